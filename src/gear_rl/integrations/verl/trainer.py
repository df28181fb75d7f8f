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

``gear`` is verl's ``sync`` loop, ``gear_colocate_async`` its ``colocate_async`` loop. verl's base
class compares ``trainer_mode`` with the literal ``"sync"`` in several places (which replay buffer,
checkpointing, refills), so these classes report their base loop's name as ``trainer_mode``; the
name they were selected by is ``gear_trainer_mode``. ``separate_async`` is not offered: it swaps
the actor's weights around the old-log-prob pass, and the teacher pass would have to run inside
that window.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSync, register_trainer
from verl.utils.debug import marked_timer
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.utils.tokenizer.chat_template import apply_chat_template
from verl.utils.tokenizer.tokenizer import normalize_token_ids
from verl.workers.utils.padding import response_from_nested

from gear_rl.integrations.teacher_inputs import (
    APPENDED,
    NO_REFERENCE,
    RERENDERED,
    SPLICED_HEAD,
    SPLICED_TAIL,
    build_teacher_rows,
    lookup_reference,
)
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

logger = logging.getLogger(__name__)

TEACHER_FIELD = "gear_teacher_log_probs"
TEACHER_PARTITION_SUFFIX = "__gear_teacher"
TEACHER_KEY_SUFFIX = "__gear_teacher"


class GEARTrainerMixin:
    """The GEAR additions to a verl v1 ``PPOTrainer`` (put it first in the bases)."""

    base_trainer_mode: ClassVar[str] = "sync"
    gear_trainer_mode: str
    gear_settings: VerlGEARSettings | None
    # set by verl's PPOTrainer, the class this mixin is combined with
    config: Any
    tokenizer: Any
    actor_rollout_wg: Any

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
        if settings is None or not settings.estimator.needs:
            batch = super()._compute_advantage(batch, metrics)  # type: ignore[misc]
        else:
            if settings.needs_teacher:
                with marked_timer("gear_teacher", getattr(self, "timing_raw", {}),
                                  color="purple"):
                    self._compute_gear_teacher_log_prob(batch, metrics)
            signals = self._fetch_gear_signals(batch)
            with provide_signals(signals):
                batch = super()._compute_advantage(batch, metrics)  # type: ignore[misc]
            metrics.update(signals.metrics)
        if settings is not None and settings.dump_dir is not None:
            self._dump_gear_step(batch, signals, settings.dump_dir)
        return batch

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
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=fields)
        # TensorDict refuses `in`; its keys() view does not.
        missing = [f for f in fields if f not in data.keys()]  # noqa: SIM118
        if missing:
            raise ValueError(
                f"GEAR needs {missing} in the batch; verl's old-log-prob pass stores 'entropy' and "
                "'old_log_probs' (not in rollout_correction bypass mode)"
            )
        padded = data.to_padded_tensor()
        return signals_from_logprobs(
            padded["response_mask"], entropy=padded["entropy"].float(),
            student_logprobs=padded["old_log_probs"].float(),
            teacher_logprobs=padded[TEACHER_FIELD].float() if settings.needs_teacher else None,
            divergence=settings.divergence,
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
            skip=[bool(tag.get("is_padding", False)) for tag in batch.tags],
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
        return normalize_token_ids(apply_chat_template(
            self.tokenizer, messages, tokenize=True, add_generation_prompt=True, **dict(kwargs)))

    def _gear_encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def gear_settings_for(config: Any) -> VerlGEARSettings | None:
    """``algorithm.gear`` parsed for ``algorithm.adv_estimator``, checked against the rest of the
    config before any worker starts; ``None`` (with a warning) when the estimator is not
    gear-rl's, in which case the trainer runs exactly like its base loop.
    ``algorithm.gear.plugins`` is loaded first, so a plugin's estimator counts as gear-rl's."""
    algorithm = config.algorithm
    load_algorithm_plugins(algorithm)
    estimator = str(getattr(algorithm.adv_estimator, "value", algorithm.adv_estimator))
    if gear_rl_name(estimator) is None:
        logger.warning("trainer.v1.trainer_mode=gear with algorithm.adv_estimator=%s (not a "
                       "gear-rl estimator): running as verl's own loop", estimator)
        return None
    settings = settings_from_algorithm(algorithm)
    if settings.estimator.needs:
        correction = algorithm.get("rollout_correction", None)
        if correction is not None and correction.get("bypass_mode", False):
            raise ValueError(
                f"algorithm.adv_estimator={estimator} needs the student's entropy and log-probs, "
                "which verl's old-log-prob pass skips in algorithm.rollout_correction.bypass_mode"
            )
    return settings


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

