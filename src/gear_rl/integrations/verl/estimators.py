"""gear-rl's credit estimators as verl advantage estimators (``algorithm.adv_estimator=<name>``).

GEAR: "Granularity-adaptivE Advantage Reweighting", arXiv 2605.11853. The maths is
``gear_rl.credit``; this module adapts verl's calling convention to it, reading only the registry
declarations (``gear_rl.credit.registry``): which estimators exist, what each needs, its config.

verl 0.9.1 calls a registered estimator as ``fn(token_level_rewards=[B, T], response_mask=[B, T],
config=<algorithm config>, index=<uid array>)`` (``ray_trainer.compute_advantage``) and never passes
entropy or log-probs. Estimators that declare ``needs`` therefore read those signals from
:func:`provide_signals`, which the ``gear`` trainer mode (``gear_rl.integrations.verl.trainer``)
opens around verl's own advantage step after it has fetched the student's entropy and log-probs
and run the teacher pass. Outside that context they raise a ``ValueError`` that says so;
estimators that need nothing run in any trainer.

Which estimators: every token-level registry estimator whose reward enters the loss and that needs
no distillation loss (:func:`verl_estimator_names`), including those registered later by a plugin
(``algorithm.gear.plugins``, the ``GEAR_RL_PLUGINS`` environment variable, or the
``gear_rl.estimators`` entry-point group); :func:`register_estimators` registers any not yet
registered. Names: a registry name is used as is, unless verl itself defines an estimator of that
name (verl special-cases some, e.g. ``grpo``); then it is ``gear_rl_<name>`` (gear-rl's GRPO is
``gear_rl_grpo``, which differs from verl's only for groups of one: advantage 0 here, the raw
score in verl).

Knobs live under ``algorithm.gear`` (see :class:`VerlGEARSettings`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from gear_rl.credit import (
    ESTIMATORS,
    CreditBatch,
    Estimator,
    credit_diagnostics,
    estimator_names,
    get_estimator,
    load_plugins,
)
from gear_rl.credit.opsd import sampled_token_distillation
from gear_rl.runlog import DEFAULT_LOG_SAMPLES, check_run_log_settings
from gear_rl.signals.divergence import SAMPLED_TOKEN_ESTIMATORS, sampled_token_divergence
from gear_rl.signals.teacher import REFERENCE_KINDS, TeacherPromptConfig

# The prefix of a gear-rl estimator whose name verl already uses for one of its own.
RENAME_PREFIX = "gear_rl_"
# verl metric names of the credit diagnostics: "gear/" + gear_rl.credit.credit_diagnostics' names.
METRIC_PREFIX = "gear/"


def verl_estimator_names() -> list[str]:
    """The registry estimators verl can run (:meth:`Estimator.engine_limit`): token-level ones
    and step-level ones (their turn spans, per-turn rewards and state keys come from gear-rl's
    ``gear_env`` agent loop, or from the runs of policy tokens of a multi-turn tool loop:
    :mod:`gear_rl.integrations.verl.agent_loop`)."""
    return [n for n in estimator_names() if verl_unsupported(get_estimator(n)) is None]


def verl_unsupported(estimator: Estimator) -> str | None:
    """Why verl cannot run ``estimator``, or None when it can."""
    return estimator.engine_limit("verl")


def _verl_own_names() -> frozenset[str]:
    """Estimator names verl itself defines: its ``AdvantageEstimator`` enum and whatever verl's
    own modules registered."""
    from verl.trainer.ppo import core_algos

    own = {member.value for member in core_algos.AdvantageEstimator}
    own.update(name for name, fn in core_algos.ADV_ESTIMATOR_REGISTRY.items()
               if getattr(fn, "__module__", "").partition(".")[0] == "verl")
    return frozenset(own)


def _verl_names() -> dict[str, str]:
    """verl name -> registry name, for every estimator of :func:`verl_estimator_names`."""
    own = _verl_own_names()
    names: dict[str, str] = {}
    for name in verl_estimator_names():
        verl_estimator = RENAME_PREFIX + name if name in own else name
        if verl_estimator in names:
            raise ValueError(f"gear-rl estimators {names[verl_estimator]!r} and {name!r} would "
                             f"both be verl's {verl_estimator!r}; rename one")
        names[verl_estimator] = name
    return names


def verl_name(name: str) -> str:
    """The name gear-rl's estimator ``name`` has in verl's ``algorithm.adv_estimator``."""
    for verl_estimator, registry_name in _verl_names().items():
        if registry_name == name:
            return verl_estimator
    raise ValueError(f"name must be one of {verl_estimator_names()}, got {name!r}")


def gear_rl_name(verl_estimator: str) -> str | None:
    """The gear-rl registry name behind verl's ``verl_estimator``, or ``None`` if not ours."""
    return _verl_names().get(verl_estimator)


