"""The project's statistics, in one place: ``gear-rl compare``'s over seeds and ``gear-rl
study``'s paired over problems and seeds (docs/study.md defines every number).

**Over seeds** (``gear-rl compare``: one final held-out Mean@k per run):

- :func:`t_interval`: the Student-t interval of a mean over seeds;
- :func:`welch_test`: Welch's two-sided unequal-variance t-test of two methods' seeds.

**Paired** (``gear-rl study``): every cell of a task is evaluated on the same held-out problems
with the same sampling seeds per problem, so a method and the baseline are compared problem by
problem. A method's results form a table ``Y[s, p]``: the score of seed ``s`` on held-out problem
``p`` at the final evaluation (Mean@k: the fraction of the problem's k samples that are correct;
pass@k: 1 when any is). Its estimate is the mean over seeds and problems, which is also the mean
over seeds of each seed's held-out Mean@k.

- **Paired bootstrap** (:func:`paired_difference`): each replicate draws the problems with
  replacement (the same draw for the method and the baseline: paired over problems) and the
  seeds with replacement (the same draw for both when they ran the same seeds: paired over
  seeds; otherwise each method's seeds on their own), and recomputes the difference of the
  means. The interval is the percentile interval of the replicates; the standard error is their
  standard deviation. :func:`bootstrap_mean`: one method's mean with such an interval.
- **Seed-level test** (:func:`seed_test`): the per-seed Mean@k of the two methods, by a paired
  t-test over seeds (``scipy.stats.ttest_rel``) when both ran the same seeds (seed ``s`` of each
  shares its data order and sampling seeds), else Welch's test (:func:`welch_test`).
- **Verdict** (:func:`verdict`): "better beyond noise" when the interval lies above 0, "worse
  beyond noise" when below, "within noise" when it contains 0.
- **Minimum detectable difference** (:func:`minimum_detectable`): ``(z(1 - alpha/2) + z(power))
  x SE``, 2.80 x SE at alpha = 0.05 and 80% power: the smallest true difference this design
  would call beyond noise four times in five (normal approximation, same SE).

Numbers in, numbers out: nothing here reads a run or imports from the project.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.stats

__all__ = [
    "VERDICTS",
    "Difference",
    "Estimate",
    "SeedTest",
    "WelchResult",
    "bootstrap_mean",
    "minimum_detectable",
    "paired_difference",
    "seed_test",
    "t_interval",
    "verdict",
    "welch_test",
]

VERDICTS = ("better beyond noise", "within noise", "worse beyond noise")


# ------------------------------------------------------------------------------ over seeds
def t_interval(values: Sequence[float], confidence: float = 0.95
               ) -> tuple[float, float | None, float | None]:
    """``(mean, low, high)``: the Student-t confidence interval of the mean of ``values``
    (``low = high = None`` for a single value: no interval exists)."""
    if not values:
        raise ValueError("values must not be empty")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None
    half = (float(scipy.stats.t.ppf(0.5 + confidence / 2.0, len(values) - 1))
            * statistics.stdev(values) / math.sqrt(len(values)))
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class WelchResult:
    """Welch's unequal-variance t-test of ``mean(a) - mean(b)``.

    Attributes:
        difference: ``mean(a) - mean(b)``.
        t, df: the statistic and Welch-Satterthwaite degrees of freedom (None when both
            samples have zero variance).
        p: two-sided p-value (0.0 or 1.0 in the zero-variance case: the means differ or not).
    """

    difference: float
    t: float | None
    df: float | None
    p: float


def welch_test(a: Sequence[float], b: Sequence[float]) -> WelchResult | None:
    """Welch's two-sided t-test (``scipy.stats.ttest_ind(a, b, equal_var=False)``); None when
    either sample has fewer than 2 values."""
    if len(a) < 2 or len(b) < 2:
        return None
    difference = statistics.fmean(a) - statistics.fmean(b)
    # Checked with exact variances first: scipy's floating-point variance of identical values
    # can come out a rounding error above zero, which would turn "no spread" into a huge t.
    if statistics.variance(a) == 0.0 and statistics.variance(b) == 0.0:
        return WelchResult(difference, None, None, 1.0 if difference == 0 else 0.0)
    with warnings.catch_warnings():
        # scipy warns of "catastrophic cancellation" when one side has (almost) no spread; the
        # test is still right there (it matches the closed form, tests/test_compare.py).
        warnings.simplefilter("ignore", RuntimeWarning)
        test = scipy.stats.ttest_ind(a, b, equal_var=False)
    return WelchResult(difference, float(test.statistic), float(test.df), float(test.pvalue))


# ------------------------------------------------------------------------------ paired


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds and problems with its bootstrap interval.

    Attributes:
        value: the mean of ``Y`` over seeds and problems.
        low, high: the percentile interval of the bootstrap replicates.
        se: the replicates' standard deviation (the bootstrap standard error).
    """

    value: float
    low: float
    high: float
    se: float


