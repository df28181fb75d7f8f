"""Shared plumbing of the step-level estimators: input checks, grouping, returns, GAE, and the
step -> token broadcast. No method's maths lives here.

Conventions (every estimator in :mod:`gear_rl.credit.steps`):

- A row ``b`` of the ``[B, T]`` tensors is one trajectory (the trajectory id is the row index);
  ``group_ids[b]`` is its prompt (verl's ``uid``). States are only ever compared within a prompt
  group: equal state keys under different prompts are different states.
- Step ``k`` of trajectory ``b`` is one policy turn: the action taken in state
  ``state_keys[b][k]``; it owns the response positions ``step_spans[b][k] = (start, end)``
  (``end`` exclusive). Spans are sorted and do not overlap; they may include observation or
  padding positions (those stay 0 because the broadcast multiplies by ``mask``), but every
  position with ``mask == 1`` must lie in some span, so no policy token is silently dropped.
- ``step_rewards[b][k]`` is the reward the environment paid after step ``k``. The trajectory's
  scalar ``rewards[b]`` (the outcome) drives every episode-level advantage.
- ``StepConfig.outcome_in_returns`` says how the two combine in returns and values: ``True``
  (default) adds ``rewards[b]`` to the last step's reward (use when ``step_rewards`` hold only
  intermediate rewards, or are left out, which means all zeros); ``False`` means
  ``step_rewards`` already contain the outcome. Each trajectory's end is treated as terminal
  (value 0 after the last step), whether the episode finished or was cut at the turn limit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gear_rl.credit._validate import check_mask, check_vector, group_index
from gear_rl.credit.batch import CreditBatch
from gear_rl.credit.config import OutcomeConfig, _finite
from gear_rl.credit.registry import estimator_names, get_estimator, register_estimator
from gear_rl.dataclass_config import check_bool

__all__ = [
    "NORM_MODES",
    "STEP_EXTRAS",
    "StepConfig",
    "StepInputs",
    "broadcast_steps",
    "check_outcomes",
    "check_step_inputs",
    "discounted_returns",
    "gae",
    "group_normalize",
    "output_dtype",
    "per_step_advantages",
    "register_step_estimator",
    "spans_from_step_ids",
    "step_advantages",
    "step_inputs_from_extras",
]

NORM_MODES = ("mean_std_norm", "mean_norm")

# The ``CreditBatch.extras`` keys the registry's step estimators read.
STEP_EXTRAS = {
    "step_spans": "B lists of (start, end) response positions per step (end exclusive)",
    "step_rewards": "B lists of per-step rewards (optional; all zeros when absent)",
    "state_keys": "B lists of hashable state keys, the state each step's action was taken in",
}


@dataclass(frozen=True)
class StepConfig(OutcomeConfig):
    """Knobs shared by the return-based step estimators (GiGPO, GAGPO, Gated-BEPO).

    Attributes:
        gamma: discount per environment step, in ``(0, 1]``.
        outcome_in_returns: add the trajectory outcome ``rewards[b]`` to the last step's reward
            when forming returns and values (``False``: ``step_rewards`` already include it).
    """

    gamma: float = 0.95
    outcome_in_returns: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("gamma", self.gamma)
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        check_bool("outcome_in_returns", self.outcome_in_returns)


@dataclass(frozen=True)
class StepInputs:
    """Checked, plain-Python step inputs (one list per trajectory).

    Attributes:
        spans: per trajectory, ``(start, end)`` of each step.
        rewards: per trajectory, the reward after each step (floats).
        state_keys: per trajectory, the hashable state of each step, or ``None`` when not given.
        groups: ``[B]`` dense prompt-group index (first appearance order).
    """

    spans: list[list[tuple[int, int]]]
    rewards: list[list[float]]
    state_keys: list[list[Hashable]] | None
    groups: list[int]

    def returns_rewards(self, outcomes: Sequence[float], outcome_in_returns: bool
                        ) -> list[list[float]]:
        """Per-step rewards with the outcome added to each trajectory's last step if told."""
        if not outcome_in_returns:
            return [list(r) for r in self.rewards]
        return [[*r[:-1], r[-1] + float(o)] if r else [] for r, o in
                zip(self.rewards, outcomes, strict=True)]


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _per_trajectory(name: str, x: object, batch: int) -> list[Any]:
    if isinstance(x, (str, bytes, torch.Tensor)) or not isinstance(x, Sequence):
        raise ValueError(f"{name} must be a sequence of B per-trajectory lists, got "
                         f"{type(x).__name__}")
    if len(x) != batch:
        raise ValueError(f"{name} has {len(x)} trajectories, but mask has {batch} rows")
    rows = []
    for b, row in enumerate(x):
        if isinstance(row, torch.Tensor):
            row = row.tolist()
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
            raise ValueError(f"{name}[{b}] must be a sequence, got {type(row).__name__}")
        rows.append(list(row))
    return rows


