"""Timing one callable the way ``torch.utils.benchmark`` does -- blocks of calls between device
synchronisations, the median and interquartile range of the blocks -- with every call accounted for.

``Timer.timeit(n)`` runs ``max(n // 100, 2)`` untimed warm-up calls before its timed ones, so timing a
slow cell one ``timeit(1)`` per sample did three calls for every one it reported. Here the loop is
ours and ``Timing.calls`` is exactly how many calls were made; the statistics are
``torch.utils.benchmark.Measurement``'s. The first call of a cell (compilation, autotuning, lazy
initialisation) is timed on its own by :func:`first_call` and never mixed into the steady state.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.utils.benchmark import Measurement
from torch.utils.benchmark.utils.common import TaskSpec
from torch.utils.benchmark.utils.timer import timer as synced_clock  # syncs the accelerator, like Timer does

# A call slower than this is timed one call per sample (the probe call is the first sample).
SLOW_CALL_S = 0.05
# The spread is only judged once this many samples exist: an IQR of two or three points means nothing.
MIN_SAMPLES = 4
# A slow call is timed at least this often while one more sample fits in 3x max_run_time: a row resting on one
# sample has no spread at all (harness.cost.noise flags it).
MIN_SLOW_SAMPLES = 3


@dataclass(frozen=True)
class TimingConfig:
    """How long to keep repeating; the defaults suit a laptop CPU sweep."""

    min_run_time: float = 0.2  # seconds of timed calls before the spread is even checked
    max_run_time: float = 2.0  # seconds of timed calls after which we stop, however noisy
    threshold: float = 0.1  # stop early once IQR / median falls below this (adaptive_autorange's rule)
    block_time: float = 0.02  # a sample of a fast call lasts about this long: sub-ms steps are repeated per sample

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """Steady-state time per call. ``iqr_s`` is None with fewer than two samples."""

    median_s: float
    iqr_s: float | None
    samples: int  # timed blocks
    number_per_run: int  # calls per block
    calls: int  # every call time_callable made, the untimed probe of a fast call included
    per_call_s: tuple[float, ...] = ()  # each sample's seconds per call: what a speed-up's interval resamples

    @property
    def repeats(self) -> int:
        """Calls inside the timed samples."""
        return self.samples * self.number_per_run


def first_call(fn: Callable[[], object]) -> float:
    """Seconds for one call, device synchronised: the warm-up (compile, autotune, lazy init)."""
    start = synced_clock()
    fn()
    return synced_clock() - start


def _block(fn: Callable[[], object], number: int) -> float:
    """Seconds for ``number`` back-to-back calls, synchronised once at each end (as Timer does)."""
    start = synced_clock()
    for _ in range(number):
        fn()
    return synced_clock() - start


def _measurement(number: int, blocks: list[float]) -> Measurement:
    spec = TaskSpec(stmt="fn()", setup="pass", num_threads=torch.get_num_threads())
    return Measurement(number_per_run=number, raw_times=list(blocks), task_spec=spec)


def _done(m: Measurement, config: TimingConfig) -> bool:
    total, n = sum(m.raw_times), len(m.raw_times)
    if total >= config.max_run_time:
        return n >= MIN_SLOW_SAMPLES or total + total / n > MIN_SLOW_SAMPLES * config.max_run_time
    return total >= config.min_run_time and len(m.raw_times) >= MIN_SAMPLES and m.iqr / m.median < config.threshold


def time_callable(fn: Callable[[], object], config: TimingConfig = TimingConfig()) -> Timing:
    """Median and IQR of an already warmed-up ``fn``.

    One probe call sets the block size: a call slower than ``SLOW_CALL_S`` is timed one call per
    sample and the probe is its first sample; a faster one is probed twice more (the fastest of the three counts:
    one scheduling hiccup must not shrink every block) and repeated ``block_time / probe`` times per sample, so a
    0.2 ms decoding step is timed in blocks of ~100 calls and timer and scheduling
    jitter average out. Samples are added until ``min_run_time`` of timed calls and IQR / median <
    ``threshold`` (at least ``MIN_SAMPLES``), or ``max_run_time`` (and ``MIN_SLOW_SAMPLES`` samples, while one more
    fits in 3x ``max_run_time``).
    """
    probe = _block(fn, 1)
    calls = 1
    if probe >= SLOW_CALL_S:
        number, blocks = 1, [probe]
    else:
        probe, calls = min(probe, _block(fn, 1), _block(fn, 1)), calls + 2
        number, blocks = max(1, math.ceil(config.block_time / max(probe, 1e-9))), []
    while not blocks or not _done(_measurement(number, blocks), config):
        blocks.append(_block(fn, number))
        calls += number
    m = _measurement(number, blocks)
    iqr = m.iqr if len(blocks) >= 2 else None
    return Timing(median_s=m.median, iqr_s=iqr, samples=len(blocks), number_per_run=number, calls=calls,
                  per_call_s=tuple(b / number for b in blocks))


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


__all__ = [
    "MIN_SAMPLES", "MIN_SLOW_SAMPLES", "SLOW_CALL_S", "Timing", "TimingConfig", "bare_loop", "first_call", "time_callable",
]
