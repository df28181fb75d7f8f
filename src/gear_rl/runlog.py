"""What every engine logs about a training step into a run directory: one builder per record
kind, shared by gear-rl's trainer (:mod:`gear_rl.train.records`) and the TRL and verl adapters
(:mod:`gear_rl.integrations`), so ``gear-rl report`` and ``gear-rl compare`` read the same
records whichever engine trained.

- :func:`sample_records`: a few trajectories of a step with every per-token signal
  (divergence, entropy, segment onsets, token weights, the final token advantage) for
  ``samples.jsonl`` and the report's token-credit viewer.
- :func:`rollout_metrics`: the step's rollout health numbers under the trainer's names
  (``reward_mean``, ``reward_std``, ``groups_mixed``, ``response_len``, ``entropy_mean``).
- :func:`engine_metrics`: an engine's numeric metrics for ``metrics.jsonl``, its
  ``gear/<diagnostic>`` credit diagnostics also under the trainer's bare names;
  :func:`verl_held_out`: verl's validation score as the trainer's ``eval/mean@N``.
- :class:`EngineRunLog`: the run directory an adapter writes (``config.yaml``, ``run.json``
  with its ``engine``, ``metrics.jsonl``, ``samples.jsonl``, ``summary.json``), through
  :class:`gear_rl.rundir.RunDir`.

Per-token tensors are ``[B, T]`` over the response, right-padded, ``T`` at least the longest
response; ``mask`` is 1 on the policy's own tokens (docs/design.md §2).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from gear_rl.credit import CreditBatch, Estimator, gear_segments
from gear_rl.credit.diagnostics import DIAGNOSTIC_NAMES, reference_outcome, token_weights
from gear_rl.credit.registry import record_credit_defaults
from gear_rl.dataclass_config import check_int
from gear_rl.rundir import RunDir

__all__ = [
    "DEFAULT_LOG_SAMPLES",
    "ENGINES",
    "EngineRunLog",
    "check_run_log_settings",
    "engine_metrics",
    "pick_rows",
    "rollout_metrics",
    "sample_records",
    "verl_held_out",
]

DEFAULT_LOG_SAMPLES = 4
"""Trajectories per step an adapter keeps in ``samples.jsonl`` unless told otherwise (the
trainer's ``log.samples_per_step`` default too): the best and worst of two mixed groups."""
ENGINES = ("gear-rl", "trl", "verl")
"""The engines that write run directories (``run.json``'s ``engine``; absent: ``gear-rl``)."""


def _groups(group_ids: Sequence[Hashable] | torch.Tensor) -> list[Hashable]:
    """``B`` group keys as plain Python values (a ``[B]`` tensor's as ints)."""
    return group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)


