"""GEAR's segmentation scan (arXiv 2605.11853, Sec. 3.2; docs/design.md steps 3-7), two ways.

- :func:`scan_reference`: the scan of docs/design.md step 4 in plain Python, one row at a time.
  It is the specification the tests hold the kernel to.
- :func:`gear_kernel`: the whole per-row pipeline (validate, normalise, scan, score, sign-aware
  weight, rescale) compiled with numba, parallel over pairs of rows.

How the kernel works (``benchmarks/credit_speed.py`` measures it in elementwise passes):

1. One vectorised pass over a row checks every value (finite divergence and entropy, mask 0/1)
   and takes the min/max of divergence and entropy over policy tokens, the policy count and the
   position after the last policy token (``end``). Min and max are taken on order-preserving
   integer keys of the floats (:func:`_narrow_key`: int32 for float32 rows, since AVX2 has no
   64-bit integer min/max), which vectorise without fast-math and are exact. Tokens from
   ``end`` on are padding: their outputs are written as 0 / -1 directly.
2. Every mode but ``entropy_window`` then runs in blocks of :data:`BLOCK` tokens:

   a. *prepare* (vectorised): ``n_t`` in float64 as before, the onset test, and integer keys of
      ``H_t`` and of the threshold ``lambda_h * H_t``, so that the scan compares integers;
   b. *scan*: the segment state is one integer, ``T``: the key of the open segment's threshold,
      or ``NONE`` outside segments. Per token ``T' = key(lambda_h H_t) if T == NONE and t opens
      else NONE if key(H_t) > T else T``, and the token's score is the carried onset score if a
      segment was open before it, else its own ``n_t``: three selects, emitted as selects the
      compiler may not turn into branches (:func:`_select`), so the cost does not depend on how
      often segments open or close. Non-policy tokens carry the key ``NONE`` (below every other
      key) and so neither open nor close a segment. The two rows of a pair are scanned in one
      loop: with two independent dependency chains in flight the scan runs about 1.8x faster;
   c. *weights* (vectorised): ``W_t`` from the token's score and the row's sign.
3. ``entropy_window`` keeps a per-segment scan (its termination needs the running mean of the
   first ``window - 1`` tokens after the onset, a division per token that would otherwise sit on
   the scan's dependency chain), over each run of consecutive policy tokens, with the
   full-window means of every token computed first, vectorised.

Both compute the normalised divergence as ``(float64(d) - float64(min)) / float64(max - min)``
and compare in float64 (the kernel's integer keys order exactly as the float64 values do), so
their onsets are identical, not merely close; the kernel's outputs are bit-identical to the
previous, row-at-a-time kernel's. What kept the compiled code slow before, and is avoided
here: Python conditional expressions around a division in a hot loop (numba lowers them as
branches, which stopped vectorisation: about 10x slower for the prepare step); selects LLVM
turned into branches (the previous "branch-free" scan compiled to jumps); and a loop taking
many array views, whose data pointers LLVM reloaded from the stack at every token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from llvmlite import ir  # type: ignore[import-untyped]
from numba import types
from numba.extending import intrinsic

from gear_rl.credit.config import GEARConfig

# Integer codes the kernel takes (numba compiles plain ints better than strings).
SEGMENTATION_CODES = {"none": 0, "kl_entropy": 1, "kl_only": 2, "entropy_only": 3,
                      "entropy_window": 4}
NORMALIZE_CODES = {"minmax": 0, "max": 1, "none": 2}
OUTPUT_ADVANTAGES, OUTPUT_ONSETS, OUTPUT_WEIGHTS = 0, 1, 2
# Per-row status codes the kernel reports; the caller turns them into ValueErrors.
STATUS_OK, STATUS_DIVERGENCE, STATUS_ENTROPY, STATUS_MASK = 0, 1, 2, 3
RANGE_EPS = 1e-8  # docs/design.md step 3: a range below this normalises to 0
BLOCK = 1024  # tokens per block of the kl-family scan: its buffers (4 x 8 KiB) stay in L1
NONE = np.int64(-(2**63))  # scan state "outside a segment"; below the key of every number


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
# Compiled kernel. Helpers first: LLVM-level primitives numba has no spelling for.
# ---------------------------------------------------------------------------------------------
def _llvm(typer: Callable[..., Any]) -> Any:
    """``numba.extending.intrinsic``, typed ``Any`` for mypy (the typer's first parameter, the
    typing context, is not an argument of the compiled call)."""
    return intrinsic(typer)


@_llvm
def _select(typingctx, cond, a, b):  # pragma: no cover - compiled
    """``a if cond else b`` as one LLVM ``select`` marked ``!unpredictable``.

    Both values are computed. The mark keeps LLVM from turning the select back into a branch
    (which it does for the scan's selects otherwise: their condition depends on the previous
    token, and a mispredicted branch per segment boundary is what made dense rows slow)."""
    if not isinstance(cond, types.Boolean) or a != b:
        return None

    def codegen(context, builder, signature, args):
        inst = builder.select(*args)
        inst.set_metadata("unpredictable", builder.module.add_metadata([]))
        return inst
    return a(cond, a, b), codegen


def _flip_negative(builder: Any, bits: Any) -> Any:
    """LLVM IR: an integer's bits with the magnitude bits flipped when the sign bit is set,
    the map between a float's bits and its order key (it is its own inverse)."""
    width = bits.type.width
    ity = ir.IntType(width)
    flip = builder.lshr(builder.ashr(bits, ir.Constant(ity, width - 1)), ir.Constant(ity, 1))
    return builder.xor(bits, flip)


