"""A credit check end to end: sample trajectories in prompt groups, estimate their Monte-Carlo
truth, score every applicable estimator and the variants asked for, write the results.

1. **Trajectories.** ``groups`` problems of the task (a seeded draw), K responses each, sampled
   by the trainer's own rollout (:func:`gear_rl.train.episodes.collect` with the run's sampler,
   temperature, top-p and ``max_new_tokens``), in batches of ``rollout.prompts_per_step`` groups
   as in a training step. Saved once to ``trajectories.json``.
2. **Truth.** For ``per_group`` trajectories of each mixed group: ``V`` at the chosen
   boundaries from ``continuations`` continuations per boundary and replicate
   (:func:`gear_rl.mc_values.estimate_prefix_values`; for an agent task, whose
   boundaries sit before policy tokens only,
   :func:`~gear_rl.mc_values.estimate_episode_values`: the episode loop resumed from
   each prefix, the rest of its turn, tool calls and later turns; for an environment task the
   same, the environment's state at the prefix rebuilt by replaying its turns from the level's
   seed, :func:`gear_rl.agent.env_loop.run_env_episodes`). Each trajectory's record is
   appended to ``values.jsonl`` as it completes; a restart skips the recorded ones, and every
   trajectory's random streams depend only on the seed and its row, so a resumed check gives
   the uninterrupted one's numbers.
3. **Signals and credit.** The trainer's signal pass (:func:`gear_rl.signals.token_signals`:
   student log-probs and entropy, teacher log-probs and divergence) on every row, once per
   distinct signal setting, and every estimator on :class:`~gear_rl.credit.CreditBatch` es of
   the same batches a training step would form.
4. **Scores** (:mod:`gear_rl.credit_check.scores`) and the outputs
   (:mod:`gear_rl.credit_check.output`).

Single-turn, agent (tool) and environment tasks (:func:`check_task` refuses a task without
a scorer).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from gear_rl.agent.loop import EpisodePrefix
from gear_rl.credit import CreditBatch, Estimator, estimator_names, gear_segments, get_estimator
from gear_rl.credit.config import OutcomeConfig
from gear_rl.credit.grpo import outcome_advantages
from gear_rl.credit_check.config import CreditCheckConfig, Variant
from gear_rl.credit_check.output import write_outputs
from gear_rl.credit_check.scores import (
    Interval,
    TrajectoryUnits,
    paired_difference,
    score_estimate,
    span_shares,
    span_sums,
    truth_summary,
)
from gear_rl.dataclass_config import check_folder, check_output_folder
from gear_rl.mc_values import (
    ContinueFn,
    PrefixValues,
    choose_boundaries,
    estimate_episode_values,
    estimate_prefix_values,
)
from gear_rl.rundir import (
    CREDIT_CHECK_DIR,
    CREDIT_CHECK_JSON,
    CREDIT_CHECK_MC_ROWS,
    CREDIT_CHECK_MD,
    CREDIT_CHECK_PNG,
    CREDIT_CHECK_TRAJECTORIES,
    CREDIT_CHECK_VALUES,
    LOCK,
    RunDir,
    append_jsonl,
    atomic_write_text,
    cpu_model,
    read_jsonl,
)
from gear_rl.seeding import sequence_seed
from gear_rl.signals import TeacherPromptConfig
from gear_rl.signals import prompt_ids as build_prompt_ids
from gear_rl.tasks import Problem, Task
from gear_rl.train.config import SignalConfig, TrainConfig, config_from_dict, recorded_config
from gear_rl.train.episodes import collect, monte_carlo_extras, step_extras, task_reward_fn
from gear_rl.train.export import read_export_info
from gear_rl.train.runtime import (
    Runtime,
    agent_limits,
    build_runtime,
    config_task,
    rollout_settings,
)
from gear_rl.train.scoring import (
    SignalPass,
    check_prompts_fit,
    score_in_chunks,
    teacher_config,
    teacher_prompt,
)

__all__ = ["CreditCheckResult", "EstimatorRow",
           "check_task", "credit_check", "plan_rows", "run_check_config", "task_reward_fn"]

# What every single-turn trajectory provides an estimator (all of CreditBatch's signals).
_PROVIDED = frozenset({"divergence", "entropy", "student_logprobs", "teacher_logprobs"})


def check_task(task: Task) -> None:
    """Refuse a task the credit check cannot score: one without a scorer (an environment task
    is scored by its game, which needs a level seed per problem). Agent (tool) and environment
    tasks are continued episode by episode
    (:func:`~gear_rl.mc_values.estimate_episode_values`)."""
    if task.env is not None:
        unseeded = [p.id for p in (*task.train, *task.eval) if "env_seed" not in p.metadata]
        if unseeded:
            raise ValueError(
                f"task {task.name!r} is an environment task, but problem {unseeded[0]!r} (and "
                f"{len(unseeded) - 1} more) has no metadata['env_seed']: an episode is "
                "continued by replaying its turns in the level the seed makes")
        return
    if not callable(getattr(task, "scorer", None)):
        raise ValueError(f"task {task.name!r} has no scorer (Task.scorer is "
                         f"{getattr(task, 'scorer', None)!r}): the truth is the expected score "
                         "of continuations, so the task must score a response")


@dataclass
class EstimatorRow:
    """One scored reading: an estimator, its config and its signal settings.

    Attributes:
        label: the row's name (the estimator's, a variant's, or ``run:<estimator>``).
        estimator: the registered estimator.
        config: its config.
        signals: the signal settings it sees.
        variant: True for a variant asked for.
    """

    label: str
    estimator: Estimator
    config: Any
    signals: SignalConfig
    variant: bool = False


def _inapplicable(estimator: Estimator, config: Any = None, *, turns: bool = False,
                  states: bool = False) -> str | None:
    """Why the task cannot give ``estimator`` (with ``config``) what it needs (None: it can).
    ``turns``: the trajectories have turns (step spans; an agent or environment task);
    ``states``: and environment states (an environment task)."""
    if not estimator.uses_reward:
        return ("its credit is a distillation loss, not an advantage (uses_reward=False): "
                "there is no per-token advantage to score")
    if estimator.step_level and not turns:
        return ("it assigns credit per turn from step spans (and state keys), which only "
                "multi-turn tasks have; this task is single-turn")
    if estimator.step_level and not states and estimator.requires_states(config):
        return ("it groups steps by environment state, which an agent (tool) task does not "
                "have (only environment tasks do)")
    missing = sorted(set(estimator.needs) - _PROVIDED)
    if missing:
        return f"it needs {missing}, which the signal pass does not provide"
    if estimator.mc_boundaries is not None and turns:
        return ("its credit comes from Monte-Carlo continuations of single responses (gear-rl "
                "train's values phase), which multi-turn episodes do not have yet")
    return None


def plan_rows(check: CreditCheckConfig, config: TrainConfig, task: Task | None = None
              ) -> tuple[list[EstimatorRow], dict[str, str]]:
    """The rows to score and the registered estimators left out (name -> why).

    ``check.estimators`` None: every registered estimator the task can feed, with its default
    config and the run's signals, plus ``run:<estimator>`` with the run's ``credit`` settings
    when it has any. Step-level estimators are scored on multi-turn tasks: those that need no
    environment state (``turn_level``) on agent tasks (``task.agent`` set), all of them on
    environment tasks (``task.env``); ``task`` None: a single-turn task. Named estimators and
    variants that cannot run raise ``ValueError`` naming what they miss.
    """
    states = task is not None and task.env is not None
    turns = states or (task is not None and task.agent is not None)
    config.credit_estimator()  # plugins first: they may register estimators
    check.validate()
    rows: list[EstimatorRow] = []
    skipped: dict[str, str] = {}
    names = estimator_names() if check.estimators is None else list(check.estimators)
    for name in names:
        estimator = get_estimator(name)
        why = _inapplicable(estimator, turns=turns, states=states)
        if why is not None:
            if check.estimators is not None:
                raise ValueError(f"estimator {name!r} cannot be scored here: {why}")
            skipped[name] = why
            continue
        rows.append(EstimatorRow(name, estimator, estimator.make_config(), config.signals))
    if config.credit and config.estimator not in skipped:
        run_estimator = get_estimator(config.estimator)
        run_credit = config.credit_config(run_estimator)
        if _inapplicable(run_estimator, run_credit, turns=turns, states=states) is None:
            rows.append(EstimatorRow(f"run:{config.estimator}", run_estimator, run_credit,
                                     config.signals))
    taken = {row.label for row in rows}
    for name, variant in check.variants.items():
        variant = cast(Variant, variant)
        if name in taken:
            raise ValueError(f"variant name {name!r} is already a row (a registered estimator "
                             "or another variant); choose another name")
        estimator = get_estimator(variant.estimator)
        # what the estimator needs first, then what its config makes it need (state keys)
        why = _inapplicable(estimator, turns=turns, states=states)
        if why is None:
            try:
                credit = estimator.make_config(**dict(variant.credit))
            except (TypeError, ValueError) as error:
                raise ValueError(f"variant.{name}.credit: {error}") from error
            why = _inapplicable(estimator, credit, turns=turns, states=states)
        if why is not None:
            raise ValueError(f"variant {name!r}: estimator {variant.estimator!r} cannot be "
                             f"scored here: {why}")
        rows.append(EstimatorRow(name, estimator, credit,
                                 variant.signal_config(config.signals, name), variant=True))
        taken.add(name)
    # the default reference (gear) may be absent (estimators=...); one asked for must be a row
    if (check.reference is not None and check.reference not in taken
            and check.reference != CreditCheckConfig.reference):
        raise ValueError(f"reference {check.reference!r} is not a scored row; rows: "
                         f"{sorted(taken)}")
    return rows, skipped


@dataclass
class CreditCheckResult:
    """What :func:`credit_check` produced.

    Attributes:
        out: the output folder.
        complete: every chosen trajectory has its truth (False: the token budget stopped it).
        data: what ``credit_check.json`` holds (settings, scores, trajectories).
        table: the markdown table of scores (as printed).
        markdown, json, plot: the files written (``plot`` None when nothing was drawn).
    """

    out: Path
    complete: bool
    data: dict[str, Any]
    table: str
    markdown: Path
    json: Path
    plot: Path | None = None


def run_check_config(run_dir: str | Path, overrides: dict[str, Any] | None = None
                     ) -> tuple[TrainConfig, Path, int]:
    """The config of a training run, its newest intact checkpoint and that checkpoint's step.

    ``overrides`` may set only what does not change the sampler, the task or the signals:
    ``device``, ``threads``, ``precision``, ``rollout.batch_size``, ``signals.batch_size``,
    ``signals.chunk_size``, ``plugins``. Raises ``ValueError`` for a folder that is not a run,
    a run without a checkpoint, or another override.
    """
    run = RunDir(check_folder(run_dir, "run directory"))  # a file, a FIFO...: says which
    if not run.is_run():
        raise ValueError(f"{run.path} is not a gear-rl run directory (no config.yaml); give a "
                         "run directory, or model=... task=... to check a model")
    checkpoint = run.latest_checkpoint(verify=True)
    if checkpoint is None:
        raise ValueError(f"{run.path} has no intact checkpoint (the run stopped before its "
                         "first one?); to check the run's starting weights pass model=... "
                         "task=... instead of the run directory")
    config = recorded_config(run.read_config())
    config.resume = None
    config.out = None
    allowed = ("device", "threads", "precision", "rollout.batch_size", "signals.batch_size",
               "signals.chunk_size", "plugins")
    for key in overrides or {}:
        if key not in allowed:
            raise ValueError(f"{key!r} cannot change when checking a run (the truth is the "
                             f"run's own sampler, task and signals); allowed: "
                             f"{', '.join(allowed)}; other signal settings are variants "
                             "(variant.NAME.signals.KEY=...)")
    config_from_dict(dict(overrides or {}), config)
    config.validate()
    state = checkpoint / "state.json"
    step = int(json.loads(state.read_text())["step"]) if state.is_file() else 0
    return config, checkpoint, step


# ------------------------------------------------------------------------------ the folder
def _open_out(out: Path) -> RunDir:
    """Lock ``out`` for this check, refusing a run directory or a foreign non-empty folder."""
    check_output_folder(out, "out")
    if RunDir(out).is_run():
        raise ValueError(f"out: {out} is a training run's folder; the check writes its own "
                         f"files (default RUN_DIR/{CREDIT_CHECK_DIR})")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"out: cannot create {out}: {error.strerror}") from error
    ours = {CREDIT_CHECK_TRAJECTORIES, CREDIT_CHECK_VALUES, CREDIT_CHECK_MC_ROWS,
            CREDIT_CHECK_JSON, CREDIT_CHECK_MD, CREDIT_CHECK_PNG, LOCK}
    foreign = [p.name for p in out.iterdir() if p.name not in ours and not p.name.startswith(".")]
    if foreign and not (out / CREDIT_CHECK_TRAJECTORIES).is_file():
        raise ValueError(f"out: {out} is not empty and holds no credit check ({foreign[0]}, "
                         "...); choose another out")
    folder = RunDir(out)
    folder.lock(user="credit check")
    return folder


def _settings_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    keys = sorted(set(saved) | set(current))
    return [f"{key}: {saved.get(key)!r} there, {current.get(key)!r} now" for key in keys
            if saved.get(key) != current.get(key)]


def _read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file the check appends to; a half-written last line (a kill
    mid-write) is dropped and the file rewritten without it, so appends start on a new line."""
    if not path.is_file():
        return []
    records = read_jsonl(path, drop_partial_last=True)
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    return records


