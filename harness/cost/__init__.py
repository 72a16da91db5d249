"""The cost half of the harness: cells and their FLOPs, sweep specs, the worker that times them, the run loop, summaries.
May import harness.results, harness.messages, harness.plugins, harness.environment, harness.memory, harness.executors
and attn; never harness.analysis, harness.accuracy or harness.cli. The names below were ``harness.cost`` (a module)."""
from harness.cost.cells import (
    DTYPES,
    KEY_FIELDS,
    MODES,
    SCOPES,
    VOCAB_SIZE,
    Cell,
    Measured,
    Rewind,
    attention_flops,
    build,
    build_model,
    build_op,
    check_supported,
    json_normal,
    linear_weights,
    model_config,
    model_flops,
    op_flops,
    train_factor,
)

__all__ = [
    "Cell", "DTYPES", "KEY_FIELDS", "MODES", "Measured", "Rewind", "SCOPES", "VOCAB_SIZE", "attention_flops", "build",
    "build_model", "build_op", "check_supported", "json_normal", "linear_weights", "model_config", "model_flops",
    "op_flops", "train_factor",
]
