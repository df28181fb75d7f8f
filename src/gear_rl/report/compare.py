"""``gear-rl compare``: held-out Mean@k of several credit estimators over several seeds.

Either reads existing run directories or trains each ``(estimator, seed)`` with the same config
and budget, in process and one after another. Writes ``compare.md`` (a table of the final
held-out Mean@k per method with a t-interval over seeds, and each method against the baseline)
and ``curves.png`` (the held-out and training-reward curves of every method on one figure).

Statistics are over seeds only: the trainer logs aggregate eval metrics, not per-problem
results, so a per-problem bootstrap is not possible from a run directory. The decision rule is
spelled out in the output (:data:`RULE`).
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import scipy.stats
from matplotlib.figure import Figure

from gear_rl.report.data import RunData, load_run
from gear_rl.report.plots import Plot, figure_png
from gear_rl.rundir import RunDir, atomic_write_bytes, atomic_write_text

__all__ = [
    "RULE",
    "Comparison",
    "MethodResult",
    "compare_runs",
    "run_comparison",
    "t_interval",
    "welch_test",
]

RULE = ("A method's difference from the baseline counts as real only if Welch's two-sided "
        "t-test over seeds (final held-out Mean@k of each seed) gives p < {alpha:g}; otherwise "
        "it is reported as within noise. With fewer than 2 seeds on either side no test is "
        "possible and the difference is reported as not established. Intervals are {conf:g}% "
        "Student-t intervals over seeds (mean ± t * s / sqrt(n)); with 1 seed no interval "
        "exists.")


# ------------------------------------------------------------------------------ statistics
def t_interval(values: Sequence[float], confidence: float = 0.95
               ) -> tuple[float, float | None, float | None]:
    """``(mean, low, high)``: the Student-t confidence interval of the mean of ``values``
    (``low = high = None`` for a single value: no interval exists)."""
    if not values:
        raise ValueError("values must not be empty")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None
    half = (float(scipy.stats.t.ppf(0.5 + confidence / 2.0, len(values) - 1))
            * statistics.stdev(values) / math.sqrt(len(values)))
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class WelchResult:
    """Welch's unequal-variance t-test of ``mean(a) - mean(b)``.

    Attributes:
        difference: ``mean(a) - mean(b)``.
        t, df: the statistic and Welch-Satterthwaite degrees of freedom (None when both
            samples have zero variance).
        p: two-sided p-value (0.0 or 1.0 in the zero-variance case: the means differ or not).
    """

    difference: float
    t: float | None
    df: float | None
    p: float


def welch_test(a: Sequence[float], b: Sequence[float]) -> WelchResult | None:
    """Welch's two-sided t-test (``scipy.stats.ttest_ind(a, b, equal_var=False)``); None when
    either sample has fewer than 2 values."""
    if len(a) < 2 or len(b) < 2:
        return None
    difference = statistics.fmean(a) - statistics.fmean(b)
    # Checked with exact variances first: scipy's floating-point variance of identical values
    # can come out a rounding error above zero, which would turn "no spread" into a huge t.
    if statistics.variance(a) == 0.0 and statistics.variance(b) == 0.0:
        return WelchResult(difference, None, None, 1.0 if difference == 0 else 0.0)
    with warnings.catch_warnings():
        # scipy warns of "catastrophic cancellation" when one side has (almost) no spread; the
        # test is still right there (it matches the closed form, tests/test_compare.py).
        warnings.simplefilter("ignore", RuntimeWarning)
        test = scipy.stats.ttest_ind(a, b, equal_var=False)
    return WelchResult(difference, float(test.statistic), float(test.df), float(test.pvalue))


# ------------------------------------------------------------------------------ runs
@dataclass
class RunResult:
    """One run's contribution: its final held-out Mean@k and its curves."""

    path: Path
    label: str
    seed: int | None
    final: float
    final_step: int
    last_step: int
    start: float | None
    eval_curve: tuple[list[int], list[float]]
    reward_curve: tuple[list[int], list[float]]
    task: str
    model: str


@dataclass
class MethodResult:
    """One method over its seeds.

    Attributes:
        label: the estimator (with its ``credit`` overrides, if any).
        runs: its runs, by seed.
        mean, low, high: mean final Mean@k over seeds and its t-interval (None with 1 seed).
        versus: comparison with the baseline (None for the baseline itself).
        verdict: the plain-words outcome of that comparison.
    """

    label: str
    runs: list[RunResult]
    mean: float
    low: float | None
    high: float | None
    versus: WelchResult | None = None
    verdict: str = ""

    @property
    def finals(self) -> list[float]:
        """Final held-out Mean@k of each seed."""
        return [r.final for r in self.runs]


