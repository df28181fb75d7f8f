"""The Monte-Carlo values phase of the ``gear`` trainer mode: SPO-chain (arXiv 2505.23564,
Sec. 3-4) and VinePPO (arXiv 2410.01679, Sec. 4, Eq. 5) inside verl 0.9.1.

``gear-rl train``'s values phase (``gear_rl.train.episodes.monte_carlo_extras``) continues each
response from the boundaries the estimator names (``Estimator.mc_boundaries``) with the policy's
own sampler and hands the mean rewards back in ``CreditBatch.extras["mc_values"]``. Here the
same is done with the job's own parts:

- **continuations** are requests to the job's rollout servers (verl's ``LLMServerClient``, the
  client its agent loops use), which hold the weights that sampled the step: ``mc_samples``
  requests per boundary, each ``prompt + response[:b]`` continued at the rollout's temperature,
  top-p and top-k for at most ``data.max_response_length - b`` tokens, stopped at the model's
  end-of-turn tokens. vLLM's prefix cache serves the shared prefix of a boundary's requests;
  identical prefixes (the same prompt and response tokens up to ``b``) are estimated once, as
  the authors and ``gear-rl train`` do (``dedupe_prefixes``);
- **rewards** are the job's reward function (``reward.custom_reward_function``, or verl's
  default scorer), called as verl's reward manager calls it: ``(data_source, solution_str,
  ground_truth, extra_info)`` with the decoded ``response[:b] + continuation``.

``V`` of a boundary is the mean of its continuations' rewards. Single-turn rows only (a
multi-turn continuation would have to replay the tools or the environment).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ContinuationRequest", "MonteCarloValues", "call_reward", "continuation_requests",
           "estimate_values", "job_scorer", "score_continuations"]


@dataclass(frozen=True)
class ContinuationRequest:
    """One distinct prefix to continue: ``prompt + response[:boundary]`` of the rows in
    ``rows`` (each with the position of this boundary in its own list).

    Attributes:
        prefix: the token ids sent to the server.
        response_prefix: ``response[:boundary]`` (what the continuation is appended to).
        budget: tokens a continuation may add (the response's remaining length).
        rows: ``(row, k)`` pairs: row ``row``'s ``k``-th boundary is this prefix.
    """

    prefix: tuple[int, ...]
    response_prefix: tuple[int, ...]
    budget: int
    rows: tuple[tuple[int, int], ...]


def continuation_requests(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                          boundaries: Sequence[Sequence[int]], max_response_length: int, *,
                          dedupe: bool = True) -> list[ContinuationRequest]:
    """The distinct prefixes of every row's boundaries (``dedupe``: equal prompt and response
    ids up to the boundary share one request), in first-seen order. A boundary with no
    budget left (``b >= max_response_length``) still gets a request of budget 0: its value is
    its prefix's own reward."""
    if not len(prompts) == len(responses) == len(boundaries):
        raise ValueError(f"{len(prompts)} prompts, {len(responses)} responses and "
                         f"{len(boundaries)} boundary lists")
    found: dict[Any, list[Any]] = {}
    for row, (prompt, response, bounds) in enumerate(zip(prompts, responses, boundaries,
                                                         strict=True)):
        for k, b in enumerate(bounds):
            if not 0 <= b <= len(response):
                raise ValueError(f"row {row}: boundary {b} outside its response of "
                                 f"{len(response)} tokens")
            head = tuple(int(t) for t in response[:b])
            prefix = tuple(int(t) for t in prompt) + head
            key: Any = prefix if dedupe else (row, k)
            entry = found.setdefault(key, [prefix, head, max(0, max_response_length - b), []])
            entry[3].append((row, k))
    return [ContinuationRequest(prefix=p, response_prefix=h, budget=n, rows=tuple(r))
            for p, h, n, r in found.values()]


@dataclass
class MonteCarloValues:
    """What the values phase hands the estimator and logs.

    Attributes:
        values: ``B`` lists, one ``V`` per boundary (``extras["mc_values"]``).
        rewards: per request, its continuations' rewards (for checks).
        requests: the distinct prefixes continued.
        tokens: continuation tokens sampled.
    """

    values: list[list[float]]
    rewards: list[list[float]]
    requests: list[ContinuationRequest]
    tokens: int


