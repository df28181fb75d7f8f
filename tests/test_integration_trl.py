"""``CreditGRPOTrainer`` (TRL 1.16 ``GRPOTrainer`` subclass) on CPU with a tiny random model and
an in-process tokenizer: no hub, no download."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
import trl.trainer.grpo_trainer as trl_grpo  # noqa: E402
from transformers import HfArgumentParser  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from gear_rl.credit import (  # noqa: E402
    CreditBatch,
    gear_advantages,
    gear_signed_advantages,
    get_estimator,
    rlsd_advantages,
    top_entropy_advantages,
)
from gear_rl.credit.config import GEARConfig  # noqa: E402
from gear_rl.credit.registry import _REGISTRY  # noqa: E402
from gear_rl.integrations.teacher_inputs import SPLICED_HEAD  # noqa: E402
from gear_rl.integrations.trl import (  # noqa: E402
    CreditGRPOConfig,
    CreditGRPOTrainer,
    GEARGRPOConfig,
    GEARTrainer,
    reshape_outcome,
    trl_estimator_names,
)
from gear_rl.models import build_tiny_tokenizer, tiny_random_model  # noqa: E402
from gear_rl.signals import (  # noqa: E402
    TeacherPromptConfig,
    prompt_ids,
    response_logprobs,
    teacher_prompt_ids,
    token_signals,
)

pytestmark = pytest.mark.usefixtures("one_thread")

NUM_GENERATIONS = 4
QUESTIONS = [("2+3?", "5"), ("7*6?", "42")]
BUILTIN = ["grpo", "dr_grpo", "gear", "gear_token_kl", "gear_kl_only", "gear_entropy_only",
           "gear_entropy_window", "gear_signed", "top_entropy", "rlsd"]
# Per estimator: credit fields and TRL settings a tiny model needs to exercise it.
SETTINGS: dict[str, dict] = {
    "dr_grpo": {"scale_rewards": "none"},
    "top_entropy": {"credit": {"rho": 0.3}},
    "rlsd": {"credit": {"lam": 0.7}},
    **{name: {"credit": {"lambda_kl": 0.05}} for name in BUILTIN if name.startswith("gear")},
}


def _reward(completions, **_):
    # Deterministic and varied within a group, so advantages have both signs.
    return [float(sum(map(ord, c[0]["content"])) % 3) for c in completions]


def _rows() -> list[dict]:
    return [{"prompt": [{"role": "user", "content": q}], "reference": ref} for q, ref in QUESTIONS]


def _inputs() -> list[dict]:
    return [row for row in _rows() for _ in range(NUM_GENERATIONS)]


def _trainer(tmp_path, max_steps: int = 1, **config) -> CreditGRPOTrainer:
    torch.manual_seed(0)
    args = CreditGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], save_strategy="no",
        per_device_train_batch_size=2 * NUM_GENERATIONS, num_generations=NUM_GENERATIONS,
        max_completion_length=6, max_steps=max_steps, logging_steps=1, learning_rate=1e-2,
        seed=0, beta=0.0, temperature=1.0, **config)
    return CreditGRPOTrainer(model=tiny_random_model("llama", seed=1), reward_funcs=_reward,
                             args=args, train_dataset=datasets.Dataset.from_list(_rows()),
                             processing_class=build_tiny_tokenizer())


def _config(tmp_path, **fields) -> CreditGRPOConfig:
    return CreditGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **fields)


# ------------------------------------------------------------------ the config
def test_supported_estimators_are_the_token_level_ones_with_a_reward() -> None:
    names = trl_estimator_names()
    assert set(BUILTIN) <= set(names)
    assert "opsd" not in names and "gigpo" not in names and "gear_steps" not in names


@pytest.mark.parametrize(("name", "reason"), [
    ("opsd", "its reward does not enter the loss"),
    ("gigpo", "step-level"),
    ("gear_steps", "step-level"),
    ("no_such_method", "not registered"),
])
def test_unsupported_estimators_are_refused_in_one_line(tmp_path, name, reason) -> None:
    with pytest.raises(ValueError) as error:
        _config(tmp_path, estimator=name)
    message = str(error.value)
    assert "\n" not in message
    assert f"estimator={name!r}" in message and reason in message
    assert "'gear'" in message and "'rlsd'" in message


def test_config_checks_the_credit_fields_through_the_estimator(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"no config field\(s\) \['gear_lambda_kl'\]"):
        _config(tmp_path, credit={"gear_lambda_kl": 0.2})
    with pytest.raises(ValueError, match="credit: lambda_kl"):
        _config(tmp_path, credit={"lambda_kl": float("nan")})
    with pytest.raises(ValueError, match="pins segmentation='none'"):
        _config(tmp_path, estimator="gear_token_kl", credit={"segmentation": "kl_only"})
    with pytest.raises(ValueError, match=r"credit\['eps'\] has no effect"):
        _config(tmp_path, credit={"eps": 1e-4})
    config = _config(tmp_path, credit={"alpha": 0.5})
    assert config.credit_config == GEARConfig(alpha=0.5)
    assert config.credit_config.resolved_beta == 0.75
    assert _config(tmp_path).credit_config == GEARConfig()  # GEAR's defaults, from GEARConfig
    assert _config(tmp_path, estimator="rlsd", credit='{"lam": 0.3}').credit_config.lam == 0.3
    with pytest.raises(ValueError, match="credit must be a JSON object"):
        _config(tmp_path, credit="{lam: 0.3")


def test_old_gear_fields_are_gone(tmp_path) -> None:
    with pytest.raises(TypeError, match="gear_lambda_kl"):
        GEARGRPOConfig(output_dir=str(tmp_path), use_cpu=True, gear_lambda_kl=0.1)
    assert GEARGRPOConfig is CreditGRPOConfig and GEARTrainer is CreditGRPOTrainer
    assert GEARGRPOConfig(output_dir=str(tmp_path), use_cpu=True).estimator == "gear"


def test_config_cross_field_rules_name_both_fields(tmp_path) -> None:
    with pytest.raises(ValueError, match="norm_by_std=False but scale_rewards='group'"):
        _config(tmp_path, estimator="dr_grpo")
    with pytest.raises(ValueError, match="norm_by_std=True but scale_rewards='none'"):
        _config(tmp_path, scale_rewards="none")
    _config(tmp_path, estimator="dr_grpo", scale_rewards="none")
    _config(tmp_path, credit={"norm_by_std": False}, scale_rewards="none")
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        _config(tmp_path, estimator="top_entropy", top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="divergence must be one of"):
        _config(tmp_path, divergence="exact")
    with pytest.raises(ValueError, match="divergence_topk is required"):
        _config(tmp_path, divergence="topk")
    with pytest.raises(ValueError, match="divergence_topk"):
        _config(tmp_path, divergence_topk=8)
    with pytest.raises(ValueError, match="teacher_placement"):
        _config(tmp_path, teacher_placement="prefix")
    with pytest.raises(ValueError, match="reference_kind"):
        _config(tmp_path, reference_kind="hint")
    with pytest.raises(ValueError, match="teacher_answer_template"):
        _config(tmp_path, teacher_answer_template="no placeholder")
    with pytest.raises(ValueError, match="signal_chunk_size"):
        _config(tmp_path, signal_chunk_size=0)


def test_teacher_wording_defaults_to_the_library_hint(tmp_path) -> None:
    assert _config(tmp_path).teacher_prompt_config == TeacherPromptConfig()
    custom = _config(tmp_path, teacher_placement="system",
                     teacher_answer_template="\n(answer: {reference})").teacher_prompt_config
    assert custom == TeacherPromptConfig(placement="system",
                                         answer_template="\n(answer: {reference})")


def test_config_parses_from_the_command_line(tmp_path) -> None:
    (args,) = HfArgumentParser(CreditGRPOConfig).parse_args_into_dataclasses([
        "--output_dir", str(tmp_path), "--use_cpu", "True", "--estimator", "rlsd",
        "--credit", '{"lam": 0.25}', "--divergence", "k3"])
    assert args.credit == {"lam": 0.25} and args.credit_config.lam == 0.25


# ------------------------------------------------------------------ the outcome hand-off
def _signals_batch(rewards, group_ids, seed: int = 0) -> CreditBatch:
    generator = torch.Generator().manual_seed(seed)
    size = len(group_ids)
    mask = torch.ones(size, 7)
    mask[0, 5:] = 0
    mask[1, 2] = 0  # an observation token inside the response
    return CreditBatch(rewards=torch.tensor(rewards), group_ids=group_ids, mask=mask,
                       divergence=torch.rand(size, 7, generator=generator) * mask,
                       entropy=torch.rand(size, 7, generator=generator) * 3,
                       student_logprobs=-torch.rand(size, 7, generator=generator) * 4,
                       teacher_logprobs=-torch.rand(size, 7, generator=generator) * 4)


def test_reshape_outcome_is_the_token_reshaping_of_the_given_advantage() -> None:
    # Group-centred but not GRPO-scaled, as TRL's scale_rewards='batch' gives.
    outcome = [0.9, -0.3, -0.3, -0.3, 0.0, 0.0, 0.4, -0.4]
    batch = _signals_batch(outcome, [0, 0, 0, 0, 1, 1, 2, 2])
    a = batch.rewards
    config = GEARConfig(lambda_kl=0.3)
    got, fallback = reshape_outcome(get_estimator("gear"), config, batch)
    torch.testing.assert_close(got, gear_advantages(a, batch.divergence, batch.entropy,
                                                    batch.mask, config))
    assert not fallback.any()
    got, _ = reshape_outcome(get_estimator("top_entropy"),
                             get_estimator("top_entropy").make_config(rho=0.3), batch)
    torch.testing.assert_close(got, top_entropy_advantages(a, batch.entropy, batch.mask, rho=0.3))
    got, _ = reshape_outcome(get_estimator("rlsd"), get_estimator("rlsd").make_config(), batch)
    torch.testing.assert_close(got, rlsd_advantages(a, batch.student_logprobs,
                                                    batch.teacher_logprobs, batch.mask))
    got, _ = reshape_outcome(get_estimator("dr_grpo"), get_estimator("dr_grpo").make_config(),
                             batch)
    torch.testing.assert_close(got, a[:, None] * batch.mask)


def test_reshape_outcome_falls_back_to_the_given_advantage_where_signs_disagree() -> None:
    # Not centred in group 0 (TRL's normalize_then_sum): the group normalisation of this
    # outcome is negative on row 0 and 0 on rows 1 and 3, while TRL's is positive on all four.
    outcome = [0.5, 1.0, 1.5, 1.0, 0.0, 0.0, -0.2, 0.6]
    batch = _signals_batch(outcome, [0, 0, 0, 0, 1, 1, 2, 2])
    a, mask = batch.rewards, batch.mask
    config = GEARConfig(lambda_kl=0.3)
    got, fallback = reshape_outcome(get_estimator("gear"), config, batch)
    assert fallback.tolist() == [True, True, False, True, False, False, False, False]
    expected = gear_advantages(a, batch.divergence, batch.entropy, mask, config)
    rows = ~fallback
    torch.testing.assert_close(got[rows], expected[rows])
    torch.testing.assert_close(got[fallback], (a[:, None] * mask)[fallback])
    assert torch.all(got[4:6] == 0)  # a zero advantage stays zero
    assert torch.all(got[mask == 0] == 0)


# ------------------------------------------------------------------ one TRL step per estimator
def _expected(trainer: CreditGRPOTrainer, inputs: list[dict], output: dict) -> torch.Tensor:
    """The ``[B, T]`` advantages the registry's functions give on TRL's ``[B]`` advantage, with
    signals from prompts built as the built-in trainer builds them."""
    args, tokenizer = trainer.args, trainer.processing_class
    estimator, config = args.credit_estimator, args.credit_config
    a = output["advantages"]
    mask = output["completion_mask"].float()
    if estimator.name in ("grpo", "dr_grpo"):
        return a[:, None] * mask
    students = [prompt_ids(tokenizer, row["prompt"]) for row in inputs]
    stored = [r[m.bool()].tolist() for r, m in zip(output["prompt_ids"], output["prompt_mask"],
                                                   strict=True)]
    assert stored == students
    teachers = [teacher_prompt_ids(tokenizer, row["prompt"], row["reference"],
                                   config=TeacherPromptConfig()) for row in inputs]
    with torch.no_grad():
        sig = token_signals(trainer.model, students, teachers, output["completion_ids"].tolist(),
                            temperature=1.0, response_mask=mask)
    if estimator.name == "gear_signed":
        return gear_signed_advantages(a, sig.divergence, sig.entropy,
                                      sig.teacher_logprobs - sig.student_logprobs,
                                      mask, config)
    if estimator.segments:
        return gear_advantages(a, sig.divergence, sig.entropy, mask, config)
    if estimator.name == "top_entropy":
        return top_entropy_advantages(a, sig.entropy, mask, rho=config.rho)
    if estimator.name == "rlsd":
        return rlsd_advantages(a, sig.student_logprobs, sig.teacher_logprobs, mask,
                               lam=config.lam, eps_w=config.eps_w)
    raise AssertionError(f"no expectation for {estimator.name}")


def _record_step(trainer: CreditGRPOTrainer, monkeypatch, expected=_expected) -> dict:
    """Train one step; return TRL's ``[B]`` advantages, what the loss received and the
    expectation computed before the update."""
    monkeypatch.setattr(trl_grpo, "shuffle_sequence_dict", lambda batch: batch)  # row order
    seen: dict = {}
    apply_credit, compute_loss = trainer._apply_credit, trainer._compute_loss

    def record_credit(inputs, output):
        seen["trl"] = output["advantages"].clone()
        seen["expected"] = expected(trainer, inputs, output)
        return apply_credit(inputs, output)

    def record_loss(model, inputs):
        seen.setdefault("loss_advantages", inputs["advantages"].clone())
        return compute_loss(model, inputs)

    monkeypatch.setattr(trainer, "_apply_credit", record_credit)
    monkeypatch.setattr(trainer, "_compute_loss", record_loss)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 1
    seen["changed"] = any(not torch.equal(before[n], p)
                          for n, p in trainer.model.named_parameters())
    seen["logged"] = {k for entry in trainer.state.log_history for k in entry}
    return seen


@pytest.mark.parametrize("name", BUILTIN)
def test_every_supported_estimator_trains_one_step_on_its_registry_advantages(
        tmp_path, monkeypatch, name) -> None:
    trainer = _trainer(tmp_path, estimator=name, **SETTINGS.get(name, {}))
    seen = _record_step(trainer, monkeypatch)
    handed = seen["loss_advantages"]
    assert seen["trl"].dim() == 1 and seen["trl"].abs().sum() > 0
    assert handed.shape == seen["expected"].shape and handed.dim() == 2
    torch.testing.assert_close(handed, seen["expected"], rtol=1e-5, atol=1e-6)
    assert seen["changed"]
    assert {"gear/adv_abs_mean", "gear/outcome_fallback_frac"} <= seen["logged"]
    estimator = get_estimator(name)
    if estimator.needs_teacher:
        assert f"gear/teacher_prompt_{SPLICED_HEAD}_frac" in seen["logged"]
        assert "gear/divergence_mean" in seen["logged"]
    if estimator.segments:
        assert {"gear/segment_frac", "gear/segments_per_response"} <= seen["logged"]


def test_grpo_skips_the_signal_pass(tmp_path, monkeypatch) -> None:
    import gear_rl.integrations.trl as integration

    def refuse(*_, **__):
        raise AssertionError("GRPO needs no signals")

    monkeypatch.setattr(integration, "token_signals", refuse)
    monkeypatch.setattr(integration, "response_logprobs", refuse)
    trainer = _trainer(tmp_path, estimator="grpo")
    output = GRPOTrainer._generate_and_score_completions(trainer, _inputs())
    handed = trainer._apply_credit(_inputs(), output)["advantages"]
    torch.testing.assert_close(handed, output["advantages"][:, None]
                               * output["completion_mask"].float())


# ------------------------------------------------------------------ plugins
PLUGIN = "trl_test_entropy_boost"
PLUGIN_MODULE = "gear_rl_trl_test_plugin"


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / f"{PLUGIN_MODULE}.py").write_text(textwrap.dedent(f'''
        from dataclasses import dataclass

        from gear_rl.credit import register_estimator
        from gear_rl.credit.config import OutcomeConfig
        from gear_rl.credit.grpo import outcome_advantages


        @dataclass(frozen=True)
        class BoostConfig(OutcomeConfig):
            boost: float = 0.5


        @register_estimator("{PLUGIN}", config=BoostConfig, needs=("entropy",))
        def entropy_boost(batch, config):
            """Tokens above entropy 1 nat get (1 + boost) times the advantage."""
            weight = 1.0 + config.boost * (batch.entropy > 1.0).float()
            return outcome_advantages(batch, config)[:, None] * weight * batch.mask
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield PLUGIN_MODULE
    _REGISTRY.pop(PLUGIN, None)
    sys.modules.pop(PLUGIN_MODULE, None)


def test_a_plugin_estimator_trains_through_plugins(tmp_path, monkeypatch, plugin_module) -> None:
    assert PLUGIN not in trl_estimator_names()
    with pytest.raises(ValueError, match="not registered"):
        _config(tmp_path, estimator=PLUGIN)

    def expected(trainer, inputs, output):
        students = [prompt_ids(trainer.processing_class, row["prompt"]) for row in inputs]
        mask = output["completion_mask"].float()
        with torch.no_grad():
            entropy = response_logprobs(trainer.model, students,
                                        output["completion_ids"].tolist(),
                                        response_mask=mask).entropy
        return output["advantages"][:, None] * (1.0 + 0.25 * (entropy > 1.0).float()) * mask

    trainer = _trainer(tmp_path / "run", estimator=PLUGIN, plugins=[plugin_module],
                       credit={"boost": 0.25})
    assert PLUGIN in trl_estimator_names()
    seen = _record_step(trainer, monkeypatch, expected)
    torch.testing.assert_close(seen["loss_advantages"], seen["expected"], rtol=1e-5, atol=1e-6)
    assert "gear/teacher_prompt_spliced_head_frac" not in seen["logged"]  # no teacher pass


# ------------------------------------------------------------------ teacher prompts
@pytest.fixture(scope="module")
def trl_batch(tmp_path_factory):
    """A trainer and one batch TRL sampled and scored (its own prompt tokenisation)."""
    trainer = _trainer(tmp_path_factory.mktemp("trl"), credit={"lambda_kl": 0.05})
    trainer.model.train()
    return trainer, GRPOTrainer._generate_and_score_completions(trainer, _inputs())


@pytest.mark.parametrize(("kind", "placement"), [
    ("answer", "user_end"), ("solution", "new_user_turn"), ("tool_call", "system")])
def test_teacher_ids_equal_the_built_in_trainers(trl_batch, kind, placement) -> None:
    trainer, output = trl_batch
    tokenizer = trainer.processing_class
    trainer.args.reference_kind, trainer.args.teacher_placement = kind, placement
    try:
        stored = [r[m.bool()].tolist() for r, m in zip(output["prompt_ids"],
                                                       output["prompt_mask"], strict=True)]
        got, hows = trainer._teacher_prompts(_inputs(), stored)
    finally:
        trainer.args.reference_kind, trainer.args.teacher_placement = "answer", "user_end"
    built_in = [teacher_prompt_ids(tokenizer, row["prompt"], row["reference"], kind=kind,
                                   config=TeacherPromptConfig(placement=placement))
                for row in _inputs()]
    assert stored == [prompt_ids(tokenizer, row["prompt"]) for row in _inputs()]
    assert got == built_in
    assert hows == [SPLICED_HEAD] * len(got)


def test_missing_reference_column_is_named(trl_batch) -> None:
    trainer, output = trl_batch
    inputs = [{"prompt": row["prompt"]} for row in _inputs()]
    with pytest.raises(ValueError, match="'reference'"):
        trainer._apply_credit(inputs, output)


# ------------------------------------------------------------------ TRL's [B, T] path
def _grads(trainer: CreditGRPOTrainer, batch: dict) -> dict[str, torch.Tensor]:
    trainer.model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one batch here
    trainer.compute_loss(trainer.model, batch).backward()
    return {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
            if p.grad is not None}


def test_gear_weights_change_the_gradient_relative_to_grpo(trl_batch) -> None:
    """Regression on TRL's path for [B, T] advantages (``_compute_loss`` unsqueezes only 1-D)."""
    trainer, grpo = trl_batch
    assert grpo["advantages"].dim() == 1 and grpo["advantages"].abs().sum() > 0
    gear = trainer._apply_credit(_inputs(), grpo)
    mask = grpo["completion_mask"].bool()
    assert gear["advantages"].shape == grpo["completion_ids"].shape
    assert torch.all(gear["advantages"][~mask] == 0)
    assert grpo["advantages"].dim() == 1  # TRL's buffered dict is left alone

    grad_grpo = _grads(trainer, grpo)
    grad_gear = _grads(trainer, gear)
    differs = [n for n in grad_grpo if not torch.allclose(grad_grpo[n], grad_gear[n],
                                                          rtol=1e-4, atol=1e-7)]
    assert differs, "GEAR's token weights left every gradient as GRPO's"

    # Control: alpha=0 makes every weight W = beta = 1, so GEAR's gradient is GRPO's.
    credit = trainer.args.credit
    trainer.args.credit = {**credit, "alpha": 0.0}
    try:
        flat = trainer._apply_credit(_inputs(), grpo)
    finally:
        trainer.args.credit = credit
    torch.testing.assert_close(flat["advantages"],
                               grpo["advantages"][:, None] * mask.float(), rtol=0, atol=1e-6)
    grad_flat = _grads(trainer, flat)
    for name in grad_grpo:
        torch.testing.assert_close(grad_flat[name], grad_grpo[name], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_gear_trainer_two_training_steps_on_cpu(tmp_path) -> None:
    trainer = GEARTrainer(
        model=tiny_random_model("llama", seed=1), reward_funcs=_reward,
        args=GEARGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[],
                            save_strategy="no", per_device_train_batch_size=NUM_GENERATIONS,
                            num_generations=NUM_GENERATIONS, max_completion_length=6,
                            max_steps=2, logging_steps=1, learning_rate=1e-2, seed=0, beta=0.0,
                            credit={"lambda_kl": 0.05}),
        train_dataset=datasets.Dataset.from_list(_rows()),
        processing_class=build_tiny_tokenizer())
    trainer.train()
    assert trainer.state.global_step == 2
    logged = {k for entry in trainer.state.log_history for k in entry}
    assert {"gear/divergence_mean", "gear/segment_frac", "gear/adv_abs_mean"} <= logged