@dataclass
class Comparison:
    """The outcome of :func:`compare_runs`.

    Attributes:
        metric: the compared metric key (``eval/mean@K``).
        methods: one entry per method, baseline first.
        baseline: the baseline's label (None when there is only one method).
        notes: warnings (budgets or tasks that differ, runs left out, unfinished runs).
        markdown, curves: the written ``compare.md`` and ``curves.png`` (None if not written).
    """

    metric: str
    methods: list[MethodResult]
    baseline: str | None
    confidence: float
    alpha: float
    notes: list[str] = field(default_factory=list)
    markdown: Path | None = None
    curves: Path | None = None


def _label(run: RunData) -> str:
    credit = run.config.get("credit") or {}
    if not credit:
        return run.estimator
    knobs = ",".join(f"{k}={v}" for k, v in sorted(credit.items()))
    return f"{run.estimator}[{knobs}]"


def _metric_key(runs: list[RunData]) -> str:
    ks = set()
    for run in runs:
        k = (run.config.get("eval") or {}).get("k")
        keys = {key for record in run.metrics for key in record
                if key.startswith("eval/mean@")}
        if isinstance(k, int) and f"eval/mean@{k}" in keys:
            ks.add(f"eval/mean@{k}")
        elif len(keys) == 1:
            ks.add(keys.pop())
        elif not keys:
            raise ValueError(f"{run.path}: metrics.jsonl has no held-out eval (eval/mean@K); "
                             "it cannot be compared")
        else:
            raise ValueError(f"{run.path}: several eval/mean@K keys and no eval.k in config")
    if len(ks) != 1:
        raise ValueError(f"runs evaluate different metrics {sorted(ks)}: compare runs with the "
                         "same eval.k")
    return ks.pop()


def _run_result(run: RunData, metric: str) -> RunResult:
    steps, values = run.series(metric)
    rewards = run.series("reward_mean")
    last_step = max(rewards[0], default=0)
    return RunResult(path=run.path, label=_label(run), seed=run.seed, final=values[-1],
                     final_step=steps[-1], last_step=last_step,
                     start=values[0] if steps[0] == 0 else None, eval_curve=(steps, values),
                     reward_curve=rewards, task=str(run.config.get("task", "?")),
                     model=str(run.config.get("model", "?")))


def _mean_curve(curves: list[tuple[list[int], list[float]]]
                ) -> tuple[list[int], list[float], list[float], list[float]]:
    """Per step present in any run: mean, min and max over the runs that have it."""
    by_step: dict[int, list[float]] = {}
    for steps, values in curves:
        for step, value in zip(steps, values, strict=True):
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    return (steps, [statistics.fmean(by_step[s]) for s in steps],
            [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps])


def curves_plot(methods: list[MethodResult], metric: str) -> Plot:
    """Held-out ``metric`` and training reward over steps, every method on one figure (mean
    over seeds, shaded between the lowest and highest seed)."""
    figure = Figure(figsize=(11.0, 4.0), layout="constrained")
    held, reward = figure.subplots(1, 2)
    name = metric.removeprefix("eval/")
    for axes, title, ylabel in ((held, f"Held-out {name}", f"held-out {name}"),
                                (reward, "Training reward", "mean reward")):
        axes.set_title(title)
        axes.set_xlabel("training step")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
    for index, method in enumerate(methods):
        colour = f"C{index}"
        label = f"{method.label} (n={len(method.runs)})"
        for axes, curves in ((held, [r.eval_curve for r in method.runs]),
                             (reward, [r.reward_curve for r in method.runs])):
            steps, mean, low, high = _mean_curve(curves)
            if not steps:
                continue
            axes.plot(steps, mean, color=colour, label=label,
                      marker="o" if len(steps) < 30 else None, markersize=3)
            if len(method.runs) > 1:
                axes.fill_between(steps, low, high, color=colour, alpha=0.15, linewidth=0)
    for axes in (held, reward):
        if axes.lines:
            axes.legend(fontsize="small")
    return Plot("curves", f"Held-out {name} and training reward per method", figure)


