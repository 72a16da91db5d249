"""The cost half of the harness: cells and their FLOPs, the scopes that build them (harness.cost.scopes), sweep specs,
the worker that times them, the run loop, summaries. May import harness.results, harness.messages, harness.plugins,
harness.environment, harness.memory, harness.executors and attn; never harness.analysis, harness.accuracy or
harness.cli. Importing it registers every scope."""
from harness.cost.cells import (
    DTYPES,
    KEY_FIELDS,
    MODES,
    SCOPES,
    Cell,
    Measured,
    Rewind,
    Scope,
    attention_flops,
    build,
    check_supported,
    json_normal,
    linear_weights,
    register_scope,
    train_factor,
)
from harness.cost.scopes.model import VOCAB_SIZE, build_model, model_config, model_flops
from harness.cost.scopes.op import build_op, op_flops

__all__ = [
    "Cell", "DTYPES", "KEY_FIELDS", "MODES", "Measured", "Rewind", "SCOPES", "Scope", "VOCAB_SIZE", "attention_flops",
    "build", "build_model", "build_op", "check_supported", "json_normal", "linear_weights", "model_config",
    "model_flops", "op_flops", "register_scope", "train_factor",
]