def _group_rows(group_ids: Sequence[Hashable] | torch.Tensor) -> list[list[int]]:
    """The rows of each group, groups in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    for row, group in enumerate(_groups(group_ids)):
        groups.setdefault(group, []).append(row)
    return list(groups.values())


def pick_rows(rewards: torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor,
              count: int) -> list[int]:
    """The ``count`` rows to log: the best and the worst rewarded row of each group with mixed
    rewards (groups in order of first appearance), then the other rows in order.

    Args:
        rewards: ``[B]`` outcome rewards.
        group_ids: ``B`` group keys (rows sharing a prompt), or a ``[B]`` integer tensor.
        count: how many rows at most.
    """
    if count <= 0:
        return []
    chosen: list[int] = []
    for rows in _group_rows(group_ids):
        values = rewards[rows]
        if float(values.max()) > float(values.min()):
            chosen += [rows[int(values.argmax())], rows[int(values.argmin())]]
    chosen += [row for row in range(len(group_ids)) if row not in chosen]
    return chosen[:count]


def sample_records(step: int, batch: CreditBatch, advantages: torch.Tensor,
                   response_ids: Sequence[Sequence[int]], *, estimator: Estimator,
                   credit_config: Any, decode: Callable[[list[int]], str], count: int,
                   rewards: torch.Tensor | None = None, outcome: torch.Tensor | None = None,
                   teacher_rows: torch.Tensor | None = None,
                   row_fields: Callable[[int], dict[str, Any]] | None = None,
                   ) -> list[dict[str, Any]]:
    """Up to ``count`` ``samples.jsonl`` records of one step (rows chosen by :func:`pick_rows`),
    each with its per-token signals cut to its response's length.

    Args:
        step: the training step (1 for the first).
        batch: the estimator's input: ``group_ids``, ``[B, T]`` ``mask`` and the signals it had
            (``divergence``, ``entropy``, ``student_logprobs``, ``teacher_logprobs``; None where
            not computed). ``batch.rewards`` is the rewards unless ``rewards`` is given.
        advantages: ``[B, T]`` the token advantages the loss used.
        response_ids: ``B`` response token id lists (their lengths cut the ``[B, T]`` rows).
        estimator, credit_config: the estimator that produced ``advantages`` and its config
            (its ``segments`` declaration decides whether segment onsets are logged).
        decode: token ids -> text (each token is decoded on its own).
        count: at most this many records (0: none).
        rewards: ``[B]`` outcome rewards to log and choose rows by (default ``batch.rewards``;
            TRL passes its rewards, its ``batch.rewards`` being its advantage).
        outcome: ``[B]`` trajectory advantage ``A`` the token weights ``W = Ahat / A`` are
            measured against (default: :func:`reference_outcome`, GRPO's of ``batch``).
        teacher_rows: ``[B]`` bool, the rows the teacher pass ran on (None: every row); the
            others log no teacher signals and no segments.
        row_fields: row -> the engine's own fields for that record (prompt, answer, response
            text...), merged in after ``step``, ``row`` and ``group``.

    Returns:
        One dict per chosen row: ``step``, ``row``, ``group``, the ``row_fields``, ``reward``,
        ``advantage`` (``A``), ``tokens``, ``token_ids``, and the per-token lists ``mask``,
        ``entropy``, ``divergence``, ``student_logprobs``, ``teacher_logprobs``,
        ``token_advantage``, ``weight`` (rounded to 5 decimals; None when not computed) and
        ``segment_onset`` (the onset index of each token's segment, -1 outside).
    """
    rewards = batch.rewards if rewards is None else rewards
    group_ids = _groups(batch.group_ids)
    chosen = pick_rows(rewards, group_ids, count)
    if not chosen:
        return []
    mask = batch.mask
    scalar = (reference_outcome(batch, credit_config) if outcome is None else outcome).float()
    weights = token_weights(scalar.to(advantages.device), advantages, mask.to(advantages.device)
                            ) if estimator.uses_reward else None
    segments = None
    if estimator.segments and batch.divergence is not None and batch.entropy is not None:
        segments = gear_segments(batch.divergence, batch.entropy, mask, credit_config)
    out = []
    for row in chosen:
        ids = [int(t) for t in response_ids[row]]
        length = len(ids)

        def values(tensor: torch.Tensor | None, row: int = row, length: int = length
                   ) -> list[float] | None:
            return (None if tensor is None
                    else [round(float(v), 5) for v in tensor[row, :length]])

        # a row the teacher skipped has no teacher signals to show
        taught = teacher_rows is None or bool(teacher_rows[row])
        record: dict[str, Any] = {"step": step, "row": row, "group": group_ids[row]}
        record.update(row_fields(row) if row_fields is not None else {})
        record.update({
            "reward": float(rewards[row]), "advantage": float(scalar[row]),
            "tokens": [decode([t]) for t in ids], "token_ids": ids,
            "mask": [int(v) for v in mask[row, :length]],
            "entropy": values(batch.entropy),
            "divergence": values(batch.divergence if taught else None),
            "student_logprobs": values(batch.student_logprobs),
            "teacher_logprobs": values(batch.teacher_logprobs if taught else None),
            "token_advantage": values(advantages),
            "weight": values(weights),
            "segment_onset": (None if segments is None or not taught
                              else [int(v) for v in segments[row, :length]]),
        })
        out.append(record)
    return out


def rollout_metrics(rewards: torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor,
                    mask: torch.Tensor,
                    response_ids: Sequence[Sequence[int]],
                    entropy: torch.Tensor | None = None) -> dict[str, float]:
    """A step's rollout health under the trainer's names.

    Args:
        rewards: ``[B]`` outcome rewards. group_ids: ``B`` group keys.
        mask: ``[B, T]`` policy-token mask. response_ids: ``B`` response id lists.
        entropy: ``[B, T]`` student entropy (None: no ``entropy_mean``).

    Returns:
        ``reward_mean``, ``reward_std`` (unbiased; 0 for one row), ``groups_mixed`` (share of
        groups whose rewards are not all equal), ``response_len`` (mean tokens per response,
        observations included) and, with ``entropy``, ``entropy_mean`` over policy tokens.
    """
    mixed = [float(rewards[rows].max() > rewards[rows].min()) for rows in _group_rows(group_ids)]
    out = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "groups_mixed": sum(mixed) / max(1, len(mixed)),
        "response_len": sum(len(r) for r in response_ids) / max(1, len(response_ids)),
    }
    if entropy is not None:
        out["entropy_mean"] = float((entropy * mask).sum() / mask.sum().clamp(min=1.0))
    return out


def engine_metrics(metrics: Mapping[str, Any], prefix: str | None = "gear/"
                   ) -> dict[str, float]:
    """An engine's metrics for ``metrics.jsonl``: the finite numbers (numpy scalars and 0-d
    tensors included; no bools, strings or lists) under their own names and, unless ``prefix``
    is None, each credit diagnostic ``<prefix><name>``
    (:data:`~gear_rl.credit.diagnostics.DIAGNOSTIC_NAMES`) also under its bare name, the one
    the trainer logs and the report plots."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (bool, str, bytes)):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of many values
            continue
        if math.isfinite(number):
            out[str(key)] = number
    for name in DIAGNOSTIC_NAMES if prefix is not None else ():
        if f"{prefix}{name}" in out:
            out[name] = out[f"{prefix}{name}"]
    return out


