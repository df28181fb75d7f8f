"""gear-rl's estimators inside verl 0.9.1: through verl's own ``compute_advantage`` with a real
``DataProto``, the plugin entry point after a plain ``import verl``, and the teacher inputs.

The trainer-mode tests need verl's v1 trainer, which imports hydra (antlr 4.9, clashing with this
env's antlr 4.13): they are in test_integration_verl_trainer.py and run in .venv/verl-cpu.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.workers.utils.padding import response_from_nested  # noqa: E402

from gear_rl.credit import (  # noqa: E402
    CreditBatch,
    GEARConfig,
    credit_diagnostics,
    gear_advantages,
    get_estimator,
    grpo_advantages,
)
from gear_rl.integrations.teacher_inputs import (  # noqa: E402
    APPENDED,
    NO_REFERENCE,
    RERENDERED,
    SPLICED_HEAD,
    SPLICED_TAIL,
    build_teacher_rows,
    lookup_reference,
    response_logprobs_from_sequence,
    splice_teacher_prompt,
    teacher_prompt_ids,
)
from gear_rl.integrations.verl import (  # noqa: E402
    VerlSignals,
    divergence_from_logprobs,
    provide_signals,
    settings_from_algorithm,
    signals_from_logprobs,
    verl_estimator_names,
    verl_name,
)


def _batch(seed: int = 0, groups: int = 6, max_len: int = 12):
    """A verl-style batch: uids with groups of 2-5, ragged right-padded responses, outcome reward
    on the last response token, and per-token signals."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 6, (groups,), generator=gen).tolist()
    uids = np.array([f"uid{g}" for g, n in enumerate(sizes) for _ in range(n)], dtype=object)
    batch = len(uids)
    lengths = torch.randint(1, max_len + 1, (batch,), generator=gen)
    mask = (torch.arange(max_len)[None, :] < lengths[:, None]).long()
    mask[0, 0] = 0 if lengths[0] > 1 else 1  # an observation token in row 0
    scores = torch.randint(0, 3, (batch,), generator=gen).float()
    rewards = torch.zeros(batch, max_len)
    rewards[torch.arange(batch), lengths - 1] = scores
    student = -torch.rand(batch, max_len, generator=gen) * 3
    teacher = -torch.rand(batch, max_len, generator=gen) * 3
    entropy = torch.rand(batch, max_len, generator=gen) * 2
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": uids},
    )
    return data, scores, uids, mask, student, teacher, entropy


def test_plugin_names_are_registered_in_verl() -> None:
    for name in verl_estimator_names():
        assert verl_name(name) in core_algos.ADV_ESTIMATOR_REGISTRY
    assert verl_name("grpo") == "gear_rl_grpo"
    assert core_algos.get_adv_estimator_fn("grpo") is core_algos.compute_grpo_outcome_advantage


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_through_compute_advantage_equals_verls_own(seed: int) -> None:
    data, *_ = _batch(seed)
    ours = compute_advantage(data, "gear_rl_grpo", config=OmegaConf.create({}))
    ours = ours.batch["advantages"].clone()
    theirs = compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=True)
    torch.testing.assert_close(ours, theirs.batch["advantages"], rtol=1e-5, atol=1e-6)
    assert ours.abs().sum() > 0


def test_dr_grpo_equals_verls_grpo_without_std() -> None:
    data, *_ = _batch(3)
    ours = compute_advantage(data, "dr_grpo", config=None).batch["advantages"].clone()
    theirs = compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=False).batch["advantages"]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_group_of_one_gets_zero_not_its_raw_score() -> None:
    rewards = torch.tensor([[0.0, 2.0], [1.0, 0.0], [0.0, 3.0]])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards,
                                        "response_mask": torch.ones(3, 2, dtype=torch.long)},
                               non_tensors={"uid": np.array(["a", "a", "b"], dtype=object)})
    ours = compute_advantage(data, "gear_rl_grpo", config=None).batch["advantages"]
    assert torch.all(ours[2] == 0)


def _algorithm(estimator: str, **gear):
    return OmegaConf.create({"adv_estimator": estimator, "norm_adv_by_std_in_grpo": True,
                             "gear": gear})


