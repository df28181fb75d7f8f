"""Held-out evaluation: Mean@k (average correctness over k samples per problem) and pass@k
(share of problems with at least one correct sample among k)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from gear_rl.agent.loop import AgentLimits
from gear_rl.signals import prompt_ids as build_prompt_ids
from gear_rl.tasks import Problem, Task
from gear_rl.train.episodes import collect, decode_response

if TYPE_CHECKING:
    from gear_rl.agent.tools import PythonSandbox

__all__ = ["decode_response", "evaluate"]


def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    *,
    problems: Sequence[Problem] | None = None,
    k: int = 4,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_new_tokens: int = 48,
    seed: int = 1234,
    stop_ids: Sequence[int],
    pad_id: int,
    batch_size: int | None = 128,
    limits: AgentLimits | None = None,
    sandbox: PythonSandbox | None = None,
) -> dict[str, Any]:
    """Sample ``k`` responses per held-out problem and score them.

    Args:
        model: the sampler (a causal LM; its device is used).
        tokenizer: its tokenizer (chat template for the prompts).
        task: scorer and, unless ``problems`` is given, the held-out problems (``task.eval``).
        k, temperature, top_p, max_new_tokens: sampling.
        seed: seeds the sampling stream, so the same model and seed give the same score.
        stop_ids, pad_id: see ``gear_rl.train.rollout.sample_responses``.
        batch_size: rows per generation batch.
        limits, sandbox: multi-turn limits and the Python sandbox for agent / environment
            tasks (see :func:`gear_rl.train.episodes.collect`).

    Returns:
        ``{"mean@k": float, "pass@k": float, "problems": int, "samples": int,
        "response_len": float, "truncated": float, "records": [...]}`` where ``records`` has one
        entry per problem (id, answer, per-sample rewards and extracted answers), plus the
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
    rows = collect(task, [p for p in problems for _ in range(k)],
                   [p for p in prompts for _ in range(k)], model=model, tokenizer=tokenizer,
                   stop_ids=stop_ids, pad_id=pad_id, temperature=temperature, top_p=top_p,
                   generator=generator, max_new_tokens=max_new_tokens, batch_size=batch_size,
                   limits=limits, sandbox=sandbox)
    records, correct, any_correct = [], 0.0, 0
    for index, problem in enumerate(problems):
        rewards, answers = [], []
        for j in range(k):
            row = index * k + j
            rewards.append(rows.rewards[row])
            answers.append(rows.extracted[row])
        hits = [r >= 1.0 for r in rewards]
        correct += sum(hits)
        any_correct += any(hits)
        records.append({"id": problem.id, "answer": problem.answer, "rewards": rewards,
                        "extracted": answers})
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
