"""Tiny, randomly initialised causal LMs and an in-process tokenizer, for tests and smoke runs.

Nothing here touches the network: the tokenizer is a byte-level BPE without merges (every byte is
one token, so any text round-trips) plus ChatML special tokens and a ChatML chat template; the
models are built from a transformers config and initialised from a fixed seed.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

TinyArch = Literal["llama", "qwen2", "qwen3"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML, the format SmolLM2 and Qwen use (without their default system prompts)."""

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

SMOLLM2_135M_SHAPE: dict[str, Any] = dict(
    vocab_size=49_152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
    intermediate_size=1536, max_position_embeddings=8192, tie_word_embeddings=True,
)
"""SmolLM2-135M's architecture as :func:`tiny_random_model` arguments (its config.json: a
Llama of 30 layers, 134.5M parameters with the tied embedding): a model of its shape with random
weights, built in place where its weights cannot travel (the GPU device check)."""


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with 259 tokens: the 256 byte symbols, then ``<|endoftext|>`` (pad),
    ``<|im_start|>`` and ``<|im_end|>`` (eos), with a ChatML chat template.

    Deterministic (no training, no seed), built in a few milliseconds, and lossless on any UTF-8
    text, so decoded samples read exactly as generated.
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="right",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_random_model(
    arch: TinyArch = "llama",
    *,
    vocab_size: int = 259,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    initializer_range: float = 0.02,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> PreTrainedModel:
    """A randomly initialised Llama, Qwen2 or Qwen3 causal LM, identical for identical arguments.

    ``vocab_size`` may exceed the tokenizer's (real models often pad their vocabulary); the
    default matches :func:`build_tiny_tokenizer`. A larger ``initializer_range`` gives sharper,
    less uniform next-token distributions. The global torch RNG state is left as it was.
    The model is returned in eval mode.
    """
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads})"
        )
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=258 if vocab_size > 258 else None,  # <|im_end|> in build_tiny_tokenizer
        pad_token_id=256 if vocab_size > 256 else None,  # <|endoftext|>
    )
    config: PreTrainedConfig
    cls: type[PreTrainedModel]
    if arch == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif arch == "qwen3":
        config = Qwen3Config(**common, head_dim=hidden_size // num_heads)
        cls = Qwen3ForCausalLM
    else:
        raise ValueError(f"arch must be 'llama', 'qwen2' or 'qwen3', got {arch!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    # typeshed's functools.wraps types PreTrainedModel.to (@wraps(Module.to)) as unbound
    return model.to(device=device, dtype=dtype).eval()  # type: ignore[call-arg]
