"""Deprecated: moved to :mod:`harness.analysis.report`; the old path goes in the next release."""
import warnings

from harness.analysis.report import (  # noqa: F401
    _CSS,
    ENV_COLUMNS,
    SECTIONS,
    _png,
    _section,
    _sources,
    _table,
    build_report,
    crossover_table,
    environment_table,
    findings,
    fmt_num,
    pivot_accuracy,
    pivot_cost,
    positions_table,
    reach_table,
    report_command,
    scaling_table,
    suspect_section,
    write_report,
)

warnings.warn("harness.report moved to harness.analysis.report; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)

__all__ = ["build_report", "crossover_table", "environment_table", "findings", "reach_table", "report_command",
           "scaling_table", "suspect_section", "write_report"]
