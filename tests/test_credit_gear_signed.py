"""``gear_signed`` (GEARConfig.score="log_ratio", issue 16): GEAR's segments carrying the sampled
token's teacher log-ratio, against the plain-Python reference, its invariants, the registry and
bad input."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given

from gear_rl.credit import (
    CreditBatch,
    GEARConfig,
    gear_advantages,
    gear_advantages_reference,
    gear_segments,
    gear_signed_advantages,
    gear_weights,
    get_estimator,
)
from gear_rl.credit.grpo import outcome_advantages
from test_credit_gear_properties import SETTINGS, batches, configs


def _ratio(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator) * 2.0


@SETTINGS
@given(batches(), configs)
def test_signed_equals_reference(batch: tuple[torch.Tensor, ...], config: GEARConfig) -> None:
    config = dataclasses.replace(config, score="log_ratio")
    adv, div, ent, mask = batch
    ratio = _ratio(tuple(mask.shape), seed=int(div.sum() * 1000) % 9973)
    out = gear_signed_advantages(adv, div, ent, ratio, mask, config)
    ref = gear_advantages_reference(adv, div, ent, mask, config, log_ratio=ratio)
    assert out.dtype == torch.float32 and out.shape == mask.shape
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-6)
    assert (out[mask == 0] == 0).all()


def test_hand_computed_row() -> None:
    """One correct row (A = 1) with a segment opened at token 1 and closed at token 3: tokens 1-3
    carry token 1's log-ratio, tokens 0 and 4 their own; u = sigmoid(-r), W = 1 - u + 0.5."""
    div = torch.tensor([[0.0, 2.0, 0.1, 0.2, 0.0]])
    ent = torch.tensor([[1.0, 1.0, 1.2, 3.0, 1.0]])  # 3.0 > 1.5 * 1.0 ends the segment at 3
    mask = torch.ones(1, 5)
    ratio = torch.tensor([[0.5, 2.0, -1.0, -3.0, 0.0]])
    config = GEARConfig(preset="paper", score="log_ratio")  # the paper's W, not rescaled
    assert gear_segments(div, ent, mask, config).tolist() == [[-1, 1, 1, 1, -1]]

    def weight(r: float) -> float:
        return 1.0 - 1.0 / (1.0 + math.exp(r)) + 0.5

    expected = [weight(0.5), weight(2.0), weight(2.0), weight(2.0), weight(0.0)]
    out = gear_signed_advantages(torch.tensor([1.0]), div, ent, ratio, mask, config)
    assert out[0].tolist() == pytest.approx(expected, abs=1e-6)
    # a wrong answer (A = -2) mirrors the weights: W = u + 0.5
    out = gear_signed_advantages(torch.tensor([-2.0]), div, ent, ratio, mask, config)
    assert out[0].tolist() == pytest.approx([-2.0 * (2.0 - w) for w in expected], abs=1e-6)


def test_deciding_token_of_a_correct_answer_gains() -> None:
    """The pilot's "...42." case: on a correct answer the token where the unsure student and the
    certain teacher differ most (the deciding digit, which the teacher endorses: r > 0) gets
    GEAR's lowest weight and gear_signed's highest."""
    div = torch.tensor([[0.01, 0.02, 5.47, 0.03, 0.01]])
    ent = torch.tensor([[0.5, 0.4, 2.0, 3.5, 0.2]])
    ratio = torch.tensor([[0.0, 0.0, 2.5, 0.1, 0.0]])
    mask = torch.ones(1, 5)
    a = torch.tensor([1.0])
    plain = gear_advantages(a, div, ent, mask, GEARConfig(preset="paper"))
    signed = gear_signed_advantages(a, div, ent, ratio, mask,
                                    GEARConfig(preset="paper", score="log_ratio"))
    assert int(plain[0].argmin()) == 2
    assert int(signed[0].argmax()) == 2 and float(signed[0, 2]) > 1.4


def test_zero_log_ratio_is_grpo() -> None:
    """With r = 0 everywhere every weight is alpha * 0.5 + beta = 1: GRPO's advantage."""
    generator = torch.Generator().manual_seed(0)
    div, ent = torch.rand(6, 9, generator=generator), torch.rand(6, 9, generator=generator)
    mask = (torch.rand(6, 9, generator=generator) > 0.2).float()
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0, -0.2, 2.0])
    for config in (GEARConfig(score="log_ratio"),
                   GEARConfig(score="log_ratio", alpha=2.0, mean_preserving=True)):
        out = gear_signed_advantages(adv, div, ent, torch.zeros(6, 9), mask, config)
        assert torch.allclose(out, adv[:, None] * mask, atol=1e-6)


def test_registry_estimator_and_pins() -> None:
    generator = torch.Generator().manual_seed(1)
    rows, length = 8, 7
    student = -torch.rand(rows, length, generator=generator) * 3
    teacher = -torch.rand(rows, length, generator=generator) * 3
    mask = torch.ones(rows, length)
    mask[:, -2:] = 0
    batch = CreditBatch(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]),
                        group_ids=[i // 4 for i in range(rows)], mask=mask,
                        divergence=torch.rand(rows, length, generator=generator),
                        entropy=torch.rand(rows, length, generator=generator),
                        student_logprobs=student, teacher_logprobs=teacher)
    estimator = get_estimator("gear_signed")
    assert estimator.needs == ("divergence", "entropy", "student_logprobs", "teacher_logprobs")
    config = estimator.make_config()
    assert config.score == "log_ratio"
    out = estimator(batch)
    expected = gear_signed_advantages(outcome_advantages(batch, config), batch.divergence,
                                      batch.entropy, teacher - student, mask, config)
    assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="student_logprobs"):
        estimator(dataclasses.replace(batch, student_logprobs=None))
    for name in ("gear", "gear_token_kl", "gear_entropy_window", "gear_steps"):
        with pytest.raises(ValueError, match="pins score='divergence'"):
            get_estimator(name).make_config(score="log_ratio")
    with pytest.raises(ValueError, match="pins score='log_ratio'"):
        estimator.make_config(score="divergence")
    with pytest.raises(ValueError, match="score must be one of"):
        GEARConfig(score="kl")


def test_bad_input() -> None:
    div, ent = torch.rand(2, 4), torch.rand(2, 4)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv, config = torch.tensor([1.0, -1.0]), GEARConfig(score="log_ratio")
    ratio = torch.zeros(2, 4)
    ratio[0, 3] = float("nan")  # masked: never read
    out = gear_signed_advantages(adv, div, ent, ratio, mask, config)
    assert torch.isfinite(out).all()
    ratio[1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"log_ratio contains NaN or inf .*row 1"):
        gear_signed_advantages(adv, div, ent, ratio, mask, config)
    with pytest.raises(ValueError, match="log_ratio"):
        gear_signed_advantages(adv, div, ent, torch.zeros(2, 5), mask, config)
    with pytest.raises(ValueError, match="gear_signed_advantages"):
        gear_advantages(adv, div, ent, mask, config)
    with pytest.raises(ValueError, match="gear_signed_advantages"):
        gear_weights(adv, div, ent, mask, config)
