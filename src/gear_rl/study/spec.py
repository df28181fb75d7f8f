"""The study file: tasks, methods, seeds, the shared budget, the baseline and the metric of a
pre-registered comparison (``gear-rl study SPEC.yaml``; docs/study.md describes every key).

Every cell (task x method x seed) is one ``gear-rl train`` run whose config is, in order: the
trainer's defaults, the study's ``budget``, the task's ``overrides``, the method's
``overrides``, then the method's estimator, the seed and ``eval.records=true``. Each is built
and checked by :func:`gear_rl.train.config.load_config`, so an unknown key or a bad value is
the trainer's own error (with its nearest-key suggestion), prefixed by where in the study it
came from. A method may not change what the cells of a task must share (the settings of
:data:`gear_rl.report.compare.COMPARABLE` and every ``eval.*`` key): those belong in the budget
or the task. The one exception is a method's ``samples_per_prompt`` (task key -> value), which
sets its cells' ``rollout.samples_per_prompt``: an arm given as many sampled tokens as another
method spends, which the report names.

``engine: verl`` makes every cell a verl job instead (:mod:`gear_rl.study.verl_cells`): the
budget is a ``verl:`` block of Hydra overrides, a task names a verl data ``setting``, a method's
overrides are Hydra overrides. ``budgets:`` holds named variants of the budget (``budget=NAME``
on the command line lays one over ``budget:`` or ``verl:``), e.g. a GPU study scaled to a CPU.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gear_rl.dataclass_config import flatten_keys, hydra_override_key, read_yaml, shown
from gear_rl.report.compare import COMPARABLE
from gear_rl.study.verl_cells import (
    ENGINES,
    STEPS_KEY,
    VerlCellConfig,
    check_verl_overrides,
    covers,
    verl_setting,
)
from gear_rl.train.config import TrainConfig, load_config

__all__ = ["CELL_FREE", "KEEP_POLICY", "METRICS", "POLICY_DIR", "SAMPLES_KEY", "Cell",
           "MethodSpec", "StatsSpec", "StudySpec", "TaskSpec", "load_spec", "parse_spec"]

METRICS = ("mean@k", "pass@k")
"""What a study compares: held-out Mean@k (fraction of a problem's k samples that are correct)
or pass@k (whether any is), with ``k = eval.k``."""

# Set per cell by the study, or a knob of the runner: never in a spec's overrides.
_RESERVED = {"estimator": "set by each method (methods.NAME.estimator)",
             "seed": "set per cell from the seeds lists",
             "out": "the study puts every cell under its out= folder",
             "resume": "the study resumes interrupted cells itself",
             "threads": "a knob of the runner: gear-rl study SPEC threads=N",
             "eval.records": "always on in a study (the paired statistics read the records)"}
CELL_FREE = ("threads", "device", "log", "resume", "out")
"""Top-level train settings a cell may change without becoming another cell (what a resumed run
may change, less ``steps`` and ``eval.every``, which the study fixes): left out when a cell
folder is checked against the spec, and out of the study's registration."""
_TOP = ("name", "description", "metric", "baseline", "seeds", "engine", "budget", "verl",
        "budgets", "tasks", "methods", "contrasts", "statistics", "analysis", "keep_checkpoints")
_TASK_KEYS = ("label", "overrides")
_VERL_TASK_KEYS = ("label", "setting", "overrides")
_METHOD_KEYS = ("estimator", "label", "overrides", "seeds", "samples_per_prompt")
SAMPLES_KEY = "rollout.samples_per_prompt"
KEEP_POLICY = "policy"
"""``keep_checkpoints: policy``: a finished cell keeps its final weights as a loadable policy."""
POLICY_DIR = "policy"
"""The folder of a cell's run directory that holds its exported final policy."""
"""The one shared setting a method may change, per task, through its ``samples_per_prompt``
(an equal-sampled-tokens arm: the baseline given as many samples as another method spends)."""
_STATS_KEYS = ("confidence", "power", "bootstrap", "bootstrap_seed")
_ANALYSIS_KEYS = ("threshold", "top_tokens")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


@dataclass(frozen=True)
class TaskSpec:
    """One task of a study.

    Attributes:
        key: its name in the spec (the folder of its cells).
        label: the name shown in the tables.
        overrides: train settings of this task's cells (dotted keys; ``task`` defaults to
            ``key``); in a verl study, Hydra overrides.
        setting: a verl study's data setting (None in a ``gear-rl`` study).
    """

    key: str
    label: str
    overrides: dict[str, Any]
    setting: str | None = None


@dataclass(frozen=True)
class MethodSpec:
    """One method: an estimator with its own settings.

    Attributes:
        key: its name in the spec (the folder name of its cells, ``KEY-s<seed>``).
        estimator: the registered estimator it trains with.
        label: the name shown in the tables.
        overrides: its own train settings (dotted keys: ``credit.*``, ``loss.*``, ...).
        seeds: the training seeds it runs.
        samples_per_prompt: task key -> its cells' ``rollout.samples_per_prompt``, in place of
            the budget's: an equal-sampled-tokens arm (empty: the budget's, as every method).
            The only shared setting a method may change; the report names it.
    """

    key: str
    estimator: str
    label: str
    overrides: dict[str, Any]
    seeds: tuple[int, ...]
    samples_per_prompt: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StatsSpec:
    """The statistics.

    Attributes:
        confidence: the bootstrap interval's level; ``1 - confidence`` is the alpha of the
            seed-level test and of the minimum detectable difference.
        power: the power behind the minimum detectable difference.
        bootstrap: bootstrap replicates.
        bootstrap_seed: the seed of the bootstrap draws (a study's tables are reproducible).
    """

    confidence: float = 0.95
    power: float = 0.8
    bootstrap: int = 10_000
    bootstrap_seed: int = 0


@dataclass(frozen=True)
class Cell:
    """One training run of a study.

    Attributes:
        task, method, seed: what it trains.
    """

    task: TaskSpec
    method: MethodSpec
    seed: int

    @property
    def name(self) -> str:
        """``task/method-s<seed>``: the cell's path under ``OUT/cells``."""
        return f"{self.task.key}/{self.method.key}-s{self.seed}"

    def run_dir(self, out: str | Path) -> Path:
        """The cell's run directory, ``OUT/cells/<task>/<method>-s<seed>``."""
        return Path(out) / "cells" / self.task.key / f"{self.method.key}-s{self.seed}"


@dataclass(frozen=True)
class StudySpec:
    """A parsed, checked study file.

    Attributes:
        name: the study's name (default: the file's stem).
        description: free text for the report.
        metric: one of :data:`METRICS`.
        baseline: the key of the method every other is compared with.
        budget: train settings shared by every cell (dotted keys).
        tasks, methods: in the file's order.
        statistics: see :class:`StatsSpec`.
        threshold: normalised divergence above which a token counts in the top-tokens table.
        top_tokens: rows of that table per task.
        keep_checkpoints: what of a finished cell's checkpoints stays: ``False`` (the default:
            nothing, to save disk; an interrupted cell keeps its own to resume), ``True`` (all of
            them) or ``"policy"`` (the final weights, exported in bf16 with the tokenizer to the
            cell's ``policy/`` folder by :func:`gear_rl.train.export.export_policy`, about a
            sixth of a checkpoint: what ``model=`` of ``gear-rl credit-check`` or ``eval`` loads).
        contrasts: further ``(method, against)`` pairs the report compares, paired as every
            method is with the baseline (e.g. a method against an equal-token arm).
        path: the file it was read from (None: parsed from a mapping).
        engine: what the cells run on, one of :data:`~gear_rl.study.verl_cells.ENGINES`.
        verl: a verl study's shared Hydra overrides (dotted keys; its budget).
        budget_name: the ``budgets:`` variant laid over the budget (None: none).
    """

    name: str
    metric: str
    baseline: str
    budget: dict[str, Any]
    tasks: tuple[TaskSpec, ...]
    methods: tuple[MethodSpec, ...]
    description: str = ""
    statistics: StatsSpec = field(default_factory=StatsSpec)
    threshold: float = 0.1
    top_tokens: int = 20
    keep_checkpoints: bool | str = False
    contrasts: tuple[tuple[str, str], ...] = ()
    path: Path | None = None
    engine: str = "gear-rl"
    verl: dict[str, Any] = field(default_factory=dict)
    budget_name: str | None = None

    def method(self, key: str) -> MethodSpec:
        """The method named ``key``."""
        for method in self.methods:
            if method.key == key:
                return method
        raise KeyError(key)

    def cells(self) -> list[Cell]:
        """Every cell, in the order the runner trains them: seed round by seed round (the
        i-th seed of every method of every task before any method's (i+1)-th), so an
        interrupted study has every method's first seeds first."""
        rounds = max(len(m.seeds) for m in self.methods)
        return [Cell(task, method, method.seeds[i]) for i in range(rounds)
                for task in self.tasks for method in self.methods if i < len(method.seeds)]

    @property
    def steps(self) -> int:
        """The cells' training steps."""
        if self.engine == "verl":
            return int(self.verl[STEPS_KEY])
        return int(self.cell_config(self.cells()[0], ".").steps)

    def verl_cell(self, cell: Cell) -> VerlCellConfig:
        """A verl study's cell: what it trains under (:class:`VerlCellConfig`)."""
        if self.engine != "verl" or cell.task.setting is None:
            raise ValueError(f"{self._where()}not a verl study")
        return VerlCellConfig.build(
            setting=cell.task.setting, estimator=cell.method.estimator, seed=cell.seed,
            steps=int(self.verl[STEPS_KEY]), shared=self.verl, task=cell.task.overrides,
            method=cell.method.overrides)

    def cell_config(self, cell: Cell, out: str | Path) -> TrainConfig:
        """The cell's train config (validated by ``load_config``), with ``out`` set to its run
        directory (a ``gear-rl`` study's; a verl study's cells: :meth:`verl_cell`)."""
        if self.engine == "verl":
            raise ValueError(f"{self._where()}a verl study's cells are verl jobs, not gear-rl "
                             "train configs")
        matched = cell.method.samples_per_prompt
        settings = {**self.budget, **cell.task.overrides, **cell.method.overrides,
                    **({SAMPLES_KEY: matched[cell.task.key]} if matched else {}),
                    "estimator": cell.method.estimator, "seed": cell.seed,
                    "eval.records": True, "out": str(cell.run_dir(out))}
        try:
            return load_config(None, [f"{key}={json.dumps(value)}"
                                      for key, value in settings.items()])
        except ValueError as error:
            raise ValueError(f"{self._where()}task {shown(cell.task.key)}, method "
                             f"{shown(cell.method.key)}: {error}") from None

    def _where(self) -> str:
        return f"study spec {self.path}: " if self.path is not None else "study spec: "


def load_spec(path: str | Path, *, budget: str | None = None) -> StudySpec:
    """Read and check the study file at ``path`` (see :func:`parse_spec`), with its
    ``budgets.<budget>`` variant laid over the budget when ``budget`` is given."""
    path = Path(path)
    # read_yaml refuses a key given twice in one mapping, as a config file's
    return parse_spec(read_yaml(path, "study spec"), path=path, budget=budget)


class _Checker:
    def __init__(self, path: Path | None) -> None:
        self.where = f"study spec {path}: " if path is not None else "study spec: "

    def fail(self, message: str) -> ValueError:
        return ValueError(self.where + message)

    def mapping(self, value: Any, name: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(f"{name} must be a mapping, got {type(value).__name__}")
        return {str(k): v for k, v in value.items()}

    def keys(self, data: Mapping[str, Any], allowed: tuple[str, ...], name: str) -> None:
        for key in data:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else f"valid: {', '.join(allowed)}"
                raise self.fail(f"unknown key {name}{shown(key)}; {hint}")

    def overrides(self, value: Any, name: str) -> dict[str, Any]:
        flat = flatten_keys(self.mapping(value, name))
        for key in flat:
            for reserved, why in _RESERVED.items():
                if covers(key, reserved):
                    raise self.fail(f"{name}: {shown(key)} cannot be set in a study ({why})")
        return flat

    def seeds(self, value: Any, name: str) -> tuple[int, ...]:
        if isinstance(value, bool) or not isinstance(value, list) or not value or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in value):
            raise self.fail(f"{name} must be a non-empty list of integers, got {shown(value)}")
        if len(set(value)) != len(value):
            raise self.fail(f"{name} lists a seed twice: {value}")
        return tuple(value)

    def number(self, data: Mapping[str, Any], key: str, default: Any, name: str, *,
               kind: type, low: float, high: float | None = None,
               open_low: bool = False) -> Any:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                kind is int and not isinstance(value, int)):
            raise self.fail(f"{name}{key} must be a{'n integer' if kind is int else ' number'}, "
                            f"got {shown(value)}")
        bad = value <= low if open_low else value < low
        if bad or (high is not None and value >= high):
            span = (f"({low}, {high})" if high is not None else
                    f"{'>' if open_low else '>='} {low}")
            raise self.fail(f"{name}{key} must be {'in ' if high is not None else ''}{span}, "
                            f"got {shown(value)}")
        return kind(value)

    def name(self, key: str, what: str) -> str:
        if not _NAME.fullmatch(key):
            raise self.fail(f"{what} name {shown(key)} must be letters, digits and _ . + - "
                            "(it names "
                            "a folder)")
        return key