@dataclass(frozen=True)
class SeedTest:
    """The seed-level test of a method against the baseline.

    Attributes:
        kind: ``"paired t"`` (same seeds on both sides) or ``"Welch t"``.
        difference: mean per-seed Mean@k of the method minus the baseline's.
        t, df: the statistic and its degrees of freedom (None when no seed-to-seed variance
            exists: then ``p`` is 1.0 for a zero difference and 0.0 otherwise).
        p: the two-sided p-value.
        n: seed pairs (paired) or the smaller side's seed count (Welch).
    """

    kind: str
    difference: float
    t: float | None
    df: float | None
    p: float
    n: int


@dataclass(frozen=True)
class Difference:
    """A method minus the baseline on one task.

    Attributes:
        difference: mean of the method's ``Y`` minus the baseline's (seeds and problems).
        low, high: its bootstrap percentile interval (``confidence`` level).
        se: its bootstrap standard error.
        mdd: the minimum detectable difference, :func:`minimum_detectable` of ``se``.
        seeds_paired: seeds were resampled jointly (both sides ran the same seeds).
        seed_test: the seed-level test (None with fewer than 2 seeds on a side).
        verdict: one of :data:`VERDICTS`, from the interval.
        confidence: the interval's level; ``power``: the power behind ``mdd``.
    """

    difference: float
    low: float
    high: float
    se: float
    mdd: float
    seeds_paired: bool
    seed_test: SeedTest | None
    verdict: str
    confidence: float
    power: float


def _table(values: Sequence[Sequence[float]] | np.ndarray, name: str) -> np.ndarray:
    table = np.asarray(values, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty [seeds, problems] table, got shape "
                         f"{table.shape}")
    if not np.isfinite(table).all():
        raise ValueError(f"{name} holds a value that is not finite")
    return table


def _check_levels(confidence: float, power: float = 0.8, replicates: int = 2) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power!r}")
    if replicates < 2:
        raise ValueError(f"replicates must be >= 2, got {replicates!r}")