def _config_fields() -> set[str]:
    """Every config field of every estimator verl can run (each may appear in algorithm.gear)."""
    return {f.name for name in verl_estimator_names()
            for f in dataclasses.fields(get_estimator(name).config_cls)}


@dataclass(frozen=True)
class VerlGEARSettings:
    """``algorithm.gear`` parsed for one estimator. Every key is optional; the defaults are the
    ones below and those of the estimator's own config class and of ``TeacherPromptConfig``.

    Attributes:
        estimator: the gear-rl estimator behind ``algorithm.adv_estimator``.
        config: its config (its registered ``config_cls``): every config field of any estimator
            verl can run may be set under ``algorithm.gear`` (GEAR's ``lambda_kl``, ``alpha``,
            ...); fields of other estimators are ignored. ``norm_by_std`` defaults to verl's
            ``algorithm.norm_adv_by_std_in_grpo`` where the config has it and does not pin it.
        divergence: ``k3`` (default) or ``k1``, from the sampled token's student and teacher
            log-probs; verl's log-prob pass returns only those, so ``full`` is not available here.
        reference_key: dotted path of the reference in a dataset row's non-tensor fields
            (verl's RL datasets keep the gold answer at ``reward_model.ground_truth``).
        reference_kind: ``answer``, ``solution`` or ``tool_call``: which hint template is used.
        plugins: modules imported (``gear_rl.credit.load_plugins``) and registered with verl
            before ``algorithm.adv_estimator`` is resolved: estimators defined outside gear-rl.
        teacher_prompt: placement and wording of the hint (``TeacherPromptConfig``'s fields,
            ``placement`` and ``*_template``, as keys).
        dump_dir: where the ``gear`` trainer mode writes, at every step, what its advantage step
            read and what verl wrote back (``step-<N>.pt``: rewards, uids, response mask,
            entropy, old and teacher log-probs, advantages), to check or debug the credit
            offline; ``None`` (default) writes nothing.
        log_samples_per_step: trajectories per step the ``gear`` trainer mode keeps in its
            gear-rl run log's ``samples.jsonl`` (``gear-rl report``'s token-credit viewer, with
            ``metrics.jsonl``, ``config.yaml`` and ``run.json``; :mod:`gear_rl.runlog`); 0
            writes no run log at all.
        run_log_dir: the run log's folder; ``None`` (default): ``trainer.default_local_dir``, the
            folder of the experiment's checkpoints.
    """

    estimator: Estimator
    config: Any
    divergence: str = "k3"
    reference_key: str = "reward_model.ground_truth"
    reference_kind: str = "answer"
    plugins: tuple[str, ...] = ()
    teacher_prompt: TeacherPromptConfig = field(default_factory=TeacherPromptConfig)
    dump_dir: str | None = None
    log_samples_per_step: int = DEFAULT_LOG_SAMPLES
    run_log_dir: str | None = None

    def __post_init__(self) -> None:
        if self.divergence not in SAMPLED_TOKEN_ESTIMATORS:
            raise ValueError(
                f"algorithm.gear.divergence must be one of {SAMPLED_TOKEN_ESTIMATORS} (verl "
                f"returns only the sampled token's log-probs), got {self.divergence!r}"
            )
        key = self.reference_key
        if not isinstance(key, str) or not key or "" in key.split("."):
            raise ValueError(
                f"algorithm.gear.reference_key must be a dotted path like "
                f"'reward_model.ground_truth', got {key!r}"
            )
        if self.dump_dir is not None and (not isinstance(self.dump_dir, str) or not self.dump_dir):
            raise ValueError(f"algorithm.gear.dump_dir must be a directory path or null, "
                             f"got {self.dump_dir!r}")
        check_run_log_settings("algorithm.gear.", self.log_samples_per_step, self.run_log_dir)
        if self.reference_kind not in REFERENCE_KINDS:
            raise ValueError(
                f"algorithm.gear.reference_kind must be one of {REFERENCE_KINDS}, "
                f"got {self.reference_kind!r}"
            )

    @property
    def needs_teacher(self) -> bool:
        """Whether the estimator reads teacher log-probs (directly or through the divergence)."""
        return self.estimator.needs_teacher

    @property
    def needs_signals(self) -> bool:
        """Whether the estimator reads anything verl does not pass to an estimator: per-token
        signals, (step-level) the turns of multi-turn rollouts, or (Monte-Carlo) the values
        phase's estimates; it then needs the ``gear`` trainer mode."""
        return (bool(self.estimator.needs) or self.estimator.step_level
                or self.estimator.mc_boundaries is not None)


