"""A cost sweep's specification: the values it accepts, how a preset, a TOML sweep file and the
command line layer (in that order of precedence), and its expansion into validated cells.

The file's keys are the command-line option names (``head_dim`` for ``--head-dim``) and an optional
``[[grid]]`` list adds sub-grids that override a few keys each. Everything is validated (names, parameters) before
the first cell runs and before the results file is opened. (One module: parse, merge and expand share the key tables.)
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cost.cells import DTYPES, MODES, SCOPES, Cell, json_normal
from harness.cost.presets import get_preset
from harness.cost.scopes.model import resolve_position
from harness.cost.timing import TimingConfig
from harness.executors import EXECUTOR_KEYS, EXECUTORS, SLURM_CLUSTERS, ExecutorConfig, config_from

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# -- parsing values ------------------------------------------------------------------------------

_LENGTH = re.compile(r"^(\d+)([kKmM]?)$")


def parse_length(token: str | int, where: str) -> int:
    """``4096``, ``4K`` or ``1M`` (K = 1024) -> a positive int."""
    if isinstance(token, bool):
        raise ValueError(f"{where}: expected a length, got {token!r}")
    if isinstance(token, int):
        n = token
    else:
        m = _LENGTH.match(str(token).strip().replace("_", ""))
        if not m:
            raise ValueError(f"{where}: malformed length {token!r}; expected e.g. 4096, 4K or 1M")
        n = int(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[m.group(2).lower()]
    if n < 1:
        raise ValueError(f"{where}: lengths must be >= 1, got {token!r}")
    return n


def parse_lengths(value: Any, where: str) -> list[int]:
    """A list, a comma list (``1024,2048``) or a doubling range (``1K..1M``) -> sorted unique lengths."""
    if isinstance(value, (list, tuple)):
        items: list[Any] = list(value)
    else:
        items = [s for s in str(value).split(",") if s.strip()] if not isinstance(value, int) else [value]
    out: list[int] = []
    for item in items:
        if isinstance(item, str) and ".." in item:
            lo_s, _, hi_s = item.partition("..")
            lo, hi = parse_length(lo_s, where), parse_length(hi_s, where)
            if lo > hi:
                raise ValueError(f"{where}: empty range {item!r} (start > end)")
            while lo <= hi:
                out.append(lo)
                lo *= 2
        else:
            out.append(parse_length(item, where))
    if not out:
        raise ValueError(f"{where}: no lengths given")
    return sorted(set(out))


def _strs(split: bool) -> Callable[[Any, str], list[str]]:
    def parse(value: Any, where: str) -> list[str]:
        items = value if isinstance(value, (list, tuple)) else [value]
        out = []
        for v in items:
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"{where}: expected text, got {v!r}")
            out += [s.strip() for s in v.split(",") if s.strip()] if split else [v.strip()]
        if not out:
            raise ValueError(f"{where}: empty list")
        return out
    return parse


def _ints(value: Any, where: str) -> list[int]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",") if isinstance(value, str) else [value]
    out = []
    for v in items:
        try:
            n = int(v) if not isinstance(v, (bool, float)) else None
        except ValueError:
            n = None
        if n is None or n < 1:
            raise ValueError(f"{where}: expected positive integers, got {v!r}")
        out.append(n)
    if not out:
        raise ValueError(f"{where}: empty list")
    return sorted(set(out))


def _of(test: Callable[[Any], bool], what: str) -> Callable[[Any, str], Any]:
    """A parser that accepts a value passing ``test`` as it is, else says it expected ``what``."""
    def parse(value: Any, where: str) -> Any:
        if not test(value):
            raise ValueError(f"{where}: expected {what}, got {value!r}")
        return value
    return parse


_int = _of(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
_bool = _of(lambda v: isinstance(v, bool), "true or false")
_str = _of(lambda v: isinstance(v, str) and bool(v), "text")


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def _count(minimum: int) -> Callable[[Any, str], int]:
    def parse(value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{where}: expected an integer >= {minimum}, got {value!r}")
        return value
    return parse


def _choice(valid: Sequence[str]) -> Callable[[Any, str], str]:
    def parse(value: Any, where: str) -> str:
        if value not in valid:
            raise ValueError(f"{where}: unknown value {value!r}; valid: {', '.join(valid)}")
        return value
    return parse


# Grid keys may appear at the top level or in a [[grid]] entry; run keys only at the top level.
GRID_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "variant": _strs(split=False),  # commas belong to the spec: name:key=v,key=v
    "position": _strs(split=False),
    "lengths": parse_lengths,
    "batch": _ints,
    "heads": _ints,
    "kv_heads": _ints,
    "docs": _ints,
    "head_dim": _ints,
    "dtype": _strs(split=True),
    "mode": _strs(split=True),
    "scope": _strs(split=True),
    "hf_config": _strs(split=False),
    "causal": _bool,
    "layers": _int,
}
RUN_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "device": _str,
    "time_limit": _positive,
    "mem_limit": _positive,
    "skip_after_failure": _bool,
    "seed": _int,
    "min_run_time": _positive,
    "max_run_time": _positive,
    "threshold": _positive,
    "retries": _count(0),
    "threads": _count(1),
    "plugin": _strs(split=False),
    "out": _str,
    # where the cells run (harness.executors)
    "executor": _choice(EXECUTORS),
    "ray_address": _str,
    "max_concurrency": _count(1),
    "slurm_partition": _str,
    "slurm_time": _count(1),
    "slurm_gpus": _count(0),
    "slurm_folder": _str,
    "slurm_cluster": _choice(SLURM_CLUSTERS),
    "detach": _bool,
}
FILE_KEYS = ("preset", "grid")


# -- the spec ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Grid:
    """One product of values; a sweep is one or more of them."""

    variant: tuple[str, ...]
    position: tuple[str, ...] = ("none",)
    lengths: tuple[int, ...] = (1024, 2048, 4096)
    batch: tuple[int, ...] = (1,)
    heads: tuple[int, ...] = (8,)
    kv_heads: tuple[int, ...] | None = None  # GQA key/value heads; None = as many as query heads
    docs: tuple[int, ...] = (1,)  # packed documents per sequence (forward and train; decode cells take 1)
    head_dim: tuple[int, ...] = (64,)
    dtype: tuple[str, ...] = ("float32",)
    mode: tuple[str, ...] = ("forward",)
    scope: tuple[str, ...] = ("op",)
    causal: bool = True
    layers: int = 2  # backbone depth for scope=model
    hf_config: tuple[str, ...] = ("llama",)  # scope=hf: transformers configs (preset names or local paths)


@dataclass(frozen=True)
class RunSettings:
    device: str = "cpu"
    time_limit: float = 300.0  # seconds per cell, warm-up included
    mem_limit: float | None = None  # GiB; None: CPU 80% of the memory available at the start, CUDA no cap
    skip_after_failure: bool = True
    seed: int = 0
    min_run_time: float = 0.2
    max_run_time: float = 2.0
    threshold: float = 0.1
    retries: int = 2  # re-measurements of a cell flagged noisy (harness.cost.noise)
    threads: int | None = None  # torch CPU threads in the worker; None: torch's choice (rows carry num_threads)
    plugin: tuple[str, ...] = ()
    out: str | None = None
    executor: ExecutorConfig = ExecutorConfig()

    @property
    def timing(self) -> TimingConfig:
        return TimingConfig(min_run_time=self.min_run_time, max_run_time=self.max_run_time, threshold=self.threshold)


@dataclass(frozen=True)
class SweepSpec:
    grids: tuple[Grid, ...]
    run: RunSettings
    preset: str | None = None


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
        if "variant" not in values:
            raise ValueError("nothing to sweep: give --variant NAME[:key=value,...], --preset or --config")
        out.append(Grid(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}))
    run = {k: tuple(v) if isinstance(v, list) else v for k, v in top.items() if k in RUN_KEYS and k not in EXECUTOR_KEYS}
    return SweepSpec(tuple(out), RunSettings(**run, executor=config_from(top)), preset)


def load_spec(preset: str | None = None, config: Path | None = None, cli: dict[str, Any] | None = None) -> SweepSpec:
    """Preset < sweep file < command line. ``cli`` holds only the options actually given."""
    layers: list[tuple[str, dict[str, Any]]] = []
    data = load_toml(config) if config is not None else None
    name = preset or (data or {}).get("preset")
    if name is not None:
        if not isinstance(name, str):
            raise ValueError(f"{config}: preset must be a name, got {name!r}")
        layers.append((f"preset {name}", get_preset(name).settings))
    if data is not None:
        layers.append((str(config), data))
    layers.append(("command line", cli or {}))
    return build_spec(layers)


# -- expansion and validation --------------------------------------------------------------------

def resolve_variant(spec: str) -> tuple[str, dict[str, Any], str]:
    """``name:key=v,backend=b`` -> (name, every config field's value, requested backend); ValueError if invalid."""
    import attn
    from attn.registry import ATTENTION

    name, params = attn.parse_spec(spec)
    backend = params.pop("backend", "auto")
    entry = ATTENTION.get(name)
    config = ATTENTION.make_config(name, params)
    backends = [b.name for b in entry.cls.backends]
    if backend != "auto" and backend not in backends:
        raise ValueError(f"unknown backend {backend!r} for {name!r} in {spec!r}; valid: auto, {', '.join(backends)}")
    resolved = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return name, json_normal(resolved), backend


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
        variants = [(resolve_variant(v), v.strip()) for v in grid.variant]
        for position in grid.position:  # validated even when only op-scope cells use none
            if not all(scope.positions_from_config for scope in scopes.values()):
                resolve_position(position, grid.heads[0], grid.head_dim[0], max(grid.lengths))
        prepared = {name: scope.prepare(grid) for name, scope in scopes.items()}
        for ((name, params, backend), label), position, scope, mode, dtype, b, h, d, kv_given, docs in itertools.product(
            variants, grid.position, grid.scope, grid.mode, grid.dtype, grid.batch, grid.heads, grid.head_dim,
            grid.kv_heads or (None,), grid.docs,
        ):
            if docs > 1 and mode == "decode":
                continue  # a decoding step of a packed row is a step of its last document: --docs is for forward/train
            for length in grid.lengths:
                if docs > length:
                    raise ValueError(f"docs {docs} exceeds length {length}: every document needs a token")
                for fields in scopes[scope].shapes(grid, prepared[scope], position, h, d, kv_given, length):
                    cell = Cell(variant=name, variant_params=params, backend_requested=backend, scope=scope, mode=mode,
                                device=spec.run.device, dtype=dtype, batch_size=b, seq_len=length, causal=grid.causal,
                                variant_spec=label, docs=docs if docs > 1 else None, **fields)
                    cells.setdefault(cell.key(), cell)
    return list(cells.values())


__all__ = [
    "FILE_KEYS", "GRID_KEYS", "RUN_KEYS", "Grid", "RunSettings", "SweepSpec", "build_spec", "check_device", "expand",
    "load_spec", "load_toml", "parse_length", "parse_lengths", "resolve_variant",
]
