"""GEAR token weights on top of a step-level advantage (beyond the papers).

GEAR (arXiv 2605.11853; DESIGN.md, "GEAR, as this project specifies it") reshapes one scalar
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
- ``base`` picks the step estimator, ``base_config`` its config (``None``: its defaults with this
  config's ``norm_by_std`` and ``eps``; a given ``base_config`` must agree with them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gear_rl.credit._validate import check_tokens
from gear_rl.credit.config import GEARConfig, OutcomeConfig
from gear_rl.credit.gear import gear_weights
from gear_rl.credit.steps.common import (
    StepInputs,
    broadcast_steps,
    check_outcomes,
    check_step_inputs,
    output_dtype,
)
from gear_rl.credit.steps.gagpo import GAGPOConfig, gagpo_step_advantages_from_inputs
from gear_rl.credit.steps.gated_bepo import GatedBEPOConfig, gated_bepo_step_advantages_from_inputs
from gear_rl.credit.steps.gigpo import GiGPOConfig, gigpo_step_advantages_from_inputs
from gear_rl.credit.steps.turn_level import (
    TurnLevelConfig,
    turn_level_step_advantages_from_inputs,
)

BASE_CONFIGS: dict[str, type[OutcomeConfig]] = {
    "turn_level": TurnLevelConfig,
    "gigpo": GiGPOConfig,
    "gagpo": GAGPOConfig,
    "gated_bepo": GatedBEPOConfig,
}
NEEDS_STATES = frozenset({"gigpo", "gagpo", "gated_bepo"})


@dataclass(frozen=True)
class GearStepsConfig(GEARConfig):
    """GEAR knobs (inherited, see :class:`~gear_rl.credit.config.GEARConfig`) plus the step
    estimator underneath.

    Attributes:
        base: ``turn_level``, ``gigpo``, ``gagpo`` or ``gated_bepo``.
        base_config: that estimator's config; ``None`` for its defaults (with this config's
            ``norm_by_std`` and ``eps``).
    """

    base: str = "gigpo"
    base_config: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.base not in BASE_CONFIGS:
            raise ValueError(f"base must be one of {sorted(BASE_CONFIGS)}, got {self.base!r}")
        cls = BASE_CONFIGS[self.base]
        if self.base_config is not None:
            if not isinstance(self.base_config, cls):
                raise ValueError(f"base_config for base {self.base!r} must be a {cls.__name__}, "
                                 f"got {type(self.base_config).__name__}")
            for name in ("norm_by_std", "eps"):
                if getattr(self.base_config, name) != getattr(self, name):
                    raise ValueError(f"base_config.{name}={getattr(self.base_config, name)!r} "
                                     f"contradicts {name}={getattr(self, name)!r}")

    @property
    def resolved_base_config(self) -> OutcomeConfig:
        """``base_config``, or the base's defaults with this config's outcome fields."""
        if self.base_config is not None:
            return self.base_config
        return BASE_CONFIGS[self.base](norm_by_std=self.norm_by_std, eps=self.eps)

    def gear_config(self) -> GEARConfig:
        """The plain GEAR part of this config."""
        own = {f.name for f in dataclasses.fields(GEARConfig)}
        return GEARConfig(**{name: getattr(self, name) for name in own})


def base_step_advantages(outcomes: torch.Tensor, steps: StepInputs,
                         group_ids: Sequence[Hashable] | torch.Tensor, base: str,
                         config: OutcomeConfig) -> list[list[float]]:
    """Per-step advantages of the step estimator ``base`` from checked inputs."""
    if base in NEEDS_STATES and steps.state_keys is None:
        raise ValueError(f"base {base!r} needs state_keys")
    if base == "turn_level":
        return turn_level_step_advantages_from_inputs(outcomes, steps, group_ids, config)
    if base == "gigpo":
        return gigpo_step_advantages_from_inputs(outcomes, steps, group_ids, config)
    if base == "gagpo":
        return gagpo_step_advantages_from_inputs(outcomes, steps, config)
    return gated_bepo_step_advantages_from_inputs(outcomes, steps, group_ids, config)


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


def gear_steps_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    mask: torch.Tensor,
    divergence: torch.Tensor,
    entropy: torch.Tensor,
    step_spans: Sequence[Sequence[tuple[int, int]]],
    state_keys: Sequence[Sequence[Hashable]] | None = None,
    step_rewards: Sequence[Sequence[float]] | None = None,
    config: GearStepsConfig = GearStepsConfig(),
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
        config: GEAR knobs plus the base step estimator.

    Returns:
        ``[B, T]`` advantages (float64 if ``rewards`` is, else float32), 0 where ``mask == 0``.
    """
    if not isinstance(config, GearStepsConfig):
        raise ValueError(f"config must be a GearStepsConfig, got {type(config).__name__}")
    check_outcomes(rewards, mask)
    steps = check_step_inputs(mask, group_ids, step_spans, step_rewards, state_keys,
                              require_states=config.base in NEEDS_STATES)
    per_step = base_step_advantages(rewards, steps, group_ids, config.base,
                                    config.resolved_base_config)
    dtype = output_dtype(rewards)
    base = broadcast_steps(per_step, steps.spans, mask, dtype)
    return gear_reweight(base, divergence, entropy, mask, config.gear_config())
