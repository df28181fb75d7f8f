"""What the trainer logs about a step, and the end-of-run summary.

- :func:`batch_metrics`: rollout health (reward, accuracy, mixed groups, lengths, entropy) and
  the credit diagnostics of :func:`gear_rl.credit.credit_diagnostics` (one set of names for the
  trainer, TRL and verl), for ``metrics.jsonl``.
- :func:`sample_records`: a few trajectories per step with every per-token signal (divergence,
  entropy, weights, segment onsets) for ``samples.jsonl`` and the report's token viewer.
- :func:`summarize` / :func:`format_summary`: start and end held-out accuracy, reward trend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gear_rl.credit import Estimator, credit_diagnostics
from gear_rl.rundir import TENSORBOARD, WANDB
from gear_rl.runlog import rollout_metrics
from gear_rl.runlog import sample_records as shared_sample_records
from gear_rl.train.scoring import Scores, StepBatch

__all__ = ["batch_metrics", "format_summary", "is_measurement", "sample_records", "summarize"]


def batch_metrics(batch: StepBatch, scores: Scores, advantages: torch.Tensor,
                  estimator: Estimator, credit_config: Any) -> dict[str, float]:
    """Rollout and credit health numbers of one batch (``advantages``: ``[B, T]``): the
    engines' shared :func:`gear_rl.runlog.rollout_metrics` plus ``accuracy``, ``truncated``,
    ``ref_kl``, the credit diagnostics and the rollout's agent statistics."""
    rewards, mask = batch.rewards, scores.mask
    old_logprobs, entropy = scores.student()
    tokens = mask.sum().clamp(min=1.0)
    out = rollout_metrics(rewards, batch.group_ids, mask, batch.response_ids, entropy)
    out["accuracy"] = float((rewards >= 1.0).float().mean())
    out["truncated"] = 1.0 - sum(batch.finished) / len(batch.finished)
    if scores.ref_logprobs is not None:
        out["ref_kl"] = float(((old_logprobs - scores.ref_logprobs) * mask).sum()
                              / tokens)
    out.update(credit_diagnostics(estimator, credit_config, scores.credit_batch(batch),
                                  advantages, teacher_rows=scores.teacher_rows))
    out.update(batch.rollout_metrics or {})
    return out


def sample_records(batch: StepBatch, scores: Scores, advantages: torch.Tensor, step: int, *,
                   estimator: Estimator, credit_config: Any, tokenizer: Any, task: Any,
                   count: int) -> list[dict[str, Any]]:
    """Up to ``count`` trajectories with their per-token signals (for the report's token
    viewer): alternately the best and worst rewarded rows of mixed groups first. The records
    are :func:`gear_rl.runlog.sample_records`' (the TRL and verl adapters write the same),
    with the trainer's problem fields (``problem_id``, ``prompt``, ``answer``, ``response``,
    ``extracted``, ``finished``; multi-turn: ``turn_ids``, ``transcript``); the groups are
    ``batch.group_ids``."""

    def problem_fields(row: int) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "problem_id": batch.problems[row].id,
            "prompt": tokenizer.decode(batch.prompt_ids[row]),
            "answer": batch.problems[row].answer, "response": batch.texts[row],
            "extracted": task.extract(batch.texts[row]), "finished": batch.finished[row],
        }
        if batch.turn_ids is not None:
            # multi-turn: mask 0 marks observation tokens; the transcript shows them
            fields["turn_ids"] = batch.turn_ids[row]
            fields["transcript"] = tokenizer.decode(batch.response_ids[row],
                                                    skip_special_tokens=False)
        return fields

    if count == 0:
        return []
    return shared_sample_records(
        step, scores.credit_batch(batch), advantages, batch.response_ids, estimator=estimator,
        credit_config=credit_config, decode=tokenizer.decode, count=count,
        teacher_rows=scores.teacher_rows, row_fields=problem_fields)


def is_measurement(key: str) -> bool:
    """True for a metrics key that measures the machine (``time/...``, ``memory/...``,
    ``perf/...``, ``..._per_s``): it differs between two runs that compute the same thing, so
    a resume or determinism check compares every other key."""
    return key.startswith(("time/", "memory/", "perf/")) or key.endswith("_per_s")


