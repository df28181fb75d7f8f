"""gear-rl's text environments as a verl agent loop (``gear_env``), and the step inputs of
multi-turn trajectories for the step-level estimators.

For the step-level credit methods on multi-turn environments (GiGPO arXiv 2505.10978, GAGPO
arXiv 2605.13217, Gated-BEPO, turn-level MT-GRPO arXiv 2505.11821, GEAR's per-step reading
``gear_steps``, arXiv 2605.11853) inside verl 0.9.1.

**The loop.** verl runs one agent loop per trajectory (``AgentLoopBase.run``, in its agent-loop
worker's event loop; ``verl/experimental/agent_loop/agent_loop.py``), chosen per data row by
its ``agent_name`` column or ``actor_rollout_ref.rollout.agent.default_agent_loop``. ``gear_env``
plays one episode of the row's environment with gear-rl's own episode logic
(:func:`gear_rl.agent.env_loop.env_episode_turns`, the generator form of what ``gear-rl train``
runs): the same environment classes (``sokoban``, ``keydoor``, ``textarena:GAME``), the same
first board as the prompt, the same turn format (each policy turn ends at an end-of-turn token;
the next board comes back as a chat user turn, observation tokens with ``response_mask`` 0), the
same rewards (1.0 when the level is solved, as ``reward_score``; the environment's shaping
rewards per step). Each turn is one request to the job's rollout servers
(``server_manager.generate``), at the rollout's sampling parameters, capped at the turn's and
the response's remaining budget. The row's ``extra_info`` says which level
(:func:`env_row`): ``env``, ``env_options``, ``env_seed``, ``max_turns`` and
``max_new_tokens_per_turn``; ``gear_rl.integrations.verl.data`` writes such rows
(``SETTING=sokoban`` etc.). The response holds at most ``data.max_response_length`` tokens.

The loop returns, in ``extra_fields["gear_steps"]`` (verl stores ``extra_fields`` with the
trajectory), the per-step token spans, state keys (``repr`` of the environment's key, so they
survive storage and compare as the keys do) and shaping rewards, the solve and the finish
reason.

**Step inputs** (:func:`step_extras`): the ``gear`` trainer mode turns a batch's
``extra_fields`` into ``CreditBatch.extras`` for the step-level estimators: a row the
``gear_env`` loop played brings its own steps; any other row (verl's ``tool_agent`` loop, or
another multi-turn loop) takes each run of policy tokens as one step, with no state keys and no
per-step rewards (estimators that group by state then refuse the batch); verl's padding rows
have no steps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.utils.profiler import simple_timer
from verl.utils.tokenizer.chat_template import apply_chat_template
from verl.utils.tokenizer.tokenizer import normalize_token_ids

from gear_rl.agent.env_loop import env_episode_turns, env_metrics
from gear_rl.agent.loop import AgentLimits
from gear_rl.credit.steps import spans_from_step_ids
from gear_rl.integrations.verl.data import AGENT_LOOP_NAME
from gear_rl.sampling.sampler import stop_token_ids
from gear_rl.tasks.agentic import env_factory

__all__ = ["AGENT_LOOP_NAME", "STEPS_FIELD", "EnvRow", "GEAREnvAgentLoop", "env_row",
           "render_chat", "step_extras", "step_ids_from_mask"]

STEPS_FIELD = "gear_steps"
"""The key of a trajectory's steps in ``AgentLoopOutput.extra_fields``."""


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                chat_template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Chat messages -> prompt ids with the assistant header open, the way verl renders a
    data row's prompt (its ``apply_chat_template`` with ``data.apply_chat_template_kwargs``):
    the ``gear_env`` loop's prompt and the teacher pass's hinted prompt alike."""
    return normalize_token_ids(apply_chat_template(
        tokenizer, [dict(m) for m in messages], tokenize=True, add_generation_prompt=True,
        **dict(chat_template_kwargs or {})))


@dataclass(frozen=True)
class EnvRow:
    """Which level a data row asks the ``gear_env`` loop to play (from its ``extra_info``).

    Attributes:
        env: ``sokoban``, ``keydoor`` or ``textarena:GAME`` (``gear_rl.tasks.agentic``).
        options: the environment's config fields (``extra_info.env_options``: a mapping, or
            the data writer's JSON string of one).
        seed: the level's seed.
        max_turns: policy turns per episode (None: the environment's step limit).
        max_new_tokens_per_turn: generation cap of one turn.
    """

    env: str
    options: dict[str, Any]
    seed: int
    max_turns: int | None
    max_new_tokens_per_turn: int


def _plain(value: Any) -> Any:
    """numpy scalars and arrays, as verl's dataset hands them on, -> Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def env_row(extra_info: Any) -> EnvRow:
    """Parse a row's ``extra_info`` for the ``gear_env`` loop; a missing or bad key raises a
    ``ValueError`` that names it (``extra_info.env`` etc.)."""
    info = _plain(extra_info)
    if not isinstance(info, Mapping) or "env" not in info:
        raise ValueError(
            f"the {AGENT_LOOP_NAME} agent loop plays the environment named in a row's "
            "extra_info.env, and this row has none (write environment data with "
            "python -m gear_rl.integrations.verl.data or SETTING=sokoban scripts/verl_cpu.sh; a "
            "single-turn data set runs with default_agent_loop=single_turn_agent)")
    env = info["env"]
    if not isinstance(env, str) or not env:
        raise ValueError(f"extra_info.env must be an environment name, got {env!r}")
    options = info.get("env_options") or {}
    if isinstance(options, str):  # the data writer's form: a JSON object (parquet-safe)
        try:
            options = json.loads(options)
        except json.JSONDecodeError as error:
            raise ValueError(f"extra_info.env_options is not a JSON object: {error}") from None
    if not isinstance(options, Mapping):
        raise ValueError(f"extra_info.env_options must be a mapping, got {options!r}")
    seed = info.get("env_seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"extra_info.env_seed must be an int >= 0, got {seed!r}")
    turns = info.get("max_turns")
    per_turn = info.get("max_new_tokens_per_turn", AgentLimits.max_new_tokens_per_turn)
    for key, value, optional in (("max_turns", turns, True),
                                 ("max_new_tokens_per_turn", per_turn, False)):
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"extra_info.{key} must be an int >= 1, got {value!r}")
    return EnvRow(env=env, options=dict(options), seed=seed, max_turns=turns,
                  max_new_tokens_per_turn=per_turn)


def _user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    users = [m.get("content") for m in messages if m.get("role") == "user"]
    return users[-1] if users else None


class GEAREnvAgentLoop(AgentLoopBase):
    """verl agent loop ``gear_env``: one episode of a gear-rl text environment per trajectory
    (module docstring). Registered when verl's agent-loop module is imported in a process
    that has gear-rl's plugin (``gear_rl.integrations.verl``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        self.stop_ids = stop_token_ids(self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        row = env_row(kwargs.get("extra_info"))
        make = env_factory(row.env, row.options)
        env = make()
        first = env.reset(row.seed)
        messages = [dict(m) for m in _plain(list(kwargs["raw_prompt"]))]
        if _user_text(messages) != first:
            raise ValueError(
                f"data row for {row.env} level seed {row.seed}: its prompt is not the level's "
                "first board as this gear-rl builds it (the data were written by another "
                "version of the environment, or edited): rewrite the data")
        max_turns = row.max_turns if row.max_turns is not None else int(env.config.max_steps)
        configured = self.rollout_config.multi_turn.get("max_assistant_turns", None)
        if configured:
            max_turns = min(max_turns, int(configured))
        prompt_ids = render_chat(self.tokenizer, messages, self.apply_chat_template_kwargs)
        params = {**sampling_params, "stop_token_ids": list(self.stop_ids)}
        params.pop("max_tokens", None)
        timing: dict[str, float] = {}
        request_id = uuid4().hex
        turn_logprobs: list[list[float]] = []  # one row, so one turn per round
        versions: list[dict[str, Any]] = []  # which weights each turn was sampled with
        turns = env_episode_turns(
            [env], [row.seed], [prompt_ids], self.tokenizer, stop_ids=self.stop_ids,
            max_turns=max_turns, max_new_tokens_per_turn=row.max_new_tokens_per_turn,
            max_response_tokens=self.response_length)
        with simple_timer("generate_sequences", timing):
            try:
                contexts, budgets = next(turns)
                while True:
                    # one request id for the episode: its turns go to one server, whose
                    # prefix cache holds the episode so far
                    outputs = await asyncio.gather(*(
                        self.server_manager.generate(
                            request_id=request_id, prompt_ids=context,
                            sampling_params={**params, "max_tokens": budget})
                        for context, budget in zip(contexts, budgets, strict=True)))
                    turn_logprobs.append(list(outputs[0].log_probs or []))
                    versions.extend(o.extra_fields for o in outputs)
                    contexts, budgets = turns.send([list(o.token_ids) for o in outputs])
            except StopIteration as done:
                episode = done.value[0]
        metrics = env_metrics([episode])
        logprobs = None
        if any(turn_logprobs):  # the rollout's log-probs of the policy tokens, 0 elsewhere
            logprobs = [0.0] * len(episode.response_ids)
            for (start, end), values in zip(episode.step_spans, turn_logprobs, strict=True):
                logprobs[start:end] = values[:end - start]
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=episode.response_ids,
            response_mask=episode.loss_mask, response_logprobs=logprobs,
            reward_score=1.0 if episode.success else 0.0,
            # verl counts chat turns: the prompt, then each policy turn and each board after it
            num_turns=1 + len(episode.step_spans) + len(episode.observation_spans),
            metrics=AgentLoopMetrics(generate_sequences=timing.get("generate_sequences", 0.0)),
            extra_fields={**_weight_versions(versions), STEPS_FIELD: {
                "step_spans": [list(span) for span in episode.step_spans],
                "state_keys": [repr(key) for key in episode.state_keys],
                "step_rewards": [float(r) for r in episode.shaping_rewards],
                "success": bool(episode.success),
                "finish_reason": episode.finish_reason,
                "parsed_action_rate": metrics["env/parsed_action_rate"],
            }})


register(AGENT_LOOP_NAME)(GEAREnvAgentLoop)


def _weight_versions(turns: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The first and last weight versions (training steps) a trajectory's turns were sampled
    with, as verl's own loops report them (``min_global_steps``, ``max_global_steps``: its
    staleness control and metrics read them)."""
    lows = [t["min_global_steps"] for t in turns if t.get("min_global_steps") is not None]
    highs = [t["max_global_steps"] for t in turns if t.get("max_global_steps") is not None]
    return {"min_global_steps": min(lows) if lows else None,
            "max_global_steps": max(highs) if highs else None}


def step_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` step index of each policy token when each run of policy tokens (mask 1) is
    one step (a multi-turn tool loop: turns are separated by tool output, mask 0); -1 on
    every other position (:func:`gear_rl.credit.steps.spans_from_step_ids` reads it)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("mask must be a [B, T] tensor")
    on = mask.bool()
    before = torch.nn.functional.pad(on[:, :-1], (1, 0), value=False)
    starts = on & ~before
    ids = torch.cumsum(starts.long(), dim=1) - 1
    return torch.where(on, ids, torch.full_like(ids, -1))


def step_extras(extra_fields: Sequence[Any], mask: torch.Tensor,
                padding: Sequence[bool]) -> dict[str, Any]:
    """``CreditBatch.extras`` of a verl batch for the step-level estimators (module docstring).

    Args:
        extra_fields: ``B`` rows' ``extra_fields`` (dicts, or None), in batch order.
        mask: ``[B, T]`` the batch's ``response_mask`` as verl pads it.
        padding: ``B`` flags: verl's padding rows (``is_padding``), which get no steps.

    Returns:
        ``{"step_spans": B lists}``, with ``"step_rewards"`` (0 for rows without their own) and,
        when every row that has steps brings them, ``"state_keys"``.
    """
    batch = mask.shape[0]
    if len(extra_fields) != batch or len(padding) != batch:
        raise ValueError(f"{len(extra_fields)} extra_fields rows and {len(padding)} padding "
                         f"flags for a batch of {batch}")
    from_mask = spans_from_step_ids(step_ids_from_mask(mask))
    spans: list[list[tuple[int, int]]] = []
    rewards: list[list[float]] = []
    states: list[list[str]] | None = []
    for b in range(batch):
        fields = extra_fields[b] if isinstance(extra_fields[b], Mapping) else {}
        steps = fields.get(STEPS_FIELD)
        if padding[b]:
            spans.append([])
            rewards.append([])
            if states is not None:
                states.append([])
        elif isinstance(steps, Mapping):
            spans.append([(int(s), int(e)) for s, e in _plain(steps["step_spans"])])
            rewards.append([float(r) for r in _plain(steps["step_rewards"])])
            if states is not None:
                states.append([str(k) for k in _plain(steps["state_keys"])])
        else:
            spans.append(from_mask[b])
            rewards.append([0.0] * len(from_mask[b]))
            states = None
    extras: dict[str, Any] = {"step_spans": spans, "step_rewards": rewards}
    if states is not None:
        extras["state_keys"] = states
    return extras
