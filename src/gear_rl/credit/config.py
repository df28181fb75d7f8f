"""Config dataclasses of the credit estimators: one documented field per knob."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from gear_rl.dataclass_config import check_bool, check_int, shown

NORMALIZE_MODES = ("minmax", "max", "none")
SEGMENTATION_MODES = ("kl_entropy", "none", "kl_only", "entropy_only", "entropy_window")
SCORE_MODES = ("divergence", "log_ratio")
TOP_ENTROPY_SELECTIONS = ("batch", "micro_batch")

# Named GEAR readings (``credit.preset=NAME``): the fields each sets where it differs from
# GEARConfig's defaults, which stay the one home of every other value. ``paper``: the literal
# reading of arXiv 2605.11853 that docs/design.md specifies (steps 3-7; with
# ``signals.divergence=full``, the trainer's default), nothing beyond the paper. The defaults
# are that reading in every field but one: ``mean_preserving``, on by default since issue 39's
# control study applied the rule it wrote before its cells (studies/credit_control.yaml,
# "GEAR's default"), so the preset turns it off. Issue 16's credit checks found no other
# reading that follows the Monte-Carlo truth better (docs/credit_check.md). A default that
# ever moves away from the paper puts the paper's value for that field here
# (tests/test_credit_gear_preset.py holds the preset to the paper's numbers).
GEAR_PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"mean_preserving": False},
}


def _finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {shown(value)}")


@dataclass(frozen=True)
class OutcomeConfig:
    """The trajectory-level GRPO advantage every token-level method starts from.

    Attributes:
        norm_by_std: divide by the group's unbiased std (GRPO); ``False`` is Dr.GRPO.
        eps: added to the group std (verl's ``epsilon``).
    """

    norm_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        check_bool("norm_by_std", self.norm_by_std)
        _finite("eps", self.eps)
        if self.eps < 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")
        if self.norm_by_std and self.eps == 0:
            raise ValueError("eps must be > 0 when norm_by_std is set: it keeps the division by "
                             "a group's std finite")


@dataclass(frozen=True)
class GEARConfig(OutcomeConfig):
    """GEAR knobs (docs/design.md, "GEAR, as this project specifies it").

    Attributes:
        lambda_kl: onset threshold on the normalised divergence ``n_s > lambda_kl`` (step 4);
            for ``entropy_only``, the threshold on the min-max-normalised entropy. ``>= 0``,
            and ``< 1`` where what it thresholds is normalised to ``[0, 1]``.
        lambda_h: a segment ends at the first later policy token whose entropy exceeds
            ``lambda_h`` times the onset's entropy (inclusive); ``>= 1`` (an entropy rise).
        alpha: weight scale in ``W = alpha * w + beta``; ``>= 0``, and ``<= 2`` with ``beta``
            unset, so that ``W`` is never negative (a negative ``W`` flips the token's
            advantage).
        beta: offset in ``W``; ``None`` means ``1 - alpha / 2`` (so ``w = 0.5`` gives ``W = 1``);
            ``>= 0``, and not 0 together with ``alpha`` (``W = 0`` everywhere).
        normalize: per-trajectory divergence normalisation over policy tokens: ``minmax``
            (``(d - min) / (max - min)``, 0 where the range is < 1e-8), ``max`` (``d / max``,
            0 where ``max`` < 1e-8), ``none`` (raw divergence).
        segmentation: ``kl_entropy`` (GEAR); ``none`` (token-level KL weights, no segments);
            ``kl_only`` (a segment runs from one divergence spike to the token before the next);
            ``entropy_only`` (onsets where normalised entropy > ``lambda_kl``, usual termination);
            ``entropy_window`` (usual onsets; a segment ends where the mean entropy of its
            trailing ``window`` policy tokens after the onset exceeds ``lambda_h * H_onset``).
        window: trailing window length for ``entropy_window``.
        sign_aware: ``w = 1 - u`` for ``A > 0`` and ``w = u`` for ``A < 0`` (step 6); ``False``
            makes high divergence always down-weight (``w = 1 - u`` for every sign).
        mean_preserving: divide ``W`` by its mean over the trajectory's policy tokens, so the
            trajectory keeps GRPO's total advantage mass (beyond the paper). None (not set):
            the preset's value if it sets one (``paper``: False), else True, the default since
            issue 39 (studies/credit_control.yaml; runs recorded before it read as False:
            :data:`gear_rl.credit.registry.CHANGED_CREDIT_DEFAULTS`).
        score: what a token's score ``u_t`` (step 5) is read from. ``divergence`` (GEAR): the
            normalised divergence ``n``. ``log_ratio`` (beyond the paper; estimator
            ``gear_signed``, issue 16): the segments are found as usual, but the score is the
            sampled token's teacher log-ratio ``r_t = log pi_T(y_t) - log pi_S(y_t)`` (RLSD's
            signed evidence), the onset's inside a segment and the token's own elsewhere, as
            ``u_t = sigmoid(-r_t)``; so step 6 raises the weight of tokens the teacher endorses
            on correct answers and of tokens it rejects on wrong ones. Needs the sampled
            tokens' log-probs.
        skip_first: the first ``skip_first`` policy tokens of each trajectory neither open a
            segment nor enter the normalisation: their divergence is replaced by the minimum
            over the trajectory's other policy tokens before step 3 (so ``n = 0`` there with
            ``minmax``; the paper notes that early non-reasoning tokens carry large,
            uninformative divergence). 0 (default): every token counts.
        preset: a named reading (:data:`GEAR_PRESETS`; ``paper``: the literal reading, the
            defaults above with ``mean_preserving`` off) whose values every field left at its
            default takes; fields given other values keep them (``mean_preserving``, whose
            default is None, keeps an explicit True too). None: the defaults above.
    """

    lambda_kl: float = 0.1
    lambda_h: float = 1.5
    alpha: float = 1.0
    beta: float | None = None
    normalize: str = "minmax"
    segmentation: str = "kl_entropy"
    window: int = 8
    sign_aware: bool = True
    mean_preserving: bool | None = None
    score: str = "divergence"
    skip_first: int = 0
    preset: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.preset is not None:
            if self.preset not in GEAR_PRESETS:
                raise ValueError(f"preset must be one of {sorted(GEAR_PRESETS)} or None, got "
                                 f"{shown(self.preset)}")
            defaults = {f.name: f.default for f in dataclasses.fields(GEARConfig)}
            for name, value in GEAR_PRESETS[self.preset].items():
                if getattr(self, name) == defaults[name]:  # not set: the preset's value
                    object.__setattr__(self, name, value)
        if self.mean_preserving is None:  # not set, and no preset sets it: the default
            object.__setattr__(self, "mean_preserving", True)
        for name in ("lambda_kl", "lambda_h", "alpha"):
            _finite(name, getattr(self, name))
        if self.beta is not None:
            _finite("beta", self.beta)
        if self.normalize not in NORMALIZE_MODES:
            raise ValueError(f"normalize must be one of {NORMALIZE_MODES}, got "
                             f"{shown(self.normalize)}")
        if self.segmentation not in SEGMENTATION_MODES:
            raise ValueError(
                f"segmentation must be one of {SEGMENTATION_MODES}, got {shown(self.segmentation)}"
            )
        check_int("window", self.window, 1)
        check_int("skip_first", self.skip_first, 0)
        if self.score not in SCORE_MODES:
            raise ValueError(f"score must be one of {SCORE_MODES}, got {shown(self.score)}")
        for name in ("sign_aware", "mean_preserving"):
            check_bool(name, getattr(self, name))
        self._check_ranges()

    def _check_ranges(self) -> None:
        """Each threshold and scale within the range where it means what docs/design.md
        section 3 says: the onset threshold below the top of what it thresholds, a segment end
        at an entropy rise, and a weight ``W`` that is never negative (a negative ``W`` flips
        a token's advantage) and not 0 everywhere."""
        if self.lambda_kl < 0:
            raise ValueError(f"lambda_kl must be >= 0, got {self.lambda_kl}: the onset rule "
                             "n_s > lambda_kl thresholds a (normalised) divergence, and a "
                             "negative threshold makes every policy token an onset")
        if self.segmentation == "entropy_only":
            bounded = "the min-max-normalised entropy it thresholds"
        elif self.segmentation != "none" and self.normalize != "none":
            bounded = f"the {self.normalize}-normalised divergence it thresholds"
        else:
            bounded = ""
        if bounded and self.lambda_kl >= 1:
            raise ValueError(
                f"lambda_kl must be < 1 with normalize={shown(self.normalize)} and segmentation="
                f"{shown(self.segmentation)}, got {self.lambda_kl}: {bounded} lies in [0, 1] and "
                f"an "
                "onset needs n_s > lambda_kl, so no segment would ever open (a threshold in "
                "nats needs normalize=none)")
        if self.lambda_h < 1:
            raise ValueError(
                f"lambda_h must be >= 1, got {self.lambda_h}: a segment ends at an entropy rise, "
                "the first later token with entropy above lambda_h times the onset's; below 1 "
                "it would end at tokens less uncertain than the onset (at or below 0, at the "
                "very next one)")
        beta = self.resolved_beta
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}: W = alpha * w + beta with "
                             "a negative alpha reverses step 6 (it raises the weights the "
                             "sign-aware rule lowers)")
        if beta < 0 and self.beta is None:
            raise ValueError(
                f"alpha must be in [0, 2] while beta is unset, got {self.alpha}: beta = 1 - "
                f"alpha / 2 = {beta:g} makes W = alpha * w + beta negative for w < "
                f"{-beta / self.alpha:.3g}, which flips those tokens' advantage (a failed "
                "trajectory's tokens would be pushed up); for a wider scale set beta >= 0 too")
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}: W = alpha * w + beta would be "
                             "negative where w is small, which flips those tokens' advantage")
        if self.alpha + beta == 0:
            raise ValueError("alpha and beta are both 0: every weight W = alpha * w + beta is 0, "
                             "so every advantage is 0 and nothing is learned; alpha=0 with beta "
                             "unset (W = 1) is GRPO")

    @property
    def resolved_beta(self) -> float:
        """``beta``, or ``1 - alpha / 2`` when unset."""
        return 1.0 - self.alpha / 2.0 if self.beta is None else float(self.beta)


