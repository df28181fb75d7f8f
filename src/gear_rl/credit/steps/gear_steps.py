"""GEAR token weights on top of a step-level advantage (beyond the papers).

GEAR (arXiv 2605.11853; docs/design.md, "GEAR, as this project specifies it") reshapes one scalar
advantage per trajectory into per-token advantages ``Ahat_t = W_t * A``, where ``W_t`` comes
from the divergence/entropy segments and the sign of ``A``. Here the advantage is per step
instead: a step-level estimator (``turn_level``, ``gigpo``, ``gagpo`` or ``gated_bepo``) gives
``A_t`` on each policy token (constant within a step), and

    ``Ahat_t = W_t(sign A_t) * A_t``

with ``W_t(+)`` and ``W_t(-)`` the weights :func:`gear_rl.credit.gear.gear_weights` gives the
whole trajectory for a positive and for a negative advantage (``A_t = 0`` gives 0).

Choices this leaves open (stated, or knobs of :class:`GearStepsConfig`):

- **Segments span steps.** Normalisation (min/max of the divergence) and the segment scan run
  over the whole trajectory's policy tokens, as in GEAR, not per step: observation tokens
  between steps are skipped, so a segment opened in one step may run into the next.
- **Mixed signs in one trajectory**: each token takes the weight of its own step's sign.
- **``mean_preserving``** divides each sign's weights by their mean over the whole trajectory
  (what ``gear_weights`` computes for that sign), not by the mean over the tokens of that sign.
- ``base`` picks the step estimator (any registered per-step estimator, plugins included),
  ``base_config`` its config (``None``: its defaults with this config's ``norm_by_std`` and
  ``eps``; a given ``base_config`` must agree with them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from gear_rl.credit._validate import check_tokens, check_vector
from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.config import GEARConfig
from gear_rl.credit.gear import gear_weights
from gear_rl.credit.registry import Estimator, estimator_names, get_estimator, register_estimator
from gear_rl.credit.steps.common import (
    broadcast_steps,
    output_dtype,
    step_advantages,
    step_inputs_from_extras,
)


def _base_estimator(base: str) -> Estimator:
    """The registered per-step estimator ``base``; anything else raises naming the valid ones."""
    valid = [n for n in estimator_names(step_level=True) if get_estimator(n).step_fn is not None]
    if base not in valid:
        raise ValueError(f"base must be one of {valid}, got {base!r}")
    return get_estimator(base)


@dataclass(frozen=True)
class GearStepsConfig(GEARConfig):
    """GEAR knobs (inherited, see :class:`~gear_rl.credit.config.GEARConfig`) plus the step
    estimator underneath.

    Attributes:
        base: a per-step estimator: ``turn_level``, ``gigpo``, ``gagpo``, ``gated_bepo``.
        base_config: that estimator's config; ``None`` for its defaults (with this config's
            ``norm_by_std`` and ``eps``).
    """

    base: str = "gigpo"
    base_config: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        cls = _base_estimator(self.base).config_cls
        if self.base_config is not None:
            if not isinstance(self.base_config, cls):
                raise ValueError(f"base_config for base {self.base!r} must be a {cls.__name__}, "
                                 f"got {type(self.base_config).__name__}")
            for name in ("norm_by_std", "eps"):
                if getattr(self.base_config, name) != getattr(self, name):
                    raise ValueError(f"base_config.{name}={getattr(self.base_config, name)!r} "
                                     f"contradicts {name}={getattr(self, name)!r}")

    @property
    def resolved_base_config(self) -> Any:
        """``base_config``, or the base's defaults with this config's outcome fields."""
        if self.base_config is not None:
            return self.base_config
        return _base_estimator(self.base).make_config(norm_by_std=self.norm_by_std, eps=self.eps)

    def gear_config(self) -> GEARConfig:
        """The plain GEAR part of this config."""
        own = {f.name for f in dataclasses.fields(GEARConfig)}
        return GEARConfig(**{name: getattr(self, name) for name in own})


def _needs_states(config: GearStepsConfig) -> bool:
    return _base_estimator(config.base).requires_states(config.resolved_base_config)


def _group_relative(config: GearStepsConfig) -> bool:
    """GEAR's weights scale the base's advantage: zero wherever the base's is."""
    return _base_estimator(config.base).needs_groups(config.resolved_base_config)


