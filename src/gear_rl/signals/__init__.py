"""Per-token signals from a causal LM for GEAR (arXiv 2605.11853) and the token-level baselines.

``token_signals(model, prompt_ids, teacher_prompt_ids, response_ids, ...)`` returns
:class:`TokenSignals` (student/teacher log-probs, entropy, reverse KL, mask; each ``[B, T]``),
computed chunk by chunk over the LM head; ``response_logprobs`` is its one-prompt half (policy
log-probs and entropy, e.g. for the policy loss). ``teacher.py`` builds the ground-truth-conditioned
teacher prompts.
"""

from gear_rl.signals.divergence import (
    DIVERGENCE_KINDS,
    ResponseScores,
    TokenSignals,
    backbone_tokens,
    default_chunk_size,
    response_logprobs,
    token_signals,
)
from gear_rl.signals.teacher import (
    TeacherPromptConfig,
    build_prompt_pairs,
    prompt_ids,
    teacher_messages,
    teacher_prompt_ids,
)

__all__ = [
    "DIVERGENCE_KINDS",
    "ResponseScores",
    "TeacherPromptConfig",
    "TokenSignals",
    "backbone_tokens",
    "build_prompt_pairs",
    "default_chunk_size",
    "prompt_ids",
    "response_logprobs",
    "teacher_messages",
    "teacher_prompt_ids",
    "token_signals",
]
