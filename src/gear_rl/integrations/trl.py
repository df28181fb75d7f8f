"""gear-rl's credit estimators inside TRL: ``CreditGRPOTrainer``, a ``trl.GRPOTrainer`` whose
advantages are a registered estimator's per-token ``[B, T]`` advantages (GEAR by default).

GEAR: "Granularity-adaptivE Advantage Reweighting", arXiv 2605.11853.

TRL 1.16's ``GRPOTrainer._generate_and_score_completions`` returns one advantage per completion
(``[B]``) and its ``_compute_loss`` unsqueezes advantages only when they are 1-D, so ``[B, T]``
advantages flow into every loss type unchanged. ``CreditGRPOTrainer`` overrides only the first:
after TRL has sampled, scored and group-normalised as configured, it

1. builds each completion's teacher prompt when the estimator reads teacher signals: the prompt
   ids TRL sampled with, with the example's reference (dataset column ``reference_column``)
   spliced in as the library's delimited hint (``gear_rl.integrations.teacher_inputs``,
   wording from ``gear_rl.signals.TeacherPromptConfig``: the same ids the built-in trainer
   builds);
2. runs the signals the estimator declares in ``needs`` on the policy model, without gradients
   and without materialising ``[B, T, V]``: the student and teacher pass
   (``gear_rl.signals.token_signals``, reverse KL ``full`` over the vocabulary by default,
   since TRL holds both distributions) when it needs teacher signals, the student pass alone
   (``response_logprobs``) when it needs only entropy or log-probs, nothing for GRPO/Dr.GRPO;
3. reshapes TRL's trajectory advantage into the estimator's token advantages over the policy
   mask ``completion_mask * tool_mask`` (tool output stays in the context, out of every
   statistic).

Which estimators: every registered one (``gear_rl.credit.get_estimator``, plugins included) that
is token-level (not ``step_level``: TRL passes no turn spans), puts the reward in the loss
(``uses_reward``; ``opsd`` has no advantage) and adds no self-distillation loss (TRL's loss has
no such term). :func:`trl_estimator_names` lists them.

Outcome advantage. TRL's ``A_i`` is kept with all its semantics (``scale_rewards``, its ``1e-4``
in the std, ``multi_objective_aggregation``, reward weights, zero for unscorable completions).
Registry estimators compute their own GRPO advantage from rewards, so the trainer gives them
TRL's ``A`` as the rewards of TRL's groups (``num_generations`` consecutive completions) and
keeps only the per-token weight they put on their own outcome advantage ``A_reg``
(``gear_rl.credit.diagnostics.reference_outcome``)::

    W_t    = estimator(batch, config)_t / A_reg      (token_weights)
    Ahat_t = W_t * A_i * mask_t

This is exact for every built-in estimator: each is ``W(sign(A), signals) * A`` with ``W`` not
depending on ``|A|`` (GEAR's weights read only the sign, the top-entropy mask and RLSD's ratio
likewise), and with TRL's default ``sum_then_normalize`` ``A`` is centred in each group, so the
group normalisation of ``A`` keeps every row's sign. So GEAR here is
``gear_advantages(A, divergence, entropy, mask, config)`` on TRL's ``A``, top-entropy
``top_entropy_advantages(A, ...)``, RLSD ``rlsd_advantages(A, ...)``, GRPO ``A`` on every token. A
plugin is held to the same contract (its credit is a token weight times its outcome advantage),
which is also what the ``weight_mean_*`` diagnostics assume.

Fallback: a row with ``A_i != 0`` whose ``A_reg`` is 0 or of the other sign has no registry weight
that fits TRL's advantage (``normalize_then_sum`` does not centre per group; a group split across
processes is seen in part). It keeps TRL's ``A_i`` on every policy token (``W = 1``, GRPO's
credit) rather than losing its learning signal to ``W = 0``, and ``gear/outcome_fallback_frac``
counts such rows.

Run log: with ``log_samples_per_step > 0`` (default 4) the trainer also writes a gear-rl run
directory (``run_log_dir``, default TRL's ``output_dir``; :class:`gear_rl.runlog.EngineRunLog`)
that ``gear-rl report`` and ``gear-rl compare`` read like a ``gear-rl train`` run: ``config.yaml``
(estimator, credit, seed, model, budget, and TRL's arguments under ``trl``), ``run.json`` with
``engine: trl``, ``samples.jsonl`` (``log_samples_per_step`` trajectories of each training
generation batch, best and worst of mixed groups first, through the trainer's own record builder
:func:`gear_rl.runlog.sample_records`: tokens, policy mask, entropy, divergence, log-probs,
segment onsets, weights ``W`` against TRL's ``A``, the final token advantage) and
``metrics.jsonl`` (per step: :func:`~gear_rl.runlog.rollout_metrics` and the credit
diagnostics under the trainer's names; at each TRL logging step TRL's own logs under
``trl/``, its ``step_time`` also as ``time/step``), and ``summary.json`` at the end. A step
is TRL's ``global_step`` being trained (1 first); a resumed run drops the records after its
checkpoint's step. Only the main process writes, from its own share of the batch.
``log_samples_per_step=0`` writes nothing.

Everything else (generation, rewards, loss, logging, vLLM, multi-process) is TRL's.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import uuid
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar, cast

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from gear_rl.credit import CreditBatch, Estimator, credit_diagnostics, get_estimator, load_plugins
from gear_rl.credit.diagnostics import reference_outcome, token_weights
from gear_rl.credit.registry import ESTIMATORS as REGISTRY
from gear_rl.credit.registry import estimator_names
from gear_rl.dataclass_config import field_docs
from gear_rl.integrations.teacher_inputs import (
    APPENDED,
    NO_REFERENCE,
    RERENDERED,
    SPLICED_HEAD,
    SPLICED_TAIL,
    lookup_reference,
    teacher_prompt_ids,
)
from gear_rl.runlog import (
    DEFAULT_LOG_SAMPLES,
    EngineRunLog,
    check_run_log_settings,
    engine_metrics,
    rollout_metrics,
    sample_records,
)
from gear_rl.safe_json import loads_bounded
from gear_rl.signals import DIVERGENCE_KINDS, TeacherPromptConfig, response_logprobs, token_signals
from gear_rl.signals import prompt_ids as render_prompt_ids
from gear_rl.signals.divergence import DivergenceKind
from gear_rl.signals.teacher import PLACEMENTS, REFERENCE_KINDS, Placement

# Config field -> TeacherPromptConfig field, for the hint wording overrides.
_TEMPLATE_FIELDS = {"teacher_answer_template": "answer_template",
                    "teacher_solution_template": "solution_template",
                    "teacher_tool_call_template": "tool_call_template"}
_HOWS = (SPLICED_HEAD, SPLICED_TAIL, RERENDERED, APPENDED, NO_REFERENCE)
_ConfigT = TypeVar("_ConfigT")


def _unsupported(estimator: Estimator) -> str | None:
    """Why TRL cannot run ``estimator``, or ``None`` when it can."""
    return estimator.engine_limit("TRL")


def trl_estimator_names() -> list[str]:
    """The registered estimators ``CreditGRPOTrainer`` can run (after any plugins loaded)."""
    return [n for n in estimator_names(step_level=False) if _unsupported(REGISTRY[n]) is None]


def trl_estimator(name: str) -> Estimator:
    """The registered estimator ``name`` if TRL can run it; otherwise one line naming the valid
    ones."""
    try:
        estimator = get_estimator(name)
    except ValueError:
        reason: str | None = (
            "not registered (an estimator from another module needs plugins=[<module>])")
    else:
        reason = _unsupported(estimator)
        if reason is None:
            return estimator
    raise ValueError(f"estimator={name!r} cannot run in TRL ({reason}); "
                     f"choose one of {trl_estimator_names()}")


def _help_from_docstring(cls: type[_ConfigT]) -> type[_ConfigT]:
    """Give each field ``cls`` declares itself the ``help`` that TRL's command line
    (``HfArgumentParser``) prints: its ``Attributes:`` entry, the field's one description."""
    docs = field_docs(cls)
    own = inspect.get_annotations(cls)
    for config_field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if config_field.name in own:
            config_field.metadata = MappingProxyType({**config_field.metadata,
                                                      "help": docs[config_field.name]})
    return cls


