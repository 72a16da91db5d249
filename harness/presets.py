"""Deprecated: ``harness.presets`` moved to harness.cost.presets; this path goes in the next release."""
import warnings

from harness.cost import presets as _presets
from harness.cost.presets import *  # noqa: F403
from harness.cost.presets import (  # noqa: F401
    _as_list,
)

__all__ = [*_presets.__all__]

warnings.warn(
    "harness.presets moved to harness.cost.presets; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
