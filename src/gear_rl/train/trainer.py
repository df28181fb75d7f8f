"""The single-machine GRPO-family trainer: ``gear-rl train``.

One step, top to bottom (:meth:`Trainer.step`), five calls, each a timed phase
(``time/<name>``):

1. **Rollout** (:meth:`Trainer.rollout`). ``rollout.prompts_per_step`` problems,
   ``rollout.samples_per_prompt`` (K) responses each, sampled with a KV cache until end of turn
   (:mod:`gear_rl.sampling`); agent tasks run multi-turn (tool outputs appended as observation
   tokens), environment tasks play one game per row (:func:`gear_rl.train.episodes.collect`,
   shared with evaluation). Rewards come from the task's scorer. Returns a
   :class:`~gear_rl.train.scoring.StepBatch`.
2. **Score** (phase ``signals``; :meth:`Trainer.score`, no grad;
   :mod:`gear_rl.train.scoring`). The student's
   log-probs of its sampled tokens (PPO's "old" log-probs) and entropy; when the estimator's
   declaration needs the teacher, the same pass scores the responses under the
   ground-truth-conditioned teacher prompt for the per-token divergence
   (:func:`gear_rl.signals.token_signals`). Returns a :class:`~gear_rl.train.scoring.Scores`.
3. **Values** (:meth:`Trainer.values`). Monte-Carlo values at the boundaries the estimator
   names (``Estimator.mc_boundaries``: SPO-chain, VinePPO), from continuations the sampler
   draws; nothing for other estimators.
4. **Credit** (:meth:`Trainer.credit`). The registered estimator
   (:func:`gear_rl.credit.get_estimator`) turns rewards and signals into ``[B, T]`` token-level
   advantages. GEAR (arXiv 2605.11853) is the default.
5. **Update** (:meth:`Trainer.update`; :mod:`gear_rl.train.update`). PPO clipped surrogate over
   those advantages (+ optional KL to the initial policy, + self-distillation where the
   estimator declares it or ``loss.opsd_coef`` asks for it), ``loss.epochs`` passes of
   ``loss.minibatches`` AdamW steps with gradient clipping.

Every speed or memory trick is behind one of two names. :class:`~gear_rl.train.scoring.Fusion`
(``loss.fuse_scoring``): the update's forward stands in for the scoring pass, which then
leaves the student's fields to it, and the credit runs before the update (``BEFORE``) or
inside it, per micro-batch (``INLINE``, handed over as a
:class:`~gear_rl.train.update.Credit`). :class:`~gear_rl.train.memory.MemoryPolicy`: when the
heap hands pages back and when the sampler copy holds weights.

Observation tokens stay in the context and get mask 0 in the signals, the credit and the loss.
Everything random is derived from ``(seed, stream, step)`` (:func:`gear_rl.seeding.derive_seed`),
and checkpoints carry the global RNG states, so ``resume=RUN_DIR`` logs exactly the metrics an
uninterrupted run logs. The run directory's layout is :mod:`gear_rl.rundir`; what is logged,
:mod:`gear_rl.train.records`; the model, task and sandbox, :mod:`gear_rl.train.runtime`; opening
the run's folder and resuming, :mod:`gear_rl.train.resume`.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gear_rl.credit import get_estimator
from gear_rl.credit.registry import upgrade_recorded_config
from gear_rl.seeding import derive_seed
from gear_rl.tasks import Problem, Task
from gear_rl.train.checkpoint import save_checkpoint
from gear_rl.train.config import TrainConfig, config_to_dict
from gear_rl.train.episodes import collect, monte_carlo_extras, step_extras, task_turns
from gear_rl.train.evaluate import run_evaluation
from gear_rl.train.memory import MemoryPolicy, memory_metrics, reset_device_peak
from gear_rl.train.mfu import ModelShape, matmul_peak
from gear_rl.train.records import batch_metrics, format_summary, sample_records, summarize
from gear_rl.train.resume import open_run, run_path
from gear_rl.train.runtime import build_runtime, rollout_settings
from gear_rl.train.scoring import (
    Fusion,
    Scorer,
    Scores,
    SignalPass,
    StepBatch,
    check_prompts_fit,
    prompt_pair,
    teacher_config,
)
from gear_rl.train.trackers import (
    TrackedRun,
    Tracker,
    finish_trackers,
    start_trackers,
    tracker_metrics,
)
from gear_rl.train.update import (
    Credit,
    NonFiniteTrainingError,
    UpdateEngine,
    UpdateResult,
    adamw,
    credit_function,
)

if TYPE_CHECKING:
    from gear_rl.agent.tools import PythonSandbox

__all__ = ["NonFiniteTrainingError", "StepOutput", "Trainer", "format_summary", "train"]


@dataclass
class StepOutput:
    """Everything one step computed: the rollout, its scores and the advantages trained on
    (``[B, T]``)."""

    batch: StepBatch
    scores: Scores
    advantages: torch.Tensor


class Trainer:
    """Owns the policy, its sampler copy, the optimiser, the task and the run directory.

    Args:
        config: a :class:`TrainConfig` (``config.resume`` set: continue that run).
        model, tokenizer: an already-loaded policy (tests); None loads ``config.model``.
        task: an already-built task; None builds ``config.task``.
    """

    def __init__(self, config: TrainConfig, *, model: torch.nn.Module | None = None,
                 tokenizer: Any = None, task: Task | None = None) -> None:
        config.validate()
        self.config = config
        random.seed(config.seed)
        np.random.seed(config.seed % 2**32)
        torch.manual_seed(config.seed)
        self.estimator = get_estimator(config.estimator)
        self.credit_config = self.estimator.make_config(**config.credit)
        path = run_path(config)  # fixed first: the sandbox hides it
        self.runtime = build_runtime(config, model=model, tokenizer=tokenizer, task=task,
                                     run_dir=path)
        runtime = self.runtime
        self.model, self.tokenizer, self.task = runtime.model, runtime.tokenizer, runtime.task
        self.stop_ids, self.pad_id = runtime.stop_ids, runtime.pad_id
        try:
            self._check_task_estimator()
            self.reference = None
            if config.loss.kl_coef > 0:
                import copy

                self.reference = copy.deepcopy(self.model).requires_grad_(False)
            distill = config.loss.opsd_weight(self.estimator.self_distillation) > 0
            signals = SignalPass(
                self.model, temperature=config.rollout.temperature,
                chunk_size=config.signals.chunk_size, divergence=config.signals.divergence,
                topk=config.signals.topk, share_prompts=config.loss.share_prompts,
                # None: multi-turn tasks (agent, environment) checkpoint their long rows' layers
                checkpoint_layers=(config.loss.checkpoint_layers
                                   if config.loss.checkpoint_layers is not None
                                   else task_turns(self.task) is not None),
                distill=distill)
            # config.validate has checked signals.placement (one of PLACEMENTS)
            self.teacher_config = teacher_config(config.signals.placement,
                                                 config.signals.answer_template)
            # the longer of each problem's student and teacher prompts must fit the context
            check_prompts_fit(self.tokenizer, self.model, (*self.task.train, *self.task.eval),
                              self.teacher_config, source=self.task.name,
                              new_tokens=max(config.rollout.max_new_tokens,
                                             config.eval.max_new_tokens))
            self.scorer = Scorer(signals, self.estimator, self.credit_config,
                                 needs_teacher=distill or self.estimator.needs_teacher,
                                 teacher_rows=config.signals.teacher_rows,
                                 batch_size=config.signals.batch_size, reference=self.reference,
                                 autocast=runtime.autocast_context)
            self.optimizer = adamw(self.model, config)
            self.run, self.start_step = open_run(config, runtime, self.optimizer, path)
        except BaseException:
            runtime.close()
            raise
        self.engine = UpdateEngine(
            self.model, self.optimizer, config, self.estimator, self.credit_config, signals,
            reference_kl=self.reference is not None,
            opsd_weight=config.loss.opsd_weight(self.estimator.self_distillation),
            autocast=runtime.autocast_context, last_checkpoint=self.run.latest_checkpoint,
            shape=self._model_shape())
        # the update's MFU is against this machine's matmul peak at the run's precision
        self.peak_dtype = torch.bfloat16 if runtime.autocast else torch.float32
        self.matmul_peak = (None if self.engine.shape is None else
                            matmul_peak(runtime.device, self.peak_dtype, self.engine.shape))
        self.memory = MemoryPolicy(runtime)
        self.run_dir = self.run.path
        self.history: list[dict[str, Any]] = self.run.read_metrics()
        self.trackers: list[Tracker] = self._start_trackers()

    @property
    def sampler(self) -> torch.nn.Module:
        return self.runtime.sampler

    @property
    def sandbox(self) -> PythonSandbox | None:
        return self.runtime.sandbox

    def _check_task_estimator(self) -> None:
        """Step-level estimators need turns (agent or environment tasks); those that group by
        state also need state keys (environment tasks)."""
        name = self.config.estimator
        if self.estimator.mc_boundaries is not None and task_turns(self.task) is not None:
            raise ValueError(f"estimator {name!r} continues single responses for its "
                             "Monte-Carlo values; continuing agent episodes and environment "
                             "levels (the credit check's replay) is not wired into the trainer: "
                             "use a single-turn task")
        if not self.estimator.step_level:
            return
        if self.task.env is None and self.task.agent is None:
            raise ValueError(f"estimator {name!r} assigns credit per turn: use a multi-turn task "
                             "(an environment such as sokoban/keydoor, or tool-math)")
        if self.task.env is None and self.estimator.requires_states(self.credit_config):
            raise ValueError(f"estimator {name!r} groups steps by environment state: use an "
                             "environment task (sokoban, keydoor); tool tasks have turns only "
                             "(estimator=turn_level)")
        agent = self.task.agent
        if agent is not None and not (agent.turn_reward_tool or agent.turn_reward_answer):
            warnings.warn(f"task {self.task.name!r} pays no turn rewards (AgentSpec."
                          "turn_reward_tool and turn_reward_answer are 0): every turn reward "
                          f"is 0, and {name!r} gives the outcome advantage alone", stacklevel=2)

    def _start_trackers(self) -> list[Tracker]:
        """``log.report_to``'s trackers, started on this run
        (:func:`~gear_rl.train.trackers.start_trackers`). One that cannot start stops the
        trainer before step 1: a new run's folder is removed (nothing was trained into it), a
        resumed run is left as it was."""
        config = self.config
        tracked = TrackedRun(self.run, self.run.read_info().get("run_id"), config.log.project,
                             upgrade_recorded_config(self.run.read_config()), self.start_step,
                             bool(config.resume))
        try:
            return start_trackers(config.log.report_to, tracked)
        except BaseException:
            self.runtime.close()
            if config.resume:
                self.run.unlock()
            else:
                self.run.discard_new()
            raise

    def close(self, *, failed: bool = False) -> None:
        """Stop the sandbox workers (if any), finish the trackers (``failed``: the run stopped
        on an error), release the run directory."""
        self.runtime.close()
        finish_trackers(getattr(self, "trackers", []), failed=failed)
        self.trackers = []
        if getattr(self, "run", None) is not None:
            self.run.unlock()

    # ------------------------------------------------------------------ the step
    def step(self, step: int) -> tuple[dict[str, Any], StepOutput]:
        """One full training step; returns its metrics record and what it computed."""
        timings: dict[str, float] = {}
        started, cpu_started = time.perf_counter(), time.process_time()
        reset_device_peak(self.runtime.device)
        with self._phase("rollout", timings):
            batch = self.rollout(step)
        with self._phase("signals", timings):
            scores = self.score(batch, self.engine.fusion(batch))
        with self._phase("values", timings):
            self.values(batch, scores, step)
        with self._phase("credit", timings):
            credit = self.credit_for_update(batch, scores, step)
        with self._phase("update", timings):
            update = self.update(batch, scores, credit, step)
        # the inline credit ran inside the update: its time is the credit's
        timings["time/credit"] += credit.seconds
        timings["time/update"] -= credit.seconds
        timings["time/step"] = time.perf_counter() - started
        # CPU seconds of this process (all its threads): on a shared machine, wall time
        # measures the neighbours too; this is what the step itself cost.
        timings["time/step_cpu"] = time.process_time() - cpu_started
        tokens = sum(len(r) for r in batch.response_ids)
        metrics = batch_metrics(batch, scores, update.advantages, self.estimator,
                                self.credit_config)
        record = {"step": step, **metrics, **update.metrics, **timings,
                  "rollout_tok_per_s": tokens / max(timings["time/rollout"], 1e-9),
                  **memory_metrics(self.runtime.device)}
        if update.flops is not None and self.matmul_peak is not None:
            # model FLOPs per second of the update's wall time, over the measured peak
            record["perf/update_mfu"] = (update.flops / max(timings["time/update"], 1e-9)
                                         / self.matmul_peak)
        return record, StepOutput(batch, scores, update.advantages)

    def _model_shape(self) -> ModelShape | None:
        """The policy's shape for the update's FLOPs; None for a model without a Hugging Face
        decoder config (its MFU is then not logged)."""
        try:
            return ModelShape.of(self.model)
        except (AttributeError, TypeError):
            return None

    @contextlib.contextmanager
    def _phase(self, name: str, timings: dict[str, float]) -> Iterator[None]:
        """Time the phase ``name`` (``time/<name>``) and hand its memory back after it
        (:meth:`MemoryPolicy.after_phase`)."""
        mark = time.perf_counter()
        yield
        self.memory.after_phase(name)
        timings[f"time/{name}"] = time.perf_counter() - mark

    # ------------------------------------------------------------------ 1. rollout
    @torch.no_grad()
    def rollout(self, step: int) -> StepBatch:
        """Sample K responses (or episodes) for each of the step's problems and score them."""
        k = self.config.rollout.samples_per_prompt
        step_problems = self._problems_for_step(step)
        problems = [p for p in step_problems for _ in range(k)]
        pairs = [pair for p in step_problems for pair in [self._prompts(p)] * k]
        generator = torch.Generator(device=self.runtime.device).manual_seed(
            derive_seed(self.config.seed, 1, step))
        rows = collect(self.task, problems, [s for s, _ in pairs], generator=generator,
                       **rollout_settings(self.config, self.runtime))
        return StepBatch(problems=problems, group_ids=[i // k for i in range(len(problems))],
                         prompt_ids=[s for s, _ in pairs], teacher_ids=[t for _, t in pairs],
                         response_ids=rows.response_ids, finished=rows.finished,
                         texts=rows.texts, rewards=torch.tensor(rows.rewards),
                         policy_masks=rows.policy_masks, turn_ids=rows.turn_ids,
                         extras=step_extras(rows.step_spans, rows.step_rewards,
                                            rows.state_keys), rollout_metrics=rows.metrics)

    def _prompts(self, problem: Problem) -> tuple[list[int], list[int]]:
        """The student and teacher prompt ids of ``problem``."""
        return prompt_pair(self.tokenizer, problem, self.teacher_config)

    def _problems_for_step(self, step: int) -> list[Problem]:
        """The step's problems: consecutive slices of a per-epoch shuffle of the training set."""
        count, problems = self.config.rollout.prompts_per_step, self.task.train
        out = []
        for j in range(count):
            index = (step - 1) * count + j
            epoch, position = divmod(index, len(problems))
            order = list(range(len(problems)))
            random.Random(derive_seed(self.config.seed, 17, epoch)).shuffle(order)
            out.append(problems[order[position]])
        return out

    # ------------------------------------------------------------------ 2. score
    def score(self, batch: StepBatch, fusion: Fusion | None = None) -> Scores:
        """The no-grad scoring pass (:class:`Scorer`). ``fusion`` (:meth:`UpdateEngine.fusion`):
        the update's forward stands in for it, and the student's fields are left to that
        forward."""
        return self.scorer(batch, fusion)

    # ------------------------------------------------------------------ 2b. values
    @torch.no_grad()
    def values(self, batch: StepBatch, scores: Scores, step: int) -> None:
        """Monte-Carlo values, where the estimator asks for them (``Estimator.mc_boundaries``:
        SPO-chain, VinePPO): at each boundary ``b`` the estimator names, ``V`` of the prompt
        and the first ``b`` response tokens is the mean reward of ``mc_samples`` continuations
        of that prefix by the sampler, at the rollout's temperature, top-p and remaining budget
        (:func:`gear_rl.train.episodes.monte_carlo_extras`, which the credit check's
        Monte-Carlo rows call too: the continuations of every trajectory decode together,
        ``rollout.mc_batch_size`` rows at a time; identical prefixes are sampled once under
        ``credit.dedupe_prefixes``).
        Writes ``batch.extras["token_texts"]``, ``["mc_values"]`` (``B`` lists, one ``V`` per
        boundary) and the phase's counts into ``batch.rollout_metrics``; nothing for other
        estimators."""
        if self.estimator.mc_boundaries is None:
            return
        runtime = self.runtime
        credit_batch = scores.credit_batch(batch)
        found = monte_carlo_extras(
            self.estimator, self.credit_config, credit_batch, sampler=runtime.sampler,
            tokenizer=self.tokenizer, task=self.task, problems=batch.problems,
            prompt_ids=batch.prompt_ids, response_ids=batch.response_ids,
            finished=batch.finished, rollout=self.config.rollout, stop_ids=runtime.stop_ids,
            pad_id=runtime.pad_id, seed=derive_seed(self.config.seed, 3, step))
        batch.extras = {**(batch.extras or {}), **found.extras}
        batch.rollout_metrics = {**(batch.rollout_metrics or {}),
                                 "mc/tokens": float(found.tokens),
                                 "mc/boundaries_per_response": found.boundaries_per_response}

    # ------------------------------------------------------------------ 3. credit
    def credit(self, batch: StepBatch, scores: Scores, step: int | None = None) -> torch.Tensor:
        """``[B, T]`` token-level advantages from the registered estimator. ``step`` (1-based)
        reaches estimators with a schedule as ``CreditBatch.step`` (RLSD's ``lam`` decay)."""
        return credit_function(self.estimator, self.credit_config, batch, step)(scores)

    def credit_for_update(self, batch: StepBatch, scores: Scores, step: int) -> Credit:
        """The credit as the update takes it: the advantages now, or, under
        :attr:`Fusion.INLINE`, the estimator as a function the update runs on each
        micro-batch once its signals are in."""
        compute = credit_function(self.estimator, self.credit_config, batch, step)
        if scores.fusion is Fusion.INLINE:
            return Credit(compute=compute)
        return Credit(advantages=compute(scores))

    # ------------------------------------------------------------------ 4. update
    def update(self, batch: StepBatch, scores: Scores, credit: Credit,
               step: int) -> UpdateResult:
        """``loss.epochs`` x ``loss.minibatches`` AdamW steps on ``batch``
        (:meth:`UpdateEngine.run`), inside the memory policy's update scope."""
        with self.memory.update() as forward_context:
            return self.engine.run(batch, scores, credit, step, forward_context=forward_context)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, Any]:
        """Held-out Mean@k / pass@k of the current policy (``eval.*`` settings)."""
        return run_evaluation(self.config, self.runtime)

    def _eval_record(self, step: int) -> dict[str, Any]:
        started, cpu_started = time.perf_counter(), time.process_time()
        result = self.evaluate()
        self.memory.after_phase("eval")
        k = self.config.eval.k
        if self.config.eval.records:
            from gear_rl.rundir import write_eval_records

            write_eval_records(self.run.path, step, result, k=k, seed=self.config.eval.seed)
        return {"step": step, f"eval/mean@{k}": result[f"mean@{k}"],
                f"eval/pass@{k}": result[f"pass@{k}"],
                "eval/response_len": result["response_len"],
                "eval/truncated": result["truncated"],
                "time/eval": time.perf_counter() - started,
                "time/eval_cpu": time.process_time() - cpu_started,
                **{f"eval/{key}": value for key, value in result.items()
                   if key.startswith(("agent/", "env/"))}}

    # ------------------------------------------------------------------ the loop
    def samples(self, output: StepOutput, step: int) -> list[dict[str, Any]]:
        """``samples.jsonl`` records of one step (see :func:`records.sample_records`)."""
        return sample_records(output.batch, output.scores, output.advantages, step,
                              estimator=self.estimator, credit_config=self.credit_config,
                              tokenizer=self.tokenizer, task=self.task,
                              count=self.config.log.samples_per_step)

    def train(self) -> dict[str, Any]:
        """Run (or continue) the configured number of steps; returns the end summary. The
        sandbox and the trackers are closed at the end, also when a step fails (or the run is
        interrupted): what was logged is flushed, and W&B marks the run failed."""
        failed = True
        try:
            summary = self._train()
            failed = False
            return summary
        finally:
            self.close(failed=failed)

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
            record, output = self.step(step)
            last = step == config.steps
            if last or (config.eval.every and step % config.eval.every == 0):
                record.update({key: value for key, value in self._eval_record(step).items()
                               if key != "step"})
            self._log(record)
            for sample in self.samples(output, step):
                self.run.append_sample(sample)
            if last or (config.log.checkpoint_every and step % config.log.checkpoint_every == 0):
                save_checkpoint(self.run, step, self.model, self.optimizer,
                                keep=config.log.keep_checkpoints,
                                config=config_to_dict(config))
            if progress is not None:
                progress.set_postfix(_progress_postfix(record, k))
                progress.update(1)
        if progress is not None:
            progress.close()
        summary = summarize(self.history, k=k, run_dir=str(self.run.path),
                            estimator=config.estimator, model=config.model, task=self.task.name,
                            seconds=time.perf_counter() - started,
                            trackers=[tracker.name for tracker in self.trackers],
                            matmul_peak=(None if self.matmul_peak is None else
                                         (self.matmul_peak, str(self.peak_dtype)
                                          .removeprefix("torch."))))
        self.run.write_summary(summary)
        return summary

    def _log(self, record: dict[str, Any]) -> None:
        self.run.append_metrics(record)
        self.history.append(record)
        metrics = tracker_metrics(record)
        for tracker in self.trackers:
            tracker.log(metrics, record["step"])


def _progress_postfix(record: dict[str, Any], k: int) -> dict[str, str]:
    postfix = {"reward": f"{record['reward_mean']:.3f}", "loss": f"{record['loss']:+.4f}"}
    if f"eval/mean@{k}" in record:
        postfix[f"eval@{k}"] = f"{record[f'eval/mean@{k}']:.3f}"
    for name, label in (("env/success_rate", "solved"), ("agent/tool_call_rate", "tools")):
        if name in record:
            postfix[label] = f"{record[name]:.2f}"
    return postfix


def train(config: TrainConfig, **kwargs: Any) -> dict[str, Any]:
    """Build a :class:`Trainer` for ``config`` and run it; returns the end summary."""
    return Trainer(config, **kwargs).train()

