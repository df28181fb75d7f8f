"""GEAR trainer modes for verl's v1 PPO trainer: ``trainer.v1.trainer_mode=gear``.

GEAR: "Granularity-adaptivE Advantage Reweighting", arXiv 2605.11853.

verl 0.9.1's v1 trainer (``verl/trainer/ppo/v1/trainer_base.py``) already computes the student's
per-token entropy in its old-log-prob pass and stores it in TransferQueue next to
``old_log_probs``, but its advantage step fetches neither, and a registered estimator only ever
sees rewards, the response mask, the algorithm config and the uids. These trainers add two
things, and nothing else changes:

1. **Teacher pass** (estimators that read the teacher): one extra forward of the actor over
   "hinted prompt + the same response" (``gear_rl.integrations.teacher_inputs``), through the
   actor's own ``compute_log_prob`` at the rollout temperature, so student and teacher log-probs
   come from the same engine and weights. The response log-probs are cut out with verl's
   ``response_from_nested`` and stored as ``gear_teacher_log_probs``.
2. **Signals for the estimator**: ``entropy``, ``old_log_probs`` and the teacher log-probs are
   fetched, the divergence computed (``k3`` / ``k1``), and verl's own ``_compute_advantage`` runs
   inside :func:`~gear_rl.integrations.verl.estimators.provide_signals`, where the registered
   gear-rl estimator reads them. KL-in-reward, rollout correction and the write-back stay verl's.

3. **Run log** (``algorithm.gear.log_samples_per_step``, default 4; 0 turns it off): a
   gear-rl run directory (``algorithm.gear.run_log_dir``, default ``trainer.default_local_dir``)
   that ``gear-rl report`` and ``gear-rl compare`` read like a ``gear-rl train`` run
   (:class:`gear_rl.runlog.EngineRunLog`): ``config.yaml`` (estimator, credit, seed, model,
   budget; verl's whole config under ``verl``), ``run.json`` with ``engine: verl``, per step the
   ``log_samples_per_step`` trajectories (best and worst of mixed groups first) with their tokens,
   policy mask, entropy, divergence, log-probs, segment onsets, weights and the advantages verl
   wrote back, through the trainer's own record builder (:func:`gear_rl.runlog.sample_records`),
   and one ``metrics.jsonl`` line with :func:`~gear_rl.runlog.rollout_metrics`, the credit
   diagnostics under the trainer's names, ``time/step`` and every number verl logs that step;
   ``summary.json`` after the last step. A resumed job drops the records after its checkpoint.
   A new run's validation before training (``trainer.val_before_train``) is the line of step 0,
   with ``eval/mean@N`` where one data source was validated. Every validation also writes its
   per-problem records (``eval_records/step-NNNNNN.json``, :mod:`gear_rl.train.evaluate`'s
   format: each held-out row's id and the rewards of its ``val_kwargs.n`` samples), which a
   ``gear-rl study`` of verl cells pairs problem by problem; ``run.json`` records the machine
   (processor or GPU, and the actor's and rollout's precision).

``gear`` is verl's ``sync`` loop, ``gear_colocate_async`` its ``colocate_async`` loop. verl's base
class compares ``trainer_mode`` with the literal ``"sync"`` in several places (which replay buffer,
checkpointing, refills), so these classes report their base loop's name as ``trainer_mode``; the
name they were selected by is ``gear_trainer_mode``. ``separate_async`` is not offered: it swaps
the actor's weights around the old-log-prob pass, and the teacher pass would have to run inside
that window.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import uuid
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import transfer_queue as tq
from omegaconf import DictConfig, ListConfig, OmegaConf
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSync, register_trainer
from verl.utils.debug import marked_timer
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.utils.padding import response_from_nested

from gear_rl.credit import CreditBatch
from gear_rl.integrations.teacher_inputs import (
    APPENDED,
    NO_REFERENCE,
    RERENDERED,
    SPLICED_HEAD,
    SPLICED_TAIL,
    build_teacher_rows,
    lookup_reference,
)
from gear_rl.integrations.verl.agent_loop import AGENT_LOOP_NAME, render_chat, step_extras
from gear_rl.integrations.verl.estimators import (
    METRIC_PREFIX,
    VerlGEARSettings,
    VerlSignals,
    gear_rl_name,
    load_algorithm_plugins,
    provide_signals,
    settings_from_algorithm,
    signals_from_logprobs,
)
from gear_rl.rundir import atomic_write_bytes
from gear_rl.runlog import (
    EngineRunLog,
    engine_metrics,
    rollout_metrics,
    sample_records,
    verl_held_out,
)

logger = logging.getLogger(__name__)

TEACHER_FIELD = "gear_teacher_log_probs"
TEACHER_PARTITION_SUFFIX = "__gear_teacher"
TEACHER_KEY_SUFFIX = "__gear_teacher"


class GEARTrainerMixin:
    """The GEAR additions to a verl v1 ``PPOTrainer`` (put it first in the bases)."""

    base_trainer_mode: ClassVar[str] = "sync"
    gear_trainer_mode: str
    gear_settings: VerlGEARSettings | None
    # the run log (open from the first logged step to the last) and the step's records, kept
    # from the advantage step until verl's metrics of the step are complete
    gear_run_log: EngineRunLog | None = None
    _gear_pending: tuple[dict[str, float], list[dict[str, Any]]] | None = None
    # the last validation's (sample prompt uids, scores), for its eval records
    _gear_val_samples: tuple[list[str], list[float]] | None = None
    # set by verl's PPOTrainer, the class this mixin is combined with
    config: Any
    tokenizer: Any
    actor_rollout_wg: Any
    agent_loop_manager: Any  # set by verl's fit(): its llm_client reaches the rollout servers
    val_dataloader: Any
    global_steps: int
    total_training_steps: int

    # verl's PPOTrainer.__init__ assigns config.trainer.v1.trainer_mode here ("gear"); the base
    # class's logic keys on its own loop's name, so that is what it reads back.
    @property
    def trainer_mode(self) -> str:
        return self.base_trainer_mode

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.gear_trainer_mode = value

    def __init__(self, config: DictConfig) -> None:
        self.gear_settings = gear_settings_for(config)
        super().__init__(config)  # type: ignore[call-arg]

    # ------------------------------------------------------------------ advantage step
    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        settings = self.gear_settings
        signals = None
        rows = batch  # the step's rows (verl hands back the meta of its write-back)
        if settings is None or not settings.needs_signals:
            batch = super()._compute_advantage(batch, metrics)  # type: ignore[misc]
        else:
            if settings.needs_teacher:
                with marked_timer("gear_teacher", getattr(self, "timing_raw", {}),
                                  color="purple"):
                    self._compute_gear_teacher_log_prob(batch, metrics)
            signals = self._fetch_gear_signals(batch)
            if settings.estimator.mc_boundaries is not None:
                with marked_timer("gear_values", getattr(self, "timing_raw", {}),
                                  color="cyan"):
                    signals.extras.update(self._gear_values_phase(batch, signals, metrics))
            with provide_signals(signals):
                batch = super()._compute_advantage(batch, metrics)  # type: ignore[misc]
            metrics.update(signals.metrics)
        if settings is not None and settings.dump_dir is not None:
            self._dump_gear_step(batch, signals, settings.dump_dir)
        if settings is not None and settings.log_samples_per_step > 0:
            self._gear_pending = self._gear_step_records(rows, signals, settings)
        return batch

    # ------------------------------------------------------------------ values phase
    def on_sample_end(self) -> None:
        """verl's sync loop puts the rollout servers to sleep here, right after sampling; a
        Monte-Carlo estimator's values phase needs them awake with the step's weights, so
        for those the sleep waits until the values are estimated (:meth:`_gear_values_phase`).
        On GPUs the servers then hold their memory through the old-log-prob pass."""
        settings = self.gear_settings
        if settings is not None and settings.estimator.mc_boundaries is not None:
            self._gear_sleep_pending = True
            return
        super().on_sample_end()  # type: ignore[misc]

    def _gear_values_phase(self, batch: KVBatchMeta, signals: VerlSignals,
                           metrics: dict) -> dict[str, Any]:
        """``extras`` of a Monte-Carlo estimator (``token_texts``, ``mc_values``): ``V`` at the
        boundaries it names, from continuations by the job's rollout servers scored by the
        job's reward function (:mod:`gear_rl.integrations.verl.values`); then the rollout
        servers' deferred sleep."""
        from gear_rl.integrations.verl.values import estimate_values, job_scorer

        settings = self.gear_settings
        assert settings is not None
        try:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=["prompts", "responses", "rm_scores", "uid",
                                                  "data_source", "reward_model",
                                                  "extra_info"])
            prompts, responses = _id_rows(data["prompts"]), _id_rows(data["responses"])
            padding = _padding_rows(batch)
            decode = self.tokenizer.decode
            texts = [[decode([t], skip_special_tokens=True) for t in row] for row in responses]
            uids = [str(u) for u in _prompt_rows(data["uid"])]
            padded = data.select("rm_scores").to_padded_tensor()
            credit = CreditBatch(rewards=padded["rm_scores"].float().sum(-1).cpu(),
                                 group_ids=uids, mask=signals.response_mask.float().cpu(),
                                 student_logprobs=signals.student_logprobs,
                                 extras={"token_texts": texts})
            assert settings.estimator.mc_boundaries is not None
            boundaries = [[] if pad else list(b) for pad, b in zip(
                padding, settings.estimator.mc_boundaries(credit, settings.config),
                strict=True)]
            score = job_scorer(_reward_function(self.config),
                               lambda ids: decode(ids, skip_special_tokens=True),
                               _prompt_rows(data["data_source"]),
                               _prompt_rows(data["reward_model"]),
                               _prompt_rows(data["extra_info"]),
                               f"algorithm.adv_estimator={verl_adv_estimator(self.config)}")
            rollout = self.config.actor_rollout_ref.rollout
            sampling = {"temperature": float(rollout.temperature),
                        "top_p": float(rollout.get("top_p", 1.0)),
                        "top_k": int(rollout.get("top_k", -1))}
            client = self.agent_loop_manager.llm_client

            async def generate(prefix: list[int], max_tokens: int) -> list[int]:
                out = await client.generate(uuid.uuid4().hex, prompt_ids=prefix,
                                            sampling_params={**sampling,
                                                             "max_tokens": max_tokens})
                return list(out.token_ids)

            result = estimate_values(
                prompts, responses, boundaries, samples=settings.config.mc_samples,
                max_response_length=int(rollout.response_length), generate=generate,
                score=score, dedupe=settings.config.dedupe_prefixes)
        finally:
            if getattr(self, "_gear_sleep_pending", False):
                self._gear_sleep_pending = False
                super().on_sample_end()  # type: ignore[misc]
        live = max(1, sum(not pad for pad in padding))
        metrics[f"{METRIC_PREFIX}mc_continuation_tokens"] = float(result.tokens)
        metrics[f"{METRIC_PREFIX}mc_prefixes"] = float(len(result.requests))
        metrics[f"{METRIC_PREFIX}mc_boundaries_per_response"] = (
            sum(map(len, boundaries)) / live)
        self._gear_mc = result
        return {"token_texts": texts, "mc_values": result.values}

    # ------------------------------------------------------------------ run log
    def _validate(self) -> dict[str, float]:
        """verl's validation, and its per-problem records in the run log's folder; the one
        before a new run's first step (``val_before_train``, step 0) opens the run log with its
        line of step 0 at once (so a job stopped before step 1's line keeps it; a validation
        during training reaches the log through the step's metrics)."""
        settings = self.gear_settings
        if settings is None or settings.log_samples_per_step <= 0:
            return super()._validate()  # type: ignore[misc]
        batches: list[dict[str, Any]] = []
        loader = self.val_dataloader
        self.val_dataloader = _Seen(loader, batches)
        self._gear_val_samples = None
        try:
            result = super()._validate()  # type: ignore[misc]
        finally:
            self.val_dataloader = loader
        if self._gear_val_samples is not None:
            self._gear_write_eval_records(batches, *self._gear_val_samples)
        if self.global_steps == 0 and result:
            self._gear_open_run_log(settings, first_step=1).log_step(
                0, {**engine_metrics(result), **verl_held_out(result)})
        return result

    def _gear_open_run_log(self, settings: VerlGEARSettings, first_step: int) -> EngineRunLog:
        """The run log, opened now if it is not (a new run at ``first_step`` 1, a resumed one
        at the step it continues with)."""
        if self.gear_run_log is None:
            self.gear_run_log = EngineRunLog(
                Path(settings.run_log_dir or self.config.trainer.default_local_dir).resolve(),
                engine="verl", config=self._gear_run_config(settings), first_step=first_step,
                info={**self._gear_machine(), "run_id": uuid.uuid4().hex,
                      "verl": _version("verl"), "torch": torch.__version__,
                      "trainer_mode": self.gear_trainer_mode})
        return self.gear_run_log

    def _val_metrics_update(self, data_sources: Any, sample_uids: Any,
                            reward_extra_infos_dict: dict[str, list], sample_turns: Any,
                            expected_acc_counts: Any = None) -> dict[str, float]:
        """verl's validation metrics; keeps each sample's prompt uid and score (``acc`` where
        the reward function gives one, as verl's core metric does, else ``reward``) for the
        records."""
        scores = reward_extra_infos_dict.get("acc") or reward_extra_infos_dict["reward"]
        self._gear_val_samples = ([str(u) for u in sample_uids],
                                  [float(bool(s)) if isinstance(s, bool) else float(s)
                                   for s in scores])
        return super()._val_metrics_update(  # type: ignore[misc]
            data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
            expected_acc_counts=expected_acc_counts)

    def _gear_write_eval_records(self, batches: list[dict[str, Any]], uids: list[str],
                                 scores: list[float]) -> None:
        """``eval_records/step-NNNNNN.json``: per held-out row, in the data set's order, its
        id (``extra_info.id`` / ``source`` / ``index``) and the scores of its samples."""
        from gear_rl.rundir import write_eval_records

        settings = self.gear_settings
        assert settings is not None
        rewards: dict[str, list[float]] = {}
        for uid, score in zip(uids, scores, strict=True):
            rewards.setdefault(uid, []).append(score)
        records = []
        for batch in batches:
            extras = batch.get("extra_info")
            for i, uid in enumerate(batch["uid"]):
                extra = extras[i] if extras is not None and isinstance(extras[i], dict) else {}
                key = next((extra[k] for k in ("id", "source", "index") if k in extra), None)
                records.append({"id": str(key if key is not None else batch["index"][i]),
                                "rewards": rewards.get(str(uid), [])})
        rollout = self.config.actor_rollout_ref.rollout
        write_eval_records(
            Path(settings.run_log_dir or self.config.trainer.default_local_dir).resolve(),
            int(self.global_steps), {"records": records}, k=int(rollout.val_kwargs.n),
            seed=int(rollout.get("seed", 0) or 0))

    def _compute_metrics(self, batch: KVBatchMeta, metrics: dict, timing_raw: dict,
                         global_steps: int, epoch: int) -> Any:
        """verl's step metrics, then the step's run-log line and samples (once the metrics
        are complete: timings, throughput, validation)."""
        result = super()._compute_metrics(  # type: ignore[misc]
            batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        pending, self._gear_pending = self._gear_pending, None
        settings = self.gear_settings
        if pending is None or settings is None:
            return result
        own, samples = pending
        run_log = self._gear_open_run_log(settings, first_step=global_steps)
        values = {**own, **engine_metrics(metrics), **verl_held_out(metrics)}
        if "step" in timing_raw:
            values["time/step"] = float(timing_raw["step"])
        run_log.log_step(global_steps, values, samples)
        if global_steps >= self.total_training_steps:
            run_log.finish({"estimator": settings.estimator.name, "steps": global_steps})
            self.gear_run_log = None
        return result

    def _gear_step_records(self, batch: KVBatchMeta, signals: VerlSignals | None,
                           settings: VerlGEARSettings
                           ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The step's rollout metrics and ``samples.jsonl`` records (padding rows left out):
        rewards are the rows' scores (``rm_scores``), the credit is the ``[B, T]`` advantages
        verl wrote back, the outcome ``A`` the estimator's on the rewards it was given."""
        kl_in_reward = bool(self.config.algorithm.get("use_kl_in_reward", False))
        fields = ["uid", "prompts", "responses", "response_mask", "rm_scores", "advantages"]
        if kl_in_reward:
            fields.append("token_level_rewards")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=fields)
        prompts, responses = _id_rows(data["prompts"]), _id_rows(data["responses"])
        padded = data.to_padded_tensor()
        keep = [i for i, pad in enumerate(_padding_rows(batch)) if not pad]
        rows = torch.tensor(keep, dtype=torch.long)
        scores = padded["rm_scores"].float().sum(-1).cpu()
        credited = (padded["token_level_rewards"].float().sum(-1).cpu() if kl_in_reward
                    else scores)
        uids = [str(u) for u in padded["uid"].tolist()]
        first: dict[str, int] = {}
        groups = [first.setdefault(u, len(first)) for u in uids]
        signal_fields = {} if signals is None else {
            name: getattr(signals, name).float().cpu()[rows]
            for name in ("entropy", "divergence", "student_logprobs", "teacher_logprobs")
            if getattr(signals, name) is not None}
        extras = {} if signals is None else {
            key: [value[i] for i in keep] for key, value in signals.extras.items()}
        credit_batch = CreditBatch(rewards=credited[rows], group_ids=[groups[i] for i in keep],
                                   mask=padded["response_mask"].float().cpu()[rows],
                                   extras=extras, **signal_fields)
        rewards = scores[rows]
        kept_responses = [responses[i] for i in keep]
        root = settings.reference_key.split(".")[0]
        try:
            references = _references(
                tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                select_fields=[root]),
                root, settings.reference_key, len(batch))
        except (KeyError, ValueError):  # a data set without references: the records show none
            references = [None] * len(batch)
        decode = self.tokenizer.decode

        def row_fields(row: int) -> dict[str, Any]:
            i = keep[row]
            return {"problem_id": uids[i], "prompt": decode(prompts[i]),
                    "answer": references[i],
                    "response": decode(responses[i], skip_special_tokens=True)}

        step = int(getattr(self, "global_steps", 0))
        records = sample_records(
            step, credit_batch, padded["advantages"].float().cpu()[rows], kept_responses,
            estimator=settings.estimator, credit_config=settings.config, decode=decode,
            count=settings.log_samples_per_step, rewards=rewards, row_fields=row_fields)
        return (rollout_metrics(rewards, credit_batch.group_ids, credit_batch.mask,
                                kept_responses, credit_batch.entropy), records)

    def _gear_machine(self) -> dict[str, Any]:
        """Where the run trains, in the facts :func:`gear_rl.rundir.machine_label` reads:
        ``cpu`` the processor, or the GPU where the job has one; ``autocast_bf16`` whether the
        actor computes in bf16; ``sampler_dtype`` the rollout's dtype."""
        from gear_rl.rundir import cpu_model

        device = cpu_model()
        if torch.cuda.is_available():
            device = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
        actor = self.config.actor_rollout_ref.actor
        # FSDP's mixed precision computes in its param_dtype (the CPU mode's fp32 sets it)
        dtype = (OmegaConf.select(actor, "fsdp_config.mixed_precision.param_dtype")
                 or OmegaConf.select(actor, "fsdp_config.dtype") or "bfloat16")
        rollout = OmegaConf.select(self.config.actor_rollout_ref.rollout, "dtype") or "bfloat16"
        return {"cpu": device, "autocast_bf16": str(dtype) in ("bf16", "bfloat16"),
                "sampler_dtype": "torch.bfloat16" if str(rollout) in ("bf16", "bfloat16")
                else "torch.float32"}

    def _gear_run_config(self, settings: VerlGEARSettings) -> dict[str, Any]:
        """``config.yaml`` of the run log: the keys ``gear-rl report``/``compare`` read, in the
        trainer's names (``credit``: the estimator's settings that differ from its defaults),
        and verl's whole config under ``verl``."""
        config = self.config
        defaults = settings.estimator.make_config()
        credit = {f.name: getattr(settings.config, f.name)
                  for f in dataclasses.fields(settings.config)
                  if getattr(settings.config, f.name) != getattr(defaults, f.name)}
        try:
            whole = OmegaConf.to_container(config, resolve=True)
        except Exception:  # an interpolation that resolves only inside a worker
            whole = OmegaConf.to_container(config, resolve=False)
        rollout = config.actor_rollout_ref.rollout
        train_files = config.data.get("train_files")
        if isinstance(train_files, (DictConfig, ListConfig)):
            train_files = OmegaConf.to_container(train_files)
        return json.loads(json.dumps({
            "estimator": settings.estimator.name, "credit": credit,
            "seed": config.data.get("seed"), "model": str(config.actor_rollout_ref.model.path),
            "task": train_files, "steps": int(self.total_training_steps),
            "rollout": {"prompts_per_step": config.data.train_batch_size,
                        "samples_per_prompt": rollout.n,
                        "max_new_tokens": config.data.max_response_length,
                        "temperature": rollout.temperature},
            "eval_data": config.data.get("val_files"),
            "eval": {"k": rollout.val_kwargs.n, "temperature": rollout.val_kwargs.temperature,
                     "top_p": rollout.val_kwargs.top_p,
                     "max_new_tokens": config.data.max_response_length},
            "verl": whole}, default=str))

    def _dump_gear_step(self, batch: KVBatchMeta, signals: VerlSignals | None,
                        dump_dir: str) -> None:
        """``algorithm.gear.dump_dir``: what the advantage step read and the advantages verl
        wrote back for the actor's update, all ``[B, T]`` padded as verl pads them, to
        ``<dump_dir>/step-<N>.pt`` (written atomically)."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "response_mask", "rm_scores", "advantages"])
        padded = data.to_padded_tensor()
        record: dict[str, Any] = {
            "estimator": str(getattr(self.config.algorithm.adv_estimator, "value",
                                     self.config.algorithm.adv_estimator)),
            "uid": [str(u) for u in padded["uid"].tolist()],
            "response_mask": padded["response_mask"].cpu(),
            "token_level_scores": padded["rm_scores"].float().cpu(),
            "advantages": padded["advantages"].float().cpu(),
        }
        if signals is not None:
            for name in ("entropy", "student_logprobs", "teacher_logprobs", "divergence"):
                value = getattr(signals, name)
                if value is not None:
                    record[name] = value.cpu()
            # step-level estimators' step spans, rewards, states; Monte-Carlo estimators'
            # token texts, values and each distinct prefix's continuation rewards
            record.update(signals.extras)
            mc = getattr(self, "_gear_mc", None)
            if "mc_values" in signals.extras and mc is not None:
                record["mc_requests"] = [
                    {"prefix": list(r.prefix), "response_prefix": list(r.response_prefix),
                     "budget": r.budget, "rows": [list(x) for x in r.rows]}
                    for r in mc.requests]
                record["mc_rewards"] = mc.rewards
        step = int(getattr(self, "global_steps", 0))
        buffer = io.BytesIO()
        torch.save(record, buffer)
        atomic_write_bytes(Path(dump_dir) / f"step-{step:04d}.pt", buffer.getvalue())

    def _fetch_gear_signals(self, batch: KVBatchMeta) -> VerlSignals:
        """Entropy, old log-probs and (if run) teacher log-probs of ``batch``, padded ``[B, T]``
        exactly as verl pads them for its advantage step."""
        settings = self.gear_settings
        assert settings is not None
        fields = ["response_mask", "entropy", "old_log_probs"]
        if settings.needs_teacher:
            fields.append(TEACHER_FIELD)
        if settings.estimator.step_level:
            fields.append("extra_fields")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=fields)
        # TensorDict refuses `in`; its keys() view does not.
        missing = [f for f in fields if f not in data.keys()]  # noqa: SIM118
        if missing:
            raise ValueError(
                f"GEAR needs {missing} in the batch; verl's old-log-prob pass stores 'entropy' and "
                "'old_log_probs' (not in rollout_correction bypass mode)"
            )
        extra_fields = data.pop("extra_fields").tolist() if settings.estimator.step_level else None
        padded = data.to_padded_tensor()
        extras = None
        if extra_fields is not None:
            extras = step_extras(extra_fields, padded["response_mask"],
                                 _padding_rows(batch))
            if settings.estimator.requires_states(settings.config) and "state_keys" not in extras:
                raise ValueError(
                    f"algorithm.adv_estimator={verl_adv_estimator(self.config)}: "
                    f"{settings.estimator.name} groups steps by environment state, and this "
                    "batch's trajectories have none (they come from an agent loop other than "
                    f"gear-rl's {AGENT_LOOP_NAME}, e.g. verl's tool loop): use an environment "
                    "setting, or a step-level estimator that needs no states (turn_level, gagpo)")
        return signals_from_logprobs(
            padded["response_mask"], entropy=padded["entropy"].float(),
            student_logprobs=padded["old_log_probs"].float(),
            teacher_logprobs=padded[TEACHER_FIELD].float() if settings.needs_teacher else None,
            divergence=settings.divergence, extras=extras,
        )

    # ------------------------------------------------------------------ teacher pass
    def _compute_gear_teacher_log_prob(self, batch: KVBatchMeta, metrics: dict) -> None:
        """Score every response after its hinted prompt with the actor; store the response
        log-probs as ``gear_teacher_log_probs`` next to ``old_log_probs``."""
        settings = self.gear_settings
        assert settings is not None
        if getattr(self, "processor", None) is not None:
            raise NotImplementedError(
                "GEAR's verl teacher pass is text-only: a multimodal processor would need the "
                "images re-aligned with the hinted prompt, which is not implemented"
            )
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["prompts", "responses", "response_mask",
                                              "raw_prompt"])
        root = settings.reference_key.split(".")[0]
        references = _references(
            tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                            select_fields=[root]),
            root, settings.reference_key, len(batch))
        rows = build_teacher_rows(
            _id_rows(data["prompts"]), _id_rows(data["responses"]),
            _id_rows(data["response_mask"]), _prompt_rows(data["raw_prompt"]), references,
            self._gear_render, self._gear_encode, kind=settings.reference_kind,
            config=settings.teacher_prompt,
            skip=_padding_rows(batch),
        )
        teacher_keys = [f"{key}{TEACHER_KEY_SUFFIX}" for key in batch.keys]
        partition = f"{batch.partition_id}{TEACHER_PARTITION_SUFFIX}"
        tags = [{"prompt_len": int(r["prompts"].numel()),
                 "response_len": int(r["responses"].numel()),
                 "seq_len": int(r["input_ids"].numel())} for r in rows.fields]
        tq.kv_batch_put(keys=teacher_keys, partition_id=partition,
                        fields=list_of_dict_to_tensordict(rows.fields), tags=tags)
        try:
            extra_info = dict(batch.extra_info or {})
            extra_info.update(calculate_entropy=False, compute_loss=False,
                              temperature=self.config.actor_rollout_ref.rollout.temperature)
            teacher_batch = KVBatchMeta(partition_id=partition, keys=teacher_keys, tags=tags,
                                        extra_info=extra_info)
            output = self.actor_rollout_wg.compute_log_prob(teacher_batch)
            if len(output) != len(teacher_batch):
                raise RuntimeError(
                    f"the teacher pass returned {len(output)} rows for {len(teacher_batch)}"
                )
            result = tq.kv_batch_get(keys=teacher_keys, partition_id=partition,
                                     select_fields=["log_probs", "response_mask"])
            teacher_log_probs = response_from_nested(result["log_probs"], result["response_mask"])
        finally:
            tq.kv_clear(keys=teacher_keys, partition_id=partition)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict({TEACHER_FIELD: teacher_log_probs},
                                          batch_size=len(batch)))
        counts = rows.counts()
        for how in (SPLICED_HEAD, SPLICED_TAIL, RERENDERED, APPENDED, NO_REFERENCE):
            metrics[f"{METRIC_PREFIX}teacher_prompt_{how}_frac"] = (
                counts.get(how, 0) / max(1, len(batch)))

    def _gear_render(self, messages: list[dict[str, Any]]) -> list[int]:
        """Chat messages -> prompt ids, the way verl's agent loop renders the student's prompt
        (verl's ``apply_chat_template`` with ``data.apply_chat_template_kwargs``)."""
        kwargs = self.config.data.get("apply_chat_template_kwargs", None) or {}
        if isinstance(kwargs, DictConfig):
            kwargs = cast("dict[str, Any]", OmegaConf.to_container(kwargs, resolve=True))
        return render_chat(self.tokenizer, messages, kwargs)

    def _gear_encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def gear_settings_for(config: Any) -> VerlGEARSettings | None:
    """``algorithm.gear`` parsed for ``algorithm.adv_estimator``, checked against the rest of the
    config before any worker starts; ``None`` (with a warning) when the estimator is not
    gear-rl's, in which case the trainer runs exactly like its base loop.
    ``algorithm.gear.plugins`` is loaded first, so a plugin's estimator counts as gear-rl's."""
    algorithm = config.algorithm
    load_algorithm_plugins(algorithm)
    estimator = verl_adv_estimator(config)
    if gear_rl_name(estimator) is None:
        logger.warning("trainer.v1.trainer_mode=gear with algorithm.adv_estimator=%s (not a "
                       "gear-rl estimator): running as verl's own loop", estimator)
        return None
    settings = settings_from_algorithm(algorithm)
    loop = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.default_agent_loop")
    if settings.estimator.mc_boundaries is not None:
        mode = OmegaConf.select(config, "trainer.v1.trainer_mode")
        if loop not in (None, "single_turn_agent"):
            raise ValueError(
                f"algorithm.adv_estimator={estimator} continues single-turn responses "
                f"(Monte-Carlo values), and actor_rollout_ref.rollout.agent.default_agent_loop "
                f"is {loop}: a continuation would have to replay its tools or environment")
        if mode != "gear":
            raise ValueError(
                f"algorithm.adv_estimator={estimator} needs trainer.v1.trainer_mode=gear: its "
                "values phase continues the step's responses on the rollout servers that "
                f"sampled them, which {mode} keeps sampling the next batch with")
    if settings.estimator.step_level and loop in (None, "single_turn_agent"):
        raise ValueError(
            f"algorithm.adv_estimator={estimator} is step-level: it needs multi-turn "
            "trajectories, and actor_rollout_ref.rollout.agent.default_agent_loop is "
            f"{loop or 'single_turn_agent'} (one turn per trajectory): set it to "
            f"{AGENT_LOOP_NAME} for gear-rl's environments (SETTING=sokoban, keydoor, "
            "textarena:GAME) or tool_agent for verl's tool loop")
    if settings.estimator.needs:
        correction = algorithm.get("rollout_correction", None)
        if correction is not None and correction.get("bypass_mode", False):
            raise ValueError(
                f"algorithm.adv_estimator={estimator} needs the student's entropy and log-probs, "
                "which verl's old-log-prob pass skips in algorithm.rollout_correction.bypass_mode"
            )
    return settings


def _reward_function(config: Any) -> Any:
    """The job's reward function as verl's reward loop loads it (``reward.
    custom_reward_function``, its ``reward_kwargs`` bound), or verl's default scorer."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(config)
    if fn is None:
        from verl.utils.reward_score import default_compute_score

        fn = default_compute_score
    return fn


def verl_adv_estimator(config: Any) -> str:
    """``algorithm.adv_estimator`` as a string (verl may hold an ``AdvantageEstimator``)."""
    value = config.algorithm.adv_estimator
    return str(getattr(value, "value", value))


def _padding_rows(batch: KVBatchMeta) -> list[bool]:
    """Which of ``batch``'s rows are verl's padding rows (``is_padding`` in their tags)."""
    return [bool(tag.get("is_padding", False)) for tag in batch.tags]


class _Seen:
    """verl's validation data loader, keeping each batch it hands out: verl's ``_validate``
    fills in each batch's ``uid`` in place, which maps the scores back to the rows."""

    def __init__(self, loader: Any, seen: list[dict[str, Any]]) -> None:
        self.loader, self.seen = loader, seen

    def __iter__(self) -> Any:
        for batch in self.loader:
            self.seen.append(batch)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _id_rows(values: torch.Tensor) -> list[list[int]]:
    """A nested (or padded-free regular) ``[B, *]`` tensor -> ``B`` Python int lists."""
    return [row.tolist() for row in values.unbind(0)]


def _prompt_rows(values: Any) -> list[Any]:
    """``raw_prompt`` as TransferQueue returns it -> ``B`` message lists (or strings)."""
    rows = []
    for value in list(values):
        value = getattr(value, "data", value)
        if hasattr(value, "tolist") and not isinstance(value, str):
            value = value.tolist()
        rows.append(value)
    return rows


def _references(data: TensorDict, root: str, reference_key: str, batch: int) -> list[str | None]:
    if root not in data.keys():  # noqa: SIM118 - TensorDict refuses `in`
        raise ValueError(
            f"algorithm.gear.reference_key={reference_key!r}: the batch has no field {root!r} "
            "(verl keeps the dataset's non-tensor columns, e.g. reward_model, extra_info)"
        )
    values = _prompt_rows(data[root])
    if len(values) != batch:
        raise ValueError(f"field {root!r} has {len(values)} rows, the batch has {batch}")
    return [lookup_reference({root: value}, reference_key) for value in values]


@register_trainer("gear")
class GEARTrainerSync(GEARTrainerMixin, PPOTrainerSync):
    """verl's synchronous v1 loop with GEAR's teacher pass and signals (``trainer_mode=gear``)."""

    base_trainer_mode = "sync"


@register_trainer("gear_colocate_async")
class GEARTrainerColocateAsync(GEARTrainerMixin, PPOTrainerColocateAsync):
    """verl's colocated asynchronous v1 loop with GEAR (``trainer_mode=gear_colocate_async``)."""

    base_trainer_mode = "colocate_async"

