"""Batched multi-turn episodes in text environments (``gear_rl.envs.TextEnv``).

For the step-level credit methods (GiGPO arXiv 2505.10978, GAGPO arXiv 2605.13217, Gated-BEPO,
turn-level MT-GRPO arXiv 2505.11821) and GEAR (arXiv 2605.11853) on multi-turn games. Each policy
turn is one environment step: the policy writes its turn (ended by its end-of-turn token), the
environment parses an action from the whole turn text and answers with the next board, which is
appended in chat form (the end of the assistant turn, a user turn with the observation, the
next assistant header) as observation tokens (loss mask 0, kept in the context). All live
episodes generate together each turn; finished ones drop out.

Per episode the loop records, per step: the token span of the policy's turn, the state key
*before* the action (the state the action was taken in: what GiGPO groups on), the
environment's reward, and whether the level was solved.

The solve is paid once. The environment's reward includes its reward for solving the level;
the trainer pays a solve through the outcome reward (1.0 for a solved level), which the
step-level estimators add to the last step's return (``StepConfig.outcome_in_returns``). So the
step rewards for credit are :attr:`EnvEpisode.shaping_rewards`, the environment's rewards
without the solve reward, not :attr:`EnvEpisode.step_rewards`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gear_rl.agent.loop import GenerateFn, append_tokens

if TYPE_CHECKING:
    from gear_rl.envs.base import TextEnv

__all__ = ["EnvEpisode", "chat_observation_ids", "env_metrics", "run_env_episodes"]


@dataclass
class EnvEpisode:
    """One multi-turn episode. Per-token lists are aligned with ``response_ids``.

    Attributes:
        prompt_ids: the prompt (the first board, chat template applied).
        response_ids: policy turns and observations after the prompt.
        loss_mask: 1 policy token, 0 observation token.
        turn_ids: the step a token belongs to (an observation: the step it answers).
        observation_spans: ``[start, end)`` of each observation.
        step_spans: ``[start, end)`` of each step's policy tokens.
        state_keys: per step, the state the action was taken in.
        step_rewards: per step, the environment's reward (its solve reward included).
        shaping_rewards: per step, the environment's reward without its solve reward
            (``StepResult.info["shaping_reward"]``): the step rewards for step-level credit,
            whose outcome reward carries the solve.
        actions: per step, the parsed action (None: none parsed).
        texts: per step, the policy's turn text.
        success: the level was solved.
        finish_reason: ``"solved"``, ``"env_done"`` (the environment's step limit), ``"max_turns"``
            or ``"token_budget"``.
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    observation_spans: list[tuple[int, int]] = field(default_factory=list)
    step_spans: list[tuple[int, int]] = field(default_factory=list)
    state_keys: list[Hashable] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    shaping_rewards: list[float] = field(default_factory=list)
    actions: list[str | None] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    success: bool = False
    finish_reason: Literal["solved", "env_done", "max_turns", "token_budget"] | None = None

    @property
    def num_observation_tokens(self) -> int:
        return len(self.loss_mask) - sum(self.loss_mask)

    def transcript(self, tokenizer: Any) -> str:
        """Everything after the prompt, as the model saw it."""
        return tokenizer.decode(self.response_ids, skip_special_tokens=False)


def chat_observation_ids(tokenizer: Any, content: str, *, turn_closed: bool) -> list[int]:
    """Token ids that close the assistant turn (unless ``turn_closed``: the policy already wrote
    its end-of-turn token), add ``content`` as a user turn, and open the next assistant turn,
    exactly as the tokenizer's chat template renders a conversation."""
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(f"\n{content}\n", add_special_tokens=False)
    marks = ("\u2063A\u2063", "\u2063U\u2063")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": marks[0]},
         {"role": "user", "content": marks[1]}], add_generation_prompt=True, tokenize=False)
    between = rendered[rendered.index(marks[0]) + len(marks[0]):rendered.index(marks[1])]
    after = rendered[rendered.index(marks[1]) + len(marks[1]):]
    if turn_closed:
        eos = getattr(tokenizer, "eos_token", None)
        if eos and between.startswith(eos):
            between = between[len(eos):]
    return tokenizer.encode(between + content + after, add_special_tokens=False)