@_help_from_docstring
@dataclass
class CreditGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the credit estimator and how TRL feeds it.

    The estimator's own knobs live in its config dataclass (``gear_rl.credit``) and are set
    through ``credit``; the fields here are the integration's.

    Attributes:
        estimator: a registered token-level estimator (:func:`trl_estimator_names`).
        credit: the estimator's config fields, e.g. ``{"lambda_kl": 0.1, "alpha": 1.0}`` for
            GEAR (``None``: its defaults); a JSON string is accepted from the command line.
        plugins: modules imported first; they register more estimators.
        reference_column: dataset column with each example's reference (final answer, solution
            or gold tool call), or a dotted path into a nested column (``reward_model.ground_truth``
            in verl-style data); non-string values are JSON-encoded. Rows without one keep the
            student prompt as teacher (zero divergence).
        reference_kind: ``answer``, ``solution`` or ``tool_call`` (which hint wording).
        teacher_placement: where the hint goes: ``user_end``, ``new_user_turn`` or ``system``.
        teacher_answer_template: hint for an answer reference, with ``{reference}``; ``None``:
            the library's (one hint for every engine).
        teacher_solution_template: hint for a solution reference, with ``{reference}``;
            ``None``: the library's.
        teacher_tool_call_template: hint for a gold tool call, with ``{reference}``; ``None``:
            the library's.
        divergence: the per-token divergence: ``full`` (exact reverse KL over the vocabulary;
            TRL holds both distributions), ``topk``, ``k1`` or ``k3``.
        divergence_topk: support size for ``divergence="topk"``.
        signal_chunk_size: response positions per LM-head chunk in the signal pass (``None``:
            automatic).
        log_samples_per_step: trajectories per training step kept in the gear-rl run log's
            ``samples.jsonl`` (``gear-rl report``'s token-credit viewer); 0 writes no run log at
            all (no ``config.yaml``, ``metrics.jsonl`` or ``samples.jsonl``).
        run_log_dir: the gear-rl run directory (``gear-rl report``/``compare`` read it);
            ``None``: ``output_dir``.
    """

    estimator: str = "gear"
    credit: dict[str, Any] | str | None = None
    plugins: list[str] = field(default_factory=list)
    reference_column: str = "reference"
    reference_kind: str = "answer"
    teacher_placement: str = TeacherPromptConfig.placement
    teacher_answer_template: str | None = None
    teacher_solution_template: str | None = None
    teacher_tool_call_template: str | None = None
    divergence: str = "full"
    divergence_topk: int | None = None
    signal_chunk_size: int | None = None
    log_samples_per_step: int = DEFAULT_LOG_SAMPLES
    run_log_dir: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.plugins, str) or not all(isinstance(m, str) for m in self.plugins):
            raise ValueError(f"plugins must be a list of module names, got {self.plugins!r}")
        load_plugins(self.plugins)
        trl_estimator(self.estimator)
        if isinstance(self.credit, str):
            try:
                self.credit = loads_bounded(self.credit)
            except ValueError as error:
                raise ValueError(f"credit must be a JSON object of {self.estimator!r}'s config "
                                 f"fields, got {self.credit!r:.200}: {error}") from error
        if self.credit is None:
            self.credit = {}
        if not isinstance(self.credit, dict):
            raise ValueError(f"credit must be a dict of {self.estimator!r}'s config fields, "
                             f"got {type(self.credit).__name__}")
        if "eps" in self.credit:
            raise ValueError("credit['eps'] has no effect in TRL: its advantage adds 1e-4 to the "
                             "std (scale_rewards decides the normalisation)")
        config = self.credit_config
        norm_by_std = getattr(config, "norm_by_std", None)
        if norm_by_std is not None and norm_by_std != (self.scale_rewards != "none"):
            raise ValueError(
                f"estimator={self.estimator!r} has norm_by_std={norm_by_std} but "
                f"scale_rewards={self.scale_rewards!r}: TRL computes the outcome advantage, so "
                "set scale_rewards='none' for norm_by_std=False (Dr.GRPO) and 'group' or "
                "'batch' otherwise")
        if self.estimator == "top_entropy" and self.top_entropy_quantile < 1.0:
            raise ValueError("estimator='top_entropy' and top_entropy_quantile < 1.0 both mask "
                             "the loss by entropy; keep top_entropy_quantile=1.0")
        if not isinstance(self.reference_column, str) or not self.reference_column:
            raise ValueError("reference_column must be a non-empty str")
        if self.reference_kind not in REFERENCE_KINDS:
            raise ValueError(f"reference_kind must be one of {REFERENCE_KINDS}, "
                             f"got {self.reference_kind!r}")
        if self.teacher_placement not in PLACEMENTS:
            raise ValueError(f"teacher_placement must be one of {PLACEMENTS}, "
                             f"got {self.teacher_placement!r}")
        for name in _TEMPLATE_FIELDS:
            template = getattr(self, name)
            if template is not None and (not isinstance(template, str)
                                         or "{reference}" not in template):
                raise ValueError(f"{name} must be None or a str containing '{{reference}}'")
        if self.divergence not in DIVERGENCE_KINDS:
            raise ValueError(f"divergence must be one of {DIVERGENCE_KINDS}, "
                             f"got {self.divergence!r}")
        if (self.divergence == "topk") != (self.divergence_topk is not None):
            raise ValueError("divergence_topk is required with divergence='topk' and refused "
                             f"otherwise, got divergence_topk={self.divergence_topk!r}")
        if self.signal_chunk_size is not None and (
                isinstance(self.signal_chunk_size, bool)
                or not isinstance(self.signal_chunk_size, int) or self.signal_chunk_size < 1):
            raise ValueError(f"signal_chunk_size must be None or an integer >= 1, "
                             f"got {self.signal_chunk_size!r}")
        check_run_log_settings("", self.log_samples_per_step, self.run_log_dir)

    @property
    def credit_estimator(self) -> Estimator:
        """The registered estimator ``estimator`` names."""
        return trl_estimator(self.estimator)

    @property
    def credit_config(self) -> Any:
        """``credit`` as the estimator's config dataclass (``make_config`` checks every value)."""
        try:
            # __post_init__ has parsed a JSON str credit into a dict
            credit = cast("dict[str, Any]", self.credit or {})
            return self.credit_estimator.make_config(**credit)
        except (TypeError, ValueError) as error:
            raise ValueError(f"credit: {error}") from error

    @property
    def teacher_prompt_config(self) -> TeacherPromptConfig:
        """Where and how the reference is shown to the teacher (library wording unless set)."""
        templates = {key: getattr(self, name) for name, key in _TEMPLATE_FIELDS.items()
                     if getattr(self, name) is not None}
        # __post_init__ has checked teacher_placement is one of PLACEMENTS
        return TeacherPromptConfig(placement=cast(Placement, self.teacher_placement),
                                   **templates)


def reshape_outcome(estimator: Estimator, config: Any,
                    batch: CreditBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator's token advantages on a given trajectory advantage (see the module
    docstring, "Outcome advantage" and "Fallback").

    Args:
        estimator: a registered token-level estimator; config: its config.
        batch: ``rewards`` holds the ``[B]`` trajectory advantage ``A`` to reshape (TRL's),
            ``group_ids`` its groups, ``mask`` the ``[B, T]`` policy mask, plus the signals the
            estimator needs.

    Returns:
        ``([B, T] W * A * mask in float32, [B] bool: rows that fell back to W = 1)``.
    """
    outcome = batch.rewards.double()
    batch = dataclasses.replace(batch, rewards=outcome)
    registry_advantages = estimator(batch, config).double()
    registry_outcome = reference_outcome(batch, config).double().to(outcome.device)
    mask = batch.mask.to(registry_advantages.device)
    weights = token_weights(registry_outcome, registry_advantages, mask)
    fallback = (outcome != 0) & (torch.sign(registry_outcome) != torch.sign(outcome))
    weights = torch.where(fallback[:, None], mask.double(), weights)
    return (weights * outcome[:, None] * mask.double()).float(), fallback


class CreditGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages are a gear-rl estimator's per-token ``[B, T]`` ones.

    Takes the same arguments as ``GRPOTrainer``; ``args`` must be a :class:`CreditGRPOConfig`,
    and the dataset needs ``args.reference_column`` when the estimator reads teacher signals.
    Logs ``gear/<name>`` for each credit diagnostic (``gear_rl.credit.credit_diagnostics``),
    ``gear/outcome_fallback_frac`` and, with a teacher, ``gear/teacher_prompt_<how>_frac``;
    with ``args.log_samples_per_step > 0`` also writes the gear-rl run log (module docstring, "Run
    log"; :attr:`run_log`).
    """

    def __init__(self, *positional: Any, **kwargs: Any) -> None:
        args = kwargs.get("args", positional[2] if len(positional) > 2 else None)
        if not isinstance(args, CreditGRPOConfig):
            raise ValueError(
                f"args must be a CreditGRPOConfig (GRPOConfig plus the credit estimator), "
                f"got {type(args).__name__}"
            )
        super().__init__(*positional, **kwargs)
        # the open gear-rl run log (main process, during train()), else None
        self.run_log: EngineRunLog | None = None
        self._rewards_per_func: torch.Tensor | None = None
        if args.log_samples_per_step > 0:
            self.add_callback(_RunLogCallback(self))

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        return self._apply_credit(inputs, output)

    def _calculate_rewards(self, *positional: Any, **kwargs: Any) -> torch.Tensor:
        """TRL's ``[N, F]`` rewards per reward function (every process's rows), kept for the
        run log."""
        rewards_per_func = super()._calculate_rewards(*positional, **kwargs)
        self._rewards_per_func = rewards_per_func
        return rewards_per_func

    def _apply_credit(self, inputs: list[dict[str, Any]],
                      output: dict[str, Any]) -> dict[str, Any]:
        """Replace ``output["advantages"]`` (``[B]``, TRL's) by the estimator's ``[B, T]``;
        returns a new dict (TRL buffers and reuses the old one)."""
        args: CreditGRPOConfig = self.args  # type: ignore[assignment]
        estimator, config = args.credit_estimator, args.credit_config
        advantages = output["advantages"]
        if advantages.dim() != 1:
            raise ValueError(f"expected TRL's [B] advantages, got shape {tuple(advantages.shape)}")
        completion_ids = output["completion_ids"]
        if len(inputs) != completion_ids.shape[0]:
            raise ValueError(f"inputs has {len(inputs)} examples, the batch has "
                             f"{completion_ids.shape[0]} completions")
        policy = output["completion_mask"]
        if output.get("tool_mask") is not None:
            policy = policy * output["tool_mask"]
        policy = policy.float()

        prompts = [row[mask.bool()].tolist()
                   for row, mask in zip(output["prompt_ids"], output["prompt_mask"], strict=True)]
        hows: list[str] = []
        signals: dict[str, Any] = {}  # CreditBatch's tensor fields, by name
        model = self.accelerator.unwrap_model(self.model)
        with torch.no_grad():
            if estimator.needs_teacher:
                teacher_prompts, hows = self._teacher_prompts(inputs, prompts)
                scores = token_signals(
                    model, prompts, teacher_prompts, completion_ids.tolist(),
                    temperature=self.temperature,
                    estimator=cast(DivergenceKind, args.divergence),  # checked in config
                    topk=args.divergence_topk, response_mask=policy,
                    chunk_size=args.signal_chunk_size)
                signals = {"divergence": scores.divergence, "entropy": scores.entropy,
                           "student_logprobs": scores.student_logprobs,
                           "teacher_logprobs": scores.teacher_logprobs}
            elif estimator.needs:
                student = response_logprobs(
                    model, prompts, completion_ids.tolist(), temperature=self.temperature,
                    response_mask=policy, chunk_size=args.signal_chunk_size)
                signals = {"entropy": student.entropy, "student_logprobs": student.logprobs}
        device = advantages.device
        batch = CreditBatch(rewards=advantages, group_ids=self._group_ids(len(inputs)),
                            mask=policy, **{k: v.to(device) for k, v in signals.items()})
        token_advantages, fallback = reshape_outcome(estimator, config, batch)

        new_output = dict(output)
        new_output["advantages"] = token_advantages.to(device=device, dtype=advantages.dtype)
        diagnostics = self._log_credit(estimator, config, batch, token_advantages, fallback,
                                       hows)
        if self.run_log is not None and self.model is not None and self.model.training:
            self._write_run_log(inputs, output, prompts, batch, token_advantages, diagnostics)
        return new_output

    def _write_run_log(self, inputs: list[dict[str, Any]], output: dict[str, Any],
                       prompts: list[list[int]], batch: CreditBatch,
                       advantages: torch.Tensor, diagnostics: dict[str, float]) -> None:
        """One training step of the run log: ``samples.jsonl`` records of this process's rows
        (``batch``: TRL's ``[B]`` advantage as rewards, ``[B, T]`` mask and signals;
        ``advantages``: the ``[B, T]`` ones the loss gets) and the step's metrics line."""
        assert self.run_log is not None
        args: CreditGRPOConfig = self.args  # type: ignore[assignment]
        tokenizer = self._tokenizer
        lengths = output["completion_mask"].sum(dim=1).tolist()
        response_ids = [row[:int(n)].tolist()
                        for row, n in zip(output["completion_ids"], lengths, strict=True)]
        rewards = self._local_rewards(len(inputs))
        batch = dataclasses.replace(batch, **{
            name: getattr(batch, name).detach().cpu()
            for name in ("rewards", "mask", "divergence", "entropy", "student_logprobs",
                         "teacher_logprobs") if getattr(batch, name) is not None})
        step = self.state.global_step + 1  # the step these completions train

        def fields(row: int) -> dict[str, Any]:
            example = inputs[row]
            return {"problem_id": example.get("id", batch.group_ids[row]),
                    "prompt": tokenizer.decode(prompts[row]),
                    "answer": lookup_reference(example, args.reference_column),
                    "response": tokenizer.decode(response_ids[row], skip_special_tokens=True)}

        records = sample_records(
            step, batch, advantages.detach().cpu(), response_ids,
            estimator=args.credit_estimator, credit_config=args.credit_config,
            decode=tokenizer.decode, count=args.log_samples_per_step, rewards=rewards,
            outcome=batch.rewards, row_fields=fields)
        metrics = {**rollout_metrics(rewards, batch.group_ids, batch.mask, response_ids,
                                     batch.entropy), **diagnostics}
        self.run_log.log_step(step, metrics, records)

    def _local_rewards(self, size: int) -> torch.Tensor:
        """``[size]`` this process's rewards of the last generation batch: TRL's weighted sum
        over reward functions (an unscorable completion counts 0)."""
        if self._rewards_per_func is None:
            raise ValueError("no rewards of this generation batch were kept")
        per_func = self._rewards_per_func
        total = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        start = self.accelerator.process_index * size
        return total[start:start + size].detach().float().cpu()

    def _open_run_log(self) -> None:
        """Start (or, resuming, continue) the run log in ``run_log_dir`` / ``output_dir``."""
        self._close_run_log(finished=False)
        if not self.accelerator.is_main_process:
            return
        args: CreditGRPOConfig = self.args  # type: ignore[assignment]
        import transformers
        import trl

        self.run_log = EngineRunLog(
            args.run_log_dir or args.output_dir or ".", engine="trl", config=self._run_config(),
            info={"run_id": uuid.uuid4().hex, "trl": trl.__version__,
                  "transformers": transformers.__version__, "torch": torch.__version__,
                  "device": str(self.accelerator.device),
                  "processes": self.accelerator.num_processes, "argv": sys.argv},
            first_step=self.state.global_step + 1)

    def _run_config(self) -> dict[str, Any]:
        """``config.yaml`` of the run log: the keys ``gear-rl report``/``compare`` read, in the
        trainer's names, and TRL's arguments under ``trl``."""
        args: CreditGRPOConfig = self.args  # type: ignore[assignment]
        model = self.accelerator.unwrap_model(self.model)
        name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
        dataset = self.train_dataset
        task = getattr(getattr(dataset, "info", None), "dataset_name", None)
        fingerprint = getattr(dataset, "_fingerprint", None)
        if task is None and fingerprint:
            # an unnamed dataset (Dataset.from_list, ...) by its content hash, so that compare
            # tells runs on two different unnamed datasets apart
            task = f"dataset {fingerprint}"
        generations, per_prompt = args.generation_batch_size or 0, args.num_generations or 1
        return {"estimator": args.estimator, "credit": dict(cast("dict", args.credit or {})),
                "seed": args.seed, "model": name, "task": task or type(dataset).__name__,
                "steps": self.state.max_steps,
                "rollout": {"prompts_per_step": generations // per_prompt,
                            "samples_per_prompt": args.num_generations,
                            "max_new_tokens": args.max_completion_length,
                            "temperature": args.temperature},
                "trl": json.loads(json.dumps(args.to_dict(), default=str))}

    def _log_trl(self, logs: dict[str, Any] | None) -> None:
        """TRL's own logs of a logging step, as a ``metrics.jsonl`` line under ``trl/`` (its
        ``step_time`` also as the trainer's ``time/step``)."""
        if self.run_log is not None and logs:
            values = {f"trl/{key}": value
                      for key, value in engine_metrics(logs, prefix=None).items()}
            if "trl/step_time" in values:
                values["time/step"] = values["trl/step_time"]
            self.run_log.log_step(self.state.global_step, values)

    def _close_run_log(self, finished: bool = True) -> None:
        if self.run_log is None:
            return
        args: CreditGRPOConfig = self.args  # type: ignore[assignment]
        if finished:
            self.run_log.finish({"estimator": args.estimator, "steps": self.state.global_step})
        else:
            self.run_log.close()
        self.run_log = None

    def _group_ids(self, size: int) -> list[int]:
        """TRL's groups: ``num_generations`` consecutive completions of the whole (all-process)
        generation batch share a prompt; this process holds rows ``[rank * size, ...)``."""
        assert self.model is not None  # the trainer is built with a model
        generations = self.num_generations if self.model.training else self.num_generations_eval
        offset = self.accelerator.process_index * size
        return [(offset + row) // generations for row in range(size)]

    def _teacher_prompts(self, inputs: list[dict[str, Any]],
                         prompts: list[list[int]]) -> tuple[list[list[int]], list[str]]:
        """Teacher prompt ids for each example from the prompt ids TRL stored, and how each was
        made (``gear_rl.integrations.teacher_inputs``)."""
        args: CreditGRPOConfig = self.args  # type: ignore[assignment]
        tokenizer = self._tokenizer
        teacher_config = args.teacher_prompt_config
        teacher, hows = [], []
        for i, (example, stored) in enumerate(zip(inputs, prompts, strict=True)):
            if args.reference_column.split(".")[0] not in example:
                raise ValueError(
                    f"example {i} has no column {args.reference_column!r} "
                    "(CreditGRPOConfig.reference_column): the teacher needs each example's "
                    "reference"
                )
            if "prompt" not in example:
                raise ValueError(f"example {i} has no 'prompt' column to build the teacher from")
            ids, how = teacher_prompt_ids(
                stored, example["prompt"], lookup_reference(example, args.reference_column),
                lambda messages: render_prompt_ids(tokenizer, messages),
                lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]),
                kind=args.reference_kind, config=teacher_config)
            teacher.append(ids)
            hows.append(how)
        return teacher, hows

    def _log_credit(self, estimator: Estimator, config: Any, batch: CreditBatch,
                    advantages: torch.Tensor, fallback: torch.Tensor,
                    hows: list[str]) -> dict[str, float]:
        """Add the ``gear/...`` metrics of this batch to TRL's; returns the credit diagnostics
        under their bare names."""
        assert self.model is not None  # the trainer is built with a model
        mode = "train" if self.model.training else "eval"
        diagnostics = credit_diagnostics(estimator, config, batch, advantages,
                                         outcome=batch.rewards)
        values = {f"gear/{name}": value for name, value in diagnostics.items()}
        values["gear/outcome_fallback_frac"] = float(fallback.double().mean())
        if hows:
            for how in _HOWS:
                values[f"gear/teacher_prompt_{how}_frac"] = hows.count(how) / len(hows)
        for name, value in values.items():
            self._metrics[mode][name].append(value)
        return diagnostics


class _RunLogCallback(TrainerCallback):
    """Opens, feeds and closes a :class:`CreditGRPOTrainer`'s run log at TRL's training
    events."""

    def __init__(self, trainer: CreditGRPOTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._open_run_log()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        self.trainer._log_trl(logs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._close_run_log()


# GEAR is the default estimator: the GEAR names are the same classes.
GEARGRPOConfig = CreditGRPOConfig
GEARTrainer = CreditGRPOTrainer
