"""gear-rl's credit estimators as verl advantage estimators (``algorithm.adv_estimator=<name>``).

GEAR: "Granularity-adaptivE Advantage Reweighting", arXiv 2605.11853. The maths is
``gear_rl.credit``; this module adapts verl's calling convention to it.

verl 0.9.1 calls a registered estimator as ``fn(token_level_rewards=[B, T], response_mask=[B, T],
config=<algorithm config>, index=<uid array>)`` (``ray_trainer.compute_advantage``) and never passes
entropy or log-probs. Estimators that need per-token signals (GEAR and its ablations, top-entropy,
RLSD) therefore read them from :func:`provide_signals`, which the ``gear`` trainer mode
(``gear_rl.integrations.verl.trainer``) opens around verl's own advantage step after it has fetched
the student's entropy and log-probs and run the teacher pass. Outside that context those estimators
raise a ``ValueError`` that says so; ``dr_grpo`` and ``gear_rl_grpo`` need nothing and run in any
trainer.

Names: every registry name is registered as is, except ``grpo``, which verl already owns (and
special-cases); gear-rl's GRPO is ``gear_rl_grpo`` (it differs from verl's only for groups of one,
which get advantage 0 here and their raw score in verl).

Knobs live under ``algorithm.gear`` (see :class:`VerlGEARSettings`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from gear_rl.credit import (
    CreditBatch,
    Estimator,
    GEARConfig,
    estimator_names,
    gear_segments,
    gear_weights,
    get_estimator,
    grpo_advantages,
)
from gear_rl.credit.config import OutcomeConfig
from gear_rl.signals.teacher import REFERENCE_KINDS, TeacherPromptConfig

# gear-rl name -> the name it is registered under in verl, where verl already uses the name.
RENAMED: Mapping[str, str] = {"grpo": "gear_rl_grpo"}
DIVERGENCE_ESTIMATORS: tuple[str, ...] = ("k3", "k1")
# The largest teacher/student log-ratio k3 exponentiates: e**80 is about 5.5e34, still finite in
# float32. Past it the teacher is so much likelier than the student that the exact size no longer
# matters after GEAR's per-trajectory normalisation.
MAX_LOG_RATIO = 80.0

# Integration-level keys of ``algorithm.gear`` (the rest are estimator config fields).
_SETTINGS_KEYS = ("divergence", "reference_key", "reference_kind", "placement",
                  "answer_template", "solution_template", "tool_call_template")


def verl_estimator_names() -> list[str]:
    """The registry estimators verl can run: token-level ones whose reward enters the loss
    (step-level ones need per-turn inputs verl's agent loop does not pass; ``opsd`` needs a
    distillation loss verl's actor does not have)."""
    return [n for n in estimator_names(step_level=False) if get_estimator(n).uses_reward]


def verl_name(name: str) -> str:
    """The name gear-rl's estimator ``name`` has in verl's ``algorithm.adv_estimator``."""
    if name not in verl_estimator_names():
        raise ValueError(f"name must be one of {verl_estimator_names()}, got {name!r}")
    return RENAMED.get(name, name)


def gear_rl_name(verl_estimator: str) -> str | None:
    """The gear-rl registry name behind verl's ``verl_estimator``, or ``None`` if not ours."""
    for name in verl_estimator_names():
        if verl_name(name) == verl_estimator:
            return name
    return None


def _all_config_fields() -> set[str]:
    fields: set[str] = set()
    for estimator in map(get_estimator, verl_estimator_names()):
        fields.update(f.name for f in dataclasses.fields(estimator.config_cls))
    return fields


@dataclass(frozen=True)
class VerlGEARSettings:
    """``algorithm.gear`` parsed for one estimator.

    Attributes:
        estimator: the gear-rl estimator behind ``algorithm.adv_estimator``.
        config: its config (``GEARConfig`` for the GEAR family): every config field of any
            registry estimator may be set under ``algorithm.gear`` (``lambda_kl``, ``lambda_h``,
            ``alpha``, ``beta``, ``normalize``, ``segmentation``, ``window``, ``sign_aware``,
            ``mean_preserving``, ``eps``, ``norm_by_std``, ``rho``, ``lam``, ``eps_w``); fields of
            other estimators are ignored. ``norm_by_std`` defaults to verl's
            ``algorithm.norm_adv_by_std_in_grpo`` where the estimator does not pin it.
        divergence: ``k3`` (default) or ``k1``, from the sampled token's student and teacher
            log-probs; verl's log-prob pass returns only those, so ``full`` is not available here.
        reference_key: dotted path of the reference in a dataset row's non-tensor fields
            (verl's RL datasets keep the gold answer at ``reward_model.ground_truth``).
        reference_kind: ``answer``, ``solution`` or ``tool_call``: which hint template is used.
        teacher_prompt: placement and wording of the hint (``placement``, ``*_template`` keys).
    """

    estimator: Estimator
    config: OutcomeConfig
    divergence: str = "k3"
    reference_key: str = "reward_model.ground_truth"
    reference_kind: str = "answer"
    teacher_prompt: TeacherPromptConfig = field(default_factory=TeacherPromptConfig)

    @property
    def needs_teacher(self) -> bool:
        """Whether the estimator reads teacher log-probs (directly or through the divergence)."""
        return bool({"divergence", "teacher_logprobs"} & set(self.estimator.needs))


def _plain(value: Any) -> Any:
    """OmegaConf containers -> plain Python; anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl always brings omegaconf
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _get(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` for mappings, DictConfigs and verl's dataclass configs alike."""
    if config is None:
        return default
    if isinstance(config, Mapping) or hasattr(config, "keys"):
        try:
            return config.get(key, default)
        except Exception:
            return default
    return getattr(config, key, default)


def settings_from_algorithm(algorithm: Any, adv_estimator: str | None = None) -> VerlGEARSettings:
    """Parse ``algorithm.gear`` for ``adv_estimator`` (default: ``algorithm.adv_estimator``).

    Args:
        algorithm: verl's ``config.algorithm`` (a DictConfig, ``AlgoConfig`` or plain mapping),
            or ``None`` for all defaults.
        adv_estimator: a verl estimator name registered by gear-rl (e.g. ``gear``,
            ``gear_rl_grpo``).

    Raises:
        ValueError: naming the key, for an estimator that is not gear-rl's, an unknown
            ``algorithm.gear`` key or a bad value.
    """
    if adv_estimator is None:
        adv_estimator = _get(algorithm, "adv_estimator")
    adv_estimator = getattr(adv_estimator, "value", adv_estimator)  # verl's AdvantageEstimator
    name = gear_rl_name(str(adv_estimator))
    if name is None:
        raise ValueError(
            f"algorithm.adv_estimator={adv_estimator!r} is not a gear-rl estimator; choose one of "
            f"{sorted(verl_name(n) for n in verl_estimator_names())}"
        )
    estimator = get_estimator(name)
    raw = _plain(_get(algorithm, "gear")) or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"algorithm.gear must be a mapping, got {type(raw).__name__}")
    known = _all_config_fields() | set(_SETTINGS_KEYS)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"algorithm.gear has unknown key(s) {unknown}; valid: {sorted(known)}")

    own = {f.name for f in dataclasses.fields(estimator.config_cls)}
    overrides = {k: v for k, v in raw.items() if k in own}
    if "norm_by_std" in own and "norm_by_std" not in overrides and "norm_by_std" not in (
            estimator.fixed):
        norm = _get(algorithm, "norm_adv_by_std_in_grpo")
        if norm is not None:
            overrides["norm_by_std"] = bool(norm)
    try:
        config = estimator.make_config(**overrides)
    except (TypeError, ValueError) as err:
        raise ValueError(f"algorithm.gear: {err}") from err

    divergence = raw.get("divergence", "k3")
    if divergence not in DIVERGENCE_ESTIMATORS:
        raise ValueError(
            f"algorithm.gear.divergence must be one of {DIVERGENCE_ESTIMATORS} (verl returns only "
            f"the sampled token's log-probs), got {divergence!r}"
        )
    reference_key = raw.get("reference_key", "reward_model.ground_truth")
    if not isinstance(reference_key, str) or not reference_key or "" in reference_key.split("."):
        raise ValueError(
            f"algorithm.gear.reference_key must be a dotted path like "
            f"'reward_model.ground_truth', got {reference_key!r}"
        )
    reference_kind = raw.get("reference_kind", "answer")
    if reference_kind not in REFERENCE_KINDS:
        raise ValueError(
            f"algorithm.gear.reference_kind must be one of {REFERENCE_KINDS}, "
            f"got {reference_kind!r}"
        )
    prompt_overrides = {k: raw[k] for k in ("placement", "answer_template", "solution_template",
                                            "tool_call_template") if k in raw}
    try:
        teacher_prompt = TeacherPromptConfig(**prompt_overrides)
    except ValueError as err:
        raise ValueError(f"algorithm.gear: {err}") from err
    return VerlGEARSettings(estimator=estimator, config=config, divergence=divergence,
                            reference_key=reference_key, reference_kind=reference_kind,
                            teacher_prompt=teacher_prompt)


