"""The estimator registry: name -> a callable with one signature, ``estimator(batch, config)``.

Every estimator takes a :class:`~gear_rl.credit.batch.CreditBatch` and returns ``[B, T]``
token-level advantages, 0 where ``batch.mask == 0``. ``estimator.needs`` names the signal fields
it reads (the trainer runs the signal pass only when it is non-empty); ``estimator.config_cls``
is its config dataclass; ``estimator.fixed`` are config fields the name pins (an ablation's
``segmentation``), which a passed config may not contradict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from gear_rl.credit._validate import check_batch_size, check_mask, check_vector
from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.config import GEARConfig, OutcomeConfig, RLSDConfig, TopEntropyConfig
from gear_rl.credit.gear import gear_advantages
from gear_rl.credit.grpo import grpo_advantages
from gear_rl.credit.steps import (
    GAGPOConfig,
    GatedBEPOConfig,
    GearStepsConfig,
    GiGPOConfig,
    TurnLevelConfig,
)
from gear_rl.credit.steps.common import broadcast_steps, output_dtype, step_inputs_from_extras
from gear_rl.credit.steps.gear_steps import NEEDS_STATES, base_step_advantages, gear_reweight
from gear_rl.credit.token import rlsd_advantages, top_entropy_advantages

EstimatorFn = Callable[[CreditBatch, Any], torch.Tensor]


@dataclass(frozen=True)
class Estimator:
    """A registered credit estimator. Call it as ``estimator(batch, config=None)``."""

    name: str
    fn: EstimatorFn
    config_cls: type[OutcomeConfig]
    needs: tuple[str, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def make_config(self, **overrides: Any) -> OutcomeConfig:
        """This estimator's config with ``overrides``; unknown or pinned fields raise."""
        valid = {f.name for f in dataclasses.fields(self.config_cls)}
        unknown = sorted(set(overrides) - valid)
        if unknown:
            raise ValueError(
                f"estimator {self.name!r} has no config field(s) {unknown}; valid: {sorted(valid)}"
            )
        for key, value in overrides.items():
            if key in self.fixed and self.fixed[key] != value:
                raise ValueError(
                    f"estimator {self.name!r} pins {key}={self.fixed[key]!r}; got {value!r} "
                    f"(use estimator 'gear' to choose {key} freely)"
                )
        return self.config_cls(**{**overrides, **self.fixed})

    def __call__(self, batch: CreditBatch, config: OutcomeConfig | None = None) -> torch.Tensor:
        """``[B, T]`` token-level advantages for ``batch`` (0 where ``batch.mask == 0``)."""
        if not isinstance(batch, CreditBatch):
            raise ValueError(f"batch must be a CreditBatch, got {type(batch).__name__}")
        if config is None:
            config = self.make_config()
        elif not isinstance(config, self.config_cls):
            raise ValueError(
                f"estimator {self.name!r} takes a {self.config_cls.__name__}, "
                f"got {type(config).__name__}"
            )
        else:
            for key, value in self.fixed.items():
                if getattr(config, key) != value:
                    raise ValueError(
                        f"estimator {self.name!r} pins {key}={value!r}; config has "
                        f"{key}={getattr(config, key)!r}"
                    )
        batch.require(self.name, *self.needs)
        check_mask(batch.mask, values=False)
        check_batch_size("rewards", batch.rewards, batch.mask.shape[0])
        return self.fn(batch, config)


def _outcome(batch: CreditBatch, config: OutcomeConfig) -> torch.Tensor:
    """``[B]`` GRPO (or Dr.GRPO) trajectory advantages."""
    return grpo_advantages(batch.rewards, batch.group_ids, norm_by_std=config.norm_by_std,
                           eps=config.eps)


def _broadcast(batch: CreditBatch, config: OutcomeConfig) -> torch.Tensor:
    check_mask(batch.mask)
    advantages = _outcome(batch, config)  # floating: grpo_advantages rejects other rewards
    return advantages[:, None] * batch.mask.to(advantages.dtype)


def _gear(batch: CreditBatch, config: GEARConfig) -> torch.Tensor:
    return gear_advantages(_outcome(batch, config), batch.divergence, batch.entropy, batch.mask,
                           config)


def _top_entropy(batch: CreditBatch, config: TopEntropyConfig) -> torch.Tensor:
    return top_entropy_advantages(_outcome(batch, config), batch.entropy, batch.mask,
                                  rho=config.rho)


def _rlsd(batch: CreditBatch, config: RLSDConfig) -> torch.Tensor:
    return rlsd_advantages(_outcome(batch, config), batch.student_logprobs,
                           batch.teacher_logprobs, batch.mask, lam=config.lam, eps_w=config.eps_w)


