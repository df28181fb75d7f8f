"""Policy-gradient losses over token-level advantages: PPO's clipped surrogate, the KL penalty
to the initial policy, and on-policy self-distillation. Pure functions: tensors in, tensors out.

Shapes: every per-token tensor is ``[B, T]`` over the response, right-padded, with ``mask`` 1 on
trained tokens (docs/design.md). Losses are aggregated with verl's ``loss_agg_mode`` semantics; the
normalisers can be given for the whole mini-batch so that gradient accumulation over
micro-batches sums to exactly the mini-batch loss. The knobs (clip range, ``agg_mode``, KL
estimator) have no defaults here: the trainer's ``loss`` config section is their one home.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KL_TYPES", "LOSS_AGG_MODES", "PolicyLossStats", "aggregate", "kl_penalty",
           "ppo_policy_loss"]

# The reductions :func:`aggregate` implements (verl's ``loss_agg_mode`` names).
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                   "seq-mean-token-sum-norm")
# The per-token KL estimators :func:`kl_penalty` implements.
KL_TYPES: tuple[str, ...] = ("low_var_kl", "k1", "k2")


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_seqs: int | None = None,
    num_tokens: float | None = None,
    horizon: int | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    Modes (verl's ``agg_loss``):
        ``token-mean``: ``sum(loss * mask) / num_tokens`` (every token of the mini-batch weighs
            the same; long answers weigh more).
        ``seq-mean-token-sum``: ``sum(loss * mask) / num_seqs``.
        ``seq-mean-token-mean``: ``sum_b (sum_t loss * mask / sum_t mask) / num_seqs`` (every
            sequence weighs the same).
        ``seq-mean-token-sum-norm``: ``sum(loss * mask) / (num_seqs * horizon)`` with a constant
            horizon (Dr.GRPO). verl divides by the horizon only; the extra mean over sequences
            here keeps the scale independent of the batch size.

    Args:
        loss_mat: ``[B, T]`` per-token loss. ``mask``: ``[B, T]`` 0/1.
        num_seqs: sequences in the whole mini-batch (default ``B``).
        num_tokens: masked-in tokens in the whole mini-batch (default ``mask.sum()``).
        horizon: the constant length for ``seq-mean-token-sum-norm`` (default ``T``).
    """
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must "
                         "be the same [B, T] shape")
    mask = mask.to(loss_mat.dtype)
    num_seqs = loss_mat.shape[0] if num_seqs is None else num_seqs
    total = (loss_mat * mask).sum()
    if mode == "token-mean":
        tokens = mask.sum() if num_tokens is None else num_tokens
        return total / max(float(tokens), 1.0)
    if mode == "seq-mean-token-sum":
        return total / max(num_seqs, 1)
    if mode == "seq-mean-token-mean":
        per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / max(num_seqs, 1)
    if mode == "seq-mean-token-sum-norm":
        horizon = loss_mat.shape[1] if horizon is None else horizon
        return total / (max(num_seqs, 1) * horizon)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; choose from {', '.join(LOSS_AGG_MODES)}")


@dataclass
class PolicyLossStats:
    """Health numbers of one policy-loss evaluation (sums over masked tokens, so micro-batches
    add up; divide by the token count for means).

    Attributes:
        clipped: tokens whose clipped branch was taken.
        approx_kl: sum of ``old_logprob - logprob`` (k1 estimate of KL(old || new) per token).
        ratio_max: the largest ratio seen.
        tokens: masked-in tokens.
    """

    clipped: float
    approx_kl: float
    ratio_max: float
    tokens: float


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str,
    num_seqs: int | None = None,
    num_tokens: float | None = None,
    horizon: int | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """PPO clipped surrogate with token-level advantages and an asymmetric clip range.

    Per token: ``r = exp(logprob - old_logprob)``,
    ``loss = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))``, then :func:`aggregate`.

    Args:
        logprobs: ``[B, T]`` log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: ``[B, T]`` the same under the policy that sampled them (no grad).
        advantages: ``[B, T]`` token-level advantages (e.g. GEAR's ``Ahat``).
        mask: ``[B, T]`` 0/1 trained-token mask.
        clip_low, clip_high: clip range ``[1 - clip_low, 1 + clip_high]``.
        agg_mode, num_seqs, num_tokens, horizon: see :func:`aggregate`.

    Returns:
        ``(loss, stats)``: the scalar loss and :class:`PolicyLossStats`.
    """
    shape = logprobs.shape
    for name, tensor in (("old_logprobs", old_logprobs), ("advantages", advantages),
                         ("mask", mask)):
        if tensor.shape != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    old_logprobs, advantages = old_logprobs.detach(), advantages.detach()
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    loss = aggregate(loss_mat, mask, agg_mode, num_seqs=num_seqs, num_tokens=num_tokens,
                     horizon=horizon)
    with torch.no_grad():
        on = mask > 0
        stats = PolicyLossStats(
            clipped=float(((clipped > unclipped) & on).sum()),
            approx_kl=float((-log_ratio)[on].sum()),
            ratio_max=float(ratio[on].max()) if bool(on.any()) else 1.0,
            tokens=float(on.sum()),
        )
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the current policy and the reference, ``[B, T]``.

    ``k1``: ``logp - ref``; ``k2``: ``0.5 (logp - ref)^2``; ``low_var_kl`` (k3, Schulman):
    ``exp(ref - logp) - (ref - logp) - 1`` clamped to ``[-10, 10]`` as in verl.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"ref_logprobs has shape {tuple(ref_logprobs.shape)}, expected "
                         f"{tuple(logprobs.shape)}")
    diff = logprobs - ref_logprobs.detach()
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "low_var_kl":
        log_ratio = (-diff).clamp(-20.0, 20.0)
        return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl_type {kind!r}; choose from {', '.join(KL_TYPES)}")
