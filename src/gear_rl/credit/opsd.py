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