def gear_reweight(step_advantages: torch.Tensor, divergence: torch.Tensor, entropy: torch.Tensor,
                  mask: torch.Tensor, config: GEARConfig) -> torch.Tensor:
    """``W_t(sign A_t) * A_t`` for token-level advantages ``A`` (see the module docstring).

    Args:
        step_advantages: ``[B, T]`` advantages, constant within each step (any real values).
        divergence, entropy: ``[B, T]`` GEAR signals (nats).
        mask: ``[B, T]`` policy-token mask.
        config: the GEAR knobs.

    Returns:
        ``[B, T]`` reweighted advantages in ``step_advantages``' dtype, 0 where ``mask == 0``.
    """
    check_tokens("step_advantages", step_advantages, tuple(mask.shape))
    batch = mask.shape[0]
    dtype = step_advantages.dtype
    ones = torch.ones(batch, dtype=dtype, device=mask.device)
    positive = gear_weights(ones, divergence, entropy, mask, config).to(dtype)
    negative = gear_weights(-ones, divergence, entropy, mask, config).to(dtype)
    weights = torch.where(step_advantages > 0, positive, negative)
    out = weights * step_advantages * mask.to(dtype)
    return torch.where(mask.to(torch.bool), out, torch.zeros_like(out))


@register_estimator("gear_steps", config=GearStepsConfig, needs=("divergence", "entropy"),
                    fixed={"score": "divergence"}, segments=True, step_level=True,
                    needs_states=_needs_states, group_relative=_group_relative,
                    paper="arXiv 2605.11853 over a step-level base",
                    description="GEAR token weights over a step-level advantage (base: gigpo)")
def gear_steps(batch: CreditBatch, config: GearStepsConfig) -> torch.Tensor:
    """GEAR weights over the step-level advantage of ``config.base`` on ``batch`` (step inputs
    in ``batch.extras``)."""
    check_vector("rewards", batch.rewards)
    base = _base_estimator(config.base)
    steps = step_inputs_from_extras("gear_steps", batch.mask, batch.group_ids, batch.extras,
                                    require_states=_needs_states(config))
    per_step = base.step_fn(batch.rewards, steps, config.resolved_base_config)  # type: ignore[misc]
    advantages = broadcast_steps(per_step, steps.spans, batch.mask, output_dtype(batch.rewards))
    # the registry's batch.require(needs) has checked that divergence and entropy are set
    return gear_reweight(advantages, cast(torch.Tensor, batch.divergence),
                         cast(torch.Tensor, batch.entropy), batch.mask, config.gear_config())


def gear_steps_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    mask: torch.Tensor,
    divergence: torch.Tensor,
    entropy: torch.Tensor,
    step_spans: Sequence[Sequence[tuple[int, int]]],
    state_keys: Sequence[Sequence[Hashable]] | None = None,
    step_rewards: Sequence[Sequence[float]] | None = None,
    config: GearStepsConfig | None = None,
) -> torch.Tensor:
    """GEAR weights over a step-level advantage.

    Args:
        rewards: ``[B]`` outcome reward per trajectory.
        group_ids: ``B`` hashable prompt ids, or a ``[B]`` integer tensor.
        mask: ``[B, T]`` 1 on policy tokens, 0 on padding and observations.
        divergence: ``[B, T]`` per-token reverse KL student -> teacher (nats).
        entropy: ``[B, T]`` per-token student entropy (nats).
        step_spans: ``B`` lists of ``(start, end)`` response positions of each step.
        state_keys: ``B`` lists of hashable state keys (needed unless ``base="turn_level"``).
        step_rewards: ``B`` lists of per-step rewards (``None``: all zeros).
        config: GEAR knobs plus the base step estimator (``None``: the defaults).

    Returns:
        ``[B, T]`` advantages (float64 if ``rewards`` is, else float32), 0 where ``mask == 0``.
    """
    if config is None:
        config = GearStepsConfig()
    if not isinstance(config, GearStepsConfig):
        raise ValueError(f"config must be a GearStepsConfig, got {type(config).__name__}")
    base = step_advantages(config.base, rewards, group_ids, mask, step_spans, step_rewards,
                           state_keys, config.resolved_base_config)
    return gear_reweight(base, divergence, entropy, mask, config.gear_config())
