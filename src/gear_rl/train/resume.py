"""Opening a run's folder, and resuming one: the run directory a config names
(:func:`run_path`), a new run's folder with its provenance (``run.json``: run id, machine, data
fingerprint) or an existing run continued from its newest intact checkpoint (:func:`open_run`),
and what a resume checks first: the same data (:func:`data_fingerprint`), the run's own
checkpoint, and a config that differs only in :data:`RESUMABLE` keys
(:func:`config_differences`, :func:`resume_config`)."""

from __future__ import annotations

import hashlib
import json
import sys
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gear_rl.credit.registry import upgrade_recorded_config
from gear_rl.dataclass_config import flatten_keys
from gear_rl.rundir import RunDir, cpu_model, file_sha256, machine_label, trained_on
from gear_rl.tasks import Problem, Task
from gear_rl.tasks.verl_data import SUFFIXES
from gear_rl.train.config import (
    TrainConfig,
    config_from_dict,
    config_to_dict,
    recorded_config,
    recorded_config_dict,
)
from gear_rl.train.runtime import Runtime

__all__ = ["RESUMABLE", "config_differences", "data_fingerprint", "open_run", "resume_config",
           "run_path"]


def run_path(config: TrainConfig) -> Path:
    """The run directory ``config`` names: ``resume``, else ``out``, else
    ``runs/<time>-<estimator>-s<seed>``."""
    if config.resume:
        return Path(config.resume)
    if config.out:
        return Path(config.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{config.estimator}-s{config.seed}"


def open_run(config: TrainConfig, runtime: Runtime, optimizer: torch.optim.Optimizer,
             path: str | Path | None = None) -> tuple[RunDir, int]:
    """The run directory of ``config``, locked for this process, and the step it continues
    after: a new one (``out``, refusing any folder whose files it would overwrite; its
    ``run.json`` records a new ``run_id`` and the :func:`data_fingerprint`), or, with
    ``resume``, the existing run with its newest intact checkpoint loaded into the policy and
    ``optimizer`` (RNG states restored, logs after that step dropped).

    A resume is refused (``ValueError``, naming what differs) when the data differ from what
    the run started with, when the checkpoint was written by another run, or when the config
    differs from the one the checkpoint was trained with beyond :data:`RESUMABLE`."""
    path = Path(path) if path is not None else run_path(config)
    if config.resume:
        run = RunDir(path)
        if not run.path.is_dir():
            raise ValueError(f"resume: {run.path} does not exist")
        run.lock()
        try:
            checkpoint = run.latest_checkpoint(verify=True)
            if checkpoint is None:
                raise ValueError(f"resume: {run.path} has no intact checkpoint to resume from")
            _check_resume(run, checkpoint, config, runtime.task)
            from gear_rl.train.checkpoint import load_checkpoint, set_rng_state

            state = load_checkpoint(checkpoint, runtime.model, optimizer)
            set_rng_state(state["rng"])
            runtime.sync_sampler()
            step = int(state["step"])
            run.truncate_logs(step)
            _record_resume(run, runtime, step)
            saved = upgrade_recorded_config(run.read_config())
            if saved.get("steps") != config.steps:  # keep config.yaml the run's truth
                run.write_config({**saved, "steps": config.steps})
        except BaseException:
            run.unlock()
            raise
        return run, step
    run = RunDir(path)
    run.claim_new()
    try:
        resolved = config_to_dict(config)
        resolved["out"] = str(run.path)
        run.create(resolved, {
            "engine": "gear-rl", "run_id": uuid.uuid4().hex,
            "data": data_fingerprint(config, runtime.task),
            "task": runtime.task.name, "train_problems": len(runtime.task.train),
            "eval_problems": len(runtime.task.eval), "device": str(runtime.device),
            "cpu": cpu_model(), "autocast_bf16": runtime.autocast,
            "sampler_dtype": str(next(runtime.sampler.parameters()).dtype),
            "parameters": sum(p.numel() for p in runtime.model.parameters()),
            "torch": torch.__version__, "argv": sys.argv,
            "sandbox_not_enforced": (None if runtime.sandbox is None
                                     else runtime.sandbox.not_enforced),
        })
    except BaseException:
        run.unlock()
        raise
    return run, 0


RESUMABLE = ("steps", "threads", "device", "log.", "eval.every", "resume", "out")
"""The config keys (dotted prefixes) a resumed run may change: anything else would make the
continued run a different run (``out`` may only name the run's own folder)."""


def config_differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The keys outside :data:`RESUMABLE` where two configs (``config_to_dict`` dicts, or what
    ``config.yaml`` / a checkpoint's ``state.json`` hold) differ, as ``"key: A, then B"``. Both
    are read as this version reads a run's config: an option added since counts as its
    default, a credit default changed since as its old value (``upgrade_recorded_config``)."""
    def normal(data: dict[str, Any]) -> dict[str, Any]:
        return flatten_keys(json.loads(json.dumps(recorded_config_dict(data), default=str)))

    first, second = normal(before), normal(after)
    return [f"{key}: {first.get(key)!r}, then {second.get(key)!r}"
            for key in sorted(first.keys() | second.keys())
            if not key.startswith(RESUMABLE) and first.get(key) != second.get(key)]


def _problems_digest(problems: Sequence[Problem]) -> dict[str, Any]:
    rows = [[p.id, p.prompt, p.answer, p.reference, p.reference_kind] for p in problems]
    text = json.dumps(rows, sort_keys=True, default=str)
    return {"count": len(rows), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def _data_files(config: TrainConfig) -> dict[str, Path]:
    """The data files ``config`` makes a run read, by the key that names them: ``task`` (a
    dataset file, or ``toolrl:PATH``), ``eval_data``, and any ``task_options`` value that names
    a file."""
    named: list[tuple[str, Any]] = [
        ("task", text) for text in {config.task, config.task.partition(":")[2]}
        if text.endswith(SUFFIXES)]
    named.append(("eval_data", config.eval_data))
    named.extend((f"task_options.{key}", value)
                 for key, value in flatten_keys(config.task_options).items())
    return {key: Path(value).expanduser() for key, value in named
            if isinstance(value, str) and value and Path(value).expanduser().is_file()}


def data_fingerprint(config: TrainConfig, task: Task) -> dict[str, Any]:
    """What a run trains and evaluates on, as ``run.json`` records it (``data``) for a resume
    to check: the path, size and SHA-256 of every data file ``config`` names (``files``, by
    key: ``task``, ``eval_data``, ``task_options.KEY``), and the count and a digest of the
    ``train`` and ``eval`` problems as loaded (ids, prompts, answers, references), which also
    covers generated tasks."""
    files = {key: {"path": str(path.resolve()), "size": path.stat().st_size,
                   "sha256": file_sha256(path)} for key, path in _data_files(config).items()}
    return {"files": files, "train": _problems_digest(task.train),
            "eval": _problems_digest(task.eval)}


def _data_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How the data now (:func:`data_fingerprint`) differ from those recorded."""
    changes = []
    then_files, now_files = recorded.get("files", {}), current["files"]
    for key in sorted(then_files.keys() | now_files.keys()):
        then, now = then_files.get(key), now_files.get(key)
        if then is None:
            changes.append(f"{key}={now['path']} was not read when the run started")
        elif now is None:
            changes.append(f"{key}={then['path']} is no longer read")
        elif (then["size"], then["sha256"]) != (now["size"], now["sha256"]):
            changes.append(f"{key}={now['path']} changed since the run started ({then['size']} "
                           f"bytes, sha256 {then['sha256'][:12]}... then; {now['size']} bytes, "
                           f"sha256 {now['sha256'][:12]}... now)")
    for split, what in (("train", "training"), ("eval", "held-out")):
        then, now = recorded.get(split), current[split]
        if then is not None and then != now:
            changes.append(f"the {now['count']} {what} problems loaded now differ from the "
                           f"{then['count']} the run started with")
    return changes


def _record_resume(run: RunDir, runtime: Runtime, step: int) -> None:
    """Add this resume's processor and precision to ``run.json`` (:meth:`RunDir.
    record_resume`), with a warning where they differ from where the run trained last."""
    before = trained_on(run.read_info())
    facts = {"step": step, "device": str(runtime.device), "cpu": cpu_model(),
             "autocast_bf16": runtime.autocast,
             "sampler_dtype": str(next(runtime.sampler.parameters()).dtype),
             "torch": torch.__version__}
    here = machine_label(facts)
    if before and before[-1] != here:
        warnings.warn(f"resume: {run.path} trained up to step {step} on {before[-1]} and "
                      f"continues on {here}: the same weights sample differently under another "
                      "precision (and can on another processor), so the rest of the run is not "
                      "what an uninterrupted run would have trained; run.json records both "
                      "(resumes), and gear-rl study and compare name such runs", stacklevel=3)
    run.record_resume(facts)


def _check_resume(run: RunDir, checkpoint: Path, config: TrainConfig, task: Task) -> None:
    """Refuse to resume ``run`` from ``checkpoint`` on other data, from another run's
    checkpoint, or with another config than the checkpoint's (see :func:`open_run`)."""
    from gear_rl.train.checkpoint import checkpoint_identity

    info = run.read_info()
    recorded = info.get("data")
    if recorded is None:
        warnings.warn(f"resume: {run.path}/run.json records no data fingerprint (a run started "
                      "by an older gear-rl): the data cannot be checked against what the run "
                      "started with", stacklevel=3)
    else:
        changes = _data_changes(recorded, data_fingerprint(config, task))
        if changes:
            raise ValueError(f"resume: {run.path} was started on other data: "
                             f"{'; '.join(changes)}. A resumed run trains and evaluates on the "
                             "data it started with: restore them, or train a new run (another "
                             "out=) on the new data")
    identity = checkpoint_identity(checkpoint)
    saved = identity.get("config")
    differences = ([] if saved is None
                   else config_differences(saved, config_to_dict(config)))
    ours, theirs = info.get("run_id"), identity.get("run_id")
    if ours and theirs and ours != theirs:
        written = (saved or {}).get("out") or "another folder"
        raise ValueError(f"resume: {checkpoint} was written by another run ({written}, run id "
                         f"{theirs}), not by {run.path} (run id {ours})"
                         + (f"; it differs in {'; '.join(differences)}" if differences else "")
                         + ": a run resumes only from its own checkpoints; remove them, or "
                         "resume the run they belong to")
    if differences:
        raise ValueError(f"resume: {run.path}/config.yaml differs from the config "
                         f"{checkpoint.name} was trained with ({'; '.join(differences)}, "
                         "checkpoint first): restore config.yaml; a resumed run may change only "
                         "steps, threads, device, log.* and eval.every")


def resume_config(run_dir: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """The saved config of ``run_dir`` with ``resume`` set; ``overrides`` may change only
    ``steps``, ``threads``, ``device``, ``log.*`` and ``eval.every`` (:data:`RESUMABLE`;
    anything else would make the continued run a different run), and may repeat any other
    key with the run's own value; ``out`` may only name the run's own folder."""
    run = RunDir(run_dir)
    if not run.is_run():
        raise ValueError(f"resume: {run_dir} has no config.yaml (not a gear-rl run directory)")
    config = recorded_config(run.read_config())
    out = (overrides or {}).get("out")
    if out is not None and Path(str(out)).resolve() != run.path.resolve():
        raise ValueError(f"resume: a resumed run stays in its own folder ({run.path}); drop "
                         f"out={out}")
    saved = config_to_dict(config)
    config_from_dict(dict(overrides or {}), config)
    changed = config_differences(saved, config_to_dict(config))
    if changed:
        raise ValueError(f"resume: {changed[0].split(':')[0]!r} cannot change when resuming "
                         f"(the run's value, then the one given: {'; '.join(changed)}); only "
                         "steps, threads, device, log.* and eval.every can")
    config.resume = str(run_dir)
    config.out = str(run_dir)
    config.validate()
    return config
