"""Trainer configuration: plain dataclasses, one documented field per knob, with YAML files and
``key=value`` overrides (dotted keys for nested fields, e.g. ``rollout.temperature=0.8``,
``credit.lambda_kl=0.2``). An override keeps the default's type; an unknown key is an error that
names the nearest valid one. Each section checks its own fields (``validate``, beside them);
:meth:`TrainConfig.validate` adds the rules that tie keys of different sections together. The
``Attributes:`` entry of a field is its one description (``gear-rl train --help`` prints them).
The generic machinery (overrides, YAML, type coercion, field descriptions, field checks) is
:mod:`gear_rl.dataclass_config`; the functions at the end bind it to :class:`TrainConfig`."""

from __future__ import annotations

import copy
import dataclasses
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from gear_rl.agent.loop import AgentLimits
from gear_rl.credit import Estimator, estimator_names, get_estimator, load_plugins
from gear_rl.credit.registry import record_credit_defaults, upgrade_recorded_config
from gear_rl.dataclass_config import (
    check_at_least,
    check_finite,
    check_int,
    check_memory,
    check_one_of,
    check_positive,
    check_unit_interval,
    coerce,
    nearest,
    parse_overrides,
    read_yaml,
    settable_keys,
    shown,
    update_from_dict,
)
from gear_rl.signals import DIVERGENCE_KINDS as DIVERGENCES
from gear_rl.signals.teacher import PLACEMENTS, TeacherPromptConfig
from gear_rl.tasks.base import DEFAULT_TRAIN_SIZE
from gear_rl.train.loss import KL_TYPES, LOSS_AGG_MODES
from gear_rl.train.trackers import check_report_to

__all__ = [
    "LOSS_AGG_MODES",
    "PRECISIONS",
    "TEACHER_ROWS",
    "AgentConfig",
    "EvalConfig",
    "LogConfig",
    "LossConfig",
    "OptimConfig",
    "RolloutConfig",
    "SignalConfig",
    "TrainConfig",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "valid_keys",
]

# Compute / weight precisions of ``precision`` and ``rollout.dtype``.
PRECISIONS: tuple[str, ...] = ("auto", "bf16", "fp32")
# ``signals.teacher_rows``: the rows the teacher pass runs on.
TEACHER_ROWS: tuple[str, ...] = ("nonzero_advantage", "all")
# ``device``: what torch takes.
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")

# Floors of what the items the memory-sizing knobs count cost, whatever the model
# (:meth:`TrainConfig.check_memory`): only a setting that cannot fit is refused.
TOKEN_BYTES = 64
"""One token of a rollout or evaluation row: its id (int64), mask, log-probs, entropy,
advantage and signals (fp32 each), before any KV cache or logits (kilobytes a token)."""
PROBLEM_BYTES = 200
"""One generated or loaded problem: its question, answer and record (Python objects)."""
CONTINUATION_BYTES = 100
"""One Monte-Carlo continuation held until its step's values are estimated: its token list
(a Python list) and its reward, before any of its tokens."""
SANDBOX_WORKER_BYTES = 20_000_000
"""One warm sandbox worker: a Python interpreter with its preloaded modules."""


@dataclass
class RolloutConfig:
    """Sampling of the training batch.

    Attributes:
        prompts_per_step: distinct problems per step (GRPO groups).
        samples_per_prompt: K responses per problem (the group size).
        temperature: sampling temperature; log-probs, entropy and divergences use the same one.
        top_p: nucleus mass (1.0: the full distribution, on-policy).
        max_new_tokens: cap on response length; a batch runs until its longest answer stops.
        batch_size: rows per generation batch (None: all at once).
        mc_batch_size: continuation rows per decoding batch of the Monte-Carlo values phase
            (SPO-chain, VinePPO: the continuations of every trajectory of the step decode
            together, ordered by prefix length; ``gear_rl.mc_values.estimate_values``). It
            bounds the decoding batch, not the continuations a step holds
            (``credit.mc_samples``, bounded by the machine's memory: ``check_memory``).
        dtype: sampler weights: ``auto`` (bf16 where the device computes bf16 natively, else the
            policy's fp32), ``bf16`` or ``fp32``. The sampler is a copy of the policy refreshed
            after every update.
    """

    prompts_per_step: int = 4
    samples_per_prompt: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    batch_size: int | None = None
    mc_batch_size: int = 256
    dtype: str = "auto"

    def validate(self, name: str = "rollout") -> None:
        """Raise ``ValueError`` naming the first bad field as ``<name>.<field>``."""
        prefix = name + "."
        check_finite(prefix, self)
        check_at_least(prefix, self, 1, "prompts_per_step", "samples_per_prompt",
                       "max_new_tokens", "batch_size", "mc_batch_size")
        check_positive(prefix, self, "temperature")
        check_unit_interval(prefix, self, "top_p")
        check_one_of(prefix + "dtype", self.dtype, PRECISIONS)


