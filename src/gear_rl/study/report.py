"""A study's results: ``study.md``, ``study.json`` and ``plots/`` from its finished cells.

Per task: each method's held-out Mean@k (or pass@k) at the final step over its seeds and the
held-out problems, with a bootstrap interval; each method against the baseline by the paired
statistics of :mod:`gear_rl.stats` (difference, interval, minimum detectable difference,
seed-level test, verdict); learning curves with seed bands (held-out score, training reward,
policy entropy; GEAR's segment fraction and mean weight per advantage sign); and the tokens most
often above a normalised divergence threshold (the paper's Figure 2 analysis). Only like is
compared with like: the task's finished cells must agree on every setting of
:data:`gear_rl.report.compare.COMPARABLE`, and on the held-out problems and their k.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gear_rl.figures import band_plot, save_plot
from gear_rl.report.compare import mismatch_error, mismatched_settings
from gear_rl.report.data import RunData, TokenCount, load_run, top_divergence_tokens
from gear_rl.rundir import RunDir, atomic_write_text, read_eval_records, read_jsonl, trained_on
from gear_rl.stats import (
    Difference,
    Estimate,
    bootstrap_mean,
    minimum_detectable,
    paired_difference,
)
from gear_rl.study.registration import REGISTRATION, format_changes, require_registered
from gear_rl.study.runner import machine_info, plan_cells
from gear_rl.study.spec import SAMPLES_KEY, Cell, MethodSpec, StudySpec, TaskSpec

__all__ = ["CellResult", "MethodResult", "StudyResult", "TaskResult", "analyze_study",
           "cell_machines", "mixed_seeds", "problem_scores", "write_study"]

# (metric key in metrics.jsonl, panel title, y label) of the two figures per task
CURVES = (("reward_mean", "Training reward", "mean reward"),
          ("entropy_mean", "Policy entropy", "entropy (nats per policy token)"))
GEAR_CURVES = (("segment_frac", "Tokens in GEAR segments", "fraction of policy tokens"),
               ("weight_mean_pos", "Mean token weight, A > 0", "mean W"),
               ("weight_mean_neg", "Mean token weight, A < 0", "mean W"))


def problem_scores(records: list[dict[str, Any]], metric: str) -> list[float]:
    """Per problem, in the records' order: ``mean@k`` the fraction of its k samples that are
    correct (reward >= 1, as :func:`gear_rl.train.evaluate.evaluate` counts them), ``pass@k``
    1.0 when any is."""
    out = []
    for record in records:
        hits = [float(r) >= 1.0 for r in record["rewards"]]
        out.append(sum(hits) / len(hits) if metric == "mean@k" else float(any(hits)))
    return out


@dataclass
class CellResult:
    """A finished cell, read.

    Attributes:
        cell: the cell. ``run``: its run directory, read. ``final_step``: its last step.
        scores: per held-out problem, its score at the final step (the problems' order).
        problems: the held-out problem ids. ``k``: samples per problem.
        by_step: per evaluated step (the final one included) on the same problems with the
            same k, the scores in the same order.
    """

    cell: Cell
    run: RunData
    final_step: int
    scores: list[float]
    problems: list[str]
    k: int
    by_step: dict[int, list[float]] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """The cell's held-out score: the mean over problems."""
        return statistics.fmean(self.scores)

    @property
    def start_score(self) -> float | None:
        """The held-out score before training (step 0; None where step 0 was not evaluated on
        the same problems)."""
        return statistics.fmean(self.by_step[0]) if 0 in self.by_step else None

    @property
    def ended_below_start(self) -> bool:
        """Whether the cell's final score is below its own step-0 score: a seed that trained
        the policy worse than it started (a "collapsed seed" in a study's rules)."""
        start = self.start_score
        return start is not None and self.score < start


@dataclass
class MethodResult:
    """One method on one task.

    Attributes:
        method: its spec. ``cells``: its finished cells, by seed. ``missing``: its cells that
            did not finish (left out of the statistics).
        estimate: the mean over seeds and problems with its bootstrap interval (None: no
            finished cell). ``versus``: against the baseline (None for the baseline itself or
            when either side has no finished cell).
    """

    method: MethodSpec
    cells: list[CellResult]
    missing: list[Cell]
    estimate: Estimate | None = None
    versus: Difference | None = None

    @property
    def seeds(self) -> list[int]:
        return [c.cell.seed for c in self.cells]


@dataclass
class TaskResult:
    """One task's results.

    Attributes:
        task: its spec. ``methods``: baseline first, then the spec's order.
        final_step, k, problems: the compared evaluation (None / 0 / [] without a finished
            cell).
        top_tokens: the tokens most often above the threshold, over the task's logged samples.
        by_step: the same comparison at every earlier step that all finished cells evaluated
            on the same problems (secondary: the verdicts are at the final step); per step,
            the methods with their estimate and difference, baseline first.
        top_sources: the methods whose samples carried a divergence.
        plots: the figures written (paths relative to the study folder).
        contrasts: the spec's further ``(method, against, difference)`` comparisons at the
            final step (None where either has no finished cell).
    """

    task: TaskSpec
    methods: list[MethodResult]
    final_step: int | None
    k: int
    problems: list[str]
    top_tokens: list[TokenCount] = field(default_factory=list)
    top_sources: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    by_step: dict[int, list[MethodResult]] = field(default_factory=dict)
    contrasts: list[tuple[str, str, Difference | None]] = field(default_factory=list)


@dataclass
class StudyResult:
    """The outcome of :func:`analyze_study` (and :func:`write_study`).

    Attributes:
        spec: the study. ``out``: its folder. ``tasks``: per task.
        registration: the folder's registration (:mod:`gear_rl.study.registration`; None:
            none recorded).
        markdown, json: the written files (None until :func:`write_study`).
    """

    spec: StudySpec
    out: Path
    tasks: list[TaskResult]
    registration: dict[str, Any] | None = None
    markdown: Path | None = None
    json: Path | None = None


def _cell_result(spec: StudySpec, cell: Cell, out: Path) -> CellResult:
    run_dir = cell.run_dir(out)
    run = load_run(run_dir)
    steps = run.config.get("steps")
    if not isinstance(steps, int):
        raise ValueError(f"study: {run_dir}/config.yaml has no steps")
    evaluations = read_eval_records(run_dir)
    if steps not in evaluations:
        raise ValueError(f"study: cell {cell.name} has no eval records at its final step "
                         f"{steps} ({run_dir}/eval_records/; cells train with eval.records=true)")
    data = evaluations[steps]
    records = data["records"]
    if not records:
        raise ValueError(f"study: cell {cell.name}: the eval records of step {steps} are empty")
    problems = [str(r.get("id")) for r in records]
    by_step = {step: problem_scores(e["records"], spec.metric)
               for step, e in evaluations.items()
               if [str(r.get("id")) for r in e["records"]] == problems
               and int(e["k"]) == int(data["k"])}
    return CellResult(cell, run, steps, problem_scores(records, spec.metric), problems,
                      int(data["k"]), by_step)


def _check_same_evaluation(task: TaskSpec, cells: list[CellResult]) -> None:
    """Refuse cells that were not evaluated alike: the COMPARABLE settings, then the problem
    ids and k of the records themselves."""
    mismatch = mismatched_settings([c.run for c in cells])
    samples = mismatch.pop(SAMPLES_KEY, None)
    if samples is not None:  # allowed only where a method declares its own, per task
        expected = {str(c.run.path): c.cell.method.samples_per_prompt.get(task.key)
                    for c in cells}
        shared = {samples[path] for path, own in expected.items() if own is None}
        if len(shared) > 1 or any(own is not None and samples[path] != own
                                  for path, own in expected.items()):
            mismatch[SAMPLES_KEY] = samples
    if mismatch:
        raise ValueError(mismatch_error(
            mismatch, command="study",
            remedy=f"the cells of task {task.key!r} must share them (remove the odd cells' "
                   "folders and run the study again)"))
    first = cells[0]
    for other in cells[1:]:
        if other.problems != first.problems or other.k != first.k:
            raise ValueError(f"study: cells {first.cell.name} and {other.cell.name} were "
                             "evaluated on different held-out problems or k; they cannot be "
                             "compared problem by problem")


def _top_tokens(cells: list[CellResult], threshold: float, limit: int
                ) -> tuple[list[TokenCount], list[str]]:
    """The tokens most often above ``threshold`` over every logged sample of ``cells``, each
    run's samples normalised with its own ``credit.normalize`` mode."""
    by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    sources = []
    for result in cells:
        with_divergence = [s for s in result.run.samples if s.get("divergence") is not None]
        if with_divergence:
            by_mode[result.run.normalize_mode] += with_divergence
            if result.cell.method.label not in sources:
                sources.append(result.cell.method.label)
    if len(by_mode) <= 1:
        mode, samples = next(iter(by_mode.items()), ("minmax", []))
        return top_divergence_tokens(samples, threshold, mode, limit), sources
    pooled: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for mode, samples in by_mode.items():
        for row in top_divergence_tokens(samples, threshold, mode, limit=10**9):
            entry = pooled[row.token]
            entry[0] += row.above
            entry[1] += row.total
            entry[2] += row.mean_normalized * row.above
    rows = [TokenCount(token, int(a), int(t), s / a) for token, (a, t, s) in pooled.items()]
    rows.sort(key=lambda r: (-r.above, -r.above / r.total, r.token))  # as top_divergence_tokens
    return rows[:limit], sources


def analyze_study(spec: StudySpec, out: str | Path) -> StudyResult:
    """Read the finished cells of ``spec`` under ``out`` and compute every task's tables.

    The cells are judged only under what they were trained and judged under: every cell folder
    must hold a run of the config ``spec`` gives it, and ``spec`` must match the folder's
    registration, or its amendments (:func:`gear_rl.study.runner.register_study` records them).

    Raises:
        ValueError: a cell folder holding a run of another config; a registered field changed
            after a cell finished without an amendment; a task's finished cells differ in a
            setting they must share, or in their held-out problems or k; a finished cell
            without eval records at its final step.
    """
    out = Path(out)
    planned = plan_cells(spec, out)
    registration = require_registered(spec, out, [p.cell.name for p in planned
                                                   if p.state == "finished"])
    tasks = []
    for task in spec.tasks:
        methods = []
        for method in sorted(spec.methods, key=lambda m: m.key != spec.baseline):
            cells = [Cell(task, method, seed) for seed in method.seeds]
            done = [c for c in cells if RunDir(c.run_dir(out)).finished()]
            methods.append(MethodResult(method, [_cell_result(spec, c, out) for c in done],
                                        [c for c in cells if c not in done]))
        finished = [c for m in methods for c in m.cells]
        if finished:
            _check_same_evaluation(task, finished)
        _compare(spec, methods)
        earlier = (set.intersection(*(set(c.by_step) for c in finished))
                   - {finished[0].final_step} if finished else set())
        by_step = {}
        for step in sorted(earlier):
            at_step = [MethodResult(m.method, m.cells, m.missing) for m in methods]
            _compare(spec, at_step, step)
            by_step[step] = at_step
        top, sources = _top_tokens(finished, spec.threshold, spec.top_tokens)
        by_key = {m.method.key: m for m in methods}
        contrasts = []
        for key, against in spec.contrasts:  # `against` in the baseline's place
            pair = [MethodResult(by_key[k].method, by_key[k].cells, by_key[k].missing)
                    for k in (against, key)]
            _compare(spec, pair)
            contrasts.append((key, against, pair[1].versus))
        tasks.append(TaskResult(task, methods, finished[0].final_step if finished else None,
                                finished[0].k if finished else 0,
                                finished[0].problems if finished else [], top, sources,
                                by_step=by_step, contrasts=contrasts))
    return StudyResult(spec, out, tasks, registration)


def _compare(spec: StudySpec, methods: list[MethodResult], step: int | None = None) -> None:
    """Fill each method's estimate and (but the baseline, ``methods[0]``) its paired
    difference from the baseline, on its cells' per-problem scores at ``step`` (None: the
    final step)."""
    stats = spec.statistics

    def scores(cell: CellResult) -> list[float]:
        return cell.scores if step is None else cell.by_step[step]

    baseline = methods[0]
    for index, result in enumerate(methods):
        if not result.cells:
            continue
        table = np.array([scores(c) for c in result.cells])
        result.estimate = bootstrap_mean(table, confidence=stats.confidence,
                                         replicates=stats.bootstrap, seed=stats.bootstrap_seed)
        if index == 0 or not baseline.cells:
            continue
        result.versus = paired_difference(
            table, np.array([scores(c) for c in baseline.cells]),
            seeds_paired=result.seeds == baseline.seeds, confidence=stats.confidence,
            power=stats.power, replicates=stats.bootstrap, seed=stats.bootstrap_seed)


# ------------------------------------------------------------------------------ writing
def _metric_key(spec: StudySpec, k: int) -> str:
    return f"eval/{spec.metric.replace('@k', f'@{k}')}"


def _plots(spec: StudySpec, result: TaskResult, out: Path) -> list[str]:
    if not result.final_step:
        return []
    key = _metric_key(spec, result.k)
    name = key.removeprefix("eval/")
    written = []
    methods = [m for m in result.methods if m.cells]

    def curves(method: MethodResult, metric: str) -> list[tuple[list[int], list[float]]]:
        return [c.run.series(metric) for c in method.cells]

    panels = [(f"Held-out {name}", f"held-out {name}")] + [(t, y) for _, t, y in CURVES]
    plot = band_plot(f"{result.task.key}-curves",
                     f"{result.task.label}: held-out {name}, training reward and policy "
                     "entropy per method (mean over seeds, band: lowest to highest seed)",
                     panels, [(f"{m.method.label} (n={len(m.cells)})",
                               [curves(m, key)] + [curves(m, k) for k, _, _ in CURVES])
                              for m in methods])
    written.append(save_plot(plot, out / "plots").relative_to(out).as_posix())
    segmenting = [m for m in methods
                  if any(c.run.series(k)[0] for c in m.cells for k, _, _ in GEAR_CURVES)]
    if segmenting:
        plot = band_plot(f"{result.task.key}-gear",
                         f"{result.task.label}: GEAR's segment fraction and mean token weight "
                         "per advantage sign (mean over seeds, band: lowest to highest seed)",
                         [(t, y) for _, t, y in GEAR_CURVES],
                         [(f"{m.method.label} (n={len(m.cells)})",
                           [curves(m, k) for k, _, _ in GEAR_CURVES]) for m in segmenting])
        written.append(save_plot(plot, out / "plots").relative_to(out).as_posix())
    return written


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _interval(low: float, high: float, signed: bool = False) -> str:
    return f"[{_fmt(low, signed)}, {_fmt(high, signed)}]"


def _seed_test(difference: Difference) -> str:
    test = difference.seed_test
    if test is None:
        return "— (fewer than 2 seeds)"
    if test.t is None:
        # t is undefined (its limit gives p = 0 or 1, kept in study.json): say what happened
        return (f"{test.kind}: undefined, every seed differs by {_fmt(test.difference, True)} "
                f"(no seed-to-seed variance)")
    return f"{test.kind} = {test.t:.2f} (df {test.df:.1f}), p = {test.p:.3f}"


def _visible(token: str) -> str:
    return json.dumps(token)[1:-1].replace("|", "\\|").replace("`", "'") or "(empty)"


def _step_cell(method: MethodResult) -> str:
    if method.estimate is None:
        return "—"
    text = f"{method.estimate.value:.3f}"
    if method.versus is not None:
        text += (f" ({_fmt(method.versus.difference, True)} "
                 f"{_interval(method.versus.low, method.versus.high, True)})")
    return text


def _task_markdown(spec: StudySpec, result: TaskResult) -> list[str]:
    task = result.task
    settings = ", ".join([*([f"verl setting `{task.setting}`"] if task.setting else []),
                          *(f"`{k}={json.dumps(v)}`" for k, v in task.overrides.items())])
    lines = [f"## {task.label}", "", f"Task settings: {settings or 'none'}."]
    matched = [f"{m.label}: `{SAMPLES_KEY}={m.samples_per_prompt[task.key]}`"
               for m in spec.methods if m.samples_per_prompt]
    if matched:
        lines[-1] += (" Methods given their own number of samples per prompt (an equal "
                      "sampled-tokens arm): " + "; ".join(matched) + ".")
    if result.final_step is None:
        return [*lines, "", "No cell of this task has finished yet.", ""]
    name = _metric_key(spec, result.k).removeprefix("eval/")
    conf = f"{spec.statistics.confidence * 100:g}%"
    baseline = result.methods[0]
    pairing = ("every cell on the same problems; verl's vLLM draws its samples per engine, "
               "not per problem, so samples are paired by problem only and start scores may "
               "differ between methods (docs/study.md)" if spec.engine == "verl"
               else "every cell on the same problems with the same sampling seeds")
    lines += ["", f"Held-out {name} at step {result.final_step}: {len(result.problems)} problems"
              f" x {result.k} samples per cell, {pairing}.", "",
              f"| method | seeds | {name} | {conf} CI | per seed | vs {baseline.method.label} |"
              f" {conf} CI of the difference | detectable (MDD) | seed-level test | verdict |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for method in result.methods:
        seeds = ",".join(map(str, method.seeds)) or "—"
        missing = f" ({len(method.missing)} unfinished)" if method.missing else ""
        if method.estimate is None:
            lines.append(f"| {method.method.label} | —{missing} | — | — | — | — | — | — | — | "
                         "no finished cell |")
            continue
        estimate = method.estimate
        per_seed = ", ".join(f"{c.score:.3f}" for c in method.cells)
        head = (f"| {method.method.label} | {seeds}{missing} | {estimate.value:.3f} | "
                f"{_interval(estimate.low, estimate.high)} | {per_seed} |")
        versus = method.versus
        if method is baseline:
            lines.append(f"{head} baseline | — | — | — | — |")
        elif versus is None:
            lines.append(f"{head} — | — | — | — | baseline has no finished cell |")
        else:
            lines.append(f"{head} {_fmt(versus.difference, True)} | "
                         f"{_interval(versus.low, versus.high, True)} | {versus.mdd:.3f} | "
                         f"{_seed_test(versus)} | **{versus.verdict}** |")
    if result.contrasts:
        lines += ["", f"Further pre-registered contrasts (the file's `contrasts`), paired as "
                  f"above, at step {result.final_step}:", "",
                  f"| method | against | difference | {conf} CI | detectable (MDD) | "
                  "seed-level test | verdict |", "|---|---|---|---|---|---|---|"]
        labels = {m.key: m.label for m in spec.methods}
        for key, against, diff in result.contrasts:
            if diff is None:
                lines.append(f"| {labels[key]} | {labels[against]} | — | — | — | — | "
                             "a method has no finished cell |")
                continue
            lines.append(f"| {labels[key]} | {labels[against]} | "
                         f"{_fmt(diff.difference, True)} | "
                         f"{_interval(diff.low, diff.high, True)} | {diff.mdd:.3f} | "
                         f"{_seed_test(diff)} | **{diff.verdict}** |")
    mdds = [m.versus.mdd for m in result.methods if m.versus is not None]
    if mdds:
        lines += ["", f"At this size (seeds x {len(result.problems)} problems x {result.k} "
                  f"samples) a difference from {baseline.method.label} smaller than about "
                  f"{statistics.median(mdds):.3f} (the median MDD) cannot be told from noise; a "
                  "verdict of *within noise* says no more than that."]
    within = [m.method.label for m in result.methods if m.versus is not None
              and m.versus.verdict == "within noise"]
    beyond = [f"{m.method.label} ({m.versus.verdict})" for m in result.methods
              if m.versus is not None and m.versus.verdict != "within noise"]
    if within or beyond:
        parts = []
        if beyond:
            parts.append("beyond noise: " + ", ".join(beyond))
        if within:
            parts.append("within noise: " + ", ".join(within))
        lines += ["", f"**Bottom line** (against {baseline.method.label}): "
                  + "; ".join(parts) + "."]
    below = [f"{m.method.label} seed {c.cell.seed} ({_fmt(c.start_score)} -> {c.score:.3f})"
             for m in result.methods for c in m.cells if c.ended_below_start]
    if any(c.start_score is not None for m in result.methods for c in m.cells):
        lines += ["", "Cells that ended below their own step-0 score: "
                  + ("; ".join(below) if below else "none") + "."]
    if result.by_step:
        steps = [*result.by_step, result.final_step]
        lines += ["", f"Held-out {name} at every evaluated step (secondary: the verdicts above "
                  f"are at step {result.final_step}, as registered; these show how fast each "
                  f"method got there). Beside each method: its difference from "
                  f"{baseline.method.label} with the {conf} paired interval.", "",
                  "| method | " + " | ".join(f"step {s}" for s in steps) + " |",
                  "|---|" + "---|" * len(steps)]
        for index, method in enumerate(result.methods):
            if not method.cells:
                continue
            row = [*(result.by_step[s][index] for s in result.by_step), method]
            lines.append(f"| {method.method.label} | " + " | ".join(
                _step_cell(m) for m in row) + " |")
    if result.plots:
        lines += [""] + [f"![{Path(p).stem}]({p})" for p in result.plots]
    lines += ["", f"Tokens most often above a normalised divergence of {spec.threshold:g} "
              f"(policy tokens of the logged samples of {', '.join(result.top_sources)})"
              if result.top_sources else
              "No logged sample of this task carries a divergence (no top-tokens table)."]
    if result.top_tokens:
        lines += ["", "| token | times above | occurrences | share above | mean normalised "
                  "divergence when above |", "|---|---|---|---|---|"]
        lines += [f"| `{_visible(r.token)}` | {r.above} | {r.total} | {r.above / r.total:.2f} | "
                  f"{r.mean_normalized:.2f} |" for r in result.top_tokens]
    unfinished = [c.name for m in result.methods for c in m.missing]
    if unfinished:
        lines += ["", f"Unfinished cells (left out): {', '.join(unfinished)}."]
    return [*lines, ""]


DEFINITIONS = """## How to read the numbers

- **{name}** of a cell: over the held-out problems, the fraction of each problem's k samples
  that are correct (Mean@k) or whether any is (pass@k), at the final training step. A method's
  value is the mean over its seeds (equivalently over seeds and problems).
- **CI**: the {conf} percentile interval of {replicates} bootstrap replicates that draw the
  problems and the seeds with replacement.
- **Difference** from the baseline and its CI: the same bootstrap, *paired*: each replicate
  draws one set of problems for both methods (every cell was evaluated on the same problems
  with the same sampling seeds), and one set of seeds for both when both ran the same seeds
  (seed s of each method shares its data order and sampling seeds); otherwise each method's
  seeds are drawn on their own.
- **Verdict**: *better beyond noise* when the CI of the difference lies above 0, *worse beyond
  noise* when below, *within noise* when it contains 0.
- **MDD** (minimum detectable difference): (z(1 - alpha/2) + z(power)) x the bootstrap standard
  error of the difference, with alpha = {alpha:g} and power = {power:g} ({factor:.2f} x SE): the
  true difference this design would call beyond noise {power_pct} of the time.
- **Seed-level test**: the per-seed values alone, a paired t-test over seeds when both methods
  ran the same seeds, else Welch's t-test; it ignores the problem-level pairing and is shown
  beside the verdict, not instead of it. With few seeds the bootstrap's seed draws understate
  seed-to-seed variation, so read a verdict that the seed-level test does not support with care.
"""


def cell_machines(result: StudyResult) -> dict[str, list[str]]:
    """The finished cells grouped by where they trained: ``"<processor>, <precision>"``
    (:func:`~gear_rl.rundir.machine_label`, from each cell's ``run.json``; a cell resumed
    elsewhere part-way is grouped under ``"A, then B"``) -> cell names. A study may span
    sessions and machines; bf16 is native on some processors and emulated on others, so a
    cell's precision can differ from its neighbour's."""
    groups: dict[str, list[str]] = {}
    for task in result.tasks:
        for method in task.methods:
            for cell in method.cells:
                where = ", then ".join(trained_on(RunDir(cell.run.path).read_info()))
                groups.setdefault(where, []).append(cell.cell.name)
    return groups


def mixed_seeds(result: StudyResult) -> dict[str, dict[str, list[str]]]:
    """The seeds whose finished cells trained on more than one machine or precision (a cell
    resumed elsewhere counts under each): ``"<task> seed <n>"`` -> where -> cell names. The
    report pairs methods within a seed, so a seed listed here compares methods across
    machines as well."""
    seeds: dict[str, dict[str, list[str]]] = {}
    for task in result.tasks:
        by_seed: dict[int, dict[str, list[str]]] = {}
        for method in task.methods:
            for cell in method.cells:
                for where in trained_on(RunDir(cell.run.path).read_info()):
                    by_seed.setdefault(cell.cell.seed, {}).setdefault(where, []).append(
                        cell.cell.name)
        for seed, groups in sorted(by_seed.items()):
            if len(groups) > 1:
                seeds[f"{task.task.key} seed {seed}"] = groups
    return seeds


def _machines_line(groups: dict[str, list[str]], mixed: dict[str, dict[str, list[str]]]
                   ) -> str:
    if len(groups) <= 1:
        return "".join(f"Cells trained on: {where}." for where in groups)
    parts = [f"{where} ({len(names)}: {', '.join(names)})" for where, names in groups.items()]
    if mixed:
        seeds = ["{} ({})".format(seed, "; ".join(f"{where}: {', '.join(names)}"
                                                  for where, names in apart.items()))
                 for seed, apart in mixed.items()]
        per_seed = ("**Seeds whose cells trained on more than one** (their paired differences "
                    "mix machines): " + "; ".join(seeds) + ".")
    else:
        per_seed = "Each seed's cells trained on one of them."
    return ("Cells trained on more than one machine or precision (compare methods within a "
            "seed, whose cells ran alike where the study ran them side by side): "
            + "; ".join(parts) + ". " + per_seed)


def _registration_lines(record: dict[str, Any] | None) -> list[str]:
    """The registration's paragraph of ``study.md``: when it was recorded (or adopted), and
    every amendment with its date, reason and changes."""
    if record is None:
        return ["Registration: none recorded (`gear-rl study` records what the cells are "
                f"trained and judged under in `{REGISTRATION}` before its first cell trains).",
                ""]
    if record.get("adopted"):
        head = (f"Registration (`{REGISTRATION}`): adopted on {record['registered']} from the "
                "study file as it was then; the cells that had finished predate registrations, "
                "so what they were judged under before that is not on record.")
    else:
        head = (f"Registration (`{REGISTRATION}`): recorded on {record['registered']}, before "
                "any cell finished.")
    amendments = record["amendments"]
    lines = [head + (f" Amended {len(amendments)} time(s) since:" if amendments
                     else " Not amended since."), ""]
    for number, entry in enumerate(amendments, 1):
        changes = {key: (change.get("old"), change.get("new"))
                   for key, change in entry.get("changes", {}).items()}
        lines.append(f"{number}. {entry.get('date')}, after {entry.get('cells_finished')} "
                     f"cell(s) finished: {entry.get('reason')} ({format_changes(changes)})")
    return lines + ([""] if amendments else [])


def _markdown(result: StudyResult, machine: dict[str, Any], timing: dict[str, Any]) -> str:
    spec = result.spec
    stats = spec.statistics
    lines = [f"# Study: {spec.name}", ""]
    if spec.description:
        lines += [spec.description.strip(), ""]
    budget = f" budget={spec.budget_name}" if spec.budget_name else ""
    command = f"gear-rl study {spec.path or 'SPEC.yaml'}{budget} out={result.out}"
    lines += [f"Reproduce: `{command}` (finished cells are reused; delete `cells/` to train "
              "again).", "",
              f"Report written on: {machine.get('cpu')}, {machine.get('cores')} cores, "
              f"AVX-512 BF16 {'yes' if machine.get('avx512_bf16') else 'no'}, AMX "
              f"{'yes' if machine.get('amx_bf16') else 'no'}, torch {machine.get('torch')}. "
              f"Cell wall time: {timing['cells_finished']} cells finished, "
              f"{timing['total_hours']:.2f} h in all, median {timing['median_minutes']:.1f} min "
              "per cell (machines shared with other work: timings are indicative).",
              _machines_line(cell_machines(result), mixed_seeds(result)), "",
              f"Baseline: {spec.method(spec.baseline).label}. Metric: held-out {spec.metric}.", ""]
    lines += _registration_lines(result.registration)
    for task in result.tasks:
        lines += _task_markdown(spec, task)
    lines += _cells_markdown(result, timing)
    factor = minimum_detectable(1.0, confidence=stats.confidence, power=stats.power)
    lines.append(DEFINITIONS.format(
        name=spec.metric, conf=f"{stats.confidence * 100:g}%", replicates=stats.bootstrap,
        alpha=1 - stats.confidence, power=stats.power, factor=factor,
        power_pct=f"{stats.power * 100:g}%"))
    return "\n".join(lines)


PHASE_PREFIXES = ("time/", "timing_s/")
"""The step-phase timings of a cell's ``metrics.jsonl``: gear-rl train's ``time/*``, verl's
``timing_s/*``."""
LOG_TAIL = 8
"""Lines of a failed cell's log shown in ``study.md``."""


def cell_times(records: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per step of each phase a cell's ``metrics.jsonl`` ``records`` logged
    (``time/*`` or ``timing_s/*``), over its training steps after the first (start-up and
    compilation land in step 1; all of them when it has one)."""
    records = [r for r in records if isinstance(r.get("step"), int) and r["step"] >= 1]
    later = [r for r in records if r["step"] > 1] or records
    keys = {k for r in later for k in r if k.startswith(PHASE_PREFIXES)
            and isinstance(r[k], (int, float)) and not k.endswith("_cpu")}
    return {k: statistics.median(r[k] for r in later if isinstance(r.get(k), (int, float)))
            for k in sorted(keys)}


def _cells_markdown(result: StudyResult, timing: dict[str, Any]) -> list[str]:
    """Per cell: how it ended, its wall time (every attempt), its steps and where a step's time
    goes (the median phases, largest first); a failed cell's last log lines."""
    spec, out = result.spec, result.out
    rows, failures = [], []
    for cell in spec.cells():
        run_dir = cell.run_dir(out)
        entry = timing["cells"].get(cell.name, {})
        metrics = run_dir / "metrics.jsonl"
        records = read_jsonl(metrics, drop_partial_last=True) if metrics.is_file() else []
        steps = max((r["step"] for r in records if isinstance(r.get("step"), int)), default=0)
        if RunDir(run_dir).finished():
            state = "finished"
        elif not entry:
            state = "not started"
        else:
            state = "failed" if not (run_dir / "checkpoints").exists() else "interrupted"
            log = run_dir.with_suffix(".log")
            if log.is_file():
                tail = log.read_text(encoding="utf-8", errors="replace").splitlines()
                failures += [f"`{cell.name}` ({state}; log `{log.relative_to(out)}`, last "
                             f"lines):", "", "```", *tail[-LOG_TAIL:], "```", ""]
        times = cell_times(records)
        step = times.pop("time/step", times.pop("timing_s/step", None))
        phases = sorted(((k, v) for k, v in times.items() if v >= 0.05),
                        key=lambda kv: -kv[1])[:5]
        rows.append(f"| {cell.name} | {state} | "
                    f"{entry['seconds'] / 60:.1f} min | " if entry else
                    f"| {cell.name} | {state} | — | ")
        rows[-1] += (f"{steps} | {'—' if step is None else f'{step:.1f}'} | "
                     + (", ".join(f"{k.split('/', 1)[1]} {v:.1f}" for k, v in phases) or "—")
                     + " |")
    lines = ["## Cells", "",
             "Wall time: every attempt of the cell added up (start-up included). Step and "
             "phases: median seconds over the training steps after the first.", "",
             "| cell | state | wall time | steps logged | s/step | largest phases (s) |",
             "|---|---|---|---|---|---|", *rows, ""]
    return lines + failures


def _estimate_json(value: Estimate | None) -> dict[str, float] | None:
    return None if value is None else {"value": value.value, "low": value.low,
                                       "high": value.high, "se": value.se}


def _versus_json(value: Difference | None) -> dict[str, Any] | None:
    if value is None:
        return None
    test = value.seed_test
    return {"difference": value.difference, "low": value.low, "high": value.high,
            "se": value.se, "mdd": value.mdd, "seeds_paired": value.seeds_paired,
            "verdict": value.verdict, "confidence": value.confidence, "power": value.power,
            "seed_test": None if test is None else vars(test)}


def _as_json(result: StudyResult, machine: dict[str, Any], timing: dict[str, Any]
             ) -> dict[str, Any]:
    spec = result.spec
    return {
        "name": spec.name, "spec": None if spec.path is None else str(spec.path),
        "metric": spec.metric, "baseline": spec.baseline,
        "statistics": vars(spec.statistics), "threshold": spec.threshold,
        "tasks": [{
            "key": t.task.key, "label": t.task.label, "overrides": t.task.overrides,
            "final_step": t.final_step, "k": t.k, "problems": len(t.problems),
            "methods": [{
                "key": m.method.key, "label": m.method.label, "estimator": m.method.estimator,
                "overrides": m.method.overrides, "seeds": m.seeds,
                "per_seed": [c.score for c in m.cells],
                "per_seed_start": [c.start_score for c in m.cells],
                "ended_below_start": [c.cell.seed for c in m.cells if c.ended_below_start],
                "cells": [Path(c.run.path).relative_to(result.out).as_posix()
                          for c in m.cells],
                "unfinished": [c.name for c in m.missing],
                "estimate": _estimate_json(m.estimate), "versus": _versus_json(m.versus)}
                for m in t.methods],
            "by_step": {str(step): [{"key": m.method.key,
                                     "estimate": _estimate_json(m.estimate),
                                     "versus": _versus_json(m.versus)} for m in methods]
                        for step, methods in t.by_step.items()},
            "contrasts": [{"key": key, "against": against, "versus": _versus_json(diff)}
                          for key, against, diff in t.contrasts],
            "top_tokens": [vars(r) for r in t.top_tokens], "top_token_sources": t.top_sources,
            "plots": t.plots} for t in result.tasks],
        "timing": {**timing, "machine": machine},
        "cell_machines": cell_machines(result),
        "mixed_seeds": mixed_seeds(result),
        "registration": result.registration,
    }


def _timing(out: Path) -> dict[str, Any]:
    path = out / "timings.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    done = [e["seconds"] for e in data.values() if e.get("finished")]
    return {"cells_finished": len(done), "total_hours": sum(done) / 3600,
            "median_minutes": statistics.median(done) / 60 if done else 0.0, "cells": data}


def write_study(result: StudyResult) -> StudyResult:
    """Write ``study.md``, ``study.json`` and the figures under ``plots/`` into the study
    folder; returns ``result`` with the paths set."""
    out = result.out
    for task in result.tasks:
        task.plots = _plots(result.spec, task, out)
    machine, timing = machine_info(), _timing(out)
    result.markdown = out / "study.md"
    atomic_write_text(result.markdown, _markdown(result, machine, timing))
    result.json = out / "study.json"
    atomic_write_text(result.json, json.dumps(_as_json(result, machine, timing), indent=2,
                                              default=str) + "\n")
    return result