def summarize(history: list[dict[str, Any]], *, k: int, run_dir: str, estimator: str,
              model: str, task: str, seconds: float,
              trackers: Sequence[str] = (),
              matmul_peak: tuple[float, str] | None = None) -> dict[str, Any]:
    """Start/end held-out accuracy, reward trend and timings from the run's metric records.

    ``matmul_peak``: this machine's measured matmul FLOP/s and its precision
    (:func:`gear_rl.train.mfu.matmul_peak`), which the steps' ``perf/update_mfu`` divide by;
    the summary gives their mean (``update_mfu``) beside it."""
    key = f"eval/mean@{k}"
    evals = [(r["step"], r[key], r[f"eval/pass@{k}"]) for r in history if key in r]
    steps = [r for r in history if "reward_mean" in r]
    head, tail = steps[:5], steps[-5:]

    def mean(records: list[dict[str, Any]], name: str) -> float | None:
        values = [r[name] for r in records if name in r]
        return sum(values) / len(values) if values else None

    out: dict[str, Any] = {
        "run_dir": run_dir, "estimator": estimator, "model": model, "task": task,
        "trackers": list(trackers),
        "steps": len(steps), "seconds_this_session": round(seconds, 1),
        "step_seconds_mean": mean(steps, "time/step"),
        "reward_first5": mean(head, "reward_mean"), "reward_last5": mean(tail, "reward_mean"),
    }
    peaks = [r["memory/peak_rss_gb"] for r in steps if "memory/peak_rss_gb" in r]
    if peaks:  # over the whole run (records of earlier sessions included)
        out["peak_rss_gb"] = max(peaks)
    mfu = mean(steps, "perf/update_mfu")
    if mfu is not None and matmul_peak is not None:
        out["update_mfu"] = mfu
        out["matmul_peak_tflops"] = matmul_peak[0] / 1e12
        out["matmul_peak_dtype"] = matmul_peak[1]
    if evals:
        out[f"eval_start_mean@{k}"] = evals[0][1]
        out[f"eval_end_mean@{k}"] = evals[-1][1]
        out[f"eval_start_pass@{k}"] = evals[0][2]
        out[f"eval_end_pass@{k}"] = evals[-1][2]
        out["eval_history"] = evals
    return out


def format_summary(summary: dict[str, Any]) -> str:
    """The one-screen end summary."""
    lines = ["", "=" * 64, f"gear-rl train: {summary['estimator']} on {summary['model']}",
             f"task       {summary['task']}",
             f"steps      {summary['steps']}   ({summary['seconds_this_session']:.0f} s this "
             f"invocation, {summary['step_seconds_mean'] or 0:.1f} s/step)"]
    if summary.get("reward_first5") is not None:
        lines.append(f"reward     first 5 steps {summary['reward_first5']:.3f}  ->  last 5 "
                     f"{summary['reward_last5']:.3f}")
    for key in [k for k in summary if k.startswith("eval_start_")]:
        metric = key.removeprefix("eval_start_")
        start, end = summary[key], summary[f"eval_end_{metric}"]
        lines.append(f"held-out   {metric:<8} {start:.3f}  ->  {end:.3f}  ({end - start:+.3f})")
    if summary.get("peak_rss_gb") is not None:
        lines.append(f"memory     peak resident {summary['peak_rss_gb']:.2f} GB")
    if summary.get("update_mfu") is not None:
        lines.append(f"update MFU {100 * summary['update_mfu']:.1f}% of this machine's "
                     f"{summary['matmul_peak_tflops']:.2f} TFLOP/s {summary['matmul_peak_dtype']}"
                     " matmul (measured; gear_rl.train.mfu)")
    trackers = summary.get("trackers", [])
    # the trackers with a folder in the run directory (trackio keeps its own store, and
    # trackio.init prints the command that opens its dashboard)
    folders = "".join(f", {name}/" for name in trackers if name in (TENSORBOARD, WANDB))
    lines.append(f"run dir    {summary['run_dir']}  (metrics.jsonl, samples.jsonl, "
                 f"checkpoints/{folders})")
    lines.append("=" * 64)
    return "\n".join(lines)