def _read_values(path: Path) -> dict[int, dict[str, Any]]:
    """The recorded trajectories of ``values.jsonl`` by row (:func:`_read_records`)."""
    return {int(r["row"]): r for r in _read_records(path)}


# ------------------------------------------------------------------------------ signals
def _teacher_config(settings: SignalConfig) -> TeacherPromptConfig:
    return teacher_config(settings.placement, settings.answer_template)


def _signal_key(settings: SignalConfig) -> tuple[Any, ...]:
    return (settings.divergence, settings.topk, settings.placement, settings.answer_template)


@torch.no_grad()
def _signals(runtime: Runtime, temperature: float, settings: SignalConfig,
             rows: list[dict[str, Any]], problems: list[Problem]) -> dict[str, torch.Tensor]:
    """The trainer's no-grad signal pass (:class:`gear_rl.train.scoring.SignalPass`, as
    ``Trainer.score`` runs it) over ``rows``: ``[N, T]`` CPU float32 student log-probs, entropy,
    teacher log-probs, divergence and mask."""
    teacher = _teacher_config(settings)
    signals = SignalPass(runtime.model, temperature=temperature,
                         chunk_size=settings.chunk_size, divergence=settings.divergence,
                         topk=settings.topk)

    def compute(chunk: list[int]) -> dict[str, torch.Tensor]:
        with runtime.autocast_context():
            fields = signals([rows[i]["prompt_ids"] for i in chunk],
                             [teacher_prompt(runtime.tokenizer, problems[i], teacher)
                              for i in chunk],
                             [rows[i]["response_ids"] for i in chunk],
                             [rows[i].get("policy_mask") or [1] * len(rows[i]["response_ids"])
                              for i in chunk])
        fields["student_logprobs"] = fields.pop("logprobs")
        return {name: value.cpu() for name, value in fields.items()}

    length = max(len(r["response_ids"]) for r in rows)
    return score_in_chunks(len(rows), settings.batch_size, length, compute)


