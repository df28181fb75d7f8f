"""The credit check (issue 16): Monte-Carlo values against exact enumeration, the scores'
definitions, a task decided at one token, bad input, resume after an interruption, and the CLI
and report end to end on tiny models."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gear_rl.credit_check import (
    CreditCheckConfig,
    TrajectoryUnits,
    check_task,
    choose_boundaries,
    cluster_bootstrap,
    credit_check,
    estimate_prefix_values,
    exact_value,
    nucleus_probs,
    plan_rows,
    precision_at_k,
    run_check_config,
    score_estimate,
    span_shares,
    span_sums,
    spearman,
    top_k_shares,
)
from gear_rl.envs.base import StepResult, TextEnv
from gear_rl.mc_values import Trajectory, estimate_values
from gear_rl.models import build_tiny_tokenizer, tiny_random_model
from gear_rl.sampling import SamplingParams, sample_responses
from gear_rl.tasks import AgentSpec, Problem, Task
from gear_rl.tasks.base import EnvSpec
from gear_rl.train import load_config


@pytest.fixture(scope="module")
def one_numba_thread():
    """GEAR's numba kernel on one thread: without OMP_WAIT_POLICY=PASSIVE (which the CLI sets
    before torch loads, too late here), its OpenMP workers left spinning after a parallel
    region slowed the tiny models' decoding in the same process 5-10x on a shared 2-core
    machine."""
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(threads)


pytestmark = pytest.mark.usefixtures("one_thread", "one_numba_thread")

# fp32 sampler and signals: the same draws on every CPU (auto picks bf16 only where native)
SMALL = ["model=tiny-random", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
         "rollout.max_new_tokens=6", "rollout.dtype=fp32", "precision=fp32"]


def _problems(count: int) -> list[Problem]:
    return [Problem(id=f"p{i}", prompt=[{"role": "user", "content": f"say something {i}"}],
                    answer="x", reference="x") for i in range(count)]


def _first_letter(text: str) -> str | None:
    return next((c for c in text if c.isascii() and c.isalpha()), None)


def first_letter_task() -> Task:
    """Reward 1 when the response's first ASCII letter is lowercase: decided at one token (the
    first letter byte; nothing before or after it can change the reward)."""
    problems = _problems(8)

    def scorer(problem: Problem, text: str) -> float:
        letter = _first_letter(text)
        return float(letter is not None and letter.islower())

    return Task(name="first-letter", train=problems[:6], eval=problems[6:], scorer=scorer,
                extract=_first_letter)


def _tiny(seed: int = 1) -> tuple[torch.nn.Module, object]:
    return tiny_random_model("llama", seed=seed), build_tiny_tokenizer()


# ------------------------------------------------------------------ (b) V against exact values
@pytest.mark.parametrize("shared", [False, True])
def test_monte_carlo_value_matches_exact_enumeration(shared: bool) -> None:
    vocab, stop, horizon = 6, 5, 4
    model = tiny_random_model("llama", vocab_size=vocab, hidden_size=32, num_heads=4,
                              num_kv_heads=2, intermediate_size=64, initializer_range=0.05,
                              seed=3)
    settings = {"temperature": 0.8, "top_p": 0.9}

    def reward(ids, finished: bool) -> float:
        ids = list(ids)
        return 0.5 * (1 in ids) + 0.3 * finished + 0.2 * (ids.count(3) >= 2)

    prompt = [0, 2, 4]
    generator = torch.Generator().manual_seed(0)
    response = None
    for _ in range(20):  # a response that leaves room to continue from its middle
        drawn = sample_responses(model, [prompt], SamplingParams(
            max_new_tokens=horizon, stop_ids=[stop], pad_id=0, **settings), generator=generator)
        if len(drawn.response_ids[0]) >= 3:
            response, finished = drawn.response_ids[0], drawn.finished[0]
            break
    assert response is not None
    bounds = list(range(len(response) + 1))
    values = estimate_prefix_values(model, prompt, response, finished, bounds, samples=4000,
                                    reward_fn=reward, max_new_tokens=horizon, stop_ids=[stop],
                                    pad_id=0, seeds=[11], shared=shared, batch_size=None,
                                    **settings)
    mc, se = values.values(0), values.stderr(0)
    exact = [exact_value(model, prompt + response[:b],
                         reward_fn=lambda cont, done, b=b: reward(response[:b] + cont, done),
                         max_new_tokens=horizon - b, stop_ids=[stop], **settings)
             for b in bounds]
    assert values.terminal == [b == len(response) for b in bounds]
    assert mc[-1] == reward(response, finished) and se[-1] == 0.0
    assert len({round(v, 6) for v in exact}) > 1  # a prefix changes the value
    for b in bounds[:-1]:
        assert 0 < se[b] < 0.02
        assert abs(mc[b] - exact[b]) < 4 * se[b], (b, mc[b], exact[b], se[b])


def test_values_of_several_trajectories_decoded_together_match_exact_enumeration() -> None:
    """``estimate_values`` on three trajectories (two of one prompt, one of another, of other
    lengths) in one decoding batch, so that it holds continuations of different trajectories'
    prefixes, each read from its own sequence's cache and left-padded to the longest: every V
    agrees with exact enumeration (the model's weights are large enough that the context moves
    the values: a prefix read from the wrong sequence fails), and with ``dedupe`` the two
    trajectories' shared prefixes get one estimate."""
    horizon, stop = 5, 5
    model = tiny_random_model("llama", vocab_size=6, hidden_size=16, num_heads=2,
                              num_kv_heads=2, intermediate_size=64, initializer_range=0.3,
                              seed=3)
    settings = {"temperature": 0.8, "top_p": 0.9}

    def reward(ids, finished: bool) -> float:
        ids = list(ids)
        return 0.5 * (1 in ids) + 0.3 * finished + 0.2 * (ids.count(3) >= 2)

    prompts = [[0, 2, 4], [0, 2, 4], [1, 3]]
    responses = [[3, 1, 2, 5], [3, 1, 4], [2, 2]]
    finished = [True, False, False]
    items = [Trajectory(p, r, f, list(range(len(r) + 1)), reward)
             for p, r, f in zip(prompts, responses, finished, strict=True)]
    both = {dedupe: estimate_values(model, items, samples=3000, max_new_tokens=horizon,
                                    stop_ids=[stop], pad_id=0, seeds=[5], batch_size=None,
                                    dedupe=dedupe, **settings)
            for dedupe in (True, False)}
    for dedupe, estimates in both.items():
        for item, values in zip(items, estimates, strict=True):
            mc, se = values.values(0), values.stderr(0)
            for b in item.boundaries[:-1]:
                head = list(item.response_ids[:b])
                exact = exact_value(model, list(item.prompt_ids) + head,
                                    reward_fn=lambda c, d, h=head: reward(h + c, d),
                                    max_new_tokens=horizon - b, stop_ids=[stop], **settings)
                assert 0 < se[b] < 0.02
                assert abs(mc[b] - exact) < 4 * se[b], (dedupe, b, mc[b], exact, se[b])
        # trajectories 0 and 1 agree on the prompt and the first two response tokens
        shared = [estimates[0].rewards[0][b] == estimates[1].rewards[0][b] for b in range(3)]
        assert shared == [dedupe] * 3
        assert estimates[0].rewards[0][3] != estimates[1].rewards[0][3]
    assert (sum(v.tokens for v in both[True])
            < sum(v.tokens for v in both[False]))


