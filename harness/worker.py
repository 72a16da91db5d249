"""Deprecated: ``harness.worker`` moved to harness.cost.worker (the child side: harness.cost.child); goes next release."""
import warnings

from harness.cost import worker as _worker
from harness.cost.child import _cap_address_space, _die_with_parent  # noqa: F401
from harness.cost.worker import *  # noqa: F403
from harness.cost.worker import (  # noqa: F401
    _BOOTSTRAP,
    LOW_AVAILABLE,
    NEAR_LIMIT,
    POLL_S,
    TRACK_S,
    _running,
    _total_memory,
    child_main,
    vars_of,
)

__all__ = [*_worker.__all__]

warnings.warn(
    "harness.worker moved to harness.cost.worker; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    child_main()
