"""GEAR: Granularity-adaptivE Advantage Reweighting (arXiv 2605.11853, Sec. 3; Eqs. 3-8).

The paper's text lost its equations; this follows the project's resolved reading in docs/design.md,
"GEAR, as this project specifies it". Per trajectory ``i`` with GRPO advantage ``A_i``:

1. ``A_i`` from :func:`gear_rl.credit.grpo.grpo_advantages` (the estimator registry does this).
2. ``d_t``: token-wise reverse KL student -> ground-truth-conditioned teacher (``gear_rl.signals``).
3. Normalise over policy tokens: ``n_t = (d_t - min) / (max - min)``, 0 where the range < 1e-8.
4. Segment: at a policy token ``s`` with ``n_s > lambda_kl`` open a segment; it runs to the first
   later policy token ``e`` with ``H_e > lambda_h * H_s`` (inclusive), or to the last policy
   token. Resume after ``e``. Observation/padding positions are skipped, not boundaries.
5. Score: ``u_t = n_s`` inside a segment with onset ``s``; ``u_t = n_t`` elsewhere.
6. Sign-aware weight: ``w_t = 1 - u_t`` if ``A_i > 0``; ``u_t`` if ``A_i < 0``; 0.5 if 0.
7. Rescale: ``W_t = alpha * w_t + beta`` (``beta = 1 - alpha/2`` unless set);
   ``Ahat_t = W_t * A_i * mask_t``.

``gear_signed`` (``score=log_ratio``, beyond the paper, issue 16) keeps steps 1-4, 6 and 7 and
replaces step 5's score by the sampled token's signed teacher log-ratio
``r_t = log pi_T(y_t) - log pi_S(y_t)`` (the evidence RLSD, arXiv 2604.03128, weights by):
``u_t = sigmoid(-r_s)`` inside a segment with onset ``s``, ``sigmoid(-r_t)`` elsewhere. The full
reverse KL is a distance and cannot tell a token that moved toward the teacher from one that
moved away; the log-ratio can, and the segments decide how far one token's evidence reaches.

:func:`gear_advantages_reference` spells those steps out in plain torch/Python; the public
functions run the fused numba kernel of :mod:`gear_rl.credit.segments`, held to it by tests.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import cast

import numba
import numpy as np
import torch

from gear_rl.credit._validate import check_batch_size, check_mask, check_tokens, check_vector
from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.config import GEARConfig
from gear_rl.credit.grpo import outcome_advantages
from gear_rl.credit.registry import EstimatorFn, register_estimator
from gear_rl.credit.segments import (
    NORMALIZE_CODES,
    OUTPUT_ADVANTAGES,
    OUTPUT_ONSETS,
    OUTPUT_WEIGHTS,
    SEGMENTATION_CODES,
    STATUS_DIVERGENCE,
    STATUS_ENTROPY,
    STATUS_MASK,
    gear_kernel,
    normalize_reference,
    scan_reference,
)

_MASK_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float32,
                torch.float64)
_STATUS_ERRORS = {
    STATUS_DIVERGENCE: "divergence contains NaN or inf (row {row})",
    STATUS_ENTROPY: "entropy contains NaN or inf (row {row})",
    STATUS_MASK: "mask must contain only 0 and 1 (row {row} has another value)",
}


def _check_inputs(divergence: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor,
                  advantages: torch.Tensor | None, config: GEARConfig) -> None:
    """Shape/dtype checks (cheap); value checks happen inside the kernel's single pass."""
    if not isinstance(config, GEARConfig):
        raise ValueError(f"config must be a GEARConfig, got {type(config).__name__}")
    check_mask(mask, values=False)
    check_tokens("divergence", divergence, tuple(mask.shape), finite=False)
    check_tokens("entropy", entropy, tuple(mask.shape), finite=False)
    if advantages is not None:
        check_vector("advantages", advantages)
        check_batch_size("advantages", advantages, mask.shape[0])


def skip_first_tokens(divergence: torch.Tensor, mask: torch.Tensor, count: int) -> torch.Tensor:
    """``divergence`` with its first ``count`` policy tokens per row set to the minimum over the
    row's other policy tokens (``GEARConfig.skip_first``): they then neither open a segment nor
    move the normalisation. A row with no other policy token gets 0 there.

    Args:
        divergence: ``[B, T]`` per-token divergence.
        mask: ``[B, T]`` 0/1 policy-token mask.
        count: how many leading policy tokens to skip (0: ``divergence`` itself is returned).

    Returns:
        ``[B, T]`` in ``divergence``'s dtype and device.
    """
    if count == 0 or divergence.numel() == 0:
        return divergence
    on = mask.to(device=divergence.device) != 0
    early = on & (on.long().cumsum(-1) <= count)
    rest = torch.where(on & ~early, divergence, torch.inf).amin(-1, keepdim=True)
    rest = torch.where(torch.isfinite(rest), rest, 0.0).to(divergence.dtype)
    return torch.where(early, rest, divergence)