def test_exact_value_of_a_uniform_model_by_hand() -> None:
    """A model with zero output weights samples uniformly: with 3 tokens (2 stops the
    response), budget 2 and reward = finished, V = P(stop within 2) = 1/3 + 2/3 * 1/3."""
    model = tiny_random_model("llama", vocab_size=3, hidden_size=8, num_heads=2,
                              num_kv_heads=1, intermediate_size=16)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    value = exact_value(model, [0], reward_fn=lambda ids, done: float(done), max_new_tokens=2,
                        stop_ids=[2])
    assert value == pytest.approx(1 / 3 + 2 / 9)
    # the nucleus keeps a token while the mass before it is below top_p: of three equal
    # tokens, top_p=0.5 keeps two (mass before them 0 and 1/3), renormalised
    kept = nucleus_probs(torch.zeros(1, 3), top_p=0.5)[0].sort().values
    assert kept.tolist() == pytest.approx([0.0, 0.5, 0.5])
    assert nucleus_probs(torch.tensor([[2.0, 0.0]]), temperature=2.0)[0].tolist() == \
        pytest.approx([math.e / (math.e + 1), 1 / (math.e + 1)])


# ------------------------------------------------------------------ the scores' definitions
def test_score_definitions_by_hand() -> None:
    assert spearman(np.ones(4), np.array([0.1, -0.2, 0.3, 0.0])) == 0.0  # constant: the floor
    assert spearman(np.array([1.0, 2, 3, 4]), np.array([0.1, 0.2, 0.3, 0.9])) == 1.0
    assert top_k_shares(np.array([3.0, -3, 1, 0]), 1).tolist() == [0.5, 0.5, 0.0, 0.0]
    assert top_k_shares(np.array([3.0, 2, 2, 2]), 2).tolist() == pytest.approx(
        [1, 1 / 3, 1 / 3, 1 / 3])
    truth = np.array([0.1, -0.6, 0.2, 0.0, 0.05])
    assert precision_at_k(np.ones(5), truth, 1) == pytest.approx(0.2)  # uniform: chance
    assert precision_at_k(np.ones(5), truth, 3) == pytest.approx(0.6)
    assert precision_at_k(np.array([0, 5.0, 1, 0, 0]), truth, 2) == 1.0
    assert span_sums(np.array([1.0, 2, 3, 4, 5]), [0, 2, 5]).tolist() == [3.0, 12.0]
    assert span_sums(np.array([1.0, 2, 3]), [0, 3], mask=np.array([1, 0, 1])).tolist() == [4.0]
    assert span_shares(np.array([1, 1, 0, 0], bool), [0, 1, 4]).tolist() == pytest.approx(
        [1.0, 1 / 3])
    assert choose_boundaries(5) == [0, 1, 2, 3, 4, 5]
    assert choose_boundaries(5, every=2) == [0, 2, 4, 5]
    assert choose_boundaries(6, segment_onsets=[-1, 1, 1, 1, 4, -1]) == [0, 1, 4, 5, 6]
    # turns: a policy turn (mask 1) then the observation answering it (mask 0, same turn id)
    mask, turns = [1, 1, 0, 0, 1, 1, 1, 0, 1], [0, 0, 0, 0, 1, 1, 1, 1, 2]
    assert choose_boundaries(9, mask=mask, turn_ids=turns) == [0, 4, 8, 9]
    with pytest.raises(ValueError, match="not both"):
        choose_boundaries(9, mask=mask, turn_ids=turns, segment_onsets=[-1] * 9)
    # ratio of sums over groups; one group has no interval
    interval = cluster_bootstrap([1.0, 3.0, 2.0], [1, 1, 2], ["a", "a", "b"], resamples=500)
    assert interval.value == pytest.approx(1.5) and interval.groups == 2
    assert interval.low <= interval.value <= interval.high
    lone = cluster_bootstrap([1.0, 3.0], [1, 1], ["a", "a"])
    assert lone.value == 2.0 and math.isnan(lone.low)


