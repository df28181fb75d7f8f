"""``credit.preset``: the paper-literal GEAR reading by name (issue 16)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gear_rl.credit import CreditBatch, get_estimator
from gear_rl.credit.config import GEAR_PRESETS, GEARConfig
from gear_rl.train import load_config


def test_paper_preset_is_the_literal_reading_and_explicit_fields_win() -> None:
    paper = GEARConfig(preset="paper")
    for name, value in GEAR_PRESETS["paper"].items():
        assert getattr(paper, name) == value, name
    assert dataclasses.replace(paper, preset=None) == GEARConfig()  # today's default reading
    mixed = GEARConfig(preset="paper", lambda_kl=0.3, skip_first=1)
    assert (mixed.lambda_kl, mixed.skip_first, mixed.lambda_h) == (0.3, 1, 1.5)
    with pytest.raises(ValueError, match="preset must be one of"):
        GEARConfig(preset="nope")


def test_every_gear_name_takes_the_preset_and_keeps_its_pins() -> None:
    generator = torch.Generator().manual_seed(0)
    batch = CreditBatch(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group_ids=[0, 0, 1, 1],
                        mask=torch.ones(4, 12), divergence=torch.rand(4, 12, generator=generator),
                        entropy=torch.rand(4, 12, generator=generator) * 3)
    for name in ("gear", "gear_token_kl", "gear_kl_only", "gear_entropy_window"):
        estimator = get_estimator(name)
        preset = estimator.make_config(preset="paper")
        for key, value in estimator.fixed.items():
            assert getattr(preset, key) == value, (name, key)
        torch.testing.assert_close(estimator(batch, preset),
                                   estimator(batch, estimator.make_config()))


def test_trainer_and_trl_read_credit_preset(tmp_path) -> None:
    """``credit.preset=paper`` reaches the trainer's config; an unknown name is an error that
    names ``credit.preset``."""
    config = load_config(None, ["model=tiny-random", "credit.preset=paper", "credit.lambda_h=1.2"])
    built = config.credit_config()
    assert built.preset == "paper" and built.lambda_h == 1.2 and built.lambda_kl == 0.1
    with pytest.raises(ValueError, match=r"credit\.preset must be one of"):
        load_config(None, ["model=tiny-random", "credit.preset=nope"]).credit_config()
    pytest.importorskip("trl")
    from gear_rl.integrations.trl import CreditGRPOConfig

    trl_config = CreditGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False,
                                  estimator="gear", credit={"preset": "paper", "alpha": 0.5},
                                  report_to=[])
    assert trl_config.credit_config.preset == "paper"
    assert trl_config.credit_config.alpha == 0.5
