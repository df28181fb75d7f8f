"""Token-level baselines GEAR is compared with.

- Top-entropy mask: Wang et al., "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
  Effective RL for LLM Reasoning", arXiv 2506.01939, Sec. 4 (policy gradient only on the top
  20% highest-entropy tokens). Authors' code: Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR,
  ``verl/trainer/ppo/core_algos.py`` ``get_global_entropy_top_mask`` (exactly ``k`` tokens by
  ``torch.topk``), called in ``verl/workers/actor/dp_actor.py`` ``update_policy`` on each PPO
  micro-batch with the current policy's entropy; ``compute_policy_loss_vanilla`` then
  aggregates the loss over the selected tokens only. ``TopEntropyConfig.selection`` offers both
  that (``micro_batch``, applied by the trainer through this estimator's ``update_mask``) and a
  batch-level mask at credit time (``batch``, the default).
- RLSD: arXiv 2604.03128, the token reweighting
  ``Ahat_t = A * ((1 - lam) + lam * clip(exp(sign(A) * d_t), 1 - eps_w, 1 + eps_w))``
  with ``d_t = log pi(a_t | s*_t) - log pi(a_t | s_t)`` (teacher minus student). Authors' code:
  iie-ycx/RLSD, ``verl/workers/actor/dp_opsd_actor.py`` ``_build_stgca_advantages`` (the same
  formula, with the ``negative_only`` and thought-span options) and the ``lam`` schedule in
  ``verl/trainer/opsd_trainer.py`` (``effective_lambda``).

Where RLSD's two log-probs come from, per engine:

- gear-rl's trainer: both from the no-grad scoring pass before the update
  (``gear_rl.signals.token_signals``): the student's are PPO's old log-probs of the sampled
  tokens; the teacher's are the same tokens after the ground-truth-conditioned teacher prompt,
  under the same (current) weights.
- verl: the sampled tokens' ``old_log_probs`` from the actor's log-prob pass, and the teacher
  rows the plugin's teacher pass scores with the actor after the hinted prompt.
- TRL: the adapter's own signal pass on TRL's completions (student prompt and teacher prompt,
  the unwrapped policy, no grad).

The authors differ in two ways that are not knobs here: their student log-probs are the current
policy's in each update micro-batch (detached), equal to the old ones on the first on-policy
pass only; and their example scores the teacher with a frozen copy of the initial policy,
re-synced every 20 steps (``rlsd_teacher_sync_interval``), not the current weights.

GEAR's own ablations (token-KL weights, KL-only, entropy-only and entropy-window segments) are
``gear.gear_advantages`` with ``GEARConfig.segmentation`` changed; the registry names them.
"""

from __future__ import annotations

from typing import cast

import torch

from gear_rl.credit._validate import check_batch_size, check_mask, check_tokens, check_vector
from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.config import RLSDConfig, TopEntropyConfig
from gear_rl.credit.grpo import outcome_advantages
from gear_rl.credit.registry import register_estimator

# ----------------------------------------------------------------------------- top-entropy


def top_entropy_count(n: int, rho: float) -> int:
    """How many of ``n`` tokens the top-``rho`` mask keeps: ``ceil(rho * n)``, at least 1 when
    ``n > 0``, computed as the authors do (``int(rho * n + 0.9999)``). That also absorbs float
    noise (``0.28 * 25 == 7.000000000000001`` keeps 7, where ``math.ceil`` would keep 8); it
    rounds down only where ``rho * n`` is within 1e-4 above an integer."""
    if n <= 0:
        return 0
    return max(1, int(n * rho + 0.9999))


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, *,
                     rho: float = TopEntropyConfig.rho) -> torch.Tensor:
    """``[B, T]`` bool: exactly :func:`top_entropy_count` ``(n, rho)`` of the ``n`` policy tokens,
    highest entropy first.

    Ties at the cut are broken by position: the earlier token in row-major order (lower row,
    then lower position) is kept. ``torch.topk``, which the authors use, keeps the same number
    and the same multiset of entropy values, but which of several tied tokens it keeps is an
    implementation detail of the device.

    Args:
        entropy: ``[B, T]`` entropy (nats).
        mask: ``[B, T]`` 1 for policy tokens (the only candidates).
        rho: fraction kept, in ``(0, 1]``.
    """
    check_mask(mask)
    check_tokens("entropy", entropy, tuple(mask.shape))
    if isinstance(rho, bool) or not (isinstance(rho, (int, float)) and 0.0 < rho <= 1.0):
        raise ValueError(f"rho must be in (0, 1], got {rho!r}")
    policy = mask.bool()
    values = entropy[policy]  # row-major order
    keep = torch.zeros_like(policy)
    count = top_entropy_count(values.numel(), float(rho))
    if count == 0:
        return keep
    # a stable descending sort keeps equal values in position order: earlier tokens win ties
    order = torch.sort(values, descending=True, stable=True).indices[:count]
    chosen = torch.zeros(values.numel(), dtype=torch.bool, device=values.device)
    chosen[order] = True
    keep[policy] = chosen
    return keep