Generate = Callable[[list[int], int], Any]
"""``generate(prefix_ids, max_tokens)``: an awaitable of one continuation's token ids."""
Score = Callable[[int, list[int]], float]
"""``score(row, response_ids)``: the job's reward of row ``row``'s response ``response_ids``."""


async def _continue_all(requests: Sequence[ContinuationRequest], samples: int,
                        generate: Generate) -> list[list[list[int]]]:
    async def one(request: ContinuationRequest) -> list[int]:
        if request.budget <= 0:
            return []
        return [int(t) for t in await generate(list(request.prefix), request.budget)]

    tasks = [[one(r) for _ in range(samples)] for r in requests]
    flat = await asyncio.gather(*(t for per in tasks for t in per))
    return [list(flat[i * samples:(i + 1) * samples]) for i in range(len(requests))]


def score_continuations(requests: Sequence[ContinuationRequest],
                        continuations: Sequence[Sequence[Sequence[int]]],
                        score: Score) -> list[list[float]]:
    """Each request's continuations scored as its first row's response (the rows of one
    request share the prompt, hence the problem)."""
    return [[float(score(r.rows[0][0], list(r.response_prefix) + list(c))) for c in conts]
            for r, conts in zip(requests, continuations, strict=True)]


def estimate_values(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                    boundaries: Sequence[Sequence[int]], *, samples: int,
                    max_response_length: int, generate: Generate, score: Score,
                    dedupe: bool = True) -> MonteCarloValues:
    """``V`` at every row's boundaries: the mean reward of ``samples`` continuations of each
    distinct prefix (:func:`continuation_requests`), sampled by ``generate`` and scored by
    ``score``. Runs its own event loop (verl's trainer calls it from synchronous code)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"mc_samples must be an int >= 1, got {samples!r}")
    requests = continuation_requests(prompts, responses, boundaries, max_response_length,
                                     dedupe=dedupe)
    continuations = asyncio.run(_continue_all(requests, samples, generate))
    rewards = score_continuations(requests, continuations, score)
    values: list[list[float]] = [[0.0] * len(b) for b in boundaries]
    for request, got in zip(requests, rewards, strict=True):
        mean = sum(got) / len(got)
        for row, k in request.rows:
            values[row][k] = mean
    return MonteCarloValues(values=values, rewards=rewards, requests=requests,
                            tokens=sum(len(c) for conts in continuations for c in conts))


def call_reward(fn: Callable[..., Any], data_source: Any, solution: str, ground_truth: Any,
                extra_info: Any) -> float:
    """verl's reward function called as its reward manager calls it; a dict result gives its
    ``score``; a coroutine function is run to completion."""
    result = fn(data_source=data_source, solution_str=solution, ground_truth=ground_truth,
                extra_info=extra_info)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    if isinstance(result, dict):
        result = result["score"]
    return float(result)


async def _await(value: Any) -> Any:
    return await value


def job_scorer(reward_fn: Callable[..., Any], decode: Callable[[list[int]], str],
               data_sources: Sequence[Any], reward_models: Sequence[Any],
               extra_infos: Sequence[Any], setting: str) -> Score:
    """``score(row, response_ids)`` with the job's reward function on row ``row``'s problem
    (its ``data_source``, ``reward_model.ground_truth`` and ``extra_info``); an exception of
    the reward function becomes a ``RuntimeError`` naming ``setting`` (e.g.
    ``algorithm.adv_estimator=vineppo``), the row and its data source, so the job ends saying
    why instead of training on a value it could not compute."""

    def score(row: int, ids: list[int]) -> float:
        model = reward_models[row] if isinstance(reward_models[row], dict) else {}
        try:
            return call_reward(reward_fn, data_sources[row], decode(ids),
                               model.get("ground_truth"), extra_infos[row])
        except Exception as err:
            raise RuntimeError(
                f"{setting}: the job's reward function (reward.custom_reward_function) raised "
                f"while scoring a Monte-Carlo continuation of row {row} (data_source "
                f"{data_sources[row]!r}): {err!r}") from err

    return score
