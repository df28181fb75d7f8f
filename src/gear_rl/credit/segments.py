"""GEAR's segmentation scan (arXiv 2605.11853, Sec. 3.2; docs/design.md steps 3-7), two ways.

- :func:`scan_reference`: the scan of docs/design.md step 4 in plain Python, one row at a time.
  It is the specification the tests hold the kernel to.
- :func:`gear_kernel`: steps 3-7 compiled with numba, one row at a time (:func:`_gear_row`):
  a first pass over the row checks its values and takes the min/max of divergence and entropy
  over policy tokens; a second pass normalises, scans, scores, weights and writes each token;
  ``mean_preserving`` adds a third pass that divides by the row's mean weight.

The kernel normalises and compares in float64 exactly as the reference does, so their onsets are
identical, not merely close. ``benchmarks/credit_speed.py`` times it (first compile on a fresh
cache, milliseconds and elementwise passes at the verl-sized and the default trainer batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba
import numpy as np

from gear_rl.credit.config import GEARConfig

# Integer codes the kernel takes (numba compiles plain ints better than strings).
NO_SEGMENTS, KL_ENTROPY, KL_ONLY, ENTROPY_ONLY, ENTROPY_WINDOW = 0, 1, 2, 3, 4
SEGMENTATION_CODES = {"none": NO_SEGMENTS, "kl_entropy": KL_ENTROPY, "kl_only": KL_ONLY,
                      "entropy_only": ENTROPY_ONLY, "entropy_window": ENTROPY_WINDOW}
MINMAX, MAX, RAW = 0, 1, 2
NORMALIZE_CODES = {"minmax": MINMAX, "max": MAX, "none": RAW}
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
# Compiled kernel: the same steps, one row at a time.
# ---------------------------------------------------------------------------------------------
@numba.njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def gear_kernel(divergence, entropy, mask, advantages, segmentation, normalize, lambda_kl,
                lambda_h, alpha, beta, window, sign_aware, mean_preserving, output, out_float,
                out_onsets, status):  # pragma: no cover - compiled; held to the reference by tests
    """GEAR over rows (numba, parallel over rows).

    Arrays: ``divergence``, ``entropy``, ``mask`` ``[B, T]``; ``advantages`` ``[B]``;
    ``out_float`` ``[B, T]`` (advantages or weights; ``[1, 1]`` when ``output`` is onsets);
    ``out_onsets`` ``[B, T]`` int64 (``[1, 1]`` otherwise); ``status`` ``[B]`` int8, written per
    row (a row holding a bad value gets its status and no output: the caller raises)."""
    for row in numba.prange(divergence.shape[0]):
        # the [1, 1] dummy's one row where an output is not asked for
        frow = out_float[min(np.int64(row), out_float.shape[0] - 1)]
        orow = out_onsets[min(np.int64(row), out_onsets.shape[0] - 1)]
        status[row] = _gear_row(divergence[row], entropy[row], mask[row], advantages[row],
                                segmentation, normalize, lambda_kl, lambda_h, alpha, beta, window,
                                sign_aware, mean_preserving, output, frow, orow)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _below(x, y):  # pragma: no cover - compiled
    """``x < y``, with -0.0 below 0.0: the order the row's min/max are taken in (so that the
    minimum, and with it the sign of a zero ``n_t``, do not depend on which zero comes first)."""
    return x < y or (x == y and math.copysign(1.0, x) < math.copysign(1.0, y))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _gear_row(drow, hrow, mrow, advantage, segmentation, normalize, lambda_kl, lambda_h, alpha,
              beta, window, sign_aware, mean_preserving, output, frow,
              orow):  # pragma: no cover - compiled
    """Steps 3-7 on one row (``drow``, ``hrow``, ``mrow``: ``[T]``); writes ``frow`` (``[T]``
    advantages or weights) or ``orow`` (``[T]`` onsets) and returns the row's status."""
    # Pass 1: check every value (the first bad token decides, divergence before entropy before
    # mask); min/max of divergence and entropy over policy tokens; their count; one past the last.
    count = end = 0
    d_low = d_high = h_low = h_high = 0.0
    for t in range(mrow.shape[0]):
        d, h, m = np.float64(drow[t]), np.float64(hrow[t]), mrow[t]
        if not math.isfinite(d):
            return STATUS_DIVERGENCE
        if not math.isfinite(h):
            return STATUS_ENTROPY
        if m != 0 and m != 1:
            return STATUS_MASK
        if m != 0:
            if count == 0:
                d_low = d_high = d
                h_low = h_high = h
            if _below(d, d_low):
                d_low = d
            if _below(d_high, d):
                d_high = d
            if _below(h, h_low):
                h_low = h
            if _below(h_high, h):
                h_high = h
            count += 1
            end = t + 1
    # Step 3: n = (d - offset) / scale, each mode's formula (x - 0.0 == x, x / 1.0 == x).
    if normalize == MINMAX:
        offset, scale = d_low, d_high - d_low
        d_zero = scale < RANGE_EPS
    elif normalize == MAX:
        offset, scale = 0.0, d_high
        d_zero = scale < RANGE_EPS
    else:
        offset, scale = 0.0, 1.0
        d_zero = False
    h_span = h_high - h_low
    h_zero = h_span < RANGE_EPS
    # Step 6: the row's sign; advantages are written with factor A (after the mean when
    # mean_preserving), weights with factor 1.
    a = np.float64(advantage)
    sign = (1 if a > 0 else (-1 if a < 0 else 0)) if sign_aware else 1
    onsets = output == OUTPUT_ONSETS
    factor = a if output == OUTPUT_ADVANTAGES and not mean_preserving else 1.0
    windowed = segmentation == ENTROPY_WINDOW
    history = np.empty(count if windowed else 0, np.float64)  # the policy entropies, in order
    # Pass 2: steps 3-7 per token. A segment is open (``inside``) from its onset ``s`` (score
    # ``carried``, termination threshold ``lambda_h * H_s``) to its last token inclusive.
    inside = False
    s = -1
    carried = threshold = total = 0.0
    policy = 0  # policy tokens so far
    seen = 0  # entropy_window: policy tokens after the onset, at most window
    for t in range(end):
        if mrow[t] == 0:
            if onsets:
                orow[t] = -1
            else:
                frow[t] = 0.0
            continue
        h = np.float64(hrow[t])
        n = 0.0 if d_zero else (np.float64(drow[t]) - offset) / scale
        if windowed:
            history[policy] = h
        policy += 1
        if inside and segmentation == KL_ONLY and n > lambda_kl:
            inside = False  # kl_only: only a spike ends a segment, and it opens the next one
        if inside:  # the token belongs to the open segment, which may end with it
            u = carried
            if windowed:  # the mean entropy of the last min(seen, window) tokens after s
                seen = min(seen + 1, window)
                trailing = 0.0
                for q in range(policy - seen, policy):
                    trailing += history[q]
                inside = not trailing / seen > threshold
            elif segmentation != KL_ONLY:
                inside = not h > threshold
        else:
            u = n
            if segmentation == ENTROPY_ONLY:
                opens = (0.0 if h_zero else (h - h_low) / h_span) > lambda_kl
            else:
                opens = segmentation != NO_SEGMENTS and n > lambda_kl
            if opens:
                inside = True
                s, carried, threshold, seen = t, n, lambda_h * h, 0
            else:
                s = -1
        if onsets:
            orow[t] = s
            continue
        if sign > 0:
            weight = alpha * (1.0 - u) + beta
        elif sign < 0:
            weight = alpha * u + beta
        else:
            weight = alpha * 0.5 + beta
        frow[t] = weight * factor
        total += weight
    # Outputs after the last policy token; mean_preserving's division by the row's mean weight
    # (times A for advantages), of the weights as written.
    if onsets:
        orow[end:] = -1
        return STATUS_OK
    frow[end:] = 0.0
    if mean_preserving and count > 0:
        mean_weight = total / count
        if abs(mean_weight) <= 1e-12:
            mean_weight = 1.0  # all weights ~0: nothing to preserve, and never divide by ~0
        scale_a = a if output == OUTPUT_ADVANTAGES else 1.0
        for t in range(end):
            if mrow[t] != 0:
                frow[t] = (np.float64(frow[t]) / mean_weight) * scale_a
    return STATUS_OK
