"""``gear-rl export``: a run's checkpoint as a plain Hugging Face model directory.

A checkpoint (:mod:`gear_rl.train.checkpoint`) holds the trained weights, the optimiser and the
RNG states, and names its model by the run's config (``model=smollm2-135m``, ``tiny-random`` or
a local directory), not by a ``config.json``: it is what a resume needs, not what
``AutoModelForCausalLM.from_pretrained`` or vLLM can load. :func:`export_policy` rebuilds the
run's model and tokenizer (:func:`gear_rl.models.load_policy`), loads the checkpoint's weights
into it (:func:`gear_rl.train.checkpoint.read_checkpoint`, which checks the manifest) and writes
``config.json``, ``generation_config.json``, ``model.safetensors``, the tokenizer with its chat
template and ``gear_rl_export.json`` (which run, step and model it came from) into a temporary
sibling of the output folder; every file and the folder are fsynced before the folder is renamed
into place, so a crash never leaves a half export under the requested name.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from gear_rl.dataclass_config import check_output_folder
from gear_rl.rundir import CHECKPOINTS, RunDir, fsync_folder, fsync_path

__all__ = ["EXPORT_DTYPES", "EXPORT_INFO", "export_policy", "read_export_info"]

EXPORT_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None, "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}
"""``dtype=`` values: ``auto`` keeps the checkpoint's own dtype (fp32: lossless)."""
EXPORT_INFO = "gear_rl_export.json"
"""What an export came from: ``run``, ``run_id``, ``step``, ``model``, ``dtype``."""


def export_policy(run_dir: str | Path, out: str | Path, *, step: int | None = None,
                  dtype: str = "auto") -> dict[str, Any]:
    """Write the weights of the run's checkpoint of ``step`` (default: the newest intact one)
    with the run's tokenizer and chat template into ``out``, a new folder that
    ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load offline.

    Args:
        run_dir: a ``gear-rl train`` run directory.
        out: the folder to create; it may exist only as an empty folder.
        step: the checkpoint's step (``checkpoints/step-N``); None for ``checkpoints/latest``.
        dtype: ``auto`` (the checkpoint's fp32), ``fp32`` or ``bf16``.

    Returns:
        The contents of ``out/gear_rl_export.json``, with ``out``.

    Raises:
        ValueError: ``out`` exists and is not an empty folder, ``run_dir`` is not a run or holds
            no checkpoint, ``step`` has no checkpoint (the message lists those there are), the
            checkpoint is damaged or does not fit the run's model, or ``dtype`` is unknown.
    """
    from gear_rl.models import load_policy
    from gear_rl.train.checkpoint import read_checkpoint
    from gear_rl.train.config import recorded_config

    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(EXPORT_DTYPES)}")
    out = Path(out).expanduser()
    dest = _export_target(out)
    run = RunDir(run_dir)
    if not run.is_run():
        raise ValueError(f"{run.path} is not a gear-rl run directory (no {run.config_path.name})")
    folders = run.checkpoint_folders()
    if not folders:
        raise ValueError(f"{run.path} has no checkpoint to export: a run writes one at its end and "
                         "every log.checkpoint_every steps; finish or resume the run first")
    if step is None:
        target: Path = run.path  # the newest intact checkpoint, followed if pruned while read
    else:
        target = run.checkpoint_folder(step)
        if target not in folders:
            steps = ", ".join(str(int(f.name.removeprefix("step-"))) for f in folders)
            raise ValueError(f"{run.path} has no checkpoint of step {step}; its checkpoints are "
                             f"of step {steps} (older ones are pruned: log.keep_checkpoints)")
    config = recorded_config(run.read_config())
    model, tokenizer = load_policy(config.model, dtype=torch.float32, seed=config.seed)
    folder, state = read_checkpoint(target, model)
    wanted = EXPORT_DTYPES[dtype]
    if wanted is not None:
        # typeshed's functools.wraps types PreTrainedModel.to (@wraps(Module.to)) as unbound
        model = model.to(wanted)  # type: ignore[arg-type]
    info = {"run": str(run.path.resolve()), "run_id": run.read_info().get("run_id"),
            "step": int(state["step"]), "checkpoint": folder.name, "model": config.model,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)  # left by a crashed export of this process id
    try:
        staging.mkdir()
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        # safetensors writes its file 0600 whatever the umask; every exported file gets the
        # mode the umask gives a new file (that of EXPORT_INFO), so a server running as
        # another user can read the weights as it reads the tokenizer
        mode = (staging / EXPORT_INFO).stat().st_mode & 0o777
        for path in staging.rglob("*"):
            if path.is_file():
                path.chmod(mode)
        for sub in sorted(p for p in staging.rglob("*") if p.is_dir()):
            fsync_folder(sub)
        fsync_folder(staging)
        os.replace(staging, dest)  # replaces an empty folder; refuses one filled meanwhile
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError) and dest.exists() and any(dest.iterdir()):
            raise ValueError(f"{out} was filled while the export was written; nothing was "
                             "written there: choose another OUT") from error
        raise
    fsync_path(dest.parent)
    return {**info, "out": str(out)}


def _export_target(out: Path) -> Path:
    """The folder an export into ``out`` creates (``out`` with its links followed: a link to an
    empty folder gets the export in that folder's place), checked before anything is loaded:
    ``out`` passes the check of every output folder
    (:func:`~gear_rl.dataclass_config.check_output_folder`: no file or dangling link there or on
    its path, a writable file system), is new or an empty folder, and is neither the current
    folder (or one above it: the export replaces the folder it writes) nor inside a run's
    ``checkpoints`` folder (where a resume would take it for a checkpoint, and keep it while it
    prunes a real one)."""
    check_output_folder(out, "OUT")
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise ValueError(f"{out} already exists and is not an empty folder: export writes a new "
                         "folder; choose another OUT or remove that one")
    target = out.resolve()
    here = Path.cwd().resolve()
    if target == here or target in here.parents:
        which = "the current folder" if target == here else "a folder above the current one"
        raise ValueError(f"OUT {str(out)!r} is {which}: export puts a new folder in OUT's "
                         "place; give the path of a new folder (gear-rl export RUN ./model)")
    check_output_folder(target.parent, "OUT's parent folder")  # the staging folder goes there
    for place in target.parents:
        if place.name == CHECKPOINTS and RunDir(place.parent).is_run():
            raise ValueError(f"OUT {str(out)!r} is inside the checkpoints folder of the run "
                             f"{str(place.parent)!r}, where a resume would take it for a "
                             "checkpoint (and prune a real one to keep it); export outside "
                             f"{str(place)!r}")
    return target


def read_export_info(folder: str | Path) -> dict[str, Any] | None:
    """What :func:`export_policy` recorded in ``folder/``:data:`EXPORT_INFO` (the run, step,
    model and dtype the weights came from); None where ``folder`` holds no readable record (a
    model name, or a model folder not written by an export)."""
    path = Path(folder) / EXPORT_INFO
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None