def _weights(rng: np.random.Generator, n: int, replicates: int) -> np.ndarray:
    """``[replicates, n]`` resampling weights: multinomial counts of ``n`` draws with
    replacement from ``n`` items, divided by ``n`` (each row sums to 1)."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=replicates) / n


def _interval(replicates: np.ndarray, confidence: float) -> tuple[float, float, float]:
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [tail, 1.0 - tail])
    return float(low), float(high), float(replicates.std(ddof=1))


def bootstrap_mean(values: Sequence[Sequence[float]] | np.ndarray, *,
                   confidence: float = 0.95, replicates: int = 10_000,
                   seed: int = 0) -> Estimate:
    """The mean of a ``[seeds, problems]`` table with a bootstrap interval over problems and
    seeds (both drawn with replacement, independently)."""
    table = _table(values, "values")
    _check_levels(confidence, replicates=replicates)
    rng = np.random.default_rng(seed)
    seeds, problems = table.shape
    stats = ((_weights(rng, seeds, replicates) @ table)
             * _weights(rng, problems, replicates)).sum(1)
    low, high, se = _interval(stats, confidence)
    return Estimate(float(table.mean()), low, high, se)


def minimum_detectable(se: float, *, confidence: float = 0.95, power: float = 0.8) -> float:
    """``(z(1 - alpha/2) + z(power)) * se`` with ``alpha = 1 - confidence``: the true difference a
    two-sided test at level alpha with standard error ``se`` detects with probability ``power``
    (normal approximation; 2.80 x SE at the defaults)."""
    _check_levels(confidence, power)
    if not math.isfinite(se) or se < 0:
        raise ValueError(f"se must be a finite number >= 0, got {se!r}")
    alpha = 1.0 - confidence
    return float((scipy.stats.norm.ppf(1.0 - alpha / 2.0) + scipy.stats.norm.ppf(power)) * se)


def verdict(low: float, high: float) -> str:
    """The plain-words outcome of an interval of ``method - baseline``: "better beyond noise"
    (it lies above 0), "worse beyond noise" (below 0) or "within noise" (it contains 0)."""
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError(f"not an interval: [{low!r}, {high!r}]")
    if low > 0:
        return VERDICTS[0]
    if high < 0:
        return VERDICTS[2]
    return VERDICTS[1]


def seed_test(method: Sequence[float], baseline: Sequence[float], *,
              paired: bool) -> SeedTest | None:
    """The seed-level test of per-seed scores: a paired t-test when ``paired`` (``method[i]``
    and ``baseline[i]`` share seed i), else Welch's; None with fewer than 2 seeds on a side."""
    if paired:
        if len(method) != len(baseline):
            raise ValueError(f"a paired test needs as many seeds on each side, got "
                             f"{len(method)} and {len(baseline)}")
        if len(method) < 2:
            return None
        differences = [m - b for m, b in zip(method, baseline, strict=True)]
        mean = statistics.fmean(differences)
        # exact variance first, as welch_test does: identical differences have none
        if statistics.variance(differences) == 0.0:
            return SeedTest("paired t", mean, None, None, 1.0 if mean == 0 else 0.0,
                            len(method))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            test = scipy.stats.ttest_rel(method, baseline)
        return SeedTest("paired t", mean, float(test.statistic), float(len(method) - 1),
                        float(test.pvalue), len(method))
    welch = welch_test(method, baseline)
    if welch is None:
        return None
    return SeedTest("Welch t", welch.difference, welch.t, welch.df, welch.p,
                    min(len(method), len(baseline)))


def paired_difference(method: Sequence[Sequence[float]] | np.ndarray,
                      baseline: Sequence[Sequence[float]] | np.ndarray, *,
                      seeds_paired: bool, confidence: float = 0.95, power: float = 0.8,
                      replicates: int = 10_000, seed: int = 0) -> Difference:
    """``method - baseline`` from their ``[seeds, problems]`` tables (the same problems, in the
    same column order), with the paired bootstrap of the module docstring, the seed-level test,
    the verdict and the minimum detectable difference.

    Args:
        method, baseline: ``Y[s, p]`` of each side. With ``seeds_paired``, row ``s`` of both is
            the same training seed (so both have as many rows).
        seeds_paired: resample seeds jointly (and test with a paired t-test).
        confidence: the interval level (``1 - alpha`` of the verdict, the test and the MDD).
        power: the power of the minimum detectable difference.
        replicates, seed: bootstrap replicates and the seed of their random draws.
    """
    ours, theirs = _table(method, "method"), _table(baseline, "baseline")
    _check_levels(confidence, power, replicates)
    if ours.shape[1] != theirs.shape[1]:
        raise ValueError(f"method and baseline must cover the same problems, got "
                         f"{ours.shape[1]} and {theirs.shape[1]} columns")
    if seeds_paired and ours.shape[0] != theirs.shape[0]:
        raise ValueError(f"paired seeds need as many rows on each side, got {ours.shape[0]} and "
                         f"{theirs.shape[0]}")
    rng = np.random.default_rng(seed)
    problems = _weights(rng, ours.shape[1], replicates)  # one problem draw for both sides
    ours_seeds = _weights(rng, ours.shape[0], replicates)
    theirs_seeds = ours_seeds if seeds_paired else _weights(rng, theirs.shape[0], replicates)
    stats = (((ours_seeds @ ours) - (theirs_seeds @ theirs)) * problems).sum(1)
    low, high, se = _interval(stats, confidence)
    difference = float(ours.mean() - theirs.mean())
    test = seed_test(ours.mean(1).tolist(), theirs.mean(1).tolist(), paired=seeds_paired)
    return Difference(difference=difference, low=low, high=high, se=se,
                      mdd=minimum_detectable(se, confidence=confidence, power=power),
                      seeds_paired=seeds_paired, seed_test=test, verdict=verdict(low, high),
                      confidence=confidence, power=power)
