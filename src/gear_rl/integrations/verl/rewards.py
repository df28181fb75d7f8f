"""Custom reward functions for verl that score exactly as ``gear-rl train`` does.

Point verl 0.9.1 at this file (it is loaded by path, so it imports nothing relative)::

    REWARD_FN=$(python -c "import gear_rl.integrations.verl.rewards as m; print(m.__file__)")
    reward.custom_reward_function.path=$REWARD_FN
    reward.custom_reward_function.name=compute_score     # verl's default name: dispatches below
    +reward.custom_reward_function.reward_kwargs.reward_scale=unit  # knobs: see each function

The calling convention is verl 0.9.1's: ``verl/trainer/ppo/reward.py`` (``get_custom_reward_fn``)
loads ``name`` from ``path`` with ``verl.utils.import_utils.load_extern_object`` and merges
``reward_kwargs`` into every call; the reward managers
(``verl/experimental/reward_loop/reward_manager/naive.py``, ``run_single``) call it with keyword
arguments only, ``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)``, plus
``reward_router_address`` and ``reward_model_tokenizer`` when a reward model is configured. A
synchronous function runs in the event loop's thread-pool executor. A ``float`` return is the
reward (the manager logs it as ``acc``); a ``dict`` must hold ``"score"`` (the reward) and every
key is logged per sample (``reward_extra_info``; ``reward_loop.py`` builds one array per key from
the first sample's keys, so every call returns the same keys, all numbers here).

- :func:`math_verify_reward`: 1.0 when the response's final answer equals the ground truth under
  ``gear_rl.tasks.math_check.math_equal`` (math-verify with the last-number fallback), the
  scorer of ``gear-rl train`` on verl-layout files (``gear_rl.tasks.verl_data.verl_task``).
- :func:`toolrl_reward`: ToolRL's ``R_format + R_correct`` (Qian et al., "ToolRL: Reward is All
  Tool Learning Needs", arXiv 2504.13958), computed by ``gear_rl.tasks.toolrl.toolrl_reward``.
- :func:`digit_share_reward`: the share of the response's characters that are digits, for smoke
  runs of randomly initialised models only (``scripts/verl_cpu.sh`` on its tiny model), which
  never answer right: a 0/1 reward would give every response of a group the same score, every
  advantage 0 and no gradient, and the run would test nothing of the update.
- :func:`compute_score`: ``toolrl_reward`` for a ``data_source`` containing ``"toolrl"``,
  ``math_verify_reward`` otherwise (verl's default function name, so ``path`` alone suffices).

verl calls a synchronous reward from an executor thread; ``math_equal`` gives the same result on
any thread (off the main thread it runs in its checker processes, see
``gear_rl.tasks.math_check``), so a verl run scores exactly as ``gear-rl train``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Literal

from gear_rl.safe_json import loads_bounded
from gear_rl.tasks import toolrl as _toolrl
from gear_rl.tasks.math_check import checked_timeout, math_equal
from gear_rl.tasks.verl_data import gold_answer

__all__ = ["compute_score", "digit_share_reward", "math_gold", "math_verify_reward",
           "toolrl_gold", "toolrl_reward"]

logger = logging.getLogger("gear_rl.integrations.verl.rewards")

# Keyword arguments verl's reward managers add on their own (naive.py, run_single).
_VERL_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})
_TOOL_RESPONSE_END = "</tool_response>"


# --- ground truths --------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """A numpy array or scalar (how a parquet column may arrive) as Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def math_gold(ground_truth: Any) -> str:
    """The gold answer text of a math row, exactly as ``gear-rl train`` reads
    ``reward_model.ground_truth``: ``gear_rl.tasks.verl_data.gold_answer`` (a string as is, a
    finite number as positional decimal text, a one-element list by its element; the rules are
    in docs/data.md).

    Raises:
        ValueError: ``ground_truth`` and the reason ``gold_answer`` gives: for a dict, bytes,
            bool, None, a nested list or any other type, NaN or an infinite number, an empty
            list, a list of several answers, or a blank answer.
    """
    try:
        return gold_answer(ground_truth)
    except ValueError as exc:
        raise ValueError(f"ground_truth {exc}") from None