def parse_spec(data: Any, *, path: str | Path | None = None,
               budget: str | None = None) -> StudySpec:
    """Check a study given as a mapping (a parsed YAML file) and build its :class:`StudySpec`.

    Every cell's config is built once here, so an unknown key, an unknown estimator or a bad
    value anywhere fails before any training, naming the task and method. ``budget`` names a
    ``budgets:`` variant to lay over the study's ``budget:`` (``verl:`` in a verl study).

    Raises:
        ValueError: an unknown or misspelt key (with the nearest valid one), a missing section,
            a bad seeds list, an unknown metric or baseline, a reserved key in an override, a
            method override of a setting the task's cells must share, or a cell config the
            trainer rejects.
    """
    where = Path(path) if path is not None else None
    check = _Checker(where)
    top = check.mapping(data, "the file")
    check.keys(top, _TOP, "")
    if budget is not None:
        variants = check.mapping(top.get("budgets"), "budgets")
        if budget not in variants:
            raise check.fail(f"budget={budget}: the study has no such budgets: entry "
                             f"(it has {sorted(variants) or 'none'})")
        top = _laid_over(top, check.mapping(variants[budget], f"budgets.{budget}"))
        check.keys(top, _TOP, f"budgets.{budget}.")
    for section in ("tasks", "methods"):
        if not top.get(section):
            raise check.fail(f"{section} is missing or empty")
    metric = top.get("metric", "mean@k")
    if metric not in METRICS:
        raise check.fail(f"metric must be one of {METRICS}, got {shown(metric)}")
    default_seeds = check.seeds(top["seeds"], "seeds") if "seeds" in top else None
    engine = top.get("engine", "gear-rl")
    if engine not in ENGINES:
        raise check.fail(f"engine must be one of {ENGINES}, got {shown(engine)}")
    verl = engine == "verl"
    home = "verl" if verl else "budget"
    if (verl and "budget" in top) or (not verl and "verl" in top):
        raise check.fail(f"a study with engine: {engine} gives its budget as {home}: "
                         f"({'Hydra overrides' if verl else 'gear-rl train settings'}), not "
                         f"{'budget' if verl else 'verl'}:; one study's cells run on one engine")
    if verl:
        shared = check_verl_overrides(flatten_keys(check.mapping(top.get("verl"), "verl")),
                                      "verl")
        steps = shared.get(STEPS_KEY)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise check.fail(f"verl.{STEPS_KEY} must be an integer >= 1 (the step the cells "
                             f"are compared at), got {shown(steps)}")
        budget_values: dict[str, Any] = {}
    else:
        shared = {}
        budget_values = check.overrides(top.get("budget"), "budget")
    tasks = []
    for key, entry in check.mapping(top["tasks"], "tasks").items():
        entry = check.mapping(entry, f"tasks.{key}")
        check.keys(entry, _VERL_TASK_KEYS if verl else _TASK_KEYS, f"tasks.{key}.")
        if verl:
            try:
                overrides = check_verl_overrides(
                    flatten_keys(check.mapping(entry.get("overrides"),
                                               f"tasks.{key}.overrides")),
                    f"tasks.{key}.overrides")
                setting = verl_setting(key, entry, f"tasks.{key}")
            except ValueError as error:
                raise check.fail(str(error)) from None
            tasks.append(TaskSpec(check.name(key, "task"), str(entry.get("label", key)),
                                  overrides, setting))
            continue
        overrides = check.overrides(entry.get("overrides"), f"tasks.{key}.overrides")
        overrides.setdefault("task", budget_values.get("task", key))
        tasks.append(TaskSpec(check.name(key, "task"), str(entry.get("label", key)), overrides))
    methods = []
    for key, entry in check.mapping(top["methods"], "methods").items():
        entry = check.mapping(entry, f"methods.{key}")
        check.keys(entry, _METHOD_KEYS, f"methods.{key}.")
        if verl:
            if "samples_per_prompt" in entry:
                raise check.fail(f"methods.{key}.samples_per_prompt: an equal-token arm is a "
                                 "gear-rl study's (a verl study's cells share "
                                 "actor_rollout_ref.rollout.n)")
            try:
                overrides = check_verl_overrides(
                    flatten_keys(check.mapping(entry.get("overrides"),
                                               f"methods.{key}.overrides")),
                    f"methods.{key}.overrides", method=True)
            except ValueError as error:
                raise check.fail(str(error)) from None
        else:
            overrides = check.overrides(entry.get("overrides"), f"methods.{key}.overrides")
        for setting in (*COMPARABLE, "eval") if not verl else ():
            for override in overrides:
                if covers(override, setting):
                    raise check.fail(
                        f"methods.{key}.overrides: {shown(override)} changes a setting every "
                        "cell of "
                        "a task must share (task, model, budget, evaluation); set it in the "
                        "budget or the task")
        if "seeds" in entry:
            seeds = check.seeds(entry["seeds"], f"methods.{key}.seeds")
        elif default_seeds is not None:
            seeds = default_seeds
        else:
            raise check.fail(f"methods.{key} has no seeds and the study has no default seeds "
                             "list")
        estimator = entry.get("estimator", key)
        if not isinstance(estimator, str):
            raise check.fail(f"methods.{key}.estimator must be a name, got {shown(estimator)}")
        if verl:
            _check_verl_estimator(check, key, estimator)
        matched = check.mapping(entry.get("samples_per_prompt"),
                                f"methods.{key}.samples_per_prompt")
        task_keys = [t.key for t in tasks]
        if matched and sorted(matched) != sorted(task_keys):
            raise check.fail(f"methods.{key}.samples_per_prompt must give every task's value "
                             f"(tasks {task_keys}), got {sorted(matched)}")
        for task_key, value in matched.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise check.fail(f"methods.{key}.samples_per_prompt.{task_key} must be an "
                                 f"integer >= 1, got {shown(value)}")
        methods.append(MethodSpec(check.name(key, "method"), estimator,
                                  str(entry.get("label", key)), overrides, seeds,
                                  {str(k): int(v) for k, v in matched.items()}))
    baseline = top.get("baseline", "grpo" if any(m.key == "grpo" for m in methods)
                       else methods[0].key)
    if baseline not in {m.key for m in methods}:
        raise check.fail(f"baseline {shown(baseline)} is not one of the methods "
                         f"{[m.key for m in methods]}")
    contrasts = []
    listed = top.get("contrasts") or []
    if not isinstance(listed, list):
        raise check.fail("contrasts must be a list of [method, against] pairs, got "
                         f"{shown(listed)}")
    for pair in listed:
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(name, str) for name in pair)):
            raise check.fail("contrasts: each entry is a [method, against] pair, got "
                             f"{shown(pair)}")
        unknown = [name for name in pair if name not in {m.key for m in methods}]
        if unknown or pair[0] == pair[1]:
            raise check.fail(f"contrasts: {shown(pair)} must name two different methods of "
                             f"{[m.key for m in methods]}")
        contrasts.append((pair[0], pair[1]))
    statistics = check.mapping(top.get("statistics"), "statistics")
    check.keys(statistics, _STATS_KEYS, "statistics.")
    stats = StatsSpec(
        confidence=check.number(statistics, "confidence", 0.95, "statistics.", kind=float,
                                low=0.0, high=1.0, open_low=True),
        power=check.number(statistics, "power", 0.8, "statistics.", kind=float, low=0.0,
                           high=1.0, open_low=True),
        bootstrap=check.number(statistics, "bootstrap", 10_000, "statistics.", kind=int,
                               low=100),
        bootstrap_seed=check.number(statistics, "bootstrap_seed", 0, "statistics.", kind=int,
                                    low=0))
    analysis = check.mapping(top.get("analysis"), "analysis")
    check.keys(analysis, _ANALYSIS_KEYS, "analysis.")
    keep = top.get("keep_checkpoints", False)
    if not isinstance(keep, bool) and keep != KEEP_POLICY:
        raise check.fail(f"keep_checkpoints must be true, false or {KEEP_POLICY!r}, got "
                         f"{shown(keep)}")
    spec = StudySpec(
        name=str(top.get("name") or (where.stem if where is not None else "study")),
        description=str(top.get("description") or ""), metric=metric, baseline=baseline,
        budget=budget_values, tasks=tuple(tasks), methods=tuple(methods), statistics=stats,
        threshold=check.number(analysis, "threshold", 0.1, "analysis.", kind=float,
                               low=0.0),
        top_tokens=check.number(analysis, "top_tokens", 20, "analysis.", kind=int, low=1),
        keep_checkpoints=keep, contrasts=tuple(contrasts), path=where, engine=engine,
        verl=shared, budget_name=budget)
    if verl:
        if keep == KEEP_POLICY:
            raise check.fail(f"keep_checkpoints: {KEEP_POLICY} exports a gear-rl checkpoint; a "
                             "verl cell's are verl's (keep them with true)")
        _check_verl_model(check, spec)
    else:
        _check_cells(spec)
    return spec


