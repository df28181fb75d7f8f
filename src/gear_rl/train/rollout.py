"""Batched sampling with a KV cache: the trainer's rollout engine.

A short hand-written loop over the model's own forward (HF ``DynamicCache``), not
``model.generate``: on a CPU the per-step overhead of ``generate`` (logits processors, stopping
criteria, a full-vocabulary multinomial) costs more than the 135M-parameter model's forward. Here:

- prompts are left-padded so every row's next token sits in the last column;
- sampling is exact categorical sampling by inverse CDF (one ``cumsum`` and a ``searchsorted``;
  ``torch.multinomial`` over 49k logits is ~30x slower on CPU), restricted to the top-p nucleus
  found through ``topk`` when the nucleus is small (the usual case) and a full sort otherwise;
- a row stops at its first stop token (end of turn), which is kept in its response (the policy
  learns to stop); finished rows are dropped from the batch and the cache, so a batch does not
  pay for its longest answer on every row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedConfig

__all__ = ["Rollout", "sample_next_token", "sample_responses", "stop_token_ids"]


@dataclass
class Rollout:
    """Sampled responses for a batch of prompts.

    Attributes:
        prompt_ids: ``B`` prompt token-id lists (as given).
        response_ids: ``B`` response token-id lists; a finished one ends with its stop token.
        finished: ``B`` flags, True where the response ended with a stop token (False: cut at
            ``max_new_tokens``).
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
) -> torch.Tensor:
    """Sample one token per row from ``softmax(logits / temperature)`` restricted to its top-p
    nucleus (the smallest set of most likely tokens whose mass reaches ``top_p``).

    Args:
        logits: ``[B, V]`` next-token logits (any float dtype; computed in fp32).
        temperature: > 0. ``top_p``: in (0, 1]; 1 samples the full distribution.
        generator: the random stream (on ``logits.device``).
        nucleus_topk: first try to find every row's nucleus inside its top-``nucleus_topk``
            tokens (a cheap ``topk``); rows whose nucleus is larger fall back to a full sort.

    Returns:
        ``[B]`` int64 token ids.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
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
    u = torch.rand(batch, 1, generator=generator, device=probs.device) * cdf[:, -1:]
    choice = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(-1)
    if candidate_ids is None:
        return choice
    return candidate_ids.gather(-1, choice.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def sample_responses(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    batch_size: int | None = None,
) -> Rollout:
    """Sample one response per prompt with a KV cache, stopping each row at its first stop token.

    Args:
        model: a Hugging Face causal LM (its device and dtype are used as they are; the trainer
            passes a bf16 copy of the policy on CPU).
        prompt_ids: ``B`` token-id lists (a prompt repeated K times gives K samples).
        max_new_tokens: cap on response length.
        stop_ids: end-of-turn token ids (see ``stop_token_ids``).
        pad_id: id used for left padding (never attended to).
        temperature, top_p: sampling distribution (see ``sample_next_token``).
        generator: random stream on the model's device; same generator state -> same samples.
        batch_size: split the prompts into chunks of this many rows (None: one batch).

    Returns:
        ``Rollout`` with ``B`` responses in the order of ``prompt_ids``.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompts = [list(map(int, p)) for p in prompt_ids]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("prompt_ids: every prompt needs at least one token")
    stops = sorted(set(int(s) for s in stop_ids))
    if batch_size is not None and batch_size < len(prompts):
        parts = [
            sample_responses(
                model, prompts[i : i + batch_size], max_new_tokens=max_new_tokens,
                stop_ids=stops, pad_id=pad_id, temperature=temperature, top_p=top_p,
                generator=generator,
            )
            for i in range(0, len(prompts), batch_size)
        ]
        return Rollout(
            prompt_ids=prompts,
            response_ids=[r for p in parts for r in p.response_ids],
            finished=[f for p in parts for f in p.finished],
        )
    device = next(model.parameters()).device
    batch = len(prompts)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    for row, p in enumerate(prompts):
        input_ids[row, width - len(p) :] = torch.tensor(p)
        attention[row, width - len(p) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp_(min=0)
    stop_tensor = torch.tensor(stops, device=device)

    cache = DynamicCache(config=cast(PreTrainedConfig, model.config))
    responses: list[list[int]] = [[] for _ in range(batch)]
    finished = [False] * batch
    active = torch.arange(batch, device=device)  # original row of each live batch row
    logits = model(
        input_ids=input_ids, attention_mask=attention, position_ids=positions,
        past_key_values=cache, use_cache=True, logits_to_keep=1,
    ).logits[:, -1]
    next_position = positions[:, -1:] + 1
    for step in range(max_new_tokens):
        tokens = sample_next_token(logits, temperature=temperature, top_p=top_p,
                                   generator=generator)
        done = torch.isin(tokens, stop_tensor)
        for row, token, stop in zip(active.tolist(), tokens.tolist(), done.tolist(),
                                    strict=True):
            responses[row].append(token)
            finished[row] = stop
        if step == max_new_tokens - 1:
            break
        keep = ~done
        if not bool(keep.any()):
            break
        if not bool(keep.all()):
            kept = keep.nonzero().squeeze(-1)
            cache.batch_select_indices(kept)
            active, tokens = active[kept], tokens[kept]
            attention, next_position = attention[kept], next_position[kept]
        attention = torch.cat([attention, attention.new_ones(attention.shape[0], 1)], dim=-1)
        logits = model(
            input_ids=tokens.unsqueeze(-1), attention_mask=attention, position_ids=next_position,
            past_key_values=cache, use_cache=True,
        ).logits[:, -1]
        next_position = next_position + 1
    return Rollout(prompt_ids=prompts, response_ids=responses, finished=finished)