@dataclass(frozen=True)
class TopEntropyConfig(OutcomeConfig):
    """Top-entropy token mask (Wang et al., "Beyond the 80/20 Rule", arXiv 2506.01939).

    Attributes:
        rho: fraction of the policy tokens, highest entropy first, that keep their advantage:
            exactly ``k = ceil(rho * n)`` of ``n`` (the authors' rounding; ties at the cut are
            broken by position, earlier first, so exactly ``k`` are kept).
        selection: where the tokens are chosen. ``batch``: the credit step keeps the top
            ``rho`` of the whole batch by the scoring pass's entropy and zeroes the advantage
            elsewhere (the paper's "top 20% of the batch"; the loss is still averaged over
            every token). ``micro_batch``: the authors' code (their verl ``dp_actor``
            ``update_policy`` with ``get_global_entropy_top_mask``): each PPO micro-batch keeps
            its own top ``rho`` by the current policy's entropy, and the policy loss is
            aggregated over the selected tokens only (with ``token-mean``, a ``1 / rho``
            larger gradient). ``micro_batch`` needs an engine that applies update-time
            selection: gear-rl's trainer does; verl and TRL refuse it.
    """

    rho: float = 0.2
    selection: str = "batch"

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("rho", self.rho)
        if not 0.0 < self.rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {self.rho}")
        if self.selection not in TOP_ENTROPY_SELECTIONS:
            raise ValueError(f"selection must be one of {TOP_ENTROPY_SELECTIONS}, got "
                             f"{shown(self.selection)}")