def _laid_over(top: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """A ``budgets:`` entry laid over the study file: mappings merged key by key (``budget``
    and ``verl`` by their dotted keys), other values replaced, a null removing the key."""
    def merge(base: Mapping[str, Any], over: Mapping[str, Any], flat: bool) -> dict[str, Any]:
        out = flatten_keys(base) if flat else dict(base)
        for key, value in (flatten_keys(over) if flat else over).items():
            if value is None:
                out.pop(key, None)
            elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping) and not flat:
                out[key] = merge(out[key], value, key in ("budget", "verl"))
            else:
                out[key] = value
        return out

    merged = merge(top, {k: v for k, v in overlay.items() if k not in ("budget", "verl")}, False)
    for block in ("budget", "verl"):
        if isinstance(overlay.get(block), Mapping):
            merged[block] = merge(merged.get(block) or {}, overlay[block], True)
    return merged


def _check_verl_estimator(check: _Checker, key: str, estimator: str) -> None:
    """A verl method's estimator: registered, and one verl runs (its ``engine_limit``)."""
    from gear_rl.credit import get_estimator

    try:
        limit = get_estimator(estimator).engine_limit("verl")
    except (KeyError, ValueError) as error:
        raise check.fail(f"methods.{key}.estimator: {error}") from None
    if limit is not None:
        raise check.fail(f"methods.{key}.estimator {estimator!r} cannot run in verl: {limit}")


