"""How far to trust one measured cell: the matmul peak timed right before and right after it, and
the CPU time other processes took while it was timed.

A peak timed once per run and divided into every later cell is wrong whenever the load changes
between them (a 2-core machine with one busy neighbour halves the peak, or not, from minute to
minute). So the worker times the peak next to each cell, under the same threads and dtype, and the
row carries both. A cell is ``noisy`` (its status stays ``ok``) when

- the two peaks disagree by more than ``peak_spread`` (the machine changed during the cell), or
- other processes took more CPU while it was timed than the cores its threads left free, plus
  ``other_cpu`` (Linux: ``/proc/stat`` busy time minus the worker's and its parent's own
  ``/proc/<pid>/stat`` time). On 2 cores with 2 OpenMP threads any neighbour stalls every parallel
  region, and sub-millisecond calls show it first; on 16 cores shared by 8 two-thread hosts (Ray)
  the siblings use cores of their own and do not count against each other.

The load average is recorded too, but not judged: it counts the measuring process's own threads.
A row faster than its roof (``peak_fraction`` above 1, or ``bandwidth_fraction`` above 1 against the bandwidth of
the level its working set lives in) is noisy too, and so measured again: a peak timed low is the usual cause. If
it stays above, plots and the report treat it as *suspect* (harness.analysis.trust).
"""
from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class NoiseConfig:
    """Thresholds of the ``noisy`` flag; the defaults are what a quiet 2-core machine stays within."""

    peak_spread: float = 0.15  # |before - after| / max(before, after), for the matmul peak and the bandwidth
    other_cpu: float = 0.25  # cores' worth of CPU other processes may use beyond the cores left free
    run_drop: float = 0.15  # the cell's peak this far below the run's median peak: slow for the whole cell
    iqr: float = 0.2  # latency IQR / median


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def _machine_busy_ticks() -> int | None:
    """CPU ticks spent busy by every core since boot (user, nice, system, irq, softirq, steal)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return user + nice + system + irq + softirq + steal


def _process_ticks(pid: int | str) -> int | None:
    """CPU ticks a process (all its threads) has used: utime + stime of ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces; fields resume after ')'
    return int(rest[11]) + int(rest[12])  # fields 14 and 15 of proc(5), counted from 3 here


def _own_ticks() -> int | None:
    """Ticks of the harness itself: this process and its parent (the sweep that polls it)."""
    own = _process_ticks("self")
    parent = _process_ticks(os.getppid()) if os.getppid() > 1 else 0
    return None if own is None else own + (parent or 0)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a Slurm or container limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CpuSnapshot:
    wall: float
    machine: int | None
    own: int | None


def cpu_snapshot() -> CpuSnapshot:
    return CpuSnapshot(time.monotonic(), _machine_busy_ticks(), _own_ticks())


def other_cpu(start: CpuSnapshot, end: CpuSnapshot) -> float | None:
    """Cores' worth of CPU that other processes used between two snapshots; None off Linux."""
    if None in (start.machine, start.own, end.machine, end.own) or end.wall <= start.wall:
        return None
    others = (end.machine - start.machine) - (end.own - start.own)
    return max(0.0, others / _clock_ticks() / (end.wall - start.wall))


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def peak_spread(before: float | None, after: float | None) -> float | None:
    if not before or not after:
        return None
    return abs(before - after) / max(before, after)


def noisy_reason(row: dict[str, Any], config: NoiseConfig = NoiseConfig()) -> str | None:
    """Why a measured row should not be trusted as it stands, or None. Reads the row's own columns (a column a row
    lacks, such as those older rows were written without, judges nothing)."""
    reasons = []
    spread = peak_spread(row.get("peak_before_flops_per_s"), row.get("peak_after_flops_per_s"))
    if spread is not None and spread > config.peak_spread:
        reasons.append(f"matmul peak changed by {spread:.0%} across the cell (limit {config.peak_spread:.0%})")
    spread = peak_spread(row.get("bandwidth_before_bytes_per_s"), row.get("bandwidth_after_bytes_per_s"))
    if spread is not None and spread > config.peak_spread:
        reasons.append(f"memory bandwidth changed by {spread:.0%} across the cell (limit {config.peak_spread:.0%})")
    peak, median = row.get("peak_flops_per_s"), row.get("run_peak_flops_per_s")
    if peak and median and peak < (1 - config.run_drop) * median:
        reasons.append(f"matmul peak {1 - peak / median:.0%} below the run's median (limit {config.run_drop:.0%}): "
                       "the machine was slow for the whole cell")
    latency, iqr = row.get("latency_ms"), row.get("latency_iqr_ms")
    if latency and iqr is not None and iqr > config.iqr * latency:
        reasons.append(f"latency IQR {iqr / latency:.0%} of the median (limit {config.iqr:.0%})")
    level = row.get("bandwidth_level")
    for column, roof in (("peak_fraction", "the matmul peak timed beside it"),
                         ("bandwidth_fraction", f"the {level} bandwidth timed at its working set" if level else None)):
        fraction = row.get(column)
        if roof and fraction is not None and fraction > 1:
            reasons.append(f"{column} {fraction:.2f}: faster than {roof}, so a count, the timing or the roof is wrong")
    if row.get("timing_samples") == 1:
        reasons.append("one timed sample: no spread to judge it by")
    other = row.get("other_cpu")
    spare = max(0, (row.get("cpus") or 0) - (row.get("num_threads") or 0))
    if other is not None and other > spare + config.other_cpu:
        reasons.append(f"other processes used {other:.2f} cores while it was timed ({spare} left free by its "
                       f"threads, limit {spare + config.other_cpu:g})")
    return "; ".join(reasons) or None


