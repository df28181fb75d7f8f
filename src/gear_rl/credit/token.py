"""Token-level baselines GEAR is compared with.

- Top-entropy mask: Wang et al., "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
  Effective RL for LLM Reasoning", arXiv 2506.01939, Sec. 4 (policy gradient only on the top
  20% highest-entropy tokens of the batch).
- RLSD: arXiv 2604.03128, the token reweighting
  ``Ahat_t = A * ((1 - lam) + lam * clip(exp(sign(A) * d_t), 1 - eps_w, 1 + eps_w))`` with
  ``d_t = log pi(a_t | s*_t) - log pi(a_t | s_t)`` (teacher minus student).

GEAR's own ablations (token-KL weights, KL-only, entropy-only and entropy-window segments) are
``gear.gear_advantages`` with ``GEARConfig.segmentation`` changed; the registry names them.
"""

from __future__ import annotations

import math
from typing import cast

import torch

from gear_rl.credit._validate import check_batch_size, check_mask, check_tokens, check_vector
from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.config import RLSDConfig, TopEntropyConfig
from gear_rl.credit.grpo import outcome_advantages
from gear_rl.credit.registry import register_estimator


def top_entropy_advantages(
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    rho: float = 0.2,
) -> torch.Tensor:
    """Keep the advantage only on the batch's top-``rho`` highest-entropy policy tokens.

    Args:
        advantages: ``[B]`` trajectory advantages.
        entropy: ``[B, T]`` student entropy (nats).
        mask: ``[B, T]`` 1 for policy tokens.
        rho: fraction kept, over all policy tokens of the batch (ties at the cut are all kept).

    Returns:
        ``[B, T]`` ``A_i * keep_t * mask_t`` in ``entropy``'s dtype.
    """
    check_mask(mask)
    check_tokens("entropy", entropy, tuple(mask.shape))
    check_vector("advantages", advantages)
    check_batch_size("advantages", advantages, mask.shape[0])
    if not (isinstance(rho, (int, float)) and 0.0 < rho <= 1.0):
        raise ValueError(f"rho must be in (0, 1], got {rho!r}")
    policy = mask.bool()
    values = entropy[policy]
    if values.numel() == 0:
        return torch.zeros_like(entropy)
    keep_count = max(1, math.ceil(rho * values.numel()))
    cut = torch.topk(values, keep_count, sorted=False).values.min()
    keep = policy & (entropy >= cut)
    return advantages.to(entropy.dtype)[:, None] * keep.to(entropy.dtype)


def rlsd_advantages(
    advantages: torch.Tensor,
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    lam: float = 0.5,
    eps_w: float = 0.2,
) -> torch.Tensor:
    """RLSD's teacher-ratio token weights on the trajectory advantage.

    Args:
        advantages: ``[B]`` trajectory advantages.
        student_logprobs: ``[B, T]`` log pi(a_t | s_t) of the sampled tokens.
        teacher_logprobs: ``[B, T]`` log pi(a_t | s*_t) under the ground-truth-conditioned teacher.
        mask: ``[B, T]`` 1 for policy tokens.
        lam: mixing weight; ``eps_w``: clip half-width of the ratio.

    Returns:
        ``[B, T]`` token advantages, 0 where ``mask == 0``.
    """
    check_mask(mask)
    check_tokens("student_logprobs", student_logprobs, tuple(mask.shape))
    check_tokens("teacher_logprobs", teacher_logprobs, tuple(mask.shape))
    check_vector("advantages", advantages)
    check_batch_size("advantages", advantages, mask.shape[0])
    dtype = torch.promote_types(student_logprobs.dtype, teacher_logprobs.dtype)
    a = advantages.to(dtype)[:, None]
    gap = teacher_logprobs.to(dtype) - student_logprobs.to(dtype)
    # clamp before exp: beyond +-20 nats the clip decides anyway, and exp never overflows
    ratio = torch.exp((torch.sign(a) * gap).clamp(-20.0, 20.0)).clamp(1.0 - eps_w, 1.0 + eps_w)
    return a * ((1.0 - lam) + lam * ratio) * mask.to(dtype)


@register_estimator("top_entropy", config=TopEntropyConfig, needs=("entropy",),
                    paper="arXiv 2506.01939",
                    description="only the top-rho highest-entropy tokens keep A")
def top_entropy(batch: CreditBatch, config: TopEntropyConfig) -> torch.Tensor:
    """:func:`top_entropy_advantages` on ``batch``'s GRPO advantage."""
    # the registry's batch.require(needs) has checked that the fields needed here are set
    return top_entropy_advantages(outcome_advantages(batch, config),
                                  cast(torch.Tensor, batch.entropy), batch.mask, rho=config.rho)


@register_estimator("rlsd", config=RLSDConfig, needs=("student_logprobs", "teacher_logprobs"),
                    paper="arXiv 2604.03128",
                    description="RLSD: clipped teacher/student ratio token weights")
def rlsd(batch: CreditBatch, config: RLSDConfig) -> torch.Tensor:
    """:func:`rlsd_advantages` on ``batch``'s GRPO advantage."""
    return rlsd_advantages(outcome_advantages(batch, config),
                           cast(torch.Tensor, batch.student_logprobs),
                           cast(torch.Tensor, batch.teacher_logprobs), batch.mask,
                           lam=config.lam, eps_w=config.eps_w)