def test_score_estimate_ranks_an_aligned_estimator_above_uniform_credit() -> None:
    rng = np.random.default_rng(0)
    units, aligned, uniform, inside = [], [], [], []
    for i in range(12):
        truth = rng.normal(size=6)
        units.append(TrajectoryUnits(group=i // 3, truth=truth, truth_se=np.full(6, 0.1),
                                     outcome=1.0, tokens=np.ones(6)))
        aligned.append(truth + rng.normal(scale=0.3, size=6))
        uniform.append(np.ones(6))
        inside.append((np.abs(truth) >= np.sort(np.abs(truth))[3]).astype(float))
    good = score_estimate(units, aligned, ks=(1,), inside=inside, resamples=300)
    floor = score_estimate(units, uniform, ks=(1,), resamples=300)
    assert good["spearman"].value > 0.8 and good["spearman"].low > 0.5
    assert floor["spearman"].value == 0.0
    assert floor["precision@1"].value == pytest.approx(1 / 6)
    assert good["precision@1"].value > 0.5
    # the segments hold the 3 largest |truth| units: more mass than their token share
    assert good["segment_mass"].value > good["segment_tokens"].value == pytest.approx(0.5)
    assert good["spearman"].groups == 4 and good["spearman"].trajectories == 12


def test_mean_weight_per_outcome_sign_sees_what_rankings_cannot() -> None:
    """Scaling each trajectory's credit by a sign-dependent factor (GEAR's degenerate segment:
    W = 0.5 on a success, 1.5 on a failure) leaves every ranking score as it was; the mean
    weight per sign shows it, token-weighted over trajectories, GRPO's being 1 on both."""
    rng = np.random.default_rng(1)
    units, uniform, skewed = [], [], []
    for i in range(8):
        length = 3 + i % 3
        outcome = 1.5 if i % 4 == 0 else -0.5  # one success per group of four
        units.append(TrajectoryUnits(group=i // 4, truth=rng.normal(size=length),
                                     truth_se=np.full(length, 0.1), outcome=outcome,
                                     tokens=np.full(length, 2.0)))
        shape = rng.uniform(0.5, 1.5, size=length)
        uniform.append(np.full(length, 2.0 * outcome))  # GRPO: A_i on each of 2 tokens a unit
        skewed.append(shape * (0.5 if outcome > 0 else 1.5) * 2.0 * outcome)
    floor = score_estimate(units, uniform, ks=(1,), resamples=200)
    assert floor["weight_pos"].value == pytest.approx(1.0)
    assert floor["weight_neg"].value == pytest.approx(1.0)
    assert floor["weight_pos"].trajectories == 2 and floor["weight_neg"].trajectories == 6
    scaled = score_estimate(units, [u * (3.0 if i % 4 else 0.2) for i, u in enumerate(skewed)],
                            ks=(1,), resamples=200)
    plain = score_estimate(units, skewed, ks=(1,), resamples=200)
    assert scaled["spearman"].value == pytest.approx(plain["spearman"].value)  # blind to it
    expected = {
        name: sum(float(np.sum(e)) / u.outcome for u, e in zip(units, skewed, strict=True)
                  if u.outcome * sign > 0)
        / sum(float(u.tokens.sum()) for u in units if u.outcome * sign > 0)
        for name, sign in (("weight_pos", 1), ("weight_neg", -1))}
    assert plain["weight_pos"].value == pytest.approx(expected["weight_pos"])
    assert plain["weight_neg"].value == pytest.approx(expected["weight_neg"])
    assert plain["weight_pos"].value < 0.8 < 1.2 < plain["weight_neg"].value
    assert "weight_pos" not in score_estimate(units, uniform, weights=False, resamples=10)


# ------------------------------------------------------------------ (a) decided at one token
def test_task_decided_at_one_token(tmp_path: Path) -> None:
    config = load_config(None, [*SMALL, "rollout.max_new_tokens=8"])
    model, tokenizer = _tiny()
    check = CreditCheckConfig(groups=4, per_group=2, continuations=32, replicates=1,
                              estimators=["grpo"], bootstrap=200, progress=False,
                              plot_trajectories=2, seed=1)
    result = credit_check(config, check, tmp_path / "cc", model=model, tokenizer=tokenizer,
                          task=first_letter_task())
    trajectories = result.data["trajectories"]
    assert len(trajectories) >= 4
    units, oracle, uniform, argmax_hits, decided = [], [], [], 0, 0
    for traj in trajectories:
        tokens, mc = traj["tokens"], np.array(traj["mc_advantage"])
        letters = [i for i, t in enumerate(tokens) if t.isascii() and t.isalpha()]
        credit = np.zeros(len(tokens))
        if letters:
            decision = letters[0]
            decided += 1
            # nothing after the deciding token changes the reward: the truth is exactly 0 there
            assert np.all(mc[decision + 1:] == 0.0)
            argmax_hits += int(np.argmax(np.abs(mc)) == decision)
            credit[decision] = traj["advantage"]
        units.append(TrajectoryUnits(group=traj["group"], truth=mc,
                                     truth_se=np.zeros(len(mc)), outcome=traj["advantage"],
                                     tokens=np.ones(len(mc))))
        oracle.append(credit)
        uniform.append(np.array(traj["advantages"]["grpo"]))
    assert decided >= 3 and argmax_hits >= 0.75 * decided
    good = score_estimate(units, oracle, ks=(1,), resamples=200)
    floor = score_estimate(units, uniform, ks=(1,), resamples=200)
    assert floor["spearman"].value == 0.0  # GRPO: uniform credit
    assert good["spearman"].value > floor["spearman"].value + 0.3
    assert good["precision@1"].value > floor["precision@1"].value + 0.3
    grpo = result.data["scores"]["rows"][0]
    assert grpo["label"] == "grpo" and grpo["floor"]
    assert grpo["scores"]["first"]["spearman"]["value"] == 0.0
    assert result.plot is not None and result.plot.read_bytes()[:4] == b"\x89PNG"
    assert "grpo (floor: uniform credit)" in result.markdown.read_text()


