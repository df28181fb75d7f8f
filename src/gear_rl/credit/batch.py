"""The batch object every registry estimator takes (see ``gear_rl.credit.get_estimator``).

Shapes follow docs/design.md: per-token tensors are ``[B, T]`` over the response, right-padded;
``mask`` is 1 on trained policy tokens and 0 on padding and observation tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class CreditBatch:
    """Everything a credit estimator may read. Only ``rewards``, ``group_ids`` and ``mask`` are
    always required; each estimator names the optional fields it needs and fails clearly when
    one is missing.

    Attributes:
        rewards: ``[B]`` scalar outcome reward per trajectory.
        group_ids: ``B`` hashable prompt ids (verl's ``uid``), or a ``[B]`` integer tensor.
        mask: ``[B, T]`` 1 for trained policy tokens, 0 for padding and observations.
        divergence: ``[B, T]`` per-token reverse KL student -> teacher (nats), for GEAR.
        entropy: ``[B, T]`` per-token student entropy (nats).
        student_logprobs: ``[B, T]`` log pi(a_t | s_t) of the sampled token.
        teacher_logprobs: ``[B, T]`` log pi(a_t | s*_t), the ground-truth-conditioned teacher.
        extras: estimator-specific inputs (step-level methods: step spans, state keys, ...;
            RLSD's ``thought_mask``).
        step: the 1-based training step, for estimators with a schedule (RLSD's ``lam``
            warm-up and decay); ``None`` where the engine does not say.
        applies_update_mask: the engine applies the estimator's update-time token selection
            (``Estimator.update_mask``) in its policy loss; an estimator whose config selects
            there refuses a batch without it (gear-rl's trainer sets it; verl and TRL do not).
    """

    rewards: torch.Tensor
    group_ids: Sequence[Hashable] | torch.Tensor
    mask: torch.Tensor
    divergence: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    student_logprobs: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    step: int | None = None
    applies_update_mask: bool = False

    def require(self, estimator: str, *names: str) -> None:
        """Raise ``ValueError`` naming every field in ``names`` that is ``None``."""
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise ValueError(
                f"estimator {estimator!r} needs CreditBatch field(s) {missing}, which are None; "
                "run the signal pass (gear_rl.signals.token_signals) to fill them"
            )
