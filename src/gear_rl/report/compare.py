"""``gear-rl compare``: held-out Mean@k of several credit estimators over several seeds, read
from their run directories (:func:`compare_runs`; training them first, ``gear-rl compare
--estimators``, is :func:`gear_rl.study.compare.run_comparison`'s). Writes ``compare.md`` (a
table of the final held-out Mean@k per method with a t-interval over seeds, and each method
against the baseline), ``compare.json`` and ``curves.png`` (the held-out and training-reward
curves of every method on one figure).

Only like is compared with like: runs that differ in a setting of :data:`COMPARABLE` (task,
model, training budget, evaluation) are refused unless ``allow_mismatch`` is given, and then the
written tables name the settings that differ. A run that did not finish (no ``summary.json``, or
its last held-out eval before its configured last step) has no final score: it is listed as
unfinished and left out of the statistics. So is a finished run of the TRL or verl adapter that
logged no held-out eval (their run logs hold training records only): it is listed with "no
held-out eval", and the others are compared.

Statistics are over seeds only (:func:`gear_rl.stats.t_interval`,
:func:`gear_rl.stats.welch_test`): by default the trainer logs aggregate eval metrics, not
per-problem results. ``gear-rl study`` (:mod:`gear_rl.study`) trains with ``eval.records=true``
and compares methods problem by problem with a paired bootstrap (:mod:`gear_rl.stats`); it
checks its cells with the pieces here (:data:`COMPARABLE`, :func:`mismatched_configs`,
:func:`mismatch_error`). The decision rule is spelled out in the output (:data:`RULE`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gear_rl.credit import get_estimator
from gear_rl.dataclass_config import check_output_folder
from gear_rl.figures import Plot, band_plot, figure_png
from gear_rl.report.data import RunData, eval_keys, load_run
from gear_rl.rundir import RunDir, atomic_write_bytes, atomic_write_text, trained_on
from gear_rl.stats import WelchResult, t_interval, welch_test

__all__ = [
    "COMPARABLE",
    "RULE",
    "Comparison",
    "MethodResult",
    "compare_runs",
    "format_comparison",
    "mismatch_error",
    "mismatched_configs",
    "mismatched_settings",
]

RULE = ("A method's difference from the baseline counts as real only if Welch's two-sided "
        "t-test over seeds (final held-out Mean@k of each seed) gives p < {alpha:g}; otherwise "
        "it is reported as within noise. With fewer than 2 seeds on either side no test is "
        "possible and the difference is reported as not established. Intervals are {conf:g}% "
        "Student-t intervals over seeds (mean ± t * s / sqrt(n)); with 1 seed no interval "
        "exists.")

# The settings two runs must share to be compared: the engine (``engine`` in an adapter run's
# config.yaml; unset for gear-rl's own runs), the task and its held-out set, the model, the
# training budget and the evaluation. The estimator, its credit.* overrides and the seed are
# what a comparison varies; the rest (threads, device, logging) does not change the scores.
COMPARABLE = ("engine", "task", "task_options", "instruction", "eval_data", "train_size",
              "model", "steps", "rollout.prompts_per_step", "rollout.samples_per_prompt",
              "rollout.max_new_tokens",
              "eval.size", "eval.k", "eval.temperature", "eval.top_p", "eval.max_new_tokens",
              "eval.seed")
UNSET = "(unset)"  # how a setting missing from a run's config.yaml is shown


# ------------------------------------------------------------------------------ runs
@dataclass
class RunResult:
    """One run's contribution: its final held-out Mean@k and its curves.

    Attributes:
        final, final_step: the last held-out eval and its step (None: the run never evaluated).
        last_step: the last training step logged.
        steps: the configured number of steps (None when ``config.yaml`` has none).
        unfinished_at: for a run that did not finish, the last step it logged (then ``final``
            is not a score and the run is left out of the statistics); None for a finished run.
        engine: the engine that trained it (``run.json``; ``gear-rl`` when absent).
        no_eval: a finished TRL or verl run without any held-out eval: it has no score and is
            left out of the statistics like an unfinished one.
        trained_on: where it trained (:func:`~gear_rl.rundir.trained_on`: processor and
            precision, then those of any resume that ran elsewhere).
    """

    path: Path
    label: str
    seed: int | None
    final: float | None
    final_step: int | None
    last_step: int
    start: float | None
    eval_curve: tuple[list[int], list[float]]
    reward_curve: tuple[list[int], list[float]]
    task: str
    model: str
    steps: int | None = None
    unfinished_at: int | None = None
    engine: str = "gear-rl"
    no_eval: bool = False
    trained_on: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.unfinished_at is None


@dataclass
class MethodResult:
    """One method over its seeds.

    Attributes:
        label: the estimator (with its ``credit`` overrides, if any).
        runs: its finished runs, by seed (the statistics are over these).
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
    unfinished: list[RunResult] = field(default_factory=list)

    @property
    def finals(self) -> list[float]:
        """Final held-out Mean@k of each finished seed."""
        return [r.final for r in self.runs if r.final is not None]