def test_gear_through_compute_advantage_equals_credit_core() -> None:
    data, scores, uids, mask, student, teacher, entropy = _batch(4)
    algorithm = _algorithm("gear", lambda_kl=0.2, lambda_h=1.2, alpha=0.8, divergence="k3")
    signals = signals_from_logprobs(mask, entropy=entropy, student_logprobs=student,
                                    teacher_logprobs=teacher, divergence="k3")
    with provide_signals(signals):
        out = compute_advantage(data, "gear", config=algorithm).batch["advantages"]
    divergence = divergence_from_logprobs(student, teacher, mask, "k3")
    config = GEARConfig(lambda_kl=0.2, lambda_h=1.2, alpha=0.8)
    expected = gear_advantages(grpo_advantages(scores, list(uids)), divergence, entropy, mask,
                               config)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    assert torch.all(out[mask == 0] == 0)
    # The metrics are gear_rl.credit's diagnostics, under gear/.
    metrics = signals.metrics
    batch = CreditBatch(rewards=scores, group_ids=list(uids), mask=mask, divergence=divergence,
                        entropy=entropy)
    diagnostics = credit_diagnostics(get_estimator("gear"), config, batch, expected)
    assert set(metrics) == {f"gear/{name}" for name in diagnostics} >= {
        "gear/adv_abs_mean", "gear/weight_mean_pos", "gear/weight_mean_neg",
        "gear/divergence_mean", "gear/segment_frac", "gear/segments_per_response"}
    for name, value in diagnostics.items():
        assert metrics[f"gear/{name}"] == pytest.approx(value, rel=1e-6)
    # alpha=0.8: W = 0.8 w + 0.6, so both means lie in [0.6, 1.4].
    assert 0.6 <= metrics["gear/weight_mean_pos"] <= 1.4


@pytest.mark.parametrize("name", ["gear_token_kl", "gear_kl_only", "gear_entropy_only",
                                  "gear_entropy_window", "gear_signed", "top_entropy", "rlsd"])
def test_every_signal_estimator_runs_through_compute_advantage(name: str) -> None:
    data, scores, uids, mask, student, teacher, entropy = _batch(5)
    signals = signals_from_logprobs(mask, entropy=entropy, student_logprobs=student,
                                    teacher_logprobs=teacher)
    with provide_signals(signals):
        out = compute_advantage(data, name, config=_algorithm(name)).batch["advantages"]
    batch = CreditBatch(rewards=scores, group_ids=list(uids), mask=mask,
                        divergence=signals.divergence, entropy=entropy,
                        student_logprobs=student, teacher_logprobs=teacher)
    torch.testing.assert_close(out, get_estimator(name)(batch).float(), rtol=0, atol=1e-6)


def test_signal_estimator_without_signals_says_which_trainer_mode() -> None:
    data, *_ = _batch(6)
    with pytest.raises(ValueError, match="trainer_mode=gear"):
        compute_advantage(data, "gear", config=_algorithm("gear"))


def test_signals_from_another_batch_are_refused() -> None:
    data, _, _, mask, student, teacher, entropy = _batch(7)
    other = signals_from_logprobs(mask[:, :-1], entropy=entropy[:, :-1],
                                  student_logprobs=student[:, :-1],
                                  teacher_logprobs=teacher[:, :-1])
    with provide_signals(other), pytest.raises(ValueError, match="another batch"):
        compute_advantage(data, "gear", config=_algorithm("gear"))
    widened = VerlSignals(response_mask=torch.zeros_like(mask), entropy=entropy,
                          divergence=torch.zeros_like(entropy))
    with provide_signals(widened), pytest.raises(ValueError, match="row order"):
        compute_advantage(data, "gear", config=_algorithm("gear"))


