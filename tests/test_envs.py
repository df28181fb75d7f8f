"""gear_rl.envs: action parsing, Sokoban and key-and-door dynamics, the BFS planner, the
TextArena games (rewards, success, planner, random state), and rollouts feeding the step-level
estimators."""

from __future__ import annotations

import random

import pytest
import torch

from gear_rl.credit import CreditBatch, estimator_names, get_estimator
from gear_rl.envs import (
    KeyDoorConfig,
    KeyDoorEnv,
    SokobanConfig,
    SokobanEnv,
    TextEnv,
    bfs_plan,
    generate_keydoor,
    generate_sokoban,
    parse_action,
)
from gear_rl.envs.sokoban import SokobanLevel

MOVES = ("up", "down", "left", "right")


@pytest.mark.parametrize(("text", "expected"), [
    ("<action>up</action>", "up"),
    ("I think <action> Left </action>", "left"),
    ("<action>[right]</action>", "right"),
    ("<action>up</action> then <action>down</action>", "down"),
    ("<action>jump</action> go up", None),           # a bad tag makes the turn malformed
    ("Push it to the left, then down.", "down"),     # no tag: the last direction word
    ("uppercase downward", None),                    # whole words only
    ("", None),
    ("UP", "up"),
])
def test_parse_action(text: str, expected: str | None) -> None:
    assert parse_action(text, MOVES) == expected


def play(env: TextEnv, plan: list[str]) -> list:
    return [env.step(f"Thinking... <action>{move}</action>") for move in plan]


@pytest.mark.parametrize("num_boxes", [1, 2])
def test_every_generated_sokoban_level_is_solved_by_the_planner(num_boxes: int) -> None:
    config = SokobanConfig(num_boxes=num_boxes)
    env = SokobanEnv(config)
    for seed in range(25):
        env.reset(seed)
        plan = env.plan()
        assert plan is not None and 2 <= len(plan) <= 12, seed
        results = play(env, plan)
        assert results[-1].done and results[-1].info["success"]
        assert not any(r.done for r in results[:-1])
        total = sum(r.reward for r in results)
        # every turn pays the step penalty; each box lands on a target once at least
        assert total >= config.solve_reward + len(plan) * config.step_penalty


def test_sokoban_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    a, b = SokobanEnv(), SokobanEnv()
    assert a.reset(7) == b.reset(7)
    assert a.state_key == b.state_key
    boards = {SokobanEnv().reset(seed) for seed in range(10)}
    assert len(boards) > 5


def test_sokoban_rules_by_hand() -> None:
    # # # # # #      player (1,1), box (1,2), target (1,3); wall below the box
    # P X O #
    # _ # _ #
    # # # # #
    h, w = 4, 5
    walls = frozenset({(r, c) for r in range(h) for c in range(w)
                       if r in (0, h - 1) or c in (0, w - 1)} | {(2, 2)})
    config = SokobanConfig()
    level = SokobanLevel(walls, frozenset({(1, 3)}), (1, 1), ((1, 2),), h, w, config)
    start = level.initial_state()
    assert level.render(start).splitlines()[1] == "# P X O #"
    same, reward, solved, moved = level.transition(start, "up")        # wall
    assert (same, moved, solved) == (start, False, False) and reward == config.step_penalty
    state, reward, solved, moved = level.transition(start, "right")    # push onto the target
    assert moved and solved and state == ((1, 2), ((1, 3),))
    # the level's reward leaves the solve reward out; the environment adds it
    assert reward == pytest.approx(config.step_penalty + config.box_reward)
    assert level.solve_reward == config.solve_reward
    assert level.render(state).splitlines()[1] == "# _ P * #"
    blocked = level.transition(state, "right")                          # box against the wall
    assert blocked[3] is False
    assert bfs_plan(level) == ["right"]


@pytest.mark.parametrize("env", [SokobanEnv(SokobanConfig(num_boxes=2)),
                                 KeyDoorEnv(KeyDoorConfig(step_penalty=-0.1, key_reward=0.3))],
                         ids=["sokoban", "keydoor"])
def test_the_solve_reward_is_reported_apart_from_the_shaping_reward(env: TextEnv) -> None:
    for seed in range(10):
        env.reset(seed)
        results = play(env, env.plan())
        for result in results[:-1]:
            assert result.info["shaping_reward"] == result.reward
        last = results[-1]
        assert last.info["success"]
        # bit-for-bit: the environment adds the solve reward to the shaping reward
        assert last.reward == last.info["shaping_reward"] + env.config.solve_reward
    env.reset(0)
    malformed = env.step("no move")
    assert malformed.info["shaping_reward"] == malformed.reward == env.config.invalid_action_penalty


