"""Settings of a credit check (``gear-rl credit-check``, :func:`gear_rl.credit_check.credit_check`).

The sampler, the task and the signals come from a :class:`~gear_rl.train.config.TrainConfig`
(a run's own, or defaults with overrides); what is specific to the check is here: how many
trajectories, how many continuations per prefix, which boundaries, which estimators and GEAR
variants, and the bootstrap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gear_rl.dataclass_config import check_bool, check_int, check_memory, shown
from gear_rl.train.config import CONTINUATION_BYTES, TOKEN_BYTES, SignalConfig, TrainConfig

__all__ = ["BOUNDARY_MODES", "SIGNAL_KEYS", "SPLITS", "CreditCheckConfig", "Variant"]

BOUNDARY_MODES: tuple[str, ...] = ("tokens", "segments", "turns")
SPLITS: tuple[str, ...] = ("train", "eval")
# The signal settings a variant may change (fields of SignalConfig): the divergence estimator
# and the teacher prompt's hint text and placement.
SIGNAL_KEYS: tuple[str, ...] = ("divergence", "topk", "placement", "answer_template")


@dataclass(frozen=True)
class Variant:
    """One estimator reading scored beside the registered defaults.

    Attributes:
        estimator: a registered estimator name (``gear``, ``gear_token_kl``, a plugin's...).
        credit: its config fields (``{"lambda_h": 1.2, "mean_preserving": True}``).
        signals: signal settings for this variant only (:data:`SIGNAL_KEYS`: ``divergence``
            ``full``/``topk``/``k1``/``k3``, ``topk``, the teacher hint's ``placement`` and
            ``answer_template``); the rest are the run's.
    """

    estimator: str
    credit: Mapping[str, Any] = field(default_factory=dict)
    signals: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, name: str, value: Any) -> Variant:
        """A :class:`Variant` from itself, an estimator name, a tuple ``(estimator, credit,
        signals)`` (the last two optional), or a mapping with those keys."""
        if isinstance(value, Variant):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"estimator", "credit", "signals"})
            if unknown or "estimator" not in value:
                raise ValueError(f"variant {shown(name)}: expected keys estimator (required), "
                                 "credit "
                                 f"and signals, got {sorted(value)}")
            return cls(str(value["estimator"]), dict(value.get("credit") or {}),
                       dict(value.get("signals") or {}))
        if isinstance(value, Sequence) and 1 <= len(value) <= 3:
            parts = list(value)
            return cls(str(parts[0]), dict(parts[1] if len(parts) > 1 else {}),
                       dict(parts[2] if len(parts) > 2 else {}))
        raise ValueError(f"variant {shown(name)}: give an estimator name, (estimator, credit, "
                         f"signals) or a mapping, got {shown(value)}")

    def signal_config(self, base: SignalConfig, name: str) -> SignalConfig:
        """``base`` with this variant's signal settings, checked (errors name
        ``variant.NAME.signals.KEY``)."""
        unknown = sorted(set(self.signals) - set(SIGNAL_KEYS))
        if unknown:
            raise ValueError(f"variant.{name}.signals: unknown key(s) {unknown}; a variant may "
                             f"set {list(SIGNAL_KEYS)}")
        settings = dataclasses.replace(base, **dict(self.signals))
        settings.validate(f"variant.{name}.signals")
        return settings


@dataclass
class CreditCheckConfig:
    """What a credit check samples, estimates and scores.

    Attributes:
        groups: prompt groups sampled (each with the run's ``rollout.samples_per_prompt`` K
            responses, in batches of ``rollout.prompts_per_step`` groups, as a training step).
        per_group: trajectories per group whose truth is estimated, alternately the best and
            the worst rewarded of the group.
        trajectories: at most this many trajectories get a truth (None: every one chosen).
        mixed_only: only groups with mixed outcomes (where GRPO's advantage is not 0) give
            trajectories a truth; every estimator still sees the whole group.
        split: ``train`` or ``eval``: the task's problems to sample from.
        continuations: ``m``, continuations per boundary and replicate.
        replicates: independent Monte-Carlo estimates of each trajectory (2 or more: the
            second, scored against the first, is the noise ceiling).
        boundaries: ``tokens`` (every ``every``-th policy-token boundary), ``segments`` (the
            boundaries of GEAR's segments, under the run's signals and GEAR config) or
            ``turns`` (multi-turn tasks: the start of every policy turn, so that a unit is one
            turn and its observation: the unit of the step-level estimators' credit).
        every: with ``boundaries=tokens``, estimate ``V`` at every ``every``-th boundary.
        budget: stop starting trajectories once this many continuation tokens are sampled (over
            every session of this output folder; None: no limit).
        seed: the seed of the problems drawn, the trajectories and the continuations.
        estimators: the registered estimators to score (None: every one the task provides the
            inputs for, plugins included).
        variants: extra readings by name (:class:`Variant`), e.g. ``{"gear_k1": ("gear", {},
            {"divergence": "k1"})}``.
        reference: the row the paired Spearman differences are taken against (None: none).
        precision_k: the ``k`` of precision@k.
        bootstrap: group resamples of the bootstrap intervals.
        confidence: their level.
        plot_trajectories: trajectories drawn in the plot.
        batch_size: continuation rows per decoding batch (None: all of a trajectory's at once).
        shared_prefix: continuations share the prefix KV cache (``sample_continuations``);
            False: every prefix sampled afresh (slower, the same distribution).
        progress: show a progress bar.
    """

    groups: int = 8
    per_group: int = 4
    trajectories: int | None = None
    mixed_only: bool = True
    split: str = "train"
    continuations: int = 8
    replicates: int = 2
    boundaries: str = "tokens"
    every: int = 1
    budget: int | None = None
    seed: int = 0
    estimators: list[str] | None = None
    variants: dict[str, Any] = field(default_factory=dict)
    reference: str | None = "gear"
    precision_k: list[int] = field(default_factory=lambda: [1, 3])
    bootstrap: int = 2000
    confidence: float = 0.95
    plot_trajectories: int = 4
    batch_size: int | None = 64
    shared_prefix: bool = True
    progress: bool = True

    @classmethod
    def from_overrides(cls, values: Mapping[str, Any]) -> CreditCheckConfig:
        """A config from ``key=value`` overrides already parsed as YAML scalars
        (``gear_rl.dataclass_config.parse_overrides``): comma-separated strings become the lists of
        ``estimators`` and ``precision_k``; ``variant.NAME.estimator`` (or ``variant.NAME``),
        ``variant.NAME.credit.FIELD`` and ``variant.NAME.signals.KEY`` build ``variants``.
        Unknown keys raise, naming the valid ones."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"variants"}
        kwargs: dict[str, Any] = {}
        variants: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            if key.startswith("variant."):
                name, _, sub = key[len("variant."):].partition(".")
                entry = variants.setdefault(name, {"credit": {}, "signals": {}})
                section, _, leaf = sub.partition(".")
                if sub in ("", "estimator"):
                    entry["estimator"] = value
                elif section in ("credit", "signals") and leaf:
                    entry[section][leaf] = value
                else:
                    raise ValueError(f"{key}: a variant takes variant.NAME.estimator, "
                                     "variant.NAME.credit.FIELD and variant.NAME.signals.KEY")
                continue
            if key not in fields:
                raise ValueError(f"unknown credit-check key {shown(key)}; valid: "
                                 f"{', '.join(sorted(fields))}, variant.NAME.*")
            if key in ("estimators", "precision_k") and isinstance(value, (str, int)):
                value = [part.strip() for part in str(value).split(",") if part.strip()]
            if key == "precision_k" and isinstance(value, list):
                try:
                    value = [int(v) for v in value]
                except ValueError as error:
                    raise ValueError(f"precision_k must be integers, got {shown(value)}") from error
            if key == "estimators" and value in (["all"], "all"):
                value = None
            kwargs[key] = value
        for name, entry in variants.items():
            if "estimator" not in entry:
                raise ValueError(f"variant {shown(name)} needs variant.{name}.estimator=NAME")
        config = cls(**kwargs, variants=dict(variants))
        config.validate()
        return config

    def check_memory(self, config: TrainConfig) -> None:
        """Refuse settings whose memory cannot fit this machine
        (:func:`~gear_rl.dataclass_config.check_memory`, at the trainer's floors): the sampled
        trajectories (``groups`` prompt groups of ``rollout.samples_per_prompt`` responses of
        up to ``rollout.max_new_tokens`` tokens, all held), one trajectory's continuations
        (``replicates x continuations`` at its first boundary, at the least) and the bootstrap's
        draws (``bootstrap x groups``, 24 bytes each)."""
        check_memory({"groups": self.groups,
                      "rollout.samples_per_prompt": config.rollout.samples_per_prompt,
                      "rollout.max_new_tokens": config.rollout.max_new_tokens}, TOKEN_BYTES,
                     "trajectory tokens")
        check_memory({"replicates": self.replicates, "continuations": self.continuations},
                     CONTINUATION_BYTES, "continuations of a trajectory's first boundary")
        check_memory({"bootstrap": self.bootstrap, "groups": self.groups}, 24,
                     "bootstrap draws")

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field; normalises ``variants`` to
        :class:`Variant` values."""
        for name in ("groups", "per_group", "continuations", "replicates", "every", "bootstrap"):
            check_int(name, getattr(self, name), 1)
        for name in ("trajectories", "budget", "batch_size"):
            check_int(name, getattr(self, name), 1, optional=True)
        check_int("plot_trajectories", self.plot_trajectories, 0)
        check_int("seed", self.seed, 0)
        for name in ("mixed_only", "shared_prefix", "progress"):
            check_bool(name, getattr(self, name))
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {shown(self.split)}")
        if self.boundaries not in BOUNDARY_MODES:
            raise ValueError(f"boundaries must be one of {BOUNDARY_MODES}, got "
                             f"{shown(self.boundaries)}")
        if self.boundaries != "tokens" and self.every != 1:
            raise ValueError(f"every applies to boundaries=tokens; boundaries={self.boundaries} "
                             "estimates V at the "
                             + ("segments' edges" if self.boundaries == "segments"
                                else "start of every turn"))
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {shown(self.confidence)}")
        if not self.precision_k or any(isinstance(k, bool) or not isinstance(k, int) or k < 1
                                       for k in self.precision_k):
            raise ValueError(f"precision_k must be a non-empty list of integers >= 1, got "
                             f"{shown(self.precision_k)}")
        if self.estimators is not None and (
                isinstance(self.estimators, str)
                or not all(isinstance(e, str) and e for e in self.estimators)):
            raise ValueError(f"estimators must be a list of estimator names, got "
                             f"{shown(self.estimators)}")
        if not isinstance(self.variants, Mapping):
            raise ValueError(f"variants must be a mapping of name -> variant, got "
                             f"{shown(self.variants)}")
        self.variants = {str(name): Variant.coerce(str(name), value)
                         for name, value in self.variants.items()}
        for name in self.variants:
            if not name.isidentifier():
                raise ValueError(f"variant name {shown(name)} must be an identifier")