def divergence_from_logprobs(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                             mask: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token reverse-KL estimate from the sampled token's log-probs (DESIGN.md, step 2).

    Args:
        student_logprobs: ``[B, T]`` ``log pi(a_t | s_t)``.
        teacher_logprobs: ``[B, T]`` ``log pi(a_t | s*_t)``.
        mask: ``[B, T]`` 1 on policy tokens; the output is 0 elsewhere (padding may hold junk).
        estimator: ``k1`` (``log pi - log pi*``, unbiased, can be negative) or ``k3``
            (``r - 1 - log r``, ``r = pi* / pi``, >= 0; the log-ratio is capped at
            ``MAX_LOG_RATIO``).

    Returns:
        ``[B, T]`` float32 divergence, 0 where ``mask == 0``.
    """
    if estimator not in DIVERGENCE_ESTIMATORS:
        raise ValueError(f"estimator must be one of {DIVERGENCE_ESTIMATORS}, got {estimator!r}")
    for arg, value in (("student_logprobs", student_logprobs),
                       ("teacher_logprobs", teacher_logprobs), ("mask", mask)):
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            raise ValueError(f"{arg} must be a [B, T] tensor")
        if value.shape != mask.shape:
            raise ValueError(f"{arg} has shape {tuple(value.shape)}, mask has {tuple(mask.shape)}")
    policy = mask.bool()
    student = torch.where(policy, student_logprobs.double(), 0.0)
    teacher = torch.where(policy, teacher_logprobs.double(), 0.0)
    if not bool(torch.isfinite(student).all()):
        raise ValueError("student_logprobs contains NaN or inf on policy tokens")
    if not bool(torch.isfinite(teacher).all()):
        raise ValueError("teacher_logprobs contains NaN or inf on policy tokens")
    if estimator == "k1":
        divergence = student - teacher
    else:
        log_ratio = (teacher - student).clamp(max=MAX_LOG_RATIO)
        divergence = (torch.expm1(log_ratio) - log_ratio).clamp_min(0.0)
    return divergence.float()


@dataclass
class VerlSignals:
    """Per-token signals for one verl batch, in the row order of the ``DataProto`` that verl's
    ``compute_advantage`` receives. Every tensor is ``[B, T]`` over the response, right-padded.

    Attributes:
        response_mask: the mask the signals were fetched with; the estimator checks that verl's
            ``response_mask`` has its shape and no 1 where this one has 0 (rollout correction
            may switch tokens off, never on).
        entropy: student entropy (nats, at the rollout temperature).
        student_logprobs: ``old_log_probs`` of the sampled tokens.
        teacher_logprobs: the same tokens under the ground-truth-conditioned prompt.
        divergence: per-token divergence (see :func:`divergence_from_logprobs`).
        metrics: filled by the estimator with ``gear/...`` diagnostics for the trainer to log.
    """

    response_mask: torch.Tensor
    entropy: torch.Tensor | None = None
    student_logprobs: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    divergence: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def signals_from_logprobs(response_mask: torch.Tensor, *, entropy: torch.Tensor | None = None,
                          student_logprobs: torch.Tensor | None = None,
                          teacher_logprobs: torch.Tensor | None = None,
                          divergence: str = "k3") -> VerlSignals:
    """Assemble :class:`VerlSignals` from verl's fields (``entropy``, ``old_log_probs`` and the
    teacher pass's log-probs, each ``[B, T]``); the divergence is computed when both log-probs
    are given."""
    div = None
    if student_logprobs is not None and teacher_logprobs is not None:
        div = divergence_from_logprobs(student_logprobs, teacher_logprobs, response_mask,
                                       divergence)
    return VerlSignals(response_mask=response_mask, entropy=entropy,
                       student_logprobs=student_logprobs, teacher_logprobs=teacher_logprobs,
                       divergence=div)


_SIGNALS: ContextVar[VerlSignals | None] = ContextVar("gear_rl_verl_signals", default=None)


@contextlib.contextmanager
def provide_signals(signals: VerlSignals) -> Iterator[VerlSignals]:
    """Make ``signals`` visible to the gear-rl estimators that verl calls inside this block."""
    if not isinstance(signals, VerlSignals):
        raise ValueError(f"signals must be a VerlSignals, got {type(signals).__name__}")
    token = _SIGNALS.set(signals)
    try:
        yield signals
    finally:
        _SIGNALS.reset(token)


def _signal_fields(name: str, estimator: Estimator,
                   response_mask: torch.Tensor) -> tuple[VerlSignals | None, dict[str, Any]]:
    signals = _SIGNALS.get()
    if not estimator.needs:
        return signals, {}
    if signals is None:
        raise ValueError(
            f"verl estimator {verl_name(name)!r} needs per-token {list(estimator.needs)}, which "
            "verl does not pass to advantage estimators: run verl's v1 trainer with "
            "trainer.use_v1=True trainer.v1.trainer_mode=gear (or call verl's compute_advantage "
            "inside gear_rl.integrations.verl.provide_signals(...))"
        )
    if tuple(signals.response_mask.shape) != tuple(response_mask.shape):
        raise ValueError(
            f"response_mask has shape {tuple(response_mask.shape)}, but the provided signals have "
            f"{tuple(signals.response_mask.shape)}: they belong to another batch"
        )
    if bool((response_mask.bool() & ~signals.response_mask.to(response_mask.device).bool()).any()):
        raise ValueError(
            "response_mask has policy tokens where the provided signals' mask has none: the "
            "signals belong to another batch or another row order"
        )
    values: dict[str, Any] = {}
    for need in estimator.needs:
        value = getattr(signals, need, None)
        if value is None:
            raise ValueError(
                f"verl estimator {verl_name(name)!r} needs signal {need!r}, which the provided "
                "signals lack (the teacher pass did not run?)"
            )
        values[need] = value.to(response_mask.device)
    return signals, values


def _record_metrics(signals: VerlSignals, name: str, settings: VerlGEARSettings,
                    batch: CreditBatch, advantages: torch.Tensor) -> None:
    """``gear/...`` diagnostics: which regime GEAR's weights are in (DESIGN.md asks for the mean
    weight per advantage sign), how much of the response sits in segments, the divergence."""
    policy = batch.mask.bool()
    metrics = signals.metrics
    metrics["gear/advantage_abs_mean"] = _masked_mean(advantages.abs(), policy)
    if batch.divergence is not None:
        metrics["gear/divergence_mean"] = _masked_mean(batch.divergence, policy)
    if not isinstance(settings.config, GEARConfig):
        return
    config = settings.config
    outcome = grpo_advantages(batch.rewards.float(), batch.group_ids,
                              norm_by_std=config.norm_by_std, eps=config.eps)
    weights = gear_weights(outcome, batch.divergence, batch.entropy, batch.mask, config)
    onsets = gear_segments(batch.divergence, batch.entropy, batch.mask, config)
    sign = outcome[:, None].expand_as(weights)
    metrics["gear/weight_mean_pos"] = _masked_mean(weights, policy & (sign > 0))
    metrics["gear/weight_mean_neg"] = _masked_mean(weights, policy & (sign < 0))
    metrics["gear/segment_token_frac"] = _masked_mean((onsets >= 0).float(), policy)


def _masked_mean(values: torch.Tensor, where: torch.Tensor) -> float:
    count = int(where.sum())
    if count == 0:
        return math.nan
    return float(values.double()[where].sum() / count)


def make_verl_estimator(name: str) -> Any:
    """verl-signature adapter around gear-rl's estimator ``name``: ``fn(token_level_rewards,
    response_mask, config=None, index=None, **kwargs) -> (advantages, returns)``, both ``[B, T]``
    in the rewards' dtype (returns == advantages, as for verl's outcome estimators)."""
    estimator = get_estimator(name)

    def compute(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                config: Any = None, index: Any = None,
                **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if index is None:
            raise ValueError(
                f"verl estimator {verl_name(name)!r} needs index (the uid of each prompt group); "
                "the batch has no non_tensor_batch['uid']"
            )
        if not isinstance(token_level_rewards, torch.Tensor) or token_level_rewards.dim() != 2:
            raise ValueError("token_level_rewards must be a [B, T] tensor")
        settings = settings_from_algorithm(config, verl_name(name))
        signals, values = _signal_fields(name, estimator, response_mask)
        batch = CreditBatch(rewards=token_level_rewards.sum(dim=-1).float(),
                            group_ids=[_hashable(i) for i in index], mask=response_mask,
                            **values)
        advantages = estimator(batch, settings.config)
        dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else (
            torch.float32)
        advantages = advantages.to(device=token_level_rewards.device, dtype=dtype)
        if signals is not None and estimator.needs:
            _record_metrics(signals, name, settings, batch, advantages)
        return advantages, advantages

    compute.__name__ = f"compute_{verl_name(name)}_advantage"
    compute.__qualname__ = compute.__name__
    compute.__doc__ = (
        f"gear-rl estimator {name!r} for verl: {estimator.description}. Registered as "
        f"algorithm.adv_estimator={verl_name(name)}."
    )
    return compute


def _hashable(value: Any) -> Any:
    """numpy scalars and 0-d arrays -> Python values (group ids only need to hash and compare)."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return item()
    return value


# One adapter per estimator, built once, so registering twice is a no-op (verl refuses a second,
# different function under a registered name).
VERL_ESTIMATORS: Mapping[str, Any] = {verl_name(n): make_verl_estimator(n)
                                      for n in verl_estimator_names()}


def register_estimators() -> list[str]:
    """Register every gear-rl estimator with verl's ``core_algos`` (idempotent).

    Returns:
        The verl names registered.

    Raises:
        RuntimeError: when one of the names already belongs to a different verl estimator.
    """
    from verl.trainer.ppo import core_algos

    for verl_estimator, fn in VERL_ESTIMATORS.items():
        existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(verl_estimator)
        if existing is fn:
            continue
        if existing is not None:
            raise RuntimeError(
                f"verl already has an advantage estimator named {verl_estimator!r} "
                f"({existing!r}); gear-rl cannot register its own under that name"
            )
        core_algos.register_adv_est(verl_estimator)(fn)
    return list(VERL_ESTIMATORS)
