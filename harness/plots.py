"""Deprecated: moved to :mod:`harness.analysis.figures`; the old path goes in the next release."""
import warnings

from harness.analysis.figures import (  # noqa: F401
    FIGURES,
    FigureSpec,
    _slug,
    check_plottable,
    draw,
    figures,
    plot_command,
)
from harness.analysis.figures.accuracy import (  # noqa: F401
    _acc_frame,
    _acc_series,
    _band,
    _gap_order,
    _heat_rows,
    _train_marks,
    plot_accuracy,
    plot_fidelity,
    plot_mqar,
    plot_passkey,
    plot_position_heatmap,
    plot_tradeoff,
    position_table,
    tradeoff_points,
)
from harness.analysis.figures.cost import (  # noqa: F401
    HOLLOW_LABEL,
    _cost_frame,
    _cost_lines,
    _hollow_note,
    _mark_failures,
    _reference_line,
    _series_line,
    plot_flops_fraction,
    plot_latency,
    plot_memory,
    plot_speedup,
    plot_throughput,
)
from harness.analysis.figures.layout import _default_build, plot_block_sparse_layout  # noqa: F401
from harness.analysis.figures.style import (  # noqa: F401
    _BACKEND_ORDER,
    _LINESTYLES,
    _MARKERS,
    FAIL_MARKER,
    FORMATS,
    MODE_ORDER,
    Skip,
    _facets,
    _figure,
    _finish,
    _frame_palette,
    _legend_entries,
    _length_axis,
    _order_key,
    _split_palette,
    _style,
    _styles,
    mem_unit,
    palette,
    palette_for,
    save,
)

warnings.warn("harness.plots moved to harness.analysis.figures; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)

__all__ = [
    "FIGURES", "Skip", "figures", "mem_unit", "palette", "palette_for", "plot_accuracy", "plot_block_sparse_layout",
    "plot_command", "plot_fidelity", "plot_flops_fraction", "plot_latency", "plot_memory", "plot_mqar", "plot_passkey",
    "plot_position_heatmap", "plot_speedup", "plot_throughput", "plot_tradeoff", "save", "tradeoff_points",
]
