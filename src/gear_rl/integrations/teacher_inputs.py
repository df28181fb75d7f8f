"""Teacher inputs for the engine integrations, as plain functions (no engine, no I/O).

GEAR (arXiv 2605.11853) scores the student's own response under the same model shown the
reference. An engine keeps the prompt ids it actually sampled with, which may differ from a plain
re-rendering of the chat messages (verl's agent loops add tool schemas, truncate, or use
model-specific builders; TRL may pass chat-template kwargs). So the teacher prompt starts from the
stored ids: the messages are rendered twice with the tokenizer's template, without and with the
hint (``gear_rl.signals.teacher``), and the difference is spliced into the stored ids
(:func:`splice_teacher_prompt`). The response ids are never touched.

For verl, :func:`build_teacher_rows` makes one "hinted prompt + the same response" row per
trajectory for the actor's ``compute_log_prob``; verl's ``response_from_nested`` cuts the response
positions back out (the response is the suffix of both sequences, so a different prompt length
changes nothing there). verl has no such teacher of its own: its distillation teacher
(``verl.experimental.teacher_loop``) is a separate model served on the student's unchanged prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from gear_rl.signals.teacher import ReferenceKind, TeacherPromptConfig, teacher_messages

Render = Callable[[list[dict[str, Any]]], list[int]]

# How a teacher prompt was made (counted in the trainer's metrics).
SPLICED_HEAD = "spliced_head"      # stored prompt starts with the re-rendered one (exact match,
                                   # or an agent's later output holding more turns)
SPLICED_TAIL = "spliced_tail"      # stored prompt ends like the re-rendered one: hint spliced in
RERENDERED = "rerendered"          # no alignment found: the re-rendered hinted prompt is used
APPENDED = "appended"              # plain-text prompt: the hint is appended to the stored ids
NO_REFERENCE = "no_reference"      # no reference in the row: teacher prompt == student prompt


def lookup_reference(row_fields: Mapping[str, Any], reference_key: str) -> str | None:
    """The reference at dotted path ``reference_key`` in a row's non-tensor fields, as text.

    Non-string references (a list of gold tool calls, a number) are JSON-encoded. Missing keys
    and empty values give ``None``.
    """
    value: Any = row_fields
    for part in reference_key.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        else:
            return None
    value = getattr(value, "data", value)  # tensordict's NonTensorData
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if text.strip() else None


def splice_teacher_prompt(student_ids: Sequence[int], rendered_student: Sequence[int],
                          rendered_teacher: Sequence[int]) -> tuple[list[int], str]:
    """Put the hint that separates ``rendered_teacher`` from ``rendered_student`` into the stored
    ``student_ids``.

    Args:
        student_ids: the prompt ids verl sampled the response after.
        rendered_student: the chat messages rendered without the hint.
        rendered_teacher: the same messages with the hint.

    Returns:
        ``(teacher_ids, how)``: when the stored prompt starts with the whole re-rendered prompt
        (it is that prompt, or an agent's later output whose prompt holds more turns), the hinted
        rendering replaces that head (``SPLICED_HEAD``); when it ends with the re-rendered tail
        from the first token the hint changes, that tail is replaced (``SPLICED_TAIL``; e.g. tool
        schemas in the system turn differ, the user turn and generation prompt match); otherwise
        the hinted rendering is used as is (``RERENDERED``).
    """
    student_ids, rs, rt = list(student_ids), list(rendered_student), list(rendered_teacher)
    # The head first: a later turn's prompt can end like the first one (the generation prompt),
    # and splicing there would put the hint after the last tool output instead of the question.
    if student_ids[:len(rs)] == rs:
        return rt + student_ids[len(rs):], SPLICED_HEAD
    prefix = 0
    while prefix < min(len(rs), len(rt)) and rs[prefix] == rt[prefix]:
        prefix += 1
    tail = rs[prefix:]
    if len(tail) <= len(student_ids) and student_ids[len(student_ids) - len(tail):] == tail:
        return student_ids[:len(student_ids) - len(tail)] + rt[prefix:], SPLICED_TAIL
    return rt, RERENDERED


def teacher_prompt_ids(student_ids: Sequence[int], prompt: Any, reference: str | None,
                       render: Render, encode: Callable[[str], list[int]], *,
                       kind: str = "answer",
                       config: TeacherPromptConfig | None = None) -> tuple[list[int], str]:
    """The teacher prompt for one trajectory and how it was made (see the module constants).

    Args:
        student_ids: the stored student prompt ids.
        prompt: the row's ``raw_prompt``: a list of chat messages, or a plain string.
        reference: the reference text, or ``None``.
        render: chat messages -> prompt ids with the generation prompt (the tokenizer's chat
            template, called as verl's agent loop calls it).
        encode: text -> ids without special tokens (for plain-text prompts).
        kind, config: which hint template, where it goes (``gear_rl.signals.teacher``).
    """
    config = config or TeacherPromptConfig()
    if reference is None:
        return list(student_ids), NO_REFERENCE
    # kind is an engine config string: hint() and teacher_messages() check it is a ReferenceKind
    if isinstance(prompt, str):
        hint = config.hint(reference, cast(ReferenceKind, kind))
        return list(student_ids) + encode(hint), APPENDED
    messages = [dict(m) for m in prompt]
    hinted = teacher_messages(messages, reference, kind=cast(ReferenceKind, kind), config=config)
    return splice_teacher_prompt(student_ids, render(messages), render(hinted))


@dataclass
class TeacherRows:
    """Rows for the actor's ``compute_log_prob``, one per trajectory, plus what they came from.

    Attributes:
        fields: one dict per row with 1-D tensors ``prompts``, ``responses``, ``input_ids``
            (prompt + response), ``attention_mask`` and ``position_ids`` (over the whole
            sequence), ``response_mask`` and ``loss_mask`` (over the response).
        how: for each row, how its teacher prompt was made.
    """

    fields: list[dict[str, torch.Tensor]]
    how: list[str]

    def counts(self) -> dict[str, int]:
        """How many rows were made each way."""
        out: dict[str, int] = {}
        for how in self.how:
            out[how] = out.get(how, 0) + 1
        return out


def build_teacher_rows(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                       response_masks: Sequence[Sequence[int]], raw_prompts: Sequence[Any],
                       references: Sequence[str | None], render: Render,
                       encode: Callable[[str], list[int]], *, kind: str = "answer",
                       config: TeacherPromptConfig | None = None,
                       skip: Sequence[bool] | None = None) -> TeacherRows:
    """Teacher rows for a batch: hinted prompt + the unchanged response ids.

    Args:
        prompts, responses, response_masks: per trajectory, the stored prompt ids, response ids
            and response mask (1 = policy token, 0 = tool output).
        raw_prompts: per trajectory, the chat messages (or text) the prompt was rendered from.
        references: per trajectory, the reference text or ``None``.
        render, encode, kind, config: as in :func:`teacher_prompt_ids`.
        skip: per trajectory, ``True`` to keep the student prompt (verl's synthetic padding rows).
    """
    batch = len(prompts)
    for name, value in (("responses", responses), ("response_masks", response_masks),
                        ("raw_prompts", raw_prompts), ("references", references)):
        if len(value) != batch:
            raise ValueError(f"{name} has {len(value)} entries, prompts has {batch}")
    if skip is not None and len(skip) != batch:
        raise ValueError(f"skip has {len(skip)} entries, prompts has {batch}")
    fields, hows = [], []
    for i in range(batch):
        if len(response_masks[i]) != len(responses[i]):
            raise ValueError(
                f"response_masks[{i}] has {len(response_masks[i])} entries, "
                f"responses[{i}] has {len(responses[i])}"
            )
        if skip is not None and skip[i]:
            ids, how = list(prompts[i]), NO_REFERENCE
        else:
            ids, how = teacher_prompt_ids(prompts[i], raw_prompts[i], references[i], render,
                                          encode, kind=kind, config=config)
        prompt = torch.tensor(ids, dtype=torch.int64)
        response = torch.tensor(list(responses[i]), dtype=torch.int64)
        sequence = torch.cat([prompt, response])
        mask = torch.tensor(list(response_masks[i]), dtype=torch.int64)
        fields.append({
            "prompts": prompt,
            "responses": response,
            "input_ids": sequence,
            "attention_mask": torch.ones_like(sequence),
            "position_ids": torch.arange(sequence.numel(), dtype=torch.int64),
            "response_mask": mask,
            "loss_mask": mask.clone(),
        })
        hows.append(how)
    return TeacherRows(fields=fields, how=hows)


def response_logprobs_from_sequence(logprobs: torch.Tensor, response_length: int) -> torch.Tensor:
    """The response part of a per-sequence log-prob row as verl's engines return it.

    verl's ``compute_log_prob`` gives, for a sequence of ``L`` tokens, ``L`` values where entry
    ``j`` is the log-prob of token ``j + 1`` (the last is junk); the response's ``R`` tokens are
    therefore entries ``L - R - 1 .. L - 2``. Same cut as ``verl.workers.utils.padding.
    response_from_nested``; kept here for the tests and for one-row use.

    Args:
        logprobs: ``[L]`` per-position log-probs of one sequence.
        response_length: ``R``, with ``1 <= R < L``.
    """
    if logprobs.dim() != 1:
        raise ValueError(f"logprobs must have shape [L], got {tuple(logprobs.shape)}")
    length = logprobs.shape[0]
    if not 1 <= response_length < length:
        raise ValueError(f"response_length must be in [1, {length - 1}], got {response_length}")
    return logprobs[length - response_length - 1:length - 1]
