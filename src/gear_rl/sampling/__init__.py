"""The KV-cache sampler: batched sampling from a Hugging Face causal LM, knowing nothing of
training (the trainer's rollout, the held-out evaluation, the credit checker and the agent and
environment loops all sample through it).

- :mod:`gear_rl.sampling.sampler`: :class:`SamplingParams` (how a call samples: cap, stop and
  padding ids, temperature, top-p, decoding batch, greedy, paired draws, fast attention),
  :func:`sample_responses` (one response per prompt), :func:`continue_sequences` (many
  continuations of prefixes of several sequences, one forward per sequence) and its
  one-sequence form :func:`sample_continuations`, :func:`sample_next_token`,
  :func:`stop_token_ids`, :class:`RowStop` and the result :class:`Samples`;
- :mod:`gear_rl.sampling.cache`: the in-place KV buffers and :class:`TurnCache` (a multi-turn
  episode's rows kept from one turn's call for the next);
- :mod:`gear_rl.sampling.attention`: the CPU decode attention, registered with transformers
  when this package is imported (:func:`decode_attention`).
"""

from gear_rl.sampling.attention import DECODE_ATTENTION, decode_attention
from gear_rl.sampling.cache import TurnCache
from gear_rl.sampling.sampler import (
    RowStop,
    Samples,
    SamplingParams,
    continue_sequences,
    sample_continuations,
    sample_next_token,
    sample_responses,
    stop_token_ids,
)

__all__ = [
    "DECODE_ATTENTION",
    "RowStop",
    "Samples",
    "SamplingParams",
    "TurnCache",
    "continue_sequences",
    "decode_attention",
    "sample_continuations",
    "sample_next_token",
    "sample_responses",
    "stop_token_ids",
]