def test_settings_parse_and_reject_bad_keys() -> None:
    settings = settings_from_algorithm(_algorithm("gear", lambda_kl=0.3, placement="system",
                                                  rho=0.5))
    assert settings.config.lambda_kl == 0.3 and settings.divergence == "k3"
    assert settings.teacher_prompt.placement == "system" and settings.needs_teacher
    assert not settings_from_algorithm(_algorithm("top_entropy")).needs_teacher
    # GEAR's default mean_preserving (issue 39) reaches verl; the paper preset turns it off
    assert settings.config.mean_preserving is True
    assert settings_from_algorithm(_algorithm("gear", preset="paper")).config.mean_preserving \
        is False
    # verl's norm_adv_by_std_in_grpo carries over where the estimator does not pin it.
    off = OmegaConf.create({"adv_estimator": "gear", "norm_adv_by_std_in_grpo": False})
    assert settings_from_algorithm(off).config.norm_by_std is False
    with pytest.raises(ValueError, match="unknown key"):
        settings_from_algorithm(_algorithm("gear", lambda_kk=0.3))
    with pytest.raises(ValueError, match="divergence"):
        settings_from_algorithm(_algorithm("gear", divergence="full"))
    with pytest.raises(ValueError, match="pins segmentation"):
        settings_from_algorithm(_algorithm("gear_kl_only", segmentation="none"))
    with pytest.raises(ValueError, match="not a gear-rl estimator"):
        settings_from_algorithm(_algorithm("gae"))


def test_run_log_settings_default_on_and_checked() -> None:
    settings = settings_from_algorithm(_algorithm("gear"))
    assert settings.log_samples_per_step == 4 and settings.run_log_dir is None
    chosen = settings_from_algorithm(_algorithm("gear", log_samples_per_step=0,
                                                run_log_dir="/tmp/x"))
    assert chosen.log_samples_per_step == 0 and chosen.run_log_dir == "/tmp/x"
    for bad in (-1, True, "4"):
        with pytest.raises(ValueError, match="log_samples_per_step"):
            settings_from_algorithm(_algorithm("gear", log_samples_per_step=bad))
    with pytest.raises(ValueError, match="run_log_dir"):
        settings_from_algorithm(_algorithm("gear", run_log_dir=""))


def test_k3_and_k1_from_sampled_logprobs() -> None:
    student = torch.tensor([[-1.0, -2.0, -0.5, 7.0]])
    teacher = torch.tensor([[-1.0, -1.0, -3.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 0]])
    k3 = divergence_from_logprobs(student, teacher, mask, "k3")
    r = torch.exp(torch.tensor([0.0, 1.0, -2.5]))
    torch.testing.assert_close(k3[0, :3], r - 1 - torch.log(r))
    assert k3[0, 3] == 0 and torch.all(k3 >= 0)
    k1 = divergence_from_logprobs(student, teacher, mask, "k1")
    torch.testing.assert_close(k1[0], torch.tensor([0.0, -1.0, 2.5, 0.0]))
    with pytest.raises(ValueError, match="teacher_logprobs"):
        divergence_from_logprobs(student, teacher, torch.ones(1, 4), "k3")
    # Extreme log ratios (+-200, and 90, past float32's exp range) stay finite.
    far = divergence_from_logprobs(torch.tensor([[-200.0, 0.0, -90.0]]),
                                   torch.tensor([[0.0, -200.0, 0.0]]), torch.ones(1, 3), "k3")
    assert torch.isfinite(far).all() and far[0, 1] == 199.0


def test_signal_pass_and_verl_adapter_compute_the_same_k1_k3(tiny) -> None:
    """One implementation: the signal pass's k1/k3 are the verl adapter's on the same
    log-probs, bit for bit, ordinary and extreme (+-200) log ratios alike."""
    from gear_rl.signals import token_signals
    from gear_rl.signals.divergence import _chunk_signals

    model, _ = tiny
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    prompts, teachers, responses = [ids(3), ids(5)], [ids(6), ids(2)], [ids(4), ids(7)]
    head = torch.nn.Linear(1, 2, bias=False)  # logits (h, -h): log p(0) ~ -200 at h = -100
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0], [-1.0]]))
    for estimator in ("k1", "k3"):
        signals = token_signals(model, prompts, teachers, responses, estimator=estimator,
                                response_mask=[[1, 0, 1, 1], [1] * 7])
        ours = divergence_from_logprobs(signals.student_logprobs, signals.teacher_logprobs,
                                        signals.mask, estimator)
        assert torch.equal(ours, signals.divergence)
        student, teacher, _, divergence = _chunk_signals(
            head, torch.tensor([[-100.0], [100.0], [0.5]]),
            torch.tensor([[100.0], [-100.0], [-0.2]]), torch.zeros(3, dtype=torch.long), 1.0,
            estimator, None)
        ours = divergence_from_logprobs(student[None], teacher[None], torch.ones(1, 3), estimator)
        assert torch.isfinite(divergence).all()
        assert torch.equal(ours[0], divergence)


