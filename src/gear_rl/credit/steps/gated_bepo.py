"""Gated-BEPO: Bellman backups over the empirical rollout graph, with a confidence gate.

Named beside GAGPO in arXiv 2608.06861, whose stored text has neither equations nor code; this
is the project's resolved reading (docs/design.md, "Step-level methods"), the gated
Bellman-expectation variant of critic-free step credit. Every step below is that reading and
every open choice is a knob of :class:`GatedBEPOConfig`:

1. **Graph.** Per prompt group, the nodes are the distinct state keys its trajectories visited
   (never shared across prompts). Every step ``k`` of a trajectory adds one observed transition
   ``s_k -> s_{k+1}`` with reward ``r_k``; the last step's transition goes to the terminal
   node, whose value is 0 and whose reward carries the outcome (``outcome_in_returns``, see
   :mod:`gear_rl.credit.steps.common`): "terminal value = outcome" is read as "the transition
   into termination pays the outcome", so the last state's value is the outcome undiscounted,
   the same convention as GiGPO's and GAGPO's returns. Transitions are pooled over the group
   and counted with multiplicity.
2. **Values: mean-backup Bellman fixed point.** ``V(s) = mean over the transitions out of s of
   (r + gamma * V(s'))``, iterated from ``V = 0`` until the largest change is at most ``tol``.
   Cycles are allowed: every visited state has an observed path to termination (its own
   trajectory's rest), so the backup is a contraction on the visited states even at
   ``gamma = 1`` and the iteration converges; ``max_iters`` bounds it and a non-converged run
   raises ``ValueError`` instead of returning a half-converged value.
3. **Bellman residuals** along each trajectory: ``delta_k = r_k + gamma * V(s_{k+1}) - V(s_k)``
   (0 after the last step), accumulated with **GAE**: ``A_k = sum_j (gamma * lam)^j
   delta_{k+j}``.
4. **Confidence gate.** A step gets ``A_k`` only where its state has at least
   ``min_successors`` distinct observed successors in the group (a real branching point whose
   backup compares alternatives); elsewhere it gets the episode-level GRPO advantage of its
   trajectory. A terminal successor is identified by its transition reward, so ending in
   success and ending in failure from the same state count as two successors.

Open choices, as knobs: ``gamma``, ``lam``, ``min_successors``, ``tol``/``max_iters``, and
``step_norm``: whether the gated step credits are group-normalised (over every step of the
prompt group, before gating) to the episode advantage's scale (default ``none``: raw GAE, which
for 0/1 outcomes is already of order 1).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from gear_rl.credit.config import _finite
from gear_rl.credit.grpo import grpo_advantages
from gear_rl.credit.steps.common import (
    NORM_MODES,
    StepConfig,
    StepInputs,
    gae,
    group_normalize,
    register_step_estimator,
)
from gear_rl.dataclass_config import check_int

STEP_NORM_MODES = ("none", *NORM_MODES)
_TERMINAL = -1


class _End:
    """The terminal successor in :func:`bellman_graph` transitions (value 0)."""

    def __repr__(self) -> str:
        return "END"


END = _End()


@dataclass(frozen=True)
class GatedBEPOConfig(StepConfig):
    """Gated-BEPO knobs.

    Attributes:
        lam: GAE ``lambda`` in ``[0, 1]`` over the Bellman residuals.
        min_successors: a state's step credit is trusted when it has at least this many
            distinct observed successors (the gate); 1 turns the gate off.
        tol: value iteration stops when no value changes by more than ``tol``.
        max_iters: value iteration limit; not converging within it raises ``ValueError``.
        step_norm: ``none``, ``mean_std_norm`` or ``mean_norm`` of the step credits over the
            prompt group's steps, before gating.
    """

    lam: float = 0.95
    min_successors: int = 2
    tol: float = 1e-10
    max_iters: int = 100_000
    step_norm: str = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("lam", self.lam)
        _finite("tol", self.tol)
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if self.tol <= 0:
            raise ValueError(f"tol must be > 0, got {self.tol}")
        for name in ("min_successors", "max_iters"):
            check_int(name, getattr(self, name), 1)
        if self.step_norm not in STEP_NORM_MODES:
            raise ValueError(f"step_norm must be one of {STEP_NORM_MODES}, "
                             f"got {self.step_norm!r}")


@dataclass(frozen=True)
class StateGraph:
    """The empirical graph of one prompt group.

    Attributes:
        nodes: state key -> node index.
        values: ``V`` per node (the Bellman fixed point).
        successors: per node, how many distinct successors were observed.
        iterations: value-iteration sweeps used.
    """

    nodes: dict[Hashable, int]
    values: list[float]
    successors: list[int]
    iterations: int


def bellman_graph(transitions: Sequence[tuple[Hashable, float, Hashable]], gamma: float,
                  tol: float = 1e-10, max_iters: int = 100_000) -> StateGraph:
    """Mean-backup values of the graph made of ``transitions``.

    Args:
        transitions: ``(state, reward, next_state)`` triples; ``next_state is END`` marks a
            transition into termination (value 0).
        gamma, tol, max_iters: as in :class:`GatedBEPOConfig`.
    """
    nodes: dict[Hashable, int] = {}
    for s, _, _ in transitions:
        nodes.setdefault(s, len(nodes))
    for _, _, nxt in transitions:
        if nxt is not END and nxt not in nodes:
            raise ValueError(f"state {nxt!r} is a successor but never acted in (every "
                             "non-terminal successor must have outgoing transitions)")
    n = len(nodes)
    src = torch.tensor([nodes[s] for s, _, _ in transitions], dtype=torch.long)
    dst = torch.tensor([_TERMINAL if x is END else nodes[x] for _, _, x in transitions],
                       dtype=torch.long)
    rew = torch.tensor([float(r) for _, r, _ in transitions], dtype=torch.float64)
    count = torch.zeros(n, dtype=torch.float64).index_add_(0, src, torch.ones_like(rew))
    distinct: list[set[object]] = [set() for _ in range(n)]
    for s, r, x in transitions:
        distinct[nodes[s]].add((END, float(r)) if x is END else ("state", x))

    live = dst >= 0
    safe_dst = torch.where(live, dst, torch.zeros_like(dst))
    values = torch.zeros(n, dtype=torch.float64)
    iterations = 0
    for _ in range(max_iters):
        iterations += 1
        backup = rew + gamma * torch.where(live, values[safe_dst], torch.zeros_like(rew))
        new = torch.zeros(n, dtype=torch.float64).index_add_(0, src, backup) / count
        change = float((new - values).abs().max()) if n else 0.0
        values = new
        if change <= tol:
            break
    else:
        raise ValueError(f"Bellman value iteration did not converge within max_iters="
                         f"{max_iters} (last change {change:.3g} > tol={tol}); raise max_iters "
                         "or tol, or lower gamma")
    return StateGraph(nodes, values.tolist(), [len(d) for d in distinct], iterations)


@register_step_estimator("gated_bepo", config=GatedBEPOConfig, needs_states=True,
                         paper="arXiv 2608.06861 (reading: docs/design.md)",
                         description="Gated-BEPO: Bellman backups on the rollout graph, "
                                     "gated at branching states")
def gated_bepo(outcomes: torch.Tensor, steps: StepInputs, config: GatedBEPOConfig
               ) -> list[list[float]]:
    """Per-step Gated-BEPO advantages from checked inputs (``steps.state_keys`` must be set)."""
    if steps.state_keys is None:
        raise ValueError("state_keys is required for Gated-BEPO's state graph")
    episode = grpo_advantages(outcomes.double(), steps.groups, norm_by_std=config.norm_by_std,
                              eps=config.eps).tolist()
    stream = steps.returns_rewards(outcomes.tolist(), config.outcome_in_returns)
    by_group: dict[int, list[int]] = {}
    for b, g in enumerate(steps.groups):
        by_group.setdefault(g, []).append(b)

    credit = [[0.0] * len(r) for r in stream]
    trusted = [[False] * len(r) for r in stream]
    for rows in by_group.values():
        transitions = []
        for b in rows:
            keys = steps.state_keys[b]
            for k, r in enumerate(stream[b]):
                transitions.append((keys[k], r, keys[k + 1] if k + 1 < len(keys) else END))
        if not transitions:
            continue
        graph = bellman_graph(transitions, config.gamma, config.tol, config.max_iters)
        for b in rows:
            v = [graph.values[graph.nodes[key]] for key in steps.state_keys[b]]
            deltas = [r + config.gamma * (v[k + 1] if k + 1 < len(v) else 0.0) - v[k]
                      for k, r in enumerate(stream[b])]
            credit[b] = gae(deltas, config.gamma, config.lam)
            trusted[b] = [graph.successors[graph.nodes[key]] >= config.min_successors
                          for key in steps.state_keys[b]]

    if config.step_norm != "none":
        flat = [a for row in credit for a in row]
        keys = [steps.groups[b] for b, row in enumerate(credit) for _ in row]
        normalized = iter(group_normalize(flat, keys, config.step_norm, config.eps))
        credit = [[next(normalized) for _ in row] for row in credit]
    return [[a if gate else episode[b] for a, gate in zip(credit[b], trusted[b], strict=True)]
            for b in range(len(stream))]

