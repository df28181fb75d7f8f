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

Continuations of one trajectory share its prefix's KV cache, and continuations of several
trajectories decode together (:func:`estimate_values`, through
:func:`gear_rl.sampling.continue_sequences`: one forward over each prompt and response, then
every cut's continuations decoded from the cached prefixes, in batches of rows ordered by prefix
length). With ``shared=False`` every cut's prefix is sampled from afresh with
``sample_responses`` instead (the same distribution; the benchmark's baseline). Each
continuation stops at its own budget, ``max_new_tokens - b``, unfinished, as the trainer's
sampler would have left it.

:func:`exact_value` computes ``V`` by enumerating every continuation (tiny vocabularies and
horizons only): the check the Monte-Carlo estimate is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gear_rl.agent.loop import EpisodePrefix
from gear_rl.sampling import SamplingParams, continue_sequences, sample_responses

__all__ = [
    "ContinueFn",
    "PrefixValues",
    "RewardFn",
    "Trajectory",
    "choose_boundaries",
    "estimate_episode_values",
    "estimate_prefix_values",
    "estimate_values",
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


def sample_from_prefixes(
    sampler: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    cuts: Sequence[tuple[int, int]],
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
) -> tuple[list[list[list[int]]], list[list[bool]], int]:
    """``samples`` continuations of ``sequences[s][:c]`` for every cut ``(s, c)``, each at most
    its cut's budget long.

    Args:
        sampler: the policy's sampler (a Hugging Face causal LM).
        sequences: token sequences (prompt and response of each trajectory).
        cuts: ``(sequence index, position)`` pairs, the position (>= 1) into that sequence to
            continue from; rows decode in this order (order them by position to keep each
            decoding batch's padding small).
        samples: continuations per cut.
        budgets: per cut, the most tokens a continuation may have (>= 1); a row leaves the
            decoding batch at its budget (unfinished, as the trainer's sampler leaves it).
        stop_ids, pad_id, temperature, top_p, generator, batch_size: the sampler's settings
            (:class:`gear_rl.sampling.SamplingParams`; ``batch_size`` counts continuation rows,
            of every sequence together).
        shared: True: each sequence's KV cache computed once and shared by its cuts
            (:func:`gear_rl.sampling.continue_sequences`); False: every prefix sampled from
            afresh (``sample_responses`` on copies of each prefix).

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
    sampling = SamplingParams(max_new_tokens=max(budgets), stop_ids=stop_ids, pad_id=pad_id,
                              temperature=temperature, top_p=top_p, batch_size=batch_size)
    if shared:
        drawn = continue_sequences(sampler, sequences, cuts, samples, sampling,
                                   generator=generator, budgets=budgets)
        per_cut = [(list(r.response_ids), list(r.finished)) for r in drawn]
    else:
        for s, c in cuts:
            if not 0 <= s < len(sequences) or not 1 <= c <= len(sequences[s]):
                raise ValueError(f"cut {(s, c)} lies outside the sequences")
        prompts = [[int(t) for t in sequences[s][:c]] for s, c in cuts for _ in range(samples)]
        result = sample_responses(sampler, prompts, sampling, generator=generator,
                                  budgets=[int(b) for b in budgets for _ in range(samples)])
        per_cut = [(result.response_ids[i * samples:(i + 1) * samples],
                    result.finished[i * samples:(i + 1) * samples]) for i in range(len(cuts))]
    if len(per_cut) != len(cuts) or any(len(r) != samples for r, _ in per_cut):
        raise RuntimeError(f"the sampler returned {len(per_cut)} cuts of "
                           f"{[len(r) for r, _ in per_cut]} continuations, expected "
                           f"{len(cuts)} of {samples}")
    sampled = sum(len(r) for responses, _ in per_cut for r in responses)
    return [r for r, _ in per_cut], [f for _, f in per_cut], sampled


@dataclass(frozen=True)
class Trajectory:
    """One sampled response whose prefix values are wanted.

    Attributes:
        prompt_ids: the prompt the response was sampled for.
        response_ids: the response ``y`` (``L`` tokens, its stop token included when finished).
        finished: the response ended with a stop token.
        boundaries: sorted, distinct response positions in ``[0, L]``.
        reward_fn: the outcome reward of a whole response (:data:`RewardFn`).
    """

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    finished: bool
    boundaries: Sequence[int]
    reward_fn: RewardFn


def estimate_values(
    sampler: torch.nn.Module,
    trajectories: Sequence[Trajectory],
    *,
    samples: int,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seeds: Sequence[int] = (0,),
    batch_size: int | None = None,
    shared: bool = True,
    dedupe: bool = True,
) -> list[PrefixValues]:
    """Monte-Carlo ``V`` at every trajectory's boundaries, the continuations of all of them
    sampled together: per replicate, every open boundary of every trajectory is one cut of
    :func:`sample_from_prefixes`, ordered by prefix length, so that a decoding batch of
    ``batch_size`` rows holds continuations of several trajectories.

    Args:
        sampler: the policy's sampler (a Hugging Face causal LM, used as it is).
        trajectories: the responses and their boundaries (:class:`Trajectory`).
        samples: ``m``, continuations per boundary and replicate.
        max_new_tokens: the response budget of the rollout; a continuation from boundary ``b``
            may have ``max_new_tokens - b`` tokens.
        stop_ids, pad_id, temperature, top_p: the rollout's sampler settings.
        seeds: one seed per replicate (each replicate is an independent estimate, drawn from
            its own generator over all trajectories).
        batch_size: continuation rows per decoding batch (None: all at once).
        shared: see :func:`sample_from_prefixes`.
        dedupe: trajectories whose prompt and response agree up to a boundary (the responses of
            one prompt all do at ``b = 0``) share one estimate of that prefix's ``V``, sampled
            once, as SPO's and VinePPO's authors do (``AIFrameResearch/SPO``: ``src/treetune/
            episode_generators/math_episode_generator_with_mc_advantages.py:1004-1016``,
            ``McGill-NLP/VinePPO``: the same file, ``:721-732``); False: every trajectory's
            boundaries are estimated on their own.

    Returns:
        One :class:`PrefixValues` per trajectory; ``tokens`` counts the tokens of the
        continuations sampled for it (a shared prefix's, for the first trajectory that has it).
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not seeds:
        raise ValueError("seeds: give one seed per replicate (at least one)")
    sequences, opens, terminals, own = [], [], [], []
    for index, item in enumerate(trajectories):
        response = [int(t) for t in item.response_ids]
        length = len(response)
        bounds = [int(b) for b in item.boundaries]
        if bounds != sorted(set(bounds)) or not bounds or bounds[0] < 0 or bounds[-1] > length:
            raise ValueError(f"trajectory {index}: boundaries must be sorted, distinct and "
                             f"within [0, {length}], got {bounds}")
        if length > max_new_tokens:
            raise ValueError(f"trajectory {index}: the response has {length} tokens, more than "
                             f"max_new_tokens ({max_new_tokens})")
        terminal = [b == length or b >= max_new_tokens for b in bounds]
        terminals.append(terminal)
        opens.append([b for b, end in zip(bounds, terminal, strict=True) if not end])
        own.append(float(item.reward_fn(response, bool(item.finished))))
        sequences.append([*map(int, item.prompt_ids), *response])
    prompt_len = [len(item.prompt_ids) for item in trajectories]
    shared_by: dict[tuple[int, int], tuple[int, int]] = {}  # (i, b) -> the job sampling it
    first: dict[tuple[int, ...], tuple[int, int]] = {}  # prompt and prefix -> its first (i, b)
    for i, bounds in enumerate(opens):
        for b in bounds:
            key = (prompt_len[i], *sequences[i][:prompt_len[i] + b])
            shared_by[(i, b)] = first.setdefault(key, (i, b)) if dedupe else (i, b)
    jobs = sorted(set(shared_by.values()), key=lambda job: (prompt_len[job[0]] + job[1], job))
    device = next(sampler.parameters()).device
    rewards: list[list[list[list[float]]]] = [[] for _ in trajectories]
    tokens = [0] * len(trajectories)
    for seed in seeds:
        generator = torch.Generator(device=device).manual_seed(int(seed))
        continuations, flags, _ = sample_from_prefixes(
            sampler, sequences, [(i, prompt_len[i] + b) for i, b in jobs], samples,
            budgets=[max_new_tokens - b for _, b in jobs], stop_ids=stop_ids, pad_id=pad_id,
            temperature=temperature, top_p=top_p, generator=generator, batch_size=batch_size,
            shared=shared)
        by_bound: dict[tuple[int, int], list[float]] = {}
        for (i, b), conts, done in zip(jobs, continuations, flags, strict=True):
            head = sequences[i][prompt_len[i]:prompt_len[i] + b]
            by_bound[(i, b)] = [float(trajectories[i].reward_fn(head + cont, fin))
                                for cont, fin in zip(conts, done, strict=True)]
            tokens[i] += sum(map(len, conts))
        for i, item in enumerate(trajectories):
            rewards[i].append([[own[i]] if end else by_bound[shared_by[(i, int(b))]]
                               for b, end in zip(item.boundaries, terminals[i], strict=True)])
    return [PrefixValues(boundaries=[int(b) for b in item.boundaries], rewards=rewards[i],
                         terminal=terminals[i], tokens=tokens[i])
            for i, item in enumerate(trajectories)]


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
    """Monte-Carlo ``V`` at ``boundaries`` of one trajectory: :func:`estimate_values` of one
    :class:`Trajectory` (its arguments, one by one)."""
    (values,) = estimate_values(
        sampler, [Trajectory(prompt_ids, response_ids, finished, boundaries, reward_fn)],
        samples=samples, max_new_tokens=max_new_tokens, stop_ids=stop_ids, pad_id=pad_id,
        temperature=temperature, top_p=top_p, seeds=seeds, batch_size=batch_size, shared=shared)
    return values


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