# --------------------------------------------------------------------------- teacher inputs
def test_splice_keeps_the_stored_prompt_outside_the_hint() -> None:
    rendered_student = [1, 2, 3, 9, 8]          # ... question | end-of-turn, generation prompt
    rendered_teacher = [1, 2, 3, 50, 51, 9, 8]  # hint before end-of-turn
    # Exact re-rendering: the teacher prompt is the hinted rendering.
    assert splice_teacher_prompt(rendered_student, rendered_student, rendered_teacher) == (
        rendered_teacher, SPLICED_HEAD)
    # The stored prompt has tool schemas up front the re-rendering lacks: only the tail changes.
    stored = [7, 7, 1, 2, 3, 9, 8]
    assert splice_teacher_prompt(stored, rendered_student, rendered_teacher) == (
        [7, 7, 1, 2, 3, 50, 51, 9, 8], SPLICED_TAIL)
    # A later agent output: the stored prompt is the first one plus more turns.
    later = [1, 2, 3, 9, 8, 30, 31, 9, 8]
    assert splice_teacher_prompt(later, rendered_student, rendered_teacher) == (
        [1, 2, 3, 50, 51, 9, 8, 30, 31, 9, 8], SPLICED_HEAD)
    assert splice_teacher_prompt([5, 5], rendered_student, rendered_teacher) == (
        rendered_teacher, RERENDERED)


def test_lookup_reference() -> None:
    row = {"reward_model": {"ground_truth": " 42 ", "style": "rule"}}
    assert lookup_reference(row, "reward_model.ground_truth") == " 42 "
    assert lookup_reference(row, "reward_model.missing") is None
    assert lookup_reference({"reward_model": {"ground_truth": ""}},
                            "reward_model.ground_truth") is None
    calls = {"extra_info": {"gold": [{"name": "f", "arguments": {"x": 1}}]}}
    assert lookup_reference(calls, "extra_info.gold") == '[{"name": "f", "arguments": {"x": 1}}]'


@pytest.fixture(scope="module")
def tiny():
    from gear_rl.models import build_tiny_tokenizer, tiny_random_model
    return tiny_random_model("qwen3", seed=3), build_tiny_tokenizer()


def test_teacher_rows_score_like_the_signal_pass(tiny) -> None:
    """Full forwards over "teacher prompt + response", cut with verl's own response_from_nested,
    give the teacher log-probs of gear_rl.signals (an independent implementation)."""
    from gear_rl.signals import response_logprobs
    from gear_rl.signals import teacher_prompt_ids as signals_teacher_ids

    model, tokenizer = tiny

    def render(messages):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    raw = [[{"role": "user", "content": "2+3?"}], [{"role": "user", "content": "7*6?"}],
           "Plain prompt: 1+1=", [{"role": "user", "content": "no ref"}]]
    refs = ["5", "42", "2", None]
    prompts = [render(raw[0]), [7, 7, *render(raw[1])], encode(raw[2]), render(raw[3])]
    responses = [encode("It is 5."), encode("6*7=42<|im_end|>"), encode(" 2"), encode("hm")]
    masks = [[1] * len(r) for r in responses]
    masks[1][1:3] = [0, 0]  # tool output inside the response
    rows = build_teacher_rows(prompts, responses, masks, raw, refs, render, encode)
    assert rows.how == [SPLICED_HEAD, SPLICED_TAIL, APPENDED, NO_REFERENCE]
    assert rows.fields[0]["prompts"].tolist() == signals_teacher_ids(tokenizer, raw[0], "5")
    assert rows.fields[3]["prompts"].tolist() == prompts[3]
    for field, response in zip(rows.fields, responses, strict=True):
        assert field["responses"].tolist() == response
        assert field["input_ids"].tolist() == field["prompts"].tolist() + response

    # verl's engine contract: entry j of a sequence's log-probs is log p(token j+1 | tokens <= j).
    temperature = 0.7
    per_sequence = []
    with torch.no_grad():
        for field in rows.fields:
            ids = field["input_ids"][None]
            logits = model(input_ids=ids).logits[0].float() / temperature
            logp = torch.log_softmax(logits, -1)
            nxt = torch.roll(ids[0], -1)
            per_sequence.append(logp.gather(-1, nxt[:, None]).squeeze(-1))
    nested = torch.nested.as_nested_tensor(per_sequence, layout=torch.jagged)
    mask_nested = torch.nested.as_nested_tensor([f["response_mask"] for f in rows.fields],
                                                layout=torch.jagged)
    cut = response_from_nested(nested, mask_nested)
    expected = response_logprobs(model, [f["prompts"].tolist() for f in rows.fields], responses,
                                 temperature=temperature)
    for i, response in enumerate(responses):
        torch.testing.assert_close(cut[i], expected.logprobs[i, :len(response)], rtol=0,
                                   atol=1e-5)
        torch.testing.assert_close(
            response_logprobs_from_sequence(per_sequence[i], len(response)), cut[i])