def top_entropy_advantages(
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    rho: float = TopEntropyConfig.rho,
) -> torch.Tensor:
    """Keep the advantage only on the batch's top-``rho`` highest-entropy policy tokens.

    Args:
        advantages: ``[B]`` trajectory advantages.
        entropy: ``[B, T]`` student entropy (nats).
        mask: ``[B, T]`` 1 for policy tokens.
        rho: fraction kept over all policy tokens of the batch: exactly ``ceil(rho * n)``
            (:func:`top_entropy_mask`; ties broken by position).

    Returns:
        ``[B, T]`` ``A_i * keep_t * mask_t`` in ``entropy``'s dtype.
    """
    check_mask(mask)
    check_tokens("entropy", entropy, tuple(mask.shape))
    check_vector("advantages", advantages)
    check_batch_size("advantages", advantages, mask.shape[0])
    keep = top_entropy_mask(entropy, mask, rho=rho)
    return advantages.to(entropy.dtype)[:, None] * keep.to(entropy.dtype)


def top_entropy_update_mask(entropy: torch.Tensor, mask: torch.Tensor,
                            config: TopEntropyConfig) -> torch.Tensor | None:
    """The update-time selection of ``selection="micro_batch"``: the micro-batch's top-``rho``
    policy tokens by the current policy's ``entropy`` (``[b, t]`` bool), None for ``batch``.
    The count, ``ceil(rho * n)`` of the micro-batch's ``n`` tokens, depends on ``mask`` only."""
    if config.selection != "micro_batch":
        return None
    return top_entropy_mask(entropy, mask, rho=config.rho)


# ----------------------------------------------------------------------------- RLSD


def rlsd_lambda(lam: float, step: int | None, *, warmup_steps: int | None = None,
                decay_steps: int | None = None) -> float:
    """``lam`` at the 1-based training ``step`` under the authors' schedule: linear warm-up
    ``lam * step / warmup_steps`` while ``step < warmup_steps``, then linear decay
    ``lam * max(0, 1 - (step - warmup_steps) / decay_steps)``; constant where unset.

    Raises ``ValueError`` when a schedule is set and ``step`` is None or below 1.
    """
    if warmup_steps is None and decay_steps is None:
        return lam
    if step is None:
        raise ValueError("rlsd: credit.lam_warmup_steps / credit.lam_decay_steps need the "
                         "training step, and this batch has none (CreditBatch.step is None; "
                         "gear-rl's trainer sets it, verl and TRL do not yet)")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"rlsd: the training step must be an integer >= 1, got {step!r}")
    warmup = warmup_steps or 0
    if warmup > 0 and step < warmup:
        return lam * step / warmup
    if decay_steps is not None:
        return lam * max(0.0, 1.0 - (step - warmup) / decay_steps)
    return lam


