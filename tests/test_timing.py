"""Timing: the median of a known duration, warm-up kept out of the steady state, both regimes.

What time_callable decides (block sizes, sample counts, budgets) is checked on a fake clock that moves only when a
timed function says so, so no assertion depends on how fast or how loaded this machine is."""
import time

import pytest

from harness.cost import timing
from harness.cost.timing import MIN_SLOW_SAMPLES, SLOW_CALL_S, TimingConfig, bare_loop, first_call, time_callable

JITTER = 0.01  # every other call takes this much longer: a spread, as real calls have, but a known one


class FakeClock:
    """Stands in for the synchronised clock: ``sleep(s)`` advances it by s (x 1 + JITTER on every other call)."""

    def __init__(self):
        self.now, self.sleeps = 0.0, 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds * (1 + JITTER * (self.sleeps % 2))
        self.sleeps += 1


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing, "synced_clock", fake)
    return fake


def sleeper(clock, seconds):
    return lambda: clock.sleep(seconds)


@pytest.mark.parametrize("seconds", [0.004, 2 * SLOW_CALL_S])  # blocked/adaptive regime, then one call per sample
def test_median_of_a_known_duration(clock, seconds):
    t = time_callable(sleeper(clock, seconds), TimingConfig(min_run_time=0.05, max_run_time=0.6, threshold=0.1))
    assert seconds <= t.median_s <= seconds * (1 + JITTER)
    assert t.repeats >= 2 and t.iqr_s is not None and t.iqr_s >= 0


def test_first_call_is_timed_apart_from_the_steady_state(clock):
    calls = []

    def compiles_once():
        clock.sleep(0.3 if not calls else 0.002)  # like a torch.compile'd function
        calls.append(1)

    warm = first_call(compiles_once)
    t = time_callable(compiles_once, TimingConfig(min_run_time=0.05, max_run_time=0.3))
    assert warm == pytest.approx(0.3)
    assert 0.002 <= t.median_s <= 0.002 * (1 + JITTER)


def test_time_budget_bounds_the_repeats_of_a_slow_call(clock):
    t = time_callable(sleeper(clock, 0.1), TimingConfig(min_run_time=0.05, max_run_time=0.25, threshold=1e-9))
    assert t.samples == t.repeats == MIN_SLOW_SAMPLES  # probe + samples until 0.25 s of timed calls, at least three


class Counted:
    def __init__(self, clock, seconds):
        self.clock, self.seconds, self.calls = clock, seconds, 0

    def __call__(self):
        self.calls += 1
        self.clock.sleep(self.seconds)


@pytest.mark.parametrize("seconds", [0.0002, 0.003, 2 * SLOW_CALL_S])
def test_the_helper_makes_exactly_the_calls_it_reports(clock, seconds):
    """No hidden warm-up: Timer.timeit(1) made three calls for each one it timed."""
    fn = Counted(clock, seconds)
    t = time_callable(fn, TimingConfig(min_run_time=0.05, max_run_time=0.3, threshold=0.05))
    assert fn.calls == t.calls
    slow = seconds >= SLOW_CALL_S
    assert t.calls == t.repeats + (0 if slow else 3)  # a fast call's three probes are no sample; a slow call's is its first
    assert t.median_s >= seconds


def test_a_slow_call_runs_once_when_a_second_call_would_pass_three_budgets(clock):
    fn = Counted(clock, 0.2)
    t = time_callable(fn, TimingConfig(min_run_time=0.05, max_run_time=0.05))
    assert fn.calls == t.calls == t.samples == 1


def test_a_slow_call_past_the_budget_is_still_timed_three_times_when_they_fit(clock):
    """Two 0.1 s calls pass a 0.12 s budget; a third still fits in 3x the budget, so the row gets a spread."""
    fn = Counted(clock, 0.1)
    t = time_callable(fn, TimingConfig(min_run_time=0.05, max_run_time=0.12, threshold=0.5))
    assert fn.calls == t.calls == t.samples == MIN_SLOW_SAMPLES and t.iqr_s is not None


def test_sub_millisecond_calls_are_repeated_within_each_sample(clock):
    t = time_callable(Counted(clock, 0.0001), TimingConfig(min_run_time=0.05, max_run_time=0.5, block_time=0.02))
    assert 200 <= t.number_per_run <= 201  # 0.02 s blocks of 0.1 ms calls
    assert t.samples >= 4 and t.iqr_s is not None


def test_bare_loop_times_each_call():  # the real clock: sleep never returns early, a loaded machine only makes it late
    times = bare_loop(lambda: time.sleep(0.002), 5)
    assert len(times) == 5 and all(x >= 0.002 for x in times)