def _key_type(width: int) -> Any:
    """The integer type of :func:`_narrow_key` for a float of ``width`` bits."""
    return types.int32 if width == 32 else types.int64


@_llvm
def _order_key(typingctx, x):  # pragma: no cover - compiled
    """int64 key of a float32/float64 ``x``: ``key(x) < key(y)`` exactly when ``x < y``, for
    any non-NaN ``x, y`` except that -0.0 orders below 0.0 (add 0.0 first where they must tie).
    The float's bits with the magnitude bits flipped when negative, sign-extended to 64 bits."""
    if x not in (types.float32, types.float64):
        return None
    width = x.bitwidth

    def codegen(context, builder, signature, args):
        key = _flip_negative(builder, builder.bitcast(args[0], ir.IntType(width)))
        return builder.sext(key, ir.IntType(64)) if width < 64 else key
    return types.int64(x), codegen


@_llvm
def _narrow_key(typingctx, x):  # pragma: no cover - compiled
    """:func:`_order_key` in the float's own width: int32 for a float32 (eight to an AVX2
    register, with native min/max: AVX2 has no 64-bit integer min/max), int64 for a float64."""
    if x not in (types.float32, types.float64):
        return None
    width = x.bitwidth

    def codegen(context, builder, signature, args):
        return _flip_negative(builder, builder.bitcast(args[0], ir.IntType(width)))
    return _key_type(width)(x), codegen


@_llvm
def _key_limit(typingctx, row, top):  # pragma: no cover - compiled
    """The largest (``top``, a compile-time bool) or smallest key of :func:`_narrow_key`'s
    type for the float array ``row`` (the start of a min or max over its keys)."""
    if (not isinstance(row, types.Array) or row.dtype not in (types.float32, types.float64)
            or not isinstance(top, types.BooleanLiteral)):
        return None
    width = row.dtype.bitwidth
    value = 2 ** (width - 1) - 1 if top.literal_value else -(2 ** (width - 1))

    def codegen(context, builder, signature, args):
        return ir.Constant(ir.IntType(width), value)
    return _key_type(width)(row, top), codegen


@_llvm
def _key_value(typingctx, key, like):  # pragma: no cover - compiled
    """The number (as float64) whose :func:`_order_key` (or :func:`_narrow_key`) is ``key``;
    ``like`` is any value of the float type the key was made from."""
    if key not in (types.int32, types.int64) or like not in (types.float32, types.float64):
        return None
    if key.bitwidth < like.bitwidth:
        return None
    width = like.bitwidth

    def codegen(context, builder, signature, args):
        k = builder.trunc(args[0], ir.IntType(width)) if width < key.bitwidth else args[0]
        value = builder.bitcast(_flip_negative(builder, k), context.get_value_type(like))
        return builder.fpext(value, ir.DoubleType()) if width < 64 else value
    return types.float64(key, like), codegen