_VERL_MEAN = re.compile(r"val-core/(?P<source>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)")


def verl_held_out(metrics: Mapping[str, Any]) -> dict[str, float]:
    """verl's held-out accuracy under the trainer's name: ``val-core/<data_source>/<var>/mean@N``
    (verl's mean score over the ``N`` validation samples of each problem, its ``acc`` where the
    reward gives one, else its ``reward``) as ``eval/mean@N``, which ``gear-rl compare`` scores
    runs by. Only where one data source was validated (several: nothing, since one number
    would weigh them by their sizes)."""
    found = {}
    for key, value in metrics.items():
        match = _VERL_MEAN.fullmatch(str(key))
        if match is not None:
            found[match["source"]] = (f"eval/mean@{match['n']}", value)
    if len(found) != 1:
        return {}
    name, value = next(iter(found.values()))
    return engine_metrics({name: value}, prefix=None)


def check_run_log_settings(prefix: str, log_samples_per_step: Any, run_log_dir: Any) -> None:
    """An adapter's two run-log knobs: ``log_samples_per_step`` an integer >= 0 (0: no run
    log), ``run_log_dir`` None or a folder path; errors name ``<prefix><knob>``."""
    check_int(f"{prefix}log_samples_per_step", log_samples_per_step, 0)
    if run_log_dir is not None and (not isinstance(run_log_dir, str) or not run_log_dir):
        raise ValueError(f"{prefix}run_log_dir must be a folder path or None, "
                         f"got {run_log_dir!r}")


class EngineRunLog:
    """A gear-rl run directory written by an engine adapter (``CreditGRPOTrainer``, verl's
    ``trainer_mode=gear``), readable by ``gear-rl report`` and ``gear-rl compare``.

    Opening it locks the folder (:meth:`RunDir.lock`) and either starts a new run there
    (``config.yaml``, ``run.json`` with ``engine``, empty ``metrics.jsonl`` and
    ``samples.jsonl``; a ``summary.json`` of an earlier run is removed) or, when the run
    continues from a checkpoint (``first_step > 1`` and the folder holds a run), drops the
    records of steps after ``first_step - 1`` and appends from there. A line on stderr says
    where the run directory is.

    Args:
        path: the run directory (created).
        engine: one of :data:`ENGINES`.
        config: what ``config.yaml`` holds: the keys the report and compare read
            (``estimator``, ``credit``, ``seed``, ``model``, ``task``, ``steps``, ``rollout``)
            and the engine's own settings.
        info: more facts for ``run.json`` (versions, argv).
        first_step: the step the engine is about to train (1 for a new run).
    """

    def __init__(self, path: str | Path, *, engine: str, config: dict[str, Any],
                 info: dict[str, Any], first_step: int = 1) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.engine = engine
        self.run = RunDir(path)
        self.run.path.mkdir(parents=True, exist_ok=True)
        self.run.lock(user=f"{engine} run")
        try:
            if first_step > 1 and self.run.is_run():
                self.run.truncate_logs(first_step - 1)
            else:
                # a default that changed since runs were first recorded is written out
                self.run.create({"engine": engine, **record_credit_defaults(config)},
                                {"engine": engine, **info})
                self.run.summary_path.unlink(missing_ok=True)
        except BaseException:
            self.run.unlock()
            raise
        print(f"[gear-rl] {engine} run log: {self.run.path} (gear-rl report {self.run.path})",
              file=sys.stderr)

    @property
    def path(self) -> Path:
        return self.run.path

    def log_step(self, step: int, metrics: Mapping[str, Any],
                 samples: Sequence[dict[str, Any]] = ()) -> None:
        """Append one ``metrics.jsonl`` line (``{"step": step, **metrics}``) and the step's
        ``samples.jsonl`` records."""
        self.run.append_metrics({"step": step, **metrics})
        for sample in samples:
            self.run.append_sample(sample)

    def finish(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` (``engine`` and ``run_dir`` added), which marks the run
        finished, and release the folder."""
        self.run.write_summary({"engine": self.engine, "run_dir": str(self.run.path),
                                **summary})
        self.close()

    def close(self) -> None:
        """Release the folder's lock (a later run may write it)."""
        self.run.unlock()