def check_step_inputs(
    mask: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    step_spans: Sequence[Sequence[tuple[int, int]]],
    step_rewards: Sequence[Sequence[float]] | None = None,
    state_keys: Sequence[Sequence[Hashable]] | None = None,
    *,
    require_states: bool = False,
) -> StepInputs:
    """Validate step inputs against ``mask`` (``[B, T]``); every failure is a ``ValueError``
    naming the argument.

    Args:
        mask: ``[B, T]`` 1 for policy tokens, 0 for padding and observations.
        group_ids: ``B`` hashable prompt ids or a ``[B]`` integer tensor.
        step_spans: ``B`` lists of ``(start, end)`` pairs, ``0 <= start < end <= T``, sorted
            and non-overlapping; every ``mask == 1`` position inside one of them.
        step_rewards: ``B`` lists of finite floats, one per step; ``None`` means all zeros.
        state_keys: ``B`` lists of hashables, one per step.
        require_states: raise when ``state_keys`` is ``None``.
    """
    check_mask(mask)
    batch, length = mask.shape
    groups, _ = group_index(group_ids, batch, mask.device)
    spans_rows = _per_trajectory("step_spans", step_spans, batch)
    on = mask.to(torch.bool).cpu()
    spans: list[list[tuple[int, int]]] = []
    for b, row in enumerate(spans_rows):
        covered = torch.zeros(length, dtype=torch.bool)
        previous_end = 0
        checked = []
        for k, span in enumerate(row):
            if isinstance(span, torch.Tensor):
                span = span.tolist()
            if (isinstance(span, (str, bytes)) or not isinstance(span, Sequence)
                    or len(span) != 2 or not all(_is_int(v) for v in span)):
                raise ValueError(f"step_spans[{b}][{k}] must be a (start, end) pair of ints, "
                                 f"got {span!r}")
            start, end = span
            if not 0 <= start < end <= length:
                raise ValueError(f"step_spans[{b}][{k}] = {(start, end)} must satisfy "
                                 f"0 <= start < end <= T = {length}")
            if start < previous_end:
                raise ValueError(f"step_spans[{b}] must be sorted and non-overlapping; span {k} "
                                 f"starts at {start} before the previous one ends at "
                                 f"{previous_end}")
            previous_end = end
            covered[start:end] = True
            checked.append((start, end))
        orphans = torch.nonzero(on[b] & ~covered).flatten()
        if orphans.numel():
            raise ValueError(f"step_spans[{b}] leaves policy token(s) at position(s) "
                             f"{orphans[:5].tolist()} (mask == 1) outside every step span")
        spans.append(checked)

    if step_rewards is None:
        rewards = [[0.0] * len(row) for row in spans]
    else:
        rewards = []
        for b, row in enumerate(_per_trajectory("step_rewards", step_rewards, batch)):
            if len(row) != len(spans[b]):
                raise ValueError(f"step_rewards[{b}] has {len(row)} entries, but step_spans[{b}] "
                                 f"has {len(spans[b])} steps")
            values = []
            for k, r in enumerate(row):
                if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
                    raise ValueError(f"step_rewards[{b}][{k}] must be a finite number, got {r!r}")
                values.append(float(r))
            rewards.append(values)

    keys: list[list[Hashable]] | None = None
    if state_keys is None:
        if require_states:
            raise ValueError("state_keys is required: B lists of hashable state keys, one per "
                             "step")
    else:
        keys = []
        for b, row in enumerate(_per_trajectory("state_keys", state_keys, batch)):
            if len(row) != len(spans[b]):
                raise ValueError(f"state_keys[{b}] has {len(row)} entries, but step_spans[{b}] "
                                 f"has {len(spans[b])} steps")
            for k, key in enumerate(row):
                try:
                    hash(key)
                except TypeError as err:
                    raise ValueError(f"state_keys[{b}][{k}] must be hashable: {err}") from err
            keys.append(row)
    return StepInputs(spans, rewards, keys, groups.tolist())


