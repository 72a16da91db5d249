"""Deprecated: ``harness.sweep`` moved to harness.cost (spec, sweep, summary, command); this path goes in the next release."""
import warnings

from harness.cost import command as _command
from harness.cost import spec as _spec
from harness.cost import summary as _summary
from harness.cost import sweep as _sweep
from harness.cost.command import *  # noqa: F403
from harness.cost.command import (  # noqa: F401
    _cli_layer,
)
from harness.cost.spec import *  # noqa: F403
from harness.cost.spec import (  # noqa: F401
    _LENGTH,
    _bool,
    _check_choices,
    _choice,
    _count,
    _int,
    _ints,
    _parse_layer,
    _positive,
    _str,
    _strs,
    _unknown_key,
    _where,
)
from harness.cost.summary import *  # noqa: F403
from harness.cost.summary import (  # noqa: F401
    _fmt_len,
    _fmt_slope,
    _num,
)
from harness.cost.sweep import *  # noqa: F403
from harness.cost.sweep import (  # noqa: F401
    _absolute_plugins,
    _failure_index,
    _run_sweep,
)

__all__ = [*_spec.__all__, *_sweep.__all__, *_summary.__all__, *_command.__all__]

warnings.warn(
    "harness.sweep moved to harness.cost (spec, sweep, summary, command); the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