@_llvm
def _bits(typingctx, x):  # pragma: no cover - compiled
    """The bits of a float64 as an int64 (so that the scan selects scores as integers)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(x), codegen


@_llvm
def _from_bits(typingctx, k):  # pragma: no cover - compiled
    """Inverse of :func:`_bits`."""
    if k != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(k), codegen


@numba.njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def gear_kernel(divergence, entropy, mask, advantages, segmentation, normalize, lambda_kl,
                lambda_h, alpha, beta, window, sign_aware, mean_preserving, output, out_float,
                out_onsets, status):  # pragma: no cover - compiled; held to the reference by tests
    """GEAR over rows (numba), two rows per parallel iteration (their scans interleave).
    Arrays: ``divergence``, ``entropy``, ``mask`` ``[B, T]``; ``advantages`` ``[B]``;
    ``out_float`` ``[B, T]`` (advantages or weights) or a dummy; ``out_onsets`` ``[B, T]``
    int64 or a dummy; ``status`` ``[B]`` int8, written per row."""
    num_rows = divergence.shape[0]
    for pair in numba.prange((num_rows + 1) // 2):
        first = 2 * pair
        second = min(first + 1, num_rows - 1)  # == first: an odd last row, alone
        _gear_pair(first, second, divergence, entropy, mask, advantages, segmentation,
                   normalize, lambda_kl, lambda_h, alpha, beta, window, sign_aware,
                   mean_preserving, output, out_float, out_onsets, status)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _row_stats(drow, hrow, mrow):  # pragma: no cover - compiled
    """Pass 1 over a row, branch-free (it vectorises): whether it holds a bad value (NaN/inf or
    a mask value other than 0/1), the order keys of the min and max divergence and entropy over
    policy tokens, the policy count and one past the last policy token."""
    d_big, d_small = _key_limit(drow, True), _key_limit(drow, False)
    h_big, h_small = _key_limit(hrow, True), _key_limit(hrow, False)
    bad = False
    d_low, d_high, h_low, h_high = d_big, d_small, h_big, h_small
    count = 0
    end = 0
    for t in range(mrow.shape[0]):
        m = mrow[t]
        d = drow[t]
        h = hrow[t]
        # abs(x) < inf is False exactly for inf and NaN
        bad |= (not (abs(d) < np.inf)) | (not (abs(h) < np.inf)) | ((m != 0) & (m != 1))
        policy = m != 0
        d_key = _narrow_key(d)
        h_key = _narrow_key(h)
        d_low = min(d_low, d_key if policy else d_big)
        d_high = max(d_high, d_key if policy else d_small)
        h_low = min(h_low, h_key if policy else h_big)
        h_high = max(h_high, h_key if policy else h_small)
        count += policy
        end = max(end, t + 1 if policy else 0)
    return bad, d_low, d_high, h_low, h_high, count, end


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _row_status(drow, hrow, mrow):  # pragma: no cover - compiled
    """The status of a row known to hold a bad value: the first bad token decides, divergence
    before entropy before mask (the slow path)."""
    for t in range(mrow.shape[0]):
        m = mrow[t]
        if not math.isfinite(drow[t]):
            return STATUS_DIVERGENCE
        if not math.isfinite(hrow[t]):
            return STATUS_ENTROPY
        if m != 0 and m != 1:
            return STATUS_MASK
    return STATUS_OK


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _row_setup(drow, hrow, mrow, advantage, normalize, sign_aware, mean_preserving,
               output):  # pragma: no cover - compiled
    """Pass 1 and the row's constants: ``(status, count, end, a, row)`` with
    ``row = (d_zero, offset, scale, h_zero, h_low, h_span, sign, factor)``."""
    bad, d_low_key, d_high_key, h_low_key, h_high_key, count, end = _row_stats(drow, hrow, mrow)
    status = _row_status(drow, hrow, mrow) if bad else STATUS_OK
    # step 3: min/max over policy tokens, exact (an empty row gives unused values: it is all 0)
    d_low = _key_value(d_low_key, drow[0]) if drow.shape[0] else 0.0
    d_high = _key_value(d_high_key, drow[0]) if drow.shape[0] else 0.0
    h_low = _key_value(h_low_key, hrow[0]) if hrow.shape[0] else 0.0
    h_high = _key_value(h_high_key, hrow[0]) if hrow.shape[0] else 0.0
    d_span = d_high - d_low
    d_zero = count == 0 or (normalize == 0 and d_span < RANGE_EPS) or (
        normalize == 1 and d_high < RANGE_EPS)
    # n = (d - offset) / scale is bit-identical to each mode's formula (x - 0.0 == x, x / 1.0 == x)
    if normalize == 0:
        offset, scale = d_low, d_span
    elif normalize == 1:
        offset, scale = 0.0, d_high
    else:
        offset, scale = 0.0, 1.0
    h_span = h_high - h_low
    h_zero = count == 0 or h_span < RANGE_EPS
    # the selects below compute both sides: keep the unused quotients finite
    if d_zero:
        scale = 1.0
    if h_zero:
        h_span = 1.0
    a = np.float64(advantage)
    if sign_aware:
        sign = 1 if a > 0 else (-1 if a < 0 else 0)
    else:
        sign = 1
    # weights (and mean-preserving rows, scaled by A after the mean: _finish_row) are written
    # with factor 1; plain advantages with factor A
    factor = a if output == OUTPUT_ADVANTAGES and not mean_preserving else 1.0
    return status, count, end, a, (d_zero, offset, scale, h_zero, h_low, h_span, sign, factor)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _gear_pair(first, second, divergence, entropy, mask, advantages, segmentation, normalize,
               lambda_kl, lambda_h, alpha, beta, window, sign_aware, mean_preserving, output,
               out_float, out_onsets, status):  # pragma: no cover - compiled
    """Rows ``first`` and ``second`` (the same row when it is alone). A row holding a bad value
    gets its status and no output (the caller raises)."""
    onsets = output == OUTPUT_ONSETS
    d0, h0, m0 = divergence[first], entropy[first], mask[first]
    d1, h1, m1 = divergence[second], entropy[second], mask[second]
    f0 = out_float[0] if onsets else out_float[first]
    f1 = out_float[0] if onsets else out_float[second]
    o0 = out_onsets[first] if onsets else out_onsets[0]
    o1 = out_onsets[second] if onsets else out_onsets[0]
    status0, count0, end0, a0, row0 = _row_setup(d0, h0, m0, advantages[first], normalize,
                                                 sign_aware, mean_preserving, output)
    status1, count1, end1, a1, row1 = _row_setup(d1, h1, m1, advantages[second], normalize,
                                                 sign_aware, mean_preserving, output)
    status[first] = status0
    status[second] = status1
    live0 = status0 == STATUS_OK
    live1 = status1 == STATUS_OK and second != first
    if segmentation == 4:
        if live0:
            sum0 = _window_row(d0, h0, m0, end0, count0, row0, lambda_kl, lambda_h, window, alpha,
                               beta, onsets, mean_preserving, f0, o0)
            _finish_row(m0, end0, count0, a0, sum0, output, mean_preserving, f0, o0)
        if live1:
            sum1 = _window_row(d1, h1, m1, end1, count1, row1, lambda_kl, lambda_h, window, alpha,
                               beta, onsets, mean_preserving, f1, o1)
            _finish_row(m1, end1, count1, a1, sum1, output, mean_preserving, f1, o1)
        return
    end0 = end0 if live0 else 0
    end1 = end1 if live1 else 0
    if segmentation == 1:  # kl_entropy, the default: a constant, so its branches fold
        sum0, sum1 = _blocks_pair(d0, h0, m0, end0, row0, f0, o0, d1, h1, m1, end1, row1, f1,
                                  o1, 1, lambda_kl, lambda_h, alpha, beta, onsets,
                                  mean_preserving)
    else:
        sum0, sum1 = _blocks_pair(d0, h0, m0, end0, row0, f0, o0, d1, h1, m1, end1, row1, f1,
                                  o1, segmentation, lambda_kl, lambda_h, alpha, beta, onsets,
                                  mean_preserving)
    if live0:
        _finish_row(m0, end0, count0, a0, sum0, output, mean_preserving, f0, o0)
    if live1:
        _finish_row(m1, end1, count1, a1, sum1, output, mean_preserving, f1, o1)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _finish_row(mrow, end, count, a, weight_sum, output, mean_preserving, frow,
                orow):  # pragma: no cover - compiled
    """Outputs from ``end`` on (0, or -1 for onsets), then ``mean_preserving``'s division by the
    row's mean weight (times ``A`` for advantages)."""
    if output == OUTPUT_ONSETS:
        orow[end:] = -1
        return
    frow[end:] = 0.0
    if mean_preserving:
        mean_weight = weight_sum / count if count > 0 else 1.0
        if abs(mean_weight) <= 1e-12:
            mean_weight = 1.0  # all weights ~0: nothing to preserve, and never divide by ~0
        scale_a = a if output == OUTPUT_ADVANTAGES else 1.0
        for t in range(end):
            if mrow[t] != 0:
                frow[t] = (np.float64(frow[t]) / mean_weight) * scale_a


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _blocks_pair(d0, h0, m0, end0, row0, f0, o0, d1, h1, m1, end1, row1, f1, o1, segmentation,
                 lambda_kl, lambda_h, alpha, beta, onsets,
                 mean_preserving):  # pragma: no cover - compiled
    """Every mode but ``entropy_window`` on ``[0, end)`` of two rows, block by block (a row
    with ``end == 0`` is skipped); returns the rows' sums of policy weights in token order
    (when ``mean_preserving``). Where both rows have tokens in a block, their scans run
    interleaved in one loop: two independent dependency chains keep the core busy."""
    can_open = segmentation != 0
    reopen = segmentation == 2  # kl_only: a spike inside a segment opens the next one
    can_close = segmentation != 2
    entropy_signal = segmentation == 3
    n_bits = np.empty(2 * BLOCK, np.int64)  # row 0 in [0, BLOCK), row 1 in [BLOCK, 2 BLOCK)
    h_keys = np.empty(2 * BLOCK, np.int64)
    open_keys = np.empty(2 * BLOCK, np.int64)
    out_bits = np.empty(2 * BLOCK, np.int64)
    n0, n1 = n_bits[:BLOCK], n_bits[BLOCK:]
    k0, k1 = h_keys[:BLOCK], h_keys[BLOCK:]
    c0, c1 = open_keys[:BLOCK], open_keys[BLOCK:]
    u0, u1 = out_bits[:BLOCK], out_bits[BLOCK:]
    state0 = state1 = NONE
    carried0 = carried1 = np.int64(0)  # an open segment's onset score bits (or onset index)
    sum0 = sum1 = 0.0
    for start in range(0, max(end0, end1), BLOCK):
        size0 = max(0, min(BLOCK, end0 - start))
        size1 = max(0, min(BLOCK, end1 - start))
        if size0:
            _prepare(d0[start:start + size0], h0[start:start + size0], m0[start:start + size0],
                     n0, k0, c0, row0, entropy_signal, can_open, can_close, lambda_kl, lambda_h)
        if size1:
            _prepare(d1[start:start + size1], h1[start:start + size1], m1[start:start + size1],
                     n1, k1, c1, row1, entropy_signal, can_open, can_close, lambda_kl, lambda_h)
        both = min(size0, size1)
        if reopen:
            if onsets:
                state0, carried0 = _scan_onsets_reopen(size0, start, c0, u0, state0, carried0)
                state1, carried1 = _scan_onsets_reopen(size1, start, c1, u1, state1, carried1)
            else:
                state0, carried0 = _scan_scores_reopen(size0, c0, n0, u0, state0, carried0)
                state1, carried1 = _scan_scores_reopen(size1, c1, n1, u1, state1, carried1)
        elif can_open and onsets:
            state0, carried0, state1, carried1 = _scan_onsets_pair(
                both, start, h_keys, open_keys, out_bits, state0, carried0, state1, carried1)
            state0, carried0 = _scan_onsets(size0 - both, start + both, k0[both:], c0[both:],
                                            u0[both:], state0, carried0)
            state1, carried1 = _scan_onsets(size1 - both, start + both, k1[both:], c1[both:],
                                            u1[both:], state1, carried1)
        elif can_open:
            state0, carried0, state1, carried1 = _scan_scores_pair(
                both, h_keys, open_keys, n_bits, out_bits, state0, carried0, state1, carried1)
            state0, carried0 = _scan_scores(size0 - both, k0[both:], c0[both:], n0[both:],
                                            u0[both:], state0, carried0)
            state1, carried1 = _scan_scores(size1 - both, k1[both:], c1[both:], n1[both:],
                                            u1[both:], state1, carried1)
        elif onsets:
            out_bits[:] = -1
        if onsets:
            if size0:
                _onsets_out(u0, m0[start:start + size0], o0[start:start + size0])
            if size1:
                _onsets_out(u1, m1[start:start + size1], o1[start:start + size1])
            continue
        scores0 = u0 if can_open else n0  # no segments: u_t = n_t
        scores1 = u1 if can_open else n1
        if size0:
            sum0 = _weights(scores0, m0[start:start + size0], row0, alpha, beta,
                            mean_preserving, f0[start:start + size0], sum0)
        if size1:
            sum1 = _weights(scores1, m1[start:start + size1], row1, alpha, beta,
                            mean_preserving, f1[start:start + size1], sum1)
    return sum0, sum1


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _prepare(dblk, hblk, mblk, n_bits, h_keys, open_keys, row, entropy_signal, can_open,
             can_close, lambda_kl, lambda_h):  # pragma: no cover - compiled
    """Per token of a block (vectorised): the bits of ``n_t``; the key of ``H_t`` (``NONE`` at
    non-policy tokens); at tokens that open a segment when outside one, the key of the
    threshold ``lambda_h * H_t`` (+inf where segments never close), elsewhere ``NONE``."""
    d_zero, offset, scale, h_zero, h_low, h_span, _, _ = row
    slope = lambda_h if can_close else 0.0
    shift = 0.0 if can_close else np.inf  # 0.0 also turns -0.0 into 0.0, so zeros tie
    if entropy_signal:
        for i in range(dblk.shape[0]):
            policy = mblk[i] != 0
            h = np.float64(hblk[i])
            n = _select(d_zero, 0.0, (np.float64(dblk[i]) - offset) / scale)
            h_norm = _select(h_zero, 0.0, (h - h_low) / h_span)
            n_bits[i] = _bits(n)
            h_keys[i] = _select(policy, _order_key(h + 0.0), NONE)
            open_keys[i] = _select(policy & (h_norm > lambda_kl),
                                   _order_key(slope * h + shift), NONE)
    else:
        for i in range(dblk.shape[0]):
            policy = mblk[i] != 0
            h = np.float64(hblk[i])
            n = _select(d_zero, 0.0, (np.float64(dblk[i]) - offset) / scale)
            n_bits[i] = _bits(n)
            h_keys[i] = _select(policy, _order_key(h + 0.0), NONE)
            open_keys[i] = _select(policy & can_open & (n > lambda_kl),
                                   _order_key(slope * h + shift), NONE)