# algorithm.gear keys that are VerlGEARSettings' own fields, and those of its teacher prompt.
_OWN_KEYS = tuple(f.name for f in dataclasses.fields(VerlGEARSettings)
                  if f.name not in ("estimator", "config", "teacher_prompt"))
_PROMPT_KEYS = tuple(f.name for f in dataclasses.fields(TeacherPromptConfig))


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


def plugin_modules(value: Any, source: str) -> tuple[str, ...]:
    """Module names from ``value``: a list of names, or one comma-separated string (as in
    ``GEAR_RL_PLUGINS``); ``source`` names the setting in errors."""
    value = _plain(value)
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{source} must be a list of module names, got {value!r}")
    return tuple(v.strip() for v in value if v.strip())


def load_verl_plugins(modules: Iterable[str]) -> list[str]:
    """Import ``modules`` (each registers its estimators with ``gear_rl.credit`` on import) and
    register every estimator verl can run that verl does not have yet. Returns the names the
    modules registered (empty for modules imported before)."""
    modules = list(modules)
    names = load_plugins(modules) if modules else []
    register_estimators()
    return names


def _gear_section(algorithm: Any) -> Mapping[str, Any]:
    raw = _plain(_get(algorithm, "gear")) or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"algorithm.gear must be a mapping, got {type(raw).__name__}")
    return raw


def load_algorithm_plugins(algorithm: Any) -> tuple[str, ...]:
    """Load ``algorithm.gear.plugins`` (:func:`load_verl_plugins`); returns the module names."""
    plugins = plugin_modules(_gear_section(algorithm).get("plugins"), "algorithm.gear.plugins")
    if plugins:
        load_verl_plugins(plugins)
    return plugins


def settings_from_algorithm(algorithm: Any, adv_estimator: str | None = None) -> VerlGEARSettings:
    """Parse ``algorithm.gear`` for ``adv_estimator`` (default: ``algorithm.adv_estimator``).

    ``algorithm.gear.plugins`` is loaded first (:func:`load_algorithm_plugins`), so a plugin's
    estimator can be the one selected.

    Args:
        algorithm: verl's ``config.algorithm`` (a DictConfig, ``AlgoConfig`` or plain mapping),
            or ``None`` for all defaults.
        adv_estimator: a verl estimator name registered by gear-rl (e.g. ``gear``,
            ``gear_rl_grpo``).

    Raises:
        ValueError: naming the key, for an estimator that is not gear-rl's, an unknown
            ``algorithm.gear`` key or a bad value.
    """
    raw = _gear_section(algorithm)
    plugins = load_algorithm_plugins(algorithm)
    if adv_estimator is None:
        adv_estimator = _get(algorithm, "adv_estimator")
    adv_estimator = getattr(adv_estimator, "value", adv_estimator)  # verl's AdvantageEstimator
    name = gear_rl_name(str(adv_estimator))
    registered = str(adv_estimator).removeprefix(RENAME_PREFIX)
    if name is None and registered in ESTIMATORS:
        why = verl_unsupported(get_estimator(registered))
        raise ValueError(f"algorithm.adv_estimator={adv_estimator!r}: verl cannot run this "
                         f"gear-rl estimator: {why}")
    if name is None:
        raise ValueError(
            f"algorithm.adv_estimator={adv_estimator!r} is not a gear-rl estimator; choose one of "
            f"{sorted(_verl_names())} (an estimator defined in another module needs "
            "algorithm.gear.plugins=[<module>] or GEAR_RL_PLUGINS=<module>)"
        )
    estimator = get_estimator(name)
    known = _config_fields() | set(_OWN_KEYS) | set(_PROMPT_KEYS)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"algorithm.gear has unknown key(s) {unknown}; valid: {sorted(known)}")

    own = {f.name for f in dataclasses.fields(estimator.config_cls)}
    clash = sorted(own & (set(_OWN_KEYS) | set(_PROMPT_KEYS)))
    if clash:
        raise ValueError(f"estimator {name!r}: config field(s) {clash} clash with the verl "
                         "integration's own algorithm.gear keys; rename them")
    overrides = {k: v for k, v in raw.items() if k in own}
    if "norm_by_std" in own and "norm_by_std" not in overrides and "norm_by_std" not in (
            estimator.fixed):
        norm = _get(algorithm, "norm_adv_by_std_in_grpo")
        if norm is not None:
            overrides["norm_by_std"] = bool(norm)
    try:
        config = estimator.make_config(**overrides)
        teacher_prompt = TeacherPromptConfig(**{k: raw[k] for k in _PROMPT_KEYS if k in raw})
    except (TypeError, ValueError) as err:
        raise ValueError(f"algorithm.gear: {err}") from err
    settings = {k: raw[k] for k in _OWN_KEYS if k in raw}
    settings["plugins"] = plugins
    return VerlGEARSettings(estimator=estimator, config=config, teacher_prompt=teacher_prompt,
                            **settings)


