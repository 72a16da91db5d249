"""Timing: the median of a known duration, warm-up kept out of the steady state, both regimes."""
import time

import pytest

from harness.timing import SLOW_CALL_S, TimingConfig, bare_loop, first_call, time_callable


def sleeper(seconds):
    return lambda: time.sleep(seconds)


@pytest.mark.parametrize("seconds", [0.004, 2 * SLOW_CALL_S])  # blocked/adaptive regime, then one call per sample
def test_median_of_a_known_duration(seconds):
    t = time_callable(sleeper(seconds), TimingConfig(min_run_time=0.05, max_run_time=0.6, threshold=0.1))
    # sleep never returns early; a loaded machine can only make it late
    assert seconds <= t.median_s < seconds * 1.5 + 0.003
    assert t.repeats >= 2 and t.iqr_s is not None and t.iqr_s >= 0


def test_first_call_is_timed_apart_from_the_steady_state():
    calls = []

    def compiles_once():
        time.sleep(0.3 if not calls else 0.002)  # like a torch.compile'd function
        calls.append(1)

    warm = first_call(compiles_once)
    t = time_callable(compiles_once, TimingConfig(min_run_time=0.05, max_run_time=0.3))
    assert warm >= 0.3
    assert t.median_s < 0.05


def test_time_budget_bounds_the_repeats_of_a_slow_call():
    t = time_callable(sleeper(0.1), TimingConfig(min_run_time=0.05, max_run_time=0.25, threshold=1e-9))
    assert t.samples == t.repeats and 2 <= t.samples <= 4  # probe + samples until 0.25 s of timed calls


def test_bare_loop_times_each_call():
    times = bare_loop(sleeper(0.002), 5)
    assert len(times) == 5 and all(x >= 0.002 for x in times)
