"""Policy loading: the bundled SmolLM2-135M-Instruct, tiny random models, any local HF directory.

``load_policy(name_or_path, dtype=..., device=...) -> (model, tokenizer)`` is the entry point;
``tiny_random_model`` / ``build_tiny_tokenizer`` build the test models directly.
"""

from gear_rl.models.loading import KNOWN_NAMES, load_policy
from gear_rl.models.smollm2 import cache_root, ensure_smollm2, smollm2_gguf_path
from gear_rl.models.tiny import (
    CHATML_TEMPLATE,
    SMOLLM2_135M_SHAPE,
    build_tiny_tokenizer,
    tiny_random_model,
)

__all__ = [
    "CHATML_TEMPLATE",
    "KNOWN_NAMES",
    "SMOLLM2_135M_SHAPE",
    "build_tiny_tokenizer",
    "cache_root",
    "ensure_smollm2",
    "load_policy",
    "smollm2_gguf_path",
    "tiny_random_model",
]