def step_inputs_from_extras(estimator: str, mask: torch.Tensor,
                            group_ids: Sequence[Hashable] | torch.Tensor,
                            extras: dict[str, Any], *, require_states: bool) -> StepInputs:
    """Read and check the step inputs in ``CreditBatch.extras`` (keys: :data:`STEP_EXTRAS`)."""
    needed = ["step_spans"] + (["state_keys"] if require_states else [])
    missing = [key for key in needed if extras.get(key) is None]
    if missing:
        raise ValueError(
            f"estimator {estimator!r} needs CreditBatch.extras key(s) {missing}; "
            + "; ".join(f"{key}: {STEP_EXTRAS[key]}" for key in missing)
        )
    return check_step_inputs(mask, group_ids, extras["step_spans"], extras.get("step_rewards"),
                             extras.get("state_keys"), require_states=require_states)


StepFn = Callable[[torch.Tensor, StepInputs, Any], list[list[float]]]


def register_step_estimator(name: str, *, config: type, needs_states: bool,
                            group_relative: bool | Callable[[Any], bool] = False,
                            paper: str = "", description: str = ""
                            ) -> Callable[[StepFn], StepFn]:
    """Register the decorated per-step function ``fn(outcomes [B], steps, config) -> B lists of
    per-step advantages`` as the step-level estimator ``name`` (``group_relative``: as
    :func:`~gear_rl.credit.registry.register_estimator`'s).

    The registry gets a token-level wrapper: it reads and checks the step inputs from
    ``batch.extras`` (keys :data:`STEP_EXTRAS`; ``state_keys`` required when
    ``needs_states``), runs ``fn`` and broadcasts each step's value onto its policy tokens.
    """
    def decorator(fn: StepFn) -> StepFn:
        def token_level(batch: CreditBatch, cfg: Any) -> torch.Tensor:
            check_vector("rewards", batch.rewards)
            steps = step_inputs_from_extras(name, batch.mask, batch.group_ids, batch.extras,
                                            require_states=needs_states)
            return broadcast_steps(fn(batch.rewards, steps, cfg), steps.spans, batch.mask,
                                   output_dtype(batch.rewards))

        token_level.__qualname__ = f"{fn.__qualname__}[token_level]"
        token_level.__module__ = fn.__module__
        register_estimator(name, config=config, step_fn=fn, needs_states=needs_states,
                           group_relative=group_relative, paper=paper,
                           description=description)(token_level)
        return fn

    return decorator


def _checked_run(name: str, rewards: torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor,
                 mask: torch.Tensor, step_spans: Sequence[Sequence[tuple[int, int]]],
                 step_rewards: Sequence[Sequence[float]] | None,
                 state_keys: Sequence[Sequence[Hashable]] | None,
                 config: Any | None) -> tuple[StepInputs, list[list[float]]]:
    estimator = get_estimator(name)
    if estimator.step_fn is None:
        raise ValueError(f"estimator {name!r} is not a per-step estimator; step-level: "
                         f"{estimator_names(step_level=True)}")
    config = estimator.make_config() if config is None else estimator.check_config(config)
    check_outcomes(rewards, mask)
    steps = check_step_inputs(mask, group_ids, step_spans, step_rewards, state_keys,
                              require_states=estimator.requires_states(config))
    return steps, estimator.step_fn(rewards, steps, config)


def per_step_advantages(
    name: str,
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    mask: torch.Tensor,
    step_spans: Sequence[Sequence[tuple[int, int]]],
    step_rewards: Sequence[Sequence[float]] | None = None,
    state_keys: Sequence[Sequence[Hashable]] | None = None,
    config: Any | None = None,
) -> list[list[float]]:
    """Per-step advantages of the step-level estimator ``name``: ``B`` lists, one float per step.

    Args:
        name: a registered step-level estimator (``turn_level``, ``gigpo``, ``gagpo``,
            ``gated_bepo``, or one from a plugin).
        rewards: ``[B]`` outcome reward per trajectory (finite, floating).
        group_ids: ``B`` hashable prompt ids, or a ``[B]`` integer tensor.
        mask: ``[B, T]`` 1 on policy tokens, 0 on padding and observations.
        step_spans: ``B`` lists of ``(start, end)`` response positions of each step.
        step_rewards: ``B`` lists of per-step rewards (``None``: all zeros).
        state_keys: ``B`` lists of hashable keys of the state each step acted in (required by
            the methods that group by state: all but ``turn_level``).
        config: the estimator's config (``None``: its defaults).
    """
    return _checked_run(name, rewards, group_ids, mask, step_spans, step_rewards, state_keys,
                        config)[1]