def _numpy(x: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """A contiguous CPU array of ``x`` in ``dtype`` (no copy when it already is one)."""
    return x.detach().to(device="cpu", dtype=dtype).contiguous().numpy()


@contextlib.contextmanager
def _torch_thread_budget() -> Iterator[None]:
    """Run a parallel numba region within torch's thread count, and leave that count as it was.

    numba's OpenMP layer shares the process's OpenMP runtime with torch. A parallel region
    launched with numba's default (every core) raised torch's own thread count to it for the rest
    of the process, once torch had used its pool: a ``threads=1`` run (two study cells side by
    side on two cores) computed on two threads per process after its first GEAR step."""
    threads = torch.get_num_threads()
    before = numba.get_num_threads()
    most = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    numba.set_num_threads(max(1, min(threads, most)))
    try:
        yield
    finally:
        numba.set_num_threads(before)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _run_kernel(divergence: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor,
                advantages: torch.Tensor | None, config: GEARConfig,
                output: int) -> torch.Tensor:
    """Check the inputs, move them to contiguous CPU arrays the kernel accepts, run it, and
    raise on the bad values it reports."""
    _check_inputs(divergence, entropy, mask, advantages, config)
    device = mask.device
    if config.skip_first:  # a NaN in the skipped tokens still reaches the kernel's check
        divergence = torch.where(torch.isfinite(divergence), skip_first_tokens(
            divergence, mask, config.skip_first), divergence)
    wide = torch.float64 in (divergence.dtype, entropy.dtype) or (
        advantages is not None and advantages.dtype == torch.float64)
    dtype = torch.float64 if wide else torch.float32

    div = _numpy(divergence, dtype)
    ent = _numpy(entropy, dtype)
    msk = _numpy(mask, mask.dtype if mask.dtype in _MASK_DTYPES else torch.float32)
    batch, length = div.shape
    adv = np.zeros(batch, dtype=div.dtype) if advantages is None else _numpy(advantages, dtype)
    out_float = np.empty((batch, length) if output != OUTPUT_ONSETS else (1, 1), dtype=div.dtype)
    out_onsets = np.empty((batch, length) if output == OUTPUT_ONSETS else (1, 1), dtype=np.int64)
    status = np.zeros(batch, dtype=np.int8)
    if batch and length:
        with _torch_thread_budget():
            gear_kernel(div, ent, msk, adv, SEGMENTATION_CODES[config.segmentation],
                        NORMALIZE_CODES[config.normalize], float(config.lambda_kl),
                        float(config.lambda_h), float(config.alpha), config.resolved_beta,
                        int(config.window), bool(config.sign_aware),
                        bool(config.mean_preserving), output, out_float, out_onsets, status)
        bad = np.flatnonzero(status)
        if bad.size:
            row = int(bad[0])
            raise ValueError(_STATUS_ERRORS[int(status[row])].format(row=row))
    result = torch.from_numpy(out_onsets if output == OUTPUT_ONSETS else out_float)
    return result.to(device)


def gear_advantages(
    advantages: torch.Tensor,
    divergence: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    config: GEARConfig = GEARConfig(),  # noqa: B008 - frozen dataclass, safe as a default
) -> torch.Tensor:
    """Reshape trajectory advantages into GEAR's per-token advantages.

    Args:
        advantages: ``[B]`` trajectory-level advantage ``A_i`` (e.g. from ``grpo_advantages``).
        divergence: ``[B, T]`` per-token divergence ``d_t`` student -> teacher (nats).
        entropy: ``[B, T]`` per-token student entropy ``H_t`` (nats).
        mask: ``[B, T]`` 1 for trained policy tokens, 0 for padding and observation tokens.
        config: the GEAR knobs.

    Returns:
        ``[B, T]`` ``Ahat_t = W_t * A_i * mask_t``: float32 (float64 if any input is float64),
        on ``mask``'s device; exactly 0 where ``mask == 0``; all-masked rows are all 0.

    Raises:
        ValueError: naming the argument, for wrong shapes or dtypes, NaN/inf, or mask values
        other than 0/1.
    """
    _divergence_score(config)
    return _run_kernel(divergence, entropy, mask, advantages, config, OUTPUT_ADVANTAGES)


def _divergence_score(config: GEARConfig) -> None:
    if isinstance(config, GEARConfig) and config.score != "divergence":
        raise ValueError(f"config.score={config.score!r} scores tokens by the sampled token's "
                         "log-ratio, which this function does not take: use "
                         "gear_signed_advantages (estimator gear_signed)")


def gear_segments(
    divergence: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    config: GEARConfig = GEARConfig(),  # noqa: B008 - frozen dataclass, safe as a default
) -> torch.Tensor:
    """Segment onsets (docs/design.md steps 3-4).

    Args:
        divergence, entropy, mask: ``[B, T]`` as in :func:`gear_advantages`.
        config: ``normalize``, ``segmentation``, ``lambda_kl``, ``lambda_h``, ``window`` are read.

    Returns:
        ``[B, T]`` int64: for each policy token, the index ``t`` of the onset of the segment that
        holds it; -1 outside segments and at every masked-out position.
    """
    return _run_kernel(divergence, entropy, mask, None, config, OUTPUT_ONSETS)


def gear_weights(
    advantages: torch.Tensor,
    divergence: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    config: GEARConfig = GEARConfig(),  # noqa: B008 - frozen dataclass, safe as a default
) -> torch.Tensor:
    """The per-token weights ``W_t`` (docs/design.md step 7, after ``mean_preserving`` if set).

    Only the sign of each ``advantages`` entry matters. Returns ``[B, T]``, 0 where
    ``mask == 0``; ``gear_advantages == gear_weights * advantages[:, None]``. For metrics and
    the token-credit viewer.
    """
    _divergence_score(config)
    return _run_kernel(divergence, entropy, mask, advantages, config, OUTPUT_WEIGHTS)


def gear_signed_advantages(
    advantages: torch.Tensor,
    divergence: torch.Tensor,
    entropy: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    config: GEARConfig = GEARConfig(score="log_ratio"),  # noqa: B008 - frozen dataclass
) -> torch.Tensor:
    """GEAR's segments carrying a signed score (``config.score == "log_ratio"``; module
    docstring): ``u_t = sigmoid(-r)`` of the onset's log-ratio inside a segment, the token's own
    elsewhere, then steps 6-7 (and ``mean_preserving``) as in :func:`gear_advantages`.

    Args:
        advantages: ``[B]`` trajectory advantages ``A_i``.
        divergence, entropy, mask: ``[B, T]`` as in :func:`gear_advantages` (they place the
            segments).
        log_ratio: ``[B, T]`` ``log pi_T(y_t) - log pi_S(y_t)`` of the sampled tokens (nats;
            read on policy tokens only).
        config: the GEAR knobs; ``score`` is not read (this function is the ``log_ratio``
            score).

    Returns:
        ``[B, T]`` ``W_t * A_i * mask_t`` in float32 (float64 if any input is float64), on
        ``mask``'s device; exactly 0 where ``mask == 0``.
    """
    check_tokens("log_ratio", log_ratio, tuple(mask.shape), finite=False)
    onsets = gear_segments(divergence, entropy, mask, config)  # checks the other inputs
    check_vector("advantages", advantages)
    check_batch_size("advantages", advantages, mask.shape[0])
    on = mask.to(torch.bool)
    if not bool(torch.isfinite(log_ratio[on]).all()):
        row = int((~torch.isfinite(log_ratio) & on).any(-1).nonzero()[0])
        raise ValueError(f"log_ratio contains NaN or inf on a policy token (row {row})")
    wide = torch.float64 in (divergence.dtype, entropy.dtype, log_ratio.dtype, advantages.dtype)
    dtype = torch.float64 if wide else torch.float32
    ratio = torch.where(on, log_ratio.to(mask.device, torch.float64), 0.0)
    carried = torch.where(onsets >= 0, ratio.gather(1, onsets.clamp(min=0)), ratio)  # step 5
    u = torch.sigmoid(-carried)
    a = advantages.to(mask.device, torch.float64)[:, None]
    if config.sign_aware:                                                               # step 6
        w = torch.where(a > 0, 1.0 - u, torch.where(a < 0, u, torch.full_like(u, 0.5)))
    else:
        w = 1.0 - u
    weights = torch.where(on, config.alpha * w + config.resolved_beta, 0.0)           # step 7
    if config.mean_preserving:
        count = on.sum(-1, keepdim=True)
        mean = weights.sum(-1, keepdim=True) / count.clamp(min=1)
        keep = (count == 0) | (mean.abs() <= 1e-12)
        weights = torch.where(keep, weights, weights / torch.where(keep, 1.0, mean))
    return (weights * a).to(dtype)


_PAPER = "arXiv 2605.11853"
_DIVERGENCE = {"score": "divergence"}
# The GEAR family's one registration record: the name, the config fields it pins, and its line.
# Every name runs :func:`gear` on a GEARConfig, produces segments, is row-local and
# outcome-scaled; a name that pins ``score="log_ratio"`` also reads the sampled tokens' two
# log-probs and cites RLSD, whose evidence that score is.
_GEAR_FAMILY: tuple[tuple[str, dict[str, str], str], ...] = (
    ("gear", _DIVERGENCE,
     "GEAR: divergence/entropy segments, sign-aware weights"),
    ("gear_token_kl", {**_DIVERGENCE, "segmentation": "none"},
     "GEAR ablation: token-level KL weights, no segments"),
    ("gear_kl_only", {**_DIVERGENCE, "segmentation": "kl_only"},
     "GEAR ablation: segments from KL spikes only"),
    ("gear_entropy_only", {**_DIVERGENCE, "segmentation": "entropy_only"},
     "GEAR ablation: onsets from entropy spikes"),
    ("gear_entropy_window", {**_DIVERGENCE, "segmentation": "entropy_window"},
     "GEAR ablation: termination by a trailing mean-entropy window"),
    ("gear_signed", {"score": "log_ratio"},
     "GEAR segments carrying the teacher log-ratio of their onset"),
)


def _register_gear_family(fn: EstimatorFn) -> EstimatorFn:
    """Register ``fn`` under every name of :data:`_GEAR_FAMILY`."""
    for name, fixed, description in _GEAR_FAMILY:
        signed = fixed["score"] == "log_ratio"
        needs = ("divergence", "entropy",
                 *(("student_logprobs", "teacher_logprobs") if signed else ()))
        register_estimator(name, config=GEARConfig, needs=needs, fixed=fixed, segments=True,
                           row_local=True, outcome_scaled=True,
                           paper=f"{_PAPER} + arXiv 2604.03128" if signed else _PAPER,
                           description=description)(fn)
    return fn


@_register_gear_family
def gear(batch: CreditBatch, config: GEARConfig) -> torch.Tensor:
    """GEAR's ``[B, T]`` advantages on ``batch``: its GRPO advantage reshaped by
    :func:`gear_advantages` (or :func:`gear_signed_advantages` when ``score == "log_ratio"``)."""
    # the registry's batch.require(needs) has checked that the signals it reads are set
    outcome = outcome_advantages(batch, config)
    divergence, entropy = cast(torch.Tensor, batch.divergence), cast(torch.Tensor, batch.entropy)
    if config.score == "log_ratio":
        ratio = (cast(torch.Tensor, batch.teacher_logprobs)
                 - cast(torch.Tensor, batch.student_logprobs))
        return gear_signed_advantages(outcome, divergence, entropy, ratio, batch.mask, config)
    return gear_advantages(outcome, divergence, entropy, batch.mask, config)


def gear_advantages_reference(
    advantages: torch.Tensor,
    divergence: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    config: GEARConfig = GEARConfig(),  # noqa: B008 - frozen dataclass, safe as a default
    log_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """docs/design.md steps 3-7 written out one row at a time in plain Python (slow; for tests).

    Same contract as :func:`gear_advantages` (with ``log_ratio`` ``[B, T]`` and
    ``config.score == "log_ratio"``: :func:`gear_signed_advantages`'s); returns float64
    ``[B, T]``.
    """
    _check_inputs(divergence, entropy, mask, advantages, config)
    check_mask(mask)
    check_tokens("divergence", divergence)
    check_tokens("entropy", entropy)
    divergence = skip_first_tokens(divergence, mask, config.skip_first)
    signed = config.score == "log_ratio"
    if not signed:
        ratios = torch.zeros_like(mask, dtype=torch.float64)
    elif log_ratio is None:
        raise ValueError("config.score='log_ratio' needs log_ratio")
    else:
        ratios = log_ratio.double()
    beta = config.resolved_beta
    rows = []
    for d_row, h_row, m_row, a, r_row in zip(
            divergence.double().tolist(), entropy.double().tolist(), mask.int().tolist(),
            advantages.double().tolist(), ratios.tolist(), strict=True):
        normalized = normalize_reference(d_row, m_row, config.normalize)          # step 3
        onsets = scan_reference(normalized, h_row, m_row, config)                  # step 4
        own = ([1.0 / (1.0 + math.exp(r)) for r in r_row] if signed               # step 5
               else normalized)
        scores = [own[s] if s >= 0 else u for s, u in zip(onsets, own, strict=True)]
        if config.sign_aware and a < 0:                                            # step 6
            weights = list(scores)
        elif config.sign_aware and a == 0:
            weights = [0.5] * len(scores)
        else:
            weights = [1.0 - u for u in scores]
        rescaled = [config.alpha * w + beta for w in weights]                      # step 7
        if config.mean_preserving and any(m_row):
            mean = sum(w for w, m in zip(rescaled, m_row, strict=True) if m) / sum(m_row)
            if abs(mean) > 1e-12:
                rescaled = [w / mean for w in rescaled]
        rows.append([w * a if m else 0.0 for w, m in zip(rescaled, m_row, strict=True)])
    return torch.tensor(rows, dtype=torch.float64).reshape(mask.shape)