@dataclass
class LossConfig:
    """The policy loss: PPO clipped surrogate over token-level advantages.

    Attributes:
        clip_low: ratio clipped below at ``1 - clip_low``.
        clip_high: ratio clipped above at ``1 + clip_high`` (asymmetric "clip-higher", DAPO).
        agg_mode: ``token-mean`` (all tokens of the mini-batch weigh equally),
            ``seq-mean-token-sum``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm``
            (token sums divided by ``rollout.max_new_tokens``, Dr.GRPO), as in verl.
        kl_coef: weight of a KL penalty to the initial policy (0: off; no reference model kept).
        kl_type: per-token KL estimator: ``low_var_kl`` (k3, clamped to [-10, 10]), ``k1``,
            ``k2``.
        opsd_coef: weight of the on-policy self-distillation term (reverse KL student ->
            stop-gradient ground-truth-conditioned teacher) added to the RL loss. 0 (the
            default) turns the term off, except for a self-distilling estimator
            (``estimator=opsd``), whose loss always has it: there 0 means weight 1.
        epochs: passes over each rollout batch.
        minibatches: optimiser steps per epoch (the batch is split in this many mini-batches).
        micro_batch_tokens: the most tokens one forward/backward runs through the model,
            padding included (shared prompts count once): each mini-batch is packed into
            micro-batches under this budget, rows of one prompt together and by length, and the
            gradients accumulate. Memory only (the loss is the mini-batch's whatever the
            packing, up to float rounding), except for an estimator that selects tokens per
            micro-batch (``top_entropy`` with ``credit.selection=micro_batch``). A row longer
            than the budget runs alone.
        micro_batch_size: also at most this many rows per micro-batch (None: no row cap).
        share_prompts: run each distinct prompt of a micro-batch once, with gradients, and let
            its responses attend to that cached prefix (the K responses of a GRPO group share
            their prompt); the gradients equal the unshared path's up to float rounding.
        fuse_scoring: on-policy single updates (``epochs=1``, ``minibatches=1``) skip the
            no-grad scoring pass: PPO's old log-probs are the update forward's own, detached
            (TRL's rule; the ratio is 1), and the student's entropy and the teacher signals
            come from that forward too. An estimator that reads student signals (GEAR) then
            gets its advantages between the forward and the backward: each micro-batch's own
            rows for a row-local estimator (GEAR, RLSD), else the batch must fit one
            micro-batch (``micro_batch_tokens``); otherwise the scoring pass runs.
        checkpoint_layers: run the update's forward with every decoder layer checkpointed
            (the backward recomputes each layer from its input: activation memory of one
            ``[tokens, hidden]`` tensor per layer, for one more forward, about a third more
            update compute); the same values and gradients. ``None`` (default): on for agent
            and environment tasks, whose multi-turn rows fill every micro-batch's token budget
            and whose update held most of the run's memory, off for single-turn tasks, whose
            whole step fits one micro-batch.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    opsd_coef: float = 0.0
    epochs: int = 1
    minibatches: int = 1
    micro_batch_tokens: int = 2048
    micro_batch_size: int | None = None
    share_prompts: bool = True
    fuse_scoring: bool = True
    checkpoint_layers: bool | None = None

    def validate(self, name: str = "loss") -> None:
        """Raise ``ValueError`` naming the first bad field as ``<name>.<field>``."""
        prefix = name + "."
        check_finite(prefix, self)
        if not 0 <= self.clip_low < 1:
            # 1 - clip_low is the lower ratio bound: it must stay positive.
            raise ValueError(f"{prefix}clip_low must be in [0, 1), got {self.clip_low}")
        check_at_least(prefix, self, 0, "clip_high", "kl_coef", "opsd_coef")
        check_at_least(prefix, self, 1, "epochs", "minibatches", "micro_batch_tokens",
                       "micro_batch_size")
        check_one_of(prefix + "agg_mode", self.agg_mode, LOSS_AGG_MODES)
        check_one_of(prefix + "kl_type", self.kl_type, KL_TYPES)

    def opsd_weight(self, self_distillation: bool) -> float:
        """The weight of the self-distillation term in the loss: ``opsd_coef``, or 1 where it is
        0 and the estimator distills itself (``Estimator.self_distillation``: ``opsd``, whose
        loss is that term alone). 0: no such term."""
        if self_distillation and self.opsd_coef == 0:
            return 1.0
        return self.opsd_coef


@dataclass
class OptimConfig:
    """AdamW on fp32 master weights.

    Attributes:
        lr: peak learning rate.
        warmup_steps: linear warm-up of the learning rate from 0 over this many steps.
        weight_decay: AdamW's decoupled weight decay.
        beta1: AdamW's first-moment decay, in [0, 1).
        beta2: AdamW's second-moment decay, in [0, 1).
        eps: AdamW's denominator term (> 0: it keeps the update finite where the second moment
            is 0).
        grad_clip: max global gradient norm (0: off).
    """

    lr: float = 3e-5
    warmup_steps: int = 0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0

    def validate(self, name: str = "optim") -> None:
        """Raise ``ValueError`` naming the first bad field as ``<name>.<field>``."""
        prefix = name + "."
        check_finite(prefix, self)
        check_positive(prefix, self, "lr", "eps")
        if self.lr > 1e30:  # the optimiser computes in float32 (max 3.4e38) and would overflow
            raise ValueError(f"{prefix}lr must be <= 1e30, got {self.lr}")
        check_at_least(prefix, self, 0, "warmup_steps", "weight_decay", "grad_clip")
        for beta in ("beta1", "beta2"):
            value = getattr(self, beta)
            if not 0 <= value < 1:
                raise ValueError(f"{prefix}{beta} must be in [0, 1), got {value}")


@dataclass
class SignalConfig:
    """The signal pass (``gear_rl.signals``) and the teacher prompt.

    Attributes:
        divergence: ``full`` (exact reverse KL), ``topk``, ``k1`` or ``k3``.
        topk: support size for ``divergence=topk`` (required there, refused elsewhere).
        chunk_size: LM-head rows per chunk (None: automatic).
        batch_size: rows per no-grad scoring forward (old log-probs, signals, reference).
        placement: where the reference goes in the teacher prompt (``user_end``,
            ``new_user_turn``, ``system``).
        answer_template: the teacher's hint for a final-answer reference (must contain
            ``{reference}``). The default is ``gear_rl.signals.teacher``'s, the one the TRL and
            verl integrations use: a delimited reference block that also asks the model to solve
            the problem on its own. The teacher pass costs in proportion to its prompt length (on
            a CPU this pass is GEAR's whole overhead), so a one-line hint costs fewer
            teacher-prompt tokens: ``signals.answer_template="\\n\\n(The correct answer is
            {reference}.)"``. ``null`` also means the library default.
        teacher_rows: which rows the teacher pass runs on. ``nonzero_advantage`` (default):
            for an estimator whose advantage is zero wherever the outcome advantage is
            (``Estimator.outcome_scaled``: GEAR and its ablations, RLSD) and without a
            self-distillation loss, only the rows with a non-zero outcome advantage: the rows
            of a group whose rewards are all equal get zero advantage whatever the teacher
            says, so the loss and the update are those of ``all`` (up to float rounding of the
            student forward, which then runs those rows in a batch of their own). Their
            divergence and teacher log-probs are left at 0, and the divergence and segment
            metrics and ``samples.jsonl``'s teacher fields cover the teacher's rows only.
            ``all``: every row, as before (a study of the signals on every trajectory).
    """

    divergence: str = "full"
    topk: int | None = None
    chunk_size: int | None = None
    batch_size: int = 32
    placement: str = TeacherPromptConfig().placement
    answer_template: str | None = TeacherPromptConfig().answer_template
    teacher_rows: str = "nonzero_advantage"

    def validate(self, name: str = "signals") -> None:
        """Raise ``ValueError`` naming the first bad field as ``<name>.<field>``."""
        prefix = name + "."
        check_finite(prefix, self)
        check_at_least(prefix, self, 1, "topk", "chunk_size", "batch_size")
        check_one_of(prefix + "divergence", self.divergence, DIVERGENCES)
        check_one_of(prefix + "placement", self.placement, PLACEMENTS)
        check_one_of(prefix + "teacher_rows", self.teacher_rows, TEACHER_ROWS)
        if self.divergence == "topk" and self.topk is None:
            raise ValueError(f"{prefix}topk must be set for {prefix}divergence=topk")
        if self.divergence != "topk" and self.topk is not None:
            # the signal pass refuses it (at the first step, after the run folder exists)
            raise ValueError(f"{prefix}topk={self.topk} applies to {prefix}divergence=topk "
                             f"only, and {prefix}divergence is {shown(self.divergence)}: set "
                             f"{prefix}divergence=topk, or drop {prefix}topk")
        if self.answer_template is not None and "{reference}" not in self.answer_template:
            raise ValueError(f"{prefix}answer_template must contain '{{reference}}'")


@dataclass
class EvalConfig:
    """Held-out evaluation: Mean@k and pass@k.

    Attributes:
        size: held-out problems.
        k: samples per problem.
        temperature: sampling temperature of evaluation.
        top_p: nucleus mass of evaluation.
        max_new_tokens: cap on the length of an evaluation answer.
        every: evaluate every this many steps (0: only at the start and the end).
        at_start: evaluate before the first step.
        seed: sampling seed of evaluation (independent of the training seed, so runs with
            different seeds are scored on identical draws of the starting model; on single-turn
            tasks each (problem, sample) keeps its own draws whatever the model generates, so
            two runs are compared draw by draw: gear_rl.train.evaluate); in ``[0, 2**63 - 1]``.
        batch_size: rows per generation batch (None: all at once). Agent and environment
            tasks decode at most a training rollout's rows at once
            (``rollout.prompts_per_step x rollout.samples_per_prompt``), whose KV caches span
            whole episodes.
        records: store each evaluation's per-problem results (every sample's reward) in
            ``RUN_DIR/eval_records/step-NNNNNN.json``, for paired comparisons (``gear-rl
            study`` turns it on).
    """

    size: int = 64
    k: int = 4
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 32
    every: int = 0
    at_start: bool = True
    seed: int = 1234
    batch_size: int | None = 128
    records: bool = False

    def validate(self, name: str = "eval") -> None:
        """Raise ``ValueError`` naming the first bad field as ``<name>.<field>``."""
        prefix = name + "."
        check_int(prefix + "seed", self.seed, 0)  # torch takes it
        check_finite(prefix, self)
        check_at_least(prefix, self, 1, "size", "k", "max_new_tokens", "batch_size")
        check_at_least(prefix, self, 0, "every")
        check_positive(prefix, self, "temperature")
        check_unit_interval(prefix, self, "top_p")


@dataclass
class AgentConfig:
    """Multi-turn rollouts of agent tasks (``tool-math``, ``bfcl``) and environments
    (``sokoban``, ``keydoor``, ``textarena:NAME``). Single-turn tasks ignore this section.

    Attributes:
        max_turns: policy turns per episode (None: the task's own; environments: their step
            limit).
        max_new_tokens_per_turn: generation cap of one turn.
        max_response_tokens: budget of a whole response, policy and observation tokens.
        max_observation_tokens: a tool output is cut to this many tokens.
        sandbox_workers: warm Python workers for tool calls.
        sandbox_timeout_s: wall-time limit of one tool call.
        sandbox_memory_mb: memory limit of one tool call.
        sandbox_mounts: absolute paths tool calls may read (read-only, at the same path), beyond
            the interpreter and the task's declared packages; one that overlaps the run
            directory or the task's data file is refused.
        reuse_kv_cache: each turn's sampling prefills only what the turn adds to a row's
            context (its last token and the observation) and reads the rest from the previous
            turn's KV cache (:class:`gear_rl.sampling.TurnCache`), in training, evaluation
            and the credit check; False prefills every turn's whole context (the sampler before
            this option; the same distribution, different bf16 rounding).
    """

    max_turns: int | None = None
    # the episode limits' defaults live with their type, gear_rl.agent.AgentLimits
    max_new_tokens_per_turn: int = AgentLimits.max_new_tokens_per_turn
    max_response_tokens: int = AgentLimits.max_response_tokens
    max_observation_tokens: int = AgentLimits.max_observation_tokens
    sandbox_workers: int = 2
    sandbox_timeout_s: float = 5.0
    sandbox_memory_mb: int = 512
    sandbox_mounts: list[str] = field(default_factory=list)
    reuse_kv_cache: bool = True

    def validate(self, name: str = "agent") -> None:
        """Raise ``ValueError`` naming the first bad field as ``<name>.<field>``."""
        prefix = name + "."
        check_finite(prefix, self)
        check_at_least(prefix, self, 1, "max_turns", "max_new_tokens_per_turn",
                       "max_response_tokens", "max_observation_tokens", "sandbox_workers",
                       "sandbox_memory_mb")
        check_positive(prefix, self, "sandbox_timeout_s")
        from gear_rl.agent.tools.sandbox import check_mounts

        check_mounts(self.sandbox_mounts, (), name=prefix + "sandbox_mounts")


@dataclass
class LogConfig:
    """Outputs.

    Attributes:
        samples_per_step: trajectories per step kept in ``samples.jsonl``.
        checkpoint_every: write a checkpoint every this many steps (and at the end; 0: end only).
        keep_checkpoints: most recent checkpoints kept.
        report_to: trackers the metrics go to besides ``metrics.jsonl``, by TRL's names:
            ``tensorboard`` (``RUN_DIR/tensorboard/``), ``wandb``, ``trackio``, a list of them
            (``log.report_to=[tensorboard,wandb]``), or ``none``; the metrics keep their
            ``metrics.jsonl`` names, the run is named after its folder, a resumed run continues
            its tracker runs. W&B and trackio are optional extras (``pip install
            'gear-rl[wandb]'``) and keep their own settings (``WANDB_MODE=offline``,
            ``TRACKIO_DIR``). Replaces ``log.tensorboard`` (``false``: ``none``).
        project: the W&B / trackio project the run is logged to.
        progress: show a progress bar.
    """

    samples_per_step: int = 4
    checkpoint_every: int = 10
    keep_checkpoints: int = 1
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    project: str = "gear-rl"
    progress: bool = True

    def validate(self, name: str = "log") -> None:
        """Raise ``ValueError`` naming the first bad field as ``<name>.<field>``."""
        prefix = name + "."
        check_finite(prefix, self)
        check_at_least(prefix, self, 0, "samples_per_step", "checkpoint_every")
        check_at_least(prefix, self, 1, "keep_checkpoints")
        check_report_to(prefix + "report_to", self.report_to)
        if not self.project.strip():
            raise ValueError(f"{prefix}project must name the W&B / trackio project, got "
                             f"{shown(self.project)}")


@dataclass
class TrainConfig:
    """Everything ``gear-rl train`` takes.

    Attributes:
        model: ``smollm2-135m`` (bundled), ``tiny-random`` (tests) or a local HF directory.
        task: a preset (``products``: one-digit products, the default; ``arithmetic``,
            ``arithmetic-3``), a reasoning-gym dataset name, or a verl-layout ``.parquet`` /
            ``.jsonl`` file.
        task_options: reasoning-gym dataset config overrides (e.g. ``task_options.max_terms=3``).
        instruction: text appended to every reasoning-gym question.
        eval_data: held-out file for a dataset-file task (None: hold out part of ``task``).
        train_size: training problems to generate (reasoning-gym) or keep (files).
        estimator: a registered credit estimator (``gear_rl.credit.ESTIMATORS``; ``opsd`` is
            self-distillation alone, with no reward in the loss).
        plugins: modules imported before the estimator is looked up, each registering its own
            estimators (``plugins=[my_pkg.my_credit]``).
        credit: the estimator's config fields (e.g. ``credit.lambda_kl=0.2``).
        steps: training steps (one rollout batch and its updates each).
        seed: training seed (data order, sampling, tiny-model init), in ``[0, 2**63 - 1]``.
        out: run directory (None: ``runs/<time>-<estimator>-s<seed>``).
        resume: a run directory to continue from its latest checkpoint.
        device: ``auto`` (cuda when available), ``cpu``, ``cuda``, ``cuda:1``...
        precision: training/scoring compute: ``auto`` (bf16 autocast where the device computes
            bf16 natively, else fp32), ``bf16`` or ``fp32``. Master weights are always fp32.
        threads: torch CPU threads (None: torch's default).
        heap_reuse: let glibc's heap keep freed memory for reuse, within a phase and across
            phases, instead of unmapping large blocks and page-faulting them in again
            (:func:`gear_rl.train.memory.keep_heap_pages`; process-wide, Linux/glibc only);
            the resident set then stays near the step's peak between phases instead of
            falling back, and the heap is trimmed only where it outgrows 1.1 times the peak
            after the second step. ``None`` (default): on
            for single-turn tasks (a quarter off the default task's scoring + update time),
            off for agent and environment tasks, whose update is the run's memory peak (on
            tool-math it added about 0.27 GB to that peak for 3% of the update's time). Off,
            the update trims the heap every 5 decoder layers and frees a bf16 sampler copy's
            weights while it runs (:func:`gear_rl.train.memory.heap_trims`).
    """

    model: str = "smollm2-135m"
    task: str = "products"
    task_options: dict[str, Any] = field(default_factory=dict)
    instruction: str = ""
    eval_data: str | None = None
    train_size: int = DEFAULT_TRAIN_SIZE
    estimator: str = "gear"
    plugins: list[str] = field(default_factory=list)
    credit: dict[str, Any] = field(default_factory=dict)
    steps: int = 10
    seed: int = 0
    out: str | None = None
    resume: str | None = None
    device: str = "auto"
    precision: str = "auto"
    threads: int | None = None
    heap_reuse: bool | None = None
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    signals: SignalConfig = field(default_factory=SignalConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad key: the estimator, the top-level fields,
        each section's own check, the credit fields (the estimator's config class checks them),
        then the rules across sections."""
        estimator = self.credit_estimator()  # plugins first: they may register the estimator
        check_int("seed", self.seed, 0)  # torch and numpy take it
        check_finite("", self)  # and every integer within 64 bits
        check_at_least("", self, 1, "steps", "train_size", "threads")
        check_one_of("precision", self.precision, PRECISIONS)
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("model must be smollm2-135m (bundled), tiny-random, or a local "
                             "Hugging Face model directory; got an empty value")
        if not _DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {shown(self.device)}")
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if dataclasses.is_dataclass(section):
                cast(Any, section).validate(f.name)  # every section has validate(prefix)
        credit = self.credit_config(estimator)
        if self.rollout.samples_per_prompt == 1 and estimator.needs_groups(credit):
            raise ValueError(
                f"rollout.samples_per_prompt=1 gives estimator={self.estimator} nothing to learn "
                "from: its advantage is relative to the other samples of the same prompt, and "
                "a group of one has none, so every advantage would be 0; set "
                "rollout.samples_per_prompt >= 2")
        batch = self.rollout.prompts_per_step * self.rollout.samples_per_prompt
        if self.loss.minibatches > batch:
            raise ValueError(f"loss.minibatches ({self.loss.minibatches}) exceeds the rollout "
                             f"batch (rollout.prompts_per_step * rollout.samples_per_prompt = "
                             f"{batch} trajectories)")
        self.check_memory(credit)
        distills = self.loss.opsd_weight(estimator.self_distillation) > 0
        if distills and self.signals.divergence not in ("full", "topk"):
            # The distillation loss differentiates the per-token divergence; the sampled-token
            # estimators k1/k3 have no useful gradient (k1's is zero in expectation on-policy).
            cause = (f"estimator={self.estimator}" if estimator.self_distillation
                     else f"loss.opsd_coef={self.loss.opsd_coef}")
            raise ValueError("signals.divergence must be 'full' or 'topk' for the self-"
                             f"distillation loss ({cause}), got {shown(self.signals.divergence)}")

    def check_memory(self, credit: Any) -> None:
        """Refuse a knob that sizes memory past what this machine has
        (:func:`~gear_rl.dataclass_config.check_memory`, at the floors above): the tokens of a
        step's rollout and of an evaluation, the problems generated, the Monte-Carlo
        continuations of a step (``credit.mc_samples``: at least one value estimate per
        prompt; ``rollout.mc_batch_size`` bounds only how many decode at once, not how many
        are held) and the sandbox's workers. ``credit``: the estimator's config."""
        rollout = self.rollout
        rows = {"rollout.prompts_per_step": rollout.prompts_per_step,
                "rollout.samples_per_prompt": rollout.samples_per_prompt}
        check_memory({**rows, "rollout.max_new_tokens": rollout.max_new_tokens}, TOKEN_BYTES,
                     "rollout tokens")
        check_memory({**rows, "agent.max_response_tokens": self.agent.max_response_tokens},
                     TOKEN_BYTES, "rollout tokens of agent episodes")
        check_memory({"eval.size": self.eval.size, "eval.k": self.eval.k,
                      "eval.max_new_tokens": self.eval.max_new_tokens}, TOKEN_BYTES,
                     "evaluation tokens")
        check_memory({"train_size": self.train_size}, PROBLEM_BYTES, "training problems")
        samples = getattr(credit, "mc_samples", None)
        if isinstance(samples, int):
            check_memory({"credit.mc_samples": samples,
                          "rollout.prompts_per_step": rollout.prompts_per_step},
                         CONTINUATION_BYTES, "Monte-Carlo continuations a step")
        check_memory({"agent.sandbox_workers": self.agent.sandbox_workers},
                     SANDBOX_WORKER_BYTES, "sandbox worker processes")

    def credit_estimator(self) -> Estimator:
        """The registered estimator ``estimator`` names (``plugins`` imported first); an unknown
        name raises naming the nearest registered one."""
        load_plugins(self.plugins)
        names = estimator_names()
        if self.estimator not in names:
            guess = nearest(str(self.estimator), names)
            hint = f"did you mean {shown(guess)}? " if guess else ""
            raise ValueError(f"unknown estimator {shown(self.estimator)}; {hint}registered: "
                             f"{', '.join(names)} (an estimator from another module needs "
                             "plugins=<module>)")
        return get_estimator(self.estimator)

    def credit_config(self, estimator: Estimator | None = None) -> Any:
        """The estimator's config built from ``credit``; errors name the key as
        ``credit.<field>`` (an unknown one with the nearest field of this estimator)."""
        estimator = self.credit_estimator() if estimator is None else estimator
        settable = estimator.config_fields()
        for key in self.credit:
            if key in settable or key in estimator.fixed:
                continue  # a pinned field set to another value raises in make_config
            guess = nearest(str(key), settable)
            hint = (f"did you mean 'credit.{guess}'?" if guess
                    else f"its keys: {', '.join('credit.' + name for name in settable)}")
            raise ValueError(f"unknown config key 'credit.{key}' for estimator "
                             f"{shown(estimator.name)}; {hint}")
        try:
            return estimator.make_config(**self.credit)
        except (TypeError, ValueError) as error:
            message = str(error)
            # The config classes name the bare field first ("lam must be in [0, 1]").
            if message.split(" ", 1)[0] in settable:
                raise ValueError(f"credit.{message}") from error
            raise ValueError(f"credit: {message}") from error


# --- the override machinery (gear_rl.dataclass_config) bound to TrainConfig ----------------

_HELP_POINTER = "gear-rl train --help describes every key"


def valid_keys() -> list[str]:
    """Every settable dotted key of :class:`TrainConfig` (dict-valued fields as
    ``name.<key>``)."""
    return settable_keys(TrainConfig)


def config_from_dict(data: Mapping[str, Any], base: TrainConfig | None = None, *,
                     unique_keys: bool = False) -> TrainConfig:
    """A :class:`TrainConfig` from nested (or dotted-key) mapping ``data`` on top of ``base``;
    ``unique_keys`` (a config file): a key set twice in ``data`` (dotted and inside its section)
    raises."""
    config = base if base is not None else TrainConfig()
    data, tensorboard, sets_report_to = _retired_tensorboard_key(data)
    update_from_dict(config, data, help_pointer=_HELP_POINTER, unique_keys=unique_keys)
    if tensorboard is not None:
        report_to = config.log.report_to
        if sets_report_to and ("tensorboard" in report_to) != tensorboard:
            raise ValueError(f"log.tensorboard={str(tensorboard).lower()} contradicts "
                             f"log.report_to={report_to}: drop log.tensorboard (replaced by "
                             "log.report_to)")
        if not sets_report_to:  # the old switch turns TensorBoard on or off, nothing else
            others = [name for name in report_to if name not in ("none", "tensorboard")]
            config.log.report_to = (["tensorboard", *others] if tensorboard else others
                                    ) or ["none"]
    return config


def recorded_config(data: Mapping[str, Any]) -> TrainConfig:
    """The :class:`TrainConfig` a run recorded (its ``config.yaml``, a checkpoint's
    ``state.json``), read as this version must read it: a credit default changed since the run
    keeps the value it had then (:func:`~gear_rl.credit.registry.upgrade_recorded_config`), and
    a retired key the run wrote in its day (``log.tensorboard``) is translated without the
    deprecation warning, which is meant for whoever writes the key now, not for a run that
    recorded it."""
    return _config_as_recorded(upgrade_recorded_config(data))


def recorded_config_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config a run recorded, in the form two configs are compared in (the study's cell
    match, :func:`gear_rl.train.resume.config_differences`): :func:`recorded_config` written
    back by :func:`config_to_dict` (an option added since the run counts as its default), or,
    where it no longer builds (a key this version does not know, a value it refuses), the
    recorded dict with only the changed credit defaults filled in, so that the comparison shows
    the difference instead of failing."""
    upgraded = upgrade_recorded_config(data)
    try:
        return config_to_dict(_config_as_recorded(copy.deepcopy(upgraded)))
    except ValueError:
        return upgraded


def _config_as_recorded(data: Mapping[str, Any]) -> TrainConfig:
    """:func:`config_from_dict` of an upgraded recorded config, without the retired-key
    warning (see :func:`recorded_config`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_RETIRED_TENSORBOARD, category=FutureWarning)
        return config_from_dict(data)


_RETIRED_TENSORBOARD = "log.tensorboard is deprecated"
"""The start of the warning a config with the retired ``log.tensorboard`` key gets (and a run's
recorded config does not: :func:`recorded_config`)."""


def _retired_tensorboard_key(data: Mapping[str, Any]
                             ) -> tuple[Mapping[str, Any], bool | None, bool]:
    """``data`` without the retired ``log.tensorboard`` switch (dotted, or inside ``log``),
    the switch's value (None: not set) and whether ``data`` sets ``log.report_to``. A config
    written before ``log.report_to`` (a run's ``config.yaml``, a study file) still loads and
    resumes; the switch warns that it is deprecated."""
    if not isinstance(data, Mapping):
        return data, None, False  # update_from_dict says what is wrong with it
    data = dict(data)
    values = []
    if "log.tensorboard" in data:
        values.append(data.pop("log.tensorboard"))
    section = data.get("log")
    if isinstance(section, Mapping) and "tensorboard" in section:
        section = dict(section)
        values.append(section.pop("tensorboard"))
        data["log"] = section
    sets_report_to = "log.report_to" in data or (isinstance(section, Mapping)
                                                 and "report_to" in section)
    if not values:
        return data, None, sets_report_to
    flags = {coerce("log.tensorboard", value, bool) for value in values}
    if len(flags) > 1:
        raise ValueError("config key 'log.tensorboard' is set twice, to true and to false")
    warnings.warn(f"{_RETIRED_TENSORBOARD}: use log.report_to (tensorboard, wandb, "
                  "trackio, a list of them, or none); log.tensorboard=false reads as "
                  "log.report_to=none", FutureWarning, stacklevel=1)
    return data, flags.pop(), sets_report_to


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON-ready) of ``config``, as a run records it: ``credit`` also
    holds the resolved value of each field whose default changed since runs were first
    recorded (:func:`~gear_rl.credit.registry.record_credit_defaults`), so the record keeps its
    meaning."""
    return record_credit_defaults(dataclasses.asdict(config))


def apply_overrides(config: TrainConfig, items: Sequence[str]) -> TrainConfig:
    """Apply ``key=value`` strings to ``config`` (in place) and return it."""
    return config_from_dict(parse_overrides(items), config)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (), *,
                validate: bool = True) -> TrainConfig:
    """Defaults, then the YAML file at ``path`` (if any; each key set once there, errors name
    the file), then ``overrides`` in order (a later one wins); validated unless
    ``validate=False`` (keys and types are checked either way)."""
    config = TrainConfig()
    if path is not None:
        data = read_yaml(path) or {}
        try:
            config_from_dict(data, config, unique_keys=True)
        except ValueError as error:
            raise ValueError(f"config file {shown(str(path))}: {error}") from None
    apply_overrides(config, overrides)
    if validate:
        config.validate()
    return config
