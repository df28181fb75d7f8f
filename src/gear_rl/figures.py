"""Figures as PNG files (matplotlib, no display needed): the helpers every figure of the project
shares, and nothing about what it shows.

- :class:`Plot`: one finished figure with a file stem and a one-line title;
- :func:`figure_png` / :func:`save_plot`: its PNG bytes / its file, carrying the title and the
  axis labels as PNG text chunks (``Title``, ``Axes``), so that a test, or a script sorting
  hundreds of plots, can tell what a file shows without looking at it;
- :func:`band_plot`: curves of several methods over training steps, each the mean over its runs
  with the band between the lowest and highest run (``gear-rl compare``, ``gear-rl study``).

The run report's curves (:mod:`gear_rl.report.plots`), the comparison's and the study's figures
and the credit check's trajectory plot (:mod:`gear_rl.credit_check.output`) are drawn with these.
Imports from the project: :mod:`gear_rl.rundir` (atomic writes) only.
"""

from __future__ import annotations

import io
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from gear_rl.rundir import atomic_write_bytes

__all__ = ["Curve", "Plot", "band_plot", "figure_png", "save_plot"]

Curve = tuple[list[int], list[float]]
"""``(steps, values)`` of one run."""


@dataclass
class Plot:
    """One finished figure.

    Attributes:
        name: file stem (``reward`` -> ``reward.png``).
        title: what it shows, one line.
        figure: the matplotlib figure (labelled axes).
    """

    name: str
    title: str
    figure: Figure

    @property
    def labels(self) -> list[dict[str, str]]:
        """Each axes' ``xlabel``/``ylabel``/``title``, in drawing order."""
        return [{"xlabel": axes.get_xlabel(), "ylabel": axes.get_ylabel(),
                 "title": axes.get_title()} for axes in self.figure.axes]


def figure_png(plot: Plot, dpi: int = 110) -> bytes:
    """The plot as PNG bytes, with ``Title`` and ``Axes`` (JSON of the labels) text chunks."""
    buffer = io.BytesIO()
    plot.figure.savefig(buffer, format="png", dpi=dpi, metadata={
        "Title": plot.title, "Axes": json.dumps(plot.labels), "Software": "gear-rl report"})
    return buffer.getvalue()


def save_plot(plot: Plot, folder: str | Path) -> Path:
    """Write ``folder/<plot.name>.png`` atomically; returns its path."""
    path = Path(folder) / f"{plot.name}.png"
    atomic_write_bytes(path, figure_png(plot))
    return path


def _mean_curve(curves: list[Curve]
                ) -> tuple[list[int], list[float], list[float], list[float]]:
    """Per step present in any run: mean, min and max over the runs that have it."""
    by_step: dict[int, list[float]] = {}
    for steps, values in curves:
        for step, value in zip(steps, values, strict=True):
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    return (steps, [statistics.fmean(by_step[s]) for s in steps],
            [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps])


def band_plot(name: str, title: str, panels: Sequence[tuple[str, str]],
              methods: Sequence[tuple[str, Sequence[Sequence[Curve]]]]) -> Plot:
    """One figure with a panel per ``(title, ylabel)`` of ``panels`` (x: training step). Each
    method, ``(label, per panel the curves of its runs)``, is drawn in every panel as the mean
    over its runs at each step, shaded between the lowest and highest run (the seed band) when
    it has more than one run; a panel with no line has no legend."""
    figure = Figure(figsize=(5.5 * len(panels), 4.0), layout="constrained")
    axes_list = figure.subplots(1, len(panels), squeeze=False)[0]
    for axes, (panel_title, ylabel) in zip(axes_list, panels, strict=True):
        axes.set_title(panel_title)
        axes.set_xlabel("training step")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
    for index, (label, per_panel) in enumerate(methods):
        # ten colours, then the same colours dashed, then dotted: every method its own line
        colour, style = f"C{index % 10}", ("-", "--", ":")[(index // 10) % 3]
        for axes, curves in zip(axes_list, per_panel, strict=True):
            steps, mean, low, high = _mean_curve(list(curves))
            if not steps:
                continue
            axes.plot(steps, mean, color=colour, linestyle=style, label=label,
                      marker="o" if len(steps) < 30 else None, markersize=3)
            if len(curves) > 1:
                axes.fill_between(steps, low, high, color=colour, alpha=0.15, linewidth=0)
    for axes in axes_list:
        if axes.lines:
            axes.legend(fontsize="small")
    return Plot(name, title, figure)
