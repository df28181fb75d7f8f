"""Batched sampling with a KV cache: the loop behind :func:`sample_responses` and
:func:`sample_continuations`, and the record of how it samples (:class:`SamplingParams`).

A short hand-written loop over the model's own forward (HF cache layers), not
``model.generate``: on a CPU the per-step overhead of ``generate`` (logits processors, stopping
criteria, a full-vocabulary multinomial, rows that finished still decoded) costs more than the
135M-parameter model's forward. Here:

- each distinct prompt of a batch is prefilled once, left-padded among the distinct prompts,
  and its cache rows are repeated for its copies (a group of K samples pays one prefill);
- the cache is written in place into buffers allocated once per batch (no ``torch.cat`` of the
  cache per layer and step, :class:`~gear_rl.sampling.cache.BufferLayer`), and no attention
  mask is built when no row is padded;
- sampling is exact categorical sampling by inverse CDF (one ``cumsum`` and a ``searchsorted``
  on one uniform draw per row; ``torch.multinomial`` over 49k logits is several times slower on
  CPU, and so are Gumbel-max and the exponential race, which need a random number per vocabulary
  entry), restricted to the top-p nucleus found through ``topk`` when the nucleus is small (the
  usual case) and a full sort otherwise; ``greedy=True`` takes the argmax instead;
- on a CPU, a decoding step's attention (one query per row) runs
  :func:`~gear_rl.sampling.attention.decode_attention`'s grouped fp32 matmuls instead of
  ``scaled_dot_product_attention``;
- a row stops at its first stop token (end of turn), which is kept in its response (the policy
  learns to stop); finished rows are dropped from the batch and the cache, so a batch does not
  pay for its longest answer on every row. A row also stops at its own token budget
  (``budgets``) and, given a :class:`RowStop`, as soon as its new tokens complete what the
  caller waits for (a tool call: the agent loop would discard every token after it).

:func:`continue_sequences` runs the same loop from prefixes of given sequences, each sequence
read from one forward pass over it, prefixes of several sequences decoding in one batch (the
Monte-Carlo values of the credit check and of the trainer's values phase);
:func:`sample_continuations` is its one-sequence form.

Multi-turn episodes (agent and environment loops) call the sampler once per turn, each row's
context being its previous context, its last turn and an observation. Given a
:class:`~gear_rl.sampling.cache.TurnCache`, :func:`sample_responses` keeps every row's KV cache
when the row leaves the batch and, next call, prefills only what a context adds to a kept row
(the last turn's final token and the observation) instead of the whole episode so far.

Numerics: in fp32 the outputs do not depend on which other rows share a batch. In bf16 on a CPU
they can (matmul rounding varies with the batch shape; ``generate``'s own greedy output for a
prompt changes between batches of 1, 4 and 32 rows), so prefilling each distinct prompt once
draws different tokens for a given seed than prefilling every copy would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from transformers import Cache, DynamicCache, PreTrainedConfig
from transformers.cache_utils import DynamicLayer

from gear_rl.sampling.attention import decode_attention
from gear_rl.sampling.cache import BufferLayer, TurnCache, buffered_cache, stacked_cache

__all__ = ["RowStop", "Samples", "SamplingParams", "continue_sequences", "sample_continuations",
           "sample_next_token", "sample_responses", "stop_token_ids"]


@dataclass(frozen=True)
class SamplingParams:
    """How a sampler call draws its tokens: one record, built where a run's settings are read
    (``gear_rl.train.runtime``: ``rollout.*`` for training and the credit checker,
    ``eval.*`` for evaluation) and passed down whole to :func:`sample_responses` and
    :func:`sample_continuations` (a call that needs another cap or draw mode makes a copy
    with :func:`dataclasses.replace`). The defaults here are the sampler's only ones.

    Attributes:
        max_new_tokens: cap on a response's length (>= 1); a batch decodes until its longest
            row stops.
        stop_ids: end-of-turn token ids (see :func:`stop_token_ids`), stored as a sorted tuple
            without repeats; a row stops at its first one, which stays in its response.
        pad_id: id used for left padding (never attended to).
        temperature: > 0 unless ``greedy``; tokens are drawn from
            ``softmax(logits / temperature)`` (see :func:`sample_next_token`).
        top_p: in (0, 1]: the nucleus mass (1: the full distribution).
        batch_size: decode at most this many rows at once (None: all at once).
        greedy: take the most likely token (``argmax`` of the logits, first index on ties, as
            ``model.generate(do_sample=False)``) instead of sampling; ``temperature``,
            ``top_p`` and the generator are then unused.
        paired_draws: draw every row's uniform numbers for all ``max_new_tokens`` steps
            before decoding (``[rows, max_new_tokens]`` from the generator, one decoding batch
            after another), so that row ``i`` samples with the same numbers whatever the other
            rows generate and whenever they finish (common random numbers for comparing
            models); rows still leave the batch at their stop token. Off (default): one draw
            per live row and step, as in training.
        fast_attention: decode under :func:`~gear_rl.sampling.attention.decode_attention`
            (CPU, ``sdpa`` models; False: transformers' SDPA at every step, e.g. to compare).
    """

    max_new_tokens: int
    stop_ids: Sequence[int]
    pad_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int | None = None
    greedy: bool = False
    paired_draws: bool = False
    fast_attention: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_ids", tuple(sorted({int(s) for s in self.stop_ids})))
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (greedy=True for argmax), got "
                             f"{self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class RowStop:
    """Stop a row once its new tokens satisfy ``done`` (e.g. they hold a complete tool call).

    ``done(ids)`` is called with a row's new tokens so far, only at steps where the row's token
    is in ``trigger`` (a token that can end what ``done`` waits for: a closing tag's last
    character), so that the check costs a decode now and then rather than every step. The row's
    response ends with that token, as with a stop token; it is not marked finished.

    Attributes:
        trigger: ``[V]`` bool over the vocabulary (ids beyond it never trigger).
        done: the predicate over a row's new token ids.
    """

    trigger: torch.Tensor
    done: Callable[[list[int]], bool]


@dataclass
class Samples:
    """Sampled responses for a batch of prompts (what one sampler call returns).

    Attributes:
        prompt_ids: ``B`` prompt token-id lists (as given).
        response_ids: ``B`` response token-id lists; a finished one ends with its stop token.
        finished: ``B`` flags, True where the response ended with a stop token (False: cut at
            ``max_new_tokens``, at the row's budget or by a :class:`RowStop`).
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    finished: list[bool]

    @property
    def num_tokens(self) -> int:
        """Total number of sampled tokens."""
        return sum(len(r) for r in self.response_ids)


def stop_token_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """End-of-turn token ids: the generation config's ``eos_token_id`` (int or list), the
    tokenizer's ``eos_token_id``, and ``<|im_end|>`` / ``<|eot_id|>`` / ``<|endoftext|>`` where
    the vocabulary has them."""
    ids: set[int] = set()

    def add(value: Any) -> None:
        if value is None:
            return
        if isinstance(value, int):
            ids.add(value)
        else:
            ids.update(int(v) for v in value)

    if model is not None and getattr(model, "generation_config", None) is not None:
        add(model.generation_config.eos_token_id)
    add(getattr(tokenizer, "eos_token_id", None))
    vocab = tokenizer.get_vocab()
    for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>"):
        if name in vocab:
            ids.add(int(vocab[name]))
    if not ids:
        raise ValueError("tokenizer/model define no end-of-turn token; pass stop_ids explicitly")
    return sorted(ids)


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    nucleus_topk: int = 64,
    uniform: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sample one token per row from ``softmax(logits / temperature)`` restricted to its top-p
    nucleus (the smallest set of most likely tokens whose mass reaches ``top_p``).

    Args:
        logits: ``[B, V]`` next-token logits (any float dtype; computed in fp32).
        temperature: > 0. ``top_p``: in (0, 1]; 1 samples the full distribution.
        generator: the random stream (on ``logits.device``).
        nucleus_topk: first try to find every row's nucleus inside its top-``nucleus_topk``
            tokens (a cheap ``topk``); rows whose nucleus is larger fall back to a full sort.
        uniform: ``[B]`` uniform numbers in [0, 1) to sample with (inverse CDF), instead of
            drawing them from ``generator``.

    Returns:
        ``[B]`` int64 token ids.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    probs = torch.softmax(scaled, dim=-1)
    batch, vocab = probs.shape
    if top_p >= 1.0:
        candidates, candidate_ids = probs, None
    else:
        k = min(nucleus_topk, vocab)
        candidates, candidate_ids = probs.topk(k, dim=-1)
        if k < vocab and bool((candidates.sum(-1) < top_p).any()):
            candidates, candidate_ids = probs.sort(dim=-1, descending=True)
        # keep a token while the mass strictly before it is below top_p (the crossing token stays)
        mass_before = candidates.cumsum(-1) - candidates
        candidates = candidates * (mass_before < top_p)
    cdf = candidates.cumsum(-1)
    if uniform is None:
        uniform = torch.rand(batch, 1, generator=generator, device=probs.device)
    elif uniform.numel() != batch:
        raise ValueError(f"uniform must hold one number per row ({batch}), got shape "
                         f"{tuple(uniform.shape)}")
    u = uniform.reshape(batch, 1).to(cdf.dtype) * cdf[:, -1:]
    choice = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(-1)
    if candidate_ids is None:
        return choice
    return candidate_ids.gather(-1, choice.unsqueeze(-1)).squeeze(-1)


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Left-padded ``[N, W]`` input ids, their attention mask (``None`` when every prompt has
    length ``W``: no mask is needed then) and the ``[N]`` position of each row's next token."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompts])
    for row, p in enumerate(prompts):
        input_ids[row, width - len(p) :] = torch.tensor(p)
    attention = None
    if bool((lengths < width).any()):
        attention = (torch.arange(width) >= (width - lengths).unsqueeze(-1)).long().to(device)
    return input_ids.to(device), attention, lengths.to(device)


def _decode(
    model: torch.nn.Module,
    cache: Cache,
    logits: torch.Tensor,
    attention: torch.Tensor | None,
    positions: torch.Tensor,
    sampling: SamplingParams,
    *,
    generator: torch.Generator | None,
    budgets: torch.Tensor | None = None,
    row_stop: RowStop | None = None,
    keep: Callable[[int, list[tuple[torch.Tensor, torch.Tensor]]], None] | None = None,
) -> tuple[list[list[int]], list[bool]]:
    """The decoding loop shared by :func:`sample_responses` and :func:`sample_continuations`,
    under :func:`~gear_rl.sampling.attention.decode_attention` (``sampling.fast_attention``).

    Args:
        model: the causal LM that filled ``cache``.
        cache: ``R`` rows of ``W`` cached positions (buffers with room for
            ``sampling.max_new_tokens`` more, see :func:`~gear_rl.sampling.cache.buffered_cache`).
        logits: ``[R, V]`` next-token logits of every row.
        attention: ``[R, W]``, 1 on cached tokens and 0 on left padding; ``None`` when no row is
            padded (then no mask is built at all).
        positions: ``[R]`` position id of each row's next token.
        sampling: how tokens are drawn and when rows stop (its ``batch_size`` and ``pad_id``
            are the caller's business). ``generator``: the random stream.
        budgets: ``[R]`` each row's own cap (<= ``max_new_tokens``; None: all
            ``max_new_tokens``).
        row_stop: stop a row once its new tokens satisfy it (:class:`RowStop`).
        keep: called as a row leaves the batch, with the row's index and its cache (every
            position but its last token's, padding removed): per layer ``(keys, values)``,
            ``[heads, positions, head_dim]`` (the cache must be
            :class:`~gear_rl.sampling.cache.BufferLayer` s).

    Returns:
        ``R`` responses (each ending at its first stop token, at the step ``row_stop`` fired,
        or cut at its budget) and ``R`` finished flags (True where the response ends with a
        stop token).
    """
    max_new_tokens, stops = sampling.max_new_tokens, sampling.stop_ids
    with decode_attention(model, sampling.fast_attention):
        rows, device = logits.shape[0], logits.device
        # One token buffer and (with padding) one mask buffer for the whole loop.
        out = torch.full((rows, max_new_tokens), -1, dtype=torch.long, device=device)
        mask, width = None, 0
        if attention is not None:  # the cache holds `width` positions before the first step
            width = attention.shape[1]
            mask = attention.new_ones(rows, width + max_new_tokens)
            mask[:, :width] = attention
        stop_tensor = torch.tensor(stops, device=device)
        active = torch.arange(rows, device=device)  # the original row of each live batch row
        trigger = None
        if row_stop is not None:
            # padded to the logits' width: ids beyond the vocabulary never fire
            trigger = torch.zeros(logits.shape[-1], dtype=torch.bool, device=device)
            width_v = min(int(row_stop.trigger.numel()), logits.shape[-1])
            trigger[:width_v] = row_stop.trigger[:width_v].to(device)
        last_step = None if budgets is None else (budgets.to(device) - 1)  # a row's final step
        position = positions.reshape(-1, 1)
        # paired: every (row, step) has its own uniform number, drawn before decoding, whichever
        # rows finish early (row-major, so a row's numbers are a fixed stretch of the stream)
        draws = (torch.rand(rows, max_new_tokens, generator=generator, device=device)
                 if sampling.paired_draws and not sampling.greedy else None)

        def save(leaving: torch.Tensor) -> None:  # the rows at these batch indices leave
            layers = cast(list[BufferLayer], cache.layers)
            length = layers[0].length
            for k in leaving.tolist():
                columns = None if mask is None else mask[k, :length].nonzero().squeeze(-1)
                kept_layers = []
                for layer in layers:
                    keys, values = cast(torch.Tensor, layer.keys)[k], cast(torch.Tensor,
                                                                           layer.values)[k]
                    kept_layers.append((keys.clone(), values.clone()) if columns is None
                                       else (keys[:, columns], values[:, columns]))
                cast(Callable, keep)(int(active[k]), kept_layers)

        for step in range(max_new_tokens):
            if sampling.greedy:
                tokens = logits.argmax(-1)
            else:
                tokens = sample_next_token(logits, temperature=sampling.temperature,
                                           top_p=sampling.top_p, generator=generator,
                                           uniform=None if draws is None else draws[active, step])
            out[active, step] = tokens
            if step == max_new_tokens - 1:
                if keep is not None:
                    save(torch.arange(active.numel()))
                break
            done = (tokens.unsqueeze(-1) == stop_tensor).any(-1)
            if last_step is not None:
                done |= last_step[active] <= step
            if trigger is not None:
                fired = trigger[tokens] & ~done
                if bool(fired.any()):  # a row may have completed what row_stop waits for
                    for k in fired.nonzero().squeeze(-1).tolist():
                        row = int(active[k])
                        if cast(RowStop, row_stop).done(out[row, : step + 1].tolist()):
                            done[k] = True
            if bool(done.any()):  # the loop's one host sync per step
                if keep is not None:
                    save(done.nonzero().squeeze(-1))
                kept = (~done).nonzero().squeeze(-1)
                if kept.numel() == 0:
                    break
                cache.batch_select_indices(kept)
                active, tokens, position = active[kept], tokens[kept], position[kept]
                if mask is not None:
                    mask = mask[kept]
            logits = model(
                input_ids=tokens.unsqueeze(-1),
                attention_mask=None if mask is None else mask[:, : width + step + 1],
                position_ids=position + step, past_key_values=cache, use_cache=True,
            ).logits[:, -1]
        stop_set = set(stops)
        responses = [[t for t in row if t >= 0] for row in out.tolist()]
        return responses, [r[-1] in stop_set for r in responses]


@torch.no_grad()
def sample_responses(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingParams,
    *,
    generator: torch.Generator | None = None,
    budgets: Sequence[int] | None = None,
    row_stop: RowStop | None = None,
    turn_cache: TurnCache | None = None,
) -> Samples:
    """Sample one response per prompt with a KV cache, stopping each row at its first stop token.

    Each distinct prompt of a batch is prefilled once and its cache rows are repeated for its
    copies (a group of K samples pays one prefill).

    Args:
        model: a Hugging Face causal LM (its device and dtype are used as they are; the trainer
            passes a bf16 copy of the policy on CPU). Full-attention layers get preallocated
            cache buffers; other layer kinds (sliding windows) keep their own cache layers.
        prompt_ids: ``B`` token-id lists (a prompt repeated K times gives K samples).
        sampling: the cap, stop and padding ids, distribution, decoding batch (the prompts are
            split into chunks of ``sampling.batch_size`` rows) and draw mode
            (:class:`SamplingParams`).
        generator: random stream on the model's device; same generator state -> same samples.
        budgets: ``B`` per-row caps, each in ``[1, sampling.max_new_tokens]`` (None: every row
            ``max_new_tokens``); a row leaves the batch at its cap.
        row_stop: also stop a row once its new tokens satisfy it (:class:`RowStop`; the
            agent loop's "a complete tool call was written").
        turn_cache: reuse the KV caches of an earlier call's rows that a prompt extends and
            keep this call's rows in it (:class:`~gear_rl.sampling.cache.TurnCache`; the
            caller calls its ``advance`` after each call). Ignored for models with other than
            full-attention layers.

    Returns:
        :class:`Samples` with ``B`` responses in the order of ``prompt_ids``.
    """
    prompts = [list(map(int, p)) for p in prompt_ids]
    if not prompts:
        raise ValueError("prompt_ids: needs at least one prompt")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("prompt_ids: every prompt needs at least one token")
    caps = _checked_budgets(budgets, len(prompts), "prompt", sampling.max_new_tokens)
    size = sampling.batch_size or len(prompts)
    responses: list[list[int]] = []
    finished: list[bool] = []
    for start in range(0, len(prompts), size):
        part, done = _sample_batch(model, prompts[start : start + size], sampling, generator,
                                   None if caps is None else caps[start : start + size],
                                   row_stop, turn_cache)
        responses += part
        finished += done
    return Samples(prompt_ids=prompts, response_ids=responses, finished=finished)


def _checked_budgets(budgets: Sequence[int] | None, count: int, per: str,
                     max_new_tokens: int) -> list[int] | None:
    """``budgets`` as ints, one per ``per`` (``count`` of them), each in ``[1,
    max_new_tokens]``; None stays None (every row ``max_new_tokens``)."""
    caps = None if budgets is None else [int(b) for b in budgets]
    if caps is not None and (len(caps) != count
                             or any(not 1 <= b <= max_new_tokens for b in caps)):
        raise ValueError(f"budgets: one per {per} ({count}), each in [1, "
                         f"max_new_tokens={max_new_tokens}]")
    return caps


def _sample_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    sampling: SamplingParams,
    generator: torch.Generator | None,
    caps: list[int] | None,
    row_stop: RowStop | None,
    turn_cache: TurnCache | None,
) -> tuple[list[list[int]], list[bool]]:
    """One decoding batch of :func:`sample_responses` (its arguments, checked): prefill the
    ``N`` prompts (each distinct one once, or what it adds to a row of ``turn_cache``) and
    decode. Returns the ``N`` responses and finished flags."""
    max_new_tokens, pad_id = sampling.max_new_tokens, sampling.pad_id
    device = next(model.parameters()).device
    prefill = DynamicCache(config=cast(PreTrainedConfig, model.config))
    full_attention = all(type(layer) is DynamicLayer for layer in prefill.layers)
    if not full_attention:
        turn_cache = None  # other layer kinds (sliding windows) keep their own cache
    found = [None if turn_cache is None else turn_cache.lookup(p) for p in prompts]
    cache: Cache
    attention: torch.Tensor | None
    if any(hit is not None for hit in found):
        cache, logits, attention, lengths = _prefill_extending(model, prompts, found, pad_id,
                                                               max_new_tokens)
        for prompt, hit in zip(prompts, found, strict=True):  # copied into `cache`: free them
            if hit is not None:
                cast(TurnCache, turn_cache).release(prompt, hit[0])
    else:
        distinct: dict[tuple[int, ...], int] = {}
        source = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        input_ids, attention, lengths = _left_pad([list(p) for p in distinct], pad_id, device)
        positions = None if attention is None else (attention.cumsum(-1) - 1).clamp_(min=0)
        logits = model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions,
            past_key_values=prefill, use_cache=True, logits_to_keep=1,
        ).logits[:, -1]
        rows = None if len(distinct) == len(prompts) else torch.tensor(source, device=device)
        cache = prefill
        if full_attention:
            cache = buffered_cache(prefill,
                                   (lambda t: t) if rows is None else (lambda t: t[rows]),
                                   max_new_tokens)
        elif rows is not None:
            prefill.batch_select_indices(rows)
        if rows is not None:
            logits, lengths = logits[rows], lengths[rows]
            attention = None if attention is None else attention[rows]
    del prefill
    kept: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    responses, finished = _decode(
        model, cache, logits, attention, lengths, sampling, generator=generator,
        budgets=None if caps is None else torch.tensor(caps, device=device), row_stop=row_stop,
        keep=None if turn_cache is None else kept.__setitem__,
    )
    if turn_cache is not None:
        for row, layers in kept.items():
            turn_cache.add(prompts[row] + responses[row], layers)
    return responses, finished


