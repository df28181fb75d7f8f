"""Held-out evaluation: Mean@k (average correctness over k samples per problem) and pass@k
(share of problems with at least one correct sample among k), with per-problem records.

**Paired draws.** On single-turn tasks every sample has its own uniform numbers: sample ``j``
of problem ``i`` is row ``i * k + j`` of its generation batch, and before decoding each batch
draws ``[rows, max_new_tokens]`` numbers from the ``seed`` stream, row after row
(``SamplingParams(paired_draws=True)``). A row's token at step ``s`` is sampled by inverse CDF
with its own number ``s``, whatever any other row generates and whenever it finishes, so two
models evaluated with the same ``seed``, problems, ``k`` and ``batch_size`` sample each
(problem, sample) with identical random numbers: a comparison of two methods is paired problem
by problem and draw by draw (common random numbers). Finished rows still leave the batch, as in
training. (One draw per live row and step instead, what training does, would shift the later
rows' draws by how many rows a model has already finished.) Multi-turn tasks (agents,
environments) sample from one stream seeded by ``seed``: they are paired by problem only.

**Running it.** :func:`run_evaluation` evaluates a built run's sampler with ``config.eval``'s
settings (training and ``gear-rl eval`` alike); :func:`evaluate_model` builds the run first
(a model, or a checkpoint's weights).

**Records.** :func:`gear_rl.rundir.write_eval_records` stores one evaluation's per-problem
records in the run directory (``eval_records/step-NNNNNN.json``, one file per evaluated step,
written atomically, so a resumed run rewrites the same files and leaves nothing behind);
:func:`gear_rl.rundir.read_eval_records` reads them back, whichever engine wrote them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gear_rl.agent.loop import AgentLimits
from gear_rl.sampling import SamplingParams
from gear_rl.signals import prompt_ids as build_prompt_ids
from gear_rl.tasks import Problem, Task
from gear_rl.train.config import TrainConfig
from gear_rl.train.episodes import collect, decode_response, task_turns
from gear_rl.train.runtime import Runtime, agent_limits, build_runtime, sampling_params

if TYPE_CHECKING:
    from gear_rl.agent.tools import PythonSandbox

__all__ = ["decode_response", "evaluate", "evaluate_model", "run_evaluation"]


def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    *,
    sampling: SamplingParams,
    problems: Sequence[Problem] | None = None,
    k: int = 4,
    seed: int = 1234,
    limits: AgentLimits | None = None,
    sandbox: PythonSandbox | None = None,
    reuse_cache: bool = True,
) -> dict[str, Any]:
    """Sample ``k`` responses per held-out problem and score them.

    Args:
        model: the sampler (a causal LM; its device is used).
        tokenizer: its tokenizer (chat template for the prompts).
        task: scorer and, unless ``problems`` is given, the held-out problems (``task.eval``).
        sampling: how to sample (:class:`~gear_rl.sampling.SamplingParams`; ``batch_size``:
            rows per generation batch); single-turn tasks always sample with paired draws
            (see the module docstring).
        k: samples per problem.
        seed: seeds the sampling stream, so the same model and seed give the same score
            (single-turn tasks: the same draws for each (problem, sample) whatever the model,
            see the module docstring).
        limits, sandbox: multi-turn limits and the Python sandbox for agent / environment
            tasks (see :func:`gear_rl.train.episodes.collect`).

    Returns:
        ``{"mean@k": float, "pass@k": float, "problems": int, "samples": int,
        "response_len": float, "truncated": float, "records": [...]}`` where ``records`` has one
        entry per problem in the order of ``problems`` (``id``, ``answer``, the k per-sample
        ``rewards``, ``extracted`` answers and response ``lengths`` in tokens), plus the
        agent / environment metrics of multi-turn tasks (``agent/...``, ``env/...``).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    problems = list(task.eval if problems is None else problems)
    if not problems:
        raise ValueError("no problems to evaluate")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(int(seed))
    prompts = [build_prompt_ids(tokenizer, p.prompt) for p in problems]
    row_problems = [p for p in problems for _ in range(k)]
    row_prompts = [p for p in prompts for _ in range(k)]
    rows = collect(task, row_problems, row_prompts, model=model, tokenizer=tokenizer,
                   sampling=replace(sampling, paired_draws=True), generator=generator,
                   limits=limits, sandbox=sandbox, reuse_cache=reuse_cache)
    records, correct, any_correct = [], 0.0, 0
    for index, problem in enumerate(problems):
        chosen = range(index * k, (index + 1) * k)
        rewards = [rows.rewards[row] for row in chosen]
        hits = [r >= 1.0 for r in rewards]
        correct += sum(hits)
        any_correct += any(hits)
        records.append({"id": problem.id, "answer": problem.answer, "rewards": rewards,
                        "extracted": [rows.extracted[row] for row in chosen],
                        "lengths": [len(rows.response_ids[row]) for row in chosen]})
    samples = len(problems) * k
    return {
        f"mean@{k}": correct / samples,
        f"pass@{k}": any_correct / len(problems),
        "problems": len(problems),
        "samples": samples,
        "response_len": sum(len(r) for r in rows.response_ids) / samples,
        "truncated": 1.0 - sum(rows.finished) / samples,
        "records": records,
        **rows.metrics,
    }


def run_evaluation(config: TrainConfig, runtime: Runtime) -> dict[str, Any]:
    """Held-out Mean@k / pass@k of ``runtime``'s sampler with ``config.eval``'s settings
    (training and ``gear-rl eval`` alike)."""
    settings = config.eval
    sampling = sampling_params(settings, runtime)
    if task_turns(runtime.task) is not None:
        # a multi-turn episode's KV cache spans its whole context (prompt, turns and
        # observations): decode no more rows at once than a training rollout does (on
        # tool-math, 128 rows of it held 1.35 GB); these tasks are paired by problem only
        rollout_rows = config.rollout.prompts_per_step * config.rollout.samples_per_prompt
        batch_size = sampling.batch_size
        sampling = replace(sampling, batch_size=rollout_rows if batch_size is None
                           else min(batch_size, rollout_rows))
    return evaluate(runtime.sampler, runtime.tokenizer, runtime.task, sampling=sampling,
                    k=settings.k, seed=settings.seed,
                    limits=agent_limits(config, runtime.task, evaluation=True),
                    sandbox=runtime.sandbox, reuse_cache=config.agent.reuse_kv_cache)


def evaluate_model(config: TrainConfig, checkpoint: str | Path | None = None) -> dict[str, Any]:
    """Held-out Mean@k / pass@k of ``config.model`` (or of a checkpoint: a run directory, whose
    newest intact checkpoint is used, or a ``checkpoints/step-N`` folder) on ``config.task``
    with the ``config.eval`` settings. Returns :func:`evaluate`'s dict,
    with ``checkpoint_folder`` and ``checkpoint_step``: the checkpoint scored (None for
    ``config.model``'s own weights)."""
    runtime = build_runtime(config, checkpoint=checkpoint, training=False)
    try:
        result = run_evaluation(config, runtime)
    finally:
        runtime.close()
    return {**result, "checkpoint_folder": None if runtime.checkpoint is None
            else str(runtime.checkpoint), "checkpoint_step": runtime.checkpoint_step}