@dataclass
class Comparison:
    """The outcome of :func:`compare_runs`.

    Attributes:
        metric: the compared metric key (``eval/mean@K``).
        methods: one entry per method with a finished run, baseline first.
        baseline: the baseline's label (None when there is only one method).
        notes: warnings (settings that differ, unfinished runs).
        unfinished: the runs that did not finish (left out of the statistics), in input order.
        mismatch: each :data:`COMPARABLE` setting the runs differ in (compared anyway with
            ``allow_mismatch``): run directory -> its value; empty when they agree.
        markdown, curves: the written ``compare.md`` and ``curves.png`` (None if not written).
    """

    metric: str
    methods: list[MethodResult]
    baseline: str | None
    confidence: float
    alpha: float
    notes: list[str] = field(default_factory=list)
    unfinished: list[RunResult] = field(default_factory=list)
    mismatch: dict[str, dict[str, Any]] = field(default_factory=dict)
    markdown: Path | None = None
    curves: Path | None = None


def _label(run: RunData) -> str:
    """The run's estimator, with each ``credit`` field whose value differs from that
    estimator's default today (all of them, for an estimator not registered here)."""
    credit = run.config.get("credit") or {}
    try:
        defaults = dataclasses.asdict(get_estimator(run.estimator).make_config())
    except (TypeError, ValueError):
        defaults = {}
    knobs = ",".join(f"{k}={v}" for k, v in sorted(credit.items())
                     if k not in defaults or defaults[k] != v)
    return f"{run.estimator}[{knobs}]" if knobs else run.estimator


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


def _scored(run: RunData) -> bool:
    """Whether the run can have a held-out score: a gear-rl run (one without held-out eval is
    an error, :func:`_metric_key`), or an adapter's run that logged an ``eval/mean@K``."""
    return run.engine == "gear-rl" or bool(eval_keys(run.metrics))


def _run_result(run: RunData, metric: str) -> RunResult:
    """The run's final held-out ``metric``, or, for a run that did not finish (no summary, or
    its last eval before its configured last step) or has no held-out eval (an adapter's run),
    the step it stopped at."""
    steps, values = run.series(metric)
    rewards = run.series("reward_mean")
    last_step = max(rewards[0], default=0)
    configured = run.config.get("steps")
    configured = configured if isinstance(configured, int) else None
    final_step = steps[-1] if steps else None
    finished = RunDir(run.path).finished() and final_step is not None and (
        configured is None or final_step >= configured)
    logged = [r["step"] for r in run.metrics if isinstance(r.get("step"), int)]
    return RunResult(path=run.path, label=_label(run), seed=run.seed,
                     final=values[-1] if steps else None, final_step=final_step,
                     last_step=last_step, start=values[0] if steps and steps[0] == 0 else None,
                     eval_curve=(steps, values), reward_curve=rewards,
                     task=str(run.config.get("task", "?")),
                     model=str(run.config.get("model", "?")), steps=configured,
                     unfinished_at=None if finished else max(logged, default=0),
                     engine=run.engine,
                     no_eval=RunDir(run.path).finished() and not _scored(run),
                     trained_on=tuple(trained_on(run.info)))


def _setting(config: dict[str, Any], key: str) -> Any:
    """The value of a dotted ``key`` in a run's config (:data:`UNSET` when absent)."""
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return UNSET
        value = value[part]
    return value


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True,
                                                                   default=str)


def mismatched_settings(runs: Sequence[RunData]) -> dict[str, dict[str, Any]]:
    """Each :data:`COMPARABLE` setting on which ``runs`` disagree: run directory -> value."""
    return mismatched_configs({str(run.path): run.config for run in runs})


def mismatched_configs(configs: Mapping[str, Mapping[str, Any]]
                       ) -> dict[str, dict[str, Any]]:
    """Each :data:`COMPARABLE` setting on which the nested ``configs`` (name -> config dict, as
    in ``config.yaml``) disagree: name -> value."""
    out: dict[str, dict[str, Any]] = {}
    for key in COMPARABLE:
        values = {name: _setting(dict(config), key) for name, config in configs.items()}
        first = next(iter(values.values()), None)
        if any(not _same(first, value) for value in values.values()):
            out[key] = values
    return out


