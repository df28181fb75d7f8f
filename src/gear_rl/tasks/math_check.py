"""Math answer checking with ``math-verify`` (Hugging Face), with a last-number fallback.

``math-verify`` extracts the last LaTeX / plain expression of a response and compares it
symbolically with the gold answer (``\\boxed{1/2}`` equals ``0.5``). A bare LaTeX gold answer such
as ``(x+1)^2`` parses to nothing unless it is wrapped in ``$...$``, so the gold is wrapped first.

Numbers are compared exactly (:func:`math_equal`): when both the gold and the answer are plain
numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``: anything with an exact rational value),
they are equal only when their values are, with no tolerance (``0.5`` equals ``1/2``;
``1234568`` never equals ``1234567``; ``0.333333`` does not equal ``\\frac{1}{3}``: write the
fraction). math-verify's own numeric comparison rounds decimals to 6 places, which would pass
``0.1234568`` for ``0.1234567``, so it decides only where one side is not a plain number (an
expression such as ``\\sqrt{2}``, ``\\pi``, ``2^{10}``, ``50\\%``, a set, an equation): there a
decimal that agrees with an irrational gold to 6 places (``1.414214`` for ``\\sqrt{2}``) counts,
the one tolerance, and only where no decimal can be exactly right.

math-verify bounds its parsing with ``signal.alarm``, which works only in a process's main
thread; elsewhere its ``parse`` raises and every answer would fall to the last number (a
different score: ``\\boxed{\\frac{2}{4}}`` against ``\\frac{1}{2}`` would be 0). So off the main
thread :func:`math_equal` runs the check in a small pool of spawned processes, each calling it in
its own main thread: the same result on any thread, at the cost of one inter-process round trip.
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing
import multiprocessing.pool
import os
import re
import threading
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from gear_rl.tasks.answers import last_boxed, last_number, number_value

__all__ = ["checked_timeout", "is_blank_answer", "math_equal"]

logger = logging.getLogger("gear_rl.tasks.math_check")

# What an answer can be made of and still say nothing: math delimiters, unescaped braces,
# LaTeX spacing and text-wrapper commands, whitespace.
_BLANK_PARTS = re.compile(
    r"\\(?:[,;:! >]|q?quad|hspace\*?|text[a-z]*|math[a-z]*|mbox|operatorname|boxed|displaystyle)"
    r"|\\[()\[\]]|(?<!\\)[{}]|[$~\s]"
)
_CHECK_PROCESSES = max(1, min(4, os.cpu_count() or 1))
DEFAULT_TIMEOUT_S = 30.0
"""How long a check run off the main thread (in the checker processes) may take."""

_pool: multiprocessing.pool.Pool | None = None
_pool_lock = threading.Lock()


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


def math_equal(gold: str, response: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """True when the final answer of ``response`` equals ``gold`` mathematically.

    ``math-verify`` extracts the final answer; two plain numbers are then compared exactly,
    anything else by math-verify (the module docstring gives the rule and its one tolerance).
    When it extracts nothing from the response (``<b>42</b>``, ``\\text{42}``, a Unicode minus),
    the response's last number is compared exactly with the gold's value. A blank gold, a blank
    final ``\\boxed{}`` or a blank extracted answer (:func:`is_blank_answer`) equals nothing.
    Numbers of any length compare right.

    The result does not depend on the calling thread: off the main thread the check runs in the
    checker processes (module docstring), and one that has not answered within ``timeout_s``
    seconds counts as not equal (logged; the processes are replaced).
    """
    timeout_s = checked_timeout(timeout_s)
    if threading.current_thread() is threading.main_thread():
        return _math_equal_here(gold, response)
    return _math_equal_in_checker(gold, response, timeout_s)


def checked_timeout(timeout_s: Any, name: str = "timeout_s") -> float:
    """``timeout_s`` as a float when it is a positive finite number of seconds.

    Raises:
        ValueError: naming ``name`` (the caller's setting) and the value, for anything else.
    """
    if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
            or not math.isfinite(timeout_s) or timeout_s <= 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {timeout_s!r}")
    return float(timeout_s)


def _math_equal_here(gold: str, response: str) -> bool:
    """:func:`math_equal` evaluated in this thread (math-verify's timeouts need the main one)."""
    from math_verify import parse, verify

    if is_blank_answer(gold):
        return False
    boxed = last_boxed(response)
    if boxed is not None and is_blank_answer(boxed):
        return False
    gold_parsed: list[Any] = []
    try:
        gold_parsed = parse(_gold_text(gold))
        predicted = parse(response)
        if predicted and all(is_blank_answer(str(item)) for item in predicted):
            return False
        if gold_parsed and predicted:
            gold_value = _exact_value(gold_parsed)
            if gold_value is not None:
                answer_value = _exact_value(predicted, unwrap_assignment=True)
                if answer_value is not None:
                    return answer_value == gold_value
            return bool(verify(gold_parsed, predicted))
    except Exception:  # math-verify raises on pathological inputs (deep nesting, timeouts)
        pass
    number = last_number(response)
    if number is None:
        return False
    gold_value = _exact_value(gold_parsed) if gold_parsed else None
    if gold_value is None:
        gold_value = number_value(gold)
    return gold_value is not None and number_value(number) == gold_value


def _exact_value(parsed: list[Any], *, unwrap_assignment: bool = False) -> Fraction | None:
    """The exact rational value of a math-verify ``parse`` result, or None when it is not a
    plain number: its extracted text read by :func:`~gear_rl.tasks.answers.number_value`, else
    a sympy ``Rational`` (``\\frac{1}{2}``, ``1,000``), else a sympy ``Float`` by the decimal
    digits it holds. ``unwrap_assignment``: read ``x = 3`` as ``3`` (as math-verify reads a
    predicted equation against a gold that is not one)."""
    import sympy

    text = next((item for item in parsed if isinstance(item, str)), None)
    if text is not None:
        value = number_value(text)
        if value is not None:
            return value
    expr = parsed[0]
    if unwrap_assignment and isinstance(expr, sympy.Eq):
        expr = expr.rhs
    if isinstance(expr, sympy.Rational):
        return Fraction(int(expr.p), int(expr.q))
    if isinstance(expr, sympy.Float):
        try:
            return Fraction(Decimal(str(expr)))
        except (InvalidOperation, ValueError, OverflowError):  # nan, inf
            return None
    return None


# --- off the main thread --------------------------------------------------------------------
def _close_pool() -> None:
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.terminate()
        pool.join()


atexit.register(_close_pool)


def _checker_pool() -> multiprocessing.pool.Pool:
    global _pool
    with _pool_lock:
        if _pool is None:
            # spawn: no fork of a process with threads (Ray, an event loop); each process
            # imports the checker once, then calls it in its own main thread
            _pool = multiprocessing.get_context("spawn").Pool(
                _CHECK_PROCESSES, initializer=__import__, initargs=(__name__,))
        return _pool


def _math_equal_in_checker(gold: str, response: str, timeout_s: float) -> bool:
    """:func:`_math_equal_here` in a checker process's main thread; False (logged, the pool
    replaced) when it has not answered within ``timeout_s`` seconds."""
    global _pool
    pool = _checker_pool()
    pending = pool.apply_async(_math_equal_here, (gold, response))
    try:
        return bool(pending.get(timeout_s))
    except multiprocessing.TimeoutError:
        logger.warning("math check did not answer within %g s; scored 0 and restarting the "
                       "checker processes", timeout_s)
        with _pool_lock:
            if _pool is pool:
                _pool = None
        pool.terminate()
        return False
