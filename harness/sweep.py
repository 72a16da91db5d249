"""``attn-bench sweep``: measure every cell of a grid of variants x lengths x shapes x modes.

A sweep comes from a preset, a TOML sweep file and the command line, in that order of
precedence; the file's keys are the command-line option names (``head_dim`` for ``--head-dim``)
and an optional ``[[grid]]`` list adds sub-grids that override a few keys each. Everything is
validated -- names against the registries, parameters against their dataclasses -- before the
first cell runs and before the results file is opened. Each cell runs in a worker process
(harness.worker) and its row is appended and flushed as soon as it finishes.

Where the workers run is the executor's business (harness.executors: this machine, a Ray cluster or
Slurm jobs): each runs a :class:`CellMeasurer` per slot and sends back what it measured; only
:func:`run_sweep` writes rows, so resume and dedup do not depend on where a cell ran.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import itertools
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from harness.cost import DTYPES, KEY_FIELDS, MODES, SCOPES, Cell, json_normal
from harness.executors import EXECUTOR_KEYS, EXECUTORS, SLURM_CLUSTERS, ExecutorConfig, config_from, executor_options
from harness.noise import assess
from harness.presets import get_preset
from harness.results import COST_FIELDS, ResultsStore, cell_key, check_rows, check_writable, exclusive, read_rows
from harness.timing import TimingConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FAILURES_THAT_SKIP = ("oom", "timeout")  # a longer length of the same configuration would fail too


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


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    return value


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false, got {value!r}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: expected text, got {value!r}")
    return value


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
    "head_dim": _ints,
    "dtype": _strs(split=True),
    "mode": _strs(split=True),
    "scope": _strs(split=True),
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
    head_dim: tuple[int, ...] = (64,)
    dtype: tuple[str, ...] = ("float32",)
    mode: tuple[str, ...] = ("forward",)
    scope: tuple[str, ...] = ("op",)
    causal: bool = True
    layers: int = 2  # backbone depth for scope=model


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
    retries: int = 2  # re-measurements of a cell flagged noisy (harness.noise)
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


def resolve_position(spec: str, heads: int, head_dim: int, seq_len: int) -> tuple[str, dict[str, Any]]:
    """Position spec -> (name, its own config fields); the shape fields the backbone fills are left out."""
    import attn
    from attn.registry import POSITIONS

    name, params = attn.parse_spec(spec)
    entry = POSITIONS.get(name)
    names = {f.name for f in dataclasses.fields(entry.config)}
    shape = {"head_dim": head_dim, "d_model": heads * head_dim, "max_seq_len": seq_len + 1}
    fill = {k: v for k, v in shape.items() if k in names and k not in params}
    config = POSITIONS.make_config(name, {**fill, **params})
    resolved = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init and f.name not in fill}
    return name, json_normal(resolved)


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
        _check_choices(grid.scope, SCOPES, "scope")
        _check_choices(grid.dtype, list(DTYPES), "dtype")
        if "decode" in grid.mode and not grid.causal:
            raise ValueError("mode decode needs causal attention (drop --bidirectional or the decode mode)")
        if grid.layers < 1:
            raise ValueError(f"layers must be >= 1, got {grid.layers}")
        variants = [(resolve_variant(v), v.strip()) for v in grid.variant]
        for position in grid.position:  # validated even when only op-scope cells use none
            resolve_position(position, grid.heads[0], grid.head_dim[0], max(grid.lengths))
        for ((name, params, backend), label), position, scope, mode, dtype, b, h, d in itertools.product(
            variants, grid.position, grid.scope, grid.mode, grid.dtype, grid.batch, grid.heads, grid.head_dim
        ):
            for length in grid.lengths:
                if scope == "op":  # the attention call alone: no positions, no backbone
                    pos_name, pos_params, layers = "none", {}, None
                else:
                    (pos_name, pos_params), layers = resolve_position(position, h, d, length), grid.layers
                cell = Cell(
                    variant=name, variant_params=params, backend_requested=backend, position=pos_name,
                    position_params=pos_params, scope=scope, mode=mode, device=spec.run.device, dtype=dtype,
                    batch_size=b, num_heads=h, head_dim=d, seq_len=length, causal=grid.causal, layers=layers,
                    variant_spec=label,
                )
                cells.setdefault(cell.key(), cell)
    return list(cells.values())


# -- running -------------------------------------------------------------------------------------

def _fmt_len(n: int) -> str:
    for unit, size in (("M", 1024**2), ("K", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _failure_index(rows: Sequence[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """Configuration key -> (status, shortest length) of its oom/timeout rows."""
    out: dict[str, tuple[str, int]] = {}
    for r in rows:
        if r.get("status") in FAILURES_THAT_SKIP and isinstance(r.get("seq_len"), int):
            key = cell_key(r, tuple(f for f in KEY_FIELDS if f != "seq_len"))
            if key not in out or r["seq_len"] < out[key][1]:
                out[key] = (r["status"], r["seq_len"])
    return out


def skip_reason(cell: Cell, failures: dict[str, tuple[str, int]]) -> str | None:
    """Why ``cell`` is not worth running: its configuration already failed at a shorter length."""
    failed = failures.get(cell.config_key())
    if failed is None or cell.seq_len <= failed[1]:
        return None
    return f"not run: {failed[0]} at seq_len {failed[1]} in this configuration (--no-skip-after-failure runs it anyway)"


def default_mem_limit_gib() -> float:
    import psutil

    return 0.8 * psutil.virtual_memory().available / 2**30


def memory_limits(run: RunSettings) -> tuple[int | None, int | None]:
    """(limit on the measuring device, resident-memory watchdog) in bytes, from what is free on this machine now.

    CPU: the limit covers the process's memory (default 80% of what is free). CUDA: it covers device
    memory (default none: the whole GPU) and the host side keeps the 80% watchdog."""
    host_bytes = int(default_mem_limit_gib() * 2**30)
    if run.device.startswith("cuda"):
        return (None if run.mem_limit is None else int(run.mem_limit * 2**30)), host_bytes
    return (host_bytes if run.mem_limit is None else int(run.mem_limit * 2**30)), None


class CellMeasurer:
    """Measures cells on the machine it is built on, in one isolated worker process (harness.worker).

    Every executor runs one of these per slot (in this process, in a Ray actor, in a Slurm job), so a
    cell is measured the same way everywhere. Its payloads carry this machine's environment, memory
    limit, and each cell's result carries the matmul peaks and load timed next to it (harness.noise), so
    each row describes where and under what load it was measured.
    """

    def __init__(self, run: RunSettings, run_id: str):
        from harness.environment import environment
        from harness.worker import Worker, WorkerConfig

        self.settings, self.run_id = run, run_id
        mem_bytes, host_bytes = memory_limits(run)
        self.worker = Worker(WorkerConfig(run.device, mem_limit_bytes=mem_bytes, host_limit_bytes=host_bytes,
                                          plugins=tuple(run.plugin)))
        self.env = environment(run.device, run.seed)
        self.extra: dict[str, Any] = {"mem_limit_bytes": mem_bytes}

    def run(self, cell: Cell) -> dict[str, Any]:
        """Measure ``cell``; while the result is ``noisy``, measure it again (``retries`` times at most)."""
        from harness.noise import least_noisy

        s = self.settings
        attempts, walls = [], []
        for _ in range(1 + s.retries):
            start, startup = time.monotonic(), self.worker.startup_s
            result = assess(self.worker.run_cell(cell.as_row(), s.timing, s.seed, s.time_limit))
            walls.append(time.monotonic() - start - (self.worker.startup_s - startup))  # a worker's start is not the cell's
            attempts.append(result)
            if not result.get("noisy"):
                break
        # Later attempts run with compiled kernels cached: the first one's warm-up is the cell's.
        first = {k: attempts[0][k] for k in ("warmup_s", "compile_s") if k in attempts[0]}
        result = {**least_noisy(attempts), **first, "attempts": len(attempts)}
        return {"result": result, "env": self.env, "run_id": self.run_id,
                "extra": {**self.extra, "cell_wall_s": sum(walls), "worker_starts": self.worker.starts}}

    def close(self) -> None:
        self.worker.close()


def lost_cell(cell: Cell, why: str) -> dict[str, Any]:
    """The payload of a cell whose host was lost (Ray worker or node died, Slurm job ended early)."""
    return {"result": {"status": "error", "error": why}, "env": None, "run_id": None, "extra": {"cell_wall_s": None}}


class CostChain:
    """One configuration's cells, lengths ascending: after an oom or timeout at one length the longer
    ones are recorded as skipped instead of run (``skip_after_failure``), wherever the chain runs."""

    def __init__(self, cells: Sequence[Cell], failure: tuple[str, int] | None = None, skip: bool = True):
        self.tasks = sorted(cells, key=lambda c: c.seq_len)
        self._todo = list(reversed(self.tasks))
        self.failure, self.skip = failure, skip
        self.last: dict[str, Any] | None = None  # the latest measured payload: a skipped row says where

    def next(self) -> tuple[Cell, dict[str, Any] | None] | None:
        if not self._todo:
            return None
        cell = self._todo.pop()
        reason = skip_reason(cell, {cell.config_key(): self.failure}) if self.skip and self.failure else None
        if reason is None:
            return cell, None
        last = self.last or {"env": None, "run_id": None, "extra": {}}
        return cell, {"result": {"status": "skipped", "error": reason}, "env": last["env"], "run_id": last["run_id"],
                      "extra": {**last["extra"], "cell_wall_s": 0.0}}

    def finish(self, cell: Cell, payload: dict[str, Any]) -> None:
        status = payload["result"].get("status")
        if status in FAILURES_THAT_SKIP and (self.failure is None or cell.seq_len < self.failure[1]):
            self.failure = (status, cell.seq_len)
        if payload.get("env") is not None:
            self.last = payload


def make_chains(cells: Sequence[Cell], failures: dict[str, tuple[str, int]], skip: bool) -> list[CostChain]:
    """Skipping after a failure orders a configuration's lengths, so each configuration is one chain;
    without it every cell is independent."""
    if not skip:
        return [CostChain([c], skip=False) for c in cells]
    groups: dict[str, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.config_key(), []).append(c)
    return [CostChain(g, failures.get(k), skip=True) for k, g in groups.items()]


def make_row(cell: Cell, result: dict[str, Any], env: dict[str, Any], run_id: str, extra: dict[str, Any]) -> dict[str, Any]:
    """A results row: DESIGN.md's cost columns first, then the cell, the environment and the extras."""
    row: dict[str, Any] = {f: None for f in COST_FIELDS}
    row.update(cell.as_row())
    row.update(env)
    row.update({"run_id": run_id, "device": cell.device})
    row.update(extra)
    row.update(result)
    assess(row)
    row["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return row


def existing_rows(out: Path, resume: bool) -> list[dict[str, Any]]:
    """Rows already in ``out``; refuses to mix a new sweep into a file (or its uncollected Slurm jobs) unless resuming it,
    and to append to a file that is not a cost results file at all (the store would cut its last line)."""
    from harness.executors import pending_jobs, sidecar_path

    rows = check_rows(out, "cost")
    if rows and not resume:
        raise ValueError(f"{out} already holds {len(rows)} rows; pass --resume to continue it, or choose another --out")
    if not resume and pending_jobs(out):
        raise ValueError(f"{sidecar_path(out)} lists {pending_jobs(out)} Slurm jobs of an earlier run of {out}; "
                         f"pass --resume to collect them, or choose another --out")
    return rows


def check_executor(run: RunSettings) -> None:
    """The executor's engine is installed and can place this device's cells (ValueError if not)."""
    from harness.executors import require

    kind = run.executor.kind
    require(kind)
    if kind == "slurm" and run.executor.slurm_cluster == "slurm" and shutil.which("sbatch") is None:
        raise ValueError("--executor slurm: no Slurm on this machine (sbatch not found); run from a login node, "
                         "or --slurm-cluster local to run the jobs here")
    if kind != "local" and re.fullmatch(r"cuda:\d+", run.device):
        raise ValueError(f"--executor {kind} gives each cell a GPU of its own: use --device cuda, not {run.device}")


def _absolute_plugins(run: RunSettings) -> RunSettings:
    """Plugin files by absolute path, so hosts started elsewhere (another directory, another node) find them."""
    paths = tuple(str(Path(p).resolve()) if p.endswith(".py") and Path(p).exists() else p for p in run.plugin)
    return dataclasses.replace(run, plugin=paths)


def run_sweep(spec: SweepSpec, cells: list[Cell], out: Path, resume: bool,
              echo: Callable[[str], None] = click.echo) -> list[dict[str, Any]]:
    """Measure the cells not yet in ``out`` with the spec's executor; returns the rows of ``out`` that belong to ``cells``.

    Hosts return payloads; only this function writes rows, so resume and dedup work the same for every executor.
    ``out`` is locked for the whole run (before its rows are read), so a second writer stops before measuring.
    """
    with exclusive(out):
        return _run_sweep(spec, cells, out, resume, echo)


def _run_sweep(spec: SweepSpec, cells: list[Cell], out: Path, resume: bool,
               echo: Callable[[str], None]) -> list[dict[str, Any]]:
    from functools import partial

    from tqdm import tqdm

    from harness.environment import environment
    from harness.executors import Workload, job_minutes, make_executor, pending_jobs, sidecar_path
    from harness.worker import WorkerConfig

    existing = existing_rows(out, resume)
    run = _absolute_plugins(spec.run)
    kind = run.executor.kind
    if kind != "slurm" and pending_jobs(out):
        echo(f"warning: {sidecar_path(out)} lists Slurm jobs not yet collected; --executor slurm --resume collects them")
    done = {cell_key(r, KEY_FIELDS) for r in existing}
    failures = _failure_index(existing)
    run_id = f"{spec.preset or 'sweep'}-{dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    env = environment(run.device, run.seed)  # the driver's: only rows no host measured (lost, or skipped at once)
    store = ResultsStore(out, KEY_FIELDS)
    defaults = {"preset": spec.preset, "time_limit_s": run.time_limit, "mem_limit_bytes": None, "cell_wall_s": None,
                "worker_starts": 0, "attempts": 1}
    todo_at_start = sum(c.key() not in done for c in cells)

    with tqdm(total=todo_at_start, unit="cell", dynamic_ncols=True, file=sys.stderr, disable=not todo_at_start) as bar:
        def record(cell: Cell, payload: dict[str, Any]) -> None:
            key = cell.key()
            if key in done:  # e.g. a Slurm job's row collected twice
                return
            done.add(key)
            extra = {**defaults, **payload["extra"], "executor": kind}
            row = make_row(cell, payload["result"], payload.get("env") or env, payload.get("run_id") or run_id, extra)
            store.append(row)
            status = row["status"]
            if status in FAILURES_THAT_SKIP:
                prev = failures.get(cell.config_key())
                if prev is None or cell.seq_len < prev[1]:
                    failures[cell.config_key()] = (status, cell.seq_len)
            if status not in ("ok", "skipped"):
                bar.write(f"{cell.label}: {status}: {row['error']}")
            bar.set_postfix_str(status, refresh=False)
            bar.update()

        executor = make_executor(run.executor, out, echo=lambda s: bar.write(s, file=sys.stderr))
        elsewhere = executor.recover({c.key(): c for c in cells}, record)  # Slurm jobs of an earlier run
        todo = [c for c in cells if c.key() not in done and c.key() not in elsewhere]
        if resume and existing:
            echo(f"resuming {out}: {len(cells) - len(todo)} of {len(cells)} cells already measured or being measured")
        chains = make_chains(todo, failures, run.skip_after_failure)
        startup = WorkerConfig().startup_timeout_s
        work = Workload(
            chains=chains, make_host=partial(CellMeasurer, run, run_id), key=Cell.key, lost=lost_cell,
            gpus=1 if run.device.startswith("cuda") else 0,
            # every attempt of a cell (1 + retries), each with a worker restart and its two peak timings
            task_timeout_s=(1 + run.retries) * (run.time_limit + 2 * startup + 120),
            job_minutes=job_minutes([len(c.tasks) for c in chains], (1 + run.retries) * (run.time_limit + 30)),
        )
        executor.run(work, record, started=lambda cell: bar.set_description_str(cell.label))
    keys = {c.key() for c in cells}
    return [r for r in read_rows(out) if cell_key(r, KEY_FIELDS) in keys]


# -- the summary ---------------------------------------------------------------------------------

MARKS = {"oom": "OOM", "timeout": "T/O", "skipped": "skip", "unsupported": "n/a", "error": "ERR"}
LEGEND = "OOM = out of memory, T/O = over the time limit, skip = not run after a failure, n/a = unsupported, ERR = error"


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def loglog_slope(lengths: Sequence[float], latencies: Sequence[float]) -> float:
    """Least-squares slope of log(latency) against log(length): the empirical exponent of the cost."""
    import numpy as np

    return float(np.polyfit(np.log(np.asarray(lengths, float)), np.log(np.asarray(latencies, float)), 1)[0])


def _fmt_slope(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def summary_tables(rows: Sequence[dict[str, Any]]) -> str:
    """Variant x length tables of median latency and peak memory, failures marked."""
    import pandas as pd

    if not rows:
        return "no rows"
    df = pd.DataFrame(rows)
    df["variant"] = [r.get("variant_spec") or r.get("variant") for r in rows]
    dims = [c for c in ("scope", "position", "mode", "dtype", "batch_size", "num_heads", "head_dim", "causal", "layers",
                        "device") if c in df and df[c].astype(str).nunique() > 1]
    index = ["variant", *dims]
    for c in dims:  # pivot tables drop rows whose index holds None (e.g. layers of op-scope cells)
        df[c] = df[c].map(lambda v: "-" if v is None else str(v))

    def table(value: str, scale: float, slope: bool = False) -> str:
        text = [
            _num(r[value] / scale) if r["status"] == "ok" and r.get(value) is not None
            else MARKS.get(r["status"], r["status"]) if r["status"] != "ok" else "-"
            for r in df.to_dict("records")
        ]
        t = df.assign(text=text, length=df["seq_len"]).pivot_table(
            index=index, columns="length", values="text", aggfunc="first", sort=False
        )
        t = t.reindex(columns=sorted(t.columns)).fillna("")
        t.columns = [_fmt_len(int(c)) for c in t.columns]
        if slope:
            t["slope"] = [_fmt_slope(slopes.get(k if isinstance(k, tuple) else (k,))) for k in t.index]
        return t.to_string()

    slopes = {}
    for key, g in df[(df["status"] == "ok") & df["latency_ms"].notna()].groupby(index, sort=False):
        if g["seq_len"].nunique() >= 3:
            slopes[key if isinstance(key, tuple) else (key,)] = loglog_slope(g["seq_len"], g["latency_ms"])

    counts = df["status"].value_counts()
    parts = [
        "median latency, ms (slope: of log latency vs log length, ~1 linear, ~2 quadratic)",
        table("latency_ms", 1.0, slope=True),
        "",
        "peak memory above baseline, MiB",
        table("peak_mem_bytes", 2**20),
        "",
        LEGEND,
        f"{len(df)} cells: " + ", ".join(f"{n} {s}" for s, n in counts.items()),
    ]
    noisy = int(df["noisy"].fillna(False).astype(bool).sum()) if "noisy" in df else 0
    if noisy:
        parts.append(f"{noisy} ok cells are noisy (ran under load or beside a changing matmul peak after every retry): "
                     f"see their noisy_reason; plots draw them hollow")
    return "\n".join(parts)


# -- the command ---------------------------------------------------------------------------------

def _cli_layer(opts: dict[str, Any]) -> dict[str, Any]:
    """The options the user actually gave (click passes None / () for the others)."""
    names = {"variant", "position", "lengths", "batch", "heads", "head_dim", "dtype", "mode", "scope", "causal", "layers",
             "device", "time_limit", "mem_limit", "skip_after_failure", "seed", "min_run_time", "max_run_time", "retries",
             "plugin", *EXECUTOR_KEYS}
    layer = {}
    for k in names:
        v = opts.get(k)
        if v is None or v == ():
            continue
        layer[k] = list(v) if isinstance(v, tuple) else v
    return layer


@click.command("sweep")
@click.option("--variant", multiple=True, help="NAME[:key=value,...]; backend=NAME picks a backend. Repeatable.")
@click.option("--position", multiple=True, help="Position method spec (scope=model only). Repeatable.")
@click.option("--lengths", help="Sequence lengths: 1024,2048 or 1K,4K or a doubling range 1K..1M.")
@click.option("--batch", help="Batch sizes, comma list.")
@click.option("--heads", help="Numbers of heads, comma list.")
@click.option("--head-dim", help="Head dimensions, comma list.")
@click.option("--dtype", multiple=True, help="float32, bfloat16, float16, float64 (repeatable or comma list).")
@click.option("--mode", multiple=True, help="forward, train, decode (repeatable or comma list).")
@click.option("--scope", multiple=True, help="op (attention alone) or model (whole backbone).")
@click.option("--causal/--bidirectional", default=None, help="Causal (default) or bidirectional attention.")
@click.option("--layers", type=int, help="Backbone depth for --scope model (default 2).")
@click.option("--device", help="cpu (default), cuda or cuda:N.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Results JSONL (default: results/sweep-<preset>-<time>.jsonl).")
@click.option("--resume", is_flag=True, help="Continue --out: cells already in it are not run again.")
@click.option("--preset", help="quick, long or gpu (see attn-bench list).")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), help="TOML sweep file; keys are these option names.")
@click.option("--plugin", multiple=True, help="File or module registering extra variants. Repeatable.")
@click.option("--time-limit", type=float, help="Seconds per cell, warm-up included (default 300).")
@click.option("--mem-limit", type=float,
              help="GiB per cell: process memory on CPU (default 80% of what is free at start), device memory on CUDA.")