def _step_extras(row: EstimatorRow, trajectories: list[dict[str, Any]],
                 members: list[int]) -> dict[str, Any]:
    """A step-level estimator's ``CreditBatch.extras`` for the trajectories ``members``: their
    turns' spans and, when the task pays turn rewards, those rewards, and an environment's
    state keys (their ``repr``: equal states, equal text), as the trainer passes them ({} for
    a token-level estimator)."""
    if not row.estimator.step_level:
        return {}
    chosen = [trajectories[i] for i in members]
    if any("step_spans" not in t for t in chosen):
        raise ValueError(f"{row.label}: the trajectories carry no turns (step spans): a "
                         "step-level estimator needs a multi-turn task's episodes")
    rewards = ([t["step_rewards"] for t in chosen] if any("step_rewards" in t for t in chosen)
               else None)
    states = ([t["state_keys"] for t in chosen] if any("state_keys" in t for t in chosen)
              else None)
    return step_extras([[tuple(s) for s in t["step_spans"]] for t in chosen], rewards,
                       states) or {}


MonteCarloFn = Callable[[EstimatorRow, int, list[int], CreditBatch], dict[str, Any]]
"""``mc(row, batch_number, members, batch) -> extras``: a Monte-Carlo row's values of one
batch (``gear_rl.train.episodes.monte_carlo_extras``, drawn independently of the truth)."""


def _advantages(row: EstimatorRow, signals: dict[str, torch.Tensor], rewards: torch.Tensor,
                groups: list[int], batches: list[list[int]], step: int,
                trajectories: list[dict[str, Any]],
                mc: MonteCarloFn | None = None) -> torch.Tensor:
    """``[N, T]`` the row's token advantages, computed batch by batch as a training step
    would (a batch-level rule such as top-entropy's cut sees one step's groups);
    ``trajectories`` are the sampled rows (a step-level estimator reads their turns); ``mc``
    gives a Monte-Carlo estimator (SPO-chain, VinePPO) its values, as the trainer's values
    phase does."""
    out = torch.zeros_like(signals["mask"])
    for number, members in enumerate(batches):
        index = torch.tensor(members)
        batch = CreditBatch(
            rewards=rewards[index], group_ids=[groups[i] for i in members],
            mask=signals["mask"][index], divergence=signals["divergence"][index],
            entropy=signals["entropy"][index],
            student_logprobs=signals["student_logprobs"][index],
            teacher_logprobs=signals["teacher_logprobs"][index], step=step,
            applies_update_mask=True, extras=_step_extras(row, trajectories, members))
        if row.estimator.mc_boundaries is not None:
            if mc is None:
                raise ValueError(f"row {row.label!r} needs Monte-Carlo values (mc=)")
            batch.extras = {**(batch.extras or {}), **mc(row, number, members, batch)}
        advantages = row.estimator(batch, row.config).float()
        # an update-time selection (top-entropy's micro_batch) keeps only the tokens it
        # selects by the policy's entropy, here over the whole step batch
        selected = row.estimator.select_for_update(signals["entropy"][index], batch.mask,
                                                   row.config)
        if selected is not None:
            advantages = advantages * selected.to(advantages.dtype)
        out[index] = advantages.cpu()
    return out


# ------------------------------------------------------------------------------ the check
def _draw_problems(task: Task, check: CreditCheckConfig) -> tuple[list[int], Sequence[Problem]]:
    pool = task.train if check.split == "train" else task.eval
    if check.groups > len(pool):
        raise ValueError(f"groups={check.groups} exceeds the task's {len(pool)} {check.split} "
                         "problems")
    order = list(range(len(pool)))
    random.Random(sequence_seed(check.seed, 17)).shuffle(order)
    return order[:check.groups], pool