PEAK_SIZE = {"cpu": 2048, "cuda": 8192}  # square matmuls big enough to reach each device's practical peak
PROBE_S = 0.2  # CPU: the size doubles from 256 while one call takes less than this


def peak_matmul(device: str, dtype: Any) -> tuple[Callable[[], Any], int]:
    """An ``n x n`` matmul in ``dtype`` (a torch dtype) on ``device`` and its FLOPs (2 n^3).

    On CPU ``n`` doubles from 256 up to 2048 while one call stays under ``PROBE_S``: fp32 reaches 2048 on every
    machine seen (>= 110 GFLOP/s), while a dtype this CPU has no fast kernel for (bf16 without AVX-512: one 2048
    matmul took 108 s on an AVX2 EPYC) is timed at a size that stays within the probe's second."""
    import time

    import torch

    n = PEAK_SIZE["cuda" if device.startswith("cuda") else "cpu"]
    if not device.startswith("cuda"):
        size = 256
        while size < n:
            x = torch.randn(size, size, dtype=dtype)
            t0 = time.perf_counter()
            torch.mm(x, x)
            if time.perf_counter() - t0 >= PROBE_S:
                break
            size *= 2
        n = size
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return (lambda: torch.mm(a, b, out=out)), 2 * n**3


# Bytes of each of STREAM's three arrays when a working set is past every cache: far past any last-level cache (a
# few tens of MiB on CPUs, 50-60 MiB of L2 on an H100/H200), so the triad streams from memory, as STREAM's rule (4x
# the caches) asks.
STREAM_ARRAY_BYTES = {"cpu": 64 << 20, "cuda": 512 << 20}
SMALLEST_TRIAD_BYTES = 3 * (16 << 10)  # below this one call's launch, not the memory, is what a triad times


@functools.cache
def cache_levels(device: str) -> tuple[tuple[str, int], ...]:
    """The data caches a working set can live in, smallest first: ``(("L2", 1 MiB), ("L3", 32 MiB))``. CPU: the
    unified and data caches of CPU 0 in sysfs (L1 left out: a call's bookkeeping alone outgrows it); CUDA: the L2.
    Empty where unknown, and then every working set is compared with the memory (DRAM)."""
    if device.startswith("cuda"):
        import torch

        size = getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0)
        return (("L2", int(size)),) if size else ()
    levels: dict[int, int] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if kind in ("Data", "Unified") and int(level) >= 2 and size[:-1].isdigit():
            levels[int(level)] = int(size[:-1]) << {"K": 10, "M": 20, "G": 30}.get(size[-1], 0)
    return tuple((f"L{k}", levels[k]) for k in sorted(levels))


def memory_level(device: str, working_set: int | None) -> str:
    """The smallest level a working set of ``working_set`` bytes fits in (``L2``, ``L3``, ``DRAM``): a call
    repeated over the same bytes is served from there, and can be no faster than that level's bandwidth."""
    if working_set is not None:
        for name, size in cache_levels(device):
            if working_set <= size:
                return name
    return "DRAM"


def stream_triad(device: str, working_set: int | None = None) -> tuple[Callable[[], Any], int]:
    """STREAM's triad ``a = b + s c`` over fp32 arrays on ``device`` and the bytes it moves (STREAM's count: two
    arrays read, one written, 3 x the array; the write-allocate read is not counted, as STREAM does not).

    The three arrays hold ``working_set`` bytes together (at least ``SMALLEST_TRIAD_BYTES``), so the triad runs in
    the level a call of that working set runs in; past the caches, or with no size, STREAM's memory-sized arrays."""
    import torch

    kind = "cuda" if device.startswith("cuda") else "cpu"
    if working_set is None or memory_level(device, working_set) == "DRAM":
        n = STREAM_ARRAY_BYTES[kind] // 4
    else:
        n = max(working_set, SMALLEST_TRIAD_BYTES) // 12
    a = torch.empty(n, device=device)
    b, c = torch.full((n,), 1.0, device=device), torch.full((n,), 2.0, device=device)
    return (lambda: torch.add(b, c, alpha=3.0, out=a)), 3 * n * 4