def test_monte_carlo_estimators_are_scored_on_their_own_continuations(tmp_path: Path) -> None:
    """On the task decided at one token, SPO-chain cut before every policy token (no mask, no
    whitening) credits each token with an independent Monte-Carlo estimate of its advantage
    (``monte_carlo_extras``, its own random stream): it agrees with the truth far above the
    uniform floor; VinePPO, whose only step here is the whole response, is the floor's rank."""
    config = load_config(None, [*SMALL, "rollout.max_new_tokens=8"])
    model, tokenizer = _tiny()
    per_token = {"cut_interval": 1, "prob_threshold": 1.0, "prob_mask": False,
                 "whiten": False, "mc_samples": 32}
    check = CreditCheckConfig(groups=4, per_group=2, continuations=32, replicates=1,
                              estimators=["grpo", "vineppo"], bootstrap=200, progress=False,
                              variants={"spo_tokens": ("spo_chain", per_token)}, seed=1)
    result = credit_check(config, check, tmp_path / "cc", model=model, tokenizer=tokenizer,
                          task=first_letter_task())
    rows = {r["label"]: r["scores"]["first"] for r in result.data["scores"]["rows"]}
    assert set(rows) == {"grpo", "vineppo", "spo_tokens"}
    assert rows["spo_tokens"]["spearman"]["value"] > rows["grpo"]["spearman"]["value"] + 0.3
    assert rows["spo_tokens"]["precision@1"]["value"] > rows["grpo"]["precision@1"]["value"] + 0.3
    assert rows["vineppo"]["spearman"]["value"] == rows["grpo"]["spearman"]["value"]
    for traj in result.data["trajectories"]:  # independent draws: not the truth itself
        assert traj["advantages"]["spo_tokens"] != traj["mc_advantage"]


