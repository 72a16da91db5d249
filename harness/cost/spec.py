"""A cost sweep's specification: the values it accepts, how a preset, a TOML sweep file and the
command line layer (in that order of precedence), and its expansion into validated cells.

The file's keys are the command-line option names (``head_dim`` for ``--head-dim``) and an optional
``[[grid]]`` list adds sub-grids that override a few keys each. Everything is validated (names, parameters) before
the first cell runs and before the results file is opened. Each key is declared once, as a field of :class:`Grid`
or :class:`RunSettings` (harness.cost.options): its default, parser, help text and command-line flags.
"""
from __future__ import annotations

import difflib
import itertools
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cost.cells import DTYPES, MODES, SCOPES, Cell, json_normal
from harness.cost.options import (
    boolean,
    choice,
    cli_layer,
    count,
    integer,
    ints,
    option,
    parse_lengths,
    positive,
    ratios,
    sizes,
    spec_keys,
    strs,
    text,
)
from harness.cost.presets import get_preset
from harness.cost.presses import press_fields, press_labels
from harness.cost.scopes.model import resolve_position
from harness.cost.timing import TimingConfig
from harness.executors import EXECUTOR_KEYS, EXECUTORS, SLURM_CLUSTERS, ExecutorConfig, config_from

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# -- the spec: every key declared once (harness.cost.options), with its default, parser, help and flags ----------

@dataclass(frozen=True)
class Grid:
    """One product of values; a sweep is one or more of them. Grid keys may appear at the top level or in a [[grid]]."""

    variant: tuple[str, ...] = option((), parse=strs(split=False),  # commas belong to the spec: name:key=v,key=v
                                      help="NAME[:key=value,...]; backend=NAME picks a backend. Repeatable.", multiple=True)
    position: tuple[str, ...] = option(("none",), parse=strs(split=False), multiple=True,
                                       help="Position method spec (scope=model only). Repeatable.")
    lengths: tuple[int, ...] = option((1024, 2048, 4096), parse=parse_lengths,
                                      help="Sequence lengths: 1024,2048 or 1K,4K or a doubling range 1K..1M.")
    batch: tuple[int, ...] = option((1,), parse=ints, help="Batch sizes, comma list.")
    heads: tuple[int, ...] = option((8,), parse=ints, help="Numbers of (query) heads, comma list.")
    kv_heads: tuple[int, ...] | None = option(None, parse=ints,  # GQA key/value heads; None = as many as query heads
                                              help="Numbers of key/value heads (GQA; 1 = multi-query), comma list; "
                                                   "default: as many as --heads.")
    docs: tuple[int, ...] = option((1,), parse=ints,  # packed documents per sequence (decode cells take 1)
                                   help="Documents packed per sequence (equal lengths, no attention across them), "
                                        "comma list; forward and train cells (default 1).")
    queries: tuple[int, ...] = option((1,), parse=ints, flags=("--queries-per-step",),
                                      help="Decode cells: new tokens per step, comma list (default 1): several draft "
                                           "tokens verified at once (speculative decoding, multi-token prediction), "
                                           "or a prefill chunk against the cache (512: chunked prefill). Op scope.")
    budget: tuple[int, ...] | None = option(None, parse=sizes,  # None: no capacity axis; batch from --batch
                                            help="Decode cells: a memory budget (1GiB, 512MiB; comma list). Each cell "
                                                 "decodes the largest batch whose decoding state fits it (measured on "
                                                 "a one-sequence state, then built at that batch), in place of "
                                                 "--batch. Op scope.")
    ragged: tuple[float, ...] = option((0.0,), parse=ratios,
                                       help="Decode cells: ragged batches, each sequence's context drawn uniformly "
                                            "from [L(1 - r), L(1 + r)] (vLLM's --random-range-ratio), comma list "
                                            "(default 0: every sequence holds L). Op scope.")
    head_dim: tuple[int, ...] = option((64,), parse=ints, help="Head dimensions, comma list.")
    dtype: tuple[str, ...] = option(("float32",), parse=strs(split=True), multiple=True,
                                    help="float32, bfloat16, float16, float64 (repeatable or comma list).")
    mode: tuple[str, ...] = option(("forward",), parse=strs(split=True), multiple=True,
                                   help="forward, train, decode (repeatable or comma list).")
    scope: tuple[str, ...] = option(("op",), parse=strs(split=True), multiple=True,
                                    help="op (attention alone), model (our backbone) or hf (a transformers model).")
    hf_config: tuple[str, ...] = option(("llama",), parse=strs(split=False), multiple=True,
                                        flags=("--hf-config", "--hf-model"),
                                        help="--scope hf: llama, mistral, qwen2 (small random-weight presets), a named "
                                             "checkpoint (smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b: attn-bench "
                                             "list), a .gguf file or "
                                             "a local config.json / model directory. Cost needs only the architecture: "
                                             "the model is built from the config with random weights.")
    press: tuple[str, ...] | None = option(None, parse=press_labels, multiple=True,  # None: no press axis at all
                                           help="--scope hf: a KV press spec, NAME[:key=value,...] (kvpress's presses, "
                                                "none, quantized:nbits=4: attn-bench list), timed in forward and "
                                                "decode. Repeatable.")
    causal: bool = option(True, parse=boolean, flags=("--causal/--bidirectional",),
                          help="Causal (default) or bidirectional attention.")
    layers: int = option(2, parse=integer, type=int, help="Backbone depth for --scope model (default 2).")
    pattern: tuple[str, ...] = option((), parse=strs(split=False), multiple=True,  # ';' separates layers: no split
                                      help="--scope model: a layer pattern (attn-bench list), named (gemma3, qwen3-next) "
                                           "or 'SPEC*N; SPEC', repeated to --layers; each is one more series beside "
                                           "the --variant ones. --scope hf: a model's layer spec (own, or "
                                           "TYPE=SPEC;TYPE=SPEC) for a model with layer types. Repeatable.")