def _names(paths: list[str], most: int = 3) -> str:
    shown = ", ".join(paths[:most])
    return shown if len(paths) <= most else f"{shown} and {len(paths) - most} more"


def mismatch_error(mismatch: dict[str, dict[str, Any]], *, command: str = "compare",
                   remedy: str = "pass --allow-mismatch (allow_mismatch=True) to compare them "
                                 "anyway") -> str:
    """One line: which runs differ from the first one, in which settings, then ``remedy``."""
    keys = list(mismatch)
    runs = list(next(iter(mismatch.values())))
    groups: list[list[str]] = []  # runs with the same values of the differing settings
    for run in runs:
        for group in groups:
            if all(_same(mismatch[k][group[0]], mismatch[k][run]) for k in keys):
                group.append(run)
                break
        else:
            groups.append([run])
    reference, *others = groups
    parts = []
    for group in others:
        differing = [f"{k} ({mismatch[k][reference[0]]!r} vs {mismatch[k][group[0]]!r})"
                     for k in keys if not _same(mismatch[k][reference[0]], mismatch[k][group[0]])]
        verb = "differs" if len(group) == 1 else "differ"
        parts.append(f"{_names(group)} {verb} from {_names(reference)} in {', '.join(differing)}")
    return f"{command}: the runs are not comparable: {'; '.join(parts)}; {remedy}"


def curves_plot(methods: list[MethodResult], metric: str) -> Plot:
    """Held-out ``metric`` and training reward over steps, every method on one figure (mean
    over seeds, shaded between the lowest and highest seed)."""
    name = metric.removeprefix("eval/")
    return band_plot(
        "curves", f"Held-out {name} and training reward per method",
        [(f"Held-out {name}", f"held-out {name}"), ("Training reward", "mean reward")],
        [(f"{method.label} (n={len(method.runs)})",
          [[r.eval_curve for r in method.runs], [r.reward_curve for r in method.runs]])
         for method in methods])


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


def _unfinished(run: RunResult, seed: bool = False) -> str:
    text = (f"no held-out eval ({run.engine} run, {run.last_step} steps)" if run.no_eval
            else f"unfinished at step {run.unfinished_at}")
    return f"seed {run.seed} {text}" if seed else text


