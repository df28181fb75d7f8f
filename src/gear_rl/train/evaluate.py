"""Held-out evaluation: Mean@k (average correctness over k samples per problem) and pass@k
(share of problems with at least one correct sample among k)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gear_rl.signals import prompt_ids as build_prompt_ids
from gear_rl.tasks import Problem, Task
from gear_rl.train.rollout import sample_responses

__all__ = ["decode_response", "evaluate"]


def decode_response(tokenizer, response_ids: Sequence[int], finished: bool) -> str:
    """Text of a response without its end-of-turn token (and without special tokens)."""
    ids = list(response_ids[:-1] if finished else response_ids)
    return tokenizer.decode(ids, skip_special_tokens=True)


def evaluate(
    model: torch.nn.Module,
    tokenizer,
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

    Returns:
        ``{"mean@k": float, "pass@k": float, "problems": int, "samples": int,
        "response_len": float, "truncated": float, "records": [...]}`` where ``records`` has one
        entry per problem (id, answer, per-sample rewards and extracted answers).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    problems = list(task.eval if problems is None else problems)
    if not problems:
        raise ValueError("no problems to evaluate")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(int(seed))
    prompts = [build_prompt_ids(tokenizer, p.prompt) for p in problems]
    rollout = sample_responses(
        model, [p for p in prompts for _ in range(k)], max_new_tokens=max_new_tokens,
        stop_ids=stop_ids, pad_id=pad_id, temperature=temperature, top_p=top_p,
        generator=generator, batch_size=batch_size,
    )
    records, correct, any_correct = [], 0.0, 0
    for index, problem in enumerate(problems):
        rewards, answers = [], []
        for j in range(k):
            row = index * k + j
            text = decode_response(tokenizer, rollout.response_ids[row], rollout.finished[row])
            rewards.append(task.score(problem, text))
            answers.append(task.extract(text))
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
        "response_len": rollout.num_tokens / samples,
        "truncated": 1.0 - sum(rollout.finished) / samples,
        "records": records,
    }
