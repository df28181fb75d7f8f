"""Monte-Carlo values of response prefixes: the ground truth of per-token credit, and the
values the Monte-Carlo estimators (SPO-chain, VinePPO: ``gear_rl.credit.mc``) train on.

The credit check (:mod:`gear_rl.credit_check`) and the trainer's values phase
(:meth:`gear_rl.train.trainer.Trainer.values`) both estimate them here.

For a response ``y`` sampled for a prompt ``x``, the value of the prefix ``y_<b`` (the first
``b`` response tokens) under the current policy is the expected outcome reward of letting the
policy finish the response from there, ``V_b = V(x, y_<b)``. The true advantage of response
token ``t`` is then ``V_{t+1} - V_t = V(x, y_<=t) - V(x, y_<t)`` (VinePPO, arXiv 2410.01679).

``V_b`` is estimated by ``m`` continuations from the prefix with the trainer's own sampler: the
same temperature and top-p, the budget that was left (``max_new_tokens - b``), and the task's
scorer on the whole response. At the last boundary (``b = L``: the response ended with its stop
token, or its budget is spent) there is nothing to sample, and ``V_L`` is the trajectory's own
reward, exactly.

Continuations of one trajectory share its prefix's KV cache through
:func:`gear_rl.sampling.sample_continuations` (one forward over the prompt and response,
then every cut's continuations decoded from the cached prefix). With ``shared=False`` every
cut's prefix is sampled from afresh with ``sample_responses`` instead (the same distribution;
the benchmark's baseline). Cuts are sampled in calls of one decoding batch whose budgets are
close (``budget_band``); a call samples up to its largest budget and each continuation is cut
to its own cut's budget, which leaves its distribution unchanged: sampling is
autoregressive, so the first ``n`` tokens of a longer continuation are distributed as a
continuation capped at ``n`` (a continuation longer than its budget counts as unfinished, as
the trainer's sampler would have left it).

:func:`exact_value` computes ``V`` by enumerating every continuation (tiny vocabularies and
horizons only): the check the Monte-Carlo estimate is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from gear_rl.agent.loop import EpisodePrefix
from gear_rl.sampling import SamplingParams, sample_continuations, sample_responses

__all__ = [
    "ContinueFn",
    "PrefixValues",
    "RewardFn",
    "choose_boundaries",
    "estimate_episode_values",
    "estimate_prefix_values",
    "exact_value",
    "nucleus_probs",
    "sample_from_prefixes",
]

RewardFn = Callable[[Sequence[int], bool], float]
"""``reward_fn(response_ids, finished) -> float``: the outcome reward of a whole response (the
trajectory's first ``b`` tokens and a continuation), ``finished`` when it ended with a stop
token."""


@dataclass
class PrefixValues:
    """Monte-Carlo values of one trajectory's prefixes.

    Attributes:
        boundaries: ``J`` sorted response positions ``b`` (``0 <= b <= L``); boundary ``j``
            stands for ``V(x, y_<b_j)``.
        rewards: ``rewards[r][j]``: the rewards of replicate ``r``'s continuations from boundary
            ``j`` (``m`` of them; one, the trajectory's own reward, at a terminal boundary).
            Replicates are independent estimates with their own random streams.
        terminal: ``J`` flags, True where nothing is left to sample (``b = L``, or the budget
            is spent): ``V`` is the trajectory's reward there, exactly (standard error 0).
        tokens: continuation tokens sampled (before each was cut to its boundary's budget).
    """

    boundaries: list[int]
    rewards: list[list[list[float]]]
    terminal: list[bool]
    tokens: int = 0

    @property
    def replicates(self) -> int:
        return len(self.rewards)

    def _pooled(self, replicate: int | None) -> list[list[float]]:
        if replicate is not None:
            if not 0 <= replicate < self.replicates:
                raise ValueError(f"replicate {replicate} out of range (have {self.replicates})")
            return self.rewards[replicate]
        return [[value for rep in self.rewards for value in rep[j]] if not self.terminal[j]
                else self.rewards[0][j] for j in range(len(self.boundaries))]

    def values(self, replicate: int | None = None) -> np.ndarray:
        """``[J]`` float64: ``V`` at every boundary, from one replicate or (None) all pooled."""
        return np.array([float(np.mean(r)) for r in self._pooled(replicate)])

    def stderr(self, replicate: int | None = None) -> np.ndarray:
        """``[J]`` float64: the standard error of :meth:`values` (sample standard deviation over
        ``sqrt(m)``; 0 at terminal boundaries; NaN where only one continuation was drawn)."""
        out = []
        for j, rewards in enumerate(self._pooled(replicate)):
            if self.terminal[j]:
                out.append(0.0)
            elif len(rewards) < 2:
                out.append(math.nan)
            else:
                out.append(float(np.std(rewards, ddof=1) / math.sqrt(len(rewards))))
        return np.array(out)

    def advantages(self, replicate: int | None = None) -> np.ndarray:
        """``[J - 1]``: ``V_{j+1} - V_j``, the Monte-Carlo advantage of the span of tokens
        between consecutive boundaries (of one token with every boundary estimated)."""
        return np.diff(self.values(replicate))

    def advantage_stderr(self, replicate: int | None = None) -> np.ndarray:
        """``[J - 1]``: the standard error of :meth:`advantages` (the two boundaries'
        continuations are independent draws)."""
        se = self.stderr(replicate)
        return np.sqrt(se[1:] ** 2 + se[:-1] ** 2)

    def to_dict(self) -> dict[str, Any]:
        return {"boundaries": list(self.boundaries), "rewards": self.rewards,
                "terminal": list(self.terminal), "tokens": self.tokens}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrefixValues:
        return cls(boundaries=[int(b) for b in data["boundaries"]],
                   rewards=[[[float(v) for v in cut] for cut in rep] for rep in data["rewards"]],
                   terminal=[bool(t) for t in data["terminal"]], tokens=int(data["tokens"]))


def choose_boundaries(length: int, *, every: int = 1, segment_onsets: Sequence[int] | None = None,
                      mask: Sequence[int] | None = None,
                      turn_ids: Sequence[int] | None = None) -> list[int]:
    """The boundaries to estimate ``V`` at for a response of ``length`` tokens.

    Args:
        length: ``L``, the response length (>= 1).
        every: with neither ``segment_onsets`` nor ``turn_ids``: every ``every``-th
            policy-token boundary (1: all).
        segment_onsets: ``L`` GEAR segment onsets (``gear_segments``: the onset of each token's
            segment, -1 outside): the boundaries are then where a segment starts or ends.
        mask: ``L`` policy flags (None: every token is the policy's); a boundary sits before a
            policy token, never before an observation token.
        turn_ids: ``L`` turn indices of a multi-turn response (an observation carries the turn
            it answers): the boundaries are then the start of every policy turn.

    Returns:
        Sorted boundaries; ``0`` and ``L`` are always included.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    policy = [True] * length if mask is None else [bool(m) for m in mask]
    if len(policy) != length:
        raise ValueError(f"mask has {len(policy)} entries, expected {length}")
    starts = [t for t in range(length) if policy[t]]
    if segment_onsets is not None and turn_ids is not None:
        raise ValueError("give segment_onsets or turn_ids, not both")
    if turn_ids is not None:
        turns = list(turn_ids)
        if len(turns) != length:
            raise ValueError(f"turn_ids has {len(turns)} entries, expected {length}")
        chosen = {t for t in starts if t > 0 and turns[t] != turns[t - 1]}
    elif segment_onsets is not None:
        onsets = list(segment_onsets)
        if len(onsets) != length:
            raise ValueError(f"segment_onsets has {len(onsets)} entries, expected {length}")
        chosen = {t for t in starts if t > 0 and onsets[t] != onsets[t - 1]}
    else:
        chosen = set(starts[::every])
    return sorted(chosen | {0, length})


def _truncate(responses: list[list[int]], finished: list[bool], budget: int
              ) -> tuple[list[list[int]], list[bool]]:
    out, flags = [], []
    for response, done in zip(responses, finished, strict=True):
        if len(response) > budget:
            out.append(response[:budget])
            flags.append(False)
        else:
            out.append(response)
            flags.append(done)
    return out, flags


def _budget_chunks(budgets: Sequence[int], samples: int, batch_size: int | None,
                   band: int | None) -> list[list[int]]:
    """Consecutive runs of cut indices sampled in one call: at most ``batch_size`` rows (one
    decoding batch; at least one cut), budgets at most ``band`` apart (None: no limit), so that
    few tokens are sampled past a cut's own budget."""
    chunks: list[list[int]] = []
    for index in range(len(budgets)):
        if chunks:
            grown = [*chunks[-1], index]
            rows_fit = batch_size is None or len(grown) * samples <= batch_size
            spread = max(budgets[i] for i in grown) - min(budgets[i] for i in grown)
            if rows_fit and (band is None or spread <= band):
                chunks[-1] = grown
                continue
        chunks.append([index])
    return chunks


def sample_from_prefixes(
    sampler: torch.nn.Module,
    prefix_ids: Sequence[int],
    cuts: Sequence[int],
    samples: int,
    *,
    budgets: Sequence[int],
    stop_ids: Sequence[int],
    pad_id: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    batch_size: int | None = None,
    shared: bool = True,
    budget_band: int | None = 8,
) -> tuple[list[list[list[int]]], list[list[bool]], int]:
    """``samples`` continuations of ``prefix_ids[:c]`` for every cut ``c``, each at most its
    cut's budget long.

    Args:
        sampler: the policy's sampler (a Hugging Face causal LM).
        prefix_ids: prompt and response token ids.
        cuts: positions into ``prefix_ids`` (each >= 1) to continue from.
        samples: continuations per cut.
        budgets: per cut, the most tokens a continuation may have (>= 1).
        stop_ids, pad_id, temperature, top_p, generator, batch_size: the sampler's settings
            (:class:`gear_rl.sampling.SamplingParams`).
        shared: True: one shared prefix KV cache (``sample_continuations``); False: every
            prefix sampled from afresh (``sample_responses`` on copies of each prefix).
        budget_band: cuts are sampled in calls of at most ``batch_size`` rows whose budgets
            differ by at most this much (None: no limit); a call samples up to its largest
            budget, and each continuation is then cut to its own (each call recomputes the
            prefix's KV cache: one forward, cheap beside the decoding it saves).

    Returns:
        ``(continuations, finished, sampled)``: per cut, ``samples`` continuation id lists and
        their finished flags, and the number of tokens sampled.
    """
    if len(cuts) != len(budgets):
        raise ValueError(f"{len(cuts)} cuts but {len(budgets)} budgets")
    if not cuts:
        return [], [], 0
    if min(budgets) < 1:
        raise ValueError(f"every budget must be >= 1, got {min(budgets)}")
    prefix = [int(t) for t in prefix_ids]
    if min(cuts) < 1 or max(cuts) > len(prefix):
        raise ValueError(f"cuts must lie in [1, {len(prefix)}], got {min(cuts)}..{max(cuts)}")
    sampling = SamplingParams(max_new_tokens=max(budgets), stop_ids=stop_ids, pad_id=pad_id,
                              temperature=temperature, top_p=top_p, batch_size=batch_size)
    per_cut: list[tuple[list[list[int]], list[bool]]] = []
    for chunk in _budget_chunks(budgets, samples, batch_size, budget_band):
        part = [int(cuts[i]) for i in chunk]
        call = replace(sampling, max_new_tokens=max(budgets[i] for i in chunk))
        if shared:
            drawn = sample_continuations(sampler, prefix, part, samples, call,
                                         generator=generator)
            per_cut += [(list(r.response_ids), list(r.finished)) for r in drawn]
        else:
            prompts = [prefix[:c] for c in part for _ in range(samples)]
            result = sample_responses(sampler, prompts, call, generator=generator)
            per_cut += [(result.response_ids[i * samples:(i + 1) * samples],
                         result.finished[i * samples:(i + 1) * samples])
                        for i in range(len(part))]
    if len(per_cut) != len(cuts) or any(len(r) != samples for r, _ in per_cut):
        raise RuntimeError(f"the sampler returned {len(per_cut)} cuts of "
                           f"{[len(r) for r, _ in per_cut]} continuations, expected "
                           f"{len(cuts)} of {samples}")
    sampled = sum(len(r) for responses, _ in per_cut for r in responses)
    continuations, flags = [], []
    for (responses, finished), budget in zip(per_cut, budgets, strict=True):
        kept, done = _truncate(responses, finished, budget)
        continuations.append(kept)
        flags.append(done)
    return continuations, flags, sampled


def estimate_prefix_values(
    sampler: torch.nn.Module,
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    finished: bool,
    boundaries: Sequence[int],
    *,
    samples: int,
    reward_fn: RewardFn,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seeds: Sequence[int] = (0,),
    batch_size: int | None = None,
    shared: bool = True,
) -> PrefixValues:
    """Monte-Carlo ``V`` at ``boundaries`` of one trajectory.

    Args:
        sampler: the policy's sampler (a Hugging Face causal LM, used as it is).
        prompt_ids: the prompt the response was sampled for.
        response_ids: the response ``y`` (``L`` tokens, its stop token included when finished).
        finished: the response ended with a stop token.
        boundaries: sorted response positions in ``[0, L]``.
        samples: ``m``, continuations per boundary and replicate.
        reward_fn: the outcome reward of a whole response (:data:`RewardFn`).
        max_new_tokens: the response budget of the rollout; a continuation from boundary ``b``
            may have ``max_new_tokens - b`` tokens.
        stop_ids, pad_id, temperature, top_p, batch_size: the rollout's sampler settings.
        seeds: one seed per replicate (each replicate is an independent estimate).
        shared: see :func:`sample_from_prefixes`.

    Returns:
        :class:`PrefixValues`.
    """
    response = [int(t) for t in response_ids]
    length = len(response)
    bounds = [int(b) for b in boundaries]
    if bounds != sorted(set(bounds)) or not bounds or bounds[0] < 0 or bounds[-1] > length:
        raise ValueError(f"boundaries must be sorted, distinct and within [0, {length}], "
                         f"got {bounds}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not seeds:
        raise ValueError("seeds: give one seed per replicate (at least one)")
    if length > max_new_tokens:
        raise ValueError(f"the response has {length} tokens, more than max_new_tokens "
                         f"({max_new_tokens})")
    terminal = [b == length or b >= max_new_tokens for b in bounds]
    own = float(reward_fn(response, finished))
    cuts = [len(prompt_ids) + b for b, end in zip(bounds, terminal, strict=True) if not end]
    budgets = [max_new_tokens - b for b, end in zip(bounds, terminal, strict=True) if not end]
    open_bounds = [b for b, end in zip(bounds, terminal, strict=True) if not end]
    prefix = [*map(int, prompt_ids), *response]
    device = next(sampler.parameters()).device
    rewards: list[list[list[float]]] = []
    tokens = 0
    for seed in seeds:
        generator = torch.Generator(device=device).manual_seed(int(seed))
        continuations, flags, sampled = sample_from_prefixes(
            sampler, prefix, cuts, samples, budgets=budgets, stop_ids=stop_ids, pad_id=pad_id,
            temperature=temperature, top_p=top_p, generator=generator, batch_size=batch_size,
            shared=shared)
        tokens += sampled
        by_bound = {b: [float(reward_fn(response[:b] + cont, done))
                        for cont, done in zip(conts, fl, strict=True)]
                    for b, conts, fl in zip(open_bounds, continuations, flags, strict=True)}
        rewards.append([[own] if end else by_bound[b]
                        for b, end in zip(bounds, terminal, strict=True)])
    return PrefixValues(boundaries=bounds, rewards=rewards, terminal=terminal, tokens=tokens)


ContinueFn = Callable[[list[EpisodePrefix], torch.Generator], tuple[list[float], int]]
"""``continue_fn(prefixes, generator) -> (rewards, tokens)``: finish one episode from each
prefix with the policy (tool calls run, observations appended: ``gear_rl.train.episodes.collect``
with ``prefixes=``) drawing from ``generator``; the outcome reward of each whole episode, and the
policy tokens generated."""


def estimate_episode_values(
    continue_fn: ContinueFn,
    response_ids: Sequence[int],
    loss_mask: Sequence[int],
    turn_ids: Sequence[int],
    reward: float,
    boundaries: Sequence[int],
    *,
    samples: int,
    seeds: Sequence[int] = (0,),
    batch_size: int | None = None,
    device: torch.device | str = "cpu",
) -> PrefixValues:
    """Monte-Carlo ``V`` at ``boundaries`` of one multi-turn (agent) episode.

    The episode analogue of :func:`estimate_prefix_values`: a boundary ``b`` sits before a
    policy token (:func:`choose_boundaries` with the episode's mask), and ``V_b`` is the mean
    outcome of ``samples`` episodes continued from its first ``b`` tokens: the rest of the turn
    ``b`` falls in, its tool call run in the sandbox, and every later turn, under the rollout's
    limits. ``b = L`` is terminal (``V`` = the episode's own ``reward``). Observation tokens are
    context: never a boundary, and their span's advantage is their policy neighbours'.

    Args:
        continue_fn: finishes episodes from prefixes (:data:`ContinueFn`).
        response_ids, loss_mask, turn_ids: the episode (``L`` tokens each).
        reward: its own outcome reward.
        boundaries: sorted positions in ``[0, L]``, each ``L`` or before a policy token.
        samples: ``m``, continuations per boundary and replicate.
        seeds: one seed per replicate.
        batch_size: most episodes per ``continue_fn`` call (None: every cut's at once); whole
            cuts only, at least one cut a call.
        device: where the generators live (the sampler's device).

    Returns:
        :class:`PrefixValues`; ``tokens`` counts the policy tokens generated.
    """
    response = [int(t) for t in response_ids]
    mask = [int(m) for m in loss_mask]
    turns = [int(t) for t in turn_ids]
    length = len(response)
    if len(mask) != length or len(turns) != length:
        raise ValueError(f"{length} response ids, {len(mask)} mask entries and {len(turns)} "
                         "turn ids: they must match")
    bounds = [int(b) for b in boundaries]
    if bounds != sorted(set(bounds)) or not bounds or bounds[0] < 0 or bounds[-1] > length:
        raise ValueError(f"boundaries must be sorted, distinct and within [0, {length}], "
                         f"got {bounds}")
    inside = [b for b in bounds if b < length and not mask[b]]
    if inside:
        raise ValueError(f"boundaries {inside[:5]} sit before observation tokens: an episode is "
                         "continued from before a policy token (or is over, at L)")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not seeds:
        raise ValueError("seeds: give one seed per replicate (at least one)")
    terminal = [b == length for b in bounds]
    open_bounds = [b for b in bounds if b < length]
    per_call = max(1, (batch_size or samples * max(len(open_bounds), 1)) // samples)
    rewards: list[list[list[float]]] = []
    tokens = 0
    for seed in seeds:
        generator = torch.Generator(device=device).manual_seed(int(seed))
        by_bound: dict[int, list[float]] = {}
        for start in range(0, len(open_bounds), per_call):
            part = open_bounds[start:start + per_call]
            prefixes = [EpisodePrefix(response[:b], mask[:b], turns[:b])
                        for b in part for _ in range(samples)]
            got, spent = continue_fn(prefixes, generator)
            if len(got) != len(prefixes):
                raise RuntimeError(f"continue_fn returned {len(got)} rewards for "
                                   f"{len(prefixes)} prefixes")
            tokens += int(spent)
            for k, b in enumerate(part):
                by_bound[b] = [float(r) for r in got[k * samples:(k + 1) * samples]]
        rewards.append([[float(reward)] if end else by_bound[b]
                        for b, end in zip(bounds, terminal, strict=True)])
    return PrefixValues(boundaries=bounds, rewards=rewards, terminal=terminal, tokens=tokens)


def nucleus_probs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0
                  ) -> torch.Tensor:
    """``[B, V]`` float64: the distribution :func:`gear_rl.sampling.sample_next_token`
    samples from: ``softmax(logits / temperature)`` restricted to the top-p nucleus (a token is
    kept while the mass strictly before it is below ``top_p``) and renormalised."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    ordered, order = probs.sort(dim=-1, descending=True)
    keep = (ordered.cumsum(-1) - ordered) < top_p
    kept = torch.zeros_like(probs).scatter_(-1, order, ordered * keep)
    return kept / kept.sum(-1, keepdim=True)


@torch.no_grad()
def exact_value(
    model: torch.nn.Module,
    prefix_ids: Sequence[int],
    *,
    reward_fn: Callable[[list[int], bool], float],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_sequences: int = 200_000,
) -> float:
    """The exact expected reward of continuing ``prefix_ids`` with the sampler's distribution
    (:func:`nucleus_probs`), by enumerating every continuation of up to ``max_new_tokens``
    tokens (stopping at a stop token). For tiny vocabularies and horizons: the number of live
    continuations grows as ``V ** n``.

    Args:
        model: a causal LM (one forward per depth, over every live continuation).
        prefix_ids: the context (prompt and response prefix).
        reward_fn: ``reward_fn(continuation_ids, finished)``.
        max_new_tokens: the continuation budget (0: the reward of the empty continuation,
            unfinished).
        stop_ids, temperature, top_p: as the sampler's.
        max_sequences: refuse to enumerate more live continuations than this at one depth.
    """
    stops = {int(s) for s in stop_ids}
    if max_new_tokens <= 0:
        return float(reward_fn([], False))
    device = next(model.parameters()).device
    prefix = [int(t) for t in prefix_ids]
    frontier: list[tuple[list[int], float]] = [([], 1.0)]
    total = 0.0
    for depth in range(max_new_tokens):
        if not frontier:
            break
        inputs = torch.tensor([prefix + seq for seq, _ in frontier], device=device)
        probs = nucleus_probs(model(input_ids=inputs).logits[:, -1], temperature, top_p).cpu()
        grown: list[tuple[list[int], float]] = []
        for (seq, mass), row in zip(frontier, probs, strict=True):
            for token in torch.nonzero(row).flatten().tolist():
                weight = mass * float(row[token])
                step = [*seq, token]
                if token in stops:
                    total += weight * float(reward_fn(step, True))
                elif depth == max_new_tokens - 1:
                    total += weight * float(reward_fn(step, False))
                else:
                    grown.append((step, weight))
        if len(grown) > max_sequences:
            raise ValueError(f"exact_value: {len(grown)} live continuations at depth "
                             f"{depth + 1} (more than max_sequences={max_sequences})")
        frontier = grown
    return total
