"""The checkpoint format: ``RUN_DIR/checkpoints/step-000010/`` with the fp32 weights
(safetensors), the optimiser state, ``state.pt`` (step, RNG states) and ``state.json`` (the step,
the run's id and its resolved config: which run, and which config, the checkpoint belongs to).
A checkpoint is written into a temporary folder, every file and the folder are fsynced, the
folder is renamed into place, then ``checkpoints/latest`` is replaced atomically and durably, and
only then are older checkpoints pruned (paths and atomic writes: :mod:`gear_rl.rundir`): an
interrupted write, a full disk or a power loss leaves ``latest`` naming a complete checkpoint.
Readers of a run that is still training (evaluation) load through :func:`read_checkpoint`, which
moves on to the newest intact checkpoint when the trainer prunes the one being read."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gear_rl.rundir import (
    DISK_FULL,
    RunDir,
    checkpoint_problem,
    fsync_folder,
    fsync_path,
    write_manifest,
)

__all__ = ["checkpoint_identity", "latest_checkpoint", "load_checkpoint", "read_checkpoint",
           "rng_state", "save_checkpoint", "set_rng_state"]

STATE_JSON = "state.json"
"""A checkpoint's readable state: ``step``, ``run_id`` and ``config`` (:func:`save_checkpoint`)."""
READ_ATTEMPTS = 5
"""How many checkpoints :func:`read_checkpoint` tries when each is pruned while it is read."""
_FULL_BYTES = 1 << 20
"""Free space under which a failed checkpoint write is taken for a full disk."""


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) global RNG states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: str | Path | RunDir,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any] | None = None,
    keep: int = 1,
    config: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` durably and prune all but the ``keep`` newest.

    ``config``: the run's resolved config (``config_to_dict``), recorded in ``state.json`` with
    the run's id (``run.json``'s ``run_id``) so that a resume recognises a checkpoint of another
    run or of another config (:func:`checkpoint_identity`). Every file and folder is fsynced
    before ``latest`` moves, and ``latest`` before an older checkpoint is removed.

    Returns the checkpoint folder.

    Raises:
        OSError: ``ENOSPC`` naming the checkpoints folder when the disk fills up (torch and
            safetensors report it as a bare write failure); the partial checkpoint is removed,
            and ``latest`` and the checkpoints before it are left as they were.
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    root = run.checkpoints
    root.mkdir(parents=True, exist_ok=True)
    final = run.checkpoint_folder(step)
    tmp = root / f".tmp-{final.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        # Tied weights (lm_head = embed_tokens) share storage; keep the first name of each.
        seen: set[int] = set()
        tensors = {}
        for name, tensor in model.state_dict().items():
            key = tensor.untyped_storage().data_ptr()
            if key in seen:
                continue
            seen.add(key)
            tensors[name] = tensor.detach().to("cpu").contiguous()
        save_file(tensors, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"step": step, "rng": rng_state(), **(extra or {})}, tmp / "state.pt")
        identity = {"step": step, "run_id": run.read_info().get("run_id"),
                    "config": None if config is None else {**config, "out": str(run.path)}}
        (tmp / STATE_JSON).write_text(json.dumps(identity) + "\n")
        write_manifest(tmp)  # sizes and checksums: a damaged checkpoint is recognised on load
        fsync_folder(tmp)
    except BaseException as error:
        full = _out_of_space(error, root)  # before the partial files are removed
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise OSError(errno.ENOSPC, f"No space left on device (checkpoint {final.name} was "
                          "not written)", str(root)) from error
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(root)
    run.point_latest(final)  # atomic, and fsynced with its folder
    # only checkpoints count and go: a step-N folder without a state.pt is none of this run's
    # (an export put there, a folder copied in), and pruning leaves it alone
    checkpoints = [f for f in run.checkpoint_folders() if (f / "state.pt").is_file()]
    for old in checkpoints[:-keep] if keep > 0 else []:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path | RunDir) -> Path | None:
    """The folder named by ``RUN_DIR/checkpoints/latest``, or None when there is none."""
    return (run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)).latest_checkpoint()


def checkpoint_identity(folder: str | Path) -> dict[str, Any]:
    """What ``state.json`` says a checkpoint belongs to: ``step``, ``run_id`` (the run's id,
    ``run.json``) and ``config`` (its resolved config); a checkpoint written before these were
    recorded has the step alone, and an unreadable file gives {}."""
    try:
        loaded = json.loads((Path(folder) / STATE_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def load_checkpoint(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """Load weights (and optimiser state) from ``folder`` into ``model`` / ``optimizer``.

    Returns the saved state dict (``step``, ``rng`` and any extras); the RNG states are not
    applied here (see :func:`set_rng_state`).

    Raises:
        ValueError: the weights cannot be read, or do not fit ``model`` (other tensor names or
            shapes: a checkpoint of another model); the message names the first difference and
            the model the checkpoint was trained with.
    """
    folder = Path(folder)
    try:
        tensors = load_file(str(folder / "model.safetensors"))
    except (OSError, SafetensorError) as error:
        raise ValueError(f"checkpoint {folder} cannot be read ({error}); it may be damaged: "
                         "an older one in the same folder is used when resuming") from error
    expected = model.state_dict()
    shapes = [f"{name} is {list(tensor.shape)} there and {list(expected[name].shape)} in the "
              "model" for name, tensor in tensors.items()
              if name in expected and tensor.shape != expected[name].shape]
    missing = set(expected) - set(tensors)
    missing -= {name for name in missing if name.endswith("lm_head.weight")}  # tied
    unexpected = set(tensors) - set(expected)
    if shapes or missing or unexpected:
        trained = (checkpoint_identity(folder).get("config") or {}).get("model")
        source = f" (it was trained with model={trained})" if trained else ""
        first = shapes[0] if shapes else (f"missing {sorted(missing)[:3]}, unexpected "
                                          f"{sorted(unexpected)[:3]}")
        more = f" and {len(shapes) - 1} more tensors differ" if len(shapes) > 1 else ""
        raise ValueError(f"checkpoint {folder} does not match the model being loaded{source}: "
                         f"{first}{more}; load it into the model it was trained with")
    model.load_state_dict(tensors, strict=False)
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))
    return torch.load(folder / "state.pt", weights_only=False)


def read_checkpoint(target: str | Path, model: torch.nn.Module) -> tuple[Path, dict[str, Any]]:
    """Load the weights of ``target`` into ``model`` for a reader (``gear-rl eval``): a
    checkpoint folder, or a run directory, whose newest intact checkpoint is used.

    A run that is still training prunes its older checkpoints (``log.keep_checkpoints``),
    possibly under its readers: when the checkpoint chosen in a run directory disappears while
    it is read, the run's newest intact checkpoint is read instead (up to
    :data:`READ_ATTEMPTS` checkpoints). Returns the folder loaded and its saved state (``step``).

    Raises:
        ValueError: ``target`` holds no intact checkpoint, a named checkpoint folder was
            removed while it was read, or the weights do not fit ``model``.
    """
    path = Path(target)
    named = (path / "model.safetensors").is_file()
    for _ in range(READ_ATTEMPTS):
        if named:
            problem = checkpoint_problem(path)
            if problem:
                raise ValueError(f"checkpoint: {path} is damaged ({problem})")
            folder: Path | None = path
        else:
            folder = RunDir(path).latest_checkpoint(verify=True)
        if folder is None:
            raise ValueError(f"checkpoint: {path} {_no_checkpoint(path)}")
        try:
            return folder, load_checkpoint(folder, model)
        except (OSError, ValueError):
            if checkpoint_problem(folder, checksums=False) is None:
                raise  # the checkpoint is still there: not a pruning
        if named:
            raise ValueError(f"checkpoint: {path} was removed while it was read (the run that "
                             "wrote it prunes older checkpoints, log.keep_checkpoints); run the "
                             "command again, or give the run directory to read its newest "
                             "checkpoint")
    raise ValueError(f"checkpoint: {READ_ATTEMPTS} checkpoints of {path} in a row were removed "
                     "while they were read; try again")


def _no_checkpoint(path: Path) -> str:
    """Why ``path``, given as a checkpoint folder or a run directory, has no intact checkpoint
    to read: each of its checkpoints is damaged (and how), it has none, or it is neither."""
    run = RunDir(path)
    folders = run.checkpoint_folders()
    if folders:
        problems = "; ".join(f"{f.name}: {checkpoint_problem(f)}" for f in folders[-3:])
        return (f"has no intact checkpoint: every one of its {len(folders)} checkpoint "
                f"folder(s) is damaged ({problems})")
    if run.is_run():
        return ("is a run directory with no checkpoint yet: a run writes one at its end and "
                "every log.checkpoint_every steps; finish or resume the run first")
    if (path / "state.pt").is_file() or (path / "manifest.json").is_file():
        return f"is a damaged checkpoint folder ({checkpoint_problem(path)})"
    return "is neither a checkpoint folder nor a run directory with one"


def _out_of_space(error: BaseException, folder: Path) -> bool:
    """Whether ``error``, raised while writing into ``folder``, comes from a full disk: an
    ``OSError`` ENOSPC or EDQUOT, or the bare write failure torch and safetensors raise instead
    (``RuntimeError: ... unexpected pos``, ``SafetensorError``) on a file system left with
    (almost) no free space."""
    if isinstance(error, OSError):
        return error.errno in DISK_FULL
    if not isinstance(error, (RuntimeError, SafetensorError)):
        return False
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < _FULL_BYTES
