"""The figure registry: each figure module registers its drawing functions with ``@register_figure``, in the order
``attn-bench plot`` draws them and the report shows them (the import order of :mod:`harness.analysis.figures`).

Accuracy figures are keyed by the task names rows carry, not by the accuracy harness (analysis reads results files
and imports nothing above the bottom layer): a figure that draws a task's rows in place of the per-length accuracy
figure names that task in ``tasks``, and the task declares the figure's name (tests/test_task_registry.py checks
that both sides agree). A task with no figure of its own is drawn by the generic ones."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from matplotlib.figure import Figure

NEEDS = ("cost", "accuracy", "both", "variants")


@dataclass(frozen=True)
class FigureSpec:
    name: str
    draw: Callable[..., Figure]
    needs: str  # "cost", "accuracy", "both" or "variants"
    description: str = ""  # one caption above it in the report
    tasks: tuple[str, ...] = ()  # accuracy tasks whose rows it draws in place of the per-length accuracy figure


_FIGURES: list[FigureSpec] = []


def register_figure(name: str, needs: str, description: str = "",
                    tasks: tuple[str, ...] = ()) -> Callable[[Callable[..., Figure]], Callable[..., Figure]]:
    """Function decorator: ``@register_figure("ruler", "accuracy", tasks=("ruler",))``."""
    if needs not in NEEDS:
        raise ValueError(f"figure {name!r}: needs must be one of {', '.join(NEEDS)}, got {needs!r}")

    def decorator(draw: Callable[..., Figure]) -> Callable[..., Figure]:
        if any(f.name == name for f in _FIGURES):
            raise ValueError(f"figure {name!r} is already registered")
        _FIGURES.append(FigureSpec(name, draw, needs, description, tuple(tasks)))
        return draw
    return decorator


def figure_specs() -> tuple[FigureSpec, ...]:
    return tuple(_FIGURES)


def own_figures() -> dict[str, str]:
    """task -> the first figure that draws its rows in place of the per-length accuracy figure."""
    out: dict[str, str] = {}
    for f in _FIGURES:
        for t in f.tasks:
            out.setdefault(t, f.name)
    return out


__all__ = ["FigureSpec", "figure_specs", "own_figures", "register_figure"]