def test_teacher_prompt_ids_rejects_mismatched_rows() -> None:
    with pytest.raises(ValueError, match="references"):
        build_teacher_rows([[1]], [[2]], [[1]], ["x"], [], lambda m: [1], lambda t: [1])
    with pytest.raises(ValueError, match=r"response_masks\[0\]"):
        build_teacher_rows([[1]], [[2, 3]], [[1]], ["x"], ["y"], lambda m: [1], lambda t: [1])
    ids, how = teacher_prompt_ids([1, 2], "text", "ref", lambda m: [], lambda t: [9])
    assert (ids, how) == ([1, 2, 9], APPENDED)


# --------------------------------------------------------------------------- the entry point
_PROBE = textwrap.dedent("""
    import json, sys
    import verl
    from verl.trainer.ppo import core_algos
    names = sorted(k for k, fn in core_algos.ADV_ESTIMATOR_REGISTRY.items()
                   if fn.__module__.startswith("gear_rl."))
    hooked = any(type(f).__name__ == "_RegisterAfterImportHook" for f in sys.meta_path)
    lazy = {"v1_imported": "verl.trainer.ppo.v1" in sys.modules,
            "loops_imported": "verl.experimental.agent_loop.agent_loop" in sys.modules}
    loops = []
    try:  # importing verl's agent loops registers gear-rl's (they need hydra, which the main
        # .venv lacks: there the import fails as it would without gear-rl)
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        loops = sorted(_agent_loop_registry)
    except ImportError as error:
        loops = None if error.name == "hydra" else [repr(error)]
    print(json.dumps({"names": names, "hooked": hooked, "loops": loops, **lazy}))
""")


