"""The estimator registry: every credit method declares itself where it is defined.

A method file registers its function with :func:`register_estimator`, placed on the function::

    @register_estimator("rlsd", config=RLSDConfig, needs=("student_logprobs", "teacher_logprobs"),
                        description="RLSD: clipped teacher/student ratio token weights")
    def rlsd(batch: CreditBatch, config: RLSDConfig) -> torch.Tensor: ...

The function takes a :class:`~gear_rl.credit.batch.CreditBatch` and its config and returns
``[B, T]`` token-level advantages, 0 where ``batch.mask == 0``. The declaration says what the
estimator is, and it is the only place that says it: the trainer (and through what it logs, the
report), the config check and ``--help``, verl and TRL read it (which signals to compute,
whether segments exist, whether the task must be multi-turn, whether the reward enters the
loss, whether the policy update selects tokens). Registering a name twice raises.

An estimator may also choose tokens at update time, from the current policy: ``update_mask=fn``
with ``fn(entropy [b, t], mask [b, t], config) -> [b, t] bool or None`` (None: no selection with
this config). The trainer calls it on each PPO micro-batch with the current policy's entropy and
aggregates the policy loss over the selected tokens only. How many tokens it selects must depend
on ``mask`` alone (the trainer counts them before the micro-batch loop, by calling it on zero
entropy, to normalise a token mean over the whole mini-batch).

Estimators defined outside this package register the same way; :func:`load_plugins` imports
their modules (``gear-rl train plugins=my_pkg.my_credit``), and installed distributions can
declare them under the entry-point group ``gear_rl.estimators`` (loaded on first lookup).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, TypeVar

import torch

from gear_rl.credit._validate import check_batch_size, check_mask
from gear_rl.credit.batch import CreditBatch

__all__ = [
    "CHANGED_CREDIT_DEFAULTS",
    "ENGINE_FEATURES",
    "ENTRY_POINT_GROUP",
    "ESTIMATORS",
    "SIGNAL_FIELDS",
    "Estimator",
    "estimator_names",
    "get_estimator",
    "load_plugins",
    "record_credit_defaults",
    "register_estimator",
    "upgrade_recorded_config",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "gear_rl.estimators"
# The per-token signal fields of CreditBatch an estimator may declare in ``needs``.
SIGNAL_FIELDS: tuple[str, ...] = ("divergence", "entropy", "student_logprobs",
                                  "teacher_logprobs")
# Signals computed from the ground-truth-conditioned teacher pass.
TEACHER_FIELDS: frozenset[str] = frozenset({"divergence", "teacher_logprobs"})

# What an engine other than gear-rl's own trainer runs beyond token-level credit on its own
# loss: ``step_level``, the turn spans, per-turn rewards and state keys of multi-turn rollouts
# (verl: gear-rl's ``gear_env`` agent loop and the runs of policy tokens of its tool loop,
# gear_rl.integrations.verl.agent_loop); ``monte_carlo``, a values phase that continues each
# response's prefixes with the policy (verl: the gear trainer mode's, on the job's rollout
# servers, gear_rl.integrations.verl.values); ``self_distillation``, the distillation term in
# a form its loss carries (verl: the sampled-token form as the advantage,
# gear_rl.credit.opsd.sampled_token_distillation). An engine not listed adds nothing.
ENGINE_FEATURES: Mapping[str, frozenset[str]] = MappingProxyType({
    "verl": frozenset({"step_level", "monte_carlo", "self_distillation"}),
    "TRL": frozenset(),
})

EstimatorFn = Callable[[CreditBatch, Any], torch.Tensor]
UpdateMaskFn = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor | None]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Estimator:
    """A registered credit estimator. Call it as ``estimator(batch, config=None)``.

    Attributes:
        name: the registry name (``estimator=<name>`` in ``gear-rl train``).
        fn: ``fn(batch, config) -> [B, T]`` advantages.
        config_cls: its frozen config dataclass.
        needs: the :data:`SIGNAL_FIELDS` it reads from the batch.
        fixed: config fields the name pins (an ablation's ``segmentation``).
        segments: whether it produces GEAR segments (its config is then a ``GEARConfig``, and
            ``gear_segments(divergence, entropy, mask, config)`` gives them).
        step_level: it assigns credit per turn and reads ``step_spans`` (and, where it
            groups by state, ``state_keys``) from ``batch.extras``: multi-turn tasks only.
        step_fn: for per-step methods, ``step_fn(outcomes [B], steps: StepInputs, config) -> B
            lists of floats`` (what ``gear_steps`` builds on); implies ``step_level``.
        needs_states: step-level methods that group by environment state need
            ``extras["state_keys"]``; a callable decides from the config (``gear_steps``).
        uses_reward: ``False`` when the outcome reward does not enter the loss (``opsd``).
        self_distillation: the trainer adds the self-distillation loss (reverse KL to the
            teacher) with weight ``loss.opsd_coef``, or 1 when that is 0.
        update_mask: update-time token selection, ``fn(entropy [b, t], mask [b, t], config) ->
            [b, t] bool or None`` on one micro-batch under the current policy (see the module
            docstring); use :meth:`select_for_update` and :meth:`update_token_count`.
        row_local: a row's advantages depend on that row's signals and mask and on the
            batch's rewards and groups only (never on another row's signals): the trainer may
            then compute the credit one micro-batch at a time, between each micro-batch's
            forward and its backward (``loss.fuse_scoring``), instead of in a separate scoring
            pass over the whole batch.
        mc_boundaries: Monte-Carlo credit (SPO-chain, VinePPO): ``fn(batch, config) -> B sorted
            lists`` of response positions ``b`` at which the trainer's values phase estimates
            ``V`` (of the prompt and the first ``b`` tokens) from the policy's own continuations
            (``config.mc_samples`` of them) and hands the means back in
            ``batch.extras["mc_values"]``; it also puts each response token's text in
            ``extras["token_texts"]``. Engines without a mid-step rollout (TRL, verl) refuse it.
        outcome_scaled: a row whose outcome advantage (``outcome_advantages(batch, config)``)
            is 0 gets advantage 0 on every token, whatever its signals (GEAR and its ablations,
            RLSD: ``Ahat = W * A``): the trainer then runs the teacher pass only on the rows
            with a non-zero outcome advantage (``signals.teacher_rows``), since the teacher's
            signals of the other rows cannot change the loss. Implies ``row_local``'s
            independence of those rows; checked by the estimator tests.
        group_relative: the advantage is relative to the other samples of the same prompt
            (GRPO's baseline, a turn or episode group), so with one sample per prompt every
            advantage is 0 by construction; a callable decides from the config
            (``gear_steps``: its base's; ``gigpo``: only with ``omega=0``). Outcome-scaled
            estimators are group-relative whatever this says. Use :meth:`needs_groups`.
        paper: the method's paper (for tables and ``--help``).
        description: one line.
    """

    name: str
    fn: EstimatorFn
    config_cls: type
    needs: tuple[str, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)
    segments: bool = False
    step_level: bool = False
    step_fn: Callable[..., list[list[float]]] | None = None
    needs_states: bool | Callable[[Any], bool] = False
    uses_reward: bool = True
    self_distillation: bool = False
    update_mask: UpdateMaskFn | None = None
    row_local: bool = False
    outcome_scaled: bool = False
    mc_boundaries: Callable[[CreditBatch, Any], list[list[int]]] | None = None
    group_relative: bool | Callable[[Any], bool] = False
    paper: str = ""
    description: str = ""

    @property
    def needs_teacher(self) -> bool:
        """Whether a run of it needs the teacher pass (teacher signals or self-distillation)."""
        return bool(TEACHER_FIELDS & set(self.needs)) or self.self_distillation

    def engine_limit(self, engine: str) -> str | None:
        """Why ``engine`` (TRL, verl: engines that run their own rollout and loss, with
        gear-rl's credit in between; :data:`ENGINE_FEATURES` says what each adds) cannot run
        this estimator, or None when it can."""
        features = ENGINE_FEATURES.get(engine, frozenset())
        if self.step_level and "step_level" not in features:
            return f"step-level: {engine} passes no turn spans"
        distills = self.self_distillation and "self_distillation" in features
        if not self.uses_reward and not distills:
            return "its reward does not enter the loss"
        if self.self_distillation and not distills:
            return f"it needs a self-distillation loss {engine}'s loss does not have"
        if self.mc_boundaries is not None and "monte_carlo" not in features:
            return ("it needs Monte-Carlo continuations of each response between scoring and "
                    f"the update (gear-rl train's values phase), which {engine}'s step cannot run")
        return None

    def needs_groups(self, config: Any | None = None) -> bool:
        """Whether this estimator with ``config`` gives every advantage 0 when each prompt has
        a single sample (a group of one has no baseline): a trainer must then refuse
        ``samples_per_prompt=1``."""
        if self.outcome_scaled:  # 0 wherever the outcome advantage is, as in a group of one
            return True
        if callable(self.group_relative):
            return bool(self.group_relative(config if config is not None
                                            else self.make_config()))
        return bool(self.group_relative)

    def requires_states(self, config: Any | None = None) -> bool:
        """Whether ``batch.extras["state_keys"]`` is needed with ``config``."""
        if callable(self.needs_states):
            return bool(self.needs_states(config if config is not None else self.make_config()))
        return bool(self.needs_states)

    def select_for_update(self, entropy: torch.Tensor, mask: torch.Tensor,
                          config: Any) -> torch.Tensor | None:
        """``[b, t]`` bool: the micro-batch tokens the policy loss keeps (``entropy``: the
        current policy's, ``mask``: the policy tokens), or None when this estimator with
        ``config`` selects none at update time."""
        if self.update_mask is None:
            return None
        selected = self.update_mask(entropy, mask, config)
        if selected is None:
            return None
        if tuple(selected.shape) != tuple(mask.shape):
            raise ValueError(f"estimator {self.name!r}: update_mask returned shape "
                             f"{tuple(selected.shape)}, expected {tuple(mask.shape)}")
        return selected.bool() & mask.bool()

    def update_token_count(self, mask: torch.Tensor, config: Any) -> float | None:
        """How many of ``mask``'s tokens :meth:`select_for_update` keeps (it depends on the mask
        alone), or None when there is no update-time selection with ``config``."""
        if self.update_mask is None:
            return None
        selected = self.select_for_update(torch.zeros(mask.shape, device=mask.device), mask,
                                          config)
        return None if selected is None else float(selected.sum())

    def config_fields(self) -> dict[str, dataclasses.Field]:
        """The settable config fields (pinned ones excluded), by name."""
        return {f.name: f for f in dataclasses.fields(self.config_cls) if f.name not in self.fixed}

    def make_config(self, **overrides: Any) -> Any:
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
                    f"estimator {self.name!r} pins {key}={self.fixed[key]!r}; got {value!r}"
                )
        return self.config_cls(**{**overrides, **self.fixed})

    def check_config(self, config: Any) -> Any:
        """``config`` if it is this estimator's (right class, pinned fields as pinned)."""
        if not isinstance(config, self.config_cls):
            raise ValueError(
                f"estimator {self.name!r} takes a {self.config_cls.__name__}, "
                f"got {type(config).__name__}"
            )
        for key, value in self.fixed.items():
            if getattr(config, key) != value:
                raise ValueError(
                    f"estimator {self.name!r} pins {key}={value!r}; config has "
                    f"{key}={getattr(config, key)!r}"
                )
        return config

    def __call__(self, batch: CreditBatch, config: Any | None = None) -> torch.Tensor:
        """``[B, T]`` token-level advantages for ``batch`` (0 where ``batch.mask == 0``)."""
        if not isinstance(batch, CreditBatch):
            raise ValueError(f"batch must be a CreditBatch, got {type(batch).__name__}")
        config = self.make_config() if config is None else self.check_config(config)
        batch.require(self.name, *self.needs)
        check_mask(batch.mask, values=False)
        check_batch_size("rewards", batch.rewards, batch.mask.shape[0])
        if not batch.applies_update_mask and self.update_token_count(batch.mask,
                                                                      config) is not None:
            raise ValueError(
                f"estimator {self.name!r} with this config selects tokens in the policy update "
                "(update_mask), which this engine's loss does not apply (CreditBatch."
                "applies_update_mask is False); gear-rl's own trainer applies it"
            )
        return self.fn(batch, config)


_REGISTRY: dict[str, Estimator] = {}
# Read-only, live view of every registered estimator (token-level and step-level).
ESTIMATORS: Mapping[str, Estimator] = MappingProxyType(_REGISTRY)


def register_estimator(
    name: str,
    *,
    config: type,
    needs: Iterable[str] = (),
    fixed: Mapping[str, Any] | None = None,
    segments: bool = False,
    step_level: bool = False,
    step_fn: Callable[..., list[list[float]]] | None = None,
    needs_states: bool | Callable[[Any], bool] = False,
    uses_reward: bool = True,
    self_distillation: bool = False,
    update_mask: UpdateMaskFn | None = None,
    row_local: bool = False,
    outcome_scaled: bool = False,
    mc_boundaries: Callable[[CreditBatch, Any], list[list[int]]] | None = None,
    group_relative: bool | Callable[[Any], bool] = False,
    paper: str = "",
    description: str = "",
) -> Callable[[F], F]:
    """Register the decorated ``fn(batch, config) -> [B, T]`` as estimator ``name``.

    Stack several decorators on one function to register variants (each with its own
    ``fixed`` fields). Raises ``ValueError`` when ``name`` is taken, ``needs`` names an unknown
    signal, ``config`` is not a dataclass, or ``fixed`` names a field ``config`` lacks.
    """
    needs = tuple(needs)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"estimator name must be an identifier string, got {name!r}")
    unknown = sorted(set(needs) - set(SIGNAL_FIELDS))
    if unknown:
        raise ValueError(f"estimator {name!r}: unknown needs {unknown}; valid: {SIGNAL_FIELDS}")
    if not dataclasses.is_dataclass(config) or not isinstance(config, type):
        raise ValueError(f"estimator {name!r}: config must be a dataclass type, got {config!r}")
    if outcome_scaled and not (hasattr(config, "norm_by_std") and hasattr(config, "eps")):
        raise ValueError(f"estimator {name!r}: outcome_scaled needs a config with the outcome "
                         "advantage's norm_by_std and eps (a subclass of OutcomeConfig)")
    pinned = dict(fixed or {})
    missing = sorted(set(pinned) - {f.name for f in dataclasses.fields(config)})
    if missing:
        raise ValueError(f"estimator {name!r}: fixed names field(s) {missing} that "
                         f"{config.__name__} does not have")

    def decorator(fn: F) -> F:
        if name in _REGISTRY:
            raise ValueError(f"estimator {name!r} is already registered (by "
                             f"{_REGISTRY[name].fn.__module__}.{_REGISTRY[name].fn.__qualname__})")
        _REGISTRY[name] = Estimator(
            name=name, fn=fn, config_cls=config, needs=needs,
            fixed=MappingProxyType(pinned), segments=segments,
            step_level=step_level or step_fn is not None, step_fn=step_fn,
            needs_states=needs_states, uses_reward=uses_reward,
            self_distillation=self_distillation, update_mask=update_mask,
            row_local=row_local, outcome_scaled=outcome_scaled, mc_boundaries=mc_boundaries,
            group_relative=group_relative, paper=paper, description=description)
        return fn

    return decorator


_entry_points_loaded = False


def _load_entry_points() -> None:
    """Import the modules of the ``gear_rl.estimators`` entry points once; a failing plugin is
    reported as a warning, not a crash of every lookup."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            point.load()
        except Exception as error:  # a broken third-party plugin must not hide the others
            logger.warning("gear-rl estimator plugin %r (%s) failed to load: %s", point.name,
                           point.value, error)


def load_plugins(modules: Iterable[str]) -> list[str]:
    """Import each module in ``modules`` (each registers its estimators on import); returns
    the names registered by them. An import error names the module."""
    before = set(_REGISTRY)
    for module in modules:
        if not isinstance(module, str) or not module.strip():
            raise ValueError(f"plugins: module names must be non-empty strings, got {module!r}")
        try:
            importlib.import_module(module.strip())
        except ImportError as error:
            raise ValueError(f"plugins: cannot import {module!r}: {error}") from error
    return sorted(set(_REGISTRY) - before)


def get_estimator(name: str) -> Estimator:
    """The registered estimator called ``name``; unknown names raise listing the valid ones."""
    _load_entry_points()
    if isinstance(name, str) and name in _REGISTRY:
        return _REGISTRY[name]
    raise ValueError(f"unknown estimator {name!r}; registered: {sorted(_REGISTRY)} (an estimator "
                     "from another module needs plugins=<module>)")


def estimator_names(*, step_level: bool | None = None) -> list[str]:
    """Sorted registered names (``step_level``: only step-level ones, or only token-level)."""
    _load_entry_points()
    return sorted(n for n, e in _REGISTRY.items()
                  if step_level is None or e.step_level == step_level)


# Defaults of an estimator's config that changed after runs had recorded configs: each as
# (field, the value every run recorded before the change used, the change). A run's
# ``config.yaml`` (and a checkpoint's ``state.json``) records ``credit`` as it was given, so a
# field left out there meant the default of its day. record_credit_defaults writes each such
# field's resolved value into a config about to be recorded (the trainer's config_to_dict, the
# TRL and verl run logs: every run recorded since says it), and upgrade_recorded_config reads a
# recorded config without it as the old value (every reader of a run's config.yaml that
# interprets it); so a run resumed, a study cell matched or a run labelled after the change
# keeps what it trained with.
CHANGED_CREDIT_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("mean_preserving", False,
     "GEAR's default since issue 39 (studies/credit_control.yaml, 'GEAR's default')"),
)


def _left_out_changed_fields(data: Mapping[str, Any]
                             ) -> tuple[Estimator | None, dict[str, Any]]:
    """The estimator a run config ``data`` names (``estimator``, its ``plugins`` imported
    first), and the :data:`CHANGED_CREDIT_DEFAULTS` fields (by name, with their old values)
    that it has as settable config fields and ``data``'s ``credit`` leaves out; ``(None, {})``
    where ``credit`` is not a mapping or the estimator cannot be found (validation says why)."""
    credit = data.get("credit")
    if not isinstance(credit, Mapping):
        return None, {}
    try:
        load_plugins(data.get("plugins") or ())
        estimator = get_estimator(str(data.get("estimator")))
    except (TypeError, ValueError):
        return None, {}
    own = {f.name for f in dataclasses.fields(estimator.config_cls)}
    return estimator, {name: old for name, old, _ in CHANGED_CREDIT_DEFAULTS
                       if name in own and name not in estimator.fixed and name not in credit}


def record_credit_defaults(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (a run config about to be recorded: ``estimator``, ``plugins``, ``credit``)
    with each field of :data:`CHANGED_CREDIT_DEFAULTS` its ``credit`` leaves out set to the
    value it resolves to (the estimator's default, or its preset's); unchanged where that
    config does not build (validation says why)."""
    estimator, missing = _left_out_changed_fields(data)
    if estimator is None or not missing:
        return dict(data)
    credit = data["credit"]
    try:
        built = estimator.make_config(**credit)
    except (TypeError, ValueError):
        return dict(data)
    return {**data, "credit": {**credit, **{name: getattr(built, name) for name in missing}}}


def upgrade_recorded_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config a run recorded (``config.yaml``, a checkpoint's ``state.json``: a
    :func:`gear_rl.train.config.config_to_dict` dict of its day) as this version must read
    it: each field of :data:`CHANGED_CREDIT_DEFAULTS` its ``credit`` leaves out takes the
    value it had before the change (runs recorded since write it out). Anything else is
    returned as it is."""
    _, missing = _left_out_changed_fields(data)
    return {**data, "credit": {**data["credit"], **missing}} if missing else dict(data)
