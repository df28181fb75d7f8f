"""Studies whose cells are verl jobs (``engine: verl`` in a study file; docs/study.md, "Studies
on verl").

A verl study's budget is a ``verl:`` block of Hydra overrides (dotted keys, shared by every
cell: model path, data files, batch sizes, lengths, GPUs per cell, validation frequency); a task
is a verl data setting of the CPU mode (``setting``: ``math``, ``tir``, ``toolrl``, ``sokoban``,
``keydoor``, ``textarena:GAME``) with its own overrides (e.g. ``data.train_files`` and
``data.val_files``); a method is a registry estimator (``algorithm.adv_estimator``, verl's name
for it) with its own overrides (``algorithm.gear.*``, the optimiser...). Each cell's Hydra
overrides are, in order: the ``verl:`` block, the task's, the method's, then what the study sets
(:data:`STUDY_SET`): the estimator, the trainer mode ``gear`` (which writes the run log the
report reads, :mod:`gear_rl.integrations.verl.trainer`), the seed as verl's data order
(``data.seed``) and sampling seed (``actor_rollout_ref.rollout.seed``), validation before
training (step 0), and resuming from the cell's own checkpoints. A seed thus gives every
method's cell the same data order and the same prompts per step, as ``gear-rl train``'s seed
does in a ``gear-rl`` study.

Nothing here imports verl: the study runs in gear-rl's environment and starts each cell in the
verl environment's interpreter (:func:`verl_python`), where
:mod:`gear_rl.study.verl_job` checks every cell's overrides against verl's own
config before any cell trains, writes the shared data and model once, and runs one cell.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gear_rl.dataclass_config import hydra_override_key, shown

__all__ = [
    "ENGINES",
    "ENGINE_KEY",
    "METHOD_SHARED",
    "STEPS_KEY",
    "STUDY_SET",
    "VerlCellConfig",
    "check_verl_overrides",
    "covers",
    "hydra_value",
    "verl_cell_state",
    "verl_python",
    "verl_setting",
]

ENGINES = ("gear-rl", "verl")
"""What a study's cells run on: ``gear-rl train`` (the default) or verl jobs."""
ENGINE_KEY = "engine"
STEPS_KEY = "trainer.total_training_steps"
"""The ``verl:`` block's training steps (required: the report compares cells at that step)."""

STUDY_SET = {
    "algorithm.adv_estimator": "set by each method (methods.NAME.estimator)",
    "trainer.v1.trainer_mode": "every cell runs in gear-rl's trainer mode, whose run log the "
                               "report reads",
    "data.seed": "set per cell from the seeds lists (the data order)",
    "actor_rollout_ref.rollout.seed": "set per cell from the seeds lists (the sampling seed)",
    "trainer.default_local_dir": "each cell keeps its checkpoints in its own folder",
    "algorithm.gear.run_log_dir": "each cell's run log is its folder",
    "algorithm.gear.log_samples_per_step": "the report reads the run log (it must be on)",
    "trainer.resume_mode": "the study resumes interrupted cells itself",
    "trainer.val_before_train": "always on: every cell's start (step 0) is evaluated",
    "trainer.experiment_name": "named after the cell",
}
"""Keys a verl study sets per cell: never in its ``verl:`` block or overrides."""

METHOD_SHARED = ("data", "actor_rollout_ref.model", "actor_rollout_ref.rollout.n",
                 "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p",
                 "actor_rollout_ref.rollout.val_kwargs",
                 "actor_rollout_ref.rollout.response_length",
                 "actor_rollout_ref.rollout.multi_turn", "actor_rollout_ref.rollout.agent",
                 "trainer.total_training_steps", "trainer.total_epochs", "trainer.test_freq",
                 "trainer.n_gpus_per_node", "trainer.nnodes", "reward")
"""What every cell of a task must share (data, model, sampling, budget, evaluation, reward):
a method's overrides may not change them."""

_SAVE_DEFAULTS = {"trainer.save_freq": 1, "trainer.max_actor_ckpt_to_keep": 1}
"""Checkpoint every step, keep the newest only (a CPU cell's step is a minute or more; give
``trainer.save_freq`` in the ``verl:`` block for a big model)."""


def covers(key: str, setting: str) -> bool:
    """Whether dotted ``key`` sets ``setting`` or part of it (or a section holding it)."""
    return key == setting or key.startswith(setting + ".") or setting.startswith(key + ".")


