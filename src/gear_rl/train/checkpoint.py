"""The checkpoint format: ``RUN_DIR/checkpoints/step-000010/`` with the fp32 weights
(safetensors), the optimiser state, and ``state.pt`` (step, RNG states). A checkpoint is written
into a temporary folder and renamed into place, then ``checkpoints/latest`` is replaced atomically
(paths and atomic writes: :mod:`gear_rl.rundir`); an interrupted write leaves the previous
checkpoint intact."""

from __future__ import annotations

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

from gear_rl.rundir import RunDir, write_manifest

__all__ = ["latest_checkpoint", "load_checkpoint", "rng_state", "save_checkpoint",
           "set_rng_state"]


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
) -> Path:
    """Write the checkpoint of ``step`` atomically and prune all but the ``keep`` newest.

    Returns the checkpoint folder.
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    root = run.checkpoints
    root.mkdir(parents=True, exist_ok=True)
    final = run.checkpoint_folder(step)
    tmp = root / f".tmp-{final.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    # Tied weights (lm_head = embed_tokens) share storage; keep the first name of each tensor.
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
    (tmp / "state.json").write_text(json.dumps({"step": step}) + "\n")
    write_manifest(tmp)  # sizes and checksums: a damaged checkpoint is recognised on load
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    run.point_latest(final)
    checkpoints = run.checkpoint_folders()
    for old in checkpoints[:-keep] if keep > 0 else []:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path | RunDir) -> Path | None:
    """The folder named by ``RUN_DIR/checkpoints/latest``, or None when there is none."""
    return (run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)).latest_checkpoint()


def load_checkpoint(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """Load weights (and optimiser state) from ``folder`` into ``model`` / ``optimizer``.

    Returns the saved state dict (``step``, ``rng`` and any extras); the RNG states are not
    applied here (see :func:`set_rng_state`).
    """
    folder = Path(folder)
    try:
        tensors = load_file(str(folder / "model.safetensors"))
    except (OSError, SafetensorError) as error:
        raise ValueError(f"checkpoint {folder} cannot be read ({error}); it may be damaged: "
                         "an older one in the same folder is used when resuming") from error
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {name for name in missing if name.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise ValueError(f"checkpoint {folder} does not match the model: missing "
                         f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))
    return torch.load(folder / "state.pt", weights_only=False)