@dataclass(frozen=True)
class RunSettings:
    """How the cells are run; only at the top level of a sweep file. Options without help have no command-line flag."""

    device: str = option("cpu", parse=text, help="cpu (default), cuda or cuda:N.")
    time_limit: float = option(300.0, parse=positive, type=float,  # seconds per cell, warm-up included
                               help="Seconds per cell, warm-up included (default 300).")
    mem_limit: float | None = option(None, parse=positive, type=float,  # GiB; None: harness.memory.cell_memory_limits
                                     help="GiB per cell: process memory on CPU (default 80% of what is free at start), "
                                          "device memory on CUDA.")
    skip_after_failure: bool = option(True, parse=boolean,
                                      flags=("--skip-after-failure/--no-skip-after-failure",),
                                      help="After an OOM or timeout, record longer lengths of that configuration as "
                                           "skipped (default on).")
    seed: int = option(0, parse=integer, type=int, help="Seed of the random inputs (default 0).")
    min_run_time: float = option(0.2, parse=positive, type=float, help="Seconds of timed calls before the spread is checked.")
    max_run_time: float = option(2.0, parse=positive, type=float,
                                 help="Seconds of timed calls after which a cell stops repeating.")
    threshold: float = option(0.1, parse=positive)
    retries: int = option(2, parse=count(0), type=int,  # re-measurements of a cell flagged noisy (harness.cost.noise)
                          help="Re-measure a cell flagged noisy up to N times (default 2; keeps the least noisy).")
    threads: int | None = option(None, parse=count(1), type=int,  # None: torch's choice (rows carry num_threads)
                                 help="torch CPU threads per cell (default: torch's choice); rows record num_threads.")
    plugin: tuple[str, ...] = option((), parse=strs(split=False), multiple=True,
                                     help="File or module registering extra variants. Repeatable.")
    out: str | None = option(None, parse=text)  # --out is the command's own option (a path)
    # the kernel engineer's loop (docs/kernels.md): harness.cost.pinned, harness.cost.gate, harness.cost.versus
    base: str | None = option(None, parse=text, help="A git ref (branch, tag, commit): each cell is measured on REF's "
                              "variants and on the working tree's, interleaved, gated, with a speed-up table.")
    at: str | None = option(None, parse=text, help="Measure the variants as git ref REF holds them (a row's repro).")
    fail_over: float = option(0.1, parse=positive, type=float,
                              help="--base: exit 1 when a cell is slower than this fraction beyond its interval (0.1).")
    refcheck: bool = option(False, parse=boolean, flags=("--refcheck/--no-refcheck",),
                            help="Gate each cell on its reference before timing it (always on with --base).")
    check_tokens: int = option(1024, parse=count(1), type=int, help="Tokens the gate compares (default 1024).")
    profile: bool = option(False, parse=boolean, flags=("--profile/--no-profile",),
                           help="Also write a torch.profiler trace and top-operator table per cell.")
    executor: ExecutorConfig = ExecutorConfig()
    pinned: Any = None  # harness.cost.pinned.Pinned of --base / --at, once checked out

    @property
    def timing(self) -> TimingConfig:
        return TimingConfig(min_run_time=self.min_run_time, max_run_time=self.max_run_time, threshold=self.threshold)


