"""Deprecated: ``harness.timing`` moved to harness.cost.timing; this path goes in the next release."""
import warnings

from harness.cost import timing as _timing
from harness.cost.timing import *  # noqa: F403
from harness.cost.timing import (  # noqa: F401
    _block,
    _done,
    _measurement,
)

__all__ = [*_timing.__all__]

warnings.warn(
    "harness.timing moved to harness.cost.timing; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