def _check_verl_model(check: _Checker, spec: StudySpec) -> None:
    """The model and data files a verl study names exist here: the model a local folder,
    ``smollm2`` (the bundled one), or, where the Hugging Face hub is not switched off
    (``HF_HUB_OFFLINE``), a hub name ``org/model`` (nothing named: the CPU mode's tiny model);
    ``data.train_files`` / ``data.val_files`` local files."""
    import os

    from gear_rl.integrations.verl.cpu_job import SMOLLM2

    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false")
    for where, overrides in [("verl", spec.verl),
                             *((f"tasks.{t.key}.overrides", t.overrides) for t in spec.tasks)]:
        for key, value in overrides.items():
            bare = hydra_override_key(key)
            if bare == "actor_rollout_ref.model.path" and value != SMOLLM2:
                hub = (isinstance(value, str) and value.count("/") == 1
                       and not value.startswith((".", "/", "~")))
                if not isinstance(value, str) or not (Path(value).expanduser().is_dir()
                                                      or (hub and not offline)):
                    raise check.fail(
                        f"{where}: actor_rollout_ref.model.path {shown(value)} is not a folder "
                        "here: give a local Hugging Face model folder or "
                        f"{SMOLLM2!r}" + (" (HF_HUB_OFFLINE is set: a hub name is not "
                                          "fetched)" if hub else ""))
            if bare in ("data.train_files", "data.val_files"):
                for name in value if isinstance(value, list) else [value]:
                    if not isinstance(name, str) or not Path(name).expanduser().is_file():
                        raise check.fail(f"{where}: {bare} {shown(name)} is not a file here "
                                         "(python -m gear_rl.integrations.verl.data writes "
                                         "verl's layout from GSM8K / MATH / ToolRL files)")


def _check_cells(spec: StudySpec) -> None:
    """Build the config of every (task, method) once: the trainer's own checks of every key
    and value (an unknown estimator included), and each task with two problems (an unknown
    task or bad task options), before any training."""
    from gear_rl.tasks import load_task

    for task in spec.tasks:
        configs = [spec.cell_config(Cell(task, method, method.seeds[0]), ".")
                   for method in spec.methods]
        config = configs[0]
        try:
            load_task(config.task, options=config.task_options, train_size=2, eval_size=2,
                      seed=0, instruction=config.instruction, eval_path=config.eval_data)
        except ValueError as error:
            raise ValueError(f"{spec._where()}task {shown(task.key)}: {error}") from None
