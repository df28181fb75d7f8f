"""Step-level returns on real environment episodes: the solve reward is counted once.

A Sokoban level played through the trainer's episode loop (:func:`run_env_episodes`) by two
scripted policies in one prompt group: the BFS planner, which solves it, and a policy that makes
the planner's first move and then writes no move, which fails. The environment's own rewards pay
the solve (``solve_reward``); the outcome reward (1.0 for a solved level) pays it again when the
step estimators add it to the last step's return. The loop's ``shaping_rewards`` leave the solve
reward out, so with them GiGPO's returns and advantages are the hand-computed ones below, the
solve paid once, by the outcome."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from gear_rl.agent.env_loop import EnvEpisode, run_env_episodes
from gear_rl.credit import CreditBatch, get_estimator
from gear_rl.credit.steps import GiGPOConfig, per_step_advantages
from gear_rl.envs import SokobanConfig, SokobanEnv
from gear_rl.models import build_tiny_tokenizer
from gear_rl.signals import prompt_ids

GAMMA = 0.95
TURNS = 5
CONFIG = SokobanConfig()


def _level_seed(moves: int) -> int:
    env = SokobanEnv(CONFIG)
    for seed in range(200):
        env.reset(seed)
        if len(env.plan()) == moves:
            return seed
    raise AssertionError(f"no {moves}-move level")


def play_group() -> tuple[list[EnvEpisode], list[str]]:
    """The solved and the failed episode of one 3-move level, and its plan."""
    tokenizer = build_tiny_tokenizer()
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    seed = _level_seed(3)
    envs = [SokobanEnv(CONFIG), SokobanEnv(CONFIG)]
    first = envs[0].reset(seed)
    plan = envs[0].plan()

    def planner(env: SokobanEnv) -> str:
        return f"<action>{env.plan()[0]}</action>"

    def first_move_then_nothing(env: SokobanEnv) -> str:
        return f"<action>{plan[0]}</action>" if env.steps == 0 else "hmm"

    scripts = [planner, first_move_then_nothing]

    def generate(prompts, stop_strings, budgets):
        live = [i for i, env in enumerate(envs) if not env.done]
        assert len(live) == len(prompts)
        return [[*tokenizer.encode(scripts[i](envs[i]), add_special_tokens=False), stop]
                for i in live]

    prompt = prompt_ids(tokenizer, [{"role": "user", "content": first}])
    episodes = run_env_episodes(envs, [seed, seed], [prompt, prompt], generate, tokenizer,
                                stop_ids=[stop], max_turns=TURNS, max_new_tokens_per_turn=32,
                                max_response_tokens=100_000)
    return episodes, plan


def _inputs(episodes: list[EnvEpisode]):
    outcomes = torch.tensor([float(e.success) for e in episodes], dtype=torch.float64)
    length = max(len(e.loss_mask) for e in episodes)
    mask = torch.zeros(len(episodes), length)
    for b, episode in enumerate(episodes):
        mask[b, :len(episode.loss_mask)] = torch.tensor(episode.loss_mask, dtype=torch.float32)
    return outcomes, mask, [e.step_spans for e in episodes], [e.state_keys for e in episodes]


def _normalised(value: float, members: list[float], by_std: bool, eps: float = 1e-6) -> float:
    if len(members) < 2:
        return 0.0
    centred = value - statistics.fmean(members)
    return centred / (statistics.stdev(members) + eps) if by_std else centred


@pytest.fixture(scope="module")
def group() -> tuple[list[EnvEpisode], list[str]]:
    return play_group()


def test_the_episodes_and_their_rewards(group) -> None:
    (solved, failed), plan = group
    penalty, idle = CONFIG.step_penalty, CONFIG.invalid_action_penalty
    assert solved.success and solved.actions == plan
    assert not failed.success and failed.finish_reason == "max_turns"
    assert failed.actions == [plan[0]] + [None] * (TURNS - 1)
    # one box: only the last move puts it on its target, which solves the level
    assert solved.shaping_rewards == [penalty, penalty, penalty + CONFIG.box_reward]
    assert solved.step_rewards == [penalty, penalty,
                                   penalty + CONFIG.box_reward + CONFIG.solve_reward]
    assert failed.shaping_rewards == failed.step_rewards == [penalty] + [idle] * (TURNS - 1)
    # both act in the start state, then in the state after the first move (the failed one
    # stays there: a turn without a move is a no-op)
    s0, s1, s2 = solved.state_keys
    assert failed.state_keys == [s0] + [s1] * (TURNS - 1)
    assert len({s0, s1, s2}) == 3


@pytest.mark.parametrize("by_std", [True, False], ids=["mean_std_norm", "mean_norm"])
def test_gigpo_counts_the_solve_reward_once(group, by_std: bool) -> None:
    episodes, _ = group
    outcomes, mask, spans, keys = _inputs(episodes)
    penalty, idle, box = CONFIG.step_penalty, CONFIG.invalid_action_penalty, CONFIG.box_reward
    g = GAMMA

    # returns by hand: the outcome (1.0) on the solving step, no solve_reward
    last = penalty + box + 1.0
    solved_returns = [penalty + g * (penalty + g * last), penalty + g * last, last]
    failed_returns = [penalty + idle * (g + g**2 + g**3 + g**4), idle * (1 + g + g**2 + g**3),
                      idle * (1 + g + g**2), idle * (1 + g), idle]
    anchor_s0 = [solved_returns[0], failed_returns[0]]
    anchor_s1 = [solved_returns[1], *failed_returns[1:]]
    episode = [_normalised(1.0, [1.0, 0.0], by_std), _normalised(0.0, [1.0, 0.0], by_std)]
    expected = [
        [episode[0] + _normalised(solved_returns[0], anchor_s0, by_std),
         episode[0] + _normalised(solved_returns[1], anchor_s1, by_std),
         episode[0]],  # the last state is the solved trajectory's alone
        [episode[1] + _normalised(failed_returns[0], anchor_s0, by_std)]
        + [episode[1] + _normalised(r, anchor_s1, by_std) for r in failed_returns[1:]],
    ]
    config = GiGPOConfig(gamma=GAMMA, norm_by_std=by_std,
                         step_norm="mean_std_norm" if by_std else "mean_norm")
    shaping = [e.shaping_rewards for e in episodes]
    ours = per_step_advantages("gigpo", outcomes, [0, 0], mask, spans, shaping, keys, config)
    for row, want in zip(ours, expected, strict=True):
        assert row == pytest.approx(want, abs=1e-9)

    # the registry's token-level estimator on the same extras the trainer builds
    batch = CreditBatch(outcomes, [0, 0], mask, extras={
        "step_spans": spans, "state_keys": keys, "step_rewards": shaping})
    tokens = get_estimator("gigpo")(batch, config)
    for b, played in enumerate(episodes):
        for (start, end), value in zip(played.step_spans, expected[b], strict=True):
            assert tokens[b, start:end].tolist() == pytest.approx([value] * (end - start))

    # the environment's own rewards with the outcome added on top pay the solve twice
    twice = per_step_advantages("gigpo", outcomes, [0, 0], mask, spans,
                                [e.step_rewards for e in episodes], keys, config)
    assert not math.isclose(twice[0][1], ours[0][1], abs_tol=1e-3)


def test_the_trainer_rollout_hands_over_rewards_without_the_solve_bonus() -> None:
    """Through the trainer's own rollout entry (``episodes._collect_env``): a solved level's
    step rewards carry no solve reward (the outcome carries it), so the step estimators count
    it once."""
    from gear_rl.agent.loop import AgentLimits
    from gear_rl.tasks import load_task
    from gear_rl.train.episodes import _collect_env

    task = load_task("sokoban", train_size=4, eval_size=1, seed=0)
    tokenizer = build_tiny_tokenizer()
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    problem = task.train[0]
    probe = task.env.make()
    probe.reset(int(problem.metadata["env_seed"]))
    plan = probe.plan()
    turn = iter(range(100))

    def generate(prompts, stop_strings, budgets):
        move = plan[min(next(turn), len(plan) - 1)]
        return [[*tokenizer.encode(f"<action>{move}</action>", add_special_tokens=False), stop]
                for _ in prompts]

    prompt = prompt_ids(tokenizer, problem.prompt)
    rows = _collect_env(task, [problem], [prompt], generate, tokenizer, [stop],
                        AgentLimits(max_turns=len(plan) + 2, max_new_tokens_per_turn=32,
                                    max_response_tokens=100_000))
    assert rows.rewards == [1.0]  # solved: the outcome pays the solve
    solve_reward = probe.config.solve_reward
    assert len(rows.step_rewards[0]) == len(plan)
    assert max(rows.step_rewards[0]) < solve_reward / 2  # no step carries the solve bonus
