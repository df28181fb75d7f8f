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

An episode can be continued from any of its token prefixes (``prefixes=``, what the credit
check's Monte-Carlo values need): the environment's state there is rebuilt by resetting it with
the level's seed and replaying the prefix's complete turns, and every observation it gives back
must equal the prefix's own.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gear_rl.agent.loop import EpisodePrefix, GenerateFn, append_tokens

if TYPE_CHECKING:
    from gear_rl.envs.base import StepResult, TextEnv

__all__ = ["EnvEpisode", "TurnRequest", "chat_observation_ids", "env_episode_turns", "env_metrics",
           "run_env_episodes"]


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


def _play_turn(episode: EnvEpisode, env: TextEnv, ids: list[int], turn: int, tokenizer: Any,
               stops: set[int]) -> tuple[StepResult, bool]:
    """Apply one policy turn (its tokens, already cut at the end-of-turn token) to ``env`` and
    record it in ``episode``; returns the step's result and whether the turn closed itself."""
    closed = bool(ids) and ids[-1] in stops
    text = tokenizer.decode(ids, skip_special_tokens=True)
    state = env.state_key
    result = env.step(text)
    episode.step_spans.append(append_tokens(episode, ids, turn, policy=True))
    episode.state_keys.append(state)
    episode.step_rewards.append(float(result.reward))
    episode.shaping_rewards.append(float(result.info.get("shaping_reward", result.reward)))
    episode.actions.append(result.info.get("action"))
    episode.texts.append(text)
    return result, closed


def _replay(episode: EnvEpisode, env: TextEnv, prefix: EpisodePrefix, tokenizer: Any,
            stops: set[int]) -> tuple[list[int], int]:
    """Bring a freshly reset ``env`` and an empty ``episode`` to the end of ``prefix`` by
    replaying its complete turns: the environment's state at a mid-episode token is the state
    its seed and the turns before it lead to. Each replayed observation must equal the
    prefix's, token for token (the check that the environment is deterministic and the prefix
    is one of its episodes). Returns the policy tokens of a turn the prefix cuts in the middle
    and the index of the turn to play next."""
    pieces = prefix.pieces()
    partial: list[int] = []
    turn = 0
    expected: list[int] | None = None
    for index, (mask, turn_id, ids) in enumerate(pieces):
        if mask == 1 and index == len(pieces) - 1:
            partial, turn = ids, turn_id
        elif mask == 1:
            result, closed = _play_turn(episode, env, ids, turn_id, tokenizer, stops)
            if result.done:
                raise ValueError(
                    f"replaying a prefix: the environment ended the episode at turn {turn_id}, "
                    "but the prefix goes on after it (the environment is not deterministic "
                    "given its seed and the turns, or the prefix is not one of its episodes)")
            expected = chat_observation_ids(tokenizer, result.observation, turn_closed=closed)
        else:
            if ids != expected:
                raise ValueError(
                    f"replaying a prefix: the environment's observation after turn {turn_id} "
                    "differs from the prefix's (the environment is not deterministic given "
                    "its seed and the turns, or the prefix is not one of its episodes)")
            append_tokens(episode, ids, turn_id, policy=False)
            turn = turn_id + 1
    return partial, turn


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
    prefixes: Sequence[EpisodePrefix | None] | None = None,
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
        prefixes: ``B`` entries (None: start afresh): continue row ``i``'s episode from
            ``prefixes[i]`` (:class:`~gear_rl.agent.loop.EpisodePrefix`, an earlier episode's
            first tokens) under the same limits: its complete turns are replayed in the
            environment (which must give the same observations back), and a turn it cuts in
            the middle is finished with the budget it had left. Rows may then be at different
            turns; each round generates for every live row.

    Returns:
        ``B`` episodes, in order (a resumed one holds its prefix's tokens first).
    """
    turns = env_episode_turns(envs, seeds, prompts, tokenizer, stop_ids=stop_ids,
                              max_turns=max_turns,
                              max_new_tokens_per_turn=max_new_tokens_per_turn,
                              max_response_tokens=max_response_tokens, prefixes=prefixes)
    try:
        contexts, budgets = next(turns)
        while True:
            contexts, budgets = turns.send(generate(contexts, [], budgets))
    except StopIteration as done:
        return done.value


TurnRequest = tuple[list[list[int]], list[int]]
"""What :func:`env_episode_turns` asks for each round: the contexts (prompt and response so
far) of the rows that generate, and each one's token budget for this turn."""


def env_episode_turns(
    envs: Sequence[TextEnv],
    seeds: Sequence[int],
    prompts: Sequence[Sequence[int]],
    tokenizer: Any,
    *,
    stop_ids: Sequence[int],
    max_turns: int,
    max_new_tokens_per_turn: int,
    max_response_tokens: int,
    prefixes: Sequence[EpisodePrefix | None] | None = None,
) -> Generator[TurnRequest, Sequence[Sequence[int]], list[EnvEpisode]]:
    """:func:`run_env_episodes` as a generator, for callers whose sampler is not a plain
    function (verl's agent loop awaits its rollout server): each round it yields the contexts
    and budgets of the rows that generate and takes the new token ids of each (as
    ``generate`` would return them); it returns the episodes. The arguments are
    :func:`run_env_episodes`' less ``generate``: one episode logic for both."""
    if not len(envs) == len(seeds) == len(prompts):
        raise ValueError(f"envs, seeds and prompts differ in length: {len(envs)}, {len(seeds)}, "
                         f"{len(prompts)}")
    if prefixes is not None and len(prefixes) != len(prompts):
        raise ValueError(f"{len(prefixes)} prefixes for {len(prompts)} prompts")
    for name, value in (("max_turns", max_turns),
                        ("max_new_tokens_per_turn", max_new_tokens_per_turn),
                        ("max_response_tokens", max_response_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    stops = set(map(int, stop_ids))
    episodes = [EnvEpisode(prompt_ids=list(map(int, p))) for p in prompts]
    for env, seed in zip(envs, seeds, strict=True):
        env.reset(int(seed))
    partial: list[list[int]] = [[] for _ in episodes]  # a resumed, unfinished turn's tokens
    turn_of = [0] * len(episodes)  # the turn each row plays next
    for i, prefix in enumerate(prefixes or []):
        if prefix is not None:
            partial[i], turn_of[i] = _replay(episodes[i], envs[i], prefix, tokenizer, stops)
    active = []
    for i, episode in enumerate(episodes):
        if turn_of[i] >= max_turns:  # resumed after the last allowed turn's observation
            episode.finish_reason = "max_turns"
        elif len(episode.response_ids) + len(partial[i]) >= max_response_tokens:
            episode.finish_reason = "token_budget"
        else:
            active.append(i)
    while active:
        budgets = [min(max_new_tokens_per_turn,
                       max_response_tokens - len(episodes[i].response_ids)) - len(partial[i])
                   for i in active]
        generating = [k for k, budget in enumerate(budgets) if budget > 0]
        generated: list[list[int]] = [[] for _ in active]
        if generating:
            new = yield ([episodes[active[k]].prompt_ids + episodes[active[k]].response_ids
                          + partial[active[k]] for k in generating],
                         [budgets[k] for k in generating])
            if len(new) != len(generating):
                raise ValueError(f"generate returned {len(new)} rows for {len(generating)} "
                                 "prompts")
            for k, ids in zip(generating, new, strict=True):
                generated[k] = list(map(int, ids))[:budgets[k]]
        still = []
        for i, new_ids in zip(active, generated, strict=True):
            episode, env, turn = episodes[i], envs[i], turn_of[i]
            ids = partial[i] + new_ids
            partial[i] = []
            for position, token in enumerate(ids):
                if token in stops:
                    ids = ids[:position + 1]
                    break
            result, closed = _play_turn(episode, env, ids, turn, tokenizer, stops)
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
            turn_of[i] += 1
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
