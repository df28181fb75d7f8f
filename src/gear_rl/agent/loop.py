"""Batched multi-turn agent rollouts with tool calls and observation masks.

GEAR (arXiv 2605.11853) credits only the policy's own tokens, so every tool output appended to a
trajectory is marked as an observation (loss mask 0) and its span and turn are recorded: GEAR's
segmentation scan skips observation positions, and the step-level methods use the turn index.

The loop does not sample: it calls a ``generate`` function (the trainer's KV-cache sampler, or
anything with the same signature):

    generate(prompt_ids: list[list[int]], stop_strings: list[str], max_new_tokens: list[int])
        -> list[list[int]]          # the new tokens of each row

It must stop a row at end of turn (its EOS ids); honouring ``stop_strings`` is optional, the loop
cuts every row just after the first complete call itself (the wasted tokens are the only cost;
the trainer's sampler stops a row as soon as its new tokens hold a complete call,
:func:`holds_call`, which never cuts earlier than the loop would).

One turn for the whole batch: every live trajectory generates; each row is cut at its first EOS
or closing tag; the calls of all rows are executed together (one ``run_many`` on the sandbox);
each observation is tokenized and appended with mask 0; finished rows drop out. Bad turns never
raise: malformed and unterminated calls, unknown tools, tool errors and time-outs, over-long
outputs, the turn limit and the token budget each end in a defined observation or finish reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from gear_rl.agent.parsing import ParsedTurn, ToolCall, ToolCallFormat, get_format, parse_turn

if TYPE_CHECKING:
    import torch

    from gear_rl.agent.tools import PythonSandbox

__all__ = [
    "AgentLimits",
    "AgentLoopConfig",
    "EpisodePrefix",
    "GenerateFn",
    "PythonExecutor",
    "ToolExecutor",
    "ToolOutput",
    "Trajectory",
    "TurnRecord",
    "format_sandbox_output",
    "holds_call",
    "run_agent",
    "trajectories_to_tensors",
    "trajectory_metrics",
]

GenerateFn = Callable[[list[list[int]], list[str], list[int]], Sequence[Sequence[int]]]
FinishReason = Literal["answer", "tool_call", "max_turns", "length", "unterminated_call",
                       "token_budget"]


# --- tools ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolOutput:
    """The result of one call as the policy will see it.

    Attributes:
        text: the observation content (before the format's observation template).
        error: ``None`` on success, else a short kind: ``"unknown_tool"``, ``"tool_error"``
            (the tool ran and failed), or a sandbox limit name (``"timeout"``, ``"memory"``...).
    """

    text: str
    error: str | None = None


class ToolExecutor(Protocol):
    """Runs a batch of calls (from every live trajectory of a turn) and returns one output per
    call, in order."""

    def __call__(self, calls: Sequence[ToolCall]) -> list[ToolOutput]: ...


def format_sandbox_output(stdout: str, stderr: str, exit_code: int | None,
                          limit_hit: str | None, *, timeout_s: float | None = None,
                          max_stderr_chars: int = 1000) -> str:
    """What the policy sees after running code: stdout; on failure also the tail of stderr (the
    traceback's last lines) and a one-line note naming the limit that was hit."""
    parts = [stdout.rstrip("\n")] if stdout.strip() else []
    failed = exit_code != 0 or limit_hit is not None
    if failed and stderr.strip():
        parts.append(stderr.rstrip("\n")[-max_stderr_chars:])
    if limit_hit == "timeout":
        parts.append(f"Error: execution timed out{f' after {timeout_s:g} s' if timeout_s else ''}")
    elif limit_hit == "output":
        parts.append("Error: output too long, truncated")
    elif limit_hit == "sandbox_error":
        parts.append("Error: the sandbox failed to run the code")
    elif limit_hit is not None:
        parts.append(f"Error: {limit_hit} limit exceeded")
    elif exit_code not in (0, None) and not stderr.strip():
        parts.append(f"Error: exit status {exit_code}")
    return "\n".join(parts) if parts else "(no output)"


class PythonExecutor:
    """Runs ``python`` calls in a :class:`~gear_rl.agent.tools.PythonSandbox`, all calls of a turn
    together (``run_many``). Calls to any other name get ``unknown_tool``."""

    def __init__(self, sandbox: PythonSandbox, *, timeout_s: float | None = None) -> None:
        self.sandbox = sandbox
        self.timeout_s = timeout_s

    def __call__(self, calls: Sequence[ToolCall]) -> list[ToolOutput]:
        outputs: list[ToolOutput | None] = [None] * len(calls)
        runnable = [i for i, call in enumerate(calls) if call.name == "python" and call.code]
        for i, call in enumerate(calls):
            if i not in runnable:
                outputs[i] = ToolOutput(f"Error: unknown tool {call.name!r}; available: python",
                                        error="unknown_tool")
        results = self.sandbox.run_many([calls[i].code or "" for i in runnable],
                                        timeout_s=self.timeout_s)
        timeout = self.timeout_s or self.sandbox.limits.timeout_s
        for i, result in zip(runnable, results, strict=True):
            text = format_sandbox_output(result.stdout, result.stderr, result.exit_code,
                                         result.limit_hit, timeout_s=timeout)
            error = result.limit_hit or ("tool_error" if result.exit_code != 0 else None)
            outputs[i] = ToolOutput(text, error=error)
        return [o for o in outputs if o is not None]


# --- config and records ---------------------------------------------------------------------
@dataclass(frozen=True)
class AgentLimits:
    """How long a multi-turn episode may run: the one home of these knobs and their defaults
    (the trainer's ``agent.*`` section takes its defaults from here).

    Attributes:
        max_turns: policy turns per episode (tool calls are made in all but the last).
        max_new_tokens_per_turn: generation cap of one turn.
        max_response_tokens: budget of the whole response (policy and observation tokens).
        max_observation_tokens: observation content is cut to this many tokens (a marker says so).
    """

    max_turns: int = 4
    max_new_tokens_per_turn: int = 64
    max_response_tokens: int = 384
    max_observation_tokens: int = 128

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens_per_turn", "max_response_tokens",
                     "max_observation_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class AgentLoopConfig(AgentLimits):
    """The episode limits (:class:`AgentLimits`), the tool-call format, and how over-long
    observations are cut.

    Attributes:
        tool_format: ``"python"``, ``"markdown"``, ``"json"`` or a :class:`ToolCallFormat`.
        stop_after_tool_call: the first tool call ends the episode without running it (function
            calling evaluated against a reference, e.g. ToolRL and BFCL).
        truncation_marker: appended to a cut observation.
    """

    tool_format: str | ToolCallFormat = "python"
    stop_after_tool_call: bool = False
    truncation_marker: str = "\n...[truncated]"

    def __post_init__(self) -> None:
        super().__post_init__()
        get_format(self.tool_format)

    @property
    def format(self) -> ToolCallFormat:
        """The resolved tool-call format."""
        return get_format(self.tool_format)


@dataclass
class TurnRecord:
    """One policy turn and what followed it."""

    text: str
    parsed: ParsedTurn
    ended_by: Literal["eos", "stop_string", "length"]
    outputs: list[ToolOutput] = field(default_factory=list)
    observation: str | None = None


@dataclass
class Trajectory:
    """A multi-turn response. Per-token lists are aligned with ``response_ids``.

    Attributes:
        prompt_ids: the prompt (as given).
        response_ids: every token after the prompt: policy turns and observations.
        loss_mask: 1 for a policy token, 0 for an observation token.
        turn_ids: the policy turn a token belongs to (0-based); an observation carries the index
            of the turn whose call it answers.
        observation_spans: ``[start, end)`` of each observation in ``response_ids``.
        turns: per policy turn, its text, parse, and the tool outputs.
        finish_reason: ``"answer"`` (a turn without a call), ``"tool_call"``
            (``stop_after_tool_call``), ``"max_turns"`` (a call in the last allowed turn; not run),
            ``"length"`` (a turn hit its token cap, or the budget ran out mid-turn),
            ``"unterminated_call"`` (the turn ended inside an open call), ``"token_budget"`` (no
            room left for an observation or another turn).
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    observation_spans: list[tuple[int, int]] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    @property
    def num_tool_calls(self) -> int:
        """Calls that were executed."""
        return sum(len(t.outputs) for t in self.turns)

    @property
    def num_calls_made(self) -> int:
        """Well-formed calls the policy wrote, executed or not (``stop_after_tool_call`` and
        the last allowed turn end the episode without running them)."""
        return sum(len(t.parsed.calls) for t in self.turns)

    @property
    def num_malformed_calls(self) -> int:
        """Turns whose call did not parse (malformed or unterminated)."""
        return sum(t.parsed.status in ("malformed", "unterminated") for t in self.turns)

    @property
    def num_unknown_tool_calls(self) -> int:
        return sum(o.error == "unknown_tool" for t in self.turns for o in t.outputs)

    @property
    def num_observation_tokens(self) -> int:
        return len(self.loss_mask) - sum(self.loss_mask)

    @property
    def policy_text(self) -> str:
        """The policy's own text, all turns concatenated (observations left out)."""
        return "".join(t.text for t in self.turns)

    @property
    def final_text(self) -> str:
        """The last policy turn (where a final answer is)."""
        return self.turns[-1].text if self.turns else ""

    def transcript(self) -> str:
        """Policy turns and observations in order, as the model saw them."""
        return "".join(t.text + (t.observation or "") for t in self.turns)


# --- the loop -------------------------------------------------------------------------------
def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def holds_call(ids: Sequence[int], tokenizer: Any, fmt: ToolCallFormat) -> bool:
    """Whether the text of ``ids`` holds a complete call of ``fmt``: where the loop cuts a turn
    (a sampler may stop a row there: the loop discards every token after it; tokens before
    ``ids``, such as a resumed turn's first part, only ever complete a call earlier)."""
    return fmt.call_span(_decode(tokenizer, ids)) is not None


def _cut_turn(ids: list[int], tokenizer: Any, stop_ids: set[int], fmt: ToolCallFormat
              ) -> tuple[list[int], Literal["eos", "stop_string", "length"]]:
    """Keep a generated turn up to and including its first EOS token or the end of its first
    complete call."""
    end, ended_by = len(ids), "length"
    for position, token in enumerate(ids):
        if token in stop_ids:
            end, ended_by = position + 1, "eos"
            break
    if holds_call(ids[:end], tokenizer, fmt):
        # the shortest prefix whose text holds a complete call (prefix decoding is monotone)
        lo, hi = 1, end
        while lo < hi:
            mid = (lo + hi) // 2
            if holds_call(ids[:mid], tokenizer, fmt):
                hi = mid
            else:
                lo = mid + 1
        end, ended_by = lo, "stop_string"
    return ids[:end], ended_by  # type: ignore[return-value]


def append_tokens(record: Any, ids: Sequence[int], turn: int, *, policy: bool
                  ) -> tuple[int, int]:
    """Append ``ids`` to a trajectory-like ``record`` (``response_ids``, ``loss_mask``,
    ``turn_ids``, ``observation_spans``): policy tokens get mask 1, observation tokens mask 0
    and a recorded span. Returns the ``[start, end)`` of the appended tokens."""
    start = len(record.response_ids)
    record.response_ids += list(ids)
    record.loss_mask += [1 if policy else 0] * len(ids)
    record.turn_ids += [turn] * len(ids)
    if not policy:
        record.observation_spans.append((start, len(record.response_ids)))
    return start, len(record.response_ids)


def _observation_ids(content: str, fmt: ToolCallFormat, tokenizer: Any, cap: int,
                     marker: str) -> tuple[str, list[int]]:
    content_ids = tokenizer.encode(content, add_special_tokens=False)
    if len(content_ids) > cap:
        content = tokenizer.decode(content_ids[:cap], skip_special_tokens=True) + marker
    text = fmt.observation_template.format(output=content)
    return text, tokenizer.encode(text, add_special_tokens=False)


@dataclass
class EpisodePrefix:
    """The first tokens of a multi-turn response, to continue it from (``run_agent(prefixes=)``):
    what a Monte-Carlo value of a mid-episode prefix needs (``gear_rl.credit_check``).

    Attributes:
        response_ids: the response's first ``b`` tokens (policy turns and observations).
        loss_mask: 1 for a policy token, 0 for an observation token, aligned with them.
        turn_ids: each token's turn (an observation carries the turn whose call it answers).

    A prefix that ends on a policy token ends inside that turn: the turn is continued (its call,
    if it writes one, is parsed from the prefix's part and the continuation together). One that
    ends on an observation token (or is empty) ends with that observation complete: the next
    turn starts there.
    """

    response_ids: list[int]
    loss_mask: list[int]
    turn_ids: list[int]

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.turn_ids) != n:
            raise ValueError(f"EpisodePrefix: {n} response ids, {len(self.loss_mask)} mask "
                             f"entries and {len(self.turn_ids)} turn ids (all must match)")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("EpisodePrefix.loss_mask must hold only 0 and 1")
        turn, observed = 0, False
        for position, (mask, turn_id) in enumerate(zip(self.loss_mask, self.turn_ids,
                                                       strict=True)):
            expected = turn + 1 if observed and mask == 1 else turn
            if turn_id != expected:
                raise ValueError(
                    f"EpisodePrefix: token {position} has turn id {turn_id}, expected "
                    f"{expected} (turns count from 0; a turn's policy tokens come before the "
                    "observation that answers it, the next turn after it)")
            if mask == 0 and position == 0:
                raise ValueError("EpisodePrefix: a response starts with a policy turn, not an "
                                 "observation")
            turn, observed = turn_id, mask == 0

    def pieces(self) -> list[tuple[int, int, list[int]]]:
        """The prefix as runs of one kind, in order: ``(mask, turn, ids)``, a policy turn's
        tokens (mask 1) or the observation answering it (mask 0). Every run but the last is
        complete; a last run of policy tokens is a turn cut in the middle."""
        runs: list[tuple[int, int, list[int]]] = []
        for token, mask, turn in zip(self.response_ids, self.loss_mask, self.turn_ids,
                                     strict=True):
            if runs and runs[-1][:2] == (mask, turn):
                runs[-1][2].append(int(token))
            else:
                runs.append((int(mask), int(turn), [int(token)]))
        return runs


def _resume(prompt: list[int], prefix: EpisodePrefix, tokenizer: Any, stops: set[int],
            fmt: ToolCallFormat) -> tuple[Trajectory, list[int], int]:
    """The episode state at the end of ``prefix``: its complete turns (records rebuilt from
    their tokens, as the loop would have made them), the policy tokens of an unfinished turn,
    and the index of the turn to generate next."""
    trajectory = Trajectory(prompt_ids=prompt)
    pieces = prefix.pieces()
    partial: list[int] = []
    turn = 0
    for index, (mask, turn_id, ids) in enumerate(pieces):
        if mask == 1 and index == len(pieces) - 1:  # the prefix ends inside this turn
            partial, turn = ids, turn_id
        elif mask == 1:
            text = tokenizer.decode(ids, skip_special_tokens=True)
            trajectory.turns.append(TurnRecord(text=text, parsed=parse_turn(text, fmt),
                                               ended_by=_cut_turn(ids, tokenizer, stops,
                                                                  fmt)[1]))
            append_tokens(trajectory, ids, turn_id, policy=True)
        else:
            trajectory.turns[-1].observation = _decode(tokenizer, ids)
            append_tokens(trajectory, ids, turn_id, policy=False)
            turn = turn_id + 1
    return trajectory, partial, turn


def run_agent(
    prompts: Sequence[Sequence[int]],
    generate: GenerateFn,
    tokenizer: Any,
    config: AgentLoopConfig,
    executor: ToolExecutor | None = None,
    *,
    stop_ids: Sequence[int] | None = None,
    prefixes: Sequence[EpisodePrefix | None] | None = None,
) -> list[Trajectory]:
    """Roll out one multi-turn trajectory per prompt.

    Args:
        prompts: ``B`` prompt token-id lists (chat template already applied).
        generate: the sampler (see the module docstring).
        tokenizer: the policy's tokenizer (``encode``/``decode``); observations are tokenized
            with it, without special tokens.
        config: limits and format.
        executor: runs the calls; required unless ``config.stop_after_tool_call``.
        stop_ids: end-of-turn token ids (default: the tokenizer's ``eos_token_id``).
        prefixes: ``B`` entries (None: start afresh): continue row ``i``'s episode from
            ``prefixes[i]`` (:class:`EpisodePrefix`) under the same limits, as if the loop had
            produced those tokens itself. Each round then generates, for every live row, the
            rest of its turn; rows may be at different turns.

    Returns:
        ``B`` trajectories, in prompt order (a resumed one holds its prefix's tokens first).
    """
    fmt = config.format
    if not config.stop_after_tool_call and executor is None:
        raise ValueError("executor is required unless config.stop_after_tool_call is set")
    prompt_lists = [list(map(int, p)) for p in prompts]
    if any(len(p) == 0 for p in prompt_lists):
        raise ValueError("prompts: every prompt needs at least one token")
    if prefixes is not None and len(prefixes) != len(prompt_lists):
        raise ValueError(f"{len(prefixes)} prefixes for {len(prompt_lists)} prompts")
    if stop_ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        stop_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    stops = set(map(int, stop_ids))
    trajectories = [Trajectory(prompt_ids=p) for p in prompt_lists]
    partial: list[list[int]] = [[] for _ in prompt_lists]  # an unfinished turn's tokens
    turn_of = [0] * len(prompt_lists)  # the turn each row generates next
    for i, prefix in enumerate(prefixes or []):
        if prefix is not None:
            trajectories[i], partial[i], turn_of[i] = _resume(prompt_lists[i], prefix,
                                                              tokenizer, stops, fmt)
    active = []
    for i, trajectory in enumerate(trajectories):
        if turn_of[i] >= config.max_turns:  # resumed after the last allowed turn's observation
            trajectory.finish_reason = "max_turns"
        elif len(trajectory.response_ids) + len(partial[i]) >= config.max_response_tokens:
            trajectory.finish_reason = "token_budget"
        else:
            active.append(i)
    while active:
        budgets = [min(config.max_new_tokens_per_turn,
                       config.max_response_tokens - len(trajectories[i].response_ids))
                   - len(partial[i]) for i in active]
        generating = [k for k, budget in enumerate(budgets) if budget > 0]
        generated: list[list[int]] = [[] for _ in active]
        if generating:
            inputs = [trajectories[active[k]].prompt_ids + trajectories[active[k]].response_ids
                      + partial[active[k]] for k in generating]
            new = generate(inputs, [fmt.stop], [budgets[k] for k in generating])
            if len(new) != len(generating):
                raise ValueError(f"generate returned {len(new)} rows for {len(generating)} "
                                 "prompts")
            for k, ids in zip(generating, new, strict=True):
                generated[k] = list(map(int, ids))[:budgets[k]]
        pending: list[tuple[int, ToolCall]] = []
        still_active = []
        for i, new_ids in zip(active, generated, strict=True):
            trajectory, turn = trajectories[i], turn_of[i]
            ids, ended_by = _cut_turn(partial[i] + new_ids, tokenizer, stops, fmt)
            partial[i] = []
            text = tokenizer.decode(ids, skip_special_tokens=True)
            parsed = parse_turn(text, fmt)
            record = TurnRecord(text=text, parsed=parsed, ended_by=ended_by)
            trajectory.turns.append(record)
            append_tokens(trajectory, ids, turn, policy=True)
            if parsed.status == "none":
                trajectory.finish_reason = "answer" if ended_by == "eos" else "length"
            elif parsed.status == "unterminated":
                trajectory.finish_reason = "unterminated_call"
            elif config.stop_after_tool_call:
                trajectory.finish_reason = "tool_call"
            elif turn == config.max_turns - 1:
                trajectory.finish_reason = "max_turns"
            elif len(trajectory.response_ids) >= config.max_response_tokens:
                trajectory.finish_reason = "token_budget"
            elif parsed.status == "malformed":
                record.outputs = []
                still_active.append(i)
            else:
                pending += [(i, call) for call in parsed.calls]
                still_active.append(i)
        # calls are only pending without config.stop_after_tool_call, which requires an executor
        outputs = (cast(ToolExecutor, executor)([call for _, call in pending]) if pending
                   else [])
        if len(outputs) != len(pending):
            raise ValueError(f"executor returned {len(outputs)} outputs for {len(pending)} calls")
        by_row: dict[int, list[ToolOutput]] = {}
        for (i, _call), output in zip(pending, outputs, strict=True):
            by_row.setdefault(i, []).append(output)
        active = []
        for i in still_active:
            trajectory = trajectories[i]
            record = trajectory.turns[-1]
            if record.parsed.status == "malformed":
                content = f"Error: {record.parsed.error}"
            else:
                record.outputs = by_row.get(i, [])
                content = "\n".join(o.text for o in record.outputs)
            text, obs_ids = _observation_ids(content, fmt, tokenizer,
                                             config.max_observation_tokens,
                                             config.truncation_marker)
            if len(trajectory.response_ids) + len(obs_ids) >= config.max_response_tokens:
                trajectory.finish_reason = "token_budget"  # no room to answer after it
                continue
            record.observation = text
            append_tokens(trajectory, obs_ids, turn_of[i], policy=False)
            turn_of[i] += 1
            if turn_of[i] < config.max_turns:
                active.append(i)
            else:  # the loop ran out of turns right after an observation
                trajectory.finish_reason = "max_turns"
    return trajectories


def trajectory_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Batch statistics for ``metrics.jsonl``: tool-call rate (fraction of trajectories with at
    least one well-formed call, run or not), calls written and calls executed per trajectory,
    turns per trajectory, the fraction of response tokens that
    are observations, malformed and unknown-tool call rates, and the share of each finish
    reason."""
    n = max(len(trajectories), 1)
    total_tokens = sum(len(t.response_ids) for t in trajectories)
    observation_tokens = sum(t.num_observation_tokens for t in trajectories)
    turns = sum(len(t.turns) for t in trajectories)
    metrics = {
        "agent/tool_call_rate": sum(t.num_calls_made > 0 for t in trajectories) / n,
        "agent/tool_calls_per_trajectory": sum(t.num_calls_made for t in trajectories) / n,
        "agent/executed_calls_per_trajectory": sum(t.num_tool_calls for t in trajectories) / n,
        "agent/turns_per_trajectory": turns / n,
        "agent/observation_token_fraction": observation_tokens / max(total_tokens, 1),
        "agent/malformed_call_rate": sum(t.num_malformed_calls for t in trajectories)
        / max(turns, 1),
        "agent/unknown_tool_rate": sum(t.num_unknown_tool_calls for t in trajectories)
        / max(sum(t.num_tool_calls for t in trajectories), 1),
        "agent/response_tokens_mean": total_tokens / n,
    }
    reasons = Counter(t.finish_reason for t in trajectories)
    for reason in ("answer", "tool_call", "max_turns", "length", "unterminated_call",
                   "token_budget"):
        metrics[f"agent/finish_{reason}"] = reasons.get(reason, 0) / n
    return metrics


def trajectories_to_tensors(trajectories: Sequence[Trajectory], pad_id: int
                            ) -> dict[str, torch.Tensor]:
    """Right-padded ``[B, T]`` tensors over the responses (the project's convention).

    Returns:
        ``response_ids`` (int64, ``pad_id`` padding), ``mask`` (1 policy token, 0 observation
        and padding), ``observation_mask`` (1 on observation tokens), ``turn_ids`` (int64, -1 on
        padding), ``response_lengths`` (``[B]``).
    """
    import torch

    if not trajectories:
        raise ValueError("trajectories must not be empty")
    width = max(max(len(t.response_ids) for t in trajectories), 1)
    batch = len(trajectories)
    response_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.float32)
    observation = torch.zeros((batch, width), dtype=torch.float32)
    turn_ids = torch.full((batch, width), -1, dtype=torch.long)
    for row, t in enumerate(trajectories):
        n = len(t.response_ids)
        if n:
            response_ids[row, :n] = torch.tensor(t.response_ids)
            loss_mask = torch.tensor(t.loss_mask, dtype=torch.float32)
            mask[row, :n] = loss_mask
            observation[row, :n] = 1.0 - loss_mask
            turn_ids[row, :n] = torch.tensor(t.turn_ids)
    lengths = torch.tensor([len(t.response_ids) for t in trajectories], dtype=torch.long)
    return {"response_ids": response_ids, "mask": mask, "observation_mask": observation,
            "turn_ids": turn_ids, "response_lengths": lengths}