def _by_label(runs: Iterable[RunResult]) -> list[tuple[str, list[RunResult]]]:
    groups: dict[str, list[RunResult]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return list(groups.items())


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text.replace("|", "\\|")


def _machines(runs: Iterable[RunResult]) -> dict[str, list[str]]:
    """Where the runs trained (``"A"``, or ``"A, then B"`` for a run resumed elsewhere) -> the
    runs, as ``label-sSEED``."""
    groups: dict[str, list[str]] = {}
    for run in runs:
        groups.setdefault(", then ".join(run.trained_on), []).append(f"{run.label}-s{run.seed}")
    return groups


def _markdown(comparison: Comparison) -> str:
    metric = comparison.metric.removeprefix("eval/")
    conf = comparison.confidence * 100
    lines = [f"# gear-rl compare: held-out {metric}", ""]
    finished = [r for m in comparison.methods for r in m.runs]
    runs = finished + comparison.unfinished
    tasks = sorted({r.task for r in runs})
    models = sorted({r.model for r in runs})
    budgets = sorted({r.last_step if r.steps is None else r.steps for r in runs})
    counted = (f"{len(runs)} runs" if not comparison.unfinished else
               f"{len(runs)} runs, {len(comparison.unfinished)} of them unfinished (left out of "
               "the statistics)")
    lines += [f"Task: {', '.join(tasks)}. Model: {', '.join(models)}. Training steps: "
              f"{', '.join(map(str, budgets))}. {counted}.", ""]
    machines = _machines(runs)
    if len(machines) > 1:
        lines += ["**Trained on more than one machine or precision** (`precision: auto` is bf16 "
                  "where it is native and fp32 elsewhere, and the same weights sample "
                  "differently under the two): " + "; ".join(
                      f"{where} ({', '.join(names)})" for where, names in machines.items())
                  + ".", ""]
    if comparison.mismatch:
        lines += [f"**Not like for like:** the runs differ in {', '.join(comparison.mismatch)} "
                  "(compared anyway, with --allow-mismatch); each run's values are under "
                  "*Differing settings*.", ""]
    base = comparison.baseline
    lines += [f"| method | seeds | final {metric} (mean over seeds) | {conf:g}% CI over seeds | "
              f"per seed | vs {base or 'baseline'} |",
              "|---|---|---|---|---|---|"]
    for method in comparison.methods:
        seeds = ",".join(str(r.seed) for r in method.runs)
        interval = ("no CI (1 seed)" if method.low is None
                    else f"[{method.low:.3f}, {method.high:.3f}]")
        per_seed = ", ".join([f"{v:.3f}" for v in method.finals]
                             + [_unfinished(r, seed=True) for r in method.unfinished])
        versus = "baseline" if method.label == base else (method.verdict or "—")
        lines.append(f"| {method.label} | {seeds} | {method.mean:.3f} | {interval} | "
                     f"{per_seed} | {versus} |")
    labels = {m.label for m in comparison.methods}
    for label, group in _by_label(r for r in comparison.unfinished if r.label not in labels):
        per_seed = ", ".join(_unfinished(r, seed=True) for r in group)
        lines.append(f"| {label} | — | — | — | {per_seed} | no finished run |")
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
            lines.append(f"| {method.label} | {r.seed} | {_fmt(r.start)} | {_fmt(r.final)} | "
                         f"{r.final_step} | {r.last_step} | `{r.path}` |")
    for r in comparison.unfinished:
        lines.append(f"| {r.label} | {r.seed} | {_fmt(r.start)} | {_unfinished(r)} | "
                     f"{'—' if r.final_step is None else r.final_step} | {r.last_step} | "
                     f"`{r.path}` |")
    if comparison.mismatch:
        keys = list(comparison.mismatch)
        lines += ["", "## Differing settings", "", f"| run directory | {' | '.join(keys)} |",
                  "|---|" + "---|" * len(keys)]
        for path in next(iter(comparison.mismatch.values())):
            cells = " | ".join(_cell(comparison.mismatch[k][path]) for k in keys)
            lines.append(f"| `{path}` | {cells} |")
    if comparison.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in comparison.notes]
    lines += ["", "![curves](curves.png)", ""]
    return "\n".join(lines)