def step_advantages(
    name: str,
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    mask: torch.Tensor,
    step_spans: Sequence[Sequence[tuple[int, int]]],
    step_rewards: Sequence[Sequence[float]] | None = None,
    state_keys: Sequence[Sequence[Hashable]] | None = None,
    config: Any | None = None,
) -> torch.Tensor:
    """``[B, T]`` token-level advantages of the step-level estimator ``name`` (args as in
    :func:`per_step_advantages`): each step's value on its policy tokens, 0 where
    ``mask == 0``; float64 if ``rewards`` is, else float32."""
    steps, values = _checked_run(name, rewards, group_ids, mask, step_spans, step_rewards,
                                 state_keys, config)
    return broadcast_steps(values, steps.spans, mask, output_dtype(rewards))


def spans_from_step_ids(step_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Step spans from a ``[B, T]`` integer step index per position (the agent loop's
    ``turn_ids``; -1 on padding). Each step's span runs from its first to its last position,
    so observations that carry a turn's index join that turn's span (and stay 0 via ``mask``).
    Steps must appear in increasing order in each row.
    """
    if not isinstance(step_ids, torch.Tensor) or step_ids.dim() != 2:
        raise ValueError("step_ids must be a [B, T] integer tensor")
    if step_ids.is_floating_point() or step_ids.is_complex():
        raise ValueError(f"step_ids must be an integer tensor, got dtype {step_ids.dtype}")
    spans = []
    for b, row in enumerate(step_ids.tolist()):
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for t, k in enumerate(row):
            if k < 0:
                continue
            first.setdefault(k, t)
            last[k] = t
        order = sorted(first)
        row_spans = [(first[k], last[k] + 1) for k in order]
        for (_, end), (start, _) in itertools.pairwise(row_spans):
            if start < end:
                raise ValueError(f"step_ids[{b}]: steps interleave; each step's positions must "
                                 "be contiguous and in increasing step order")
        spans.append(row_spans)
    return spans


def broadcast_steps(step_values: Sequence[Sequence[float]],
                    spans: Sequence[Sequence[tuple[int, int]]], mask: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[B, T]`` tensor holding ``step_values[b][k]`` on step ``k``'s positions, times ``mask``
    (so 0 on observation and padding tokens and outside every span)."""
    batch, length = mask.shape
    out = torch.zeros((batch, length), dtype=torch.float64)
    for b, (values, row) in enumerate(zip(step_values, spans, strict=True)):
        for value, (start, end) in zip(values, row, strict=True):
            out[b, start:end] = float(value)
    out = out * mask.detach().to(device="cpu", dtype=torch.float64)
    return out.to(device=mask.device, dtype=dtype)


def output_dtype(rewards: torch.Tensor) -> torch.dtype:
    """float64 when the rewards are float64, else float32."""
    return torch.float64 if rewards.dtype == torch.float64 else torch.float32


def check_outcomes(rewards: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """``rewards`` must be a finite floating ``[B]`` tensor matching ``mask``'s rows."""
    check_vector("rewards", rewards)
    check_mask(mask, values=False)
    if rewards.shape[0] != mask.shape[0]:
        raise ValueError(f"rewards has batch size {rewards.shape[0]}, but mask has "
                         f"{mask.shape[0]}")
    return [float(r) for r in rewards.tolist()]


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_k = sum_{j >= k} gamma^(j - k) r_j`` for one trajectory."""
    out = [0.0] * len(rewards)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = rewards[k] + gamma * running
        out[k] = running
    return out


def gae(deltas: Sequence[float], gamma: float, lam: float) -> list[float]:
    """``A_k = sum_{j >= k} (gamma * lam)^(j - k) delta_j`` for one trajectory."""
    return discounted_returns(deltas, gamma * lam)


def group_normalize(values: Sequence[float], keys: Sequence[Hashable], mode: str, eps: float
                    ) -> list[float]:
    """Centre each value on the mean of the values sharing its key, then (``mean_std_norm``)
    divide by that set's unbiased std plus ``eps``. Sets of one give 0 (no baseline)."""
    if mode not in (*NORM_MODES, "none"):
        raise ValueError(f"normalisation mode must be one of {(*NORM_MODES, 'none')}, "
                         f"got {mode!r}")
    if mode == "none":
        return [float(v) for v in values]
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    out = [0.0] * len(values)
    for index in members.values():
        if len(index) < 2:
            continue
        vals = [float(values[i]) for i in index]
        if max(vals) == min(vals):
            continue  # exactly 0, not rounding noise over a rounding-noise std
        mean = math.fsum(vals) / len(vals)
        centred = [v - mean for v in vals]
        if mode == "mean_std_norm":
            std = math.sqrt(math.fsum(c * c for c in centred) / (len(vals) - 1))
            centred = [c / (std + eps) for c in centred]
        for i, c in zip(index, centred, strict=True):
            out[i] = c
    return out