def rlsd_advantages(
    advantages: torch.Tensor,
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    lam: float = RLSDConfig.lam,
    eps_w: float = RLSDConfig.eps_w,
    negative_only: bool = False,
    thought_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """RLSD's teacher-ratio token weights on the trajectory advantage.

    Args:
        advantages: ``[B]`` trajectory advantages.
        student_logprobs: ``[B, T]`` log pi(a_t | s_t) of the sampled tokens.
        teacher_logprobs: ``[B, T]`` log pi(a_t | s*_t) under the ground-truth-conditioned teacher.
        mask: ``[B, T]`` 1 for policy tokens.
        lam: mixing weight; ``eps_w``: clip half-width of the ratio.
        negative_only: reweight only rows with ``A < 0``; the others keep ``A``.
        thought_mask: ``[B, T]`` 0/1, reweight only where it is 1 (the others keep ``A``);
            None reweights every policy token.

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
    weight = (1.0 - lam) + lam * ratio
    one = torch.ones_like(weight)
    if negative_only:
        weight = torch.where(a < 0, weight, one)
    if thought_mask is not None:
        if not isinstance(thought_mask, torch.Tensor) or tuple(thought_mask.shape) != tuple(
                mask.shape):
            raise ValueError(f"thought_mask must be a [B, T] tensor of mask's shape "
                             f"{tuple(mask.shape)}")
        if thought_mask.dtype != torch.bool and not bool(
                ((thought_mask == 0) | (thought_mask == 1)).all()):
            raise ValueError("thought_mask must contain only 0 and 1 (1 on thought tokens)")
        weight = torch.where(thought_mask.to(weight.device).bool(), weight, one)
    return a * weight * mask.to(dtype)


# ----------------------------------------------------------------------------- registry


@register_estimator("top_entropy", config=TopEntropyConfig, needs=("entropy",),
                    update_mask=top_entropy_update_mask, group_relative=True,
                    paper="arXiv 2506.01939",
                    description="only the top-rho highest-entropy tokens keep A")
def top_entropy(batch: CreditBatch, config: TopEntropyConfig) -> torch.Tensor:
    """:func:`top_entropy_advantages` on ``batch``'s GRPO advantage (``selection="batch"``), or
    the plain GRPO advantage on every policy token for ``micro_batch``, whose tokens the policy
    update chooses (:func:`top_entropy_update_mask`)."""
    # the registry's batch.require(needs) has checked that the fields needed here are set
    entropy = cast(torch.Tensor, batch.entropy)
    outcome = outcome_advantages(batch, config)
    if config.selection == "micro_batch":
        return outcome.to(entropy.dtype)[:, None] * batch.mask.to(entropy.dtype)
    return top_entropy_advantages(outcome, entropy, batch.mask, rho=config.rho)


@register_estimator("rlsd", config=RLSDConfig, needs=("student_logprobs", "teacher_logprobs"),
                    row_local=True, outcome_scaled=True, paper="arXiv 2604.03128",
                    description="RLSD: clipped teacher/student ratio token weights")
def rlsd(batch: CreditBatch, config: RLSDConfig) -> torch.Tensor:
    """:func:`rlsd_advantages` on ``batch``'s GRPO advantage, with ``lam`` at ``batch.step``
    under the config's schedule (:func:`rlsd_lambda`).

    ``thought_only`` reads ``batch.extras["thought_mask"]`` (``[B, T]``, 1 on tokens inside a
    thought span). The built-in trainer does not produce thought masks yet: its default model,
    SmolLM2, writes no think tags.
    """
    thought_mask = None
    if config.thought_only:
        thought_mask = batch.extras.get("thought_mask")
        if thought_mask is None:
            raise ValueError("rlsd: credit.thought_only needs CreditBatch.extras['thought_mask'] "
                             "([B, T], 1 on thought tokens), which this batch lacks; gear-rl's "
                             "trainer does not build thought masks")
    lam = rlsd_lambda(config.lam, batch.step, warmup_steps=config.lam_warmup_steps,
                      decay_steps=config.lam_decay_steps)
    return rlsd_advantages(outcome_advantages(batch, config),
                           cast(torch.Tensor, batch.student_logprobs),
                           cast(torch.Tensor, batch.teacher_logprobs), batch.mask,
                           lam=lam, eps_w=config.eps_w, negative_only=config.negative_only,
                           thought_mask=thought_mask)