@dataclass(frozen=True)
class SweepSpec:
    grids: tuple[Grid, ...]
    run: RunSettings
    preset: str | None = None


GRID_KEYS = spec_keys(Grid)
RUN_KEYS = {**spec_keys(RunSettings), **{  # where the cells run (harness.executors), top level only
    "executor": choice(EXECUTORS), "ray_address": text, "max_concurrency": count(1), "slurm_partition": text,
    "slurm_time": count(1), "slurm_gpus": count(0), "slurm_folder": text, "slurm_cluster": choice(SLURM_CLUSTERS),
    "detach": boolean,
}}
FILE_KEYS = ("preset", "grid")


def _where(source: str, key: str) -> str:
    return f"--{key.replace('_', '-')}" if source == "command line" else f"{source}: {key}"


def _unknown_key(source: str, key: str, valid: Sequence[str]) -> ValueError:
    near = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ValueError(f"{source}: unknown key {key!r}{hint}; valid: {', '.join(valid)}")


def _parse_layer(source: str, mapping: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """Type-check one source's keys; returns its top-level settings and its grid entries (if any)."""
    top: dict[str, Any] = {}
    grids = None
    valid = [*GRID_KEYS, *RUN_KEYS, *FILE_KEYS]
    for key, value in mapping.items():
        if key == "preset":
            if not isinstance(value, str):
                raise ValueError(f"{source}: preset must be a name, got {value!r}")
        elif key == "grid":
            if not isinstance(value, list) or not all(isinstance(g, dict) for g in value):
                raise ValueError(f"{source}: grid must be a list of tables ([[grid]])")
            grids = []
            for i, entry in enumerate(value):
                parsed = {}
                for k, v in entry.items():
                    if k in RUN_KEYS:
                        raise ValueError(f"{source}: grid[{i}]: {k!r} can only be set at the top level")
                    if k not in GRID_KEYS:
                        raise _unknown_key(f"{source}: grid[{i}]", k, list(GRID_KEYS))
                    parsed[k] = GRID_KEYS[k](v, f"{source}: grid[{i}].{k}")
                grids.append(parsed)
        elif key in GRID_KEYS:
            top[key] = GRID_KEYS[key](value, _where(source, key))
        elif key in RUN_KEYS:
            top[key] = RUN_KEYS[key](value, _where(source, key))
        else:
            raise _unknown_key(source, key, valid)
    return top, grids


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"cannot read sweep file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:  # a binary file: say which one
        raise ValueError(f"{path}: not a TOML sweep file: byte {e.start} is not UTF-8 text") from None
    if "plugin" in data:  # plugin paths in a file are relative to the file
        plugins = data["plugin"] if isinstance(data["plugin"], list) else [data["plugin"]]
        data["plugin"] = [str(path.parent / p) if isinstance(p, str) and p.endswith(".py") and (path.parent / p).exists()
                          else p for p in plugins]
    return data


def build_spec(layers: Sequence[tuple[str, dict[str, Any]]]) -> SweepSpec:
    """Merge sources, later ones winning: a later top-level key also overrides it inside earlier grids."""
    top: dict[str, Any] = {}
    grids: list[dict[str, Any]] = []
    preset = None
    for source, mapping in layers:
        if source.startswith("preset "):
            preset = source.removeprefix("preset ")
        layer_top, layer_grids = _parse_layer(source, mapping)
        for g in grids:
            for k in layer_top:
                g.pop(k, None)
        top.update(layer_top)
        if layer_grids is not None:
            grids = layer_grids
    shared = {k: v for k, v in top.items() if k in GRID_KEYS}
    out = []
    for g in grids or [{}]:
        values = {**shared, **g}
        if "variant" not in values and not values.get("pattern"):
            raise ValueError("nothing to sweep: give --variant NAME[:key=value,...], --pattern, --preset or --config")
        out.append(Grid(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}))
    run = {k: tuple(v) if isinstance(v, list) else v for k, v in top.items() if k in RUN_KEYS and k not in EXECUTOR_KEYS}
    return SweepSpec(tuple(out), RunSettings(**run, executor=config_from(top)), preset)


