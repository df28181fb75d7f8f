"""Trainer config: YAML, dotted overrides, type checks, each section's own checks, the rules
across sections, finite floats, choice lists from their owners, nearest-key suggestions."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from gear_rl.credit import estimator_names, get_estimator
from gear_rl.dataclass_config import field_docs, parse_overrides
from gear_rl.signals import DIVERGENCE_KINDS as DIVERGENCES
from gear_rl.signals.teacher import PLACEMENTS, TeacherPromptConfig
from gear_rl.train import config as config_module
from gear_rl.train import loss as loss_module
from gear_rl.train.config import (
    AgentConfig,
    EvalConfig,
    LogConfig,
    LossConfig,
    OptimConfig,
    RolloutConfig,
    SignalConfig,
    TrainConfig,
    apply_overrides,
    load_config,
    valid_keys,
)

SECTIONS = tuple(name for name, hint in typing.get_type_hints(TrainConfig).items()
                 if dataclasses.is_dataclass(hint))


def float_keys() -> list[str]:
    """Every dotted key whose field is a float (or an optional float)."""
    keys = []
    hints = typing.get_type_hints(TrainConfig)
    for name in SECTIONS:
        section_hints = typing.get_type_hints(hints[name])
        for key, hint in section_hints.items():
            if float in (hint, *typing.get_args(hint)):
                keys.append(f"{name}.{key}")
    return keys


def test_defaults_are_valid() -> None:
    config = load_config()
    assert config.model == "smollm2-135m" and config.estimator == "gear"
    assert config.loss.agg_mode == "token-mean"


def test_dotted_overrides_and_types(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("estimator: grpo\nrollout:\n  temperature: 0.7\nsteps: 5\n")
    config = load_config(path, ["steps=7", "rollout.top_p=0.9", "optim.lr=3e-6",
                                "credit.eps=0.001", "log.report_to=none",
                                "out=/tmp/x", "rollout.batch_size=null"])
    assert config.estimator == "grpo" and config.steps == 7
    assert config.rollout.temperature == 0.7 and config.rollout.top_p == 0.9
    assert config.optim.lr == 3e-6 and isinstance(config.optim.lr, float)
    assert config.credit == {"eps": 0.001}
    assert config.log.report_to == ["none"] and config.rollout.batch_size is None


def test_load_config_without_validation_still_checks_keys() -> None:
    config = load_config(None, ["steps=0"], validate=False)
    assert config.steps == 0
    with pytest.raises(ValueError, match="unknown config key"):
        load_config(None, ["stepz=0"], validate=False)


def test_bad_values() -> None:
    with pytest.raises(ValueError, match="steps must be an int"):
        load_config(None, ["steps=abc"])
    with pytest.raises(ValueError, match="steps must be >= 1"):
        load_config(None, ["steps=0"])
    with pytest.raises(ValueError, match="unknown estimator 'nope'; registered: "):
        load_config(None, ["estimator=nope"])
    with pytest.raises(ValueError, match=r"unknown config key 'credit\.lambda_xx'"):
        load_config(None, ["credit.lambda_xx=1"])
    with pytest.raises(ValueError, match="pins segmentation"):
        load_config(None, ["estimator=gear_kl_only", "credit.segmentation=none"])
    with pytest.raises(ValueError, match="agg_mode"):
        load_config(None, ["loss.agg_mode=sum"])
    with pytest.raises(ValueError, match="top_p"):
        load_config(None, ["rollout.top_p=1.5"])
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["steps"])
    with pytest.raises(ValueError, match="does not exist"):
        load_config("/nonexistent.yaml")
    with pytest.raises(ValueError, match="divergence"):
        load_config(None, ["estimator=opsd", "signals.divergence=k3"])


@pytest.mark.parametrize(("override", "message"), [
    ("rollout.temperature=0", "rollout.temperature must be > 0, got 0"),
    ("rollout.samples_per_prompt=0", "rollout.samples_per_prompt must be >= 1, got 0"),
    ("rollout.batch_size=0", "rollout.batch_size must be >= 1, got 0"),
    ("rollout.dtype=fp16", "rollout.dtype must be one of"),
    ("loss.clip_low=1", r"loss.clip_low must be in \[0, 1\), got 1"),
    ("loss.clip_high=-0.1", "loss.clip_high must be >= 0"),
    ("loss.kl_type=k4", "loss.kl_type must be one of"),
    ("loss.micro_batch_size=0", "loss.micro_batch_size must be >= 1"),
    ("optim.eps=0", "optim.eps must be > 0, got 0"),
    ("optim.lr=0", "optim.lr must be > 0"),
    ("optim.beta2=1", r"optim.beta2 must be in \[0, 1\)"),
    ("optim.weight_decay=-1", "optim.weight_decay must be >= 0"),
    ("signals.placement=top", "signals.placement must be one of"),
    ("signals.divergence=topk", "signals.topk must be set for signals.divergence=topk"),
    ("signals.chunk_size=0", "signals.chunk_size must be >= 1"),
    ("signals.answer_template=no placeholder",
     "signals.answer_template must contain '{reference}'"),
    ("eval.top_p=0", r"eval.top_p must be in \(0, 1\]"),
    ("eval.every=-1", "eval.every must be >= 0"),
    ("agent.max_turns=0", "agent.max_turns must be >= 1"),
    ("agent.sandbox_timeout_s=0", "agent.sandbox_timeout_s must be > 0"),
    ("log.keep_checkpoints=0", "log.keep_checkpoints must be >= 1"),
    ("precision=fp16", "precision must be one of"),
    ("threads=0", "threads must be >= 1"),
])
def test_errors_name_the_dotted_key(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, [override])


def test_every_section_checks_itself() -> None:
    sections = (RolloutConfig, LossConfig, OptimConfig, SignalConfig, EvalConfig, AgentConfig,
                LogConfig)
    assert {cls.__name__ for cls in sections} == {
        typing.get_type_hints(TrainConfig)[name].__name__ for name in SECTIONS}
    for cls in sections:
        cls().validate()  # the defaults pass
    with pytest.raises(ValueError, match=r"rollout\.temperature must be > 0, got 0"):
        RolloutConfig(temperature=0).validate()
    with pytest.raises(ValueError, match=r"optim\.eps must be > 0"):
        OptimConfig(eps=0.0).validate()
    with pytest.raises(ValueError, match=r"loss\.kl_coef must be a finite number"):
        LossConfig(kl_coef=float("nan")).validate()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", ".inf", ".nan"])
@pytest.mark.parametrize("key", float_keys())
def test_every_float_knob_must_be_finite(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=rf"^{key} must be a finite number"):
        load_config(None, [f"{key}={value}"])


def test_float_keys_cover_the_knobs_named_in_the_docs() -> None:
    keys = float_keys()
    for key in ("optim.lr", "optim.eps", "loss.kl_coef", "rollout.temperature", "eval.top_p",
                "agent.sandbox_timeout_s"):
        assert key in keys


def test_credit_fields_are_checked_by_the_estimator_config() -> None:
    with pytest.raises(ValueError, match=r"^credit.lambda_kl must be a finite number"):
        load_config(None, ["credit.lambda_kl=inf"])
    with pytest.raises(ValueError, match=r"^credit.lam must be in \[0, 1\], got 2"):
        load_config(None, ["estimator=rlsd", "credit.lam=2"])
    assert load_config(None, ["estimator=rlsd", "credit.lam=0.3"]).credit_config().lam == 0.3


def test_cross_section_rules_name_both_keys() -> None:
    with pytest.raises(ValueError, match=r"loss.minibatches \(64\) exceeds the rollout batch "
                                         r"\(rollout.prompts_per_step \* "
                                         r"rollout.samples_per_prompt = 32"):
        load_config(None, ["loss.minibatches=64"])
    with pytest.raises(ValueError, match=r"signals.divergence must be 'full' or 'topk' .*"
                                         r"loss.opsd_coef=0.5"):
        load_config(None, ["loss.opsd_coef=0.5", "signals.divergence=k1"])
    with pytest.raises(ValueError, match=r"signals.divergence .*estimator=opsd"):
        load_config(None, ["estimator=opsd", "signals.divergence=k3"])
    load_config(None, ["estimator=opsd", "signals.divergence=topk", "signals.topk=8"])


def test_choice_lists_come_from_their_owners() -> None:
    assert config_module.LOSS_AGG_MODES is loss_module.LOSS_AGG_MODES
    assert config_module.KL_TYPES is loss_module.KL_TYPES
    assert config_module.DIVERGENCES is DIVERGENCES
    assert config_module.PLACEMENTS is PLACEMENTS
    for mode in loss_module.LOSS_AGG_MODES:
        assert load_config(None, [f"loss.agg_mode={mode}"]).loss.agg_mode == mode
    for kind in loss_module.KL_TYPES:
        assert load_config(None, [f"loss.kl_type={kind}"]).loss.kl_type == kind
    for divergence in DIVERGENCES:  # topk is refused with the other divergences
        topk = ["signals.topk=4"] if divergence == "topk" else []
        load_config(None, [f"signals.divergence={divergence}", *topk])
    for placement in PLACEMENTS:
        load_config(None, [f"signals.placement={placement}"])
    for precision in config_module.PRECISIONS:
        load_config(None, [f"precision={precision}", f"rollout.dtype={precision}"])


def test_the_loss_functions_reject_what_the_config_rejects() -> None:
    import torch

    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="choose from low_var_kl, k1, k2"):
        loss_module.kl_penalty(x, x, "k4")
    with pytest.raises(ValueError, match="choose from token-mean, seq-mean-token-sum, "):
        loss_module.aggregate(x, torch.ones(1, 2), "sum")


def test_teacher_hint_defaults_to_the_library_template() -> None:
    library = TeacherPromptConfig().answer_template
    assert SignalConfig().answer_template == library
    assert load_config().signals.answer_template == library
    short = load_config(None, ['signals.answer_template="\\n\\n(The correct answer is '
                               '{reference}.)"'])
    assert short.signals.answer_template == "\n\n(The correct answer is {reference}.)"
    assert load_config(None, ["signals.answer_template=null"]).signals.answer_template is None


def test_unknown_keys_suggest_the_nearest() -> None:
    with pytest.raises(ValueError, match=r"^unknown config key 'rollout.temprature'; did you "
                                         r"mean 'rollout.temperature'\?$"):
        load_config(None, ["rollout.temprature=0.7"])
    with pytest.raises(ValueError, match=r"'stepz'; did you mean 'steps'\?"):
        load_config(None, ["stepz=3"])
    with pytest.raises(ValueError, match=r"'rolout.temperature'; did you mean "
                                         r"'rollout.temperature'\?"):
        load_config(None, ["rolout.temperature=1"])
    with pytest.raises(ValueError, match=r"did you mean 'rollout.temperature' or "
                                         r"'eval.temperature'\?"):
        load_config(None, ["temperature=1"])
    with pytest.raises(ValueError, match=r"'rollout.lr'; did you mean 'optim.lr'\?"):
        load_config(None, ["rollout.lr=1"])
    with pytest.raises(ValueError, match="has no sub-keys"):
        load_config(None, ["steps.x=3"])


def test_unknown_key_without_a_near_one_lists_that_level() -> None:
    with pytest.raises(ValueError) as error:
        load_config(None, ["bogus=1"])
    message = str(error.value)
    assert "unknown config key 'bogus'; valid top-level keys: model, task" in message
    assert "rollout.<key>" in message and "gear-rl train --help" in message
    with pytest.raises(ValueError, match=r"valid rollout keys: rollout.prompts_per_step, .*"
                                         r"rollout.dtype"):
        load_config(None, ["rollout.xyz=1"])


def test_unknown_yaml_key_suggests_the_nearest(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  temprature: 0.7\n")
    with pytest.raises(ValueError, match=r"'rollout.temprature'; did you mean "
                                         r"'rollout.temperature'\?"):
        load_config(path)


def test_unknown_credit_field_and_estimator_suggest_the_nearest() -> None:
    with pytest.raises(ValueError, match=r"^unknown config key 'credit.lamda_kl' for estimator "
                                         r"'gear'; did you mean 'credit.lambda_kl'\?$"):
        load_config(None, ["credit.lamda_kl=0.2"])
    with pytest.raises(ValueError, match=r"'credit.lamb' for estimator 'rlsd'; did you mean "
                                         r"'credit.lam'\?"):
        load_config(None, ["estimator=rlsd", "credit.lamb=0.2"])
    with pytest.raises(ValueError, match=r"credit.xyzzy.*its keys: credit.norm_by_std"):
        load_config(None, ["credit.xyzzy=1"])
    with pytest.raises(ValueError, match=r"unknown estimator 'rlds'; did you mean 'rlsd'\? "
                                         r"registered: dr_grpo, "):
        load_config(None, ["estimator=rlds"])
    with pytest.raises(ValueError, match="did you mean 'token-mean'"):
        load_config(None, ["loss.agg_mode=token_mean"])


def test_every_field_is_documented_once() -> None:
    for cls in (TrainConfig, *(typing.get_type_hints(TrainConfig)[n] for n in SECTIONS)):
        docs = field_docs(cls)
        undocumented = [name for name, doc in docs.items()
                        if not doc and name not in SECTIONS]
        assert not undocumented, (cls.__name__, undocumented)
    assert field_docs(OptimConfig)["eps"].startswith("AdamW's denominator term")
    for name in estimator_names():
        estimator = get_estimator(name)
        docs = field_docs(estimator.config_cls)
        assert all(docs[field] for field in estimator.config_fields()), name


def test_field_docs_parse_attribute_entries() -> None:
    @dataclasses.dataclass
    class Base:
        """Base.

        Attributes:
            a: first line
                continued.
            b (int): typed entry.
        """

        a: int = 1
        b: int = 2

    @dataclasses.dataclass
    class Child(Base):
        """Child.

        Attributes:
            b: overridden.

        Notes:
            c: not an attribute.
        """

        c: int = 3

    assert field_docs(Child) == {"a": "first line continued.", "b": "overridden.", "c": ""}


def test_valid_keys_cover_sections() -> None:
    keys = valid_keys()
    for key in ("model", "task", "estimator", "steps", "seed", "out", "resume",
                "rollout.samples_per_prompt", "loss.clip_high", "eval.k", "credit.<key>"):
        assert key in keys
    config = apply_overrides(TrainConfig(), ["eval.k=8"])
    assert config.eval.k == 8