# The scans. The state is the open segment's threshold key, or NONE outside segments; what
# they carry is the open segment's onset score bits (a token's score u_t, written per token) or
# its onset index. A token's output is the carried value if a segment was open before it, else
# its own (n_t, or t if it opens a segment, -1 if not): the carried value after the token is
# that same output. Each variant is written out so that its loop holds only its own selects.
@numba.njit(cache=True, nogil=True, error_model="numpy")
def _scan_scores(size, h_keys, open_keys, n_bits, out_bits, state,
                 carried):  # pragma: no cover - compiled
    """Segment scan over a block; ``out_bits`` gets each token's score ``u_t`` (as bits)."""
    for i in range(size):
        outside = state == NONE
        carried = _select(outside, n_bits[i], carried)
        out_bits[i] = carried
        kept = _select(h_keys[i] > state, NONE, state)  # NONE stays NONE
        state = _select(outside, open_keys[i], kept)
    return state, carried


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _scan_scores_pair(size, h_keys, open_keys, n_bits, out_bits, state0, carried0, state1,
                      carried1):  # pragma: no cover - compiled
    """:func:`_scan_scores` on two rows at once, row 0 at ``[0, size)`` of the buffers and row 1
    at ``[BLOCK, BLOCK + size)`` (two chains in flight: about 1.8x faster than one after the
    other; one buffer per array, not a view per row: with eight array arguments LLVM reloaded
    their data pointers at every token)."""
    for i in range(size):
        j = BLOCK + i
        outside0 = state0 == NONE
        carried0 = _select(outside0, n_bits[i], carried0)
        out_bits[i] = carried0
        kept0 = _select(h_keys[i] > state0, NONE, state0)
        state0 = _select(outside0, open_keys[i], kept0)
        outside1 = state1 == NONE
        carried1 = _select(outside1, n_bits[j], carried1)
        out_bits[j] = carried1
        kept1 = _select(h_keys[j] > state1, NONE, state1)
        state1 = _select(outside1, open_keys[j], kept1)
    return state0, carried0, state1, carried1


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _scan_scores_reopen(size, open_keys, n_bits, out_bits, state,
                        carried):  # pragma: no cover - compiled
    """kl_only's scan: every spike opens a segment, nothing closes one."""
    for i in range(size):
        opener = open_keys[i]
        opens = opener != NONE
        carried = _select((state == NONE) | opens, n_bits[i], carried)
        out_bits[i] = carried
        state = _select(opens, opener, state)
    return state, carried


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _scan_onsets(size, start, h_keys, open_keys, out_bits, state,
                 onset):  # pragma: no cover - compiled
    """Segment scan over a block; ``out_bits`` gets each token's onset index or -1."""
    for i in range(size):
        outside = state == NONE
        own = _select(open_keys[i] != NONE, np.int64(start + i), np.int64(-1))
        onset = _select(outside, own, onset)
        out_bits[i] = onset
        kept = _select(h_keys[i] > state, NONE, state)
        state = _select(outside, open_keys[i], kept)
    return state, onset


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _scan_onsets_pair(size, start, h_keys, open_keys, out_bits, state0, onset0, state1,
                      onset1):  # pragma: no cover - compiled
    """:func:`_scan_onsets` on two rows at once (buffers as in :func:`_scan_scores_pair`)."""
    for i in range(size):
        j = BLOCK + i
        t = np.int64(start + i)
        outside0 = state0 == NONE
        onset0 = _select(outside0, _select(open_keys[i] != NONE, t, np.int64(-1)), onset0)
        out_bits[i] = onset0
        kept0 = _select(h_keys[i] > state0, NONE, state0)
        state0 = _select(outside0, open_keys[i], kept0)
        outside1 = state1 == NONE
        onset1 = _select(outside1, _select(open_keys[j] != NONE, t, np.int64(-1)), onset1)
        out_bits[j] = onset1
        kept1 = _select(h_keys[j] > state1, NONE, state1)
        state1 = _select(outside1, open_keys[j], kept1)
    return state0, onset0, state1, onset1


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _scan_onsets_reopen(size, start, open_keys, out_bits, state,
                        onset):  # pragma: no cover - compiled
    """kl_only's scan, onset indices."""
    for i in range(size):
        opener = open_keys[i]
        opens = opener != NONE
        onset = _select(opens, np.int64(start + i), _select(state == NONE, np.int64(-1), onset))
        out_bits[i] = onset
        state = _select(opens, opener, state)
    return state, onset


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _weights(score_bits, mblk, row, alpha, beta, mean_preserving, oblk,
             total):  # pragma: no cover - compiled
    """Steps 6-7 on a block (vectorised): ``oblk = W * factor`` at policy tokens, 0 elsewhere.
    If ``mean_preserving``, returns ``total`` plus ``W`` of each policy token, added in token
    order (the running sum of the row, so blocks do not change its rounding)."""
    sign, factor = row[6], row[7]
    size = oblk.shape[0]
    if sign > 0:
        for i in range(size):
            weight = alpha * (1.0 - _from_bits(score_bits[i])) + beta
            oblk[i] = _select(mblk[i] != 0, weight * factor, 0.0)
    elif sign < 0:
        for i in range(size):
            weight = alpha * _from_bits(score_bits[i]) + beta
            oblk[i] = _select(mblk[i] != 0, weight * factor, 0.0)
    else:
        weight = alpha * 0.5 + beta
        for i in range(size):
            oblk[i] = _select(mblk[i] != 0, weight * factor, 0.0)
    if mean_preserving:  # an ordered sum (a separate loop: it does not vectorise)
        if sign > 0:
            for i in range(size):
                weight = alpha * (1.0 - _from_bits(score_bits[i])) + beta
                total += _select(mblk[i] != 0, weight, 0.0)
        elif sign < 0:
            for i in range(size):
                weight = alpha * _from_bits(score_bits[i]) + beta
                total += _select(mblk[i] != 0, weight, 0.0)
        else:
            weight = alpha * 0.5 + beta
            for i in range(size):
                total += _select(mblk[i] != 0, weight, 0.0)
    return total


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _onsets_out(onset_bits, mblk, oblk):  # pragma: no cover - compiled
    for i in range(oblk.shape[0]):
        oblk[i] = _select(mblk[i] != 0, onset_bits[i], np.int64(-1))


