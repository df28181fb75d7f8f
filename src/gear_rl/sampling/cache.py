"""The sampler's KV caches: per-layer buffers written in place (:class:`BufferLayer`) and the
rows kept from one sampling call for the next turn of a multi-turn episode (:class:`TurnCache`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from transformers import Cache
from transformers.cache_utils import DynamicLayer

__all__ = ["BufferLayer", "TurnCache", "buffered_cache", "stacked_cache"]


class BufferLayer(DynamicLayer):
    """A full-attention cache layer that writes each step's keys and values in place into a
    buffer allocated once (``[R, heads, capacity, head_dim]``), instead of ``DynamicLayer``'s
    ``torch.cat`` of the whole cache on every step. ``keys`` / ``values`` are views of the
    filled part, ``[R, heads, length, head_dim]``, as the attention expects."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._fill(keys, values, capacity)

    def _fill(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        rows, heads, length, dim = keys.shape
        if capacity < length:
            raise ValueError(f"capacity {capacity} < cached length {length}")
        self._key_buffer = keys.new_empty(rows, heads, capacity, dim)
        self._value_buffer = values.new_empty(rows, heads, capacity, values.shape[-1])
        self._key_buffer[:, :, :length] = keys
        self._value_buffer[:, :, :length] = values
        self.length = length
        self.keys = self._key_buffer[:, :, :length]
        self.values = self._value_buffer[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self._key_buffer.shape[2]:
            raise RuntimeError(f"KV buffer full: {end} > {self._key_buffer.shape[2]} positions")
        self._key_buffer[:, :, start:end] = key_states
        self._value_buffer[:, :, start:end] = value_states
        self.length = end
        keys, values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        self.keys, self.values = keys, values
        return keys, values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        # only the filled part is copied; the new buffers keep the capacity
        length = self.length
        self._fill(self._key_buffer[indices, :, :length], self._value_buffer[indices, :, :length],
                   self._key_buffer.shape[2])


def buffered_cache(cache: Cache, take: Callable[[torch.Tensor], torch.Tensor],
                   extra: int) -> Cache:
    """A new cache holding ``take(keys)`` / ``take(values)`` of every layer of ``cache`` (rows
    selected, repeated or cut), in buffers with room for ``extra`` more positions.

    Raises ValueError for a cache with other than full-attention layers (sliding windows, linear
    attention), whose stored positions are not the sequence's."""
    layers = []
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(f"unsupported KV-cache layer {type(layer).__name__}: the sampler "
                             "needs full-attention layers (no sliding window)")
        keys, values = take(cast(torch.Tensor, layer.keys)), take(cast(torch.Tensor, layer.values))
        layers.append(BufferLayer(keys, values, keys.shape[2] + extra))
    return Cache(layers=cast(Any, layers))


def stacked_cache(caches: Sequence[Cache]) -> Cache:
    """One cache whose row ``s`` is the single row of ``caches[s]``, every layer right-padded
    with zeros to the longest (``[S, heads, longest, head_dim]``): the padding sits after each
    row's own positions, so a row read up to its own length is the row as it was.

    Raises ValueError for a cache with other than full-attention layers, or of other than one
    row."""
    stacked: list[DynamicLayer] = []
    for parts in zip(*(c.layers for c in caches), strict=True):
        if any(type(layer) is not DynamicLayer for layer in parts):
            raise ValueError("stacked_cache: full-attention layers only (no sliding window)")
        keys = [cast(torch.Tensor, layer.keys) for layer in parts]
        values = [cast(torch.Tensor, layer.values) for layer in parts]
        if any(k.shape[0] != 1 for k in keys):
            raise ValueError("stacked_cache: every cache must hold one row")
        longest = max(k.shape[2] for k in keys)
        layer = DynamicLayer()
        layer.update(torch.cat([torch.nn.functional.pad(k, (0, 0, 0, longest - k.shape[2]))
                                for k in keys]),
                     torch.cat([torch.nn.functional.pad(v, (0, 0, 0, longest - v.shape[2]))
                                for v in values]))
        stacked.append(layer)
    return Cache(layers=cast(Any, stacked))


class TurnCache:
    """The KV caches of one sampling call's rows, kept for the next call (a multi-turn episode's
    next turn), so that a context that extends a kept row is prefilled only from where the row
    ended.

    An entry is keyed by its row's whole token sequence, context and response; it holds the
    keys and values of every full-attention layer for all but the response's last token (that
    token was sampled, never fed), compacted to the row's real positions:
    ``[heads, length, head_dim]`` per layer, with ``length = len(key) - 1``. A context matches
    an entry whose key is a prefix of it (the longest such), and then only ``context[length:]``
    is prefilled, at positions ``length, length + 1, ...``: the positions a full prefill gives
    those tokens, with the same cached keys before them. A context that extends no entry (a
    first turn, a resumed episode, a turn the loop cut) is prefilled whole.

    Entries live for one call: :meth:`advance` (the caller's, after each call) makes the call's
    rows the ones the next call can extend and drops the rest, and an entry is dropped as soon
    as a batch has copied it. Memory: about ``2 * layers * kv_heads * head_dim`` numbers per
    kept token (SmolLM2-135M in bf16: 23 KB) for each kept row. ``max_rows`` bounds how many
    rows are kept at once (those of the last call not yet copied and those of this call); a
    row that does not fit is not kept, and its next context is prefilled whole. Without it a
    call decoding its rows in chunks (``batch_size``) would keep every row's cache, not one
    chunk's: an evaluation of 128 tool-math episodes holds about 1.3 GB of kept rows.
    """

    def __init__(self, max_rows: int | None = None) -> None:
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be at least 1 or None, got {max_rows}")
        self.max_rows = max_rows
        self._previous: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._lengths: list[int] = []
        self._current: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.hits = 0  # contexts that extended a kept row, over the cache's life
        self.reused_tokens = 0  # positions read from kept rows instead of prefilled

    def lookup(self, context: Sequence[int]) -> tuple[int, list[tuple[torch.Tensor,
                                                                     torch.Tensor]]] | None:
        """The longest kept row whose sequence is a prefix of ``context``: ``(length, layers)``
        (``length`` cached positions, ``layers`` their keys and values per layer), or None."""
        for size in self._lengths:  # longest first
            if size <= len(context):
                entry = self._previous.get(tuple(context[:size]))
                if entry is not None:
                    return size - 1, entry
        return None

    def add(self, sequence: Sequence[int], layers: list[tuple[torch.Tensor, torch.Tensor]]
            ) -> None:
        """Keep a row of this call: ``sequence`` its context and response, ``layers`` the keys
        and values (``[heads, len(sequence) - 1, head_dim]``) of every layer; not kept when
        ``max_rows`` rows are kept already."""
        if self.max_rows is not None and self.kept_rows >= self.max_rows:
            return
        self._current[tuple(sequence)] = layers

    @property
    def kept_rows(self) -> int:
        """Rows kept now: the last call's not yet copied and this call's."""
        return len(self._previous) + len(self._current)

    def release(self, context: Sequence[int], length: int) -> None:
        """Count a hit and drop the kept row whose ``length`` cached positions ``context`` was
        found to extend (its keys and values were copied into a batch and are not needed
        again)."""
        self.hits += 1
        self.reused_tokens += length
        self._previous.pop(tuple(context[:length + 1]), None)

    def advance(self) -> None:
        """End a call: its rows become the ones the next call's contexts can extend."""
        self._previous, self._current = self._current, {}
        self._lengths = sorted({len(k) for k in self._previous}, reverse=True)

    def clear(self) -> None:
        """Drop every kept row."""
        self._previous, self._current, self._lengths = {}, {}, []
