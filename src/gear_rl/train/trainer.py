"""The single-machine GRPO-family trainer: ``gear-rl train``.

One step, top to bottom (``Trainer.step``):

1. **Rollout.** ``rollout.prompts_per_step`` problems, ``rollout.samples_per_prompt`` (K)
   responses each, sampled with a KV cache until end of turn. Agent tasks (``tool-math``,
   ``bfcl``) run multi-turn: tool calls execute in a sandbox and their outputs are appended as
   observation tokens; environment tasks (``sokoban``, ``keydoor``) play one game per row. Both
   go through ``gear_rl.train.episodes.collect`` (as does evaluation). Observation tokens stay
   in the context and get mask 0 in the signals, the credit and the loss.
2. **Reward.** The task's scorer on each decoded response (1 correct, 0 not); environments:
   1 when the level is solved (their shaped per-turn rewards are the step rewards).
3. **Signals** (no grad). The student's log-probs of its sampled tokens (PPO's "old" log-probs)
   and entropy; when the estimator needs them (``estimator.needs``) the same pass also scores
   the responses under the ground-truth-conditioned teacher prompt (one extra no-grad forward)
   for the per-token divergence (``gear_rl.signals.token_signals``).
4. **Credit.** ``gear_rl.credit.get_estimator(estimator)`` turns rewards (+ signals) into
   ``[B, T]`` token-level advantages. GEAR (arXiv 2605.11853) is the default.
5. **Update.** PPO clipped surrogate over those advantages (+ optional KL to the initial policy,
   + optional self-distillation), ``loss.epochs`` passes of ``loss.minibatches`` AdamW steps
   with gradient clipping. Weights stay fp32; forwards run under bf16 autocast where the device
   computes bf16 natively.

Everything random is derived from ``(seed, step)``, and checkpoints also carry the global RNG
states, so ``resume=RUN_DIR`` logs exactly the metrics an uninterrupted run logs.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from gear_rl.credit import CreditBatch, credit_diagnostics, gear_segments, get_estimator
from gear_rl.credit.diagnostics import reference_outcome, token_weights
from gear_rl.signals import (
    TeacherPromptConfig,
    response_logprobs,
    teacher_prompt_ids,
    token_signals,
)
from gear_rl.signals import prompt_ids as build_prompt_ids
from gear_rl.tasks import Problem, Task, load_task
from gear_rl.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from gear_rl.train.config import TrainConfig, config_from_dict, config_to_dict
from gear_rl.train.episodes import AgentLimits, Rows, collect
from gear_rl.train.evaluate import evaluate
from gear_rl.train.loss import aggregate, kl_penalty, ppo_policy_loss
from gear_rl.train.rollout import stop_token_ids

__all__ = ["Trainer", "bf16_is_native", "resolve_device", "train"]

def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; anything else as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def bf16_is_native(device: torch.device) -> bool:
    """True where bf16 matmuls are fast: CUDA with bf16 support, or a CPU with AVX-512 (BF16 /
    AMX on recent Xeons). On an AVX2-only CPU bf16 is emulated and slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def agent_limits(config: TrainConfig, *, evaluation: bool = False) -> AgentLimits:
    """The multi-turn limits of ``config.agent`` (evaluation: at least ``eval.max_new_tokens``
    per turn)."""
    agent = config.agent
    per_turn = agent.max_new_tokens_per_turn
    if evaluation:
        per_turn = max(per_turn, config.eval.max_new_tokens)
    return AgentLimits(max_turns=agent.max_turns, max_new_tokens_per_turn=per_turn,
                       max_response_tokens=agent.max_response_tokens,
                       max_observation_tokens=agent.max_observation_tokens)


def task_sandbox(task: Task, config: TrainConfig):
    """A :class:`~gear_rl.agent.tools.PythonSandbox` with ``config.agent``'s limits when
    ``task`` runs Python tool calls, else None. The caller closes it."""
    if task.agent is None or task.agent.tool != "python":
        return None
    from gear_rl.agent.tools import PythonSandbox

    return PythonSandbox(workers=config.agent.sandbox_workers,
                         timeout_s=config.agent.sandbox_timeout_s,
                         memory_mb=config.agent.sandbox_memory_mb)


def _derived_seed(*parts: int) -> int:
    value = 0x9E3779B97F4A7C15
    for part in parts:
        value = (value * 6364136223846793005 + int(part) + 1442695040888963407) % 2**63
    return value


