"""Deprecated: ``harness.noise`` moved to harness.cost.noise; this path goes in the next release."""
import warnings

from harness.cost import noise as _noise
from harness.cost.noise import *  # noqa: F403
from harness.cost.noise import (  # noqa: F401
    _clock_ticks,
    _machine_busy_ticks,
    _own_ticks,
    _process_ticks,
)

__all__ = [*_noise.__all__]

warnings.warn(
    "harness.noise moved to harness.cost.noise; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