def toolrl_gold(ground_truth: Any) -> str:
    """The gold output text ``gear_rl.tasks.toolrl.toolrl_reward`` scores against.

    Accepted: ToolRL's gold ``output`` string (``<think>...</think>`` then ``<tool_call>`` and/or
    ``<response>``, as ``gear_rl.integrations.verl.data`` writes it), returned unchanged; the gold
    call(s) JSON-encoded (what ``gear_rl.integrations.teacher_inputs.lookup_reference`` makes of
    a non-string reference: one ``{"name", "parameters" | "arguments"}`` object or a list of
    them), or those objects themselves, returned as a ``<tool_call>`` block with one JSON object
    per line (ToolRL's layout). A gold of calls has no ``<think>`` or ``<response>`` field, so
    ``R_format`` then asks for ``<think>`` and ``<tool_call>`` only.

    Raises:
        ValueError: for a string that is neither, an empty list, a list holding a non-object, or
            any other type (named).
    """
    value = _plain(ground_truth)
    if isinstance(value, str):
        if "<tool_call>" in value or "<response>" in value:
            return value
        try:
            value = loads_bounded(value)
        except ValueError as exc:  # not JSON, or nested past the bound
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise ValueError(
                "ground_truth must be ToolRL's gold output (with <tool_call> or <response>) or "
                f"JSON-encoded tool call(s); got text that is neither ({reason}): "
                f"{ground_truth!r:.120}") from exc
    if isinstance(value, Mapping):
        value = [value]
    if isinstance(value, (list, tuple)):
        calls = [_plain(call) for call in value]
        if not calls:
            raise ValueError("ground_truth holds no tool call (an empty list)")
        bad = [type(call).__name__ for call in calls if not isinstance(call, Mapping)]
        if bad:
            raise ValueError(f"ground_truth: every tool call must be an object, got {bad[0]}")
        try:
            lines = [json.dumps(dict(call), ensure_ascii=False) for call in calls]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"ground_truth: a tool call is not JSON-serialisable: {exc}") from exc
        return "<tool_call>\n" + "\n".join(lines) + "\n</tool_call>"
    raise ValueError("ground_truth must be a string, a tool-call object or a list of them, got "
                     f"{type(value).__name__}")


# --- math -----------------------------------------------------------------------------------
def _check_extra_kwargs(function: str, kwargs: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(kwargs) - _VERL_KWARGS)
    if unknown:
        raise ValueError(f"{function}: unknown keyword argument(s) {unknown} (from "
                         f"reward.custom_reward_function.reward_kwargs?); it takes {list(known)}")


def _final_turn(solution_str: str) -> str:
    """The text after the last tool response: the policy's final turn in a tool-agent rollout
    (Qwen3's chat template wraps tool output in ``<tool_response>`` tags, which decoding keeps)."""
    end = solution_str.rfind(_TOOL_RESPONSE_END)
    return solution_str if end < 0 else solution_str[end + len(_TOOL_RESPONSE_END):]


def math_verify_reward(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    final_turn_only: bool = True,
    timeout_s: float = 30.0,
    **kwargs: Any,
) -> float:
    """1.0 when ``solution_str``'s final answer equals ``ground_truth``, else 0.0.

    The check is ``gear_rl.tasks.math_check.math_equal(gold, solution_str)``, the scorer
    ``gear-rl train`` uses on verl-layout files (``gear_rl.tasks.verl_data.verl_task``), so the
    same response and ground truth get the same reward in both trainers. Signature: verl 0.9.1's
    custom reward function (``verl/trainer/ppo/reward.py``, called by
    ``verl/experimental/reward_loop/reward_manager/naive.py``); verl logs the float as ``acc``.

    Args:
        data_source, extra_info: as verl passes them; not read.
        solution_str: the decoded response. Malformed text (no answer, unbalanced braces,
            nonsense LaTeX) scores 0.0; an error inside the checker is logged and scores 0.0.
        ground_truth: ``reward_model.ground_truth`` (see :func:`math_gold`: a string, a
            finite number or a one-element list of one, as ``gear-rl train`` reads it).
        final_turn_only: score only the text after the last ``</tool_response>`` when there is
            one (the final turn of a ``tool_agent`` rollout, as ``gear-rl train`` scores
            tool-integrated math); no effect on single-turn responses.
        timeout_s: how long a check run in the checker processes (off the main thread) may take
            before it counts as 0.0.
        **kwargs: verl's ``reward_router_address`` / ``reward_model_tokenizer`` are accepted and
            ignored; any other name is refused.

    Raises:
        ValueError: for a ground truth :func:`math_gold` refuses, a ``solution_str`` that is not
            a string, bad knob values, or an unknown keyword argument.
    """
    _check_extra_kwargs("math_verify_reward", kwargs, ("final_turn_only", "timeout_s"))
    if not isinstance(final_turn_only, bool):
        raise ValueError(f"math_verify_reward: final_turn_only must be a bool, got "
                         f"{final_turn_only!r}")
    timeout_s = checked_timeout(timeout_s, "math_verify_reward: timeout_s")
    gold = math_gold(ground_truth)
    if not isinstance(solution_str, str):
        raise ValueError(f"solution_str must be a string, got {type(solution_str).__name__}")
    response = _final_turn(solution_str) if final_turn_only else solution_str
    try:
        return 1.0 if math_equal(gold, response, timeout_s=timeout_s) else 0.0
    except Exception as exc:  # the checker must not stop training on one odd response
        logger.warning("math check failed (%s: %s); scored 0", type(exc).__name__, exc)
        return 0.0


