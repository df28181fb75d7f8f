"""Math answer checking with ``math-verify`` (Hugging Face), with a last-number fallback.

``math-verify`` extracts the last LaTeX / plain expression of a response and compares it
symbolically with the gold answer (``\\boxed{1/2}`` equals ``0.5``). A bare LaTeX gold answer such
as ``(x+1)^2`` parses to nothing unless it is wrapped in ``$...$``, so the gold is wrapped first.
"""

from __future__ import annotations

import re

from gear_rl.tasks.answers import last_boxed, last_number, normalize_number

__all__ = ["is_blank_answer", "math_equal"]

# What an answer can be made of and still say nothing: math delimiters, unescaped braces,
# LaTeX spacing and text-wrapper commands, whitespace.
_BLANK_PARTS = re.compile(
    r"\\(?:[,;:! >]|q?quad|hspace\*?|text[a-z]*|math[a-z]*|mbox|operatorname|boxed|displaystyle)"
    r"|\\[()\[\]]|(?<!\\)[{}]|[$~\s]"
)


def is_blank_answer(text: str) -> bool:
    """True when ``text`` holds no answer: empty, whitespace, or only delimiters, spacing and
    empty wrappers (``$ $``, ``\\boxed{\\,}``, ``\\text{}``). ``math-verify`` reads such text
    as an empty expression, and the number fallback would read an empty gold as 0."""
    return not _BLANK_PARTS.sub("", text)


def _gold_text(gold: str) -> str:
    gold = gold.strip()
    if "$" in gold or "\\boxed" in gold or "\\(" in gold or "\\[" in gold:
        return gold
    return f"${gold}$"


def math_equal(gold: str, response: str) -> bool:
    """True when the final answer of ``response`` equals ``gold`` mathematically.

    ``math-verify`` decides when it can parse both sides; when it extracts nothing from the
    response, the response's last number is compared with the gold as numbers. A blank gold, a
    blank final ``\\boxed{}`` or a blank extracted answer (:func:`is_blank_answer`) equals
    nothing.
    """
    from math_verify import parse, verify

    if is_blank_answer(gold):
        return False
    boxed = last_boxed(response)
    if boxed is not None and is_blank_answer(boxed):
        return False
    try:
        gold_parsed = parse(_gold_text(gold))
        predicted = parse(response)
        if predicted and all(is_blank_answer(str(item)) for item in predicted):
            return False
        if gold_parsed and predicted:
            return bool(verify(gold_parsed, predicted))
    except Exception:  # math-verify raises on pathological inputs (deep nesting, timeouts)
        pass
    number = last_number(response)
    return number is not None and _same_number(number, normalize_number(gold))


def _same_number(left: str, right: str) -> bool:
    try:
        return abs(_to_float(left) - _to_float(right)) <= 1e-6 * max(1.0, abs(_to_float(right)))
    except ValueError:
        return left == right


def _to_float(text: str) -> float:
    if "/" in text:
        numerator, denominator = text.split("/", 1)
        return float(numerator) / float(denominator)
    return float(text)
