"""``gear-rl study``: train every cell of a study, resumably and in parallel processes, then
write its tables and figures (:mod:`gear_rl.study.report`).

The study folder ``OUT``::

    OUT/
      spec.yaml                     the study file, as last run
      registration.json             what the cells are trained and judged under, with its
                                    amendments (gear_rl.study.registration)
      timings.json                  wall seconds per cell (every attempt added up)
      cells/<task>/<method>-s<seed>/       the cell's gear-rl train run directory
      cells/<task>/<method>-s<seed>.yaml   the config it was started with
      cells/<task>/<method>-s<seed>.log    its output (appended on every attempt)
      study.md, study.json, plots/  the results (gear_rl.study.report)

Each cell runs in its own process (``python -m gear_rl.study.cell``), so a crash stays in its
cell; a killed study takes its running cells with it. A verl study's cells
(:mod:`gear_rl.study.verl_cells`) are verl jobs, started in the verl environment's interpreter
(:mod:`gear_rl.study.verl_job`) after one check of every cell's overrides against
verl's config; ``jobs=N`` splits the node's GPUs between N cells (one cell at a time on a
CPU). Rerunning the same command continues:
finished cells (``summary.json``) are never rerun, interrupted cells resume from their latest
checkpoint (``resume=``), cells interrupted before their first checkpoint start again, and a
cell folder holding a run of another config stops the study before anything trains, as does a
registered field (metric, baseline, ...) changed after a cell finished, unless the change is
recorded as an amendment (:func:`register_study`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from gear_rl.credit.registry import CHANGED_CREDIT_DEFAULTS
from gear_rl.dataclass_config import flatten_keys
from gear_rl.rundir import (
    RunDir,
    atomic_write_text,
    cpu_flags,
    cpu_model,
    machine_label,
    read_jsonl,
    trained_on,
    usable_cores,
)
from gear_rl.stop import StopSignal
from gear_rl.study.registration import note_finished, register
from gear_rl.study.spec import CELL_FREE, KEEP_POLICY, POLICY_DIR, Cell, StudySpec
from gear_rl.study.verl_cells import VerlCellConfig, verl_cell_state, verl_python
from gear_rl.train.config import TrainConfig, config_to_dict, recorded_config_dict
from gear_rl.train.runtime import resolve_device, resolves_to_bf16

__all__ = ["DEFAULT_JOBS_PER_CORE", "CellOutcome", "StudyRun", "cell_environment",
           "default_parallelism",
           "machine_info", "mixed_seed_warnings", "plan_cells", "register_study", "run_state",
           "run_study", "select_cells"]

# Measured by benchmarks/study_parallel.py on the project's 2-core Xeon (AMX), shared with other
# sessions (load average 8-12; docs/study.md): a pair of SmolLM2-135M cells (2 steps) took 544 s
# and 326 s as two one-thread processes side by side, 542 s and 354 s one after another with two
# threads: the side-by-side way 1.03x faster (medians), never slower. Hence one single-thread
# cell per core by default (and a crash or a slow cell holds up one core, not the study).
DEFAULT_JOBS_PER_CORE = 1
# Peak resident memory of one SmolLM2-135M cell in that benchmark was 5.0 GB: a bound on how
# many cells run at once.
CELL_MEMORY_GB = 6.0

def machine_info() -> dict[str, Any]:
    """The CPU model, core count, AMX / AVX-512 flags, memory and torch version."""
    import torch

    info: dict[str, Any] = {"cpu": cpu_model(), "cores": usable_cores(),
                            "torch": torch.__version__, "python": platform.python_version()}
    flags = cpu_flags()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gb"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    info["amx_bf16"] = "amx_bf16" in flags
    info["avx512_bf16"] = "avx512_bf16" in flags
    info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info


def default_parallelism(cores: int | None = None, memory_gb: float | None = None
                        ) -> tuple[int, int]:
    """``(jobs, threads)``: one single-thread cell per core (:data:`DEFAULT_JOBS_PER_CORE`),
    no more cells than memory holds (:data:`CELL_MEMORY_GB` each)."""
    info = machine_info() if cores is None or memory_gb is None else {}
    cores = cores if cores is not None else int(info.get("cores") or 1)
    memory = memory_gb if memory_gb is not None else float(info.get("memory_gb") or 0.0)
    jobs = max(1, cores * DEFAULT_JOBS_PER_CORE)
    if memory > 0:
        jobs = max(1, min(jobs, int(memory // CELL_MEMORY_GB)))
    return jobs, max(1, cores // jobs)


def resolve_parallelism(jobs: int | None, threads: int | None, cores: int | None = None,
                        memory_gb: float | None = None) -> tuple[int, int]:
    """``(jobs, threads)`` of a run: each given value as given; ``jobs`` None:
    :func:`default_parallelism`'s; ``threads`` None: the cores shared among the jobs
    (``cores // jobs``, at least 1), so ``jobs=1`` alone gets every core."""
    if jobs is None:
        jobs = default_parallelism(cores, memory_gb)[0]
    if threads is None:
        count = cores if cores is not None else int(machine_info().get("cores") or 1)
        threads = max(1, count // max(jobs, 1))
    return jobs, threads


@dataclass
class Planned:
    """A cell and what its folder holds now (:func:`run_state`)."""

    cell: Cell
    config: TrainConfig | VerlCellConfig
    run_dir: Path
    state: str

    @property
    def steps(self) -> int:
        return int(self.config.steps)


@dataclass
class CellOutcome:
    """How one cell's process ended in this invocation.

    Attributes:
        cell: the cell. ``seconds``: its wall time in this attempt.
        returncode: the process's exit status. ``finished``: its run wrote ``summary.json``.
        log: its log file (the tail is shown when it failed).
    """

    cell: Cell
    seconds: float
    returncode: int
    finished: bool
    log: Path


@dataclass
class StudyRun:
    """The outcome of :func:`run_study`.

    Attributes:
        out: the study folder. ``planned``: every cell and its state before this invocation.
        outcomes: the cells trained in this invocation. ``failed``: those that did not finish.
        seconds: this invocation's wall time. ``interrupted``: stopped by Ctrl-C.
        warnings: what was said on stderr before training (:func:`mixed_seed_warnings`).
    """

    out: Path
    planned: list[Planned]
    outcomes: list[CellOutcome] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[CellOutcome]:
        return [o for o in self.outcomes if not o.finished]


def _config_file(cell: Cell, out: Path) -> Path:
    return cell.run_dir(out).with_suffix(".yaml")


def _log_file(cell: Cell, out: Path) -> Path:
    return cell.run_dir(out).with_suffix(".log")


def run_state(run_dir: str | Path, wanted: Mapping[str, Any], *,
              ignore: Sequence[str] = ()) -> str:
    """What the planned run directory ``run_dir`` holds for a run of config ``wanted`` (a
    :func:`~gear_rl.train.config.config_to_dict` dict with ``out`` set), one of
    :data:`gear_rl.rundir.RUN_STATES` (:meth:`gear_rl.rundir.RunDir.state`): ``new`` (no run
    yet), ``finished`` (its ``summary.json``), ``interrupted`` (a checkpoint to resume from) or
    ``no_checkpoint`` (interrupted before its first checkpoint). Used by ``gear-rl study``
    (:func:`plan_cells`) and ``gear-rl compare --estimators``
    (:func:`gear_rl.study.compare.run_comparison`).

    The saved config is read as this version reads a run's config to resume it: an option
    added since the run was written counts as its default.

    Raises:
        ValueError: the folder holds a run of another config; ``ignore`` names top-level
            config keys left out of that check (settings a resume may change).
    """
    run = RunDir(run_dir)
    if not run.is_run():
        return "new"
    saved = recorded_config_dict(run.read_config())
    saved = {k: v for k, v in saved.items() if k not in ignore}
    expected = {k: v for k, v in wanted.items() if k not in ignore}
    if saved != expected:
        state = "a finished" if run.finished() else "an interrupted"
        then, now = flatten_keys(saved), flatten_keys(expected)
        changed = sorted(k for k in then.keys() | now.keys() if then.get(k) != now.get(k))
        defaults = {f"credit.{name}" for name, _, _ in CHANGED_CREDIT_DEFAULTS}
        hint = "".join(f"; {key}: {then.get(key)!r} in the run, {now.get(key)!r} now (its "
                       "default changed since runs that left it out: give "
                       f"{key}={then.get(key)!r} to keep this run)"
                       for key in changed if key in defaults)
        raise ValueError(f"{run_dir} holds {state} run with another config (differs in "
                         f"{changed}{hint})")
    return run.state()


_SHOWN = 6  # cells named in a refusal; the rest are counted


def plan_cells(spec: StudySpec, out: str | Path) -> list[Planned]:
    """Every cell with its config and the state of its folder (``new``, ``finished``,
    ``interrupted``, ``no_checkpoint``), checked before anything trains or is judged.

    Raises:
        ValueError: cell folders hold runs whose config differs from the spec's (in anything
            but the settings a resume may change: threads, device, log.*), naming every such
            cell and the settings it differs in. A cell's training cannot be amended.
    """
    out = Path(out)
    if spec.engine == "verl":
        return _plan_verl_cells(spec, out)
    planned, wrong = [], []
    for cell in spec.cells():
        config = spec.cell_config(cell, out)
        config.log.progress = False  # the study shows the progress; a bar in a log is noise
        wanted = config_to_dict(config)
        try:
            state = run_state(cell.run_dir(out), wanted, ignore=CELL_FREE)
        except ValueError as error:
            wrong.append(f"cell {cell.name}: {error}")
            continue
        planned.append(Planned(cell, config, cell.run_dir(out), state))
    _refuse_changed(wrong)
    return planned


def _refuse_changed(wrong: list[str]) -> None:
    if wrong:
        shown = "; ".join(wrong[:_SHOWN]) + (f"; and {len(wrong) - _SHOWN} more cell(s)"
                                             if len(wrong) > _SHOWN else "")
        raise ValueError(f"study: {shown}: the study file changed since "
                         f"{'this cell' if len(wrong) == 1 else f'these {len(wrong)} cells'} "
                         "ran, and what a cell trained under cannot be amended: restore the "
                         "file, remove the cell folders to train them again, or choose "
                         "another out=")


def _plan_verl_cells(spec: StudySpec, out: Path) -> list[Planned]:
    """:func:`plan_cells` of a verl study: a started cell's folder must hold a verl run (its
    ``run.json`` says ``engine: verl``) of the overrides its cell file recorded, the ones the
    spec gives it now."""
    planned, wrong = [], []
    for cell in spec.cells():
        config = spec.verl_cell(cell)
        run_dir = cell.run_dir(out)
        state = verl_cell_state(run_dir)
        info = RunDir(run_dir).read_info() if (run_dir / "run.json").is_file() else {}
        if info and info.get("engine") != "verl":
            raise ValueError(f"study: cell {cell.name}: {run_dir} holds a run of engine "
                             f"{info.get('engine', 'gear-rl')!r} and this study's cells are verl "
                             "jobs: one study's cells run on one engine (choose another out=)")
        saved_path = _config_file(cell, out)
        if state != "new" and saved_path.is_file():
            saved = yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {}
            wanted = config.as_dict()
            if saved != wanted:
                changed = sorted(k for k in saved.keys() | wanted.keys()
                                 if saved.get(k) != wanted.get(k))
                wrong.append(f"cell {cell.name}: {run_dir} holds a run of other settings "
                             f"(differs in {changed})")
                continue
        planned.append(Planned(cell, config, run_dir, state))
    _refuse_changed(wrong)
    return planned


def register_study(spec: StudySpec, out: str | Path, *, amend: str | None = None,
                   planned: list[Planned] | None = None) -> list[str]:
    """Check the study folder ``out`` against ``spec`` and record its registration
    (:mod:`gear_rl.study.registration`): every cell folder must hold a run of the config the
    spec gives it (:func:`plan_cells`, or ``planned`` when already made), and a registered
    field changed after a cell finished needs ``amend`` (the reason, recorded). Writes
    ``OUT/registration.json`` and ``OUT/spec.yaml`` (the study file); returns the lines to
    tell the user. What ``gear-rl study`` runs before training, and with ``train=false``.

    Raises:
        ValueError: a cell folder holding a run of another config; a changed registered field
            without ``amend``; an ``amend`` with nothing to amend.
    """
    out = Path(out)
    planned = plan_cells(spec, out) if planned is None else planned
    out.mkdir(parents=True, exist_ok=True)
    lines = register(spec, out, [p.cell.name for p in planned if p.state == "finished"],
                     amend=amend)
    if spec.path is not None:
        atomic_write_text(out / "spec.yaml", spec.path.read_text(encoding="utf-8"))
    return lines


class _Timings:
    """``OUT/timings.json``: per cell, wall seconds over every attempt and whether it
    finished."""

    def __init__(self, out: Path) -> None:
        self.path = out / "timings.json"
        self.data: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            try:
                self.data = json.loads(self.path.read_text(encoding="utf-8"))
            except ValueError:
                self.data = {}  # a timing file is a convenience; start it again

    def add(self, cell: Cell, seconds: float, finished: bool) -> None:
        entry = self.data.setdefault(cell.name, {"seconds": 0.0, "finished": False})
        entry["seconds"] = round(float(entry["seconds"]) + seconds, 3)
        entry["finished"] = finished
        atomic_write_text(self.path, json.dumps(self.data, indent=1, sort_keys=True) + "\n")

    def estimate(self, cell: Cell) -> float | None:
        """Expected wall seconds of ``cell``: the mean over finished cells of its task, else
        over every finished cell; None when none finished yet."""
        done = {name: e["seconds"] for name, e in self.data.items() if e.get("finished")}
        same = [s for name, s in done.items() if name.split("/", 1)[0] == cell.task.key]
        pool = same or list(done.values())
        return statistics.fmean(pool) if pool else None


def _duration(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _last_step(run_dir: Path) -> int:
    records = read_jsonl(run_dir / "metrics.jsonl", drop_partial_last=True) \
        if (run_dir / "metrics.jsonl").is_file() else []
    return max((r["step"] for r in records if isinstance(r.get("step"), int)), default=0)


@dataclass
class _Running:
    planned: Planned
    process: subprocess.Popen
    started: float
    log: IO[str]
    gpus: list[str] = field(default_factory=list)


def select_cells(spec: StudySpec, methods: Sequence[str] | None = None,
                 seeds: Sequence[int] | None = None,
                 tasks: Sequence[str] | None = None) -> list[Cell]:
    """The cells of ``spec`` whose method is in ``methods``, whose seed is in ``seeds`` and
    whose task is in ``tasks`` (None: any), in the runner's order: a study can be trained a
    part at a time (e.g. the baseline and the method under test first, or the cheaper task
    first) and completed by a later run.

    Raises:
        ValueError: a method or task the spec does not have, a seed no method of the spec has,
            or a selection that leaves no cell.
    """
    task_keys = [t.key for t in spec.tasks]
    unknown_tasks = [t for t in tasks or () if t not in task_keys]
    if unknown_tasks:
        raise ValueError(f"study: tasks={','.join(unknown_tasks)}: not a task of "
                         f"{spec.name!r} (its tasks: {', '.join(task_keys)})")
    keys = [m.key for m in spec.methods]
    unknown = [m for m in methods or () if m not in keys]
    if unknown:
        raise ValueError(f"study: methods={','.join(unknown)}: not a method of "
                         f"{spec.name!r} (its methods: {', '.join(keys)})")
    known_seeds = sorted({seed for m in spec.methods for seed in m.seeds})
    missing = [seed for seed in seeds or () if seed not in known_seeds]
    if missing:
        raise ValueError(f"study: seeds={','.join(map(str, missing))}: no method of "
                         f"{spec.name!r} has it (its seeds: "
                         f"{', '.join(map(str, known_seeds))})")
    cells = [cell for cell in spec.cells()
             if (methods is None or cell.method.key in methods)
             and (seeds is None or cell.seed in seeds)
             and (tasks is None or cell.task.key in tasks)]
    if not cells:
        raise ValueError(f"study: methods={','.join(methods or keys)} with "
                         f"seeds={','.join(map(str, seeds or known_seeds))} and "
                         f"tasks={','.join(tasks or task_keys)} selects no cell "
                         f"of {spec.name!r}")
    return cells


def run_study(spec: StudySpec, out: str | Path, *, jobs: int | None = None,
              threads: int | None = None, progress: bool = True,
              python: str = sys.executable,
              on_cell: Callable[[CellOutcome], None] | None = None,
              methods: Sequence[str] | None = None,
              seeds: Sequence[int] | None = None,
              tasks: Sequence[str] | None = None, amend: str | None = None) -> StudyRun:
    """Train every unfinished cell of ``spec`` under ``out`` (see the module docstring).

    Args:
        spec: the study. ``out``: the study folder.
        jobs: cells trained at once, each in its own process (None: :func:`default_parallelism`).
        threads: torch threads per cell (None: the cores shared among the jobs; a verl
            study's CPU cells: each job shares the cores among its ranks).
        progress: show a progress bar (cells done / total, the running cells' steps, ETA) and
            a line per finished cell on stderr.
        python: the interpreter of the cell processes.
        on_cell: called with each cell's outcome as it ends.
        methods, seeds, tasks: train only the cells of these methods, seeds and tasks
            (:func:`select_cells`; None: all). Every cell is still planned and checked; the
            others are left as they are for a later run.
        amend: the reason for a change of a registered field after cells finished, recorded
            as an amendment (:func:`register_study`).

    Raises:
        ValueError: a bad ``jobs``/``threads``/``methods``/``seeds``/``tasks``, a study
            folder in use by another study, a cell folder holding a run of another config, or
            a registered field changed after cells finished without ``amend`` (checked before
            anything trains).
    """
    if spec.engine == "verl":
        jobs, gpus = verl_parallelism(spec, jobs)
        # 0: the job shares the cores out among its ranks itself (the CPU mode's
        # OMP_NUM_THREADS, cpu_job.threads_per_rank); threads=N sets it for every cell
        threads = threads or 0
        python = verl_python()
    else:
        jobs, threads = resolve_parallelism(jobs, threads)
        gpus = []
    if jobs < 1 or threads < (0 if spec.engine == "verl" else 1):
        raise ValueError(f"study: jobs and threads must be >= 1, got jobs={jobs}, "
                         f"threads={threads}")
    selected = {cell.name for cell in select_cells(spec, methods, seeds, tasks)}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    folder = RunDir(out)
    folder.lock(user="gear-rl study")
    started = time.perf_counter()
    try:
        planned = plan_cells(spec, out)
        for line in register_study(spec, out, amend=amend, planned=planned):
            print(line, file=sys.stderr)
        result = StudyRun(out=out, planned=planned)
        todo = []
        for item in planned:
            if item.state == "finished" or item.cell.name not in selected:
                continue
            if item.state == "no_checkpoint":  # nothing to resume from: start it again
                shutil.rmtree(item.run_dir)
            todo.append(item)
        result.warnings = mixed_seed_warnings(planned, todo)
        for line in result.warnings:
            print(line, file=sys.stderr)
        if spec.engine == "verl" and todo:
            prepare_verl_cells(todo, out, python)
        try:
            _train(todo, len(selected), out, jobs=jobs, threads=threads, progress=progress,
                   python=python, keep_checkpoints=spec.keep_checkpoints, result=result,
                   on_cell=on_cell, gpus=gpus)
        finally:  # the cells that finished now, under the registration in force
            note_finished(out, [p.cell.name for p in planned if RunDir(p.run_dir).finished()])
    finally:
        folder.unlock()
    result.seconds = time.perf_counter() - started
    return result


def mixed_seed_warnings(planned: list[Planned], todo: list[Planned]) -> list[str]:
    """One line per task and seed whose cells would have trained on more than one machine or
    precision (:func:`~gear_rl.rundir.machine_label`) once ``todo`` trains here: where the
    seed's finished and interrupted cells trained (their ``run.json``), and where ``todo``'s
    cells will (this processor; each cell's ``precision`` and ``rollout.dtype`` on its
    device). The report pairs
    methods within a seed, so such a seed compares methods across machines as well; it is
    named in ``study.md`` (:func:`gear_rl.study.report.mixed_seeds`)."""
    here, training = cpu_model(), {item.cell.name for item in todo}
    lines = []
    for task, seed in sorted({(item.cell.task.key, item.cell.seed) for item in todo}):
        groups: dict[str, list[str]] = {}
        for item in planned:
            if (item.cell.task.key, item.cell.seed) != (task, seed):
                continue
            labels = (trained_on(RunDir(item.run_dir).read_info())
                      if item.state in ("finished", "interrupted")
                      and (item.run_dir / "run.json").is_file() else [])
            if item.cell.name in training and isinstance(item.config, TrainConfig):
                device = resolve_device(item.config.device)
                sampler = resolves_to_bf16(item.config.rollout.dtype, device)
                facts = {"cpu": here,
                         "autocast_bf16": resolves_to_bf16(item.config.precision, device),
                         "sampler_dtype": "torch.bfloat16" if sampler else "torch.float32"}
                labels.append(machine_label(facts) + " (here)")
            for label in dict.fromkeys(labels):
                groups.setdefault(label, []).append(item.cell.name.split("/", 1)[1])
        if len({label.removesuffix(" (here)") for label in groups}) > 1:
            where = "; ".join(f"{label}: {', '.join(names)}" for label, names in groups.items())
            lines.append(f"gear-rl study: warning: {task} seed {seed}: its cells would train on "
                         f"more than one machine or precision ({where}). The report compares "
                         "methods within a seed; train a seed's cells on one kind of machine "
                         "(retrain the others here, or train these where the others ran). "
                         "Training goes on; study.md names the seed.")
    return lines


def _export_final_policy(run_dir: Path) -> bool:
    """Export a finished cell's final checkpoint to ``run_dir/policy`` in bf16
    (``keep_checkpoints: policy``); False, with the reason on stderr, where it could not."""
    from gear_rl.train.export import EXPORT_INFO, export_policy

    out = run_dir / POLICY_DIR
    if (out / EXPORT_INFO).is_file():
        return True
    try:
        export_policy(run_dir, out, dtype="bf16")
    except (OSError, ValueError) as error:
        print(f"[study] {run_dir}: its final policy could not be exported ({error}); its "
              "checkpoints are kept", file=sys.stderr)
        return False
    return True


def verl_parallelism(spec: StudySpec, jobs: int | None,
                     environ: Mapping[str, str] | None = None) -> tuple[int, list[list[str]]]:
    """``(jobs, gpus)`` of a verl study: on a CPU one cell at a time (a 2-rank verl job needs
    about 12 GB; ``jobs`` above 1 is refused); with GPUs (``CUDA_VISIBLE_DEVICES``, else
    ``nvidia-smi -L``) each of the ``jobs`` cells (default: as many as fit) gets its own
    ``trainer.n_gpus_per_node`` of them, ``gpus[i]`` the devices of the i-th slot.

    Raises:
        ValueError: more cells than the CPU or the GPUs hold.
    """
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    else:
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                     timeout=30, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            listing = ""
        devices = [str(i) for i, line in enumerate(listing.splitlines())
                   if line.startswith("GPU ")]
    if not devices:
        if jobs not in (None, 1):
            raise ValueError(f"study: jobs={jobs}: a verl study trains one cell at a time on a "
                             "CPU (each job starts its own Ray cluster, actor and vLLM server; "
                             "two do not fit 24 GB)")
        return 1, []
    per_cell = int(spec.verl.get("trainer.n_gpus_per_node", 1))
    fit = len(devices) // max(per_cell, 1)
    if fit < 1 or (jobs is not None and jobs > fit):
        raise ValueError(f"study: jobs={jobs or 1} cells of trainer.n_gpus_per_node={per_cell} "
                         f"GPUs need {(jobs or 1) * per_cell}, and {len(devices)} are visible")
    jobs = fit if jobs is None else jobs
    return jobs, [devices[i * per_cell:(i + 1) * per_cell] for i in range(jobs)]


def prepare_verl_cells(todo: list[Planned], out: Path, python: str) -> None:
    """Before any verl cell trains: every cell's overrides composed with verl's own config (an
    override verl rejects fails here, naming the cell), and each task's data and model
    written once under ``OUT/verl`` (:mod:`gear_rl.study.verl_job`).

    Raises:
        ValueError: the check failed; its output's last lines say why.
    """
    plan = out / "verl" / "prepare.json"
    plan.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(plan, json.dumps([
        {"cell": item.cell.name, "task": item.cell.task.key, "method": item.cell.method.key,
         "run_dir": str(item.run_dir.resolve()), **item.config.as_dict()}  # type: ignore[union-attr]
        for item in todo], indent=1) + "\n")
    print(f"[study] checking {len(todo)} verl cell(s) against verl's config and writing their "
          "data", file=sys.stderr)
    done = subprocess.run([python, "-m", "gear_rl.study.verl_job", "prepare",
                           str(plan)], capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise ValueError("verl refused the study's cells before any trained:\n  "
                         + "\n  ".join(tail))


def _command(item: Planned, out: Path, python: str, threads: int) -> list[str]:
    if isinstance(item.config, VerlCellConfig):
        path = _config_file(item.cell, out)
        if item.state == "new" or not path.is_file():
            atomic_write_text(path, yaml.safe_dump(item.config.as_dict(), sort_keys=False))
        return [python, "-m", "gear_rl.study.cell", str(os.getpid()), "verl", str(path),
                str(item.run_dir), item.cell.name, str(out / "verl")]
    head = [python, "-m", "gear_rl.study.cell", str(os.getpid()), "train"]
    if RunDir(item.run_dir).is_run():  # interrupted after a checkpoint: resume it
        return [*head, f"resume={item.run_dir}", f"threads={threads}"]
    path = _config_file(item.cell, out)
    data = config_to_dict(item.config)
    data["threads"] = threads
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
    return [*head, str(path)]


def cell_environment(threads: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a cell's process: this one's with ``threads`` OpenMP/MKL threads, or,
    with ``threads`` 0 (a verl study's cell), the threads left to the job (the CPU mode shares
    the cores among its ranks)."""
    env = {**(os.environ if environ is None else environ), "PYTHONUNBUFFERED": "1"}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _train(todo: list[Planned], total: int, out: Path, *, jobs: int, threads: int,
           progress: bool, python: str, keep_checkpoints: bool | str, result: StudyRun,
           on_cell: Callable[[CellOutcome], None] | None,
           gpus: list[list[str]] | None = None) -> None:
    timings = _Timings(out)
    queue = list(todo)
    running: list[_Running] = []
    env = cell_environment(threads)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=total - len(todo), desc="study", unit="cell",
                   dynamic_ncols=True, file=sys.stderr,
                   bar_format="{desc}: {n_fmt}/{total_fmt} cells |{bar}| {elapsed}{postfix}")

    def say(line: str) -> None:
        if bar is not None:
            bar.write(line, file=sys.stderr)

    def finish(job: _Running) -> None:
        job.log.close()
        seconds = time.perf_counter() - job.started
        cell, run_dir = job.planned.cell, job.planned.run_dir
        finished = job.process.returncode == 0 and RunDir(run_dir).finished()
        timings.add(cell, seconds, finished)
        outcome = CellOutcome(cell, seconds, int(job.process.returncode), finished,
                              _log_file(cell, out))
        result.outcomes.append(outcome)
        if finished:
            exported = keep_checkpoints != KEEP_POLICY or _export_final_policy(run_dir)
            if keep_checkpoints is not True and exported:
                shutil.rmtree(RunDir(run_dir).checkpoints, ignore_errors=True)
            summary = RunDir(run_dir).read_summary()
            scores = ", ".join(f"{key.removeprefix('eval_end_')} {value:.3f}"
                               for key, value in summary.items()
                               if key.startswith("eval_end_mean@"))
            say(f"[study] {cell.name} finished in {_duration(seconds)}"
                + (f": held-out {scores}" if scores else ""))
            if bar is not None:
                bar.update(1)
        elif result.interrupted:
            say(f"[study] {cell.name} interrupted after {_duration(seconds)} (it resumes from "
                "its latest checkpoint on the next run)")
        else:
            tail = outcome.log.read_text(encoding="utf-8", errors="replace").splitlines()[-12:]
            say(f"[study] {cell.name} FAILED (exit {outcome.returncode}) after "
                f"{_duration(seconds)}; log {outcome.log}:\n  " + "\n  ".join(tail))
        if on_cell is not None:
            on_cell(outcome)

    def postfix() -> str:
        now = time.perf_counter()
        remaining = 0.0
        known = True
        for item in queue:
            estimate = timings.estimate(item.cell)
            known &= estimate is not None
            remaining += estimate or 0.0
        for job in running:
            estimate = timings.estimate(job.planned.cell)
            known &= estimate is not None
            remaining += max((estimate or 0.0) - (now - job.started), 0.0)
        steps = ", ".join(f"{job.planned.cell.name} step {_last_step(job.planned.run_dir)}/"
                          f"{job.planned.steps}" for job in running)
        eta = (f"ETA {_duration(remaining / max(1, min(jobs, len(queue) + len(running))))}"
               if known else "ETA after the first cell")
        return f"{eta} | {steps}" if steps else eta

    # a terminal redraws the bar in place; a log file gets a line per refresh
    refresh_every = 1.0 if sys.stderr.isatty() else 60.0
    refreshed = 0.0
    try:
        while queue or running:
            while queue and len(running) < jobs:
                item = queue.pop(0)
                command = _command(item, out, python, threads)
                cell_env, slot = env, []
                if gpus:  # this cell's own GPUs: the first slot no running cell holds
                    held = [job.gpus for job in running]
                    slot = next(g for g in gpus if g not in held)
                    cell_env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(slot)}
                log = _log_file(item.cell, out).open("a", encoding="utf-8")
                log.write(f"\n[study] {time.strftime('%Y-%m-%d %H:%M:%S')} $ "
                          f"{' '.join(command)}\n")
                log.flush()
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=cell_env)
                running.append(_Running(item, process, time.perf_counter(), log, slot))
            for job in [j for j in running if j.process.poll() is not None]:
                running.remove(job)
                finish(job)
            now = time.perf_counter()
            if bar is not None and now - refreshed >= refresh_every:
                bar.set_postfix_str(postfix(), refresh=True)
                refreshed = now
            time.sleep(0.5)
    except KeyboardInterrupt as stop:
        result.interrupted = True
        if isinstance(stop, StopSignal):  # sent to the study alone: pass it on to its cells
            for job in running:
                with contextlib.suppress(ProcessLookupError):
                    job.process.send_signal(stop.signum)
        for job in running:  # Ctrl-C reached them too; let them stop cleanly, then make sure
            try:
                job.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.process.kill()
                job.process.wait()
            finish(job)
    finally:
        if bar is not None:
            bar.set_postfix_str("interrupted" if result.interrupted else "done", refresh=True)
            bar.close()
