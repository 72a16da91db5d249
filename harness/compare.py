"""Deprecated: moved to :mod:`harness.analysis.compare`; the old path goes in the next release."""
import warnings

from harness.analysis.compare import (  # noqa: F401
    DEFAULT_TOL,
    KEY,
    NUMERIC,
    OPTIONAL_DEFAULTS,
    _absent,
    _adopt,
    _auto_alias,
    _check_numbers,
    _first_difference,
    _key,
    _key_values,
    _load,
    _norm,
    _not_a_number,
    _shorten,
    _show,
    compare_command,
    compare_frames,
    match_keys,
)

warnings.warn("harness.compare moved to harness.analysis.compare; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)

__all__ = ["DEFAULT_TOL", "KEY", "OPTIONAL_DEFAULTS", "compare_command", "compare_frames", "match_keys"]
