"""Step-level estimators (gear_rl.credit.steps): hand-computed examples, errors, invariants."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from gear_rl.credit import (
    ESTIMATORS,
    CreditBatch,
    GEARConfig,
    gear_advantages,
    get_estimator,
    grpo_advantages,
)
from gear_rl.credit.registry import estimator_names
from gear_rl.credit.steps import (
    GAGPOConfig,
    GatedBEPOConfig,
    GearStepsConfig,
    GiGPOConfig,
    TurnLevelConfig,
    bellman_graph,
    check_step_inputs,
    gear_steps_advantages,
    per_step_advantages,
    spans_from_step_ids,
    step_advantages,
)
from gear_rl.credit.steps.gated_bepo import END

# Each step k of a row owns positions [3k, 3k + 3): two policy tokens, then one observation token.
STEP_WIDTH = 3


def layout(steps_per_row: list[int]) -> tuple[torch.Tensor, list[list[tuple[int, int]]]]:
    """``[B, T]`` mask (one padding column at the end) and the step spans."""
    length = STEP_WIDTH * max(steps_per_row) + 1
    mask = torch.zeros(len(steps_per_row), length)
    spans = []
    for b, n in enumerate(steps_per_row):
        row = []
        for k in range(n):
            start = STEP_WIDTH * k
            mask[b, start:start + 2] = 1
            row.append((start, start + STEP_WIDTH))
        spans.append(row)
    return mask, spans


def close(actual: list[list[float]], expected: list[list[float]], tol: float = 1e-9) -> None:
    assert len(actual) == len(expected)
    for a_row, e_row in zip(actual, expected, strict=True):
        assert a_row == pytest.approx(e_row, abs=tol), (actual, expected)


# --- a shared rollout group for GiGPO and GAGPO ---------------------------------------------
# Prompt p: p0 A -> B (success), p1 A -> C (fail), p2 A -> B (fail).
# Prompt q: q0 acts in a state also called "A" (success), q1 in D (fail): q's "A" is a different
# state from p's "A" and must never share a group with it. C and D are each seen once.
KEYS = [["A", "B"], ["A", "C"], ["A", "B"], ["A"], ["D"]]
GROUPS = ["p", "p", "p", "q", "q"]
OUTCOMES = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)


def test_gigpo_hand_example_mean_norm() -> None:
    mask, spans = layout([len(k) for k in KEYS])
    config = GiGPOConfig(gamma=0.5, omega=1.0, step_norm="mean_norm", norm_by_std=False)
    # Returns (outcome on the last step, gamma 0.5): p0 [0.5, 1], p1 [0, 0], p2 [0, 0],
    # q0 [1], q1 [0]. Episode (Dr.GRPO): p [2/3, -1/3, -1/3], q [1/2, -1/2].
    # Anchor groups: (p, A) = {0.5, 0, 0} -> [1/3, -1/6, -1/6]; (p, B) = {1, 0} -> [1/2, -1/2];
    # (p, C), (q, A), (q, D) singletons -> 0 (episode advantage alone).
    expected = [[1.0, 7 / 6], [-0.5, -1 / 3], [-0.5, -5 / 6], [0.5], [-0.5]]
    per_step = per_step_advantages("gigpo", OUTCOMES, GROUPS, mask, spans, state_keys=KEYS,
                                   config=config)
    close(per_step, expected)

    tokens = step_advantages("gigpo", OUTCOMES, GROUPS, mask, spans, state_keys=KEYS, config=config)
    assert tokens.dtype == torch.float64
    assert tokens[0].tolist() == pytest.approx([1, 1, 0, 7 / 6, 7 / 6, 0, 0])
    assert (tokens[mask == 0] == 0).all()


def test_gigpo_mean_std_norm_and_omega() -> None:
    mask, spans = layout([len(k) for k in KEYS])
    config = GiGPOConfig(gamma=0.5, omega=0.5)
    episode = grpo_advantages(OUTCOMES, GROUPS).tolist()
    anchor_a = [0.5 - 1 / 6, -1 / 6, -1 / 6]
    std_a = statistics.stdev([0.5, 0.0, 0.0])
    std_b = statistics.stdev([1.0, 0.0])
    expected = [
        [episode[0] + 0.5 * anchor_a[0] / std_a, episode[0] + 0.5 * 0.5 / std_b],
        [episode[1] + 0.5 * anchor_a[1] / std_a, episode[1]],
        [episode[2] + 0.5 * anchor_a[2] / std_a, episode[2] - 0.5 * 0.5 / std_b],
        [episode[3]],
        [episode[4]],
    ]
    close(per_step_advantages("gigpo", OUTCOMES, GROUPS, mask, spans, state_keys=KEYS,
                              config=config), expected,
          tol=1e-5)


def test_gigpo_groups_identical_states_only_within_a_prompt() -> None:
    mask, spans = layout([len(k) for k in KEYS])
    config = GiGPOConfig(gamma=0.5, step_norm="mean_norm", norm_by_std=False)
    separate = per_step_advantages("gigpo", OUTCOMES, GROUPS, mask, spans, state_keys=KEYS,
                                   config=config)
    merged = per_step_advantages("gigpo", OUTCOMES, ["p"] * 5, mask, spans, state_keys=KEYS,
                                 config=config)
    assert separate[3] == [0.5]       # q's "A" has no partner in q: episode advantage only
    assert merged[3] != separate[3]   # one prompt group: it joins p's "A" group


def test_gigpo_step_rewards_without_outcome() -> None:
    mask, spans = layout([2, 2])
    # step rewards already include the outcome: returns p0 [0.5 * 1, 1], p1 [0, 0]
    config = GiGPOConfig(gamma=0.5, outcome_in_returns=False, step_norm="mean_norm",
                         norm_by_std=False, omega=2.0)
    per_step = per_step_advantages("gigpo", torch.tensor([1.0, 0.0]), [0, 0], mask, spans,
                                   state_keys=[["s", "t"], ["s", "t"]],
                                   step_rewards=[[0.0, 1.0], [0.0, 0.0]], config=config)
    close(per_step, [[0.5 + 2 * 0.25, 0.5 + 2 * 0.5], [-0.5 - 2 * 0.25, -0.5 - 2 * 0.5]])


def test_gigpo_per_step_episode_stats_hand_example() -> None:
    # p0 succeeds in 3 steps, p1 fails in 1; every state is new, so A = A^E.
    mask, spans = layout([3, 1])
    keys = [["a", "b", "c"], ["d"]]
    outcomes = torch.tensor([1.0, 0.0], dtype=torch.float64)
    # trajectory statistics: scores {1, 0}, mean 1/2, std 1/sqrt(2)
    # per-step statistics: rows {1, 1, 1, 0}, mean 3/4, std 1/2
    expected = {
        ("trajectory", True): [0.5 * math.sqrt(2), -0.5 * math.sqrt(2)],
        ("per_step", True): [0.25 / 0.5, -0.75 / 0.5],
        ("trajectory", False): [0.5, -0.5],
        ("per_step", False): [0.25, -0.75],
    }
    for (stats, norm_by_std), (a0, a1) in expected.items():
        config = GiGPOConfig(episode_stats=stats, norm_by_std=norm_by_std,
                             step_norm="mean_std_norm" if norm_by_std else "mean_norm")
        close(per_step_advantages("gigpo", outcomes, [0, 0], mask, spans, state_keys=keys,
                                  config=config), [[a0] * 3, [a1]], tol=1e-5)


def _verl_agent_gigpo(scores: list[float], groups: list[int], keys: list[list[str]],
                      step_rewards: list[list[float]], gamma: float, remove_std: bool,
                      cross_steps: bool, eps: float = 1e-6) -> list[list[float]]:
    """This test's reading of verl-agent's ``gigpo/core_gigpo.py`` (one batch row per step):
    ``episode_norm_reward`` (a group's list holds each row's trajectory score, or each
    trajectory's once when ``cross_steps`` is off; a list of one: mean 0, std 1), discounted
    returns per trajectory, ``step_norm_reward`` over rows with equal (group, state), and
    their sum (``step_advantage_w`` 1)."""
    rows = [(b, k) for b, row in enumerate(keys) for k in range(len(row))]
    returns = []
    for row in step_rewards:
        g, out = 0.0, []
        for r in reversed(row):
            g = r + gamma * g
            out.append(g)
        returns.append(out[::-1])

    def normalise(value: float, members: list[float], singleton_mean: float | None) -> float:
        if len(members) == 1:
            mean, std = (members[0] if singleton_mean is None else singleton_mean), 1.0
        else:
            mean, std = statistics.fmean(members), statistics.stdev(members)
        return value - mean if remove_std else (value - mean) / (std + eps)

    episode_lists: dict[int, list[float]] = {}
    seen = set()
    for b, _ in rows:
        if not cross_steps and b in seen:
            continue
        seen.add(b)
        episode_lists.setdefault(groups[b], []).append(scores[b])
    step_lists: dict[tuple[int, str], list[float]] = {}
    for b, k in rows:
        step_lists.setdefault((groups[b], keys[b][k]), []).append(returns[b][k])
    return [[normalise(scores[b], episode_lists[groups[b]], 0.0)
             + normalise(returns[b][k], step_lists[(groups[b], keys[b][k])], None)
             for k in range(len(keys[b]))] for b in range(len(keys))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("episode_stats", ["trajectory", "per_step"])
@pytest.mark.parametrize("mode", ["mean_std_norm", "mean_norm"])
def test_gigpo_matches_a_reading_of_verl_agent_on_random_inputs(seed: int, episode_stats: str,
                                                                mode: str) -> None:
    rng = random.Random(seed)
    rows = 12
    groups = [b // 4 for b in range(rows)]
    steps_per_row = [rng.randint(1, 6) for _ in range(rows)]
    keys = [[rng.choice("ABC") for _ in range(n)] for n in steps_per_row]
    step_rewards = [[rng.choice([0.0, -0.1, 1.0]) + rng.random() for _ in range(n)]
                    for n in steps_per_row]
    scores = [float(rng.random() < 0.5) for _ in range(rows)]
    mask, spans = layout(steps_per_row)
    config = GiGPOConfig(gamma=0.9, episode_stats=episode_stats, outcome_in_returns=False,
                         norm_by_std=mode == "mean_std_norm", step_norm=mode)
    ours = per_step_advantages("gigpo", torch.tensor(scores, dtype=torch.float64), groups, mask,
                               spans, step_rewards, keys, config)
    theirs = _verl_agent_gigpo(scores, groups, keys, step_rewards, 0.9,
                               remove_std=mode == "mean_norm",
                               cross_steps=episode_stats == "per_step")
    close(ours, theirs, tol=1e-12)


def test_gigpo_prompt_group_of_one_gets_no_episode_advantage() -> None:
    # verl-agent gives a lone trajectory of one step its raw score (mean 0, std 1); here 0
    mask, spans = layout([1, 2])
    outcomes = torch.tensor([1.0, 1.0], dtype=torch.float64)
    for stats in ("trajectory", "per_step"):
        config = GiGPOConfig(episode_stats=stats)
        out = per_step_advantages("gigpo", outcomes, [0, 1], mask, spans,
                                  state_keys=[["s"], ["s", "t"]], config=config)
        assert out == [[0.0], [0.0, 0.0]]
    close(_verl_agent_gigpo([1.0, 1.0], [0, 1], [["s"], ["s", "t"]], [[0.0], [0.0, 0.0]],
                            0.95, remove_std=False, cross_steps=True), [[1.0], [0.0, 0.0]],
          tol=1e-5)
    with pytest.raises(ValueError, match="episode_stats"):
        GiGPOConfig(episode_stats="per_token")


def test_gagpo_hand_example() -> None:
    mask, spans = layout([len(k) for k in KEYS])
    # Value proxy (gamma 0.5): V(p,A) = mean(0.5, 0, 0) = 1/6, V(p,B) = mean(1, 0) = 1/2,
    # V(p,C) = 0, V(q,A) = 1, V(q,D) = 0 (q's "A" is not p's "A").
    # TD residuals: p0 [0.5 * 1/2 - 1/6, 1 - 1/2] = [1/12, 1/2]; p1 [-1/6, 0];
    # p2 [1/12, -1/2]; q0 [1 - 1] = [0]; q1 [0].
    deltas = [[1 / 12, 0.5], [-1 / 6, 0.0], [1 / 12, -0.5], [0.0], [0.0]]
    lam0 = GAGPOConfig(gamma=0.5, lam=0.0, adv_norm="none")
    close(per_step_advantages("gagpo", OUTCOMES, GROUPS, mask, spans, state_keys=KEYS,
                              config=lam0), deltas)

    # lam = 1 telescopes to G_k - V(s_k): p0 [0.5 - 1/6, 1/2], p2 [0 - 1/6, -1/2].
    lam1 = GAGPOConfig(gamma=0.5, lam=1.0, adv_norm="none")
    close(per_step_advantages("gagpo", OUTCOMES, GROUPS, mask, spans, state_keys=KEYS, config=lam1),
          [[1 / 3, 0.5], [-1 / 6, 0.0], [-1 / 6, -0.5], [0.0], [0.0]])

    # group normalisation over the six steps of p (q's steps are all 0 -> stay 0)
    normed = per_step_advantages("gagpo", OUTCOMES, GROUPS, mask, spans, state_keys=KEYS,
                                 config=GAGPOConfig(gamma=0.5, lam=0.0))
    flat = [d for row in deltas[:3] for d in row]
    mean, std = statistics.fmean(flat), statistics.stdev(flat)
    close(normed, [[(d - mean) / (std + 1e-6) for d in row] for row in deltas[:3]] + [[0.0], [0.0]])


# --- Gated-BEPO: a cycle, a state seen once, and the same key under another prompt --------------
# Prompt p: p0 A -> B -> A -> C, success; p1 A -> C, fail.
# Prompt q: q0 acts once in "A" (success), q1 once in "B" (fail).
BEPO_KEYS = [["A", "B", "A", "C"], ["A", "C"], ["A"], ["B"]]
BEPO_GROUPS = ["p", "p", "q", "q"]
BEPO_OUTCOMES = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)


def test_gated_bepo_hand_example_with_a_cycle() -> None:
    mask, spans = layout([len(k) for k in BEPO_KEYS])
    # Graph of p (gamma 1/2): A -> B, B -> A, A -> C (twice), C -> END paying 1, C -> END
    # paying 0. V(C) = 1/2; V(B) = V(A)/2; V(A) = (V(B)/2 + 1/4 + 1/4)/3 -> V(A) = 2/11,
    # V(B) = 1/11. A has successors {B, C}, C has {END:1, END:0}: trusted; B has one: gated.
    transitions = [("A", 0.0, "B"), ("B", 0.0, "A"), ("A", 0.0, "C"), ("C", 1.0, END),
                   ("A", 0.0, "C"), ("C", 0.0, END)]
    graph = bellman_graph(transitions, gamma=0.5, tol=1e-14)
    values = {key: graph.values[i] for key, i in graph.nodes.items()}
    assert values == pytest.approx({"A": 2 / 11, "B": 1 / 11, "C": 0.5})
    assert dict(zip(graph.nodes, graph.successors, strict=True)) == {"A": 2, "B": 1, "C": 2}

    episode = grpo_advantages(BEPO_OUTCOMES, BEPO_GROUPS).tolist()
    # Residuals: p0 [1/22 - 4/22, 1/11 - 1/11, 1/4 - 2/11, 1 - 1/2] = [-3/22, 0, 3/44, 1/2];
    # p1 [1/4 - 2/11, 0 - 1/2] = [3/44, -1/2]. q: A and B each have one successor: episode.
    lam0 = GatedBEPOConfig(gamma=0.5, lam=0.0, tol=1e-14)
    close(per_step_advantages("gated_bepo", BEPO_OUTCOMES, BEPO_GROUPS, mask, spans,
                              state_keys=BEPO_KEYS, config=lam0),
          [[-3 / 22, episode[0], 3 / 44, 0.5], [3 / 44, -0.5], [episode[2]], [episode[3]]])
    # GAE with lam = 1 (gamma * lam = 1/2): p0 [-5/88, (gated), 7/22, 1/2] = G_k - V(s_k)
    lam1 = GatedBEPOConfig(gamma=0.5, lam=1.0, tol=1e-14)
    close(per_step_advantages("gated_bepo", BEPO_OUTCOMES, BEPO_GROUPS, mask, spans,
                              state_keys=BEPO_KEYS, config=lam1),
          [[-5 / 88, episode[0], 7 / 22, 0.5], [3 / 44 - 0.25, -0.5], [episode[2]],
           [episode[3]]])
    # the gate off: B gets its own residual chain too
    ungated = GatedBEPOConfig(gamma=0.5, lam=0.0, tol=1e-14, min_successors=1)
    assert per_step_advantages("gated_bepo", BEPO_OUTCOMES, BEPO_GROUPS, mask, spans,
                               state_keys=BEPO_KEYS, config=ungated)[0][1] == pytest.approx(0.0)


def test_gated_bepo_does_not_pool_across_prompts() -> None:
    mask, spans = layout([len(k) for k in BEPO_KEYS])
    config = GatedBEPOConfig(gamma=0.5, lam=0.0, tol=1e-14)
    separate = per_step_advantages("gated_bepo", BEPO_OUTCOMES, BEPO_GROUPS, mask, spans,
                                   state_keys=BEPO_KEYS, config=config)
    pooled = per_step_advantages("gated_bepo", BEPO_OUTCOMES, ["p"] * 4, mask, spans,
                                 state_keys=BEPO_KEYS, config=config)
    assert pooled[0][0] != pytest.approx(separate[0][0])


def test_bellman_cycle_converges_at_gamma_one_and_limits_raise() -> None:
    # V(A) = mean(V(B), 1), V(B) = V(A): the fixed point is V = 1 even without discounting.
    transitions = [("A", 0.0, "B"), ("B", 0.0, "A"), ("A", 1.0, END)]
    graph = bellman_graph(transitions, gamma=1.0, tol=1e-12)
    assert graph.values == pytest.approx([1.0, 1.0])
    assert graph.iterations > 10
    with pytest.raises(ValueError, match="did not converge within max_iters=3"):
        bellman_graph(transitions, gamma=1.0, tol=1e-12, max_iters=3)
    with pytest.raises(ValueError, match="never acted in"):
        bellman_graph([("A", 0.0, "Z")], gamma=0.9)


def test_turn_level_hand_example() -> None:
    turn_rewards = [[1.0, 0.0, 0.0], [0.0, 1.0], [1.0, 1.0, 0.0], [1.0]]
    outcomes = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = ["p", "p", "p", "q"]
    mask, spans = layout([len(r) for r in turn_rewards])
    # Outcome (Dr.GRPO): p [2/3, -1/3, -1/3], q0 alone -> 0.
    # Turn groups: (p, 0) {1, 0, 1} -> [1/3, -2/3, 1/3]; (p, 1) {0, 1, 1} -> [-2/3, 1/3, 1/3];
    # (p, 2) {0, 0} -> [0, 0]; (q, 0) alone -> 0.
    config = TurnLevelConfig(turn_norm="mean_norm", norm_by_std=False)
    close(per_step_advantages("turn_level", outcomes, groups, mask, spans, turn_rewards,
                              config=config),
          [[1.0, 0.0, 2 / 3], [-1.0, -1 / 3], [0.0, 0.0, -1 / 3], [0.0]])
    combined = TurnLevelConfig(turn_norm="mean_norm", norm_by_std=False, last_turn="combined",
                               outcome_coef=0.5)
    close(per_step_advantages("turn_level", outcomes, groups, mask, spans, turn_rewards,
                              config=combined),
          [[1 / 3 + 1 / 3, -2 / 3 + 1 / 3, 1 / 3], [-2 / 3 - 1 / 6, 1 / 3 - 1 / 6],
           [1 / 3 - 1 / 6, 1 / 3 - 1 / 6, -1 / 6], [0.0]])


# --- gear_steps ------------------------------------------------------------------------------
def _signals(mask: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(mask.shape, generator=generator),
            torch.rand(mask.shape, generator=generator) * 2)


def test_gear_steps_reduces_to_gear_when_every_state_is_unique() -> None:
    keys = [["a0", "a1"], ["b0"], ["c0", "c1"], ["d0"]]
    mask, spans = layout([len(k) for k in keys])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = [0, 0, 1, 1]
    divergence, entropy = _signals(mask, 0)
    ours = gear_steps_advantages(rewards, groups, mask, divergence, entropy, spans, keys,
                                 config=GearStepsConfig(base="gigpo", alpha=0.8))
    gear = gear_advantages(grpo_advantages(rewards, groups), divergence, entropy, mask,
                           GEARConfig(alpha=0.8))
    torch.testing.assert_close(ours, gear)


def test_gear_steps_weights_each_step_by_its_own_sign() -> None:
    mask, spans = layout([len(k) for k in KEYS])
    divergence, entropy = _signals(mask, 1)
    config = GearStepsConfig(base="gagpo", base_config=GAGPOConfig(gamma=0.5, lam=0.0))
    out = gear_steps_advantages(OUTCOMES, GROUPS, mask, divergence, entropy, spans, KEYS,
                                config=config)
    base = get_estimator("gagpo")(CreditBatch(OUTCOMES, GROUPS, mask, extras={
        "step_spans": spans, "state_keys": KEYS}), GAGPOConfig(gamma=0.5, lam=0.0))
    assert (out * base >= 0).all()
    assert ((out != 0) == (base != 0)).all()
    assert (out[mask == 0] == 0).all()
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="contradicts norm_by_std"):
        GearStepsConfig(base="gigpo", norm_by_std=False, base_config=GiGPOConfig())
    with pytest.raises(ValueError, match="must be a GiGPOConfig"):
        GearStepsConfig(base="gigpo", base_config=GAGPOConfig())


# --- the registry ----------------------------------------------------------------------------
def _batch(**extras: object) -> CreditBatch:
    mask, spans = layout([len(k) for k in KEYS])
    divergence, entropy = _signals(mask, 2)
    return CreditBatch(OUTCOMES.float(), GROUPS, mask, divergence=divergence, entropy=entropy,
                       extras={"step_spans": spans, "state_keys": KEYS, **extras})


def test_step_estimators_are_declared_step_level() -> None:
    assert set(estimator_names(step_level=True)) == {"turn_level", "gigpo", "gagpo",
                                                      "gated_bepo", "gear_steps"}
    assert all(ESTIMATORS[name].step_level for name in estimator_names(step_level=True))
    assert get_estimator("gear_steps").requires_states(GearStepsConfig(base="gigpo"))
    assert not get_estimator("gear_steps").requires_states(GearStepsConfig(base="turn_level"))


@pytest.mark.parametrize("name", estimator_names(step_level=True))
def test_registry_matches_direct_calls_and_names_missing_extras(name: str) -> None:
    batch = _batch()
    estimator = get_estimator(name)
    out = estimator(batch)
    assert out.shape == batch.mask.shape and out.dtype == torch.float32
    assert torch.isfinite(out).all() and (out[batch.mask == 0] == 0).all()
    if name == "gigpo":
        config = estimator.make_config(gamma=0.5, omega=0.3)
        direct = step_advantages("gigpo", batch.rewards, GROUPS, batch.mask,
                                 batch.extras["step_spans"], state_keys=KEYS, config=config)
        torch.testing.assert_close(estimator(batch, config), direct)
    with pytest.raises(ValueError, match="step_spans"):
        estimator(CreditBatch(batch.rewards, GROUPS, batch.mask, batch.divergence,
                              batch.entropy, extras={"state_keys": KEYS}))
    if name not in ("turn_level",):
        with pytest.raises(ValueError, match="state_keys"):
            estimator(CreditBatch(batch.rewards, GROUPS, batch.mask, batch.divergence,
                                  batch.entropy, extras={"step_spans": batch.extras["step_spans"]}))


def test_gear_steps_needs_token_signals() -> None:
    batch = _batch()
    batch.divergence = None
    with pytest.raises(ValueError, match="divergence"):
        get_estimator("gear_steps")(batch)


# --- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(("change", "match"), [
    (lambda a: a.update(step_spans=[[(0, 3), (2, 6)], *a["step_spans"][1:]]),
     "sorted and non-overlapping"),
    (lambda a: a.update(step_spans=[[(0, 3), (3, 99)], *a["step_spans"][1:]]),
     r"step_spans\[0\]\[1\]"),
    (lambda a: a.update(step_spans=[[(0, 3)], *a["step_spans"][1:]]), "outside every step"),
    (lambda a: a.update(step_spans=a["step_spans"][:-1]), "step_spans has 4 trajectories"),
    (lambda a: a.update(step_spans=[[(0, 1.5)], *a["step_spans"][1:]]), "pair of ints"),
    (lambda a: a.update(state_keys=[["A"], *KEYS[1:]]), r"state_keys\[0\] has 1 entries"),
    (lambda a: a.update(state_keys=[[["A"], "B"], *KEYS[1:]]), "must be hashable"),
    (lambda a: a.update(step_rewards=[[0.0, math.nan], [0, 0], [0, 0], [0], [0]]),
     r"step_rewards\[0\]\[1\] must be a finite number"),
    (lambda a: a.update(step_rewards=[[0.0], [0, 0], [0, 0], [0], [0]]),
     r"step_rewards\[0\] has 1 entries"),
    (lambda a: a.update(rewards=torch.tensor([1.0, 0.0])), "rewards has batch size 2"),
    (lambda a: a.update(rewards=torch.tensor([1.0, math.inf, 0, 0, 0])), "rewards contains NaN"),
    (lambda a: a.update(group_ids=["p"]), "group_ids has 1 entries"),
])
def test_bad_inputs_raise_naming_the_argument(change, match: str) -> None:
    mask, spans = layout([len(k) for k in KEYS])
    args = {"rewards": OUTCOMES, "group_ids": GROUPS, "mask": mask, "step_spans": spans,
            "state_keys": KEYS, "step_rewards": None}
    change(args)
    with pytest.raises(ValueError, match=match):
        step_advantages("gigpo", **args)


def test_bad_configs_raise() -> None:
    with pytest.raises(ValueError, match="gamma"):
        GiGPOConfig(gamma=0.0)
    with pytest.raises(ValueError, match="step_norm"):
        GiGPOConfig(step_norm="std")
    with pytest.raises(ValueError, match="lam"):
        GAGPOConfig(lam=1.5)
    with pytest.raises(ValueError, match="min_successors"):
        GatedBEPOConfig(min_successors=0)
    with pytest.raises(ValueError, match="last_turn"):
        TurnLevelConfig(last_turn="first")
    with pytest.raises(ValueError, match="base must be one of"):
        GearStepsConfig(base="ppo")
    mask, spans = layout([len(k) for k in KEYS])
    with pytest.raises(ValueError, match="takes a GiGPOConfig"):
        step_advantages("gigpo", OUTCOMES, GROUPS, mask, spans, state_keys=KEYS,
                        config=GAGPOConfig())


def test_spans_from_step_ids_and_missing_states() -> None:
    step_ids = torch.tensor([[0, 0, 0, 1, 1, -1], [0, 1, 1, 1, 2, 2]])
    assert spans_from_step_ids(step_ids) == [[(0, 3), (3, 5)], [(0, 1), (1, 4), (4, 6)]]
    with pytest.raises(ValueError, match="interleave"):
        spans_from_step_ids(torch.tensor([[0, 1, 0]]))
    mask = torch.ones(1, 2)
    with pytest.raises(ValueError, match="state_keys is required"):
        check_step_inputs(mask, [0], [[(0, 2)]], require_states=True)


# --- invariants on random rollouts ---------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_random_rollouts_finite_and_zero_off_policy(seed: int) -> None:
    rng = random.Random(seed)
    rows = 8
    steps_per_row = [rng.randint(0, 5) for _ in range(rows)]
    steps_per_row[0] = max(steps_per_row[0], 1)
    mask, spans = layout(steps_per_row)
    keys = [[rng.choice("ABCD") for _ in range(n)] for n in steps_per_row]
    step_rewards = [[rng.choice([0.0, -0.1, 1.0]) for _ in range(n)] for n in steps_per_row]
    rewards = torch.tensor([float(rng.random() < 0.5) for _ in range(rows)])
    groups = [b // 4 for b in range(rows)]
    divergence, entropy = _signals(mask, seed)
    batch = CreditBatch(rewards, groups, mask, divergence=divergence, entropy=entropy,
                        extras={"step_spans": spans, "state_keys": keys,
                                "step_rewards": step_rewards})
    for name in estimator_names(step_level=True):
        estimator = get_estimator(name)
        for gamma in (0.9, 1.0):
            overrides = {} if name == "turn_level" else {"gamma": gamma}
            if name == "gear_steps":
                overrides = {"base": "gated_bepo",
                             "base_config": GatedBEPOConfig(gamma=gamma)}
            out = estimator(batch, estimator.make_config(**overrides))
            assert torch.isfinite(out).all(), name
            assert (out[mask == 0] == 0).all(), name
            empty = [b for b, n in enumerate(steps_per_row) if n == 0]
            assert (out[empty] == 0).all(), name
