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
def _gear_row(b, length, divergence, entropy, mask, advantages, segmentation, normalize,
              lambda_kl, lambda_h, alpha, beta, window, sign_aware, mean_preserving, output,
              out_float, out_onsets):  # pragma: no cover - compiled
    # Pass 1: validate, and the min/max over policy tokens (step 3).
    d_low, d_high, h_low, h_high = np.inf, -np.inf, np.inf, -np.inf
    count = 0
    for t in range(length):
        d = divergence[b, t]
        h = entropy[b, t]
        m = mask[b, t]
        if not math.isfinite(d):
            return 1
        if not math.isfinite(h):
            return 2
        if m != 0 and m != 1:
            return 3
        if m != 0:
            count += 1
            d_low = min(d_low, d)
            d_high = max(d_high, d)
            h_low = min(h_low, h)
            h_high = max(h_high, h)
    d_low64 = np.float64(d_low)
    d_span = np.float64(d_high) - d_low64
    d_zero = count == 0 or (normalize == 0 and d_span < RANGE_EPS) or (
        normalize == 1 and np.float64(d_high) < RANGE_EPS)
    h_low64 = np.float64(h_low)
    h_span = np.float64(h_high) - h_low64
    h_zero = count == 0 or h_span < RANGE_EPS

    a = np.float64(advantages[b])
    if sign_aware:
        sign = 1 if a > 0 else (-1 if a < 0 else 0)
    else:
        sign = 1
    trailing = np.zeros(window, dtype=np.float64)

    # Pass 2: scan (step 4), score (5), weight (6), rescale (7).
    in_segment = False
    onset = -1
    onset_score = 0.0
    threshold = 0.0
    seen = 0  # policy tokens after the onset (entropy_window)
    weight_sum = 0.0
    for t in range(length):
        if mask[b, t] == 0:
            if output == 1:
                out_onsets[b, t] = -1
            else:
                out_float[b, t] = 0.0
            continue
        if d_zero:
            n = 0.0
        elif normalize == 0:
            n = (np.float64(divergence[b, t]) - d_low64) / d_span
        elif normalize == 1:
            n = np.float64(divergence[b, t]) / np.float64(d_high)
        else:
            n = np.float64(divergence[b, t])
        h = np.float64(entropy[b, t])

        closes = False  # this token is its segment's last (the scan resumes after it)
        if in_segment and segmentation == 2:
            if n > lambda_kl:
                onset, onset_score = t, n  # kl_only: the next spike opens the next segment
        elif in_segment:
            if segmentation == 4:
                trailing[seen % window] = h
                seen += 1
                k = min(seen, window)
                total = 0.0
                for q in range(seen - k, seen):  # oldest first, as the reference sums
                    total += trailing[q % window]
                closes = total / k > threshold
            else:
                closes = h > threshold
        else:
            if segmentation == 3:
                signal = 0.0 if h_zero else (h - h_low64) / h_span
            else:
                signal = n
            if segmentation != 0 and signal > lambda_kl:
                in_segment = True
                onset, onset_score = t, n
                threshold = lambda_h * h
                seen = 0

        score = onset_score if in_segment else n
        weight = _weight(score, sign, alpha, beta)
        weight_sum += weight
        if output == 1:
            out_onsets[b, t] = onset if in_segment else -1
        elif output == 2 or mean_preserving:
            out_float[b, t] = weight  # scaled by A after the mean, below
        else:
            out_float[b, t] = weight * a
        if closes:
            in_segment = False

    if mean_preserving and output != 1:
        mean_weight = weight_sum / count if count > 0 else 1.0
        if abs(mean_weight) <= 1e-12:
            mean_weight = 1.0  # all weights ~0: nothing to preserve, and never divide by ~0
        scale = a if output == 0 else 1.0
        for t in range(length):
            if mask[b, t] != 0:
                out_float[b, t] = (np.float64(out_float[b, t]) / mean_weight) * scale
    return 0


@numba.njit(cache=True, inline="always")
def _weight(score, sign, alpha, beta):  # pragma: no cover - compiled
    if sign > 0:
        w = 1.0 - score
    elif sign < 0:
        w = score
    else:
        w = 0.5
    return alpha * w + beta