def _step_method(name: str) -> EstimatorFn:
    """A registry function for the step estimator ``name`` (inputs in ``batch.extras``)."""
    def run(batch: CreditBatch, config: OutcomeConfig) -> torch.Tensor:
        check_vector("rewards", batch.rewards)
        steps = step_inputs_from_extras(name, batch.mask, batch.group_ids, batch.extras,
                                        require_states=name in NEEDS_STATES)
        per_step = base_step_advantages(batch.rewards, steps, batch.group_ids, name, config)
        return broadcast_steps(per_step, steps.spans, batch.mask, output_dtype(batch.rewards))
    return run


def _gear_steps(batch: CreditBatch, config: GearStepsConfig) -> torch.Tensor:
    check_vector("rewards", batch.rewards)
    steps = step_inputs_from_extras("gear_steps", batch.mask, batch.group_ids, batch.extras,
                                    require_states=config.base in NEEDS_STATES)
    per_step = base_step_advantages(batch.rewards, steps, batch.group_ids, config.base,
                                    config.resolved_base_config)
    base = broadcast_steps(per_step, steps.spans, batch.mask, output_dtype(batch.rewards))
    return gear_reweight(base, batch.divergence, batch.entropy, batch.mask, config.gear_config())


_GEAR_NEEDS = ("divergence", "entropy")


def _gear_variant(name: str, segmentation: str, description: str) -> Estimator:
    return Estimator(name, _gear, GEARConfig, _GEAR_NEEDS,
                     MappingProxyType({"segmentation": segmentation}), description)


ESTIMATORS: Mapping[str, Estimator] = MappingProxyType({
    e.name: e for e in (
        Estimator("grpo", _broadcast, OutcomeConfig, (), MappingProxyType({"norm_by_std": True}),
                  "GRPO: group-normalised outcome advantage on every token"),
        Estimator("dr_grpo", _broadcast, OutcomeConfig, (),
                  MappingProxyType({"norm_by_std": False}),
                  "Dr.GRPO: group-centred outcome advantage, no std division"),
        Estimator("gear", _gear, GEARConfig, _GEAR_NEEDS, MappingProxyType({}),
                  "GEAR: divergence/entropy segments, sign-aware weights (segmentation free)"),
        _gear_variant("gear_token_kl", "none", "GEAR ablation: token-level KL weights"),
        _gear_variant("gear_kl_only", "kl_only", "GEAR ablation: segments from KL spikes only"),
        _gear_variant("gear_entropy_only", "entropy_only",
                      "GEAR ablation: onsets from entropy spikes"),
        _gear_variant("gear_entropy_window", "entropy_window",
                      "GEAR ablation: termination by a trailing mean-entropy window"),
        Estimator("top_entropy", _top_entropy, TopEntropyConfig, ("entropy",),
                  MappingProxyType({}), "only the top-rho highest-entropy tokens keep A"),
        Estimator("rlsd", _rlsd, RLSDConfig, ("student_logprobs", "teacher_logprobs"),
                  MappingProxyType({}), "RLSD: clipped teacher/student ratio token weights"),
    )
})


# Step-level methods for multi-turn agents. They read per-step inputs from ``batch.extras``
# (``step_spans``, ``step_rewards`` optional, ``state_keys`` for all but ``turn_level``; see
# ``gear_rl.credit.steps.STEP_EXTRAS``) and fail naming the missing keys. Kept apart from
# ``ESTIMATORS``, whose members run on any batch of token signals; ``get_estimator`` finds both.
STEP_ESTIMATORS: Mapping[str, Estimator] = MappingProxyType({
    e.name: e for e in (
        Estimator("turn_level", _step_method("turn_level"), TurnLevelConfig, (),
                  MappingProxyType({}), "MT-GRPO: group-normalised turn rewards + outcome"),
        Estimator("gigpo", _step_method("gigpo"), GiGPOConfig, (), MappingProxyType({}),
                  "GiGPO: episode advantage + omega * anchor-state step advantage"),
        Estimator("gagpo", _step_method("gagpo"), GAGPOConfig, (), MappingProxyType({}),
                  "GAGPO: GAE over a grouped state-value proxy, group-normalised"),
        Estimator("gated_bepo", _step_method("gated_bepo"), GatedBEPOConfig, (),
                  MappingProxyType({}),
                  "Gated-BEPO: Bellman backups on the rollout graph, gated at branching states"),
        Estimator("gear_steps", _gear_steps, GearStepsConfig, _GEAR_NEEDS, MappingProxyType({}),
                  "GEAR token weights over a step-level advantage (base: gigpo by default)"),
    )
})


def get_estimator(name: str) -> Estimator:
    """The registered estimator called ``name`` (token-level or step-level); unknown names raise
    listing the valid ones."""
    try:
        return ESTIMATORS[name] if name in ESTIMATORS else STEP_ESTIMATORS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown estimator {name!r}; registered: "
            f"{sorted(ESTIMATORS)}, step-level: {sorted(STEP_ESTIMATORS)}"
        ) from None
