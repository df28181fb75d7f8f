"""One rollout entry point for every kind of task: single-turn, tool-using agent, environment.

The trainer's rollout and the held-out evaluation both call :func:`collect`, so a task is
sampled and scored the same way in both. Per row it returns the response token ids, the policy
mask (0 on observation tokens: tool outputs and environment boards, which GEAR's scan skips and
the loss ignores), turn ids, the reward, and for environment tasks the per-step spans, state keys
and rewards that the step-level estimators (``gear_rl.credit.steps``) read.

- Single-turn tasks: :func:`gear_rl.sampling.sample_responses`, scored on the decoded text.
- Agent tasks (``task.agent``): :func:`gear_rl.agent.run_agent` with the trainer's KV-cache
  sampler; Python calls run in a :class:`~gear_rl.agent.tools.PythonSandbox`. The reward is the
  task's score of the last policy turn (or of all policy turns, ``AgentSpec.score_text``).
- Environment tasks (``task.env``): :func:`gear_rl.agent.env_loop.run_env_episodes`; the reward
  is 1.0 when the level is solved.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from gear_rl.agent.loop import AgentLimits, EpisodePrefix
from gear_rl.sampling import RowStop, SamplingParams, TurnCache, sample_responses
from gear_rl.tasks import Problem, Task

if TYPE_CHECKING:
    from gear_rl.agent.tools import PythonSandbox

__all__ = ["MonteCarloExtras", "Rows", "collect", "decode_response", "monte_carlo_extras",
           "step_extras", "task_reward_fn", "task_turns", "turn_rewards"]


def task_turns(task: Task) -> int | None:
    """The policy turns per episode a multi-turn task asks for (None: single-turn)."""
    spec = task.env if task.env is not None else task.agent
    return None if spec is None else spec.max_turns


def decode_response(tokenizer: Any, response_ids: Sequence[int], finished: bool) -> str:
    """Text of a response without its end-of-turn token (and without special tokens)."""
    ids = list(response_ids[:-1] if finished else response_ids)
    return tokenizer.decode(ids, skip_special_tokens=True)


def task_reward_fn(task: Task, problem: Problem,
                   tokenizer: Any) -> Callable[[Sequence[int], bool], float]:
    """``reward(response_ids, finished)``: the task's score of a single-turn response's decoded
    text (end-of-turn token stripped), as :func:`collect` scores a rollout; what a Monte-Carlo
    continuation is scored by (the trainer's values phase, the credit check)."""

    def reward(response_ids: Sequence[int], finished: bool) -> float:
        return task.score(problem, decode_response(tokenizer, response_ids, finished))

    return reward


@dataclass
class MonteCarloExtras:
    """What the values phase hands a Monte-Carlo estimator (:func:`monte_carlo_extras`).

    Attributes:
        extras: ``{"token_texts": B lists of each response token's text, "mc_values": B lists,
            one V per boundary the estimator named}`` (``CreditBatch.extras``).
        tokens: continuation tokens sampled.
        boundaries_per_response: mean boundaries named per response.
    """

    extras: dict[str, Any]
    tokens: int
    boundaries_per_response: float


def monte_carlo_extras(estimator: Any, credit_config: Any, batch: Any, *, sampler: Any,
                       tokenizer: Any, task: Task, problems: Sequence[Problem],
                       prompt_ids: Sequence[Sequence[int]],
                       response_ids: Sequence[Sequence[int]], finished: Sequence[bool],
                       rollout: Any, stop_ids: Sequence[int], pad_id: int,
                       seed: int) -> MonteCarloExtras:
    """The Monte-Carlo values of one batch of single-turn rows at the boundaries
    ``estimator.mc_boundaries`` names (SPO-chain, VinePPO): ``V`` of the prompt and the first
    ``b`` response tokens is the mean reward of ``credit_config.mc_samples`` continuations by
    ``sampler`` at the rollout's temperature, top-p and remaining budget
    (:func:`gear_rl.mc_values.estimate_values`: every row's continuations decode together,
    ``rollout.mc_batch_size`` rows at a time, identical prefixes sampled once under
    ``credit_config.dedupe_prefixes``), scored by the task (:func:`task_reward_fn`). The
    trainer's values phase and the credit check's Monte-Carlo rows both call it.

    Args:
        estimator: a registered estimator with ``mc_boundaries``.
        credit_config: its config (``mc_samples``, ``dedupe_prefixes``).
        batch: the rows' :class:`~gear_rl.credit.CreditBatch` (``B`` rows); its ``extras``
            gain ``token_texts`` before the boundaries are asked for.
        sampler, tokenizer, task, problems: the policy's sampler, its tokenizer, the task and
            each row's problem.
        prompt_ids, response_ids, finished: the ``B`` rows.
        rollout: the :class:`~gear_rl.train.config.RolloutConfig` the rows were sampled with.
        stop_ids, pad_id: the sampler's.
        seed: the continuations' random stream.
    """
    from gear_rl.mc_values import Trajectory, estimate_values

    if estimator.mc_boundaries is None:
        raise ValueError(f"estimator {estimator.name!r} has no Monte-Carlo boundaries")
    texts = [[tokenizer.decode([t], skip_special_tokens=True) for t in row]
             for row in response_ids]
    batch.extras = {**(batch.extras or {}), "token_texts": texts}
    boundaries = estimator.mc_boundaries(batch, credit_config)
    rows = [row for row, bounds in enumerate(boundaries) if bounds]
    estimates = estimate_values(
        sampler,
        [Trajectory(prompt_ids[row], response_ids[row], finished[row], boundaries[row],
                    task_reward_fn(task, problems[row], tokenizer)) for row in rows],
        samples=credit_config.mc_samples, max_new_tokens=rollout.max_new_tokens,
        stop_ids=stop_ids, pad_id=pad_id, temperature=rollout.temperature, top_p=rollout.top_p,
        seeds=(seed,), batch_size=rollout.mc_batch_size, dedupe=credit_config.dedupe_prefixes)
    values: list[list[float]] = [[] for _ in boundaries]
    for row, estimate in zip(rows, estimates, strict=True):
        values[row] = estimate.values().tolist()
    return MonteCarloExtras({"token_texts": texts, "mc_values": values},
                            sum(estimate.tokens for estimate in estimates),
                            sum(map(len, boundaries)) / max(len(boundaries), 1))


def step_extras(step_spans: list[list[tuple[int, int]]] | None,
                step_rewards: list[list[float]] | None = None,
                state_keys: list[list[Hashable]] | None = None) -> dict[str, Any] | None:
    """The step-level estimators' inputs (``CreditBatch.extras``) of multi-turn rows: per row
    and step, the turn's token span, and where there are any, its reward and state key. None
    without step spans (single-turn rows)."""
    if step_spans is None:
        return None
    extras: dict[str, Any] = {"step_spans": step_spans}
    if step_rewards is not None:
        extras["step_rewards"] = step_rewards
    if state_keys is not None:
        extras["state_keys"] = state_keys
    return extras


@dataclass
class Rows:
    """Sampled and scored rows (``B`` of everything).

    Attributes:
        response_ids: token ids after the prompt (observations included).
        finished: the response ended properly (end-of-turn token, final answer, solved or the
            environment's own end) rather than being cut by a length limit.
        texts: the text the scorer read (environment tasks: the policy's turns joined).
        extracted: the answer the scorer extracted (None where none / environment tasks).
        rewards: the outcome rewards.
        policy_masks: per row, 1 policy token / 0 observation token; None for single-turn
            tasks (every token is the policy's).
        turn_ids: per row and token, the turn index (None for single-turn tasks).
        step_spans, state_keys, step_rewards: per row and step (environment tasks; agent tasks
            have step spans, each turn's covering the observation that answers it, and step
            rewards when the task pays turn rewards (:func:`turn_rewards`), no state keys;
            None for single-turn tasks).
        metrics: batch statistics (tool-call rate, observation fraction, success rate...).
    """

    response_ids: list[list[int]]
    finished: list[bool]
    texts: list[str]
    extracted: list[str | None]
    rewards: list[float]
    policy_masks: list[list[int]] | None = None
    turn_ids: list[list[int]] | None = None
    step_spans: list[list[tuple[int, int]]] | None = None
    state_keys: list[list[Hashable]] | None = None
    step_rewards: list[list[float]] | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def _generate_fn(model: torch.nn.Module, sampling: SamplingParams, generator: torch.Generator,
                 row_stop: RowStop | None = None, reuse_cache: bool = True):
    """The :data:`~gear_rl.agent.loop.GenerateFn` of an episode batch: each turn is one
    :func:`~gear_rl.sampling.sample_responses` call with ``sampling`` up to the turn's longest
    budget, one draw per live row and step from ``generator`` (turns are not paired)."""
    # one TurnCache per episode batch: each turn's rows are kept for the next turn's contexts;
    # decoded in chunks of batch_size, at most two chunks' rows are kept (the memory of two
    # decoding batches' caches), and rows beyond that prefill their next turn whole
    batch_size = sampling.batch_size
    turn_cache = (TurnCache(max_rows=None if batch_size is None else 2 * batch_size)
                  if reuse_cache else None)

    def generate(prompts: list[list[int]], stop_strings: list[str],
                 budgets: list[int]) -> list[list[int]]:
        # Stop strings are not matched as text: the agent loop cuts each turn after its call,
        # and row_stop (agent tasks) ends a row as soon as its tokens hold a complete call.
        turn = replace(sampling, max_new_tokens=max(budgets), paired_draws=False)
        result = sample_responses(model, prompts, turn, generator=generator, budgets=budgets,
                                  row_stop=row_stop, turn_cache=turn_cache)
        if turn_cache is not None:
            turn_cache.advance()
        return result.response_ids

    return generate


_TRIGGERS: weakref.WeakKeyDictionary[Any, dict[str, torch.Tensor]] = weakref.WeakKeyDictionary()


def call_stop(tokenizer: Any, tool_format: Any) -> RowStop:
    """The :class:`~gear_rl.sampling.RowStop` of an agent turn: a row stops once its new
    tokens hold a complete call of ``tool_format`` (:func:`gear_rl.agent.holds_call`), checked
    after tokens whose text holds the closing tag's last character. The trigger table (one
    decode per vocabulary entry, about 0.4 s for SmolLM2's 49k) is kept per tokenizer."""
    from gear_rl.agent import get_format, holds_call

    fmt = get_format(tool_format)
    char = fmt.close_tag[-1]
    tables = _TRIGGERS.setdefault(tokenizer, {})
    if char not in tables:
        tables[char] = torch.tensor([char in tokenizer.decode([i], skip_special_tokens=False)
                                     for i in range(len(tokenizer))], dtype=torch.bool)
    return RowStop(trigger=tables[char], done=lambda ids: holds_call(ids, tokenizer, fmt))


def collect(
    task: Task,
    problems: Sequence[Problem],
    prompts: Sequence[Sequence[int]],
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    sampling: SamplingParams,
    generator: torch.Generator,
    limits: AgentLimits | None = None,
    sandbox: PythonSandbox | None = None,
    prefixes: Sequence[EpisodePrefix] | None = None,
    reuse_cache: bool = True,
) -> Rows:
    """Sample one response (or episode) per prompt and score it.

    Args:
        task: what to roll out and how to score it.
        problems, prompts: ``B`` problems and their chat-rendered prompt ids.
        model: the sampler. ``tokenizer``: its tokenizer.
        sampling: how to sample (:class:`~gear_rl.sampling.SamplingParams`); its
            ``max_new_tokens`` is the response cap of a single-turn task (a multi-turn task's
            turns are capped by ``limits``) and its ``paired_draws`` applies to single-turn
            tasks only (multi-turn ones sample turn by turn from one stream).
        generator: the random stream.
        limits: multi-turn limits (default: :class:`~gear_rl.agent.loop.AgentLimits`'s, with
            the task's own turn count).
        sandbox: runs ``python`` tool calls (required for agent tasks with ``tool="python"``).
        prefixes: multi-turn tasks only: ``B`` :class:`~gear_rl.agent.loop.EpisodePrefix` es
            to continue each episode from (``run_agent(prefixes=)``; environment tasks:
            ``run_env_episodes(prefixes=)``, which replays the prefix's turns in the
            environment); the rows returned hold the whole episodes, prefix first, scored as
            usual. (Single-turn continuations are
            :func:`gear_rl.sampling.sample_continuations`.)
        reuse_cache: multi-turn tasks: each turn prefills only what it adds to a row's
            previous turn, reading the rest from that turn's KV cache
            (:class:`gear_rl.sampling.TurnCache`); False prefills every turn's whole
            context.
    """
    if len(problems) != len(prompts):
        raise ValueError(f"{len(problems)} problems but {len(prompts)} prompts")
    if prefixes is not None and task.agent is None and task.env is None:
        raise ValueError(f"prefixes: only multi-turn episodes can be continued from a prefix "
                         f"here; task {task.name!r} is single-turn (its continuations: "
                         "gear_rl.sampling.sample_continuations)")
    if limits is None:
        turns = task_turns(task)
        limits = AgentLimits() if turns is None else AgentLimits(max_turns=turns)
    row_stop = None
    if task.agent is not None:  # the loop cuts every turn after its first complete call
        row_stop = call_stop(tokenizer, task.agent.tool_format)
    generate = _generate_fn(model, sampling, generator, row_stop=row_stop,
                            reuse_cache=reuse_cache)
    stop_ids = sampling.stop_ids
    if task.env is not None:
        return _collect_env(task, problems, prompts, generate, tokenizer, stop_ids, limits,
                            prefixes)
    if task.agent is not None:
        return _collect_agent(task, problems, prompts, generate, tokenizer, stop_ids, limits,
                              sandbox, prefixes)
    result = sample_responses(model, prompts, sampling, generator=generator)
    texts = [decode_response(tokenizer, r, f)
             for r, f in zip(result.response_ids, result.finished, strict=True)]
    return Rows(response_ids=result.response_ids, finished=result.finished, texts=texts,
                extracted=[task.extract(t) for t in texts],
                rewards=[task.score(p, t) for p, t in zip(problems, texts, strict=True)])


def _collect_agent(task, problems, prompts, generate, tokenizer, stop_ids, limits,
                   sandbox, prefixes=None) -> Rows:
    from gear_rl.agent import (
        AgentLoopConfig,
        PythonExecutor,
        run_agent,
        trajectories_to_tensors,
        trajectory_metrics,
    )
    from gear_rl.credit.steps import spans_from_step_ids

    spec = task.agent
    executor = None
    if spec.tool == "python":
        if sandbox is None:
            raise ValueError(f"task {task.name!r} runs Python tool calls: pass a sandbox")
        executor = PythonExecutor(sandbox)
    config = AgentLoopConfig(
        tool_format=spec.tool_format, max_turns=limits.max_turns,
        max_new_tokens_per_turn=limits.max_new_tokens_per_turn,
        max_response_tokens=limits.max_response_tokens,
        max_observation_tokens=limits.max_observation_tokens,
        stop_after_tool_call=spec.tool == "none")
    trajectories = run_agent(prompts, generate, tokenizer, config, executor, stop_ids=stop_ids,
                             prefixes=prefixes)
    texts = [t.final_text if spec.score_text == "final" else t.policy_text
             for t in trajectories]
    finished = [t.finish_reason in ("answer", "tool_call") for t in trajectories]
    step_rewards = None
    metrics = trajectory_metrics(trajectories)
    if spec.turn_reward_tool or spec.turn_reward_answer:
        step_rewards = [turn_rewards(task, p, t)
                        for p, t in zip(problems, trajectories, strict=True)]
        paid = [r for row in step_rewards for r in row]
        metrics["agent/turn_reward_mean"] = sum(paid) / max(len(paid), 1)
    return Rows(
        response_ids=[t.response_ids for t in trajectories], finished=finished, texts=texts,
        extracted=[task.extract(t) for t in texts],
        rewards=[task.score(p, t) for p, t in zip(problems, texts, strict=True)],
        policy_masks=[t.loss_mask for t in trajectories],
        turn_ids=[t.turn_ids for t in trajectories],
        # a turn's span also covers the observation answering it; mask 0 keeps that at 0
        step_spans=spans_from_step_ids(
            trajectories_to_tensors(trajectories, pad_id=0)["turn_ids"]),
        step_rewards=step_rewards, metrics=metrics)


def turn_rewards(task: Task, problem: Problem, trajectory: Any) -> list[float]:
    """MT-GRPO's verifiable turn rewards (arXiv 2505.11821) of one agent trajectory, one per
    step of its ``step_spans`` (each turn with tokens, in order): ``task.agent.turn_reward_tool``
    times the share of the turn's calls that ran without error, plus
    ``task.agent.turn_reward_answer`` when ``task.score`` accepts the turn's tool output (its
    calls' outputs joined) as the answer (score >= 1). A turn without a well-formed call (an
    answer, a malformed call) earns 0.

    Args:
        task: an agent task (``task.agent`` set).
        problem: the problem the trajectory answers.
        trajectory: a :class:`gear_rl.agent.Trajectory` (its ``turns`` and ``turn_ids``).
    """
    spec = task.agent
    if spec is None:
        raise ValueError(f"task {task.name!r} is not an agent task: it has no turns to reward")
    rewards = []
    for k in sorted(set(int(k) for k in trajectory.turn_ids)):  # turn k's record is turns[k]
        outputs = trajectory.turns[k].outputs
        if not outputs:
            rewards.append(0.0)
            continue
        ran = sum(o.error is None for o in outputs) / len(outputs)
        content = "\n".join(o.text for o in outputs)
        answer = task.score(problem, content) >= 1.0
        rewards.append(float(spec.turn_reward_tool) * ran
                       + (float(spec.turn_reward_answer) if answer else 0.0))
    return rewards


def _collect_env(task, problems, prompts, generate, tokenizer, stop_ids, limits,
                 prefixes=None) -> Rows:
    from gear_rl.agent.env_loop import env_metrics, run_env_episodes

    spec = task.env
    envs = [spec.make() for _ in problems]
    episodes = run_env_episodes(
        envs, [int(p.metadata["env_seed"]) for p in problems], prompts, generate, tokenizer,
        stop_ids=stop_ids, max_turns=limits.max_turns,
        max_new_tokens_per_turn=limits.max_new_tokens_per_turn,
        max_response_tokens=limits.max_response_tokens, prefixes=prefixes)
    return Rows(
        response_ids=[e.response_ids for e in episodes],
        finished=[e.finish_reason in ("solved", "env_done") for e in episodes],
        texts=["\n".join(e.texts) for e in episodes],
        extracted=[" ".join(a or "?" for a in e.actions) for e in episodes],
        rewards=[1.0 if e.success else 0.0 for e in episodes],
        policy_masks=[e.loss_mask for e in episodes], turn_ids=[e.turn_ids for e in episodes],
        step_spans=[e.step_spans for e in episodes], state_keys=[e.state_keys for e in episodes],
        step_rewards=[e.shaping_rewards for e in episodes], metrics=env_metrics(episodes))
