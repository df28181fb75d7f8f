"""Scores of a credit estimator against the Monte-Carlo truth, with cluster-bootstrap intervals.

A *unit* is the span of policy tokens between two consecutive boundaries at which ``V`` was
estimated: one token when every boundary is (``every=1``), a run of tokens otherwise. The truth
of a unit is its Monte-Carlo advantage ``V_end - V_start`` (the sum of its tokens' advantages,
by telescoping); an estimator's credit of a unit is the sum of its per-token advantages over the
unit's policy tokens. Per trajectory (docs/credit_check.md defines each score):

- **Spearman**: the rank correlation (``scipy.stats.spearmanr``, ties at average ranks) of the
  estimator's unit credits with the truth. Constant credit (GRPO's uniform credit, in token
  units) has no ranking: its Spearman is *defined as 0*, the floor. Trajectories whose truth is
  constant, or with fewer than 3 units, carry no ranking to match and are left out.
- **precision@k**: the expected share of the ``k`` units with the largest ``|credit|`` that are
  among the ``k`` units with the largest ``|truth|``, ties at the cut broken uniformly at random
  on each side (computed exactly, not sampled), so constant credit scores the chance level
  ``k / U``. Trajectories with ``U <= k`` units, or constant truth, are left out.
- **segment mass**: the share of ``|truth|`` mass inside GEAR's segments (a unit counts inside
  in proportion to its policy tokens inside a segment), beside the share of policy tokens inside
  (what the mass share would be if segments were placed blind).
- **mean weight per outcome sign**: the estimator's total credit of a trajectory over its
  outcome advantage times its policy tokens (``sum_t Ahat_t / (A_i * n_i)``: the mean of GEAR's
  ``W``), pooled over the trajectories with ``A_i > 0`` and, apart, ``A_i < 0``. GRPO's is 1 on
  both. Spearman and precision are blind to a trajectory-wide factor; this is what shows it: a
  reading whose weights average 0.6 on successes and 1.4 on failures pushes a group's failures
  down harder than it lifts its successes (docs/credit_check.md).
- **opposed mass** (of the truth itself): the share of ``|truth|`` mass on units whose sign is
  the opposite of their trajectory's outcome advantage, credit that no estimator preserving the
  outcome's sign on every token can represent.

Averages are over trajectories (Spearman, precision) or pooled ratios of sums over trajectories
(mass shares). Every interval is a percentile bootstrap over prompt groups: resampling whole
groups with replacement keeps the trajectories of one prompt, which share its difficulty,
together (:func:`cluster_bootstrap`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["Interval", "TrajectoryUnits", "cluster_bootstrap", "paired_difference",
           "per_trajectory_scores", "precision_at_k", "score_estimate", "span_shares",
           "span_sums", "spearman", "top_k_shares", "truth_summary"]


@dataclass(frozen=True)
class Interval:
    """A statistic over trajectories and its bootstrap interval.

    Attributes:
        value: the statistic on all trajectories (NaN where no trajectory defines it).
        low, high: the percentile interval over group resamples (NaN with fewer than 2 groups).
        trajectories: trajectories the statistic is defined on.
        groups: prompt groups they come from.
    """

    value: float
    low: float
    high: float
    trajectories: int
    groups: int

    def to_dict(self) -> dict[str, float | int | None]:
        return {key: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for key, v in asdict(self).items()}


def spearman(estimate: np.ndarray, truth: np.ndarray) -> float:
    """Spearman's rho of ``estimate`` with ``truth`` (``[U]`` each); 0 where either is constant
    (no ranking: the defined floor)."""
    estimate, truth = np.asarray(estimate, float), np.asarray(truth, float)
    if estimate.shape != truth.shape:
        raise ValueError(f"estimate has shape {estimate.shape}, truth {truth.shape}")
    if estimate.size < 2 or np.ptp(estimate) == 0 or np.ptp(truth) == 0:
        return 0.0
    from scipy.stats import spearmanr

    return float(spearmanr(estimate, truth).statistic)


def top_k_shares(values: np.ndarray, k: int) -> np.ndarray:
    """``[U]``: the probability that each unit is among the ``k`` largest ``|values|`` when ties
    at the cut are broken uniformly at random (1 above the cut, 0 below, a fraction at it)."""
    magnitude = np.abs(np.asarray(values, float))
    if not 1 <= k <= magnitude.size:
        raise ValueError(f"k must be in [1, {magnitude.size}], got {k}")
    cut = np.sort(magnitude)[::-1][k - 1]
    above = magnitude > cut
    tied = magnitude == cut
    shares = above.astype(float)
    shares[tied] = (k - above.sum()) / tied.sum()
    return shares


def precision_at_k(estimate: np.ndarray, truth: np.ndarray, k: int) -> float:
    """The expected share of the top-``k`` units by ``|estimate|`` that are top-``k`` by
    ``|truth|`` (ties at either cut broken uniformly at random, independently)."""
    return float((top_k_shares(estimate, k) * top_k_shares(truth, k)).sum() / k)


def span_sums(token_values: np.ndarray, boundaries: Sequence[int],
              mask: np.ndarray | None = None) -> np.ndarray:
    """``[J - 1]``: the sum of ``token_values`` (``[L]``) over the policy tokens (``mask``,
    None: all) of each span ``[b_j, b_{j+1})``."""
    values = np.asarray(token_values, float)
    if mask is not None:
        values = values * (np.asarray(mask) > 0)
    totals = np.concatenate([[0.0], np.cumsum(values)])
    bounds = np.asarray(boundaries, int)
    return totals[bounds[1:]] - totals[bounds[:-1]]


def span_shares(inside: np.ndarray, boundaries: Sequence[int],
                mask: np.ndarray | None = None) -> np.ndarray:
    """``[J - 1]``: the share of each span's policy tokens for which ``inside`` (``[L]`` bool)
    holds (0 for a span without policy tokens)."""
    flags = np.asarray(inside, bool)
    policy = np.ones(flags.shape) if mask is None else (np.asarray(mask) > 0).astype(float)
    hits = span_sums(flags.astype(float) * policy, boundaries)
    tokens = span_sums(policy, boundaries)
    return np.divide(hits, tokens, out=np.zeros_like(hits), where=tokens > 0)


@dataclass
class TrajectoryUnits:
    """One trajectory's truth, in units.

    Attributes:
        group: its prompt group.
        truth: ``[U]`` Monte-Carlo unit advantages.
        truth_se: ``[U]`` their standard errors.
        outcome: the trajectory's outcome advantage (GRPO's ``A_i`` in its group).
        tokens: ``[U]`` policy tokens per unit.
    """

    group: Hashable
    truth: np.ndarray
    truth_se: np.ndarray
    outcome: float
    tokens: np.ndarray


def cluster_bootstrap(numerators: Sequence[float] | np.ndarray,
                      denominators: Sequence[float] | np.ndarray,
                      groups: Sequence[Hashable], *, resamples: int = 2000,
                      confidence: float = 0.95, seed: int = 0) -> Interval:
    """``sum(numerators) / sum(denominators)`` over trajectories and its percentile interval
    over resamples of whole prompt groups (with replacement). A mean over trajectories is the
    case ``denominators = 1``; NaN numerators mark trajectories that do not count."""
    num = np.asarray(numerators, float)
    den = np.asarray(denominators, float)
    if num.shape != den.shape or len(groups) != num.size:
        raise ValueError("numerators, denominators and groups must have one entry per "
                         "trajectory")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    keep = np.isfinite(num) & np.isfinite(den)
    num, den = num[keep], den[keep]
    kept = [g for g, k in zip(groups, keep, strict=True) if k]
    ids: dict[Hashable, int] = {}
    dense = np.array([ids.setdefault(g, len(ids)) for g in kept], dtype=int)
    count = len(ids)
    if count == 0 or den.sum() == 0:
        return Interval(math.nan, math.nan, math.nan, int(num.size), count)
    value = float(num.sum() / den.sum())
    if count < 2:
        return Interval(value, math.nan, math.nan, int(num.size), count)
    group_num = np.bincount(dense, weights=num, minlength=count)
    group_den = np.bincount(dense, weights=den, minlength=count)
    draws = np.random.default_rng(seed).integers(0, count, size=(resamples, count))
    totals = group_den[draws].sum(1)
    stats = np.divide(group_num[draws].sum(1), totals, out=np.full(resamples, np.nan),
                      where=totals != 0)
    tail = (1 - confidence) / 2 * 100
    low, high = np.nanpercentile(stats, [tail, 100 - tail])
    return Interval(value, float(low), float(high), int(num.size), count)


def per_trajectory_scores(units: TrajectoryUnits, estimate: np.ndarray, ks: Sequence[int]
                          ) -> dict[str, float]:
    """One trajectory's Spearman and precision@k (NaN where the trajectory is left out: see
    the module docstring) and its chance level ``k / U``."""
    truth = units.truth
    estimate = np.asarray(estimate, float)
    if estimate.shape != truth.shape:
        raise ValueError(f"estimate has {estimate.shape} units, the truth {truth.shape}")
    informative = truth.size >= 2 and np.ptp(truth) > 0
    out = {"spearman": spearman(estimate, truth) if informative and truth.size >= 3
           else math.nan}
    for k in ks:
        ok = informative and truth.size > k
        out[f"precision@{k}"] = precision_at_k(estimate, truth, k) if ok else math.nan
        out[f"chance@{k}"] = k / truth.size if ok else math.nan
    return out


def score_estimate(units: Sequence[TrajectoryUnits], estimates: Sequence[np.ndarray], *,
                   ks: Sequence[int] = (1, 3),
                   inside: Sequence[np.ndarray] | None = None, weights: bool = True,
                   resamples: int = 2000, confidence: float = 0.95, seed: int = 0
                   ) -> dict[str, Interval]:
    """Scores of one estimator over trajectories.

    Args:
        units: every scored trajectory's truth.
        estimates: per trajectory, ``[U]`` the estimator's unit credits.
        ks: the ``k`` of precision@k.
        inside: per trajectory, ``[U]`` the share of each unit's policy tokens inside the
            estimator's GEAR segments (None: it has no segments).
        weights: also ``weight_pos`` / ``weight_neg``, the mean weight per outcome sign
            (module docstring); False where the estimates are not token advantages (the noise
            ceiling scores one truth replicate against another).
        resamples, confidence, seed: the bootstrap (:func:`cluster_bootstrap`).

    Returns:
        ``spearman``, ``precision@k``, ``chance@k``, with ``weights`` ``weight_pos`` and
        ``weight_neg``, and, with ``inside``, ``segment_mass`` and ``segment_tokens`` (the
        share of policy tokens inside segments).
    """
    if len(estimates) != len(units):
        raise ValueError(f"{len(estimates)} estimates for {len(units)} trajectories")
    groups = [u.group for u in units]
    rows = [per_trajectory_scores(u, e, ks) for u, e in zip(units, estimates, strict=True)]
    boot: dict[str, Any] = {"resamples": resamples, "confidence": confidence, "seed": seed}
    ones = np.ones(len(units))
    out = {name: cluster_bootstrap([r[name] for r in rows], ones, groups, **boot)
           for name in rows[0]} if rows else {}
    if weights:
        tokens = [float(u.tokens.sum()) for u in units]
        for name, sign in (("weight_pos", 1.0), ("weight_neg", -1.0)):
            out[name] = cluster_bootstrap(
                [float(np.sum(e)) / u.outcome if u.outcome * sign > 0 else math.nan
                 for u, e in zip(units, estimates, strict=True)], tokens, groups, **boot)
    if inside is not None:
        if len(inside) != len(units):
            raise ValueError(f"{len(inside)} segment shares for {len(units)} trajectories")
        mass = [float(np.abs(u.truth).sum()) for u in units]
        out["segment_mass"] = cluster_bootstrap(
            [float((np.abs(u.truth) * s).sum()) for u, s in zip(units, inside, strict=True)],
            mass, groups, **boot)
        out["segment_tokens"] = cluster_bootstrap(
            [float((u.tokens * s).sum()) for u, s in zip(units, inside, strict=True)],
            [float(u.tokens.sum()) for u in units], groups, **boot)
    return out


def paired_difference(units: Sequence[TrajectoryUnits], estimates: Sequence[np.ndarray],
                      reference: Sequence[np.ndarray], *, name: str = "spearman",
                      ks: Sequence[int] = (1, 3), resamples: int = 2000,
                      confidence: float = 0.95, seed: int = 0) -> Interval:
    """The mean per-trajectory difference of score ``name`` between two estimators on the same
    trajectories (``estimates`` minus ``reference``), with its cluster-bootstrap interval."""
    diffs = [per_trajectory_scores(u, a, ks)[name] - per_trajectory_scores(u, b, ks)[name]
             for u, a, b in zip(units, estimates, reference, strict=True)]
    return cluster_bootstrap(diffs, np.ones(len(diffs)), [u.group for u in units],
                             resamples=resamples, confidence=confidence, seed=seed)


def truth_summary(units: Sequence[TrajectoryUnits], *, resamples: int = 2000,
                  confidence: float = 0.95, seed: int = 0) -> dict[str, Interval]:
    """Properties of the truth itself.

    Returns:
        ``mean_se`` (mean standard error of the unit advantages), ``clear_units`` (share of
        units whose advantage is beyond 2 standard errors), ``opposed_mass`` (share of
        ``|truth|`` mass whose sign opposes the trajectory's outcome advantage, over
        trajectories with a non-zero outcome advantage) and ``opposed_clear`` (the share of
        clear units, on those trajectories, with the opposite sign).
    """
    groups = [u.group for u in units]
    boot: dict[str, Any] = {"resamples": resamples, "confidence": confidence, "seed": seed}
    se = [np.where(np.isfinite(u.truth_se), u.truth_se, np.nan) for u in units]
    clear = [np.abs(u.truth) > 2 * np.nan_to_num(s, nan=np.inf) for u, s in zip(units, se,
                                                                                 strict=True)]
    signed = [u.outcome != 0 for u in units]
    opposed = [np.sign(u.truth) == -np.sign(u.outcome) for u in units]
    return {
        "mean_se": cluster_bootstrap([float(np.nansum(s)) for s in se],
                                     [float(np.isfinite(s).sum()) for s in se], groups, **boot),
        "clear_units": cluster_bootstrap([float(c.sum()) for c in clear],
                                         [float(c.size) for c in clear], groups, **boot),
        "opposed_mass": cluster_bootstrap(
            [float((np.abs(u.truth) * o).sum()) if s else math.nan
             for u, o, s in zip(units, opposed, signed, strict=True)],
            [float(np.abs(u.truth).sum()) if s else math.nan for u, s in zip(units, signed,
                                                                             strict=True)],
            groups, **boot),
        "opposed_clear": cluster_bootstrap(
            [float((c & o).sum()) if s else math.nan
             for c, o, s in zip(clear, opposed, signed, strict=True)],
            [float(c.sum()) if s else math.nan for c, s in zip(clear, signed, strict=True)],
            groups, **boot),
    }