def _prefill_extending(
    model: torch.nn.Module,
    prompts: list[list[int]],
    found: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None],
    pad_id: int,
    extra: int,
) -> tuple[Cache, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill ``B`` prompts of which some extend rows kept in a :class:`TurnCache`
    (``found[i] = (length, layers)``: the first ``length`` positions are cached) and the others
    (None) are prefilled whole. Each distinct (kept row, rest) pair is computed once.

    Layout of distinct row ``d`` in the ``W + N`` columns (``W``: the longest cached part,
    ``N``: the longest rest): its cached positions right-aligned in the first ``W`` columns,
    its rest right-aligned in the last ``N`` (input ids left-padded), at position ids
    ``length, length + 1, ...``; padding columns are masked. Returns the cache (buffers with
    room for ``extra`` more positions, rows repeated for copies), the ``[B, V]`` last logits,
    the ``[B, W + N]`` attention mask and the ``[B]`` next positions."""
    device = next(model.parameters()).device
    distinct: dict[tuple[int, int, tuple[int, ...]], int] = {}
    items: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None, list[int]]] = []
    source = []
    for prompt, hit in zip(prompts, found, strict=True):
        length, layers = (0, None) if hit is None else hit
        key = (length, id(layers), tuple(prompt[length:]))
        if key not in distinct:
            distinct[key] = len(items)
            items.append((length, layers, prompt[length:]))
        source.append(distinct[key])
    width = max(length for length, _, _ in items)
    input_ids, rest_mask, rest_lengths = _left_pad([rest for _, _, rest in items], pad_id, device)
    span = input_ids.shape[1]
    template = next(layers for _, layers, _ in items if layers is not None)
    count = len(items)
    buffers = []
    for index, (keys0, values0) in enumerate(template):
        keys = keys0.new_zeros(count, keys0.shape[0], width, keys0.shape[-1])
        values = values0.new_zeros(count, values0.shape[0], width, values0.shape[-1])
        for d, (length, layers, _) in enumerate(items):
            if layers is not None:
                keys[d, :, width - length:] = layers[index][0]
                values[d, :, width - length:] = layers[index][1]
        buffers.append(BufferLayer(keys, values, width + span + extra))
    cache = Cache(layers=cast(Any, buffers))
    cached = torch.tensor([length for length, _, _ in items], device=device)
    if rest_mask is None:
        rest_mask = torch.ones_like(input_ids)
    attention = torch.cat([(torch.arange(width, device=device)
                            >= (width - cached).unsqueeze(-1)).long(), rest_mask], dim=-1)
    positions = cached.unsqueeze(-1) + (rest_mask.cumsum(-1) - 1).clamp_(min=0)
    logits = model(
        input_ids=input_ids, attention_mask=attention, position_ids=positions,
        past_key_values=cache, use_cache=True, logits_to_keep=1,
    ).logits[:, -1]
    lengths = cached + rest_lengths
    if len(items) == len(prompts):
        return cache, logits, attention, lengths
    rows = torch.tensor(source, device=device)
    cache.batch_select_indices(rows)
    return cache, logits[rows], attention[rows], lengths[rows]


@torch.no_grad()
def sample_continuations(
    model: torch.nn.Module,
    prefix_ids: Sequence[int],
    cuts: Sequence[int],
    samples: int,
    sampling: SamplingParams,
    *,
    generator: torch.Generator | None = None,
    budgets: Sequence[int] | None = None,
) -> list[Samples]:
    """Sample ``samples`` continuations of each prefix ``prefix_ids[:c]``, ``c`` in ``cuts``,
    from one forward pass over ``prefix_ids``: :func:`continue_sequences` of one sequence.

    Args:
        model: a Hugging Face causal LM with full-attention layers.
        prefix_ids: one token sequence of length ``L`` (e.g. prompt + sampled response).
        cuts: prefix lengths, each in ``[1, L]`` (repeats allowed).
        samples, sampling, generator, budgets: as in :func:`continue_sequences`.

    Returns:
        One :class:`Samples` per cut, in the order of ``cuts``.
    """
    if not prefix_ids:
        raise ValueError("prefix_ids: needs at least one token")
    return continue_sequences(model, [prefix_ids], [(0, int(c)) for c in cuts], samples,
                              sampling, generator=generator, budgets=budgets)


@torch.no_grad()
def continue_sequences(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    cuts: Sequence[tuple[int, int]],
    samples: int,
    sampling: SamplingParams,
    *,
    generator: torch.Generator | None = None,
    budgets: Sequence[int] | None = None,
) -> list[Samples]:
    """Sample ``samples`` continuations of each prefix ``sequences[s][:c]``, ``(s, c)`` in
    ``cuts``, from one forward pass over each sequence that a cut reads.

    Each sequence's KV cache is computed once; the rows of cut ``(s, c)`` start from the first
    ``c`` positions of sequence ``s`` (repeated ``samples`` times, no re-prefill) and from the
    logits at position ``c - 1``, which causal attention makes those of the prefix alone. Rows
    of different cuts, of one sequence or of several, decode together, their caches
    left-padded to the longest cut of the batch and masked. Sampling, stopping and determinism
    are those of :func:`sample_responses`.

    Args:
        model: a Hugging Face causal LM with full-attention layers.
        sequences: ``S`` token sequences (e.g. prompt + sampled response of each trajectory).
        cuts: ``(sequence index, prefix length)`` pairs, the length in ``[1, len(sequence)]``
            (repeats allowed).
        samples: continuations per cut (>= 1).
        sampling: as in :func:`sample_responses`; its ``batch_size`` counts rows
            (continuations), ``len(cuts) * samples`` in all, taken cut by cut in the order of
            ``cuts``, so a batch spans several cuts (a caller that orders its cuts by length
            keeps each batch's padding small). Its ``pad_id`` is never fed (padding lives in
            the cache and is masked).
        generator: as in :func:`sample_responses`.
        budgets: per cut, the most tokens its continuations may have, each in
            ``[1, sampling.max_new_tokens]`` (None: every cut ``max_new_tokens``); a row leaves
            the batch at its cut's budget.

    Returns:
        One :class:`Samples` per cut, in the order of ``cuts``: ``prompt_ids`` holds
        ``samples`` copies of the prefix, ``response_ids`` its continuations.
    """
    seqs = [[int(t) for t in s] for s in sequences]
    cut_list = [(int(s), int(c)) for s, c in cuts]
    if not cut_list:
        raise ValueError("cuts: needs at least one cut")
    bad_seq = [s for s, _ in cut_list if not 0 <= s < len(seqs)]
    if bad_seq:
        raise ValueError(f"cuts name sequences {sorted(set(bad_seq))[:5]}, but there are "
                         f"{len(seqs)}")
    bad = [c for s, c in cut_list if not 1 <= c <= len(seqs[s])]
    if bad:
        lengths_of = sorted({len(seqs[s]) for s, _ in cut_list})
        span = (f"[1, {lengths_of[0]}]" if len(lengths_of) == 1
                else "[1, the sequence's length]")
        raise ValueError(f"cuts must be in {span} (the prefix length), got {bad[:5]}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    caps = _checked_budgets(budgets, len(cut_list), "cut", sampling.max_new_tokens)
    device = next(model.parameters()).device
    used = sorted({s for s, _ in cut_list})
    index_of = {s: i for i, s in enumerate(used)}  # the sequence's row in the stacked cache
    caches: list[Cache] = []
    logit_row: dict[tuple[int, int], int] = {}
    cut_logits = []
    for s in used:
        prefill = DynamicCache(config=cast(PreTrainedConfig, model.config))
        distinct = sorted({c for t, c in cut_list if t == s})
        keep = torch.tensor([c - 1 for c in distinct], device=device)
        cut_logits.append(model(  # [len(distinct), V]: the logits after each distinct cut
            input_ids=torch.tensor([seqs[s]], device=device), past_key_values=prefill,
            use_cache=True, logits_to_keep=keep,
        ).logits[0])
        logit_row.update({(s, c): len(logit_row) + i for i, c in enumerate(distinct)})
        caches.append(prefill)
    every_logit = torch.cat(cut_logits)
    full = stacked_cache(caches)
    del caches, cut_logits
    row_cuts = [cut for cut in cut_list for _ in range(samples)]  # cut by cut, in order
    row_caps = None if caps is None else [b for b in caps for _ in range(samples)]
    chunk = sampling.batch_size or len(row_cuts)
    responses: list[list[int]] = []
    finished: list[bool] = []
    for start in range(0, len(row_cuts), chunk):
        part = row_cuts[start : start + chunk]
        lengths = torch.tensor([c for _, c in part], device=device)
        rows = torch.tensor([index_of[s] for s, _ in part], device=device)
        width = int(lengths.max())
        # row r's cache holds positions 0..c_r-1 of its sequence, right-aligned in `width`
        # columns; the columns before it repeat position 0 (finite values, masked out)
        column = torch.arange(width, device=device)
        offset = (width - lengths).unsqueeze(-1)
        source = (column - offset).clamp_(min=0)  # [R, W] position read into each column

        def take(t: torch.Tensor, rows: torch.Tensor = rows, source: torch.Tensor = source
                 ) -> torch.Tensor:  # [S, H, L, D] -> [R, H, W, D]
            return t.transpose(1, 2)[rows.unsqueeze(-1), source].transpose(1, 2)

        call = sampling
        part_caps = None
        if row_caps is not None:
            part_caps = row_caps[start : start + chunk]
            call = replace(sampling, max_new_tokens=max(part_caps))
        cache = buffered_cache(full, take, call.max_new_tokens)
        attention = None
        if bool((lengths < width).any()):
            attention = (column >= offset).long()
        logits = every_logit[torch.tensor([logit_row[cut] for cut in part], device=device)]
        got, done = _decode(model, cache, logits, attention, lengths, call, generator=generator,
                            budgets=None if part_caps is None
                            else torch.tensor(part_caps, device=device))
        responses += got
        finished += done
    return [
        Samples(prompt_ids=[seqs[s][:c] for _ in range(samples)],
                response_ids=responses[i * samples : (i + 1) * samples],
                finished=finished[i * samples : (i + 1) * samples])
        for i, (s, c) in enumerate(cut_list)
    ]
