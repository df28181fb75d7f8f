"""JSON text from outside the program (model output, data files), parsed with a nesting bound.

Python's ``json.loads`` recurses once per level of nesting: text of a thousand ``[`` (about 500
tokens of model output) raises ``RecursionError``, which no caller expects and which ends a
training run from one sampled response. :func:`loads_bounded` refuses such text with a
``ValueError`` before decoding, so every parser of model text (``gear_rl.agent.parsing``, the
ToolRL and BFCL scorers) and of data files (``gear_rl.tasks.verl_data``, the verl converters,
BFCL) fails the way it fails on any other malformed JSON. It also reads integers of any length
(``json.loads`` refuses more than 4,300 digits: Python's int-to-string limit).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "JSONTooDeepError", "loads_bounded"]

MAX_JSON_DEPTH = 100
"""The deepest nesting of arrays and objects accepted: far beyond any tool call or data row,
far below the interpreter's recursion limit."""

# a JSON string (escapes included) or one bracket; strings are skipped whole, so brackets
# inside them do not count
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_LONG_INT = 4000  # digits; shorter integers take int() directly


class JSONTooDeepError(ValueError):
    """JSON text nested deeper than the bound (a ``ValueError``, as a malformed text is)."""


def _int(text: str) -> int:
    return int(text) if len(text) < _LONG_INT else int(Decimal(text))


def loads_bounded(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)``, refusing nesting deeper than ``max_depth`` arrays/objects.

    Raises:
        JSONTooDeepError: the text nests deeper than ``max_depth`` (checked before decoding,
            so decoding never recurses past it).
        json.JSONDecodeError: the text is not JSON (both are ``ValueError``).
    """
    if text.count("[") + text.count("{") > max_depth:
        depth = 0
        for token in _TOKENS.finditer(text):
            bracket = token.group()
            if bracket in ("[", "{"):
                depth += 1
                if depth > max_depth:
                    raise JSONTooDeepError(
                        f"JSON nested deeper than {max_depth} levels of arrays/objects (at "
                        f"character {token.start()})")
            elif bracket in ("]", "}"):
                depth = max(0, depth - 1)
    return json.loads(text, parse_int=_int)