def compare_runs(run_dirs: Sequence[str | Path], out: str | Path | None = None, *,
                 baseline: str | None = None, confidence: float = 0.95,
                 alpha: float = 0.05, allow_mismatch: bool = False) -> Comparison:
    """Compare finished runs: group them by method (estimator + ``credit`` overrides), take
    each run's final held-out Mean@k, and test every method against the baseline.

    A run that did not finish (no ``summary.json``, or its last held-out eval before its
    configured ``steps``) has no final score: it is listed as unfinished at the last step it
    logged and left out of the statistics.

    Args:
        run_dirs: ``gear-rl train`` run directories.
        out: folder for ``compare.md``, ``compare.json`` and ``curves.png``; None writes nothing.
        baseline: the method to compare against; default ``grpo`` when it has a finished run,
            else the first method that has one.
        confidence: the t-interval's level. alpha: Welch-test significance level.
        allow_mismatch: compare runs that differ in a :data:`COMPARABLE` setting anyway; the
            written tables then name the settings that differ.

    Raises:
        ValueError: no runs, no finished run, a finished run without held-out eval, runs with
            different eval.k, runs that differ in a :data:`COMPARABLE` setting (without
            ``allow_mismatch``; one line naming the runs and settings), the same method and seed
            twice among the finished runs, an unknown baseline or one without a finished run,
            a bad ``confidence``/``alpha``, a run directory that is not a directory (a file, a
            FIFO: said which), or an ``out`` that is a file (or has a file on its path).
    """
    if not run_dirs:
        raise ValueError("compare: give at least one run directory")
    if not 0.0 < confidence < 1.0 or not 0.0 < alpha < 1.0:
        raise ValueError(f"confidence and alpha must lie in (0, 1), got {confidence!r}, "
                         f"{alpha!r}")
    if out is not None:  # a file there: say so before reading every run
        check_output_folder(out, "compare: the output folder")
    runs = [load_run(path) for path in run_dirs]
    mismatch = mismatched_settings(runs)
    if mismatch and not allow_mismatch:
        raise ValueError(mismatch_error(mismatch))
    ended = [run for run in runs if RunDir(run.path).finished() and _scored(run)]
    metric = _metric_key(ended) if ended else ""  # no run ended: all are unscored, below
    results = [_run_result(run, metric) for run in runs]
    unfinished = [r for r in results if not r.finished]
    if len(unfinished) == len(results):
        raise ValueError("compare: no run finished: " + _names(
            [f"{r.path} {_unfinished(r)}" for r in unfinished]))
    notes: list[str] = []
    seen: dict[tuple[str, int | None], Path] = {}
    by_method: dict[str, list[RunResult]] = {}
    for result in results:
        if not result.finished:
            why = ("no summary.json" if not RunDir(result.path).finished() else
                   "its engine logs training records only" if result.no_eval else
                   f"last held-out eval at step {result.final_step} of {result.steps}")
            notes.append(f"{result.path}: {_unfinished(result)} ({why}); left out of the "
                         "statistics")
            continue
        key = (result.label, result.seed)
        if key in seen:
            raise ValueError(f"compare: {result.path} and {seen[key]} are both {result.label} "
                             f"with seed {result.seed}; give each (method, seed) once")
        seen[key] = result.path
        by_method.setdefault(result.label, []).append(result)
        if result.final_step is not None and result.final_step < result.last_step:
            notes.append(f"{result.path}: last held-out eval at step {result.final_step}, "
                         f"training went to step {result.last_step}")
    if mismatch:
        notes.append(f"the runs differ in {', '.join(mismatch)} (compared anyway, with "
                     "--allow-mismatch): the comparison is not like for like")
    labels = list(by_method)
    every = list(dict.fromkeys(r.label for r in results))
    if baseline is None:
        baseline = "grpo" if "grpo" in by_method else labels[0]
        if "grpo" in every and "grpo" not in by_method:
            notes.append(f"grpo has no finished run; the baseline is {baseline}")
    elif baseline not in by_method:
        if baseline in every:
            raise ValueError(f"compare: baseline {baseline!r} has no finished run (finished "
                             f"methods: {labels})")
        raise ValueError(f"compare: baseline {baseline!r} is not among the methods {every}")

    def by_seed(r: RunResult) -> tuple[bool, int]:
        return (r.seed is None, r.seed or 0)

    methods = []
    for label in [baseline, *[m for m in labels if m != baseline]]:
        group = sorted(by_method[label], key=by_seed)
        mean, low, high = t_interval([r.final for r in group if r.final is not None],
                                     confidence)
        methods.append(MethodResult(label, group, mean, low, high, unfinished=sorted(
            (r for r in unfinished if r.label == label), key=by_seed)))
    base = methods[0]
    for method in methods[1:]:
        method.versus = welch_test(method.finals, base.finals)
        method.verdict = _verdict(method, base, alpha)
    comparison = Comparison(metric=metric, methods=methods,
                            baseline=baseline if len(methods) > 1 else None,
                            confidence=confidence, alpha=alpha, notes=notes,
                            unfinished=unfinished, mismatch=mismatch)
    if out is not None:
        folder = Path(out)
        comparison.curves = folder / "curves.png"
        atomic_write_bytes(comparison.curves, figure_png(curves_plot(methods, metric)))
        comparison.markdown = folder / "compare.md"
        atomic_write_text(comparison.markdown, _markdown(comparison))
        atomic_write_text(folder / "compare.json", json.dumps(_as_json(comparison), indent=2,
                                                              default=str) + "\n")
    return comparison


def _as_json(comparison: Comparison) -> dict[str, Any]:
    return {"metric": comparison.metric, "baseline": comparison.baseline,
            "confidence": comparison.confidence, "alpha": comparison.alpha,
            "rule": RULE.format(alpha=comparison.alpha, conf=comparison.confidence * 100),
            "notes": comparison.notes, "mismatch": comparison.mismatch,
            "trained_on": _machines([*(r for m in comparison.methods for r in m.runs),
                                     *comparison.unfinished]),
            "methods": [{"label": m.label, "mean": m.mean, "ci": [m.low, m.high],
                         "seeds": [r.seed for r in m.runs], "finals": m.finals,
                         "runs": [str(r.path) for r in m.runs], "verdict": m.verdict,
                         "welch": None if m.versus is None else vars(m.versus),
                         "unfinished": [str(r.path) for r in m.unfinished]}
                        for m in comparison.methods],
            "unfinished": [{"label": r.label, "seed": r.seed, "run": str(r.path),
                            "unfinished_at": r.unfinished_at, "last_eval_step": r.final_step}
                           for r in comparison.unfinished]}


def format_comparison(comparison: Comparison) -> str:
    """The comparison table as text for the terminal (the Markdown table)."""
    return _markdown(comparison).split("\n## Runs")[0].rstrip()
