"""Timing one callable the way ``torch.utils.benchmark`` does: warm-up, adaptive repeats, device
synchronisation, and the median and interquartile range of the repeats.

The first call of a cell (compilation, autotuning, lazy initialisation) is timed on its own by
:func:`first_call` and never mixed into the steady-state numbers of :func:`time_callable`.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.benchmark import Measurement, Timer
from torch.utils.benchmark.utils.timer import timer as synced_clock  # syncs the accelerator, like Timer does

# A call slower than this is timed one call per sample: the block-size search of
# blocked_autorange would only repeat it (and its own warm-up call) for nothing.
SLOW_CALL_S = 0.05


@dataclass(frozen=True)
class TimingConfig:
    """How long to keep repeating; the defaults suit a laptop CPU sweep."""

    min_run_time: float = 0.2  # seconds of timed calls before the spread is even checked
    max_run_time: float = 2.0  # seconds of timed calls after which we stop, however noisy
    threshold: float = 0.1  # stop early once IQR / median falls below this (adaptive_autorange)


@dataclass(frozen=True)
class Timing:
    """Steady-state time per call. ``iqr_s`` is None with fewer than two samples."""

    median_s: float
    iqr_s: float | None
    samples: int  # timed blocks
    number_per_run: int  # calls per block (blocked_autorange amortises timer overhead over a block)

    @property
    def repeats(self) -> int:
        return self.samples * self.number_per_run


def first_call(fn: Callable[[], object]) -> float:
    """Seconds for one call, device synchronised: the warm-up (compile, autotune, lazy init)."""
    start = synced_clock()
    fn()
    return synced_clock() - start


def _timer(fn: Callable[[], object]) -> Timer:
    # Timer defaults to num_threads=1; a sweep measures with the threads the process really uses.
    return Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())


def _summarise(m: Measurement) -> Timing:
    iqr = m.iqr if len(m.times) >= 2 else None
    return Timing(median_s=m.median, iqr_s=iqr, samples=len(m.raw_times), number_per_run=m.number_per_run)


def time_callable(fn: Callable[[], object], config: TimingConfig = TimingConfig()) -> Timing:
    """Median and IQR of an already warmed-up ``fn``.

    Fast calls go through ``Timer.adaptive_autorange`` (blocks grown until timer overhead
    vanishes, repeated until IQR/median < threshold or ``max_run_time``). Slow calls are timed
    one per sample, until ``max_run_time`` of them or an early stop on the same spread rule.
    """
    timer = _timer(fn)
    probe = timer.timeit(1)
    if probe.median < SLOW_CALL_S:
        m = timer.adaptive_autorange(
            threshold=config.threshold, min_run_time=config.min_run_time, max_run_time=config.max_run_time
        )
        return _summarise(m)
    samples = [probe]
    while True:
        merged = Measurement.merge(samples)[0]
        total = sum(merged.times)
        if total >= config.max_run_time:
            break
        if total >= config.min_run_time and len(samples) >= 4 and merged.iqr / merged.median < config.threshold:
            break
        samples.append(timer.timeit(1))
    return _summarise(Measurement.merge(samples)[0])


def bare_loop(fn: Callable[[], object], calls: int) -> list[float]:
    """Seconds per call of ``fn`` timed one by one with no harness around it (overhead checks)."""
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()
        out.append(time.perf_counter() - start)
    return out


__all__ = ["SLOW_CALL_S", "Timing", "TimingConfig", "bare_loop", "first_call", "time_callable"]