def load_spec(preset: str | None = None, config: Path | None = None, cli: dict[str, Any] | None = None) -> SweepSpec:
    """Preset < sweep file < command line. ``cli``: the command's spec options; those not given (None or ()) do not count."""
    layers: list[tuple[str, dict[str, Any]]] = []
    data = load_toml(config) if config is not None else None
    name = preset or (data or {}).get("preset")
    if name is not None:
        if not isinstance(name, str):
            raise ValueError(f"{config}: preset must be a name, got {name!r}")
        layers.append((f"preset {name}", get_preset(name).settings))
    if data is not None:
        layers.append((str(config), data))
    layers.append(("command line", cli_layer(cli or {})))
    return build_spec(layers)


# -- expansion and validation --------------------------------------------------------------------

def resolved_variant(spec: str) -> tuple[str, dict[str, Any], str]:
    """``name:key=v,backend=b`` -> (name, every config field's value as a row records it, requested backend), through
    :func:`attn.resolve_variant`; ValueError if invalid."""
    import attn

    v = attn.resolve_variant(spec)
    return v.name, json_normal(v.fields), v.backend


def check_device(device: str) -> None:
    import torch

    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"unknown device {device!r}; valid: cpu, cuda, cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested but no CUDA device is visible (torch.cuda.is_available() is False)")


def _check_choices(values: Sequence[str], valid: Sequence[str], what: str) -> None:
    for v in values:
        if v not in valid:
            raise ValueError(f"unknown {what} {v!r}; valid: {', '.join(valid)}")


def _press_axis(grid: Grid, scopes: dict[str, Any]) -> list[dict[str, Any]]:
    """The press fields of each press of the grid (one empty entry without ``press``: cells as before presses)."""
    if grid.press is None:
        return [{}]
    other = [name for name, scope in scopes.items() if not scope.presses]
    if other:
        raise ValueError(f"--press compresses a transformers model's KV cache: it needs --scope hf, not {other[0]}")
    if "train" in grid.mode:
        raise ValueError("--press times inference (forward, decode): mode train keeps no KV cache to compress; "
                         "drop train, or sweep it in a [[grid]] of its own, without press")
    return [press_fields(p) for p in grid.press]


def _patterns(grid: Grid, scopes: dict[str, Any]) -> list[tuple[tuple[str, dict[str, Any], str], str]]:
    """Each ``--pattern`` as a variant of the grid: ("layers", {"pattern": its unit}, "auto") and its label; on --scope
    hf a model's layer spec (attn.hf.layers), checked against each model when the scope prepares the grid."""
    from attn.patterns import LAYERS, parse_pattern

    if not grid.pattern:
        return []
    if set(scopes) == {"hf"}:  # validated by HfScope.prepare, against each model of the grid
        return [((LAYERS, {"pattern": w.strip()}, "auto"), w.strip()) for w in grid.pattern]
    other = [name for name in scopes if name != "model"]
    if other:
        raise ValueError(f"--pattern is our backbone's layer pattern on --scope model and a transformers model's layer "
                         f"spec on --scope hf: give it one of them, not {', '.join(scopes)}")
    out = []
    for written in grid.pattern:
        p = parse_pattern(written)
        p.layers(grid.layers)  # the depth holds a whole unit
        out.append(((LAYERS, {"pattern": p.text}, "auto"), p.label))
    return out