def _probe(env_extra: dict[str, str]) -> dict:
    import json
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_plain_import_verl_loads_the_plugin_in_a_fresh_process(tmp_path) -> None:
    """Entry points need gear-rl pip-installed (setup_venv.sh does `pip install -e .`). A module
    named in GEAR_RL_PLUGINS registers its estimator too, as in a Ray worker."""
    (tmp_path / "probe_credit_plugin.py").write_text(textwrap.dedent("""
        from gear_rl.credit import OutcomeConfig, register_estimator
        from gear_rl.credit.grpo import broadcast_outcome

        register_estimator("probe_plugin", config=OutcomeConfig)(broadcast_outcome)
    """))
    expected = sorted([*(verl_name(n) for n in verl_estimator_names()), "probe_plugin"])
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    loaded = _probe({"VERL_USE_EXTERNAL_PLUGINS": "auto", "PYTHONPATH": path,
                     "GEAR_RL_PLUGINS": "probe_credit_plugin"})
    assert loaded["names"] == expected
    # the heavy v1 trainer and agent loops stay lazy, and register gear-rl's when imported
    assert loaded["hooked"] and not loaded["v1_imported"] and not loaded["loops_imported"]
    if loaded["loops"] is not None:
        assert "gear_env" in loaded["loops"] and "single_turn_agent" in loaded["loops"]
    # Control: with verl's plugin loading off, nothing of ours is there.
    off = _probe({"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert off["names"] == [] and not off["hooked"]


# ------------------------------------------------------------------ step-level estimators
STEP_ESTIMATORS = ("gigpo", "gagpo", "gated_bepo", "turn_level", "gear_steps")


def _step_extras(mask: torch.Tensor, uids: np.ndarray, seed: int) -> dict:
    """Random step inputs for a verl batch: each row's policy positions cut into 1-3 turns,
    shaping rewards, and state keys drawn from a few per prompt (so states repeat)."""
    gen = torch.Generator().manual_seed(seed)
    spans, rewards, states = [], [], []
    for b in range(mask.shape[0]):
        on = torch.nonzero(mask[b]).flatten().tolist()
        first, last = on[0], on[-1] + 1
        cuts = sorted(set(torch.randint(first + 1, last + 1, (2,), generator=gen).tolist())
                      - {last}) if last - first > 1 else []
        edges = [first, *cuts, last]
        spans.append([(edges[k], edges[k + 1]) for k in range(len(edges) - 1)])
        rewards.append([round(float(r), 2) for r in torch.rand(len(edges) - 1, generator=gen)])
        states.append([f"s{int(torch.randint(0, 3, (1,), generator=gen))}"
                       for _ in range(len(edges) - 1)])
    return {"step_spans": spans, "step_rewards": rewards, "state_keys": states}


@pytest.mark.parametrize("name", STEP_ESTIMATORS)
def test_step_level_estimators_through_compute_advantage_equal_the_registry(name: str) -> None:
    """What the ``gear`` trainer mode hands verl's advantage step for a multi-turn batch (the
    step extras beside the signals) gives exactly the registry's advantages."""
    data, scores, uids, mask, student, teacher, entropy = _batch(5)
    mask[0, 0] = 1  # every row's policy tokens in one block here
    data.batch["response_mask"] = mask
    extras = _step_extras(mask, uids, seed=7)
    estimator = get_estimator(name)
    signals = signals_from_logprobs(mask, entropy=entropy, student_logprobs=student,
                                    teacher_logprobs=teacher, divergence="k3", extras=extras)
    with provide_signals(signals):
        out = compute_advantage(data, verl_name(name),
                                config=_algorithm(verl_name(name))).batch["advantages"]
    values = {need: getattr(signals, need) for need in estimator.needs}
    expected = estimator(CreditBatch(rewards=scores, group_ids=list(uids), mask=mask,
                                     extras=extras, **values),
                         estimator.make_config(norm_by_std=True))
    torch.testing.assert_close(out, expected.float(), rtol=0, atol=0)
    assert float(out.abs().sum()) > 0 and torch.all(out[mask == 0] == 0)


def test_step_level_estimator_without_turns_says_what_to_run() -> None:
    data, _, _, mask, *_ = _batch(6)
    with pytest.raises(ValueError, match="trainer_mode=gear"):  # no signals at all
        compute_advantage(data, "gigpo", config=_algorithm("gigpo"))
    with provide_signals(signals_from_logprobs(mask)), pytest.raises(
            ValueError, match="default_agent_loop=gear_env"):  # signals, but no turn spans
        compute_advantage(data, "gigpo", config=_algorithm("gigpo"))


def test_every_registry_estimator_that_verl_runs_is_registered_there() -> None:
    """Step-level estimators run in verl (through the ``gear`` trainer mode's step inputs);
    Monte-Carlo and self-distillation ones are refused by name."""
    from gear_rl.credit import estimator_names

    runs = set(verl_estimator_names())
    assert set(STEP_ESTIMATORS) <= runs
    for name in estimator_names():
        why = get_estimator(name).engine_limit("verl")
        assert (why is None) == (name in runs), (name, why)


def test_opsd_through_compute_advantage_is_the_sampled_token_distillation() -> None:
    """verl's actor has only the sampled token's log-prob: OPSD runs there as the per-token
    reverse KL's policy-gradient form, ``-(log pi - log pi*)`` on policy tokens, no reward."""
    data, _, _, mask, student, teacher, entropy = _batch(7)
    signals = signals_from_logprobs(mask, entropy=entropy, student_logprobs=student,
                                    teacher_logprobs=teacher, divergence="k3")
    with provide_signals(signals):
        out = compute_advantage(data, "opsd", config=_algorithm("opsd")).batch["advantages"]
    expected = torch.where(mask.bool(), teacher - student, torch.zeros_like(student))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert get_estimator("opsd").engine_limit("verl") is None
    assert get_estimator("opsd").engine_limit("TRL") == "its reward does not enter the loss"
