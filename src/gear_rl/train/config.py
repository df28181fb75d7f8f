"""Trainer configuration: plain dataclasses, one documented field per knob, with YAML files and
``key=value`` overrides (dotted keys for nested fields, e.g. ``rollout.temperature=0.8``,
``credit.lambda_kl=0.2``). Unknown keys are errors that list the valid ones."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "LOSS_AGG_MODES",
    "AgentConfig",
    "EvalConfig",
    "LogConfig",
    "LossConfig",
    "OptimConfig",
    "RolloutConfig",
    "SignalConfig",
    "TrainConfig",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "parse_overrides",
    "valid_keys",
]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                  "seq-mean-token-sum-norm")
KL_TYPES = ("low_var_kl", "k1", "k2")


@dataclass
class RolloutConfig:
    """Sampling of the training batch.

    Attributes:
        prompts_per_step: distinct problems per step (GRPO groups).
        samples_per_prompt: K responses per problem (the group size).
        temperature: sampling temperature; log-probs, entropy and divergences use the same one.
        top_p: nucleus mass (1.0: the full distribution, on-policy).
        max_new_tokens: cap on response length; a batch runs until its longest answer stops.
        batch_size: rows per generation batch (None: all at once).
        dtype: sampler weights: ``auto`` (bf16 where the device computes bf16 natively, else the
            policy's fp32), ``bf16`` or ``fp32``. The sampler is a copy of the policy refreshed
            after every update.
    """

    prompts_per_step: int = 4
    samples_per_prompt: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    batch_size: int | None = None
    dtype: str = "auto"


@dataclass
class LossConfig:
    """The policy loss: PPO clipped surrogate over token-level advantages.

    Attributes:
        clip_low: ratio clipped below at ``1 - clip_low``.
        clip_high: ratio clipped above at ``1 + clip_high`` (asymmetric "clip-higher", DAPO).
        agg_mode: ``token-mean`` (all tokens of the mini-batch weigh equally),
            ``seq-mean-token-sum``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm``
            (token sums divided by ``rollout.max_new_tokens``, Dr.GRPO), as in verl.
        kl_coef: weight of a KL penalty to the initial policy (0: off; no reference model kept).
        kl_type: per-token KL estimator: ``low_var_kl`` (k3, clamped to [-10, 10]), ``k1``,
            ``k2``.
        opsd_coef: weight of the on-policy self-distillation term (reverse KL student ->
            stop-gradient ground-truth-conditioned teacher) added to the RL loss.
        epochs: passes over each rollout batch.
        minibatches: optimiser steps per epoch (the batch is split in this many mini-batches).
        micro_batch_size: rows per forward/backward (gradient accumulation; memory only).
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    opsd_coef: float = 0.0
    epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int = 16


@dataclass
class OptimConfig:
    """AdamW on fp32 master weights.

    Attributes:
        lr: peak learning rate. ``warmup_steps``: linear warm-up from 0 over this many steps.
        weight_decay, beta1, beta2, eps: AdamW's. ``grad_clip``: max global grad norm (0: off).
    """

    lr: float = 3e-5
    warmup_steps: int = 0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0


@dataclass
class SignalConfig:
    """The signal pass (``gear_rl.signals``) and the teacher prompt.

    Attributes:
        divergence: ``full`` (exact reverse KL), ``topk``, ``k1`` or ``k3``.
        topk: support size for ``divergence=topk``.
        chunk_size: LM-head rows per chunk (None: automatic).
        batch_size: rows per no-grad scoring forward (old log-probs, signals, reference).
        placement: where the reference goes in the teacher prompt (``user_end``,
            ``new_user_turn``, ``system``).
        answer_template: the teacher's hint for a final-answer reference (must contain
            ``{reference}``). The default is one short sentence: the teacher pass costs in
            proportion to its prompt length, and on a CPU this pass is GEAR's whole overhead.
            ``null`` uses ``gear_rl.signals.teacher``'s longer default, which also asks the
            model to solve the problem on its own.
    """

    divergence: str = "full"
    topk: int | None = None
    chunk_size: int | None = None
    batch_size: int = 32
    placement: str = "user_end"
    answer_template: str | None = "\n\n(The correct answer is {reference}.)"


@dataclass
class EvalConfig:
    """Held-out evaluation: Mean@k and pass@k.

    Attributes:
        size: held-out problems. ``k``: samples per problem.
        temperature, top_p, max_new_tokens: sampling for evaluation.
        every: evaluate every this many steps (0: only at the start and the end).
        at_start: evaluate before the first step.
        seed: sampling seed of evaluation (independent of the training seed, so runs with
            different seeds are scored on identical draws of the starting model).
        batch_size: rows per generation batch.
    """

    size: int = 64
    k: int = 4
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 32
    every: int = 0
    at_start: bool = True
    seed: int = 1234
    batch_size: int | None = 128


@dataclass
class AgentConfig:
    """Multi-turn rollouts of agent tasks (``tool-math``, ``bfcl``) and environments
    (``sokoban``, ``keydoor``). Single-turn tasks ignore this section.

    Attributes:
        max_turns: policy turns per episode (None: the task's own; environments: their step
            limit).
        max_new_tokens_per_turn: generation cap of one turn.
        max_response_tokens: budget of a whole response, policy and observation tokens.
        max_observation_tokens: a tool output is cut to this many tokens.
        sandbox_workers: warm Python workers for tool calls.
        sandbox_timeout_s: wall-time limit of one tool call.
        sandbox_memory_mb: memory limit of one tool call.
    """

    max_turns: int | None = None
    max_new_tokens_per_turn: int = 64
    max_response_tokens: int = 384
    max_observation_tokens: int = 128
    sandbox_workers: int = 2
    sandbox_timeout_s: float = 5.0
    sandbox_memory_mb: int = 512


@dataclass
class LogConfig:
    """Outputs.

    Attributes:
        samples_per_step: trajectories per step kept in ``samples.jsonl``.
        checkpoint_every: write a checkpoint every this many steps (and at the end; 0: end only).
        keep_checkpoints: most recent checkpoints kept.
        tensorboard: write TensorBoard event files.
        progress: show a progress bar.
    """

    samples_per_step: int = 4
    checkpoint_every: int = 10
    keep_checkpoints: int = 1
    tensorboard: bool = True
    progress: bool = True


@dataclass
class TrainConfig:
    """Everything ``gear-rl train`` takes.

    Attributes:
        model: ``smollm2-135m`` (bundled), ``tiny-random`` (tests) or a local HF directory.
        task: a preset (``products``: one-digit products, the default; ``arithmetic``,
            ``arithmetic-3``), a reasoning-gym dataset name, or a verl-layout ``.parquet`` /
            ``.jsonl`` file.
        task_options: reasoning-gym dataset config overrides (e.g. ``task_options.max_terms=3``).
        instruction: text appended to every reasoning-gym question.
        eval_data: held-out file for a dataset-file task (None: hold out part of ``task``).
        train_size: training problems to generate (reasoning-gym) or keep (files).
        estimator: a registered credit estimator (``gear_rl.credit.ESTIMATORS``; ``opsd`` is
            self-distillation alone, with no reward in the loss).
        plugins: modules imported before the estimator is looked up, each registering its own
            estimators (``plugins=[my_pkg.my_credit]``).
        credit: the estimator's config fields (e.g. ``credit.lambda_kl=0.2``).
        steps: training steps (one rollout batch and its updates each).
        seed: training seed (data order, sampling, tiny-model init).
        out: run directory (None: ``runs/<time>-<estimator>-s<seed>``).
        resume: a run directory to continue from its latest checkpoint.
        device: ``auto`` (cuda when available), ``cpu``, ``cuda``, ``cuda:1``...
        precision: training/scoring compute: ``auto`` (bf16 autocast where the device computes
            bf16 natively, else fp32), ``bf16`` or ``fp32``. Master weights are always fp32.
        threads: torch CPU threads (None: torch's default).
    """

    model: str = "smollm2-135m"
    task: str = "products"
    task_options: dict[str, Any] = field(default_factory=dict)
    instruction: str = ""
    eval_data: str | None = None
    train_size: int = 2000
    estimator: str = "gear"
    plugins: list[str] = field(default_factory=list)
    credit: dict[str, Any] = field(default_factory=dict)
    steps: int = 10
    seed: int = 0
    out: str | None = None
    resume: str | None = None
    device: str = "auto"
    precision: str = "auto"
    threads: int | None = None
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    signals: SignalConfig = field(default_factory=SignalConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        from gear_rl.credit import get_estimator, load_plugins

        load_plugins(self.plugins)
        estimator = get_estimator(self.estimator)  # unknown names raise listing the valid ones
        estimator.make_config(**self.credit)  # raises on unknown or pinned fields
        positive = {
            "steps": self.steps, "train_size": self.train_size,
            "rollout.prompts_per_step": self.rollout.prompts_per_step,
            "rollout.samples_per_prompt": self.rollout.samples_per_prompt,
            "rollout.max_new_tokens": self.rollout.max_new_tokens,
            "loss.epochs": self.loss.epochs, "loss.minibatches": self.loss.minibatches,
            "loss.micro_batch_size": self.loss.micro_batch_size,
            "signals.batch_size": self.signals.batch_size,
            "eval.size": self.eval.size, "eval.k": self.eval.k,
            "eval.max_new_tokens": self.eval.max_new_tokens,
            "log.keep_checkpoints": self.log.keep_checkpoints,
            "agent.max_turns": 1 if self.agent.max_turns is None else self.agent.max_turns,
            "agent.max_new_tokens_per_turn": self.agent.max_new_tokens_per_turn,
            "agent.max_response_tokens": self.agent.max_response_tokens,
            "agent.max_observation_tokens": self.agent.max_observation_tokens,
            "agent.sandbox_workers": self.agent.sandbox_workers,
            "agent.sandbox_memory_mb": self.agent.sandbox_memory_mb,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, value in {"eval.every": self.eval.every,
                            "log.checkpoint_every": self.log.checkpoint_every,
                            "log.samples_per_step": self.log.samples_per_step,
                            "optim.warmup_steps": self.optim.warmup_steps,
                            "loss.kl_coef": self.loss.kl_coef,
                            "loss.opsd_coef": self.loss.opsd_coef,
                            "optim.grad_clip": self.optim.grad_clip,
                            "optim.weight_decay": self.optim.weight_decay}.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        batch = self.rollout.prompts_per_step * self.rollout.samples_per_prompt
        if self.loss.minibatches > batch:
            raise ValueError(f"loss.minibatches ({self.loss.minibatches}) exceeds the rollout "
                             f"batch ({batch} trajectories)")
        for name, value in {"rollout.temperature": self.rollout.temperature,
                            "eval.temperature": self.eval.temperature,
                            "optim.lr": self.optim.lr,
                            "agent.sandbox_timeout_s": self.agent.sandbox_timeout_s}.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        for name, value in {"rollout.top_p": self.rollout.top_p,
                            "eval.top_p": self.eval.top_p}.items():
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if not 0 <= self.loss.clip_low < 1 or self.loss.clip_high < 0:
            raise ValueError(f"loss.clip_low must be in [0, 1) and loss.clip_high >= 0, got "
                             f"{self.loss.clip_low}, {self.loss.clip_high}")
        choices = {"loss.agg_mode": (self.loss.agg_mode, LOSS_AGG_MODES),
                   "loss.kl_type": (self.loss.kl_type, KL_TYPES),
                   "precision": (self.precision, ("auto", "bf16", "fp32")),
                   "rollout.dtype": (self.rollout.dtype, ("auto", "bf16", "fp32")),
                   "signals.divergence": (self.signals.divergence, ("full", "topk", "k1", "k3")),
                   "signals.placement": (self.signals.placement,
                                         ("user_end", "new_user_turn", "system"))}
        template = self.signals.answer_template
        if template is not None and "{reference}" not in template:
            raise ValueError("signals.answer_template must contain '{reference}'")
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        distills = estimator.self_distillation or self.loss.opsd_coef > 0
        if distills and self.signals.divergence not in ("full", "topk"):
            # The distillation loss differentiates the per-token divergence; the sampled-token
            # estimators k1/k3 have no useful gradient (k1's is zero in expectation on-policy).
            raise ValueError("signals.divergence must be 'full' or 'topk' for the self-"
                             f"distillation loss, got {self.signals.divergence!r}")


_DICT_FIELDS = ("task_options", "credit")


def valid_keys(cls: type = TrainConfig, prefix: str = "") -> list[str]:
    """Every settable dotted key of ``cls`` (dict-valued fields as ``name.<key>``)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            keys.extend(valid_keys(hint, prefix + f.name + "."))
        elif f.name in _DICT_FIELDS:
            keys.append(prefix + f.name + ".<key>")
        else:
            keys.append(prefix + f.name)
    return keys


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """``value`` checked (and, for numbers given as strings, converted) against ``hint``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(key, value, option)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError(errors[0] if errors else f"{key}: bad value {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{key} must be a bool, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"{key} must be an int, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{key} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"{key} must be a string, got {value!r}")
    if origin is list or hint is list:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key} must be a list of strings, got {value!r}")
        return list(value)
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{key} must be a mapping, got {value!r}")
        return dict(value)
    return value


def _set(config: Any, key: str, value: Any, full_key: str) -> None:
    name, _, rest = key.partition(".")
    fields = {f.name: f for f in dataclasses.fields(config)}
    if name not in fields:
        raise ValueError(
            f"unknown config key {full_key!r}; valid keys: {', '.join(valid_keys())}"
        )
    hint = typing.get_type_hints(type(config))[name]
    if dataclasses.is_dataclass(hint):
        if rest:
            _set(getattr(config, name), rest, value, full_key)
            return
        if not isinstance(value, Mapping):
            raise ValueError(f"{full_key} is a section; set its keys ({full_key}.<key>=...)")
        for sub, sub_value in value.items():
            _set(getattr(config, name), str(sub), sub_value, f"{full_key}.{sub}")
        return
    if name in _DICT_FIELDS and rest:
        target = getattr(config, name)
        *parents, leaf = rest.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
        return
    if rest:
        raise ValueError(f"unknown config key {full_key!r}: {name!r} has no sub-keys; "
                         f"valid keys: {', '.join(valid_keys())}")
    setattr(config, name, _coerce(full_key, value, hint))


def config_from_dict(data: Mapping[str, Any], base: TrainConfig | None = None) -> TrainConfig:
    """A :class:`TrainConfig` from nested (or dotted-key) mapping ``data`` on top of ``base``."""
    config = base if base is not None else TrainConfig()
    if not isinstance(data, Mapping):
        raise ValueError(f"config must be a mapping, got {type(data).__name__}")
    for key, value in data.items():
        _set(config, str(key), value, str(key))
    return config


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON-ready) of ``config``."""
    return dataclasses.asdict(config)


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a.b": 1, "c": "x"}``; values are parsed as YAML scalars
    (``1e-5`` -> float, ``true`` -> bool, ``null`` -> None, ``[1, 2]`` -> list)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} is not of the form key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str) and _looks_like_float(raw):
            value = float(raw)
        out[key.strip()] = value
    return out


def _looks_like_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def apply_overrides(config: TrainConfig, items: Sequence[str]) -> TrainConfig:
    """Apply ``key=value`` strings to ``config`` (in place) and return it."""
    return config_from_dict(parse_overrides(items), config)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Defaults, then the YAML file at ``path`` (if any), then ``overrides``; validated."""
    config = TrainConfig()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config file {str(path)!r} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        config_from_dict(data, config)
    apply_overrides(config, overrides)
    config.validate()
    return config
