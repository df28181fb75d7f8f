"""A verl study's cells in the verl environment (``gear-rl study`` with ``engine: verl``;
:mod:`gear_rl.study.verl_cells`).

    python -m gear_rl.study.verl_job prepare PLAN.json
    python -m gear_rl.study.verl_job run PARENT_PID CELL.yaml RUN_DIR NAME WORKDIR

``prepare`` runs once before any cell trains: for each (task, method) of the cells to train, the
recipe's command (``recipes/verl/run_gear_qwen3_4b.sh``, as the cell will run it) composes its
config with Hydra's ``--cfg job`` (an override verl rejects fails here, with Hydra's message),
and gear-rl's trainer mode checks it (:func:`gear_rl.integrations.verl.trainer.gear_settings_for`:
the estimator against the agent loop, ``algorithm.gear.*``); each setting's data and the model
are written once under ``WORKDIR`` (shared by every cell, so every cell of a task reads the same
files). ``run`` is one cell: the verl job of its overrides, its checkpoints and run log in
``RUN_DIR``, through the CPU mode (:mod:`gear_rl.integrations.verl.cpu_job`) on a CPU and the
recipe as is where a GPU is visible; it asks for SIGTERM when the study dies, so the job's
clean-up (its process group, ``/dev/shm``) runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gear_rl.integrations.verl import cpu_job
from gear_rl.study.verl_cells import VerlCellConfig, verl_cell_state

__all__ = ["cell_plan", "check_cell", "main", "run_cell"]

CHECK_TIMEOUT_S = 300.0


def _device() -> str:
    """``cuda`` where a GPU is visible to this process, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cell_plan(entry: dict[str, Any], run_dir: Path, name: str, workdir: Path, *,
              device: str | None = None) -> cpu_job.JobPlan:
    """The job of one cell (``entry``: a cell file's content): its overrides, the estimator
    under verl's name, its folder's paths."""
    from gear_rl.integrations.verl.estimators import verl_name

    config = VerlCellConfig(setting=entry["setting"], estimator=entry["estimator"],
                            seed=int(entry["seed"]), steps=int(entry["steps"]),
                            overrides=tuple(entry["overrides"]))
    overrides = [f"algorithm.adv_estimator={verl_name(config.estimator)}",
                 *config.command_overrides(run_dir, name)]
    if verl_cell_state(run_dir) == "interrupted":  # resumed: step 0 was evaluated already
        overrides.append("trainer.val_before_train=false")
    return cpu_job.plan_job(overrides, setting=config.setting, workdir=workdir,
                            device=device or _device())


def check_cell(plan: cpu_job.JobPlan, name: str) -> None:
    """Compose the cell's config the way its job will (``--cfg job``: Hydra refuses an unknown
    key or a bad value) and run gear-rl's trainer-mode checks on it.

    Raises:
        ValueError: naming the cell and what was refused.
    """
    from omegaconf import OmegaConf

    from gear_rl.integrations.verl.trainer import gear_settings_for

    try:
        done = subprocess.run([*plan.command, "--cfg", "job"], env=plan.env, cwd=plan.workdir,
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise ValueError(f"cell {name}: verl's config did not compose in "
                         f"{CHECK_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise ValueError(f"cell {name}: verl refused its overrides: "
                         + " | ".join(lines[-6:]))
    printed = re.search(r"^[A-Za-z_]+:", done.stdout, re.M)  # the YAML, after any log lines
    try:
        config = OmegaConf.create(done.stdout[printed.start():] if printed else "{}")
        gear_settings_for(config)
    except ValueError as error:
        raise ValueError(f"cell {name}: {error}") from None


def prepare(plan_path: Path) -> int:
    """``prepare``: check each (task, method) of the plan once and write the shared data and
    model; 0 when every cell passed, 2 (the reasons on stderr) when any was refused."""
    entries = json.loads(plan_path.read_text(encoding="utf-8"))
    workdir = plan_path.parent
    device = _device()
    seen: set[tuple[str, str]] = set()
    refused = []
    for entry in entries:
        key = (entry["task"], entry["method"])
        if key in seen:  # the seeds of a (task, method) differ only in data and sampling seed
            continue
        seen.add(key)
        try:
            plan = cell_plan(entry, Path(entry["run_dir"]), entry["cell"], workdir,
                             device=device)
            check_cell(plan, entry["cell"])
        except ValueError as error:
            refused.append(str(error))
            continue
        print(f"[study] {entry['cell']}: verl's config composed and gear-rl's checks passed",
              file=sys.stderr)
    for line in refused:
        print(f"[study] {line}", file=sys.stderr)
    return 2 if refused else 0


def run_cell(parent: int, cell_file: Path, run_dir: Path, name: str, workdir: Path) -> int:
    """``run``: one cell's verl job; its exit code (:func:`cpu_job.run_job`)."""
    from gear_rl.study.cell import die_with_parent

    die_with_parent(parent, signal.SIGTERM)  # the study died: stop the job, cleanly
    entry = yaml.safe_load(cell_file.read_text(encoding="utf-8"))
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = cell_plan(entry, run_dir, name, workdir)
    print(f"[study] {name}: {' '.join(plan.command)}", file=sys.stderr, flush=True)
    return cpu_job.run_job(plan)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["prepare"] and len(args) == 2:
        return prepare(Path(args[1]))
    if args[:1] == ["run"] and len(args) == 6 and args[1].isdigit():
        return run_cell(int(args[1]), Path(args[2]), Path(args[3]), args[4], Path(args[5]))
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