def _check_serving(grid: Grid) -> None:
    """--queries-per-step, --budget and --ragged: decode cells of the op scope (the variant's own state, no model
    around it)."""
    asked = [f for f, on in (("--queries-per-step", max(grid.queries) > 1), ("--budget", grid.budget),
                             ("--ragged", max(grid.ragged) > 0)) if on]
    if not asked:
        return
    if "decode" not in grid.mode:
        raise ValueError(f"{' and '.join(asked)} shape decoding steps: add --mode decode")
    if set(grid.scope) != {"op"}:
        raise ValueError(f"{' and '.join(asked)} run in --scope op only (a decoding step on the variant's own state)")
    if grid.budget and tuple(grid.batch) != (1,):
        raise ValueError("--budget finds each cell's batch; leave --batch out")
    if grid.budget and max(grid.ragged) > 0:
        raise ValueError("--budget sizes a batch of equal contexts: ragged batches under a budget are not built")


def expand(spec: SweepSpec, check_device_available: bool = True) -> list[Cell]:
    """Every cell of every grid, validated, deduplicated; within a configuration, lengths ascend."""
    if check_device_available:
        check_device(spec.run.device)
    elif not re.fullmatch(r"cpu|cuda(:\d+)?", spec.run.device):
        raise ValueError(f"unknown device {spec.run.device!r}; valid: cpu, cuda, cuda:N")
    cells: dict[str, Cell] = {}
    for grid in spec.grids:
        _check_choices(grid.mode, MODES, "mode")
        _check_choices(grid.scope, list(SCOPES), "scope")
        _check_choices(grid.dtype, list(DTYPES), "dtype")
        if "decode" in grid.mode and not grid.causal:
            raise ValueError("mode decode needs causal attention (drop --bidirectional or the decode mode)")
        scopes = {name: SCOPES[name] for name in grid.scope}
        for scope in scopes.values():
            scope.check(grid)
        if grid.layers < 1:
            raise ValueError(f"layers must be >= 1, got {grid.layers}")
        variants = [(resolved_variant(v), v.strip()) for v in grid.variant] + _patterns(grid, scopes)
        for position in grid.position:  # validated even when only op-scope cells use none
            if not all(scope.positions_from_config for scope in scopes.values()):
                resolve_position(position, grid.heads[0], grid.head_dim[0], max(grid.lengths))
        presses = _press_axis(grid, scopes)
        prepared = {name: scope.prepare(grid) for name, scope in scopes.items()}
        _check_serving(grid)
        for ((name, params, backend), label), position, scope, mode, dtype, b, h, d, kv_given, docs, press, t, budget, r in (
            itertools.product(variants, grid.position, grid.scope, grid.mode, grid.dtype, grid.batch, grid.heads,
                              grid.head_dim, grid.kv_heads or (None,), grid.docs, presses, grid.queries,
                              grid.budget or (None,), grid.ragged)
        ):
            if docs > 1 and mode == "decode":
                continue  # a decoding step of a packed row is a step of its last document: --docs is for forward/train
            if mode != "decode" and (t > 1 or budget is not None or r):
                continue  # queries per step, a memory budget and ragged contexts shape decoding only
            serving = dict(queries=t if t > 1 else None, budget_bytes=budget, ragged=r or None)
            if budget is not None:
                b = 1  # the cell finds its batch from the budget
            for length in grid.lengths:
                if docs > length:
                    raise ValueError(f"docs {docs} exceeds length {length}: every document needs a token")
                for fields in scopes[scope].shapes(grid, prepared[scope], position, h, d, kv_given, length):
                    cell = Cell(variant=name, variant_params=params, backend_requested=backend, scope=scope, mode=mode,
                                device=spec.run.device, dtype=dtype, batch_size=b, seq_len=length, causal=grid.causal,
                                variant_spec=label, docs=docs if docs > 1 else None, **fields, **press, **serving)
                    cells.setdefault(cell.key(), cell)
    return list(cells.values())


__all__ = [
    "FILE_KEYS", "GRID_KEYS", "RUN_KEYS", "Grid", "RunSettings", "SweepSpec", "build_spec", "check_device",
    "expand", "load_spec", "load_toml", "resolved_variant",
]
