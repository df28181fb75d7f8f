"""``gear-rl compare --estimators``: train every ``(estimator, seed)`` with the same config and
budget, one after another in this process, then compare them
(:func:`gear_rl.report.compare.compare_runs`, which only reads run directories).

Running trainings is orchestration, so it lives here beside ``gear-rl study``'s runner
(:mod:`gear_rl.study.runner`, whose :func:`~gear_rl.study.runner.run_state` both use to tell a
new run folder from a finished or an interrupted one), not in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gear_rl.report.compare import Comparison, compare_runs
from gear_rl.study.runner import run_state
from gear_rl.train.config import config_to_dict, load_config
from gear_rl.train.resume import resume_config
from gear_rl.train.trainer import Trainer

__all__ = ["run_comparison"]

# Keys compare sets per run; an override of one is refused.
_RESERVED = ("estimator", "seed", "out", "resume")


def run_comparison(estimators: Sequence[str], seeds: Sequence[int], out: str | Path, *,
                   config_path: str | Path | None = None, overrides: Sequence[str] = (),
                   baseline: str | None = None, confidence: float = 0.95,
                   alpha: float = 0.05, allow_mismatch: bool = False) -> Comparison:
    """Train every ``(estimator, seed)`` with the same config and budget, one after another in
    this process, into ``out/<estimator>-s<seed>``, then
    :func:`~gear_rl.report.compare.compare_runs` them into ``out``.

    An interrupted comparison continues where it stopped: a run directory that holds a finished
    run (``summary.json``) with the same config is reused, and one that holds an interrupted
    run (a checkpoint, no summary) with the same config is resumed from its latest checkpoint
    (``resume=RUN_DIR``).

    Args:
        estimators: registered estimator names (``gear_rl.credit.ESTIMATORS``).
        seeds: seeds, the same for every estimator.
        out: the comparison folder.
        config_path: a ``gear-rl train`` YAML config shared by all runs.
        overrides: ``key=value`` train overrides shared by all runs (not estimator, seed, out).

    Raises:
        ValueError: empty or duplicate estimators/seeds, a reserved override, a config the
            trainer rejects, a run directory holding a run with another config, or one holding
            a run interrupted before its first checkpoint (nothing to resume from); all checked
            for every run before any training starts.
    """
    if not estimators or not seeds:
        raise ValueError("compare: give at least one estimator and one seed")
    if len(set(estimators)) != len(estimators) or len(set(seeds)) != len(seeds):
        raise ValueError(f"compare: duplicate estimators or seeds ({list(estimators)}, "
                         f"{list(seeds)})")
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in _RESERVED:
            raise ValueError(f"compare: {key}= is set per run by compare; drop {item!r}")
    folder = Path(out)
    configs = []
    for estimator in estimators:
        for seed in seeds:
            run_dir = folder / f"{estimator}-s{seed}"
            config = load_config(config_path, [*overrides, f"estimator={estimator}",
                                               f"seed={seed}", f"out={run_dir}"])
            configs.append((run_dir, config))
    todo = []  # what to train: new runs, and interrupted ones resumed from their checkpoint
    for run_dir, config in configs:
        wanted = config_to_dict(config)
        wanted["out"] = str(run_dir)
        try:
            state = run_state(run_dir, wanted)
        except ValueError as error:
            raise ValueError(f"compare: {error}; choose another --out") from None
        if state == "new":
            todo.append(config)
        elif state == "no_checkpoint":
            raise ValueError(f"compare: {run_dir} holds a run interrupted before its first "
                             "checkpoint (nothing to resume from); remove it to train it again, "
                             "or choose another --out")
        elif state == "interrupted":
            todo.append(resume_config(run_dir))
    for config in todo:
        Trainer(config).train()
    return compare_runs([run_dir for run_dir, _ in configs], folder, baseline=baseline,
                        confidence=confidence, alpha=alpha, allow_mismatch=allow_mismatch)