@click.option("--skip-after-failure/--no-skip-after-failure", default=None,
              help="After an OOM or timeout, record longer lengths of that configuration as skipped (default on).")
@click.option("--seed", type=int, help="Seed of the random inputs (default 0).")
@click.option("--min-run-time", type=float, help="Seconds of timed calls before the spread is checked.")
@click.option("--max-run-time", type=float, help="Seconds of timed calls after which a cell stops repeating.")
@click.option("--retries", type=int, help="Re-measure a cell flagged noisy up to N times (default 2; keeps the least noisy).")
@executor_options
@click.option("--dry-run", is_flag=True, help="Validate and list the cells; measure nothing.")
def sweep_command(out: Path | None, resume: bool, preset: str | None, config: Path | None, dry_run: bool, **opts: Any) -> None:
    """Measure latency, throughput, peak memory and FLOP/s across sequence lengths, each cell isolated in a worker process."""
    from harness.plugins import load_plugins, report_plugins

    spec = load_spec(preset, config, _cli_layer(opts))
    failed_plugins = load_plugins(spec.run.plugin, report=False)  # a bad spec's one error line names them
    check_executor(spec.run)
    cells = expand(spec, check_device_available=spec.run.executor.kind == "local")  # a login node may have no GPU
    report_plugins(failed_plugins)
    if out is None and spec.run.out:
        out = Path(spec.run.out)
    if out is None:
        if resume:
            raise click.UsageError("--resume needs --out (the results file to continue)")
        out = Path("results") / f"sweep-{spec.preset or 'custom'}-{dt.datetime.now():%Y%m%d-%H%M%S}.jsonl"
    if dry_run:
        for c in cells:
            click.echo(f"{c.label}  [{c.scope}, {c.dtype}, B={c.batch_size} H={c.num_heads} D={c.head_dim}]")
        click.echo(f"{len(cells)} cells -> {out}")
        return
    check_writable(out)  # before any work: a run must not measure for an hour and then fail to write
    with exclusive(out):  # a second writer stops here, before its first line of output
        existing_rows(out, resume)
        where = "" if spec.run.executor.kind == "local" else f" (executor {spec.run.executor.kind})"
        click.echo(f"{len(cells)} cells on {spec.run.device}{where} -> {out}", err=True)
        rows = run_sweep(spec, cells, out, resume)
    if rows or not spec.run.executor.detach:
        click.echo(summary_tables(rows))
    click.echo(f"results: {out}")


__all__ = [
    "Grid", "RunSettings", "SweepSpec", "build_spec", "expand", "load_spec", "load_toml", "make_row", "parse_lengths",
    "loglog_slope", "resolve_position", "resolve_variant", "run_sweep", "skip_reason", "summary_tables", "sweep_command",
]