def test_monte_carlo_rows_values_are_kept_and_reused(tmp_path: Path) -> None:
    """The Monte-Carlo rows' own values are appended to mc_rows.jsonl batch by batch; a rerun
    after a kill (the last batch lost, half a line written) draws only what is missing and
    scores exactly as the uninterrupted check."""
    config = load_config(None, [*SMALL, "rollout.max_new_tokens=6",
                                "rollout.prompts_per_step=2"])
    per_token = {"cut_interval": 1, "prob_threshold": 1.0, "mc_samples": 4}

    def run(out: Path):
        check = CreditCheckConfig(groups=4, per_group=1, continuations=4, replicates=1,
                                  estimators=["grpo", "vineppo"], bootstrap=50, progress=False,
                                  variants={"spo_tokens": ("spo_chain", per_token)}, seed=2)
        model, tokenizer = _tiny()
        return credit_check(config, check, out, model=model, tokenizer=tokenizer,
                            task=first_letter_task())

    whole = run(tmp_path / "cc")
    saved = (tmp_path / "cc" / "mc_rows.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in saved]
    # two rows (vineppo, spo_tokens) x two batches of 2 prompts
    assert sorted((r["label"], r["batch"]) for r in records) == [
        ("spo_tokens", 0), ("spo_tokens", 1), ("vineppo", 0), ("vineppo", 1)]
    assert all(len(r["extras"]["mc_values"]) == 2 * config.rollout.samples_per_prompt
               for r in records)
    (tmp_path / "cc" / "mc_rows.jsonl").write_text(
        "\n".join(saved[:-1]) + "\n" + saved[-1][:len(saved[-1]) // 2])
    with pytest.warns(UserWarning, match="half-written last line"):
        again = run(tmp_path / "cc")
    assert again.data["scores"] == whole.data["scores"]
    assert again.data["trajectories"] == whole.data["trajectories"]
    assert (tmp_path / "cc" / "mc_rows.jsonl").read_text().splitlines() == saved


def test_a_truth_at_its_noise_floor_is_said_so() -> None:
    """The report says when the noise ceiling's interval reaches 0 (no estimator can be told
    from noise), on a committed check's own data, and not when the ceiling is clear."""
    from gear_rl.credit_check.output import format_table

    path = Path(__file__).resolve().parents[1] / "results" / "credit_check" / \
        "products_first_init" / "credit_check.json"
    data = json.loads(path.read_text())
    assert data["scores"]["ceiling"]["spearman"]["low"] > 0.5
    assert "noise floor" not in format_table(data)
    data["scores"]["ceiling"]["spearman"].update(value=0.1, low=-0.06, high=0.27)
    assert ("**The truth is at its noise floor here**: one replicate's ranking agrees with the "
            "other's by +0.100 [-0.06, +0.27] (Spearman)" in format_table(data))


# ------------------------------------------------------------------ (c) bad input
def test_bad_input_is_refused_clearly(tmp_path: Path) -> None:
    config = load_config(None, SMALL)
    with pytest.raises(ValueError, match=r"no config.yaml"):
        run_check_config(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: tiny-random\n")
    with pytest.raises(ValueError, match="no intact checkpoint"):
        run_check_config(run)
    problems = _problems(4)
    game = Task(name="game", train=problems[:2], eval=problems[2:], scorer=lambda p, t: 0.0,
                extract=lambda t: t, env=EnvSpec(make=lambda: None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"environment task, but problem 'p0' \(and 3 more\) "
                                         r"has no metadata\['env_seed'\]"):
        check_task(game)
    check_task(letter_game_task())
    check_task(Task(name="tools", train=problems[:2], eval=problems[2:],
                    scorer=lambda p, t: 0.0, extract=lambda t: t, agent=AgentSpec()))
    blind = Task(name="blind", train=problems[:2], eval=problems[2:],
                 scorer=None, extract=lambda t: t)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has no scorer"):
        check_task(blind)
    with pytest.raises(ValueError, match="has no scorer"):
        credit_check(config, CreditCheckConfig(progress=False), tmp_path / "x",
                     model=_tiny()[0], tokenizer=build_tiny_tokenizer(), task=blind)
    for name, why in (("gigpo", "multi-turn"), ("opsd", "uses_reward=False")):
        with pytest.raises(ValueError, match=f"estimator '{name}' cannot be scored.*{why}"):
            plan_rows(CreditCheckConfig(estimators=[name]), config)
    with pytest.raises(ValueError, match=r"variant 'steps'.*multi-turn"):
        plan_rows(CreditCheckConfig(variants={"steps": "turn_level"}), config)
    with pytest.raises(ValueError, match=r"variant.bad.signals: unknown key"):
        plan_rows(CreditCheckConfig(variants={"bad": ("gear", {}, {"temperature": 2})}),
                  config)
    with pytest.raises(ValueError, match=r"variant.k.signals.divergence must be one of"):
        plan_rows(CreditCheckConfig(variants={"k": ("gear", {}, {"divergence": "k9"})}),
                  config)
    with pytest.raises(ValueError, match=r"variant.g.credit: .*no config field"):
        plan_rows(CreditCheckConfig(variants={"g": ("gear", {"lambda": 1})}), config)
    with pytest.raises(ValueError, match="unknown estimator"):
        plan_rows(CreditCheckConfig(estimators=["nope"]), config)
    rows, skipped = plan_rows(CreditCheckConfig(), config)
    assert {"grpo", "gear", "rlsd"} <= {r.label for r in rows}
    assert "gigpo" in skipped and "opsd" in skipped
    with pytest.raises(ValueError, match="not empty and holds no credit check"):
        (tmp_path / "busy").mkdir()
        (tmp_path / "busy" / "notes.txt").write_text("mine")
        credit_check(config, CreditCheckConfig(groups=2, progress=False), tmp_path / "busy",
                     model=_tiny()[0], tokenizer=build_tiny_tokenizer(),
                     task=first_letter_task())


# ------------------------------------------------------------------ (d) resume
def test_resume_after_an_interruption_matches_an_uninterrupted_check(tmp_path: Path) -> None:
    config = load_config(None, SMALL)
    task = first_letter_task()

    def run(out: Path, **overrides):
        settings = {"groups": 2, "per_group": 2, "continuations": 2, "bootstrap": 50,
                    "estimators": ["grpo"], "progress": False, "plot_trajectories": 0}
        check = CreditCheckConfig(**{**settings, **overrides})
        model, tokenizer = _tiny()
        return credit_check(config, check, out, model=model, tokenizer=tokenizer, task=task)

    whole = run(tmp_path / "whole")
    assert whole.complete and whole.data["counts"]["truth_done"] >= 3, whole.data["counts"]
    # a budget that stops after the first trajectory, then a kill mid-write
    partial = run(tmp_path / "cut", budget=1)
    assert not partial.complete and partial.data["counts"]["truth_done"] == 1
    values = tmp_path / "cut" / "values.jsonl"
    second = (tmp_path / "whole" / "values.jsonl").read_text().splitlines()[1]
    values.write_text(values.read_text() + second[:len(second) // 2])  # half a line
    with pytest.warns(UserWarning, match="half-written last line"):
        resumed = run(tmp_path / "cut")
    assert resumed.complete
    assert resumed.data["timing"]["truth_tokens_this_session"] < \
        whole.data["timing"]["truth_tokens_this_session"]
    assert resumed.data["scores"] == whole.data["scores"]
    assert resumed.data["trajectories"] == whole.data["trajectories"]
    assert (tmp_path / "cut" / "values.jsonl").read_text() == values.read_text()
    # other settings in the same folder are refused
    with pytest.raises(ValueError, match=r"other settings.*continuations"):
        run(tmp_path / "cut", continuations=4)


# ------------------------------------------------------------------ (e) CLI and report
def _viewer(page: str) -> dict:
    marker = '<script type="application/json" id="report-data">'
    return json.loads(page.split(marker)[1].split("</script>")[0].replace("<\\/", "</"))


def test_cli_end_to_end_and_the_report_viewer(tmp_path: Path, capsys) -> None:
    from gear_rl.cli import main
    from gear_rl.report import build_report

    out = tmp_path / "cc"
    args = ["credit-check", "model=tiny-random", "task=products", "train_size=8",
            "eval.size=2", "rollout.samples_per_prompt=2", "rollout.max_new_tokens=5",
            "groups=2", "per_group=1", "mixed_only=false", "continuations=2",
            "estimators=grpo,gear", "variant.gear_k3.estimator=gear",
            "variant.gear_k3.signals.divergence=k3", "progress=false", "bootstrap=20",
            "every=2", "plot_trajectories=1", f"out={out}"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| grpo (floor: uniform credit) |" in printed and "noise ceiling" in printed
    assert "| gear_k3 (variant of gear) |" in printed
    data = json.loads((out / "credit_check.json").read_text())
    assert [r["label"] for r in data["scores"]["rows"]] == ["grpo", "gear", "gear_k3"]
    assert data["scores"]["rows"][2]["signals"]["divergence"] == "k3"
    assert data["settings"]["every"] == 2 and data["settings"]["checkpoint_step"] == 0
    for traj in data["trajectories"]:
        length = len(traj["tokens"])
        assert traj["boundaries"] == sorted({*range(0, length, 2), length})
    assert (out / "credit_check.png").is_file() and (out / "credit_check.md").is_file()
    # the same command again: every trajectory is recorded, nothing is sampled
    assert main(args) == 0
    again = json.loads((out / "credit_check.json").read_text())
    assert again["timing"]["truth_tokens_this_session"] == 0
    assert again["scores"] == data["scores"]

    # the report of a run whose folder holds this credit check colours by the MC advantage
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: tiny-random\nestimator: gear\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    shutil.copytree(out, run / "credit_check")
    page = build_report(run).html.read_text()
    viewer = _viewer(page)
    assert any(s["key"] == "mc_advantage" and s["available"] for s in viewer["signals"])
    entry = viewer["steps"][-1]
    assert entry["label"] == "credit check (checkpoint step 0)"
    traj = entry["pairs"][0]["pos"]
    assert len(traj["signals"]["mc_advantage"]) == len(traj["tokens"])
    assert traj["signals"]["advantage"] is not None  # the run's estimator, gear
    assert 'id="credit-check-note"' in page
    # a run without a credit check offers no such signal
    shutil.rmtree(run / "credit_check")
    keys = [s["key"] for s in _viewer(build_report(run).html.read_text())["signals"]]
    assert "mc_advantage" not in keys


def test_cli_errors(tmp_path: Path, capsys) -> None:
    from gear_rl.cli import main

    assert main(["credit-check", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000003").mkdir(parents=True)
    (run / "config.yaml").write_text("model: tiny-random\n")
    assert main(["credit-check", str(run)]) == 2
    assert "no intact checkpoint" in capsys.readouterr().err
    (run / "checkpoints" / "step-000003" / "state.pt").write_bytes(b"")
    (run / "checkpoints" / "latest").write_text("step-000003\n")
    assert main(["credit-check", str(run), "rollout.temperature=0.5"]) == 2
    assert "cannot change when checking a run" in capsys.readouterr().err
    assert main(["credit-check", "model=tiny-random", "task=tool-math", "train_size=2",
                 "eval.size=1", "estimators=gigpo", f"out={tmp_path / 'tools'}"]) == 2
    assert "groups steps by environment state" in capsys.readouterr().err
    assert main(["credit-check", "model=tiny-random", "estimators=gigpo"]) == 2
    assert "multi-turn" in capsys.readouterr().err
    assert main(["credit-check", "model=tiny-random", "variant.x.credit.lambda_h=2"]) == 2
    assert "variant.x.estimator" in capsys.readouterr().err
    assert main(["credit-check", "model=tiny-random", "contiuations=4"]) == 2
    assert "unknown config key 'contiuations'" in capsys.readouterr().err
    assert main(["credit-check", "--help"]) == 0
    assert "variant.NAME.signals.KEY" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_on_a_trained_run(tmp_path: Path, capsys) -> None:
    """``gear-rl credit-check RUN_DIR``: the run's config and latest checkpoint, output in
    RUN_DIR/credit_check, which ``gear-rl report`` then shows."""
    from conftest import tiny_trainer
    from gear_rl.cli import main
    from gear_rl.report import build_report

    run_dir = tmp_path / "run"
    tiny_trainer(run_dir, "steps=1", "train_size=12", "eval.size=4",
                 task=first_letter_task()).train()
    capsys.readouterr()
    # the config names products (the trainer was handed a Task object): on a random model
    # every reward is 0, so every group is scored
    assert main(["credit-check", str(run_dir), "groups=2", "per_group=1", "mixed_only=false",
                 "continuations=2", "bootstrap=20", "estimators=grpo,gear",
                 "progress=false"]) == 0
    assert "noise ceiling" in capsys.readouterr().out
    data = json.loads((run_dir / "credit_check" / "credit_check.json").read_text())
    assert data["settings"]["checkpoint_step"] == 1
    assert data["settings"]["checkpoint"].endswith("step-000001")
    viewer = _viewer(build_report(run_dir).html.read_text())
    assert viewer["steps"][-1]["label"] == "credit check (checkpoint step 1)"


# ------------------------------------------------------------------ (f) agent (tool) tasks
def test_episode_values_bookkeeping() -> None:
    """``estimate_episode_values``: V at the end is the episode's own reward; every other
    boundary is the mean of its continuations' rewards, each continued from exactly its prefix;
    how many cuts go into one call changes nothing (one stream per replicate, drawn in order);
    a boundary before an observation token is refused."""
    from gear_rl.mc_values import estimate_episode_values

    response = [5, 6, 7, 8, 9, 10]
    mask = [1, 1, 0, 0, 1, 1]
    turns = [0, 0, 0, 0, 1, 1]
    seen: list[int] = []

    def continue_fn(prefixes, generator):
        seen.extend(len(p.response_ids) for p in prefixes)
        draws = torch.rand(len(prefixes), generator=generator).tolist()
        return [len(p.response_ids) + d for p, d in zip(prefixes, draws, strict=True)], \
            len(prefixes)

    bounds = [0, 1, 4, 5, 6]
    whole = estimate_episode_values(continue_fn, response, mask, turns, 0.25, bounds,
                                    samples=3, seeds=[7, 8])
    assert seen == [b for b in bounds[:-1] for _ in range(3)] * 2
    seen.clear()
    cut = estimate_episode_values(continue_fn, response, mask, turns, 0.25, bounds, samples=3,
                                  seeds=[7, 8], batch_size=3)
    assert cut.rewards == whole.rewards and cut.tokens == whole.tokens == 4 * 3 * 2
    assert whole.terminal == [False, False, False, False, True]
    assert whole.rewards[0][-1] == [0.25] and whole.stderr(0)[-1] == 0.0
    for j, b in enumerate(bounds[:-1]):
        assert all(b <= r < b + 1 for r in whole.rewards[1][j])
    with pytest.raises(ValueError, match="before observation tokens"):
        estimate_episode_values(continue_fn, response, mask, turns, 0.0, [0, 2, 6], samples=1)


def _call_heavy_model() -> tuple[torch.nn.Module, object, Task]:
    """The tiny model with an LM head that favours five characters (``a b 1 +`` and space:
    their rows random, every other row 0), and a Python-tool task whose calls open with
    ``a`` and close with ``b``, so that its episodes really call the tool (the sandbox answers
    ``1+`` with a SyntaxError, ``1+1`` with nothing) and run several turns. Reward: the last
    turn's text has an even length."""
    from gear_rl.agent import ToolCallFormat

    model, tokenizer = _tiny()
    with torch.no_grad():
        head = torch.zeros_like(model.lm_head.weight)
        draw = torch.Generator().manual_seed(3)
        for char in "ab1+ ":
            [token] = tokenizer.encode(char, add_special_tokens=False)
            head[token] = torch.randn(head.shape[1], generator=draw) * 0.6
    model.lm_head.weight = torch.nn.Parameter(head)
    fmt = ToolCallFormat(kind="python", open_tag="a", close_tag="b",
                         observation_template="\n[out]{output}[/out]\n")
    problems = _problems(6)
    task = Task(name="call-heavy", train=problems[:4], eval=problems[4:],
                scorer=lambda problem, text: float(len(text) % 2 == 0),
                extract=lambda text: text,
                agent=AgentSpec(tool="python", tool_format=fmt,  # type: ignore[arg-type]
                                max_turns=3, score_text="final", turn_reward_tool=0.2,
                                turn_reward_answer=0.5))
    return model, tokenizer, task


def test_agent_task_episodes_continue_from_inside_turns(tmp_path: Path) -> None:
    """The credit check on an agent task with the real tiny model and the real sandbox:
    episodes with tool calls and observations; the truth's boundaries sit before policy
    tokens only (never inside an observation), some of them in later turns; V at the end is
    the episode's reward; the continuations finish the episode through more tool calls; the
    scores and the outputs come out; a check cut short and resumed gives the same numbers."""
    model, tokenizer, task = _call_heavy_model()
    config = load_config(None, [*SMALL, "agent.max_new_tokens_per_turn=12",
                                "agent.max_response_tokens=72", "agent.sandbox_workers=2"])

    def run(out: Path, **overrides):
        settings = {"groups": 2, "per_group": 2, "continuations": 3, "bootstrap": 50,
                    "estimators": ["grpo", "gear", "turn_level"], "progress": False,
                    "plot_trajectories": 1,
                    "mixed_only": False, "every": 2}
        check = CreditCheckConfig(**{**settings, **overrides})
        return credit_check(config, check, out, model=model, tokenizer=tokenizer, task=task)

    whole = run(tmp_path / "whole")
    state = json.loads((tmp_path / "whole" / "trajectories.json").read_text())
    rows = {r["row"]: r for r in state["rows"]}
    assert all("policy_mask" in r and "turn_ids" in r for r in rows.values())
    assert any(0 in r["policy_mask"] for r in rows.values()), "no episode called the tool"
    # turn_level reads the episodes' turns and the task's turn rewards, one per turn (their
    # values on real episodes: tests/test_agent.py)
    assert all(len(r["step_spans"]) == len(r["step_rewards"]) >= 1 for r in rows.values())
    assert any(len(r["step_spans"]) > 1 for r in rows.values())
    values = [json.loads(line) for line in
              (tmp_path / "whole" / "values.jsonl").read_text().splitlines()]
    assert len(values) == whole.data["counts"]["truth_done"] >= 3
    later_turn = False
    for record in values:
        row = rows[record["row"]]
        mask, length = row["policy_mask"], len(row["response_ids"])
        assert record["boundaries"][-1] == length and record["terminal"][-1]
        assert record["rewards"][0][-1] == [row["reward"]]
        for b in record["boundaries"][:-1]:
            assert mask[b] == 1, (record["row"], b)
            later_turn |= row["turn_ids"][b] > 0
        assert all(len(cut) == 3 for cut, end in zip(record["rewards"][0], record["terminal"],
                                                      strict=True) if not end)
    assert later_turn, "no boundary after an observation"
    assert whole.data["scores"]["rows"][0]["label"] == "grpo"
    assert {"gear", "turn_level"} <= {r["label"] for r in whole.data["scores"]["rows"]}
    with pytest.raises(ValueError, match="groups steps by environment state"):
        plan_rows(CreditCheckConfig(estimators=["gigpo"]), config, task)
    assert "the rest of the episode under the agent limits" in whole.markdown.read_text()
    partial = run(tmp_path / "cut", budget=1)
    assert not partial.complete
    resumed = run(tmp_path / "cut")
    assert resumed.data["scores"] == whole.data["scores"]

    def truth(folder: str) -> list[dict]:
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
                for line in (tmp_path / folder / "values.jsonl").read_text().splitlines()]

    assert truth("cut") == truth("whole")


# ------------------------------------------------------------------ (g) environment tasks
class LetterGame(TextEnv):
    """A deterministic guessing game: the level (its seed) picks six letters, and a turn whose
    text holds one of them solves it; each failed turn costs 0.1 (shaping) and shows how many
    turns have failed. Its state is that count, so the trajectories of one level meet in the
    same states (what GiGPO groups on)."""

    def __init__(self) -> None:
        self.letters, self.failed = "", 0

    def reset(self, seed: int) -> str:
        self.letters = "".join(random_letters(seed))
        self.failed = 0
        return f"Write one of the secret letters (level {seed})."

    def step(self, action_text: str) -> StepResult:
        if any(c in self.letters for c in action_text):
            return StepResult("Solved.", 1.0, True, {"success": True, "shaping_reward": 0.0})
        self.failed += 1
        return StepResult(f"No. {self.failed} wrong.", -0.1, self.failed >= 5,
                          {"success": False, "shaping_reward": -0.1})

    @property
    def state_key(self) -> int:
        return self.failed


def random_letters(seed: int) -> list[str]:
    import random

    return random.Random(seed).sample("abcdefghijklmnopqrstuvwxyz", 6)


def letter_game_task() -> Task:
    problems = [Problem(id=f"level{i}", prompt=[{"role": "user", "content": f"Level {i}."}],
                        answer="", reference=" or ".join(random_letters(100 + i)),
                        reference_kind="solution", metadata={"env_seed": 100 + i})
                for i in range(6)]

    def not_scored(problem: Problem, text: str) -> float:
        raise RuntimeError("scored by the game")

    return Task(name="letter-game", train=problems[:4], eval=problems[4:], scorer=not_scored,
                extract=lambda text: None, env=EnvSpec(make=LetterGame, max_turns=3))


def test_environment_task_episodes_are_continued_by_replaying_their_turns(
        tmp_path: Path) -> None:
    """The credit check on an environment task with the real tiny model: multi-turn episodes
    with observations; every step-level estimator (GiGPO's state groups included) is scored;
    boundaries sit before policy tokens only, some in later turns; V at the end is the
    episode's reward (the game's solve); the continuations replay the prefix's turns in the
    game (a boundary after a failed turn continues in the state that turn left); a check cut
    short and resumed gives the same numbers."""
    task = letter_game_task()
    config = load_config(None, [*SMALL, "agent.max_new_tokens_per_turn=6",
                                "agent.max_response_tokens=80"])
    rows, skipped = plan_rows(CreditCheckConfig(), config, task)
    labels = {r.label for r in rows}
    assert {"gigpo", "gagpo", "gated_bepo", "gear_steps", "turn_level", "gear"} <= labels
    assert "gigpo" not in skipped

    def run(out: Path, **overrides):
        settings = {"groups": 3, "per_group": 2, "continuations": 6, "bootstrap": 50,
                    "estimators": ["grpo", "gear", "gigpo", "gear_steps", "turn_level"],
                    "progress": False, "plot_trajectories": 1, "mixed_only": False}
        check = CreditCheckConfig(**{**settings, **overrides})
        model, tokenizer = _tiny()
        return credit_check(config, check, out, model=model, tokenizer=tokenizer, task=task)

    whole = run(tmp_path / "whole")
    state = json.loads((tmp_path / "whole" / "trajectories.json").read_text())
    rows_by = {r["row"]: r for r in state["rows"]}
    assert {r["reward"] for r in rows_by.values()} == {0.0, 1.0}, "no mixed outcomes"
    assert all(len(r["state_keys"]) == len(r["step_spans"]) == len(r["step_rewards"])
               for r in rows_by.values())
    assert any(len(r["step_spans"]) > 1 for r in rows_by.values())
    values = [json.loads(line) for line in
              (tmp_path / "whole" / "values.jsonl").read_text().splitlines()]
    assert len(values) == whole.data["counts"]["truth_done"] >= 4
    later_turn, mixed_value = False, False
    for record in values:
        row = rows_by[record["row"]]
        assert record["boundaries"][-1] == len(row["response_ids"]) and record["terminal"][-1]
        assert record["rewards"][0][-1] == [row["reward"]]
        for b, cut in zip(record["boundaries"][:-1], record["rewards"][0][:-1], strict=True):
            assert row["policy_mask"][b] == 1, (record["row"], b)
            later_turn |= row["turn_ids"][b] > 0
            mixed_value |= 0 < sum(cut) < len(cut)
    assert later_turn and mixed_value
    scored = {r["label"] for r in whole.data["scores"]["rows"]}
    assert {"gigpo", "gear_steps", "turn_level"} <= scored
    partial = run(tmp_path / "cut", budget=1)
    assert not partial.complete
    resumed = run(tmp_path / "cut")
    assert resumed.data["scores"] == whole.data["scores"]
    # boundaries=turns: V at the start of every policy turn, a unit is a turn and its observation
    turns = run(tmp_path / "turns", boundaries="turns", continuations=2, per_group=1)
    for line in (tmp_path / "turns" / "values.jsonl").read_text().splitlines():
        record = json.loads(line)
        row = rows_by[record["row"]]
        starts = [start for start, _ in row["step_spans"]]
        assert record["boundaries"] == sorted({0, *starts, len(row["response_ids"])})
    assert turns.data["counts"]["truth_done"] >= 2
    with pytest.raises(ValueError, match="boundaries=turns needs a multi-turn task"):
        credit_check(config, CreditCheckConfig(boundaries="turns", progress=False),
                     tmp_path / "single", model=_tiny()[0], tokenizer=build_tiny_tokenizer(),
                     task=first_letter_task())
    with pytest.raises(ValueError, match="every applies to boundaries=tokens"):
        CreditCheckConfig(boundaries="turns", every=2).validate()
