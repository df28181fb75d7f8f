"""Trainer config: YAML, dotted overrides, type checks, unknown keys."""

from __future__ import annotations

import pytest

from gear_rl.train.config import (
    TrainConfig,
    apply_overrides,
    load_config,
    parse_overrides,
    valid_keys,
)


def test_defaults_are_valid() -> None:
    config = load_config()
    assert config.model == "smollm2-135m" and config.estimator == "gear"
    assert config.loss.agg_mode == "token-mean"


def test_dotted_overrides_and_types(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("estimator: grpo\nrollout:\n  temperature: 0.7\nsteps: 5\n")
    config = load_config(path, ["steps=7", "rollout.top_p=0.9", "optim.lr=3e-6",
                                "credit.eps=0.001", "log.tensorboard=false",
                                "out=/tmp/x", "rollout.batch_size=null"])
    assert config.estimator == "grpo" and config.steps == 7
    assert config.rollout.temperature == 0.7 and config.rollout.top_p == 0.9
    assert config.optim.lr == 3e-6 and isinstance(config.optim.lr, float)
    assert config.credit == {"eps": 0.001}
    assert config.log.tensorboard is False and config.rollout.batch_size is None


def test_unknown_key_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown config key 'rollout.temprature'.*"
                                         r"rollout\.temperature"):
        load_config(None, ["rollout.temprature=1"])
    with pytest.raises(ValueError, match="unknown config key 'stepz'"):
        load_config(None, ["stepz=3"])
    with pytest.raises(ValueError, match="has no sub-keys"):
        load_config(None, ["steps.x=3"])


def test_bad_values() -> None:
    with pytest.raises(ValueError, match="steps must be an int"):
        load_config(None, ["steps=abc"])
    with pytest.raises(ValueError, match="steps must be >= 1"):
        load_config(None, ["steps=0"])
    with pytest.raises(ValueError, match="unknown 'nope'"):
        load_config(None, ["estimator=nope"])
    with pytest.raises(ValueError, match="no config field"):
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


def test_valid_keys_cover_sections() -> None:
    keys = valid_keys()
    for key in ("model", "task", "estimator", "steps", "seed", "out", "resume",
                "rollout.samples_per_prompt", "loss.clip_high", "eval.k", "credit.<key>"):
        assert key in keys
    config = apply_overrides(TrainConfig(), ["eval.k=8"])
    assert config.eval.k == 8
