"""Tool-call formats and parsing for multi-turn agent rollouts.

Three preset formats, all configurable through :class:`ToolCallFormat`:

- ``python``: the tool-integrated-reasoning format (as in ToRL / SimpleTIR style math agents): the
  policy writes code between ``<python>`` and ``</python>``; the environment answers with the
  output between ``<result>`` and ``</result>``.
- ``markdown``: the same tool in Markdown fences, as Qwen2.5-Math's tool-integrated reasoning
  writes it: code in a ````` ```python ````` fence, the output in a ````` ```output ````` fence.
  Small chat models write fenced code unprompted (SmolLM2-135M-Instruct does, and never writes
  ``<python>`` tags), so this format can give a nonzero tool-call rate from the first step.
- ``json``: function calling (the Hermes / Qwen convention, also ToolRL's): one JSON object per
  line between ``<tool_call>`` and ``</tool_call>``, each ``{"name": ..., "arguments": {...}}``
  (``"parameters"`` is accepted as a synonym, as ToolRL's data uses it); the environment answers
  between ``<tool_response>`` and ``</tool_response>``.

Parsing never raises on model text: every outcome is a :class:`ParsedTurn` with a ``status``
(JSON is read by :func:`gear_rl.safe_json.loads_bounded`: a body nested past its bound is
``malformed``, never a ``RecursionError``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from gear_rl.safe_json import loads_bounded

__all__ = [
    "JSON_FORMAT",
    "MARKDOWN_PYTHON_FORMAT",
    "MARKDOWN_TOOL_INSTRUCTIONS",
    "PYTHON_FORMAT",
    "PYTHON_TOOL_INSTRUCTIONS",
    "CallStatus",
    "ParsedTurn",
    "ToolCall",
    "ToolCallFormat",
    "get_format",
    "parse_json_calls",
    "parse_turn",
]

CallStatus = Literal["none", "ok", "malformed", "unterminated"]


@dataclass(frozen=True)
class ToolCallFormat:
    """How a tool call is written and how its result is shown.

    Attributes:
        kind: ``"python"`` (the call body is code) or ``"json"`` (the body is JSON calls).
        open_tag, close_tag: delimiters of a call; ``close_tag`` is the generation stop string.
        observation_template: text appended after a call, with ``{output}`` for the tool output.
            It is tokenized on its own and masked out of the loss.
        strip_code_fences: for ``python``, drop a surrounding Markdown code fence.
        stop_string: what the sampler is asked to stop at (default ``close_tag``); differs when
            the closing tag is also the start of the opening one (Markdown fences).
    """

    kind: Literal["python", "json"]
    open_tag: str
    close_tag: str
    observation_template: str
    strip_code_fences: bool = True
    stop_string: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("python", "json"):
            raise ValueError(f"kind must be 'python' or 'json', got {self.kind!r}")
        if not self.open_tag or not self.close_tag or self.open_tag == self.close_tag:
            raise ValueError("open_tag and close_tag must be distinct non-empty strings")
        if "{output}" not in self.observation_template:
            raise ValueError("observation_template must contain '{output}'")

    @property
    def stop(self) -> str:
        """The generation stop string."""
        return self.stop_string or self.close_tag

    def call_span(self, text: str) -> tuple[int, int] | None:
        """``(start of the opening tag, end of the closing tag)`` of the first complete call:
        the first closing tag after an opening tag, and the last opening tag before it."""
        first_open = text.find(self.open_tag)
        if first_open < 0:
            return None
        close = text.find(self.close_tag, first_open + len(self.open_tag))
        if close < 0:
            return None
        start = text.rfind(self.open_tag, first_open, close)
        return start, close + len(self.close_tag)


PYTHON_FORMAT = ToolCallFormat(
    kind="python", open_tag="<python>", close_tag="</python>",
    observation_template="\n<result>\n{output}\n</result>\n",
)
MARKDOWN_PYTHON_FORMAT = ToolCallFormat(
    kind="python", open_tag="```python", close_tag="```",
    observation_template="\n```output\n{output}\n```\n", stop_string="\n```\n",
    strip_code_fences=False,
)
JSON_FORMAT = ToolCallFormat(
    kind="json", open_tag="<tool_call>", close_tag="</tool_call>",
    observation_template="\n<tool_response>\n{output}\n</tool_response>\n",
)


PYTHON_TOOL_INSTRUCTIONS = (
    "You can run Python code: write it between <python> and </python>, and its printed output "
    "will be shown between <result> and </result>. Use it for calculations, then give the final "
    "answer."
)
"""A system-prompt sentence for the ``python`` format (tool-integrated math)."""

MARKDOWN_TOOL_INSTRUCTIONS = (
    "You can run Python code: write it in a ```python code block, and its printed output will be "
    "shown in a ```output block. Use it for calculations, then give the final answer."
)
"""A system-prompt sentence for the ``markdown`` format."""


def get_format(name: str | ToolCallFormat) -> ToolCallFormat:
    """``"python"``, ``"markdown"`` or ``"json"`` (or a ``ToolCallFormat``, returned as is)."""
    if isinstance(name, ToolCallFormat):
        return name
    formats = {"python": PYTHON_FORMAT, "markdown": MARKDOWN_PYTHON_FORMAT, "json": JSON_FORMAT}
    if name not in formats:
        raise ValueError(f"tool-call format must be one of {sorted(formats)}, got {name!r}")
    return formats[name]


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: a function name with arguments, or (python format) code."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    code: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """What one policy turn asked for.

    Attributes:
        status: ``"none"`` (no call: a final answer), ``"ok"`` (one or more well-formed calls),
            ``"malformed"`` (a complete call whose body does not parse), ``"unterminated"`` (an
            opening tag without its closing tag).
        calls: the parsed calls (empty unless ``status == "ok"``).
        error: why a call is malformed.
        body: the raw text between the tags (``None`` without a complete call).
    """

    status: CallStatus
    calls: tuple[ToolCall, ...] = ()
    error: str | None = None
    body: str | None = None


_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_+-]*\s*\n(.*?)\n?\s*```\s*$", re.S)


def _call_from_object(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        raise ValueError(f"a call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a call needs a non-empty string 'name'")
    if "arguments" in obj:
        arguments = obj["arguments"]
    else:
        arguments = obj.get("parameters", {})
    if isinstance(arguments, str):  # OpenAI-style arguments serialised as a string
        arguments = loads_bounded(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise ValueError(f"'arguments' of {name!r} must be an object")
    return ToolCall(name=name, arguments=arguments)


def parse_json_calls(body: str) -> tuple[ToolCall, ...]:
    """Parse a ``<tool_call>`` body: one JSON object, a JSON list of objects, or one object per
    line (ToolRL). Raises ``ValueError`` (``json.JSONDecodeError`` is one) when it does not parse
    or nests deeper than :data:`gear_rl.safe_json.MAX_JSON_DEPTH`.
    """
    text = body.strip()
    if not text:
        raise ValueError("empty tool call")
    try:
        parsed = loads_bounded(text)
    except json.JSONDecodeError:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2:
            raise
        parsed = [loads_bounded(line) for line in lines]
    objects = parsed if isinstance(parsed, list) else [parsed]
    if not objects:
        raise ValueError("empty list of tool calls")
    return tuple(_call_from_object(obj) for obj in objects)


def parse_turn(text: str, fmt: ToolCallFormat) -> ParsedTurn:
    """Parse the text of one policy turn (the rollout loop cuts it after the call).

    The call is the first closing tag after an opening tag, with the last opening tag before it
    (see :meth:`ToolCallFormat.call_span`).
    """
    span = fmt.call_span(text)
    if span is None:
        if fmt.open_tag in text:
            return ParsedTurn(status="unterminated",
                              error=f"no {fmt.close_tag} after {fmt.open_tag}")
        if fmt.close_tag in text and fmt.close_tag not in fmt.open_tag:
            return ParsedTurn(status="malformed", error=f"{fmt.close_tag} without "
                                                        f"{fmt.open_tag}", body="")
        return ParsedTurn(status="none")
    start, end = span
    body = text[start + len(fmt.open_tag):end - len(fmt.close_tag)]
    if fmt.kind == "python":
        code = body
        if fmt.strip_code_fences:
            fenced = _FENCE.match(code)
            if fenced:
                code = fenced.group(1)
        code = code.strip("\n")
        if not code.strip():
            return ParsedTurn(status="malformed", error="empty code block", body=body)
        return ParsedTurn(status="ok", calls=(ToolCall(name="python", code=code),), body=body)
    try:
        calls = parse_json_calls(body)
    except (ValueError, TypeError) as exc:
        return ParsedTurn(status="malformed", error=f"could not parse the tool call: {exc}",
                          body=body)
    return ParsedTurn(status="ok", calls=calls, body=body)