# ---------------------------------------------------------------------------------------------
# entropy_window
# ---------------------------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, error_model="numpy")
def _window_row(drow, hrow, mrow, end, count, row, lambda_kl, lambda_h, window, alpha, beta,
                onsets, mean_preserving, frow, orow):  # pragma: no cover - compiled
    """``entropy_window`` on ``[0, end)``: a segment ends at the first token where the mean
    entropy of the last ``k = min(seen, window)`` policy tokens after the onset exceeds
    ``lambda_h * H_onset``. While ``k < window`` that mean is a running sum since the onset
    (summed oldest first, like the reference); after, it is the full-window mean, which does
    not depend on the scan and is computed beforehand for every token of a run of policy
    tokens (:func:`_window_means`). Returns the sum of the policy weights in token order."""
    d_zero, offset, scale = row[0], row[1], row[2]
    size = max(end, 1)
    n_bits = np.empty(size, np.int64)
    opens_at = np.empty(size, np.bool_)
    out_bits = np.empty(size, np.int64)
    for t in range(end):
        n = _select(d_zero, 0.0, (np.float64(drow[t]) - offset) / scale)
        n_bits[t] = _bits(n)
        opens_at[t] = (mrow[t] != 0) & (n > lambda_kl)
    history = np.empty(window - 1 + end + 8, np.float64)  # carry, the run, slack
    history[:window - 1] = 0.0
    history[window - 1 + end:] = 0.0
    means = np.empty(size, np.float64)
    inside = False
    threshold = 0.0
    mark = np.int64(0)  # the segment's onset score bits (or onset index)
    seen = 0  # policy tokens after the onset, saturating at window
    running = 0.0  # their entropy, summed oldest first, while seen < window
    t = 0
    while t < end:  # runs of consecutive policy tokens [a, b); the state carries across gaps
        if count == end:  # every token before end is a policy token: one run
            a = t
            b = t = end
        else:
            while t < end and mrow[t] == 0:
                t += 1
            a = t
            while t < end and mrow[t] != 0:
                t += 1
            b = t
        _window_means(hrow[a:b], history, means, window)
        i = a
        while i < b:
            if not inside:
                while i < b and not opens_at[i]:
                    out_bits[i] = -1 if onsets else n_bits[i]
                    i += 1
                if i == b:
                    break
                threshold = lambda_h * np.float64(hrow[i])
                mark = np.int64(i) if onsets else n_bits[i]
                out_bits[i] = mark
                inside = True
                seen = 0
                running = 0.0
                i += 1
                continue
            while i < b and seen < window - 1:  # k = seen < window: the running mean
                seen += 1
                running += np.float64(hrow[i])
                out_bits[i] = mark
                i += 1
                if running / np.float64(seen) > threshold:
                    inside = False
                    break
            if not inside:
                continue
            while i < b:  # k = window: the full-window mean
                seen = window
                out_bits[i] = mark
                i += 1
                if means[i - 1 - a] > threshold:
                    inside = False
                    break
    if onsets:
        _onsets_out(out_bits, mrow[:end], orow[:end])
        return 0.0
    return _weights(out_bits, mrow[:end], row, alpha, beta, mean_preserving, frow[:end], 0.0)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _window_means(hrun, history, means, window):  # pragma: no cover - compiled
    """:func:`_window_sums`, with the window a compile-time constant when it is the default
    (8): LLVM then unrolls its offsets and drops the selects of the missing ones. With the
    window a runtime value the same sums cost about 1.3 elementwise passes more on an AVX2
    EPYC (``benchmarks/credit_speed.py``, docs/speed.md); the values are the same."""
    if window == 8:
        _window_sums(hrun, history, means, 8)
    else:
        _window_sums(hrun, history, means, window)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _window_sums(hrun, history, means, window):  # pragma: no cover - compiled
    """``means[i]``: the mean of the ``window`` policy entropies ending at token ``i`` of a run,
    summed oldest first. ``history[:window - 1]`` holds the ``window - 1`` policy entropies
    before the run (zeros at the row's start, never read there: the scan uses a mean only once
    ``window`` tokens follow the onset) and is refilled for the next run; ``history`` has 8
    slots of slack at the end. Vectorised: eight offsets per pass, each term an ordered float64
    add (a missing offset adds 0.0, which changes a sum at most in the sign of a zero: the
    means are only compared)."""
    size = hrun.shape[0]
    lead = window - 1
    for i in range(size):
        history[lead + i] = np.float64(hrun[i])
    for o in range(0, window, 8):
        first = o == 0
        has1, has2, has3 = o + 1 < window, o + 2 < window, o + 3 < window
        has4, has5, has6, has7 = o + 4 < window, o + 5 < window, o + 6 < window, o + 7 < window
        for i in range(size):  # one array read at eight offsets: one alias check, vectorises
            k = o + i
            total = _select(first, 0.0, means[i]) + history[k]
            total = total + _select(has1, history[k + 1], 0.0)
            total = total + _select(has2, history[k + 2], 0.0)
            total = total + _select(has3, history[k + 3], 0.0)
            total = total + _select(has4, history[k + 4], 0.0)
            total = total + _select(has5, history[k + 5], 0.0)
            total = total + _select(has6, history[k + 6], 0.0)
            total = total + _select(has7, history[k + 7], 0.0)
            means[i] = total
    window_size = np.float64(window)
    if window & (window - 1) == 0:
        inverse = 1.0 / window_size  # exact: x * 2**-j and x / 2**j round the same number
        for i in range(size):
            means[i] = means[i] * inverse
    else:
        for i in range(size):
            means[i] = means[i] / window_size
    for o in range(lead):
        history[o] = history[size + o]