def divergence_from_logprobs(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                             mask: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token reverse-KL estimate from the sampled token's log-probs (docs/design.md, step 2):
    ``gear_rl.signals.divergence.sampled_token_divergence`` (the signal pass's own ``k1``/``k3``,
    with its dtype and capping rule) on the policy tokens.

    Args:
        student_logprobs: ``[B, T]`` ``log pi(a_t | s_t)``.
        teacher_logprobs: ``[B, T]`` ``log pi(a_t | s*_t)``.
        mask: ``[B, T]`` 1 on policy tokens; the output is 0 elsewhere (padding may hold junk).
        estimator: ``k1`` (``log pi - log pi*``, unbiased, can be negative) or ``k3``
            (``r - 1 - log r``, ``r = pi* / pi``, >= 0).

    Returns:
        ``[B, T]`` float32 divergence, 0 where ``mask == 0``.
    """
    if estimator not in SAMPLED_TOKEN_ESTIMATORS:
        raise ValueError(f"estimator must be one of {SAMPLED_TOKEN_ESTIMATORS}, got {estimator!r}")
    for arg, value in (("student_logprobs", student_logprobs),
                       ("teacher_logprobs", teacher_logprobs), ("mask", mask)):
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            raise ValueError(f"{arg} must be a [B, T] tensor")
        if value.shape != mask.shape:
            raise ValueError(f"{arg} has shape {tuple(value.shape)}, mask has {tuple(mask.shape)}")
    policy = mask.bool()
    student = torch.where(policy, student_logprobs, 0.0)
    teacher = torch.where(policy, teacher_logprobs, 0.0)
    if not bool(torch.isfinite(student).all()):
        raise ValueError("student_logprobs contains NaN or inf on policy tokens")
    if not bool(torch.isfinite(teacher).all()):
        raise ValueError("teacher_logprobs contains NaN or inf on policy tokens")
    divergence = sampled_token_divergence(student, teacher, estimator)
    return torch.where(policy, divergence, 0.0).float()


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
        extras: ``CreditBatch.extras`` of the batch: the step-level estimators' turn spans,
            per-turn rewards and state keys (:func:`gear_rl.integrations.verl.agent_loop.
            step_extras`), in the same row order.
        metrics: filled by the estimator with ``gear/...`` diagnostics for the trainer to log.
    """

    response_mask: torch.Tensor
    entropy: torch.Tensor | None = None
    student_logprobs: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    divergence: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def signals_from_logprobs(response_mask: torch.Tensor, *, entropy: torch.Tensor | None = None,
                          student_logprobs: torch.Tensor | None = None,
                          teacher_logprobs: torch.Tensor | None = None,
                          divergence: str = "k3",
                          extras: dict[str, Any] | None = None) -> VerlSignals:
    """Assemble :class:`VerlSignals` from verl's fields (``entropy``, ``old_log_probs`` and the
    teacher pass's log-probs, each ``[B, T]``; ``extras``: the batch's step inputs); the
    divergence is computed when both log-probs are given."""
    div = None
    if student_logprobs is not None and teacher_logprobs is not None:
        div = divergence_from_logprobs(student_logprobs, teacher_logprobs, response_mask,
                                       divergence)
    return VerlSignals(response_mask=response_mask, entropy=entropy,
                       student_logprobs=student_logprobs, teacher_logprobs=teacher_logprobs,
                       divergence=div, extras=dict(extras or {}))


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
    if not estimator.needs and not estimator.step_level and estimator.mc_boundaries is None:
        return signals, {}
    if signals is None:
        what = (f"per-token {list(estimator.needs)}" if estimator.needs else
                "the turns of each trajectory (it is step-level)" if estimator.step_level else
                "Monte-Carlo values of its responses' prefixes")
        raise ValueError(
            f"verl estimator {verl_name(name)!r} needs {what}, which "
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
    needs = list(estimator.needs)
    if estimator.self_distillation:  # its sampled-token form reads both log-probs
        needs += [n for n in ("student_logprobs", "teacher_logprobs") if n not in needs]
    for need in needs:
        value = getattr(signals, need, None)
        if value is None:
            raise ValueError(
                f"verl estimator {verl_name(name)!r} needs signal {need!r}, which the provided "
                "signals lack (the teacher pass did not run?)"
            )
        values[need] = value.to(response_mask.device)
    return signals, values


def _record_metrics(signals: VerlSignals, estimator: Estimator, config: Any,
                    batch: CreditBatch, advantages: torch.Tensor) -> None:
    """The credit diagnostics of ``gear_rl.credit`` (one set of names for every engine: mean
    weight per advantage sign, segment fraction, divergence, ...) as ``gear/<name>``."""
    for name, value in credit_diagnostics(estimator, config, batch, advantages).items():
        signals.metrics[METRIC_PREFIX + name] = value


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
        extras = {} if signals is None else signals.extras
        if estimator.step_level and "step_spans" not in extras:
            raise ValueError(
                f"verl estimator {verl_name(name)!r} is step-level, but the batch has no turn "
                "spans: run a multi-turn agent loop (actor_rollout_ref.rollout.agent."
                "default_agent_loop=gear_env for gear-rl's environments, or tool_agent)")
        batch = CreditBatch(rewards=token_level_rewards.sum(dim=-1).float(),
                            group_ids=[_hashable(i) for i in index], mask=response_mask,
                            extras=dict(extras), **values)
        advantages = estimator(batch, settings.config)
        if estimator.self_distillation:  # the distillation term as verl's loss can carry it
            advantages = advantages.float() + sampled_token_distillation(batch)
        dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else (
            torch.float32)
        if signals is not None:
            _record_metrics(signals, estimator, settings.config, batch, advantages)
        advantages = advantages.to(device=token_level_rewards.device, dtype=dtype)
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


# registry name -> (the Estimator, its verl adapter): one adapter per registered estimator, so
# that registering again is a no-op (verl refuses a second, different function under a name).
_ADAPTERS: dict[str, tuple[Estimator, Callable[..., Any]]] = {}


def _adapter(name: str) -> Callable[..., Any]:
    estimator = get_estimator(name)
    cached = _ADAPTERS.get(name)
    if cached is None or cached[0] is not estimator:
        cached = _ADAPTERS[name] = (estimator, make_verl_estimator(name))
    return cached[1]


class _VerlEstimators(Mapping[str, Callable[..., Any]]):
    """Live, read-only view: verl name -> adapter, for every estimator of
    :func:`verl_estimator_names` as the registry holds them now (a plugin's appear once it is
    loaded; :func:`register_estimators` puts them into verl)."""

    def __getitem__(self, verl_estimator: str) -> Callable[..., Any]:
        name = gear_rl_name(verl_estimator)
        if name is None:
            raise KeyError(verl_estimator)
        return _adapter(name)

    def __iter__(self) -> Iterator[str]:
        return iter(_verl_names())

    def __len__(self) -> int:
        return len(_verl_names())

    def __repr__(self) -> str:
        return f"VERL_ESTIMATORS({sorted(self)})"


VERL_ESTIMATORS: Mapping[str, Callable[..., Any]] = _VerlEstimators()


def register_estimators() -> list[str]:
    """Register with verl's ``core_algos`` every gear-rl estimator verl can run, including any a
    plugin registered since the last call. Idempotent: a name verl already maps to the same
    adapter is left alone.

    Returns:
        The verl names of all gear-rl estimators now registered with verl.

    Raises:
        RuntimeError: when names already belong to a different verl estimator (the others are
            registered all the same).
    """
    from verl.trainer.ppo import core_algos

    registered, taken = [], []
    for verl_estimator, fn in VERL_ESTIMATORS.items():
        existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(verl_estimator)
        if existing is None:
            core_algos.register_adv_est(verl_estimator)(fn)
        elif existing is not fn:
            taken.append(f"{verl_estimator!r} ({existing!r})")
            continue
        registered.append(verl_estimator)
    if taken:
        raise RuntimeError(f"verl already has different advantage estimators named "
                           f"{', '.join(taken)}; gear-rl cannot register its own under them")
    return registered