def _rate(make: Callable[[], tuple[Callable[[], Any], int]], timing: Any) -> float | None:
    """Work per second of the callable ``make`` returns (after one untimed call touches its pages); None if it
    failed. Its buffers live only for this timing, so they never count as a cell's memory nor eat into a cap."""
    from harness.cost.timing import first_call, time_callable

    try:
        fn, work = make()
        first_call(fn)
        return work / time_callable(fn, timing).median_s
    except Exception:  # noqa: BLE001  (a failed peak leaves the cell's own measurement standing)
        return None


def time_peak(device: str, dtype: Any) -> float | None:
    """The device's matmul FLOP/s in the cell's dtype, with the threads the process uses; None if it failed.

    Timed short (0.3-1 s), freed before the cell's memory baseline and after its peak is read: it runs twice per cell
    on CPU and once per chain on CUDA (harness.cost.sweep.CellMeasurer.peaks_for)."""
    from harness.cost.timing import TimingConfig

    return _rate(lambda: peak_matmul(device, dtype), TimingConfig(min_run_time=0.3, max_run_time=1.0, threshold=0.05))


def time_bandwidth(device: str, working_set: int | None = None) -> float | None:
    """The bandwidth in bytes/s of the level a working set of ``working_set`` bytes lives in (:func:`stream_triad`
    of that size, the threads the process uses), timed beside the matmul peak: what a memory-bound call (a decoding
    step) is judged against. A decoding step over 16 MiB of KV cache repeated in a timing loop reads the L3, not
    DRAM: judged against DRAM's triad it claimed 1.1-1.8x the machine. None if it failed."""
    from harness.cost.timing import TimingConfig

    return _rate(lambda: stream_triad(device, working_set),
                 TimingConfig(min_run_time=0.1, max_run_time=0.25, threshold=0.05))




def assess(row: dict[str, Any], config: NoiseConfig = NoiseConfig()) -> dict[str, Any]:
    """Fill an ``ok`` row's trust columns from its own measurements (idempotent).

    ``peak_flops_per_s`` is the larger of the two peaks timed next to the cell (the conservative
    denominator), ``peak_fraction`` = achieved / that; likewise ``bandwidth_peak_bytes_per_s`` and
    ``bandwidth_fraction`` for the bytes the call must move. ``arithmetic_intensity`` = FLOPs / bytes, and
    ``roofline_fraction`` = the larger fraction = achieved / the roofline's bound min(peak, intensity x bandwidth):
    how close the call came to what this machine allows it, compute- or memory-bound. ``noisy`` / ``noisy_reason``
    by :func:`noisy_reason`. Rows that measured nothing keep ``noisy`` None.
    """
    if row.get("status") != "ok":
        row.setdefault("noisy", None)
        row.setdefault("noisy_reason", None)
        return row
    peaks = [p for p in (row.get("peak_before_flops_per_s"), row.get("peak_after_flops_per_s")) if p]
    if peaks:
        row["peak_flops_per_s"] = max(peaks)
    peak, achieved = row.get("peak_flops_per_s"), row.get("achieved_flops_per_s")
    row["peak_fraction"] = achieved / peak if achieved and peak else None
    row["peak_spread"] = peak_spread(row.get("peak_before_flops_per_s"), row.get("peak_after_flops_per_s"))
    bandwidths = [b for b in (row.get("bandwidth_before_bytes_per_s"), row.get("bandwidth_after_bytes_per_s")) if b]
    row["bandwidth_peak_bytes_per_s"] = max(bandwidths) if bandwidths else None
    bandwidth, moved = row["bandwidth_peak_bytes_per_s"], row.get("achieved_bytes_per_s")
    row["bandwidth_fraction"] = moved / bandwidth if moved and bandwidth else None
    flops, count = row.get("flops"), row.get("bytes")
    row["arithmetic_intensity"] = flops / count if flops is not None and count else None
    fractions = [f for f in (row["peak_fraction"], row["bandwidth_fraction"]) if f is not None]
    row["roofline_fraction"] = max(fractions) if fractions else None
    reason = noisy_reason(row, config)
    row["noisy"], row["noisy_reason"] = reason is not None, reason
    return row


def least_noisy(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Of several attempts at one cell, the one to keep: a quiet one, else the one with the least other load."""
    quiet = [r for r in results if r.get("noisy") is False]
    if quiet:
        return quiet[-1]
    return min(results, key=lambda r: (r.get("status") != "ok", r.get("other_cpu") or 0.0, r.get("peak_spread") or 0.0))


__all__ = [
    "CpuSnapshot", "NoiseConfig", "PEAK_SIZE", "assess", "cache_levels", "cpu_snapshot", "least_noisy", "load_average",
    "memory_level", "noisy_reason",
    "other_cpu", "peak_matmul", "peak_spread", "stream_triad", "time_bandwidth", "time_peak", "usable_cpus",
]