def _verdict(method: MethodResult, baseline: MethodResult, alpha: float) -> str:
    test = method.versus
    difference = method.mean - baseline.mean
    if test is None:
        return (f"{difference:+.3f}; not established (fewer than 2 seeds on a side: no test "
                "possible)")
    if test.t is None:
        detail = "no variance across seeds on either side"
    else:
        detail = f"Welch t = {test.t:.2f}, df = {test.df:.1f}, p = {test.p:.3f}"
    if test.p < alpha:
        word = "better than" if difference > 0 else "worse than"
        return f"{difference:+.3f}; {word} {baseline.label} ({detail} < {alpha:g})"
    return f"{difference:+.3f}; within noise ({detail} >= {alpha:g})"


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _markdown(comparison: Comparison) -> str:
    metric = comparison.metric.removeprefix("eval/")
    conf = comparison.confidence * 100
    lines = [f"# gear-rl compare: held-out {metric}", ""]
    runs = [r for m in comparison.methods for r in m.runs]
    tasks = sorted({r.task for r in runs})
    models = sorted({r.model for r in runs})
    budgets = sorted({r.last_step for r in runs})
    lines += [f"Task: {', '.join(tasks)}. Model: {', '.join(models)}. Training steps: "
              f"{', '.join(map(str, budgets))}. {len(runs)} runs.", ""]
    base = comparison.baseline
    lines += [f"| method | seeds | final {metric} (mean over seeds) | {conf:g}% CI over seeds | "
              f"per seed | vs {base or 'baseline'} |",
              "|---|---|---|---|---|---|"]
    for method in comparison.methods:
        seeds = ",".join(str(r.seed) for r in method.runs)
        interval = ("no CI (1 seed)" if method.low is None
                    else f"[{method.low:.3f}, {method.high:.3f}]")
        per_seed = ", ".join(f"{v:.3f}" for v in method.finals)
        versus = "baseline" if method.label == base else (method.verdict or "—")
        lines.append(f"| {method.label} | {seeds} | {method.mean:.3f} | {interval} | "
                     f"{per_seed} | {versus} |")
    lines += ["", "**Rule.** " + RULE.format(alpha=comparison.alpha, conf=conf)]
    lines += ["", "Per-problem results are not logged, so the interval covers seed-to-seed "
              "variation only (each seed's eval is itself a finite sample of problems)."]
    verdicts = [m for m in comparison.methods if m.label != base]
    if base and verdicts:
        within = [m.label for m in verdicts if "within noise" in m.verdict
                  or "not established" in m.verdict]
        lines += [""]
        if within and len(within) == len(verdicts):
            lines.append(f"**Bottom line:** no method differs from {base} beyond noise.")
        elif within:
            lines.append(f"**Bottom line:** within noise of {base}: {', '.join(within)}.")
        else:
            lines.append(f"**Bottom line:** every method differs from {base} beyond noise.")
    lines += ["", "## Runs", "", f"| method | seed | {metric} at start | final {metric} | "
              "final eval step | last training step | run directory |",
              "|---|---|---|---|---|---|---|"]
    for method in comparison.methods:
        for r in method.runs:
            lines.append(f"| {method.label} | {r.seed} | {_fmt(r.start)} | {r.final:.3f} | "
                         f"{r.final_step} | {r.last_step} | `{r.path}` |")
    if comparison.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in comparison.notes]
    lines += ["", "![curves](curves.png)", ""]
    return "\n".join(lines)


def compare_runs(run_dirs: Sequence[str | Path], out: str | Path | None = None, *,
                 baseline: str | None = None, confidence: float = 0.95,
                 alpha: float = 0.05) -> Comparison:
    """Compare finished runs: group them by method (estimator + ``credit`` overrides), take
    each run's final held-out Mean@k, and test every method against the baseline.

    Args:
        run_dirs: ``gear-rl train`` run directories.
        out: folder for ``compare.md`` and ``curves.png``; None writes nothing.
        baseline: the method to compare against; default ``grpo`` when present, else the first
            method.
        confidence: the t-interval's level. alpha: Welch-test significance level.

    Raises:
        ValueError: no runs, a run without held-out eval, runs with different eval.k, the same
            method and seed twice, an unknown baseline, or a bad ``confidence``/``alpha``.
    """
    if not run_dirs:
        raise ValueError("compare: give at least one run directory")
    if not 0.0 < confidence < 1.0 or not 0.0 < alpha < 1.0:
        raise ValueError(f"confidence and alpha must lie in (0, 1), got {confidence!r}, "
                         f"{alpha!r}")
    runs = [load_run(path) for path in run_dirs]
    metric = _metric_key(runs)
    results = [_run_result(run, metric) for run in runs]
    notes: list[str] = []
    seen: dict[tuple[str, int | None], Path] = {}
    by_method: dict[str, list[RunResult]] = {}
    for result in results:
        key = (result.label, result.seed)
        if key in seen:
            raise ValueError(f"compare: {result.path} and {seen[key]} are both {result.label} "
                             f"with seed {result.seed}; give each (method, seed) once")
        seen[key] = result.path
        by_method.setdefault(result.label, []).append(result)
        if result.final_step < result.last_step:
            notes.append(f"{result.path}: last held-out eval at step {result.final_step}, "
                         f"training went to step {result.last_step}")
    for name, values in (("task", {r.task for r in results}), ("model", {r.model for r in results}),
                         ("training steps", {r.last_step for r in results})):
        if len(values) > 1:
            notes.append(f"the runs differ in {name} ({', '.join(map(str, sorted(values)))}): "
                         "the comparison is not like for like")
    labels = list(by_method)
    if baseline is None:
        baseline = "grpo" if "grpo" in by_method else labels[0]
    elif baseline not in by_method:
        raise ValueError(f"compare: baseline {baseline!r} is not among the methods {labels}")
    methods = []
    for label in [baseline, *[m for m in labels if m != baseline]]:
        group = sorted(by_method[label], key=lambda r: (r.seed is None, r.seed or 0))
        mean, low, high = t_interval([r.final for r in group], confidence)
        methods.append(MethodResult(label, group, mean, low, high))
    base = methods[0]
    for method in methods[1:]:
        method.versus = welch_test(method.finals, base.finals)
        method.verdict = _verdict(method, base, alpha)
    comparison = Comparison(metric=metric, methods=methods,
                            baseline=baseline if len(methods) > 1 else None,
                            confidence=confidence, alpha=alpha, notes=notes)
    if out is not None:
        folder = Path(out)
        comparison.curves = folder / "curves.png"
        atomic_write_bytes(comparison.curves, figure_png(curves_plot(methods, metric)))
        comparison.markdown = folder / "compare.md"
        atomic_write_text(comparison.markdown, _markdown(comparison))
        atomic_write_text(folder / "compare.json", json.dumps(_as_json(comparison), indent=2)
                          + "\n")
    return comparison


