"""Ground-truth-conditioned teacher prompts for GEAR's self-distillation signal.

GEAR (Granularity-adaptivE Advantage Reweighting), arXiv 2605.11853: the "teacher" is the same
model as the student, shown the task's reference (a final answer, a full solution, or a gold tool
call) in its prompt. Scoring the student's own response under both prompts gives the per-token
divergence GEAR reweights the advantage with.

The reference goes into a clearly delimited block ahead of the assistant turn. With a chat
template the block is added to the conversation (end of the last user message by default) and the
prompt is rendered through the template, exactly as the student's prompt is. The response token
ids are never re-tokenised: :func:`gear_rl.signals.token_signals` takes them separately, so they
stay identical and aligned under both prompts.

The default wording shows the reference as privileged information and asks the model to reason on
its own, so that the teacher's distribution stays close to the student's where the student is
already right and moves where the reference changes what should come next (copying the reference
verbatim would make every token look divergent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

ReferenceKind = Literal["answer", "solution", "tool_call"]
Placement = Literal["user_end", "new_user_turn", "system"]
Prompt = str | Sequence[Mapping[str, Any]]

REFERENCE_KINDS: tuple[str, ...] = ("answer", "solution", "tool_call")
PLACEMENTS: tuple[str, ...] = ("user_end", "new_user_turn", "system")

DEFAULT_ANSWER_TEMPLATE = (
    "\n\n=== Reference (for checking only) ===\n"
    "The correct final answer is: {reference}\n"
    "=== End of reference ===\n"
    "Do not just state this answer. Solve the problem yourself, step by step, in your own words, "
    "and give your final answer as you normally would."
)
DEFAULT_SOLUTION_TEMPLATE = (
    "\n\n=== Reference solution (for checking only) ===\n"
    "{reference}\n"
    "=== End of reference solution ===\n"
    "Do not copy or paraphrase the reference. Solve the problem yourself, step by step, in your "
    "own words, and give your final answer as you normally would."
)
DEFAULT_TOOL_CALL_TEMPLATE = (
    "\n\n=== Reference tool call (for checking only) ===\n"
    "{reference}\n"
    "=== End of reference tool call ===\n"
    "Do not just copy it. Decide for yourself which tool to call and with which arguments, and "
    "respond in your usual format."
)


@dataclass(frozen=True)
class TeacherPromptConfig:
    """How the reference is shown to the teacher.

    Attributes:
        placement: where the reference block goes in a chat prompt. ``"user_end"`` appends it to
            the last user message (default); ``"new_user_turn"`` adds a user message after the
            last message of the prompt; ``"system"`` appends it to the system message, or adds a
            system message first when there is none (note: this replaces a default system prompt
            the chat template would otherwise insert, so it changes more than the hint).
            Plain-text prompts always get the block appended at their end.
        answer_template: text for ``kind="answer"``; must contain ``{reference}``.
        solution_template: text for ``kind="solution"``; must contain ``{reference}``.
        tool_call_template: text for ``kind="tool_call"``; must contain ``{reference}``.
    """

    placement: Placement = "user_end"
    answer_template: str = DEFAULT_ANSWER_TEMPLATE
    solution_template: str = DEFAULT_SOLUTION_TEMPLATE
    tool_call_template: str = DEFAULT_TOOL_CALL_TEMPLATE

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        for name in ("answer_template", "solution_template", "tool_call_template"):
            template = getattr(self, name)
            if not isinstance(template, str) or "{reference}" not in template:
                raise ValueError(f"{name} must be a str containing '{{reference}}'")

    def hint(self, reference: str, kind: ReferenceKind = "answer") -> str:
        """The reference block for ``reference`` of the given ``kind``."""
        if kind not in REFERENCE_KINDS:
            raise ValueError(f"kind must be one of {REFERENCE_KINDS}, got {kind!r}")
        if not isinstance(reference, str) or not reference.strip():
            raise ValueError("reference must be a non-empty str")
        template = getattr(self, f"{kind}_template")
        # str.replace, not str.format: references are free text and may contain braces.
        return template.replace("{reference}", reference.strip())


def teacher_messages(
    messages: Sequence[Mapping[str, Any]],
    reference: str,
    *,
    kind: ReferenceKind = "answer",
    config: TeacherPromptConfig | None = None,
) -> list[dict[str, Any]]:
    """A copy of the chat ``messages`` with the reference block placed per ``config.placement``.

    ``messages`` is the student's prompt conversation (everything before the response), each a
    mapping with ``role`` and string ``content``. The input is not modified.
    """
    config = config or TeacherPromptConfig()
    out = _check_messages(messages)
    hint = config.hint(reference, kind)
    if config.placement == "user_end":
        users = [i for i, message in enumerate(out) if message["role"] == "user"]
        if not users:
            raise ValueError("messages has no 'user' message to append the reference to")
        out[users[-1]]["content"] = out[users[-1]]["content"] + hint
    elif config.placement == "new_user_turn":
        out.append({"role": "user", "content": hint.lstrip("\n")})
    else:  # system
        if out and out[0]["role"] == "system":
            out[0]["content"] = out[0]["content"] + hint
        else:
            out.insert(0, {"role": "system", "content": hint.lstrip("\n")})
    return out


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    """Token ids of a student prompt, ready for the first response token.

    ``prompt`` is a chat conversation (rendered through the tokenizer's chat template with the
    generation prompt, e.g. ``<|im_start|>assistant\\n``) or a plain string (tokenised as is).
    Special tokens come from the template only, never added a second time.
    """
    if isinstance(prompt, str):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    else:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "prompt is a list of chat messages but the tokenizer has no chat_template; "
                "pass the prompt as plain text instead"
            )
        text = tokenizer.apply_chat_template(
            _check_messages(prompt), add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("prompt tokenises to no tokens; the first response token needs one")
    return list(ids)


def teacher_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    reference: str,
    *,
    kind: ReferenceKind = "answer",
    config: TeacherPromptConfig | None = None,
) -> list[int]:
    """Token ids of the teacher prompt: ``prompt`` with the reference block (see
    :func:`teacher_messages`), built exactly the way :func:`prompt_ids` builds the student's."""
    config = config or TeacherPromptConfig()
    if isinstance(prompt, str):
        return prompt_ids(tokenizer, prompt + config.hint(reference, kind))
    return prompt_ids(tokenizer, teacher_messages(prompt, reference, kind=kind, config=config))


def build_prompt_pairs(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    references: Sequence[str],
    *,
    kind: ReferenceKind = "answer",
    config: TeacherPromptConfig | None = None,
) -> tuple[list[list[int]], list[list[int]]]:
    """Student and teacher prompt ids for a batch: ``(prompt_ids, teacher_prompt_ids)``, two lists
    of ``B`` id lists, ready for :func:`gear_rl.signals.token_signals` with the same responses."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a sequence of prompts, got {type(prompts).__name__}")
    if isinstance(references, (str, bytes)) or not isinstance(references, Sequence):
        raise ValueError(
            f"references must be a sequence of str, got {type(references).__name__}"
        )
    if len(prompts) != len(references):
        raise ValueError(
            f"references has {len(references)} entries but prompts has {len(prompts)}"
        )
    student = [prompt_ids(tokenizer, prompt) for prompt in prompts]
    teacher = [
        teacher_prompt_ids(tokenizer, prompt, reference, kind=kind, config=config)
        for prompt, reference in zip(prompts, references, strict=True)
    ]
    return student, teacher


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ValueError(f"messages[{i}] must be a mapping with 'role' and 'content'")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"messages[{i}]['content'] must be a str")
        out.append(dict(message))
    return out
