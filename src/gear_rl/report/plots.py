"""Training curves of one run (``gear-rl report``), one :class:`~gear_rl.figures.Plot` per
curve: each its own figure, so that a reader can drop one into a paper or an issue. They are
written as PNG files by :mod:`gear_rl.figures`."""

from __future__ import annotations

from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gear_rl.figures import Plot
from gear_rl.report.data import RunData, eval_keys, weight_stats_by_step

__all__ = ["training_curves"]


def _figure(title: str, ylabel: str, xlabel: str = "training step") -> tuple[Figure, Axes]:
    figure = Figure(figsize=(6.0, 3.4), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    return figure, axes


def _line(axes: Axes, run: RunData, key: str, label: str, **style: Any) -> bool:
    steps, values = run.series(key)
    if not steps:
        return False
    axes.plot(steps, values, label=label, marker="o" if len(steps) < 30 else None,
              markersize=3, **style)
    return True


def training_curves(run: RunData) -> tuple[list[Plot], list[str]]:
    """The run's curves over steps and a note for each one that could not be drawn.

    Curves: reward, held-out accuracy (every ``eval/mean@K`` and ``eval/pass@K``), policy
    entropy, fraction of policy tokens in segments, token weight mean per advantage sign with
    its spread over the logged samples' tokens, and step time (wall and CPU).
    """
    plots: list[Plot] = []
    skipped: list[str] = []

    def single(key: str, title: str, ylabel: str, name: str, caption: str, missing: str,
               ylim: tuple[float, float] | None = None) -> None:
        figure, axes = _figure(title, ylabel)
        if _line(axes, run, key, key):
            if ylim is not None:
                axes.set_ylim(*ylim)
            plots.append(Plot(name, caption, figure))
        else:
            skipped.append(f"{missing}: no {key!r} in metrics.jsonl")

    single("reward_mean", "Training reward", "mean reward", "reward",
           "Training reward over steps", "reward")

    figure, axes = _figure("Held-out accuracy", "held-out accuracy")
    drawn = [key for key in eval_keys(run.metrics) + eval_keys(run.metrics, "eval/pass@")
             if _line(axes, run, key, key.removeprefix("eval/"))]
    if drawn:
        axes.legend(fontsize="small")
        plots.append(Plot("heldout", "Held-out Mean@k / pass@k over steps", figure))
    else:
        skipped.append("held-out accuracy: no 'eval/mean@K' in metrics.jsonl")

    single("entropy_mean", "Policy entropy", "entropy (nats per policy token)", "entropy",
           "Mean policy entropy over steps", "entropy")
    single("segment_frac", "Tokens in segments", "fraction of policy tokens", "segments",
           "Fraction of policy tokens inside GEAR segments",
           "segment fraction (the estimator does not segment)", ylim=(-0.02, 1.02))

    figure, axes = _figure("Token weights", "token weight W")
    drawn_weights = False
    spread = weight_stats_by_step(run.samples)
    for sign, key, colour, label, shift in (
            ("pos", "weight_mean_pos", "tab:green", "A > 0", -0.08),
            ("neg", "weight_mean_neg", "tab:red", "A < 0", 0.08)):
        drawn_weights |= _line(axes, run, key, f"mean W, {label} (all tokens)", color=colour)
        if spread[sign]:
            steps = [s + shift for s in spread[sign]]  # side by side, not on top
            means = [mean for mean, _ in spread[sign].values()]
            stds = [std for _, std in spread[sign].values()]
            axes.errorbar(steps, means, yerr=stds, fmt="none", ecolor=colour, alpha=0.5,
                          capsize=3, label=f"mean ± std, {label} (logged samples)")
            drawn_weights = True
    if drawn_weights:
        axes.legend(fontsize="x-small")
        plots.append(Plot("weights", "Token weight mean and spread per advantage sign",
                          figure))
    else:
        skipped.append("weights: no 'weight_mean_pos'/'weight_mean_neg' in metrics.jsonl and "
                       "no logged sample with weights and a non-zero advantage")

    figure, axes = _figure("Step time", "seconds per step")
    drawn_time = [_line(axes, run, key, label) for key, label in
                  (("time/step", "wall"), ("time/step_cpu", "CPU (this process)"))]
    if any(drawn_time):
        axes.legend(fontsize="small")
        plots.append(Plot("step_time", "Wall and CPU seconds per training step", figure))
    else:
        skipped.append("step time: no 'time/step' in metrics.jsonl")
    return plots, skipped