def _as_json(comparison: Comparison) -> dict[str, Any]:
    return {"metric": comparison.metric, "baseline": comparison.baseline,
            "confidence": comparison.confidence, "alpha": comparison.alpha,
            "rule": RULE.format(alpha=comparison.alpha, conf=comparison.confidence * 100),
            "notes": comparison.notes,
            "methods": [{"label": m.label, "mean": m.mean, "ci": [m.low, m.high],
                         "seeds": [r.seed for r in m.runs], "finals": m.finals,
                         "runs": [str(r.path) for r in m.runs], "verdict": m.verdict,
                         "welch": None if m.versus is None else vars(m.versus)}
                        for m in comparison.methods]}


def format_comparison(comparison: Comparison) -> str:
    """The comparison table as text for the terminal (the Markdown table)."""
    return _markdown(comparison).split("\n## Runs")[0].rstrip()


_RESERVED = ("estimator", "seed", "out", "resume")


def run_comparison(estimators: Sequence[str], seeds: Sequence[int], out: str | Path, *,
                   config_path: str | Path | None = None, overrides: Sequence[str] = (),
                   baseline: str | None = None, confidence: float = 0.95,
                   alpha: float = 0.05) -> Comparison:
    """Train every ``(estimator, seed)`` with the same config and budget, one after another in
    this process, into ``out/<estimator>-s<seed>``, then :func:`compare_runs` them into ``out``.

    A run directory that already holds a finished run (``summary.json``) is reused, so an
    interrupted comparison continues where it stopped.

    Args:
        estimators: estimator names (``gear_rl.credit`` registry, or ``opsd``).
        seeds: seeds, the same for every estimator.
        out: the comparison folder.
        config_path: a ``gear-rl train`` YAML config shared by all runs.
        overrides: ``key=value`` train overrides shared by all runs (not estimator, seed, out).

    Raises:
        ValueError: empty or duplicate estimators/seeds, a reserved override, or a config the
            trainer rejects (checked for every run before any training starts).
    """

    from gear_rl.train.config import config_to_dict, load_config

    if not estimators or not seeds:
        raise ValueError("compare: give at least one estimator and one seed")
    if len(set(estimators)) != len(estimators) or len(set(seeds)) != len(seeds):
        raise ValueError(f"compare: duplicate estimators or seeds ({list(estimators)}, "
                         f"{list(seeds)})")
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in _RESERVED:
            raise ValueError(f"compare: {key}= is set per run by compare; drop {item!r}")
    folder = Path(out)
    configs = []
    for estimator in estimators:
        for seed in seeds:
            run_dir = folder / f"{estimator}-s{seed}"
            config = load_config(config_path, [*overrides, f"estimator={estimator}",
                                               f"seed={seed}", f"out={run_dir}"])
            configs.append((run_dir, config))
    from gear_rl.train.trainer import Trainer

    for run_dir, config in configs:
        if RunDir(run_dir).finished():
            saved = RunDir(run_dir).read_config()
            wanted = config_to_dict(config)
            wanted["out"] = str(run_dir)
            if saved != wanted:
                changed = sorted(k for k in wanted if saved.get(k) != wanted[k])
                raise ValueError(f"compare: {run_dir} holds a finished run with another config "
                                 f"(differs in {changed}); choose another --out")
            continue
        Trainer(config).train()
    return compare_runs([run_dir for run_dir, _ in configs], folder, baseline=baseline,
                        confidence=confidence, alpha=alpha)