def test_malformed_action_is_a_penalised_no_op_and_the_step_limit_truncates() -> None:
    env = SokobanEnv(SokobanConfig(max_steps=2, invalid_action_penalty=-0.5))
    env.reset(0)
    key = env.state_key
    result = env.step("I will not say a direction.")
    assert result.reward == -0.5 and not result.done
    assert result.info["action"] is None and not result.info["valid_action"]
    assert env.state_key == key
    assert "No valid action" in result.observation
    result = env.step("<action>dance</action>")
    assert result.done and result.info["truncated"] and not result.info["success"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("<action>up</action>")


def test_bad_configs_raise() -> None:
    with pytest.raises(ValueError, match="num_boxes"):
        SokobanConfig(num_boxes=0)
    with pytest.raises(ValueError, match="min_solution_length"):
        SokobanConfig(min_solution_length=5, max_solution_length=3)
    with pytest.raises(ValueError, match="max_steps"):
        KeyDoorConfig(max_steps=0)
    with pytest.raises(ValueError, match="width"):
        KeyDoorConfig(width=3)
    with pytest.raises(RuntimeError, match="no solvable Sokoban level"):
        generate_sokoban(0, SokobanConfig(min_solution_length=90, max_solution_length=100,
                                          max_attempts=3))
    with pytest.raises(ValueError, match="seed"):
        SokobanEnv().reset("0")  # type: ignore[arg-type]


def test_keydoor_levels_are_solved_and_the_door_needs_the_key() -> None:
    env = KeyDoorEnv()
    for seed in range(40):
        env.reset(seed)
        plan = env.plan()
        assert plan is not None, seed
        results = play(env, plan)
        assert results[-1].done and results[-1].info["success"]
        assert results[-1].reward == pytest.approx(1.0)
    level = generate_keydoor(3, KeyDoorConfig())
    # standing next to the door without the key: the door does not open
    r, c = level.door
    beside = ((r, c - 1), False, False)
    assert level.transition(beside, "right")[3] is False
    opened, _, _, moved = level.transition(((r, c - 1), True, False), "right")
    assert moved and opened == ((r, c), True, True)


def test_keydoor_states_repeat() -> None:
    # a move and its reverse (without touching the key) come back to the same state key
    level = generate_keydoor(1, KeyDoorConfig())
    state = level.initial_state()
    for move in MOVES:
        nxt, _, _, moved = level.transition(state, move)
        if moved and nxt[1] == state[1]:
            back = {"up": "down", "down": "up", "left": "right", "right": "left"}[move]
            assert level.transition(nxt, back)[0] == state
            break
    else:
        pytest.fail("no reversible move from the start")


def _random_rollouts(env: TextEnv, seed: int, n: int, rng: random.Random
                     ) -> tuple[list[list], list[list[float]], list[float]]:
    keys, rewards, outcomes = [], [], []
    for _ in range(n):
        env.reset(seed)
        row_keys, row_rewards = [], []
        done, success = False, False
        while not done:
            row_keys.append(env.state_key)
            result = env.step(f"<action>{rng.choice(MOVES)}</action>")
            row_rewards.append(result.reward)
            done, success = result.done, result.info["success"]
        keys.append(row_keys)
        rewards.append(row_rewards)
        outcomes.append(float(success))
    return keys, rewards, outcomes


def test_keydoor_rollouts_feed_every_step_estimator() -> None:
    rng = random.Random(0)
    env = KeyDoorEnv(KeyDoorConfig(max_steps=8))
    keys, step_rewards, outcomes = [], [], []
    groups = []
    for seed in (0, 1):
        k, r, o = _random_rollouts(env, seed, 4, rng)
        keys += k
        step_rewards += r
        outcomes += o
        groups += [seed] * 4
    # repeated states: some state key occurs more than once within a prompt group
    for seed in (0, 1):
        flat = [key for row, g in zip(keys, groups, strict=True) if g == seed for key in row]
        assert len(set(flat)) < len(flat)
    width = 3
    length = width * max(len(row) for row in keys)
    mask = torch.zeros(len(keys), length)
    spans = []
    for b, row in enumerate(keys):
        spans.append([(width * k, width * k + width) for k in range(len(row))])
        for k in range(len(row)):
            mask[b, width * k:width * k + 2] = 1
    generator = torch.Generator().manual_seed(0)
    batch = CreditBatch(torch.tensor(outcomes), groups, mask,
                        divergence=torch.rand(mask.shape, generator=generator),
                        entropy=torch.rand(mask.shape, generator=generator),
                        extras={"step_spans": spans, "state_keys": keys,
                                "step_rewards": step_rewards})
    for name in estimator_names(step_level=True):
        estimator = get_estimator(name)
        config = estimator.make_config(outcome_in_returns=False) if name in (
            "gigpo", "gagpo", "gated_bepo") else None
        out = estimator(batch, config)
        assert torch.isfinite(out).all() and (out[mask == 0] == 0).all(), name


def test_textarena_adapter() -> None:
    pytest.importorskip("textarena")
    from gear_rl.envs import TextArenaConfig, TextArenaEnv

    env = TextArenaEnv(TextArenaConfig(game="Sokoban-v0", max_steps=3))
    first = env.reset(seed=0)
    assert "Sokoban" in first and "Current Board" in first
    board = env.state_key
    assert isinstance(board, str) and "#" in board
    malformed = env.step("no move here")
    assert malformed.reward == -0.1 and malformed.info["action"] is None
    assert env.state_key == board
    keys = {board}
    moves = []
    for move in ("left", "up"):
        moves.append(env.step(f"<action>{move}</action>"))
        keys.add(env.state_key)
    assert all(m.info["action"] and m.info["valid_action"] for m in moves)
    assert len(keys) == 3  # seed 0: both moves change the board
    assert moves[-1].done and moves[-1].info["truncated"] and not moves[-1].info["success"]
    hash(env.state_key)


def test_textarena_success_is_a_solved_level_not_a_partial_reward() -> None:
    pytest.importorskip("textarena")
    from gear_rl.envs import TextArenaConfig, TextArenaEnv

    env = TextArenaEnv(TextArenaConfig(game="FrozenLake-v0"))
    env.reset(3)  # seed 3: a hole right below the start
    fell = env.step("down")
    assert fell.done and 0 < fell.reward < 1 and not fell.info["success"]
    assert fell.info["shaping_reward"] == fell.reward  # a lost game's fraction is shaping
    env.reset(0)
    wall = env.step("up")  # off the grid: TextArena's invalid move, warned once
    assert not wall.done and not wall.info["valid_action"]
    assert env.step("up").done  # the second one in a row ends the game
    env.reset(0)
    plan = env.plan()
    for move in plan:
        result = env.step(f"<action>{move}</action>")
    assert result.done and result.reward == 1.0 and result.info["success"]
    assert result.info["shaping_reward"] == 0.0  # a win is all solve reward


def test_textarena_games_keep_the_callers_random_state() -> None:
    pytest.importorskip("textarena")
    from gear_rl.envs import TextArenaConfig, TextArenaEnv

    random.seed(5)
    expected = random.Random(5).random()
    env = TextArenaEnv(TextArenaConfig(game="FrozenLake-v0-random"))
    first = env.reset(11)
    env.step("down")
    assert random.random() == expected
    assert TextArenaEnv(TextArenaConfig(game="FrozenLake-v0-random")).reset(11) == first


def test_textarena_config_names_the_supported_games() -> None:
    from gear_rl.envs import TEXTARENA_GAMES, TextArenaConfig

    with pytest.raises(ValueError, match=r"FrozenLake-v0, .*Sokoban-v0") as error:
        TextArenaConfig(game="Wordle-v0")
    assert "\n" not in str(error.value)
    assert "Sokoban-v0" in TEXTARENA_GAMES
    with pytest.raises(ValueError, match="max_steps"):
        TextArenaConfig(max_steps=0)


def test_move_prompt_asks_for_one_word_or_a_tag() -> None:
    word = SokobanEnv(SokobanConfig()).reset(3)
    tag = SokobanEnv(SokobanConfig(move_prompt="tag")).reset(3)
    assert word.endswith("Answer with one word: up, down, left or right.")
    assert tag.endswith("inside <action></action>: up, down, left, right.")
    assert word.split("Steps left")[0] == tag.split("Steps left")[0]  # same board
    with pytest.raises(ValueError, match="move_prompt"):
        SokobanConfig(move_prompt="json")