def hydra_value(value: Any) -> str:
    """A YAML value as a Hydra override's value: booleans ``true``/``false``, ``null``, numbers
    as written, lists and mappings in Hydra's grammar, strings quoted where Hydra would read
    them otherwise."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    plain = text and all(c.isalnum() or c in "_-./:@" for c in text) and not text[0].isdigit() \
        and text.lower() not in ("true", "false", "null", "none")
    return text if plain else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_verl_overrides(overrides: Mapping[str, Any], where: str, *,
                         method: bool = False) -> dict[str, Any]:
    """``overrides`` (flattened dotted keys) checked: no key the study sets per cell
    (:data:`STUDY_SET`), and for a method none every cell of a task shares
    (:data:`METHOD_SHARED`). Returns them as given.

    Raises:
        ValueError: such a key, naming it and why.
    """
    for key in overrides:
        bare = hydra_override_key(key)
        for reserved, why in STUDY_SET.items():
            if covers(bare, reserved):
                raise ValueError(f"{where}: {shown(key)} cannot be set in a verl study ({why})")
        if method:
            for shared in METHOD_SHARED:
                if covers(bare, shared):
                    raise ValueError(
                        f"{where}: {shown(key)} changes what every cell of a task must share "
                        "(data, model, sampling, budget, evaluation, reward); set it in the "
                        "verl: block or the task")
    return dict(overrides)


def verl_setting(task_key: str, entry: Mapping[str, Any], where: str) -> str:
    """A verl task's data setting: its ``setting``, else its key when that names one."""
    from gear_rl.integrations.verl.cpu_job import SETTINGS
    from gear_rl.integrations.verl.data import ENV_SETTINGS, is_env_setting

    setting = entry.get("setting", task_key)
    if not isinstance(setting, str) or not (setting in SETTINGS or is_env_setting(setting)):
        raise ValueError(f"{where}.setting must be one of {', '.join((*SETTINGS, *ENV_SETTINGS))}"
                         f" (the CPU mode's data settings), got {shown(setting)}"
                         + ("" if "setting" in entry else " (from the task's key; give setting:)"))
    return setting


@dataclass(frozen=True)
class VerlCellConfig:
    """What a verl cell trains under.

    Attributes:
        setting: the CPU mode's data setting (the recipe's ``SETTING``).
        estimator: the registry estimator (verl's name for it is resolved in the verl
            environment).
        seed: the cell's seed.
        steps: ``trainer.total_training_steps``.
        overrides: the Hydra overrides, in order (the ``verl:`` block, the task's, the
            method's, the study's defaults); the cell's paths and the estimator are added when it
            starts (:meth:`command_overrides`).
    """

    setting: str
    estimator: str
    seed: int
    steps: int
    overrides: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """The cell file's content (``cells/<task>/<method>-s<seed>.yaml``)."""
        return {ENGINE_KEY: "verl", "setting": self.setting, "estimator": self.estimator,
                "seed": self.seed, "steps": self.steps, "overrides": list(self.overrides)}

    @classmethod
    def build(cls, *, setting: str, estimator: str, seed: int, steps: int,
              shared: Mapping[str, Any], task: Mapping[str, Any],
              method: Mapping[str, Any]) -> VerlCellConfig:
        given = [*shared.items(), *task.items(), *method.items()]
        keys = {hydra_override_key(k) for k, _ in given}
        items = [f"{k}={hydra_value(v)}" for k, v in given]
        items += [f"{k}={v}" for k, v in _SAVE_DEFAULTS.items() if k not in keys]
        if "trainer.test_freq" not in keys:  # the held-out score at the last step
            items.append(f"trainer.test_freq={steps}")
        items += [f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}",
                  "trainer.val_before_train=true", "trainer.resume_mode=auto",
                  "trainer.v1.trainer_mode=gear"]
        return cls(setting, estimator, seed, steps, tuple(items))

    def command_overrides(self, run_dir: Path, name: str) -> list[str]:
        """The overrides a cell starts with: its own plus its folder (checkpoints under
        ``run_dir/checkpoints``, the run log in ``run_dir``) and experiment name. The
        estimator's verl name is added by the cell process."""
        run_dir = Path(run_dir).resolve()
        return [*self.overrides, f"trainer.default_local_dir={run_dir / 'checkpoints'}",
                f"++algorithm.gear.run_log_dir={run_dir}",
                f"trainer.experiment_name={name.replace('/', '-')}"]


def verl_cell_state(run_dir: Path) -> str:
    """What a verl cell's folder holds: ``new``, ``finished`` (the run log's
    ``summary.json``), ``interrupted`` (a verl checkpoint to resume from:
    ``checkpoints/latest_checkpointed_iteration.txt``) or ``no_checkpoint``."""
    from gear_rl.rundir import RunDir

    run = RunDir(run_dir)
    if run.finished():
        return "finished"
    if (run.checkpoints / "latest_checkpointed_iteration.txt").is_file():
        return "interrupted"
    return "no_checkpoint" if run_dir.exists() and any(run_dir.iterdir()) else "new"


def verl_python(environ: Mapping[str, str] | None = None) -> str:
    """The interpreter of the verl environment: ``GEAR_RL_VERL_PY``, else this interpreter
    where verl's v1 trainer imports, else the checkout's ``.venv/verl-cpu`` (what
    ``scripts/setup_verl_cpu.sh`` builds).

    Raises:
        ValueError: none of them has verl, saying how to get one.
    """
    import importlib.util

    environ = os.environ if environ is None else environ
    given = environ.get("GEAR_RL_VERL_PY")
    if given:
        if shutil.which(given) is None and not Path(given).is_file():
            raise ValueError(f"GEAR_RL_VERL_PY={given!r} is not an interpreter")
        return given
    if importlib.util.find_spec("transfer_queue") is not None and \
            importlib.util.find_spec("verl") is not None:
        return sys.executable
    local = Path(__file__).resolve().parents[3] / ".venv" / "verl-cpu" / "bin" / "python"
    if local.is_file():
        return str(local)
    raise ValueError("a verl study needs verl 0.9.1's environment: run it from that environment, "
                     "set GEAR_RL_VERL_PY to its python, or build .venv/verl-cpu on a CPU "
                     "(bash scripts/setup_verl_cpu.sh)")