@dataclass(frozen=True)
class RLSDConfig(OutcomeConfig):
    """RLSD token reweighting (arXiv 2604.03128):
    ``Ahat_t = A * ((1 - lam) + lam * clip(exp(sign(A) * d_t), 1 - eps_w, 1 + eps_w))``,
    ``d_t = teacher_logprob - student_logprob``. The schedule and the two restrictions are the
    authors' code's options (iie-ycx/RLSD: ``opsd_config.py``, ``rlsd_*``), off by default.

    Attributes:
        lam: mixing weight of the teacher-ratio term (the peak value under a schedule).
        eps_w: clip half-width of the ratio.
        lam_warmup_steps: ``lam`` ramps up linearly, ``lam * t / lam_warmup_steps`` at training
            step ``t < lam_warmup_steps`` (1-based, as the authors' ``global_step``); ``None``:
            no warm-up.
        lam_decay_steps: from step ``t >= lam_warmup_steps`` (or 0), ``lam`` decays linearly to
            0: ``lam * max(0, 1 - (t - lam_warmup_steps) / lam_decay_steps)``, so without a
            warm-up step 1 already has ``lam * (1 - 1 / lam_decay_steps)`` and step
            ``lam_decay_steps`` has 0 (the authors' ``examples/visual_rl/rlsd_train.sh`` uses
            60 steps, no warm-up). ``None``: constant ``lam``. Either schedule needs the
            training step (``CreditBatch.step``).
        negative_only: reweight only trajectories with ``A < 0``; the others keep GRPO's ``A``
            on every token (the authors' ``rlsd_negative_only``, against the response-length
            collapse of under-reinforced correct answers).
        thought_only: reweight only tokens inside a thought span; the others keep ``A`` (the
            authors' ``rlsd_thought_only``: tokens strictly between ``<thought>`` and
            ``</thought>``, the tags excluded). Needs ``CreditBatch.extras["thought_mask"]``
            (``[B, T]``, 1 on thought tokens).
    """

    lam: float = 0.5
    eps_w: float = 0.2
    lam_warmup_steps: int | None = None
    lam_decay_steps: int | None = None
    negative_only: bool = False
    thought_only: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("lam", self.lam)
        _finite("eps_w", self.eps_w)
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if not 0.0 <= self.eps_w < 1.0:
            raise ValueError(f"eps_w must be in [0, 1), got {self.eps_w}")
        check_int("lam_warmup_steps", self.lam_warmup_steps, 1, optional=True)
        check_int("lam_decay_steps", self.lam_decay_steps, 1, optional=True)
        for name in ("negative_only", "thought_only"):
            check_bool(name, getattr(self, name))
