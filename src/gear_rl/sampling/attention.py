"""The sampler's CPU decode attention, registered with transformers at import.

On a CPU, a decoding step's attention (one query per row) is two batched matmuls and a softmax
in fp32, the query heads of each key-value head grouped against its keys
(:func:`_decode_attention_forward`), instead of ``scaled_dot_product_attention``: with a padding
mask the latter repeats the grouped keys and values for every query head and takes a path
several times slower for a single query (the step's attention dominated long multi-turn
contexts). :func:`decode_attention` switches a model to it for the decoding loop only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = ["DECODE_ATTENTION", "decode_attention"]

DECODE_ATTENTION = "gear_rl_decode"
"""The attention implementation name :func:`decode_attention` registers with transformers."""

_PLAIN_ONLY = ("sliding_window", "softcap", "s_aux", "sinks")  # kwargs the fast path refuses


def _decode_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor, attention_mask: torch.Tensor | None,
                              dropout: float = 0.0, scaling: float | None = None,
                              is_causal: bool | None = None, **kwargs: Any
                              ) -> tuple[torch.Tensor, None]:
    """Attention of one query per row against its cached keys (a decoding step), on a CPU.

    Shapes: ``query`` ``[R, H, 1, D]``, ``key`` / ``value`` ``[R, G, L, D]`` (``G`` key-value
    heads, ``H = G * n``), ``attention_mask`` None or ``[R, 1, 1, L]`` (bool, True where
    attended, or additive float); returns ``[R, 1, H, D]`` like transformers' SDPA path. The
    ``n`` query heads sharing a key-value head are one ``[n, D] x [D, L]`` matmul, in fp32
    (scores, softmax and the weighted sum), then cast back to the query's dtype. Anything
    else (more than one query, gradients, dropout, a sliding window, soft-capping, sinks, a
    mask of another length, another device) goes to transformers' SDPA function unchanged."""
    rows, heads, queries, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    mask = attention_mask
    if (queries != 1 or query.device.type != "cpu" or dropout or torch.is_grad_enabled()
            or heads % kv_heads or any(kwargs.get(name) is not None for name in _PLAIN_ONLY)
            or (mask is not None and (mask.dim() != 4 or mask.shape[-1] != length
                                      or mask.shape[-2] != 1))):
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, is_causal=is_causal,
                                      **kwargs)
    group = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    q = query.reshape(rows, kv_heads, group, dim).float()
    scores = torch.matmul(q, key.float().transpose(-1, -2)).mul_(scale)  # [R, G, n, L]
    if mask is not None:
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask.float())
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, value.float())  # [R, G, n, D]
    return out.to(query.dtype).reshape(rows, 1, heads, dim), None


AttentionInterface.register(DECODE_ATTENTION, _decode_attention_forward)
AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)


@contextlib.contextmanager
def decode_attention(model: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, a model that uses transformers' ``sdpa`` attention on a CPU decodes
    with :func:`_decode_attention_forward` (its config's attention implementation is switched
    and restored on exit; every other forward of such a model goes to SDPA as before). Other
    models, devices and implementations are left alone."""
    config = getattr(model, "config", None)
    device = next(model.parameters()).device
    if (not enabled or config is None or device.type != "cpu"
            or getattr(config, "_attn_implementation", None) != "sdpa"):
        yield
        return
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