def run_env_episodes(
    envs: Sequence[TextEnv],
    seeds: Sequence[int],
    prompts: Sequence[Sequence[int]],
    generate: GenerateFn,
    tokenizer: Any,
    *,
    stop_ids: Sequence[int],
    max_turns: int,
    max_new_tokens_per_turn: int,
    max_response_tokens: int,
) -> list[EnvEpisode]:
    """Play one episode per environment.

    Args:
        envs: ``B`` environments (fresh or reused; each is ``reset`` here).
        seeds: ``B`` level seeds.
        prompts: ``B`` prompt id lists (normally the chat-rendered first observation of
            ``envs[i].reset(seeds[i])``; the caller builds them so the teacher prompt matches).
        generate: the sampler (:data:`gear_rl.agent.loop.GenerateFn`).
        tokenizer: encodes observations, decodes turns.
        stop_ids: end-of-turn token ids.
        max_turns: policy turns per episode.
        max_new_tokens_per_turn: generation cap of one turn.
        max_response_tokens: budget of the whole response (policy and observation tokens).

    Returns:
        ``B`` episodes, in order.
    """
    if not len(envs) == len(seeds) == len(prompts):
        raise ValueError(f"envs, seeds and prompts differ in length: {len(envs)}, {len(seeds)}, "
                         f"{len(prompts)}")
    for name, value in (("max_turns", max_turns),
                        ("max_new_tokens_per_turn", max_new_tokens_per_turn),
                        ("max_response_tokens", max_response_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    stops = set(map(int, stop_ids))
    episodes = [EnvEpisode(prompt_ids=list(map(int, p))) for p in prompts]
    for env, seed in zip(envs, seeds, strict=True):
        env.reset(int(seed))
    active = list(range(len(episodes)))
    for turn in range(max_turns):
        if not active:
            break
        budgets = [min(max_new_tokens_per_turn,
                       max_response_tokens - len(episodes[i].response_ids)) for i in active]
        generated = generate([episodes[i].prompt_ids + episodes[i].response_ids for i in active],
                             [], budgets)
        if len(generated) != len(active):
            raise ValueError(f"generate returned {len(generated)} rows for {len(active)} prompts")
        still = []
        for i, new_ids, budget in zip(active, generated, budgets, strict=True):
            episode, env = episodes[i], envs[i]
            ids = list(map(int, new_ids))[:budget]
            for position, token in enumerate(ids):
                if token in stops:
                    ids = ids[:position + 1]
                    break
            closed = bool(ids) and ids[-1] in stops
            text = tokenizer.decode(ids, skip_special_tokens=True)
            state = env.state_key
            result = env.step(text)
            episode.step_spans.append(append_tokens(episode, ids, turn, policy=True))
            episode.state_keys.append(state)
            episode.step_rewards.append(float(result.reward))
            episode.shaping_rewards.append(float(result.info.get("shaping_reward",
                                                                 result.reward)))
            episode.actions.append(result.info.get("action"))
            episode.texts.append(text)
            if result.done:
                episode.success = bool(result.info.get("success"))
                episode.finish_reason = "solved" if episode.success else "env_done"
                continue
            if turn == max_turns - 1:
                episode.finish_reason = "max_turns"
                continue
            obs = chat_observation_ids(tokenizer, result.observation, turn_closed=closed)
            if len(episode.response_ids) + len(obs) >= max_response_tokens:
                episode.finish_reason = "token_budget"
                continue
            append_tokens(episode, obs, turn, policy=False)
            still.append(i)
        active = still
    return episodes


def env_metrics(episodes: Sequence[EnvEpisode]) -> dict[str, float]:
    """Batch statistics: success rate, turns, valid-action rate, observation token fraction."""
    n = max(len(episodes), 1)
    steps = sum(len(e.step_spans) for e in episodes)
    tokens = sum(len(e.response_ids) for e in episodes)
    return {
        "env/success_rate": sum(e.success for e in episodes) / n,
        "env/turns_per_episode": steps / n,
        "env/parsed_action_rate": sum(a is not None for e in episodes for a in e.actions)
        / max(steps, 1),
        "env/step_reward_mean": sum(sum(e.step_rewards) for e in episodes) / n,
        "agent/observation_token_fraction": sum(e.num_observation_tokens for e in episodes)
        / max(tokens, 1),
        "agent/response_tokens_mean": tokens / n,
    }