def _pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Right-pad a ``[B, T]`` tensor with zeros to ``[B, length]``."""
    if tensor.shape[1] >= length:
        return tensor[:, :length]
    return torch.nn.functional.pad(tensor, (0, length - tensor.shape[1]))


@dataclass
class StepBatch:
    """One rollout batch and everything computed on it. Per-token tensors are ``[B, T]``.

    Attributes:
        problems: the ``B`` problems (each repeated K times, consecutively).
        group_ids: ``B`` group (problem) indices within the step.
        prompt_ids, teacher_ids, response_ids: token ids per row.
        finished: ``B`` flags (ended with a stop token).
        texts: ``B`` decoded responses. ``rewards``: ``[B]``.
        mask, old_logprobs, entropy: ``[B, T]`` (mask: 1 on the policy's own tokens).
        divergence, teacher_logprobs, ref_logprobs: ``[B, T]`` or None.
        advantages: ``[B, T]`` token-level advantages.
        policy_masks, turn_ids: per row and token (multi-turn tasks; None otherwise).
        extras: step inputs for the step-level estimators (``CreditBatch.extras``).
        rollout_metrics: agent / environment statistics of the batch.
    """

    problems: list[Problem]
    group_ids: list[int]
    prompt_ids: list[list[int]]
    teacher_ids: list[list[int]]
    response_ids: list[list[int]]
    finished: list[bool]
    texts: list[str]
    rewards: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    entropy: torch.Tensor
    divergence: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    policy_masks: list[list[int]] | None = None
    turn_ids: list[list[int]] | None = None
    extras: dict[str, Any] | None = None
    rollout_metrics: dict[str, float] | None = None


class Trainer:
    """Owns the policy, its sampler copy, the optimiser, the task and the run directory.

    Args:
        config: a validated :class:`TrainConfig` (``config.resume`` set: continue that run).
        model, tokenizer: an already-loaded policy (tests); None loads ``config.model``.
        task: an already-built task; None builds ``config.task``.
    """

    def __init__(self, config: TrainConfig, *, model=None, tokenizer=None,
                 task: Task | None = None) -> None:
        config.validate()
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        fast_bf16 = bf16_is_native(self.device)
        self.autocast = config.precision == "bf16" or (config.precision == "auto" and fast_bf16)
        sampler_bf16 = config.rollout.dtype == "bf16" or (config.rollout.dtype == "auto"
                                                          and fast_bf16)
        random.seed(config.seed)
        np.random.seed(config.seed % 2**32)
        torch.manual_seed(config.seed)

        if model is None:
            from gear_rl.models import load_policy

            model, tokenizer = load_policy(config.model, dtype=torch.float32,
                                           device=self.device, seed=config.seed)
        elif tokenizer is None:
            raise ValueError("tokenizer is required when model is given")
        self.model = model.to(self.device).float()
        self.model.eval()  # no dropout: the loss must score the sampling distribution
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, model)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.stop_ids[0])
        self.sampler = (copy.deepcopy(self.model).to(torch.bfloat16) if sampler_bf16
                        else self.model)
        self.reference = None
        if config.loss.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).requires_grad_(False)

        self.task = task if task is not None else load_task(
            config.task, options=config.task_options, train_size=config.train_size,
            eval_size=config.eval.size, seed=0, instruction=config.instruction,
            eval_path=config.eval_data,
        )
        self.estimator = get_estimator(config.estimator)
        self.credit_config = self.estimator.make_config(**config.credit)
        self._check_task_estimator()
        self.limits = agent_limits(config)
        self.sandbox = task_sandbox(self.task, config)
        self.distill = self.estimator.self_distillation or config.loss.opsd_coef > 0
        self.needs_teacher = self.distill or self.estimator.needs_teacher
        template = ({} if config.signals.answer_template is None
                    else {"answer_template": config.signals.answer_template})
        self.teacher_config = TeacherPromptConfig(placement=config.signals.placement, **template)
        self._prompt_cache: dict[str, tuple[list[int], list[int]]] = {}

        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.optim.lr,
            betas=(config.optim.beta1, config.optim.beta2), eps=config.optim.eps,
            weight_decay=config.optim.weight_decay,
        )
        self.start_step = 0
        self.run_dir = self._prepare_run_dir()
        self.writer = None
        if config.log.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"),
                                        purge_step=self.start_step + 1)
        self.history: list[dict[str, Any]] = self._read_jsonl(self.run_dir / "metrics.jsonl")

    def _check_task_estimator(self) -> None:
        """Step-level estimators need turns (agent or environment tasks); all but
        ``turn_level`` also need state keys (environment tasks)."""
        name = self.config.estimator
        if not self.estimator.step_level:
            return
        if self.task.env is None and self.task.agent is None:
            raise ValueError(f"estimator {name!r} assigns credit per turn: use a multi-turn task "
                             "(an environment such as sokoban/keydoor, or tool-math)")
        if self.task.env is None and self.estimator.requires_states(self.credit_config):
            raise ValueError(f"estimator {name!r} groups steps by environment state: use an "
                             "environment task (sokoban, keydoor); tool tasks have turns only "
                             "(estimator=turn_level)")

    def close(self) -> None:
        """Stop the sandbox workers (if any) and flush TensorBoard."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    # ------------------------------------------------------------------ run directory, resume
    def _prepare_run_dir(self) -> Path:
        config = self.config
        if config.resume:
            run_dir = Path(config.resume)
            checkpoint = latest_checkpoint(run_dir)
            if checkpoint is None:
                raise ValueError(f"resume: {run_dir} has no checkpoint to resume from")
            state = load_checkpoint(checkpoint, self.model, self.optimizer)
            set_rng_state(state["rng"])
            self.start_step = int(state["step"])
            self._sync_sampler()
            for name in ("metrics.jsonl", "samples.jsonl"):
                self._truncate_jsonl(run_dir / name, self.start_step)
            return run_dir
        if config.out:
            run_dir = Path(config.out)
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            run_dir = Path("runs") / f"{stamp}-{config.estimator}-s{config.seed}"
        if (run_dir / "checkpoints").exists():
            raise ValueError(f"out: {run_dir} already holds a run; pass resume={run_dir} to "
                             "continue it, or choose another out")
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved = config_to_dict(config)
        resolved["out"] = str(run_dir)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
        (run_dir / "run.json").write_text(json.dumps({
            "task": self.task.name, "train_problems": len(self.task.train),
            "eval_problems": len(self.task.eval), "device": str(self.device),
            "autocast_bf16": self.autocast,
            "sampler_dtype": str(next(self.sampler.parameters()).dtype),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "torch": torch.__version__, "argv": sys.argv,
        }, indent=2) + "\n")
        for name in ("metrics.jsonl", "samples.jsonl"):
            (run_dir / name).write_text("")
        return run_dir

    @staticmethod
    def _read_jsonl(path: Path) -> list[dict[str, Any]]:
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    @staticmethod
    def _truncate_jsonl(path: Path, last_step: int) -> None:
        """Drop records of steps after ``last_step`` (logged by the interrupted run after its
        last checkpoint), atomically."""
        if not path.is_file():
            return
        kept = [line for line in path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= last_step]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with (self.run_dir / name).open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    # ------------------------------------------------------------------ helpers
    def _autocast(self):
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def _sync_sampler(self) -> None:
        if self.sampler is self.model:
            return
        with torch.no_grad():
            for target, source in zip(self.sampler.parameters(), self.model.parameters(),
                                      strict=True):
                target.copy_(source)

    def _prompts(self, problem: Problem) -> tuple[list[int], list[int]]:
        if problem.id not in self._prompt_cache:
            student = build_prompt_ids(self.tokenizer, problem.prompt)
            teacher = teacher_prompt_ids(self.tokenizer, problem.prompt, problem.reference,
                                         kind=problem.reference_kind,
                                         config=self.teacher_config)
            self._prompt_cache[problem.id] = (student, teacher)
        return self._prompt_cache[problem.id]

    def _problems_for_step(self, step: int) -> list[Problem]:
        """The step's problems: consecutive slices of a per-epoch shuffle of the training set."""
        count, train = self.config.rollout.prompts_per_step, self.task.train
        out = []
        for j in range(count):
            index = (step - 1) * count + j
            epoch, position = divmod(index, len(train))
            order = list(range(len(train)))
            random.Random(_derived_seed(self.config.seed, 17, epoch)).shuffle(order)
            out.append(train[order[position]])
        return out

    def _lr(self, step: int) -> float:
        warmup = self.config.optim.warmup_steps
        scale = min(1.0, step / warmup) if warmup > 0 else 1.0
        return self.config.optim.lr * scale

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def rollout(self, step: int) -> StepBatch:
        """Sample K responses (or episodes) for each of the step's problems and score them."""
        config = self.config.rollout
        problems = [p for p in self._problems_for_step(step)
                    for _ in range(config.samples_per_prompt)]
        group_ids = [i // config.samples_per_prompt for i in range(len(problems))]
        pairs = [self._prompts(p) for p in problems]
        generator = torch.Generator(device=self.device).manual_seed(
            _derived_seed(self.config.seed, 1, step))
        rows = collect(
            self.task, problems, [s for s, _ in pairs], model=self.sampler,
            tokenizer=self.tokenizer, stop_ids=self.stop_ids, pad_id=self.pad_id,
            temperature=config.temperature, top_p=config.top_p, generator=generator,
            max_new_tokens=config.max_new_tokens, batch_size=config.batch_size,
            limits=self.limits, sandbox=self.sandbox,
        )
        empty = torch.zeros(0)
        return StepBatch(problems=problems, group_ids=group_ids,
                         prompt_ids=[s for s, _ in pairs], teacher_ids=[t for _, t in pairs],
                         response_ids=rows.response_ids, finished=rows.finished,
                         texts=rows.texts, rewards=torch.tensor(rows.rewards), mask=empty,
                         old_logprobs=empty, entropy=empty, policy_masks=rows.policy_masks,
                         turn_ids=rows.turn_ids, extras=self._step_extras(rows),
                         rollout_metrics=rows.metrics)

    @staticmethod
    def _step_extras(rows: Rows) -> dict[str, Any] | None:
        if rows.step_spans is None:
            return None
        extras: dict[str, Any] = {"step_spans": rows.step_spans}
        if rows.step_rewards is not None:
            extras["step_rewards"] = rows.step_rewards
        if rows.state_keys is not None:
            extras["state_keys"] = rows.state_keys
        return extras

    def _masks(self, batch: StepBatch, rows) -> list[list[int]] | None:
        """The policy masks of ``rows`` (None: single-turn, every token is the policy's)."""
        if batch.policy_masks is None:
            return None
        if isinstance(rows, slice):
            return batch.policy_masks[rows]
        return [batch.policy_masks[i] for i in rows]

    @torch.no_grad()
    def score(self, batch: StepBatch) -> None:
        """Fill ``batch`` with old log-probs, entropy and (when needed) the teacher signals and
        reference log-probs; no gradients."""
        size, config = self.config.signals.batch_size, self.config
        length = max(len(r) for r in batch.response_ids)
        parts: dict[str, list[torch.Tensor]] = {}
        for start in range(0, len(batch.response_ids), size):
            rows = slice(start, start + size)
            with self._autocast():
                if self.needs_teacher:
                    sig = token_signals(
                        self.model, batch.prompt_ids[rows], batch.teacher_ids[rows],
                        batch.response_ids[rows], temperature=config.rollout.temperature,
                        estimator=config.signals.divergence, topk=config.signals.topk,
                        chunk_size=config.signals.chunk_size,
                        response_mask=self._masks(batch, rows),
                    )
                    fields = {"old_logprobs": sig.student_logprobs, "entropy": sig.entropy,
                              "divergence": sig.divergence,
                              "teacher_logprobs": sig.teacher_logprobs, "mask": sig.mask}
                else:
                    scores = response_logprobs(
                        self.model, batch.prompt_ids[rows], batch.response_ids[rows],
                        temperature=config.rollout.temperature,
                        chunk_size=config.signals.chunk_size,
                        response_mask=self._masks(batch, rows),
                    )
                    fields = {"old_logprobs": scores.logprobs, "entropy": scores.entropy,
                              "mask": scores.mask}
                if self.reference is not None:
                    fields["ref_logprobs"] = response_logprobs(
                        self.reference, batch.prompt_ids[rows], batch.response_ids[rows],
                        temperature=config.rollout.temperature,
                        chunk_size=config.signals.chunk_size,
                        response_mask=self._masks(batch, rows),
                    ).logprobs
            for name, value in fields.items():
                parts.setdefault(name, []).append(_pad(value.float(), length))
        for name, values in parts.items():
            setattr(batch, name, torch.cat(values))

    @staticmethod
    def _credit_batch(batch: StepBatch) -> CreditBatch:
        return CreditBatch(
            rewards=batch.rewards.to(batch.mask.device), group_ids=batch.group_ids,
            mask=batch.mask, divergence=batch.divergence, entropy=batch.entropy,
            student_logprobs=batch.old_logprobs, teacher_logprobs=batch.teacher_logprobs,
            extras=batch.extras or {},
        )

    def credit(self, batch: StepBatch) -> None:
        """Token-level advantages from the registry estimator."""
        batch.advantages = self.estimator(self._credit_batch(batch), self.credit_config).float()

    def update(self, batch: StepBatch, step: int) -> dict[str, float]:
        """``loss.epochs`` x ``loss.minibatches`` AdamW steps on ``batch``."""
        config = self.config.loss
        rows = len(batch.response_ids)
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr(step)
        totals = {"loss": 0.0, "pg_loss": 0.0, "kl_loss": 0.0, "opsd_loss": 0.0,
                  "clipped": 0.0, "approx_kl": 0.0, "tokens": 0.0, "grad_norm": 0.0}
        ratio_max, updates = 1.0, 0
        shuffle = torch.Generator().manual_seed(_derived_seed(self.config.seed, 2, step))
        for _ in range(config.epochs):
            order = torch.randperm(rows, generator=shuffle).tolist()
            for minibatch in np.array_split(np.array(order), config.minibatches):
                minibatch = sorted(minibatch.tolist())
                num_tokens = float(batch.mask[minibatch].sum())
                self.optimizer.zero_grad(set_to_none=True)
                for start in range(0, len(minibatch), config.micro_batch_size):
                    micro = minibatch[start:start + config.micro_batch_size]
                    parts, stats = self._micro_loss(batch, micro, len(minibatch), num_tokens)
                    parts["loss"].backward()
                    for name, value in parts.items():
                        totals[name] += float(value.detach())
                    if stats is not None:
                        totals["clipped"] += stats.clipped
                        totals["approx_kl"] += stats.approx_kl
                        totals["tokens"] += stats.tokens
                        ratio_max = max(ratio_max, stats.ratio_max)
                clip = self.config.optim.grad_clip
                params = [p for p in self.model.parameters() if p.grad is not None]
                norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
                totals["grad_norm"] += float(norm)
                self.optimizer.step()
                updates += 1
        self._sync_sampler()
        tokens = max(totals.pop("tokens"), 1.0)
        out = {name: value / updates for name, value in totals.items()
               if name not in ("clipped", "approx_kl")}
        out["clip_frac"] = totals["clipped"] / tokens
        out["approx_kl"] = totals["approx_kl"] / tokens
        out["ratio_max"] = ratio_max
        out["lr"] = self._lr(step)
        return out

    def _micro_loss(self, batch: StepBatch, rows: list[int], num_seqs: int,
                    num_tokens: float):
        """Loss of the micro-batch ``rows`` scaled so micro-batches sum to the mini-batch loss.

        Returns ``({"loss", "pg_loss", "kl_loss", "opsd_loss"}, PolicyLossStats | None)``.
        """
        config, signals = self.config, self.config.signals
        prompts = [batch.prompt_ids[i] for i in rows]
        responses = [batch.response_ids[i] for i in rows]
        with self._autocast():
            if self.distill:
                sig = token_signals(
                    self.model, prompts, [batch.teacher_ids[i] for i in rows], responses,
                    temperature=config.rollout.temperature, estimator=signals.divergence,
                    topk=signals.topk, chunk_size=signals.chunk_size, student_requires_grad=True,
                    response_mask=self._masks(batch, rows),
                )
                logprobs, divergence = sig.student_logprobs, sig.divergence
            else:
                logprobs = response_logprobs(
                    self.model, prompts, responses, temperature=config.rollout.temperature,
                    chunk_size=signals.chunk_size, requires_grad=True,
                    response_mask=self._masks(batch, rows),
                ).logprobs
                divergence = None
        length = logprobs.shape[1]
        logprobs = logprobs.float()
        mask = batch.mask[rows, :length]
        agg = {"mode": config.loss.agg_mode, "num_seqs": num_seqs, "num_tokens": num_tokens,
               "horizon": config.rollout.max_new_tokens}
        zero = logprobs.sum() * 0.0
        parts = {"pg_loss": zero, "kl_loss": zero, "opsd_loss": zero}
        stats = None
        if self.estimator.uses_reward:
            parts["pg_loss"], stats = ppo_policy_loss(
                logprobs, batch.old_logprobs[rows, :length], batch.advantages[rows, :length],
                mask, clip_low=config.loss.clip_low, clip_high=config.loss.clip_high,
                agg_mode=agg["mode"], num_seqs=num_seqs, num_tokens=num_tokens,
                horizon=agg["horizon"],
            )
        if self.reference is not None:
            kl = kl_penalty(logprobs, batch.ref_logprobs[rows, :length], config.loss.kl_type)
            parts["kl_loss"] = aggregate(kl, mask, agg["mode"], num_seqs=num_seqs,
                                         num_tokens=num_tokens, horizon=agg["horizon"])
        if divergence is not None:
            parts["opsd_loss"] = aggregate(divergence.float(), mask, agg["mode"],
                                           num_seqs=num_seqs, num_tokens=num_tokens,
                                           horizon=agg["horizon"])
        opsd_weight = config.loss.opsd_coef
        if self.estimator.self_distillation and opsd_weight == 0:
            opsd_weight = 1.0
        loss = (parts["pg_loss"] + config.loss.kl_coef * parts["kl_loss"]
                + opsd_weight * parts["opsd_loss"])
        return {"loss": loss, **{k: v.detach() for k, v in parts.items()}}, stats

    # ------------------------------------------------------------------ metrics and samples
    def batch_metrics(self, batch: StepBatch) -> dict[str, float]:
        """Rollout and credit health numbers of one batch."""
        rewards, mask = batch.rewards, batch.mask
        tokens = mask.sum().clamp(min=1.0)
        groups = rewards.view(-1, self.config.rollout.samples_per_prompt)
        lengths = torch.tensor([len(r) for r in batch.response_ids], dtype=torch.float32)
        out = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "accuracy": float((rewards >= 1.0).float().mean()),
            "groups_mixed": float((groups.max(1).values > groups.min(1).values).float().mean()),
            "response_len": float(lengths.mean()),
            "truncated": 1.0 - sum(batch.finished) / len(batch.finished),
            "entropy_mean": float((batch.entropy * mask).sum() / tokens),
        }
        if batch.ref_logprobs is not None:
            out["ref_kl"] = float(((batch.old_logprobs - batch.ref_logprobs) * mask).sum()
                                  / tokens)
        out.update(self._credit_metrics(batch))
        out.update(batch.rollout_metrics or {})
        return out

    def _weights(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``([B] trajectory advantage A, [B, T] token weight W = Ahat / A)``."""
        scalar = reference_outcome(self._credit_batch(batch), self.credit_config).float()
        return scalar, token_weights(scalar, batch.advantages, batch.mask)

    def _segments(self, batch: StepBatch) -> torch.Tensor | None:
        if not self.estimator.segments or batch.divergence is None:
            return None
        return gear_segments(batch.divergence, batch.entropy, batch.mask, self.credit_config)

    def _credit_metrics(self, batch: StepBatch) -> dict[str, float]:
        return credit_diagnostics(self.estimator, self.credit_config, self._credit_batch(batch),
                                  batch.advantages)

    def samples(self, batch: StepBatch, step: int) -> list[dict[str, Any]]:
        """A few trajectories with their per-token signals (for the report's token viewer):
        alternately the best and worst rewarded rows of mixed groups first."""
        count = self.config.log.samples_per_step
        if count == 0:
            return []
        k = self.config.rollout.samples_per_prompt
        chosen: list[int] = []
        for group in range(len(batch.response_ids) // k):
            rows = list(range(group * k, (group + 1) * k))
            rewards = batch.rewards[rows]
            if float(rewards.max()) > float(rewards.min()):
                chosen += [rows[int(rewards.argmax())], rows[int(rewards.argmin())]]
        chosen += [i for i in range(len(batch.response_ids)) if i not in chosen]
        scalar, weights = self._weights(batch)
        if not self.estimator.uses_reward:
            weights = None
        segments = self._segments(batch)
        out = []
        for row in chosen[:count]:
            length = len(batch.response_ids[row])
            record: dict[str, Any] = {
                "step": step, "row": row, "group": batch.group_ids[row],
                "problem_id": batch.problems[row].id,
                "prompt": self.tokenizer.decode(batch.prompt_ids[row]),
                "answer": batch.problems[row].answer, "response": batch.texts[row],
                "extracted": self.task.extract(batch.texts[row]),
                "reward": float(batch.rewards[row]), "advantage": float(scalar[row]),
                "finished": batch.finished[row],
                "tokens": [self.tokenizer.decode([t]) for t in batch.response_ids[row]],
                "token_ids": batch.response_ids[row],
            }
            if batch.turn_ids is not None:
                # multi-turn: mask 0 marks observation tokens; the transcript shows them
                record["turn_ids"] = batch.turn_ids[row]
                record["transcript"] = self.tokenizer.decode(batch.response_ids[row],
                                                             skip_special_tokens=False)

            def values(tensor: torch.Tensor | None, row: int = row, length: int = length):
                return (None if tensor is None
                        else [round(float(v), 5) for v in tensor[row, :length]])

            record["mask"] = [int(v) for v in batch.mask[row, :length]]
            record["entropy"] = values(batch.entropy)
            record["divergence"] = values(batch.divergence)
            record["student_logprobs"] = values(batch.old_logprobs)
            record["teacher_logprobs"] = values(batch.teacher_logprobs)
            record["token_advantage"] = values(batch.advantages)
            record["weight"] = values(weights)
            record["segment_onset"] = (None if segments is None
                                       else [int(v) for v in segments[row, :length]])
            out.append(record)
        return out

    def _log(self, record: dict[str, Any]) -> None:
        self._append("metrics.jsonl", record)
        self.history.append(record)
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key.replace("@", "_at_"), value, record["step"])
            self.writer.flush()

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, Any]:
        """Held-out Mean@k / pass@k of the current policy (``eval.*`` settings)."""
        config = self.config.eval
        return evaluate(
            self.sampler, self.tokenizer, self.task, k=config.k, temperature=config.temperature,
            top_p=config.top_p, max_new_tokens=config.max_new_tokens, seed=config.seed,
            stop_ids=self.stop_ids, pad_id=self.pad_id, batch_size=config.batch_size,
            limits=agent_limits(self.config, evaluation=True), sandbox=self.sandbox,
        )

    def _eval_record(self, step: int) -> dict[str, Any]:
        started, cpu_started = time.perf_counter(), time.process_time()
        result = self.evaluate()
        k = self.config.eval.k
        return {"step": step, f"eval/mean@{k}": result[f"mean@{k}"],
                f"eval/pass@{k}": result[f"pass@{k}"],
                "eval/response_len": result["response_len"],
                "eval/truncated": result["truncated"],
                "time/eval": time.perf_counter() - started,
                "time/eval_cpu": time.process_time() - cpu_started,
                **{f"eval/{key}": value for key, value in result.items()
                   if key.startswith(("agent/", "env/"))}}

    # ------------------------------------------------------------------ the loop
    def step(self, step: int) -> tuple[dict[str, Any], StepBatch]:
        """One full training step; returns its metrics record and batch."""
        timings, started, cpu_started = {}, time.perf_counter(), time.process_time()
        batch = self.rollout(step)
        timings["time/rollout"] = time.perf_counter() - started
        mark = time.perf_counter()
        self.score(batch)
        timings["time/signals"] = time.perf_counter() - mark
        mark = time.perf_counter()
        self.credit(batch)
        timings["time/credit"] = time.perf_counter() - mark
        mark = time.perf_counter()
        update = self.update(batch, step)
        timings["time/update"] = time.perf_counter() - mark
        timings["time/step"] = time.perf_counter() - started
        # CPU seconds of this process (all its threads): on a shared machine, wall time
        # measures the neighbours too; this is what the step itself cost.
        timings["time/step_cpu"] = time.process_time() - cpu_started
        tokens = sum(len(r) for r in batch.response_ids)
        record = {"step": step, **self.batch_metrics(batch), **update, **timings,
                  "rollout_tok_per_s": tokens / max(timings["time/rollout"], 1e-9)}
        return record, batch

    def train(self) -> dict[str, Any]:
        """Run (or continue) the configured number of steps; returns the end summary. The
        sandbox and TensorBoard writer are closed at the end, also when a step fails."""
        try:
            return self._train()
        finally:
            self.close()

    def _train(self) -> dict[str, Any]:
        config = self.config
        started = time.perf_counter()
        k = config.eval.k
        if self.start_step == 0 and config.eval.at_start:
            self._log(self._eval_record(0))
        progress = None
        if config.log.progress:
            from tqdm import tqdm

            progress = tqdm(total=config.steps, initial=self.start_step, desc="train",
                            unit="step", dynamic_ncols=True, file=sys.stderr)
        for step in range(self.start_step + 1, config.steps + 1):
            record, batch = self.step(step)
            last = step == config.steps
            if last or (config.eval.every and step % config.eval.every == 0):
                record.update({key: value for key, value in self._eval_record(step).items()
                               if key != "step"})
            self._log(record)
            for sample in self.samples(batch, step):
                self._append("samples.jsonl", sample)
            if last or (config.log.checkpoint_every and step % config.log.checkpoint_every == 0):
                save_checkpoint(self.run_dir, step, self.model, self.optimizer,
                                keep=config.log.keep_checkpoints)
            if progress is not None:
                postfix = {"reward": f"{record['reward_mean']:.3f}",
                           "loss": f"{record['loss']:+.4f}"}
                if f"eval/mean@{k}" in record:
                    postfix[f"eval@{k}"] = f"{record[f'eval/mean@{k}']:.3f}"
                for name, label in (("env/success_rate", "solved"),
                                    ("agent/tool_call_rate", "tools")):
                    if name in record:
                        postfix[label] = f"{record[name]:.2f}"
                progress.set_postfix(postfix)
                progress.update(1)
        if progress is not None:
            progress.close()
        summary = self.summary(time.perf_counter() - started)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def summary(self, seconds: float) -> dict[str, Any]:
        """Start/end held-out accuracy, reward trend and timings from ``metrics.jsonl``."""
        k = self.config.eval.k
        key = f"eval/mean@{k}"
        evals = [(r["step"], r[key], r[f"eval/pass@{k}"]) for r in self.history if key in r]
        steps = [r for r in self.history if "reward_mean" in r]
        head, tail = steps[:5], steps[-5:]

        def mean(records: list[dict[str, Any]], name: str) -> float | None:
            values = [r[name] for r in records if name in r]
            return sum(values) / len(values) if values else None

        out: dict[str, Any] = {
            "run_dir": str(self.run_dir), "estimator": self.config.estimator,
            "model": self.config.model, "task": self.task.name, "steps": len(steps),
            "seconds_this_session": round(seconds, 1),
            "step_seconds_mean": mean(steps, "time/step"),
            "reward_first5": mean(head, "reward_mean"), "reward_last5": mean(tail, "reward_mean"),
        }
        if evals:
            out[f"eval_start_mean@{k}"] = evals[0][1]
            out[f"eval_end_mean@{k}"] = evals[-1][1]
            out[f"eval_start_pass@{k}"] = evals[0][2]
            out[f"eval_end_pass@{k}"] = evals[-1][2]
            out["eval_history"] = evals
        return out


def format_summary(summary: dict[str, Any]) -> str:
    """The one-screen end summary."""
    lines = ["", "=" * 64, f"gear-rl train: {summary['estimator']} on {summary['model']}",
             f"task       {summary['task']}",
             f"steps      {summary['steps']}   ({summary['seconds_this_session']:.0f} s this "
             f"session, {summary['step_seconds_mean'] or 0:.1f} s/step)"]
    if summary.get("reward_first5") is not None:
        lines.append(f"reward     first 5 steps {summary['reward_first5']:.3f}  ->  last 5 "
                     f"{summary['reward_last5']:.3f}")
    for key in [k for k in summary if k.startswith("eval_start_")]:
        metric = key.removeprefix("eval_start_")
        start, end = summary[key], summary[f"eval_end_{metric}"]
        lines.append(f"held-out   {metric:<8} {start:.3f}  ->  {end:.3f}  ({end - start:+.3f})")
    lines += [f"run dir    {summary['run_dir']}  (metrics.jsonl, samples.jsonl, tensorboard/, "
              "checkpoints/)", "=" * 64]
    return "\n".join(lines)


def resume_config(run_dir: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """The saved config of ``run_dir`` with ``resume`` set; ``overrides`` may change only
    ``steps``, ``threads``, ``device``, ``log.*`` and ``eval.every`` (anything else would make
    the continued run a different run)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"resume: {run_dir} has no config.yaml (not a gear-rl run directory)")
    config = config_from_dict(yaml.safe_load(path.read_text()))
    allowed = ("steps", "threads", "device", "log.", "eval.every", "resume", "out")
    for key in overrides or {}:
        if not key.startswith(allowed):
            raise ValueError(f"resume: {key!r} cannot change when resuming; only steps, threads, "
                             "device, log.* and eval.every can")
    config_from_dict(dict(overrides or {}), config)
    config.resume = str(run_dir)
    config.out = str(run_dir)
    config.validate()
    return config


def train(config: TrainConfig, **kwargs: Any) -> dict[str, Any]:
    """Build a :class:`Trainer` for ``config`` and run it; returns the end summary."""
    return Trainer(config, **kwargs).train()



def evaluate_model(config: TrainConfig, checkpoint: str | Path | None = None) -> dict[str, Any]:
    """Held-out Mean@k / pass@k of ``config.model`` (or of a checkpoint: a run directory, whose
    latest checkpoint is used, or a ``checkpoints/step-N`` folder) on ``config.task`` with the
    ``config.eval`` settings. Returns :func:`gear_rl.train.evaluate.evaluate`'s dict."""
    from gear_rl.models import load_policy

    config.validate()
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    model, tokenizer = load_policy(config.model, dtype=torch.float32, device=device,
                                   seed=config.seed)
    if checkpoint is not None:
        folder = Path(checkpoint)
        if not (folder / "model.safetensors").is_file():
            found = latest_checkpoint(folder)
            if found is None:
                raise ValueError(f"checkpoint: {folder} is neither a checkpoint folder nor a "
                                 "run directory with one")
            folder = found
        load_checkpoint(folder, model)
    if config.rollout.dtype == "bf16" or (config.rollout.dtype == "auto"
                                          and bf16_is_native(device)):
        model = model.to(torch.bfloat16)
    task = load_task(config.task, options=config.task_options, train_size=config.train_size,
                     eval_size=config.eval.size, seed=0, instruction=config.instruction,
                     eval_path=config.eval_data)
    stops = stop_token_ids(tokenizer, model)
    pad = tokenizer.pad_token_id
    limits = agent_limits(config, evaluation=True)
    sandbox = task_sandbox(task, config)
    try:
        return evaluate(model, tokenizer, task, k=config.eval.k,
                        temperature=config.eval.temperature, top_p=config.eval.top_p,
                        max_new_tokens=config.eval.max_new_tokens, seed=config.eval.seed,
                        stop_ids=stops, pad_id=int(pad if pad is not None else stops[0]),
                        batch_size=config.eval.batch_size, limits=limits, sandbox=sandbox)
    finally:
        if sandbox is not None:
            sandbox.close()
