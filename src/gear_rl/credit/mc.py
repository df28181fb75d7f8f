"""Monte-Carlo segment credit: SPO-chain and VinePPO.

- **SPO-chain** (Segment Policy Optimization, Guo et al., arXiv 2505.23564, Sec. 3-4): cut the
  response before every ``cut_interval``-th token whose probability under the sampling policy is
  below ``prob_threshold``; estimate ``V`` at every cut from Monte-Carlo continuations; each
  segment's tokens get ``V(end) - V(start)``, the last segment ``R - V(start)``; tokens at or
  above the threshold get 0 and stay out of the whitening ("probability mask").
- **VinePPO** (Kazemnejad et al., arXiv 2410.01679, Sec. 4, Eq. 5):
  ``A_t = r + V(s_{i+1}) - V(s_i)`` for the tokens of reasoning step ``i``, steps split at
  newlines, ``V`` of every step's start from Monte-Carlo continuations (``V`` of the terminal
  state 0, ``r = R`` on the last step only).

Both are read from the authors' code (``AIFrameResearch/SPO`` @ b9fc6a26, ``McGill-NLP/VinePPO``
@ efe72284; each default below cites its file). The estimators here are pure: the trainer's values
phase continues each prefix with the policy (``gear_rl.mc_values``) at the boundaries
:attr:`Estimator.mc_boundaries` asks for and hands the means back in
``CreditBatch.extras["mc_values"]`` (``B`` lists, one ``V`` per boundary), with
``extras["token_texts"]`` (``B`` lists of each response token's text) for VinePPO's step split.

Where this project differs from the authors, and why:

- Boundaries are token positions of the sampled response (``b``: ``V`` of the prompt and the
  first ``b`` response tokens), continued from the token ids with the shared-prefix sampler; the
  authors decode the prefix to text and let vLLM re-tokenise it.
- ``p_t`` is the policy's probability at the run's rollout temperature (``rollout.temperature``,
  1.0 by default); the authors' runs sample and score at 0.6 (``SPO:configs/
  polIter_rho1bSft2_ppo_MATH.jsonnet:18,105``).
- The probability mask acts through the advantages: a masked token has advantage 0 and is left
  out of the whitening statistics, but it still counts in the loss's token mean (the authors
  drop it from the loss's mask, ``SPO:src/treetune/trainers/ppo_trainer.py:1057-1059``): the
  trainer's loss has one mask for every estimator.
- Whitening (``whiten``) runs over the whole step's batch (32 trajectories by default); the
  authors whiten per training micro-batch (8 episodes for SPO, 64 for VinePPO).
- Identical prefixes share one estimate (``dedupe_prefixes``, as the authors do) when their
  prompt and response token ids agree; the authors compare the query text.
- VinePPO's step split is GSM8K's newline rule (``VINE:src/treetune/tasks/gsm8k.py:65-142``):
  the arithmetic tasks here answer in GSM8K's style, not MATH's LaTeX, whose sentence splitter
  is not ported.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gear_rl.credit._validate import check_mask
from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.registry import register_estimator
from gear_rl.dataclass_config import check_bool, check_int, shown

__all__ = ["SPOChainConfig", "VinePPOConfig", "segment_advantages", "spo_chain_boundaries",
           "vineppo_boundaries", "whiten"]

_SPO = "arXiv 2505.23564"
_VINE = "arXiv 2410.01679"




@dataclass(frozen=True)
class SPOChainConfig:
    """SPO-chain knobs (authors' defaults, ``SPO`` = ``AIFrameResearch/SPO`` @ b9fc6a26).

    Attributes:
        mc_samples: Monte-Carlo continuations per boundary (9: ``SPO:configs/
            polIter_rho1bSft2_spo_chain_MATH.jsonnet:13``).
        prob_threshold: a cut candidate is a policy token with probability below this (strict;
            0.9, ``SPO:src/treetune/episode_generators/math_episode_generator_with_mc_advantages.
            py:927``); tokens at or above it get advantage 0 under ``prob_mask``.
        cut_interval: a boundary before every ``cut_interval``-th candidate, the first included
            (5: ``...with_mc_advantages.py:30``, ``configs/episode_generators/
            interval5.jsonnet:3``).
        prob_mask: train only on tokens below ``prob_threshold`` (the others get advantage 0
            and stay out of the whitening; on: ``SPO:src/treetune/trainers/ppo_trainer.py:133``).
        whiten: normalise the advantages to mean 0 and unbiased std 1 over the batch's trained
            tokens (on: ``ppo_trainer.py:135``; ``configs/trainers/ppo_MATH.jsonnet:64``).
        dedupe_prefixes: trajectories of a step that agree on the prompt and the response up to
            a cut share one Monte-Carlo estimate there, sampled once (on: the authors
            deduplicate identical value queries, ``SPO:...with_mc_advantages.py:1004-1016``).
    """

    mc_samples: int = 9
    prob_threshold: float = 0.9
    cut_interval: int = 5
    prob_mask: bool = True
    whiten: bool = True
    dedupe_prefixes: bool = True

    def __post_init__(self) -> None:
        check_int("mc_samples", self.mc_samples, 1)
        if not 0.0 < self.prob_threshold <= 1.0:
            raise ValueError(f"prob_threshold must lie in (0, 1], got {self.prob_threshold}")
        check_int("cut_interval", self.cut_interval, 1)
        for name in ("prob_mask", "whiten", "dedupe_prefixes"):
            check_bool(name, getattr(self, name))


@dataclass(frozen=True)
class VinePPOConfig:
    """VinePPO knobs (authors' defaults, ``VINE`` = ``McGill-NLP/VinePPO`` @ efe72284).

    Attributes:
        mc_samples: Monte-Carlo continuations per step start (``num_mc_rollouts = 9``:
            ``VINE:configs/polIter_rho1bSft2_vineppo_MATH.jsonnet:1``).
        max_steps: ``V`` is estimated at the starts of steps ``0..max_steps`` only: step
            ``max_steps`` gets ``R - V`` of its start, later steps 0 (None: every step, the MATH
            configs; GSM8K's cap is 25, ``VINE:configs/polIter_rho1bSft2_vineppo_GSM8K.
            jsonnet:15``, applied at ``VINE:...with_mc_advantages.py:694-696``).
        answer_prefix: the text that opens the final answer, merged into the last step
            (GSM8K's: a newline, then ``#### ``, ``VINE:src/treetune/tasks/gsm8k.py:33``;
            None: none).
        whiten: normalise the advantages to mean 0 and unbiased std 1 over the batch's policy
            tokens (on: ``VINE:src/treetune/trainers/ppo_trainer.py``, ``whiten_advantages``).
        dedupe_prefixes: trajectories of a step that agree on the prompt and the response up to
            a step start (the prompt itself, for the responses of one problem) share one
            Monte-Carlo estimate there, sampled once (on: ``VINE:src/treetune/episode_generators/
            math_episode_generator_with_mc_advantages.py:721-732``).
    """

    mc_samples: int = 9
    max_steps: int | None = None
    answer_prefix: str | None = "\n#### "
    whiten: bool = True
    dedupe_prefixes: bool = True

    def __post_init__(self) -> None:
        check_int("mc_samples", self.mc_samples, 1)
        check_int("max_steps", self.max_steps, 1, optional=True)
        if self.answer_prefix is not None and not isinstance(self.answer_prefix, str):
            raise ValueError(f"answer_prefix must be text or None, got {shown(self.answer_prefix)}")
        for name in ("whiten", "dedupe_prefixes"):
            check_bool(name, getattr(self, name))


# ------------------------------------------------------------------------------ boundaries
def spo_chain_boundaries(logprobs: Sequence[float], mask: Sequence[float],
                         config: SPOChainConfig) -> list[int]:
    """SPO-chain's cut points of one response (``L`` tokens): the positions ``b`` of every
    ``cut_interval``-th policy token whose probability ``exp(logprobs[b])`` is below
    ``prob_threshold`` (``V(b)``: the value before that token). ``SPO:...with_mc_advantages.
    py:924-929`` (``c = i - 1`` there is the state after token ``c``, i.e. ``b = i`` here)."""
    low = [t for t, (lp, m) in enumerate(zip(logprobs, mask, strict=True))
           if m and math.exp(float(lp)) < config.prob_threshold]
    return low[::config.cut_interval]


def vineppo_boundaries(token_texts: Sequence[str], answer_prefix: str | None = "\n#### "
                       ) -> list[int]:
    """VinePPO's step starts of one response, as token positions (``0`` first).

    The split is GSM8K's (``VINE:src/treetune/tasks/gsm8k.py:65-142``): the text before
    ``answer_prefix`` is split at every newline, each newline starting the next step; leading
    pieces that are empty or blank merge into the first non-empty one; where the answer prefix
    is present, the last non-empty step, what follows it and the answer form the last step (a
    second prefix stays inside the answer; the authors drop such a trajectory). A token belongs
    to the step of its first character (``VINE:...with_mc_advantages.py:364-369``; a token with
    no text, such as the stop token decoded without special tokens, to the step it ends in),
    so a step starts at its first token; a step no token starts in has no boundary."""
    text = "".join(token_texts)
    body, answer = text, None
    prefix = answer_prefix or ""
    if prefix and prefix in text:
        body, answer = text.split(prefix, 1)
    steps = body.split("\n")
    first = next((i for i, step in enumerate(steps) if step.strip()), 0)
    steps = ["\n".join(steps[:first + 1]), *steps[first + 1:]]
    if answer is not None:
        last = max((i for i, step in enumerate(steps) if step.strip()), default=0)
        steps = [*steps[:last], "\n".join(steps[last:]) + prefix + answer]
    starts, offset = [], len(steps[0])  # character offsets of the steps after the first
    for step in steps[1:]:
        starts.append(offset)
        offset += 1 + len(step)
    bounds, current, offset = [0], 0, 0
    for t, token in enumerate(token_texts):
        index = bisect.bisect_right(starts, offset)
        if index != current and t > 0:
            bounds.append(t)
        current = index
        offset += len(token)
    return bounds


# ------------------------------------------------------------------------------ advantages
def segment_advantages(length: int, boundaries: Sequence[int], values: Sequence[float],
                       reward: float) -> list[float]:
    """Per-token advantages of one response (``L = length`` tokens) from ``V`` at its
    boundaries: tokens ``[b_j, b_{j+1})`` get ``V(b_{j+1}) - V(b_j)``, the last segment
    ``[b_m, L)`` gets ``reward - V(b_m)``, tokens before ``b_0`` get 0 (no ``V`` of the prompt:
    SPO's first segment when its first token is not a cut). SPO: ``...with_mc_advantages.py:
    392-435``; VinePPO: ``r + V(s') - V(s)``, ``r = R`` on the last step, ``V`` 0 after it
    (``VINE:...with_mc_advantages.py:377-401``). A response without a boundary (SPO-chain:
    no token below the threshold) gets 0 everywhere, as the authors give it
    (``SPO:...with_mc_advantages.py:409-412``)."""
    out = [0.0] * length
    if not boundaries:
        return out
    ends = [*boundaries[1:], length]
    end_values = [*values[1:], reward]
    for start, end, v_start, v_end in zip(boundaries, ends, values, end_values, strict=True):
        for t in range(start, min(end, length)):
            out[t] = float(v_end) - float(v_start)
    return out


def whiten(advantages: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """``(A - mean) / sqrt(var + 1e-8)`` over the ``select``-ed entries (unbiased variance), 0
    elsewhere; every entry when nothing is selected. ``SPO:src/treetune/trainers/utils.py:
    266-291`` (its masked whitening; the authors whiten per micro-batch, here per batch)."""
    chosen = select.bool()
    if not bool(chosen.any()):
        chosen = torch.ones_like(chosen)
    values = advantages[chosen].double()
    mean = values.mean()
    var = values.var(unbiased=True) if values.numel() > 1 else torch.zeros((), dtype=values.dtype)
    out = (advantages.double() - mean) / torch.sqrt(var + 1e-8)
    return torch.where(select.bool(), out, torch.zeros_like(out)).to(advantages.dtype)


def _extra(batch: CreditBatch, key: str, why: str) -> list:
    """``batch.extras[key]``, one entry per row, or a ``ValueError`` saying ``why`` it is
    needed."""
    value = batch.extras.get(key)
    if value is None or len(value) != batch.mask.shape[0]:
        raise ValueError(f"{why} (extras[{shown(key)}], one entry per row)")
    return value


def _mc_values(batch: CreditBatch) -> list[list[float]]:
    return _extra(batch, "mc_values", "Monte-Carlo estimators need their values, one per "
                  "boundary: gear-rl train's values phase computes them")


def _lengths(mask: torch.Tensor) -> list[int]:
    """One past each row's last policy token (0 for an empty row)."""
    return [int(row.nonzero().max()) + 1 if bool(row.any()) else 0 for row in mask]


def _spo_boundaries(batch: CreditBatch, config: SPOChainConfig) -> list[list[int]]:
    if batch.student_logprobs is None:
        raise ValueError("spo_chain needs the student's log-probs of its sampled tokens")
    return [spo_chain_boundaries(lp.tolist(), m.tolist(), config)
            for lp, m in zip(batch.student_logprobs, batch.mask, strict=True)]


def _token_texts(batch: CreditBatch) -> list[list[str]]:
    return _extra(batch, "token_texts", "vineppo needs each response token's text to split "
                  "the steps at newlines")


def _vine_boundaries(batch: CreditBatch, config: VinePPOConfig) -> list[list[int]]:
    """The step starts whose ``V`` is estimated: those of steps ``0..max_steps``."""
    return [_vine_starts(texts, config)[1] for texts in _token_texts(batch)]


def _vine_starts(texts: Sequence[str], config: VinePPOConfig) -> tuple[list[int], list[int]]:
    """Every step start of a response, and those whose ``V`` is estimated."""
    starts = vineppo_boundaries(texts, config.answer_prefix)
    cap = None if config.max_steps is None else config.max_steps + 1
    return starts, starts[:cap]


def _to_tensor(rows: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    width = mask.shape[1]
    padded = [row[:width] + [0.0] * (width - len(row)) for row in rows]
    return torch.tensor(padded, dtype=torch.float32, device=mask.device) * mask


def _check_values(row: int, bounds: list[int], values: list[float]) -> None:
    if len(values) != len(bounds):
        raise ValueError(f"row {row}: {len(values)} Monte-Carlo values for {len(bounds)} "
                         "boundaries")


@register_estimator("spo_chain", config=SPOChainConfig, needs=("student_logprobs",),
                    mc_boundaries=_spo_boundaries, paper=_SPO,
                    description="SPO-chain: Monte-Carlo segment values at low-probability cuts")
def spo_chain(batch: CreditBatch, config: SPOChainConfig) -> torch.Tensor:
    """SPO-chain's ``[B, T]`` advantages (module docstring)."""
    check_mask(batch.mask)
    boundaries, values = _spo_boundaries(batch, config), _mc_values(batch)
    rows = []
    for row, (length, bounds, vals) in enumerate(zip(_lengths(batch.mask), boundaries, values,
                                                     strict=True)):
        _check_values(row, bounds, vals)
        rows.append(segment_advantages(length, bounds, vals, float(batch.rewards[row])))
    advantages = _to_tensor(rows, batch.mask)
    select = batch.mask.bool()
    if config.prob_mask:
        assert batch.student_logprobs is not None  # _spo_boundaries checked it
        select = select & (batch.student_logprobs.exp() < config.prob_threshold)
        advantages = torch.where(select, advantages, torch.zeros_like(advantages))
    return whiten(advantages, select) if config.whiten else advantages


@register_estimator("vineppo", config=VinePPOConfig, mc_boundaries=_vine_boundaries,
                    paper=_VINE,
                    description="VinePPO: Monte-Carlo values at every reasoning step's start")
def vineppo(batch: CreditBatch, config: VinePPOConfig) -> torch.Tensor:
    """VinePPO's ``[B, T]`` advantages (module docstring). ``V`` of the prompt is always
    estimated; step starts past ``max_steps`` take ``V = R`` (the authors fill them backwards
    from the terminal state with zero step rewards, ``VINE:...with_mc_advantages.py:388-391``),
    so their tokens get 0."""
    check_mask(batch.mask)
    values = _mc_values(batch)
    rows = []
    for row, (length, texts, vals) in enumerate(zip(_lengths(batch.mask), _token_texts(batch),
                                                    values, strict=True)):
        starts, estimated = _vine_starts(texts, config)
        _check_values(row, estimated, vals)
        reward = float(batch.rewards[row])
        full = [*vals, *([reward] * (len(starts) - len(estimated)))]
        rows.append(segment_advantages(length, starts, full, reward))
    advantages = _to_tensor(rows, batch.mask)
    return whiten(advantages, batch.mask.bool()) if config.whiten else advantages
