"""Answer extraction matched to how small chat models answer.

SmolLM2-135M-Instruct almost never writes a requested ``Answer: <value>`` line; it explains and
ends with the number ("... so 5 - 3 = 2."). The extractor therefore takes, in order of precedence:
the last ``\\boxed{...}``, the last ``Answer: ...`` line, and otherwise the last number in the text.

A task can read the first number instead (:data:`ANSWER_RULES`, ``task_options.answer_rule``):
then the tokens after it cannot change the reward, which makes a task whose outcome is decided by
a few tokens among many that do not matter (docs/results.md, the credit control's step 5).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

__all__ = ["ANSWER_RULES", "extract_answer", "first_number", "first_number_span", "last_boxed",
           "last_number", "normalize_number", "number_value"]

_NUMBER = re.compile(r"(?<![\w.])[-−]?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
_LITERAL = re.compile(rf"([-−+]?)\s*({_DIGITS}(?:\.\d*)?|\.\d+)(?:/({_DIGITS}))?")
_ANSWER_LINE = re.compile(r"(?im)^\W*(?:final\s+)?answer\s*[:：]\s*(.+?)\s*$")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[begin:i].strip()
            depth -= 1
    return None


def normalize_number(token: str) -> str:
    """``"−1,234.50"`` -> ``"-1234.5"``: unicode minus, thousands commas, inner spaces and
    trailing zeros of a decimal removed; fractions kept as ``a/b``."""
    token = token.replace("−", "-").replace(",", "").replace(" ", "")
    if "." in token and "/" not in token:
        token = token.rstrip("0").rstrip(".")
    if token in ("-0", ""):
        token = "0"
    return token


def number_value(text: str) -> Fraction | None:
    """The exact value of ``text`` when it is one plain number, else None.

    A plain number is an optionally signed (``-``, Unicode ``−``, ``+``) integer or decimal
    (``3``, ``-0.50``, ``.5``, ``1,234``, ``1{,}234`` or ``1\\,234`` with thousands separators),
    or a quotient of one by an integer (``3/4``); whitespace and ``$`` around it are ignored.
    The value is exact (a :class:`~fractions.Fraction`, never a float) and of any length:
    ``0.5`` and ``1/2`` are the same value, ``1234567`` and ``1234568`` are not, and a number of
    5,000 digits is read without Python's int-to-string digit limit (digits go through
    :class:`~decimal.Decimal`). ``1,2`` (not thousands commas), ``1/0``, ``2e3`` and any other
    text give None.
    """
    text = text.strip().strip("$").strip().replace("{,}", ",").replace("\\,", ",")
    match = _LITERAL.fullmatch(text)
    if match is None:
        return None
    sign, number, denominator = match.groups()
    value = Fraction(Decimal(number.replace(",", "")))
    if denominator is not None:
        divisor = Fraction(Decimal(denominator.replace(",", "")))
        if divisor == 0:
            return None
        value /= divisor
    return -value if sign in ("-", "−") else value


def last_number(text: str) -> str | None:
    """The last number in ``text`` (integers, decimals, ``a/b``, thousands commas), normalised."""
    matches = _NUMBER.findall(text)
    return normalize_number(matches[-1]) if matches else None


def first_number_span(text: str) -> tuple[int, int] | None:
    """Character offsets ``(start, end)`` of the first number in ``text`` (as
    :func:`last_number` reads numbers), or None."""
    match = _NUMBER.search(text)
    return match.span() if match else None


def first_number(text: str) -> str | None:
    """The first number in ``text``, normalised (None: there is none)."""
    span = first_number_span(text)
    return normalize_number(text[span[0]:span[1]]) if span else None


def extract_answer(text: str) -> str | None:
    """The response's final answer: last ``\\boxed{}``, else last ``Answer:`` line, else the last
    number. A boxed or answer-line value that contains a number is reduced to that number."""
    for candidate in (last_boxed(text), _last_answer_line(text)):
        if candidate:
            number = last_number(candidate)
            if number is not None and _is_numberish(candidate):
                return number
            return candidate.strip().rstrip(".")
    return last_number(text)


def _last_answer_line(text: str) -> str | None:
    lines = _ANSWER_LINE.findall(text)
    return lines[-1] if lines else None


def _is_numberish(text: str) -> bool:
    """True when ``text`` is a number with at most light decoration (``$ 12.``, ``x = -3``)."""
    stripped = re.sub(r"[\s$\\().]|^[a-zA-Z]\s*=", "", text.strip())
    return bool(re.fullmatch(r"[-−]?[\d,]+(?:\.\d+)?(?:/\d+)?", stripped))


ANSWER_RULES: dict[str, Callable[[str], str | None]] = {
    "final": extract_answer,
    "first_number": first_number,
}
"""What a reasoning-gym task's scorer reads from a response (``task_options.answer_rule``):
``final`` (default) the final answer (:func:`extract_answer`); ``first_number`` the first number,
so that nothing after it can change the reward."""
