"""GEAR's segmentation scan (arXiv 2605.11853, Sec. 3.2; docs/design.md steps 3-7), two ways.

- :func:`scan_reference`: the scan of docs/design.md step 4 in plain Python, one row at a time.
  It is the specification the tests hold the kernel to.
- :func:`gear_kernel`: the whole per-row pipeline (validate, normalise, scan, score, sign-aware
  weight, rescale) fused into one numba kernel, parallel over rows. The scan is sequential within
  a row, so it cannot be vectorised; fusing every step into one pass over memory is what keeps
  GEAR within a few elementwise passes of plain GRPO (see ``benchmarks/credit_speed.py``).

Both compute the normalised divergence as ``(float64(d) - float64(min)) / float64(max - min)``
and compare in float64, so their onsets are identical, not merely close.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba
import numpy as np

from gear_rl.credit.config import GEARConfig

# Integer codes the kernel takes (numba compiles plain ints better than strings).
SEGMENTATION_CODES = {"none": 0, "kl_entropy": 1, "kl_only": 2, "entropy_only": 3,
                      "entropy_window": 4}
NORMALIZE_CODES = {"minmax": 0, "max": 1, "none": 2}
OUTPUT_ADVANTAGES, OUTPUT_ONSETS, OUTPUT_WEIGHTS = 0, 1, 2
# Per-row status codes the kernel reports; the caller turns them into ValueErrors.
STATUS_OK, STATUS_DIVERGENCE, STATUS_ENTROPY, STATUS_MASK = 0, 1, 2, 3
RANGE_EPS = 1e-8  # docs/design.md step 3: a range below this normalises to 0
_BIG = float(np.finfo(np.float64).max)  # finite min/max sentinel (see _row_range)


# ---------------------------------------------------------------------------------------------
# Reference: docs/design.md step 3 (normalise) and step 4 (scan), literally, in plain Python.
# ---------------------------------------------------------------------------------------------
def normalize_reference(values: Sequence[float], mask: Sequence[int], mode: str) -> list[float]:
    """Per-trajectory normalisation over policy tokens (``mask == 1``); 0 on masked-out ones."""
    policy = [float(v) for v, m in zip(values, mask, strict=True) if m]
    if mode == "none":
        return [float(v) if m else 0.0 for v, m in zip(values, mask, strict=True)]
    if not policy:
        return [0.0] * len(values)
    low, high = min(policy), max(policy)
    if mode == "minmax":
        span = high - low
        if span < RANGE_EPS:
            return [0.0] * len(values)
        return [(float(v) - low) / span if m else 0.0 for v, m in zip(values, mask, strict=True)]
    if mode == "max":
        if high < RANGE_EPS:
            return [0.0] * len(values)
        return [float(v) / high if m else 0.0 for v, m in zip(values, mask, strict=True)]
    raise ValueError(f"unknown normalize mode {mode!r}")


def scan_reference(
    normalized: Sequence[float],
    entropy: Sequence[float],
    mask: Sequence[int],
    config: GEARConfig,
) -> list[int]:
    """Segment onsets of one trajectory, by docs/design.md step 4.

    Args:
        normalized: ``[T]`` normalised divergence ``n_t``.
        entropy: ``[T]`` student entropy ``H_t`` (nats).
        mask: ``[T]`` 1 for policy tokens; 0 positions are skipped, never boundaries.
        config: ``lambda_kl``, ``lambda_h``, ``segmentation`` and ``window`` are read.

    Returns:
        ``[T]`` list: for each token, the index of the onset of the segment holding it, or -1
        (outside every segment, and at every masked-out position).
    """
    mode = config.segmentation
    onsets = [-1] * len(normalized)
    if mode == "none":
        return onsets
    onset_signal = list(normalized)
    if mode == "entropy_only":
        onset_signal = normalize_reference(entropy, mask, "minmax")
    policy = [t for t, m in enumerate(mask) if m]
    i = 0
    while i < len(policy):
        s = policy[i]
        if not onset_signal[s] > config.lambda_kl:
            i += 1
            continue
        onsets[s] = s
        threshold = config.lambda_h * float(entropy[s])
        j = i + 1
        while j < len(policy):
            e = policy[j]
            if mode == "kl_only":
                if normalized[e] > config.lambda_kl:
                    break  # the next spike opens the next segment
                onsets[e] = s
                j += 1
                continue
            onsets[e] = s
            if mode == "entropy_window":
                start = max(i + 1, j + 1 - config.window)  # after the onset, at most `window`
                trailing = [float(entropy[t]) for t in policy[start: j + 1]]
                ends = sum(trailing) / len(trailing) > threshold
            else:
                ends = float(entropy[e]) > threshold
            j += 1
            if ends:
                break
        i = j
    return onsets


# ---------------------------------------------------------------------------------------------
# Compiled kernel: the same steps fused, one row per parallel iteration.
# ---------------------------------------------------------------------------------------------
@numba.njit(parallel=True, cache=True, nogil=True)
def gear_kernel(divergence, entropy, mask, advantages, segmentation, normalize, lambda_kl,
                lambda_h, alpha, beta, window, sign_aware, mean_preserving, output, out_float,
                out_onsets, status):  # pragma: no cover - compiled; held to the reference by tests
    """Fused GEAR over rows (numba). Arrays: ``divergence``, ``entropy``, ``mask`` ``[B, T]``;
    ``advantages`` ``[B]``; ``out_float`` ``[B, T]`` (advantages or weights) or a dummy;
    ``out_onsets`` ``[B, T]`` int64 or a dummy; ``status`` ``[B]`` int8, written per row."""
    num_rows, length = divergence.shape
    for b in numba.prange(num_rows):
        status[b] = _gear_row(b, length, divergence, entropy, mask, advantages, segmentation,
                              normalize, lambda_kl, lambda_h, alpha, beta, window, sign_aware,
                              mean_preserving, output, out_float, out_onsets)


@numba.njit(cache=True, nogil=True)
def _row_status(b, length, divergence, entropy, mask):  # pragma: no cover - compiled
    """The status of a row known to hold a bad value: the first bad token decides, divergence
    before entropy before mask (the slow path; rows are checked branch-free first)."""
    for t in range(length):
        m = mask[b, t]
        if not math.isfinite(divergence[b, t]):
            return 1
        if not math.isfinite(entropy[b, t]):
            return 2
        if m != 0 and m != 1:
            return 3
    return 0


@numba.njit(cache=True, nogil=True)
def _row_valid(b, length, divergence, entropy, mask):  # pragma: no cover - compiled
    """Whether every divergence and entropy of the row is finite and every mask value 0 or 1."""
    bad = False
    for t in range(length):
        m = mask[b, t]
        # abs(x) < inf is False exactly for inf and NaN
        bad |= (not (abs(divergence[b, t]) < np.inf)) | (not (abs(entropy[b, t]) < np.inf)) | (
            (m != 0) & (m != 1))
    return not bad


# nnan/ninf hold: only rows that passed _row_valid come here, and the sentinels are finite
# (DBL_MAX); min/max are exact in any order, so these flags only let the loop vectorise.
@numba.njit(cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz", "reassoc"})
def _row_range(b, length, divergence, entropy, mask):  # pragma: no cover - compiled
    """float64 min and max of the row's divergence and entropy over policy tokens, and their
    count (an empty row gives the sentinels, unused: it normalises to 0)."""
    big = _BIG
    d_low, d_high, h_low, h_high = big, -big, big, -big
    count = 0
    for t in range(length):
        d = np.float64(divergence[b, t])
        h = np.float64(entropy[b, t])
        policy = mask[b, t] != 0
        count += policy
        d_low = min(d_low, d if policy else big)
        d_high = max(d_high, d if policy else -big)
        h_low = min(h_low, h if policy else big)
        h_high = max(h_high, h if policy else -big)
    return d_low, d_high, h_low, h_high, count


@numba.njit(cache=True, nogil=True)
def _gear_row(b, length, divergence, entropy, mask, advantages, segmentation, normalize,
              lambda_kl, lambda_h, alpha, beta, window, sign_aware, mean_preserving, output,
              out_float, out_onsets):  # pragma: no cover - compiled
    # Pass 1: validate, then the min/max over policy tokens (step 3); both loops branch-free
    # reductions that vectorise. A row holding a bad value is located token by token after.
    if not _row_valid(b, length, divergence, entropy, mask):
        return _row_status(b, length, divergence, entropy, mask)
    d_low, d_high, h_low, h_high, count = _row_range(b, length, divergence, entropy, mask)
    d_low64 = d_low
    d_span = d_high - d_low64
    d_zero = count == 0 or (normalize == 0 and d_span < RANGE_EPS) or (
        normalize == 1 and d_high < RANGE_EPS)
    # n = (d - offset) / scale is bit-identical to each mode's formula (x - 0.0 == x, x / 1.0 == x)
    if normalize == 0:
        offset, scale = d_low64, d_span
    elif normalize == 1:
        offset, scale = 0.0, d_high
    else:
        offset, scale = 0.0, 1.0
    h_low64 = h_low
    h_span = h_high - h_low64
    h_zero = count == 0 or h_span < RANGE_EPS

    a = np.float64(advantages[b])
    if sign_aware:
        sign = 1 if a > 0 else (-1 if a < 0 else 0)
    else:
        sign = 1
    if output == 1:
        factor = 1.0  # unused
    elif output == 2 or mean_preserving:
        factor = 1.0  # weights; scaled by A after the mean, below
    else:
        factor = a
    # Loop-invariant switches of the scan, so its body needs no data-dependent branch.
    can_open = segmentation != 0
    reopen = segmentation == 2  # kl_only: a spike inside a segment opens the next one
    can_close = segmentation != 2
    entropy_signal = segmentation == 3

    # Pass 2: scan (step 4), score (5), weight (6), rescale (7), with selects for the state.
    if segmentation == 4:
        weight_sum = _scan_window(b, length, divergence, entropy, mask, d_zero, offset, scale,
                                  lambda_kl, lambda_h, window, sign, alpha, beta, factor,
                                  output, out_float, out_onsets)
    else:
        weight_sum = _scan(b, length, divergence, entropy, mask, d_zero, offset, scale,
                           h_zero, h_low64, h_span, lambda_kl, lambda_h, can_open, reopen,
                           can_close, entropy_signal, sign, alpha, beta, factor, output,
                           out_float, out_onsets)

    if mean_preserving and output != 1:
        mean_weight = weight_sum / count if count > 0 else 1.0
        if abs(mean_weight) <= 1e-12:
            mean_weight = 1.0  # all weights ~0: nothing to preserve, and never divide by ~0
        scale_a = a if output == 0 else 1.0
        for t in range(length):
            if mask[b, t] != 0:
                out_float[b, t] = (np.float64(out_float[b, t]) / mean_weight) * scale_a
    return 0


@numba.njit(cache=True, nogil=True, inline="always")
def _scan(b, length, divergence, entropy, mask, d_zero, offset, scale, h_zero, h_low64, h_span,
          lambda_kl, lambda_h, can_open, reopen, can_close, entropy_signal, sign, alpha, beta,
          factor, output, out_float, out_onsets):  # pragma: no cover - compiled
    """Scan of every mode but ``entropy_window``; returns the sum of the policy weights.

    The per-token tail (score, weight, output) is written out here and in :func:`_scan_window`
    on purpose: moving it into a shared inline helper measured about 1.8x slower
    (``benchmarks/credit_speed.py --passes-only``, 4.1-4.7 vs 7.8-9.0 passes)."""
    in_segment = False
    onset = -1
    onset_score = 0.0
    threshold = 0.0
    weight_sum = 0.0
    for t in range(length):
        policy = mask[b, t] != 0
        d = np.float64(divergence[b, t])
        h = np.float64(entropy[b, t])
        n = 0.0 if d_zero else (d - offset) / scale
        if entropy_signal:
            signal = 0.0 if h_zero else (h - h_low64) / h_span
        else:
            signal = n
        opens = policy & can_open & (signal > lambda_kl) & (reopen | (not in_segment))
        closes = policy & in_segment & can_close & (h > threshold)
        onset = t if opens else onset
        onset_score = n if opens else onset_score
        threshold = lambda_h * h if opens else threshold
        inside = in_segment | opens
        score = onset_score if inside else n
        weight = _weight(score, sign, alpha, beta)
        weight_sum += weight if policy else 0.0
        if output == 1:
            out_onsets[b, t] = onset if inside & policy else -1
        else:
            out_float[b, t] = weight * factor if policy else 0.0
        in_segment = inside & (not closes)
    return weight_sum


@numba.njit(cache=True, nogil=True, inline="always")
def _scan_window(b, length, divergence, entropy, mask, d_zero, offset, scale, lambda_kl,
                 lambda_h, window, sign, alpha, beta, factor, output, out_float,
                 out_onsets):  # pragma: no cover - compiled
    """Scan of ``entropy_window``; returns the sum of the policy weights.

    The trailing mean of the k = min(seen, window) policy entropies after the onset is summed
    oldest first, as the reference does: while seen <= window that sum is a running sum reset
    at the onset; after, it is the full-window sum over the last ``window`` policy entropies,
    which does not depend on the scan's state (so it is computed for every token, off the
    scan's dependency chain)."""
    # policy entropies in order, after ``window`` zeros (so the full window never underflows)
    history = np.zeros(length + window, dtype=np.float64)
    p = window  # next slot of ``history``
    in_segment = False
    onset = -1
    onset_score = 0.0
    threshold = 0.0
    seen = 0  # policy tokens after the onset, saturating at ``window``
    running = 0.0  # sum of the ``seen`` entropies after the onset, oldest first
    weight_sum = 0.0
    window_size = np.float64(window)
    for t in range(length):
        policy = mask[b, t] != 0
        d = np.float64(divergence[b, t])
        h = np.float64(entropy[b, t])
        n = 0.0 if d_zero else (d - offset) / scale
        history[p] = h
        p += policy

        step = policy & in_segment
        seen_now = min(seen + 1, window) if step else seen
        running_now = running + h if step else running
        if step & (seen_now >= window):  # changes only at segment ends: predictable
            total = 0.0
            for q in range(p - window, p):  # oldest first
                total += history[q]
            k = window_size
        else:
            total = running_now
            k = np.float64(max(seen_now, 1))
        closes = step & (total / k > threshold)

        opens = policy & (n > lambda_kl) & (not in_segment)
        onset = t if opens else onset
        onset_score = n if opens else onset_score
        threshold = lambda_h * h if opens else threshold
        seen = 0 if opens else seen_now
        running = 0.0 if opens else running_now
        inside = in_segment | opens
        score = onset_score if inside else n
        weight = _weight(score, sign, alpha, beta)
        weight_sum += weight if policy else 0.0
        if output == 1:
            out_onsets[b, t] = onset if inside & policy else -1
        else:
            out_float[b, t] = weight * factor if policy else 0.0
        in_segment = inside & (not closes)
    return weight_sum


@numba.njit(cache=True, inline="always")
def _weight(score, sign, alpha, beta):  # pragma: no cover - compiled
    if sign > 0:
        w = 1.0 - score
    elif sign < 0:
        w = score
    else:
        w = 0.5
    return alpha * w + beta
