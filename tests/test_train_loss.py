"""Policy losses against hand computations on a 2x3 batch."""

from __future__ import annotations

import math

import pytest
import torch

from gear_rl.train.loss import aggregate, kl_penalty, ppo_policy_loss

LOGPROBS = [[-1.0, -0.5, -2.0], [-0.2, -1.5, -0.7]]
OLD = [[-1.1, -0.5, -1.5], [-0.2, -1.0, -0.9]]
ADV = [[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def test_hand_values_of_each_token() -> None:
    """Each token's loss from ppo_policy_loss alone (a one-token mask, summed over one
    sequence) against ``max(-A r, -A clip(r, 0.8, 1.28))`` worked by hand:
    r = exp(0.1), 1, exp(-0.5) in row 0 (A = 1, inside the range: -A r) and 1, exp(-0.5) in
    row 1 (A = -2: -A r = 2, and 2 * clip(exp(-0.5), 0.8, 1.28) = 1.6 > 2 * exp(-0.5))."""
    hand = {(0, 0): -math.exp(0.1), (0, 1): -1.0, (0, 2): -math.exp(-0.5),
            (1, 0): 2.0, (1, 1): 1.6}
    for (b, t), expected in hand.items():
        only = torch.zeros(2, 3)
        only[b, t] = 1
        loss, stats = ppo_policy_loss(
            torch.tensor(LOGPROBS, dtype=torch.float64), torch.tensor(OLD, dtype=torch.float64),
            torch.tensor(ADV, dtype=torch.float64), only, clip_low=0.2, clip_high=0.28,
            agg_mode="seq-mean-token-sum", num_seqs=1)
        assert float(loss) == pytest.approx(expected, rel=1e-12), (b, t)
        assert stats.clipped == (1 if (b, t) == (1, 1) else 0), (b, t)  # the clip decides there


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (-math.exp(0.1) - 1 - math.exp(-0.5) + 2 + 1.6) / 5),
        ("seq-mean-token-sum", ((-math.exp(0.1) - 1 - math.exp(-0.5)) + 3.6) / 2),
        ("seq-mean-token-mean", ((-math.exp(0.1) - 1 - math.exp(-0.5)) / 3 + 3.6 / 2) / 2),
        ("seq-mean-token-sum-norm", (-math.exp(0.1) - 1 - math.exp(-0.5) + 3.6) / (2 * 3)),
    ],
)
def test_ppo_loss_matches_hand_computation(mode: str, expected: float) -> None:
    logprobs = torch.tensor(LOGPROBS, dtype=torch.float64, requires_grad=True)
    loss, stats = ppo_policy_loss(
        logprobs, torch.tensor(OLD, dtype=torch.float64), torch.tensor(ADV, dtype=torch.float64),
        torch.tensor(MASK), clip_low=0.2, clip_high=0.28, agg_mode=mode,
    )
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    assert stats.clipped == 1 and stats.tokens == 5
    assert stats.approx_kl == pytest.approx(-0.1 + 0.0 + 0.5 + 0.0 + 0.5)
    loss.backward()
    grad = logprobs.grad
    # clipped and masked tokens get no gradient; the others get -A r / normaliser
    assert float(grad[1, 1]) == 0.0 and float(grad[1, 2]) == 0.0
    if mode == "token-mean":
        assert float(grad[0, 0]) == pytest.approx(-math.exp(0.1) / 5)
        assert float(grad[1, 0]) == pytest.approx(2.0 / 5)


def test_high_clip_is_asymmetric() -> None:
    # A > 0 and ratio 1.25: inside [0.8, 1.28] -> not clipped; with a symmetric 0.2 it would be.
    args = (torch.tensor([[math.log(1.25)]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]),
            torch.tensor([[1]]))
    _, asym = ppo_policy_loss(*args, clip_low=0.2, clip_high=0.28, agg_mode="token-mean")
    _, sym = ppo_policy_loss(*args, clip_low=0.2, clip_high=0.2, agg_mode="token-mean")
    assert asym.clipped == 0 and sym.clipped == 1


def test_micro_batches_add_up_to_the_mini_batch_loss() -> None:
    torch.manual_seed(0)
    logprobs, old = torch.randn(6, 5), torch.randn(6, 5)
    adv = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).long()
    mask[:, 0] = 1
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                 "seq-mean-token-sum-norm"):
        whole, _ = ppo_policy_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.28,
                                   agg_mode=mode, horizon=7)
        parts = sum(
            ppo_policy_loss(logprobs[s], old[s], adv[s], mask[s], clip_low=0.2, clip_high=0.28,
                            agg_mode=mode, num_seqs=6, num_tokens=float(mask.sum()),
                            horizon=7)[0]
            for s in (slice(0, 2), slice(2, 6))
        )
        assert float(parts) == pytest.approx(float(whole), rel=1e-6), mode


def test_kl_penalty_estimators() -> None:
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    assert kl_penalty(logp, ref, "k1")[0].tolist() == pytest.approx([0.5, 0.0])
    assert kl_penalty(logp, ref, "k2")[0].tolist() == pytest.approx([0.125, 0.0])
    k3 = kl_penalty(logp, ref, "low_var_kl")
    assert k3[0].tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1.0, 0.0])
    with pytest.raises(ValueError, match="kl_type"):
        kl_penalty(logp, ref, "k9")


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="advantages"):
        ppo_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2),
                        torch.ones(2, 3), clip_low=0.2, clip_high=0.28, agg_mode="token-mean")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), "sum")
    with pytest.raises(ValueError, match="same"):
        aggregate(torch.zeros(2, 3), torch.ones(3, 3), "token-mean")