def _sample(runtime: Runtime, config: TrainConfig, check: CreditCheckConfig, task: Task,
            chosen: list[int], pool: Sequence[Problem]) -> list[dict[str, Any]]:
    """The trajectories: K responses per chosen problem, a training step's batch at a time."""
    rollout, k = config.rollout, config.rollout.samples_per_prompt
    rows: list[dict[str, Any]] = []
    for batch_index, start in enumerate(range(0, len(chosen), rollout.prompts_per_step)):
        indices = chosen[start:start + rollout.prompts_per_step]
        problems = [pool[i] for i in indices for _ in range(k)]
        prompts = [build_prompt_ids(runtime.tokenizer, p.prompt) for p in problems]
        generator = torch.Generator(device=runtime.device).manual_seed(
            sequence_seed(check.seed, 1, batch_index))
        result = collect(task, problems, prompts, **rollout_settings(config, runtime),
                         generator=generator)
        for j, problem in enumerate(problems):
            row = {
                "row": len(rows), "batch": batch_index, "group": start + j // k,
                "problem_index": indices[j // k], "problem_id": problem.id,
                "prompt_ids": prompts[j], "response_ids": result.response_ids[j],
                "finished": result.finished[j], "reward": float(result.rewards[j]),
                "text": result.texts[j], "extracted": result.extracted[j]}
            if result.policy_masks is not None:  # an episode: observations are context
                row["policy_mask"] = list(result.policy_masks[j])
                row["turn_ids"] = list(cast(list, result.turn_ids)[j])
                row["step_spans"] = [list(span) for span in cast(list, result.step_spans)[j]]
                if result.step_rewards is not None:  # turn rewards (turn_level, step methods)
                    row["step_rewards"] = list(result.step_rewards[j])
                if result.state_keys is not None:  # an environment's states, as text
                    row["state_keys"] = [repr(key) for key in result.state_keys[j]]
            rows.append(row)
    return rows


def _episode_continuer(runtime: Runtime, config: TrainConfig, task: Task, problem: Problem,
                       prompt: list[int]) -> ContinueFn:
    """The :data:`~gear_rl.mc_values.ContinueFn` of one agent or environment
    trajectory: its episodes finished from prefixes by the trainer's episode loop, scored as
    in training (the task's scorer, or the game's solve)."""
    settings = rollout_settings(config, runtime)

    def continue_fn(prefixes: list[EpisodePrefix], generator: torch.Generator
                    ) -> tuple[list[float], int]:
        result = collect(task, [problem] * len(prefixes), [prompt] * len(prefixes),
                         generator=generator, prefixes=prefixes, **settings)
        masks = cast(list, result.policy_masks)
        tokens = sum(sum(mask[len(prefix.response_ids):])
                     for mask, prefix in zip(masks, prefixes, strict=True))
        return [float(r) for r in result.rewards], tokens

    return continue_fn


def _choose_truth(rows: list[dict[str, Any]], check: CreditCheckConfig) -> list[int]:
    """The rows whose truth is estimated: per group (in order), ``per_group`` of its rows,
    alternately the best and the worst rewarded."""
    by_group: dict[int, list[int]] = {}
    for row in rows:
        by_group.setdefault(int(row["group"]), []).append(int(row["row"]))
    chosen: list[int] = []
    for members in by_group.values():
        rewards = [rows[i]["reward"] for i in members]
        if check.mixed_only and max(rewards) == min(rewards):
            continue
        ranked = sorted(members, key=lambda i: (-rows[i]["reward"], i))
        picks: list[int] = []
        low, high = 0, len(ranked) - 1
        while low <= high and len(picks) < check.per_group:
            picks.append(ranked[low])
            low += 1
            if low <= high and len(picks) < check.per_group:
                picks.append(ranked[high])
                high -= 1
        chosen.extend(sorted(picks))
    if check.trajectories is not None:
        chosen = chosen[:check.trajectories]
    return chosen


def _segment_config(config: TrainConfig) -> tuple[Estimator, Any]:
    """The GEAR estimator and config whose segments the report uses: the run's estimator when
    it has segments, else ``gear`` with its defaults."""
    estimator = config.credit_estimator()
    if estimator.segments:
        return estimator, config.credit_config(estimator)
    gear = get_estimator("gear")
    return gear, gear.make_config()


@torch.no_grad()
def _weights_fingerprint(model: torch.nn.Module) -> str:
    """A short digest of the weights (each tensor's shape and float64 sum): a folder's check
    continues only on the weights it was started with."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        total = float(parameter.sum(dtype=torch.float64))
        digest.update(f"{name}{tuple(parameter.shape)}{total:.10e}".encode())
    return digest.hexdigest()[:16]


def _machine(device: torch.device) -> str:
    name = cpu_model()
    if device.type == "cuda":
        name = f"{torch.cuda.get_device_name(device)} (host: {name})"
    return f"{name}, {torch.get_num_threads()} torch threads, device {device}"


def credit_check(
    config: TrainConfig,
    check: CreditCheckConfig | None = None,
    out: str | Path = CREDIT_CHECK_DIR,
    *,
    checkpoint: str | Path | None = None,
    checkpoint_step: int = 0,
    model: torch.nn.Module | None = None,
    tokenizer: Any = None,
    task: Task | None = None,
) -> CreditCheckResult:
    """Run (or continue) a credit check and write ``credit_check.md``, ``credit_check.json``
    and ``credit_check.png`` into ``out``.

    Args:
        config: the trainer's settings: model, task, rollout (sampler), signals, device.
        check: the check's own settings (default :class:`CreditCheckConfig`).
        out: the output folder; a folder holding an unfinished check with the same settings
            is continued.
        checkpoint: weights to load (a run directory or a checkpoint folder; see
            :func:`run_check_config`). ``checkpoint_step``: its training step (the credit is
            the next step's, ``CreditBatch.step = checkpoint_step + 1``).
        model, tokenizer: an already-loaded policy (a TRL or verl user's); None loads
            ``config.model``.
        task: an already-built task; None builds ``config.task``.

    Raises:
        ValueError: for a task the check cannot run (:func:`check_task`), an estimator or
            variant whose inputs are missing (:func:`plan_rows`), an ``out`` holding other
            settings or other files.
    """
    check = check if check is not None else CreditCheckConfig()
    config.validate()  # a bad estimator or credit key fails here, before the task loads
    check.check_memory(config)
    if task is None:
        task = config_task(config)
    check_task(task)
    if check.boundaries == "turns" and task.agent is None and task.env is None:
        raise ValueError(f"boundaries=turns needs a multi-turn task; task {task.name!r} is "
                         "single-turn (use boundaries=tokens or segments)")
    rows_plan, skipped = plan_rows(check, config, task)
    chosen, pool = _draw_problems(task, check)
    out = Path(out)
    folder = _open_out(out)
    try:
        # the sandbox of an agent task never sees the check's folder (its files hold the
        # references) nor the folders beside it
        runtime = build_runtime(config, model=model, tokenizer=tokenizer, task=task,
                                checkpoint=checkpoint, run_dir=out)
        try:
            run = _Check(config=config, check=check, out=out, runtime=runtime, task=task,
                         checkpoint=checkpoint, checkpoint_step=checkpoint_step)
            return _run(run, chosen, pool, rows_plan, skipped)
        finally:
            runtime.close()
    finally:
        folder.unlock()


@dataclass
class _Check:
    """One credit check's fixed inputs, read by every step of :func:`_run`.

    Attributes:
        config: the trainer's settings (sampler, signals, run estimator).
        check: the check's own settings.
        out: the output folder (locked by :func:`credit_check`).
        runtime: the built run: policy, sampler copy, tokenizer, task, sandbox.
        task: the task the trajectories come from.
        checkpoint, checkpoint_step: the weights loaded (None: ``config.model``'s own) and
            their training step.
    """

    config: TrainConfig
    check: CreditCheckConfig
    out: Path
    runtime: Runtime
    task: Task
    checkpoint: str | Path | None
    checkpoint_step: int

    @property
    def multi_turn(self) -> bool:
        """An agent or environment task (episodes with turns)."""
        return self.task.agent is not None or self.task.env is not None


@dataclass
class _Trajectories:
    """The sampled trajectories and the truth's plan (``trajectories.json``).

    Attributes:
        rows: one record per trajectory (:func:`_sample`), ``N`` of them.
        truth_plan: the rows whose truth is estimated, with their boundaries.
        problems: ``rows``' problems, row by row.
        sample_seconds: the time sampling took (in the session that sampled).
    """

    rows: list[dict[str, Any]]
    truth_plan: list[dict[str, Any]]
    problems: list[Problem]
    sample_seconds: float


@dataclass
class _Truth:
    """How far the Monte-Carlo truth got (``values.jsonl``).

    Attributes:
        done: the recorded trajectories' values, by row.
        spent: continuation tokens spent over all sessions.
        complete: every planned trajectory has its truth (False: ``budget`` stopped it).
        session_tokens, session_seconds: what this session spent.
    """

    done: dict[int, dict[str, Any]]
    spent: int
    complete: bool
    session_tokens: int
    session_seconds: float


@dataclass
class _Credit:
    """Every row's credit on the trajectories.

    Attributes:
        rewards: ``[N]`` the trajectories' rewards. ``groups``: their prompt groups.
        base: the run's own signals (``[N, T]`` student and teacher log-probs, entropy,
            divergence, mask).
        outcome: ``[N, T]`` the GRPO outcome advantage of every token.
        advantages: ``[N, T]`` each row's token advantages, by label.
        segments: ``[N, T]`` the segment ids of the rows whose estimator has segments.
        base_onsets: ``[N, T]`` the report's GEAR segments under the run's signals.
    """

    rewards: torch.Tensor
    groups: list[int]
    base: dict[str, torch.Tensor]
    outcome: torch.Tensor
    advantages: dict[str, torch.Tensor]
    segments: dict[str, torch.Tensor]
    base_onsets: torch.Tensor


def _run(run: _Check, chosen: list[int], pool: Sequence[Problem],
         rows_plan: list[EstimatorRow], skipped: dict[str, str]) -> CreditCheckResult:
    """The check's steps: prompts checked, the trajectories sampled (or read back), their
    truth estimated, every row's credit computed and scored, the outputs written."""
    started = time.perf_counter()
    _check_prompts(run, chosen, pool)
    segment_estimator, segment_config = _segment_config(run.config)
    settings = _settings(run, segment_estimator, segment_config)
    signal_cache: dict[tuple[Any, ...], dict[str, torch.Tensor]] = {}
    sampled = _trajectories(run, settings, chosen, pool, segment_config, signal_cache)
    truth = _estimate_truth(run, sampled)
    mark = time.perf_counter()
    credit = _credit(run, sampled, rows_plan, segment_config, signal_cache)
    scored = [p for p in sampled.truth_plan if int(p["row"]) in truth.done]
    truths = {int(p["row"]): PrefixValues.from_dict(truth.done[int(p["row"])]) for p in scored}
    data: dict[str, Any] = {"scores": _score(run.config, run.check, sampled.rows, scored, truths,
                                             credit.outcome, credit.base, credit.advantages,
                                             credit.segments, rows_plan)}
    score_seconds = time.perf_counter() - mark
    data["skipped"] = skipped
    data["settings"] = _report_settings(run, settings)
    data["counts"] = _counts(sampled, truth, credit, scored)
    data["timing"] = {"sample_seconds": round(sampled.sample_seconds, 2),
                      "truth_seconds_total": round(sum(float(r.get("seconds", 0.0))
                                                       for r in truth.done.values()), 2),
                      "truth_seconds_this_session": round(truth.session_seconds, 2),
                      "truth_tokens_this_session": truth.session_tokens,
                      "score_seconds": round(score_seconds, 2),
                      "wall_seconds_this_session": round(time.perf_counter() - started, 2)}
    data["machine"] = _machine(run.runtime.device)
    data["trajectories"] = _trajectory_records(run.runtime.tokenizer, sampled.rows,
                                               sampled.problems, scored, truths, credit.outcome,
                                               credit.base, credit.base_onsets,
                                               credit.advantages, run.config)
    markdown, json_path, plot, table = write_outputs(run.out, data, run.check)
    return CreditCheckResult(out=run.out, complete=truth.complete, data=data, table=table,
                             markdown=markdown, json=json_path, plot=plot)


def _check_prompts(run: _Check, chosen: list[int], pool: Sequence[Problem]) -> None:
    """Refuse chosen problems whose prompts (student and teacher) leave no room in the
    model's context for a response (:func:`~gear_rl.train.scoring.check_prompts_fit`)."""
    config = run.config
    check_prompts_fit(run.runtime.tokenizer, run.runtime.model, (pool[i] for i in chosen),
                      _teacher_config(config.signals), source=run.task.name,
                      new_tokens=(agent_limits(config, run.task).max_response_tokens
                                  if run.multi_turn else config.rollout.max_new_tokens))


def _settings(run: _Check, segment_estimator: Estimator, segment_config: Any
              ) -> dict[str, Any]:
    """What the check's trajectories and truth depend on: a folder's check continues only
    under the same settings (recorded in ``trajectories.json``)."""
    config, check, rollout = run.config, run.check, run.config.rollout
    settings = {
        "model": config.model, "weights": _weights_fingerprint(run.runtime.model),
        "checkpoint": None if run.checkpoint is None else str(run.checkpoint),
        "checkpoint_step": run.checkpoint_step, "task": run.task.name, "task_spec": config.task,
        "task_options": config.task_options, "train_size": config.train_size,
        "instruction": config.instruction, "split": check.split,
        "sampler_dtype": str(next(run.runtime.sampler.parameters()).dtype),
        "temperature": rollout.temperature, "top_p": rollout.top_p,
        "max_new_tokens": rollout.max_new_tokens, "samples_per_prompt":
            rollout.samples_per_prompt, "prompts_per_step": rollout.prompts_per_step,
        "groups": check.groups, "per_group": check.per_group,
        "trajectories": check.trajectories, "mixed_only": check.mixed_only,
        "continuations": check.continuations, "replicates": check.replicates,
        "boundaries": check.boundaries, "every": check.every, "seed": check.seed,
    }
    if run.multi_turn:
        settings["agent_limits"] = dataclasses.asdict(agent_limits(config, run.task))
    if check.boundaries == "segments":
        settings["segments"] = {"estimator": segment_estimator.name,
                                "config": repr(segment_config),
                                "signals": list(_signal_key(config.signals))}
    return settings


def _trajectories(run: _Check, settings: dict[str, Any], chosen: list[int],
                  pool: Sequence[Problem], segment_config: Any,
                  signal_cache: dict[tuple[Any, ...], dict[str, torch.Tensor]]
                  ) -> _Trajectories:
    """The trajectories and the truth's plan: read back from ``trajectories.json`` (refused
    under other settings, or when the task's problems changed), or sampled, planned and saved
    there. Planning segment boundaries computes the run's signals, kept in ``signal_cache``."""
    config, check, out = run.config, run.check, run.out
    state_path = out / CREDIT_CHECK_TRAJECTORIES
    if state_path.is_file():
        state = json.loads(state_path.read_text(encoding="utf-8"))
        mismatch = _settings_mismatch(state["settings"], settings)
        if mismatch:
            raise ValueError(f"out: {out} holds a credit check with other settings ("
                             + "; ".join(mismatch) + "); choose another out, or remove it")
        rows = state["rows"]
        truth_plan = state["truth"]
        sample_seconds = float(state.get("sample_seconds", 0.0))
    else:
        mark = time.perf_counter()
        rows = _sample(run.runtime, config, check, run.task, chosen, pool)
        sample_seconds = time.perf_counter() - mark
        truth_rows = _choose_truth(rows, check)
        onsets = None
        if check.boundaries == "segments":
            base = _signals(run.runtime, config.rollout.temperature, config.signals, rows,
                            [pool[r["problem_index"]] for r in rows])
            signal_cache[_signal_key(config.signals)] = base
            onsets = gear_segments(base["divergence"], base["entropy"], base["mask"],
                                   segment_config)
        truth_plan = [{"row": r, "boundaries": choose_boundaries(
            len(rows[r]["response_ids"]), every=check.every,
            segment_onsets=None if onsets is None
            else onsets[r, :len(rows[r]["response_ids"])].tolist(),
            mask=rows[r].get("policy_mask"),
            turn_ids=rows[r]["turn_ids"] if check.boundaries == "turns" else None)}
            for r in truth_rows]
        atomic_write_text(state_path, json.dumps(
            {"settings": settings, "rows": rows, "truth": truth_plan,
             "sample_seconds": sample_seconds}) + "\n")
    problems = [pool[r["problem_index"]] for r in rows]
    for row, problem in zip(rows, problems, strict=True):
        if row["problem_id"] != problem.id:
            raise ValueError(f"out: {out}: row {row['row']} was sampled for problem "
                             f"{row['problem_id']!r}, the task now has {problem.id!r} there "
                             "(the task changed); choose another out")
    return _Trajectories(rows=rows, truth_plan=truth_plan, problems=problems,
                         sample_seconds=sample_seconds)


def _estimate_truth(run: _Check, sampled: _Trajectories) -> _Truth:
    """The truth, one planned trajectory at a time, each appended to ``values.jsonl`` as it
    completes (a rerun skips the recorded ones), until the plan or ``budget`` ends."""
    check, runtime, rollout = run.check, run.runtime, run.config.rollout
    rows, problems = sampled.rows, sampled.problems
    values_path = run.out / CREDIT_CHECK_VALUES
    done = _read_values(values_path)
    spent = sum(int(r["tokens"]) for r in done.values())
    progress = None
    if check.progress:
        from tqdm import tqdm

        progress = tqdm(total=len(sampled.truth_plan),
                        initial=sum(p["row"] in done for p in sampled.truth_plan),
                        desc="credit-check", unit="traj", dynamic_ncols=True, file=sys.stderr)
    session_tokens, session_seconds = 0, 0.0
    complete = True
    try:
        for plan in sampled.truth_plan:
            index = int(plan["row"])
            if index in done:
                continue
            if check.budget is not None and spent >= check.budget:
                complete = False
                break
            row = rows[index]
            mark = time.perf_counter()
            seeds = [sequence_seed(check.seed, 2, index, r) for r in range(check.replicates)]
            if run.multi_turn:
                values = estimate_episode_values(
                    _episode_continuer(runtime, run.config, run.task, problems[index],
                                       row["prompt_ids"]),
                    row["response_ids"], row["policy_mask"], row["turn_ids"], row["reward"],
                    plan["boundaries"], samples=check.continuations, seeds=seeds,
                    batch_size=check.batch_size, device=runtime.device)
            else:
                values = estimate_prefix_values(
                    runtime.sampler, row["prompt_ids"], row["response_ids"], row["finished"],
                    plan["boundaries"], samples=check.continuations,
                    reward_fn=task_reward_fn(run.task, problems[index], runtime.tokenizer),
                    max_new_tokens=rollout.max_new_tokens, stop_ids=runtime.stop_ids,
                    pad_id=runtime.pad_id, temperature=rollout.temperature,
                    top_p=rollout.top_p, seeds=seeds, batch_size=check.batch_size,
                    shared=check.shared_prefix)
            seconds = time.perf_counter() - mark
            record = {"row": index, **values.to_dict(), "seconds": round(seconds, 3)}
            append_jsonl(values_path, record)
            done[index] = record
            spent += values.tokens
            session_tokens += values.tokens
            session_seconds += seconds
            if progress is not None:
                progress.set_postfix(tokens=spent,
                                     tok_s=f"{session_tokens / max(session_seconds, 1e-9):.0f}")
                progress.update(1)
    finally:
        if progress is not None:
            progress.close()
    return _Truth(done=done, spent=spent, complete=complete, session_tokens=session_tokens,
                  session_seconds=session_seconds)


def _credit(run: _Check, sampled: _Trajectories, rows_plan: list[EstimatorRow],
            segment_config: Any, signal_cache: dict[tuple[Any, ...], dict[str, torch.Tensor]]
            ) -> _Credit:
    """Every row's signals (once per distinct signal setting), advantages (batch by batch,
    as a training step forms them, for the step after the checkpoint's) and segments."""
    config, rows = run.config, sampled.rows
    temperature = config.rollout.temperature
    rewards = torch.tensor([float(r["reward"]) for r in rows])
    groups = [int(r["group"]) for r in rows]
    batches: dict[int, list[int]] = {}
    for r in rows:
        batches.setdefault(int(r["batch"]), []).append(int(r["row"]))
    batch_rows = list(batches.values())
    for row_plan in rows_plan:
        key = _signal_key(row_plan.signals)
        if key not in signal_cache:
            signal_cache[key] = _signals(run.runtime, temperature, row_plan.signals, rows,
                                         sampled.problems)
    base_key = _signal_key(config.signals)
    if base_key not in signal_cache:
        signal_cache[base_key] = _signals(run.runtime, temperature, config.signals, rows,
                                          sampled.problems)
    base = signal_cache[base_key]
    outcome = outcome_advantages(
        CreditBatch(rewards=rewards, group_ids=groups, mask=base["mask"]), OutcomeConfig())
    mc = _MonteCarloRows(run, sampled, rows_plan, len(batch_rows))
    try:
        advantages = {row.label: _advantages(row, signal_cache[_signal_key(row.signals)],
                                             rewards, groups, batch_rows,
                                             run.checkpoint_step + 1, rows, mc)
                      for row in rows_plan}
    finally:
        mc.close()
    segments = {row.label: gear_segments(signal_cache[_signal_key(row.signals)]["divergence"],
                                         signal_cache[_signal_key(row.signals)]["entropy"],
                                         base["mask"], row.config)
                for row in rows_plan if row.estimator.segments}
    base_onsets = gear_segments(base["divergence"], base["entropy"], base["mask"],
                                segment_config)
    return _Credit(rewards=rewards, groups=groups, base=base, outcome=outcome,
                   advantages=advantages, segments=segments, base_onsets=base_onsets)


class _MonteCarloRows:
    """The :data:`MonteCarloFn` of a check: a Monte-Carlo row's own values (SPO-chain,
    VinePPO), batch by batch, independent of the truth's. Often the longest part of the check
    after the truth, so each batch's values are appended to ``mc_rows.jsonl`` as they are
    drawn and a rerun of the same check reuses them. :meth:`close` ends the progress bar."""

    def __init__(self, run: _Check, sampled: _Trajectories, rows_plan: list[EstimatorRow],
                 batches: int) -> None:
        self.run, self.sampled = run, sampled
        self.path = run.out / CREDIT_CHECK_MC_ROWS
        self.done = {(r["label"], int(r["batch"]), r["config"]): r["extras"]
                     for r in _read_records(self.path)}
        mc_rows = [row for row in rows_plan if row.estimator.mc_boundaries is not None]
        keys = [(row.label, number, repr(row.config)) for row in mc_rows
                for number in range(batches)]
        self.progress = None
        if run.check.progress and any(key not in self.done for key in keys):
            from tqdm import tqdm

            self.progress = tqdm(total=len(keys), initial=sum(k in self.done for k in keys),
                                 desc="credit-check: estimators' own values", unit="batch",
                                 dynamic_ncols=True, file=sys.stderr)

    def __call__(self, row: EstimatorRow, number: int, members: list[int],
                 batch: CreditBatch) -> dict[str, Any]:
        key = (row.label, number, repr(row.config))
        if key not in self.done:
            runtime, rows = self.run.runtime, self.sampled.rows
            extras = monte_carlo_extras(
                row.estimator, row.config, batch, sampler=runtime.sampler,
                tokenizer=runtime.tokenizer, task=self.run.task,
                problems=[self.sampled.problems[i] for i in members],
                prompt_ids=[rows[i]["prompt_ids"] for i in members],
                response_ids=[rows[i]["response_ids"] for i in members],
                finished=[rows[i]["finished"] for i in members], rollout=self.run.config.rollout,
                stop_ids=runtime.stop_ids, pad_id=runtime.pad_id,
                seed=sequence_seed(self.run.check.seed, 5, number)).extras
            append_jsonl(self.path, {"label": key[0], "batch": number, "config": key[2],
                                     "extras": extras})
            self.done[key] = extras
            if self.progress is not None:
                self.progress.set_postfix(row=row.label)
                self.progress.update(1)
        return self.done[key]

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()


def _report_settings(run: _Check, settings: dict[str, Any]) -> dict[str, Any]:
    """``credit_check.json``'s ``settings``: the trajectories' settings, the export the model
    came from, and the scoring's own settings."""
    config, check = run.config, run.check
    return {**settings, "export": read_export_info(config.model),
            "bootstrap": check.bootstrap, "confidence": check.confidence,
            "precision_k": list(check.precision_k), "budget": check.budget,
            "reference": check.reference,
            "shared_prefix": check.shared_prefix,
            "signals": {"divergence": config.signals.divergence,
                        "topk": config.signals.topk,
                        "placement": config.signals.placement,
                        "answer_template": config.signals.answer_template},
            "estimator": config.estimator, "credit": config.credit}


def _counts(sampled: _Trajectories, truth: _Truth, credit: _Credit,
            scored: list[dict[str, Any]]) -> dict[str, Any]:
    """``credit_check.json``'s ``counts``: trajectories, groups (mixed: rewards differ), the
    truth planned and done, continuation tokens."""
    rows, groups = sampled.rows, credit.groups
    return {
        "rows": len(rows), "groups": len(set(groups)),
        "groups_mixed": sum(1 for g in set(groups)
                            if len({rows[i]["reward"] for i in range(len(rows))
                                    if groups[i] == g}) > 1),
        "truth_planned": len(sampled.truth_plan), "truth_done": len(scored),
        "truth_groups": len({groups[int(p["row"])] for p in scored}),
        "continuation_tokens": truth.spent, "complete": truth.complete}


def _units(row: dict[str, Any], values: PrefixValues, outcome: float, mask: np.ndarray,
           replicate: int | None) -> TrajectoryUnits:
    return TrajectoryUnits(group=int(row["group"]), truth=values.advantages(replicate),
                           truth_se=values.advantage_stderr(replicate), outcome=outcome,
                           tokens=span_sums(mask, values.boundaries))


def _score(config: TrainConfig, check: CreditCheckConfig, rows: list[dict[str, Any]],
           scored: list[dict[str, Any]], truths: dict[int, PrefixValues], outcome: torch.Tensor,
           base: dict[str, torch.Tensor], advantages: dict[str, torch.Tensor],
           segments: dict[str, torch.Tensor], rows_plan: list[EstimatorRow]) -> dict[str, Any]:
    """Every row's scores against the first replicate (and the noise ceiling) and against all
    replicates pooled."""
    boot: dict[str, Any] = {"resamples": check.bootstrap, "confidence": check.confidence,
                            "seed": check.seed}
    ks = list(check.precision_k)
    indices = [int(p["row"]) for p in scored]
    lengths = {i: len(rows[i]["response_ids"]) for i in indices}
    masks = {i: base["mask"][i, :lengths[i]].numpy() for i in indices}
    truth_sets: dict[str, list[TrajectoryUnits]] = {}
    replicates = check.replicates
    truth_sets["first"] = [_units(rows[i], truths[i], float(outcome[i]), masks[i],
                                  0 if replicates > 1 else None) for i in indices]
    if replicates > 1:
        truth_sets["pooled"] = [_units(rows[i], truths[i], float(outcome[i]), masks[i], None)
                                for i in indices]

    def unit_credit(label: str) -> list[np.ndarray]:
        return [span_sums(advantages[label][i, :lengths[i]].numpy(), truths[i].boundaries,
                          masks[i]) for i in indices]

    def inside(label: str) -> list[np.ndarray] | None:
        if label not in segments:
            return None
        return [span_shares(segments[label][i, :lengths[i]].numpy() >= 0, truths[i].boundaries,
                            masks[i]) for i in indices]

    def as_dict(scores: dict[str, Interval]) -> dict[str, Any]:
        return {name: interval.to_dict() for name, interval in scores.items()}

    credits = {row.label: unit_credit(row.label) for row in rows_plan}
    reference = check.reference if check.reference in credits else None
    out_rows = []
    for row in rows_plan:
        entry: dict[str, Any] = {
            "label": row.label, "estimator": row.estimator.name, "config": repr(row.config),
            "signals": {"divergence": row.signals.divergence, "topk": row.signals.topk,
                        "placement": row.signals.placement,
                        "answer_template": row.signals.answer_template},
            "variant": row.variant, "floor": row.estimator.name == "grpo" and not row.variant,
            "segments": row.label in segments, "scores": {}, "vs_reference": {}}
        for name, units in truth_sets.items():
            entry["scores"][name] = as_dict(score_estimate(units, credits[row.label], ks=ks,
                                                           inside=inside(row.label), **boot))
            if reference is not None and row.label != reference:
                entry["vs_reference"][name] = paired_difference(
                    units, credits[row.label], credits[reference], ks=ks, **boot).to_dict()
        out_rows.append(entry)
    result: dict[str, Any] = {"rows": out_rows, "reference": reference, "ceiling": None,
                              "truth": {name: as_dict(truth_summary(units, **boot))
                                        for name, units in truth_sets.items()}}
    if replicates > 1:
        second = [truths[i].advantages(1) for i in indices]
        result["ceiling"] = as_dict(score_estimate(truth_sets["first"], second, ks=ks,
                                                   weights=False, **boot))
    for key, replicate in (("mean_value_se", None), ("mean_value_se_replicate", 0)):
        values_se = [truths[i].stderr(replicate)[~np.array(truths[i].terminal)]
                     for i in indices]
        flat = np.concatenate(values_se) if values_se else np.array([])
        result[key] = float(np.nanmean(flat)) if flat.size and np.isfinite(flat).any() else None
    return result


def _trajectory_records(tokenizer: Any, rows: list[dict[str, Any]], problems: list[Problem],
                        scored: list[dict[str, Any]], truths: dict[int, PrefixValues],
                        outcome: torch.Tensor, base: dict[str, torch.Tensor],
                        onsets: torch.Tensor, advantages: dict[str, torch.Tensor],
                        config: TrainConfig) -> list[dict[str, Any]]:
    """Per scored trajectory, what the plot and the report's token viewer show."""

    def values(tensor: torch.Tensor, i: int, length: int) -> list[float]:
        return [round(float(v), 6) for v in tensor[i, :length]]

    records = []
    for plan in scored:
        i = int(plan["row"])
        row, truth = rows[i], truths[i]
        length = len(row["response_ids"])
        mask = base["mask"][i, :length].numpy()
        pooled = truth.advantages(None)
        per_token = np.zeros(length)
        bounds = truth.boundaries
        for j, adv in enumerate(pooled):  # a unit's advantage shared over its policy tokens
            span = slice(bounds[j], bounds[j + 1])
            count = mask[span].sum()
            if count > 0:
                per_token[span] = adv / count * (mask[span] > 0)
        records.append({
            "row": i, "group": row["group"], "problem_id": row["problem_id"],
            "prompt": tokenizer.decode(row["prompt_ids"]), "answer": problems[i].answer,
            "response": row["text"], "extracted": row["extracted"], "reward": row["reward"],
            "advantage": float(outcome[i]), "finished": row["finished"],
            "tokens": [tokenizer.decode([t]) for t in row["response_ids"]],
            "token_ids": row["response_ids"], "mask": [int(m) for m in mask],
            "boundaries": bounds, "values": [round(float(v), 6) for v in truth.values(None)],
            "values_se": [None if not math.isfinite(v) else round(float(v), 6)
                          for v in truth.stderr(None)],
            "replicate_values": [[round(float(v), 6) for v in truth.values(r)]
                                 for r in range(truth.replicates)],
            "mc_advantage": [round(float(v), 6) for v in per_token],
            "entropy": values(base["entropy"], i, length),
            "divergence": values(base["divergence"], i, length),
            "student_logprobs": values(base["student_logprobs"], i, length),
            "teacher_logprobs": values(base["teacher_logprobs"], i, length),
            "segment_onset": [int(v) for v in onsets[i, :length]],
            "advantages": {label: values(tensor, i, length)
                           for label, tensor in advantages.items()},
            "run_estimator": (f"run:{config.estimator}"
                              if f"run:{config.estimator}" in advantages else
                              config.estimator if config.estimator in advantages else None),
        })
    return records