# --- ToolRL ---------------------------------------------------------------------------------
def toolrl_reward(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    reward_scale: Literal["paper", "unit"] = "paper",
    require_think: bool = True,
    no_call_gold: Literal["zero", "match"] = "zero",
    matching: Literal["optimal", "greedy"] = "optimal",
    **kwargs: Any,
) -> dict[str, float]:
    """ToolRL's reward ``R = R_format + R_correct`` of ``solution_str`` (arXiv 2504.13958).

    Computed by ``gear_rl.tasks.toolrl.toolrl_reward`` (its module docstring gives each part's
    reading). Signature: verl 0.9.1's custom reward function (``verl/trainer/ppo/reward.py``,
    ``verl/experimental/reward_loop/reward_manager/naive.py``), whose dict return is logged key
    by key.

    Args:
        data_source, extra_info: as verl passes them; not read.
        solution_str: the decoded response. A missing or unparsable ``<tool_call>`` (even JSON
            nested too deeply to decode) gets ``R_correct = -3``.
        ground_truth: the gold output or the gold call(s), see :func:`toolrl_gold`.
        reward_scale: ``"paper"`` (default): ``score = R`` in [-3, 4]; ``"unit"``: ``(R + 3) / 7``
            in [0, 1], what ``gear-rl train``'s ToolRL task trains on by default (GRPO's and
            GEAR's std-normalised advantages are the same under either).
        require_think, no_call_gold, matching: as ``gear_rl.tasks.toolrl.toolrl_reward``.
        **kwargs: verl's ``reward_router_address`` / ``reward_model_tokenizer`` are accepted and
            ignored; any other name is refused.

    Returns:
        ``{"score", "format", "correct", "acc"}``: the reward, ``R_format`` in {0, 1},
        ``R_correct`` in [-3, 3], and ``acc`` 1.0 for a fully correct response (``R = 4``; verl
        then reports ``acc`` as the validation core metric).

    Raises:
        ValueError: for a ground truth :func:`toolrl_gold` refuses or whose ``<tool_call>``
            does not parse, a ``solution_str`` that is not a string, a bad knob value or an
            unknown keyword argument.
    """
    _check_extra_kwargs("toolrl_reward", kwargs,
                        ("reward_scale", "require_think", "no_call_gold", "matching"))
    if reward_scale not in ("paper", "unit"):
        raise ValueError(f"toolrl_reward: reward_scale must be 'paper' or 'unit', got "
                         f"{reward_scale!r}")
    if not isinstance(require_think, bool):
        raise ValueError(f"toolrl_reward: require_think must be a bool, got {require_think!r}")
    if no_call_gold not in ("zero", "match"):
        raise ValueError(f"toolrl_reward: no_call_gold must be 'zero' or 'match', got "
                         f"{no_call_gold!r}")
    if matching not in ("optimal", "greedy"):
        raise ValueError(f"toolrl_reward: matching must be 'optimal' or 'greedy', got "
                         f"{matching!r}")
    gold = toolrl_gold(ground_truth)
    if not isinstance(solution_str, str):
        raise ValueError(f"solution_str must be a string, got {type(solution_str).__name__}")
    try:
        _toolrl.extract_tool_calls(gold)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"ground_truth: its <tool_call> block does not parse: {exc}") from exc
    score = _toolrl.toolrl_reward(solution_str, gold, require_think=require_think,
                                  no_call_gold=no_call_gold, matching=matching)
    r_format, r_correct = score.format, score.correct
    total = r_format + r_correct
    return {
        "score": total if reward_scale == "paper" else (total + 3.0) / 7.0,
        "format": r_format,
        "correct": r_correct,
        "acc": 1.0 if r_format == 1.0 and r_correct == 3.0 else 0.0,
    }


# --- verl's default name --------------------------------------------------------------------
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> float | dict[str, float]:
    """verl's default custom-reward name (``reward.custom_reward_function.name=compute_score``,
    verl 0.9.1 ``verl/trainer/config/reward/reward.yaml``): :func:`toolrl_reward` when
    ``data_source`` contains ``"toolrl"`` (``gear_rl.integrations.verl.data`` writes
    ``gear_rl/toolrl``), else :func:`math_verify_reward`. ``kwargs`` go to the chosen function.
    Keep one setting per run: the two return different types, and verl expects every sample of
    a batch to log the same keys."""
    if "toolrl" in str(data_source).lower():
        return toolrl_reward(data_source, solution_str, ground_truth, extra_info, **kwargs)
    return math_verify_reward(data_source, solution_str, ground_truth, extra_info, **kwargs)


# --- smoke runs of random models --------------------------------------------------------------
def digit_share_reward(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> float:
    """The share of ``solution_str``'s characters that are ASCII digits (0 for an empty
    response): a dense reward a random byte-level model earns partial credit on, so GRPO
    groups differ and the update has a gradient. For smoke runs (module docstring), not a
    task's score."""
    _check_extra_kwargs("digit_share_reward", kwargs, ())
    text = str(solution_str)
    return sum(c in "0123456789" for c in text) / len(text) if text else 0.0
