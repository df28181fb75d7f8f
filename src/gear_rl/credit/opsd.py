"""On-policy self-distillation alone (OPSD): no outcome reward in the loss.

Zhao et al., "Self-Distilled Reasoner: On-Policy Self-Distillation for Large Language Models",
arXiv 2601.18734, Sec. 3: the same model conditioned on the reference (the teacher, never
differentiated) supervises its own rollouts by minimising the per-token divergence between the
student's and the teacher's next-token distributions. There is no advantage: this estimator's
credit is zero on every token, and its declaration (``self_distillation=True``,
``uses_reward=False``) tells the trainer to drop the policy-gradient term and add the
distillation loss (``gear_rl.train.loss``; weight ``loss.opsd_coef``, 1 when left at 0). The
distillation term differentiates the divergence, so it needs ``signals.divergence`` ``full`` or
``topk`` (docs/design.md, "OPSD").

Engines whose actor gives only the sampled token's log-prob (verl) cannot differentiate a full or
top-k divergence; they take :func:`sampled_token_distillation`, the per-token reverse KL's
policy-gradient form, as the advantage: at each visited state ``s`` with ``a ~ pi``,
``E[grad log pi(a|s) * -(log pi(a|s) - log pi*(a|s*))] = -grad KL(pi(.|s) || pi*(.|s*))``
(``E[grad log pi] = 0``), the same gradient the differentiated loss follows, estimated from one
sampled token per position instead of the whole or top-k vocabulary: unbiased and noisier. The
authors' and gear-rl train's form is the differentiated one; this one is what verl's policy loss
can carry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gear_rl.credit._validate import check_mask
from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.registry import register_estimator


@dataclass(frozen=True)
class OPSDConfig:
    """OPSD has no credit knobs: its loss weight is ``loss.opsd_coef`` and its divergence is the
    signal pass's (``signals.divergence``)."""


@register_estimator("opsd", config=OPSDConfig, needs=("divergence",), uses_reward=False,
                    self_distillation=True, paper="arXiv 2601.18734",
                    description="self-distillation alone: reverse KL to the teacher, no reward")
def opsd(batch: CreditBatch, config: OPSDConfig) -> torch.Tensor:
    """``[B, T]`` zeros: OPSD learns from the distillation loss only."""
    check_mask(batch.mask)
    return torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)


def sampled_token_distillation(batch: CreditBatch) -> torch.Tensor:
    """``[B, T]`` ``-(log pi(a_t | s_t) - log pi*(a_t | s*_t))`` on policy tokens, 0 elsewhere:
    OPSD's reverse KL as a per-token advantage for an engine's policy-gradient loss (module
    docstring), from ``batch.student_logprobs`` and ``batch.teacher_logprobs`` (``[B, T]``, the
    sampled tokens'; float32 out)."""
    batch.require("opsd (sampled-token form)", "student_logprobs", "teacher_logprobs")
    check_mask(batch.mask)
    assert batch.student_logprobs is not None and batch.teacher_logprobs is not None
    policy = batch.mask.bool()
    gap = batch.student_logprobs.float() - batch.teacher_logprobs.float()
    if not bool(torch.isfinite(torch.where(policy, gap, 0.0)).all()):
        raise ValueError("opsd: student or teacher log-probs are NaN or inf on policy tokens")
    return torch.where(policy, -gap, torch.zeros_like(gap))
