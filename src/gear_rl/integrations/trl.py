"""GEAR inside TRL: ``GEARTrainer``, a ``trl.GRPOTrainer`` with token-level GEAR advantages.

GEAR: "Granularity-adaptivE Advantage Reweighting", arXiv 2605.11853.

TRL 1.16's ``GRPOTrainer._generate_and_score_completions`` returns one advantage per completion
(``[B]``) and its ``_compute_loss`` unsqueezes advantages only when they are 1-D, so ``[B, T]``
advantages flow into every loss type unchanged. ``GEARTrainer`` overrides only the first: after
TRL has sampled, scored and group-normalised as configured, it

1. builds each completion's teacher prompt: the prompt ids TRL sampled with, with the example's
   reference (dataset column ``reference_column``) spliced in as a delimited hint
   (``gear_rl.integrations.teacher_inputs``);
2. runs the signal pass (``gear_rl.signals.token_signals``) on the policy model: student entropy
   and the reverse KL to the teacher, ``full`` over the vocabulary by default (the trainer holds
   both distributions), without materialising ``[B, T, V]`` and without gradients;
3. reshapes TRL's trajectory advantage ``A_i`` into ``W_t * A_i`` with
   ``gear_rl.credit.gear_advantages``, normalising over ``completion_mask * tool_mask`` (tool
   output stays in the context, out of every statistic).

Everything else (generation, rewards, loss, logging, vLLM, multi-process) is TRL's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from gear_rl.credit import GEARConfig, gear_advantages, gear_segments, gear_weights
from gear_rl.credit.config import NORMALIZE_MODES, SEGMENTATION_MODES
from gear_rl.integrations.teacher_inputs import (
    APPENDED,
    NO_REFERENCE,
    RERENDERED,
    SPLICED_HEAD,
    SPLICED_TAIL,
    teacher_prompt_ids,
)
from gear_rl.signals import ESTIMATORS as DIVERGENCE_ESTIMATORS
from gear_rl.signals import TeacherPromptConfig, token_signals
from gear_rl.signals import prompt_ids as render_prompt_ids
from gear_rl.signals.teacher import PLACEMENTS, REFERENCE_KINDS


@dataclass
class GEARGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus GEAR's knobs (DESIGN.md, "GEAR, as this project specifies it").

    Attributes:
        reference_column: dataset column with each example's reference (final answer, solution
            or gold tool call); non-string values are JSON-encoded. Rows without one keep the
            student prompt as teacher (zero divergence).
        gear_reference_kind: ``answer``, ``solution`` or ``tool_call`` (which hint wording).
        gear_placement: where the hint goes: ``user_end``, ``new_user_turn`` or ``system``.
        gear_divergence: ``full`` (exact reverse KL), ``topk``, ``k1`` or ``k3``.
        gear_topk: support size for ``gear_divergence="topk"``.
        gear_lambda_kl: onset threshold on the normalised divergence.
        gear_lambda_h: segment end where entropy exceeds ``lambda_h`` x the onset's entropy.
        gear_alpha: weight scale in ``W = alpha * w + beta``.
        gear_beta: offset in ``W``; ``None`` is ``1 - alpha / 2``.
        gear_normalize: ``minmax``, ``max`` or ``none``.
        gear_segmentation: ``kl_entropy`` (GEAR) or an ablation: ``none``, ``kl_only``,
            ``entropy_only``, ``entropy_window``.
        gear_window: trailing window for ``entropy_window``.
        gear_sign_aware: sign-aware weights (``w = u`` on negative trajectories).
        gear_mean_preserving: rescale ``W`` to mean 1 per trajectory (beyond the paper).
        gear_chunk_size: response positions per LM-head chunk in the signal pass (``None``: auto).
    """

    reference_column: str = field(default="reference", metadata={
        "help": "Dataset column holding each example's reference (answer, solution, tool call)."})
    gear_reference_kind: str = field(default="answer", metadata={
        "help": "Hint wording: 'answer', 'solution' or 'tool_call'."})
    gear_placement: str = field(default="user_end", metadata={
        "help": "Hint placement: 'user_end', 'new_user_turn' or 'system'."})
    gear_divergence: str = field(default="full", metadata={
        "help": "Per-token divergence: 'full', 'topk', 'k1' or 'k3'."})
    gear_topk: int | None = field(default=None, metadata={
        "help": "Support size for gear_divergence='topk'."})
    gear_lambda_kl: float = field(default=0.1, metadata={"help": "Onset threshold."})
    gear_lambda_h: float = field(default=1.5, metadata={"help": "Entropy termination ratio."})
    gear_alpha: float = field(default=1.0, metadata={"help": "Weight scale alpha."})
    gear_beta: float | None = field(default=None, metadata={
        "help": "Weight offset beta (default 1 - alpha/2)."})
    gear_normalize: str = field(default="minmax", metadata={
        "help": "Divergence normalisation: 'minmax', 'max' or 'none'."})
    gear_segmentation: str = field(default="kl_entropy", metadata={
        "help": "'kl_entropy' (GEAR) or an ablation: 'none', 'kl_only', 'entropy_only', "
                "'entropy_window'."})
    gear_window: int = field(default=8, metadata={"help": "Window for 'entropy_window'."})
    gear_sign_aware: bool = field(default=True, metadata={"help": "Sign-aware weights."})
    gear_mean_preserving: bool = field(default=False, metadata={
        "help": "Rescale weights to mean 1 per completion."})
    gear_chunk_size: int | None = field(default=None, metadata={
        "help": "Response positions per LM-head chunk in the signal pass."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.reference_column, str) or not self.reference_column:
            raise ValueError("reference_column must be a non-empty str")
        if self.gear_reference_kind not in REFERENCE_KINDS:
            raise ValueError(f"gear_reference_kind must be one of {REFERENCE_KINDS}, "
                             f"got {self.gear_reference_kind!r}")
        if self.gear_placement not in PLACEMENTS:
            raise ValueError(f"gear_placement must be one of {PLACEMENTS}, "
                             f"got {self.gear_placement!r}")
        if self.gear_divergence not in DIVERGENCE_ESTIMATORS:
            raise ValueError(f"gear_divergence must be one of {DIVERGENCE_ESTIMATORS}, "
                             f"got {self.gear_divergence!r}")
        if (self.gear_divergence == "topk") != (self.gear_topk is not None):
            raise ValueError("gear_topk is required with gear_divergence='topk' and refused "
                             f"otherwise, got gear_topk={self.gear_topk!r}")
        if self.gear_normalize not in NORMALIZE_MODES:
            raise ValueError(f"gear_normalize must be one of {NORMALIZE_MODES}")
        if self.gear_segmentation not in SEGMENTATION_MODES:
            raise ValueError(f"gear_segmentation must be one of {SEGMENTATION_MODES}")
        self.gear_config  # noqa: B018 - builds the credit config, which checks every value

    @property
    def gear_config(self) -> GEARConfig:
        """The knobs as ``gear_rl.credit.GEARConfig``."""
        return GEARConfig(lambda_kl=self.gear_lambda_kl, lambda_h=self.gear_lambda_h,
                          alpha=self.gear_alpha, beta=self.gear_beta,
                          normalize=self.gear_normalize, segmentation=self.gear_segmentation,
                          window=self.gear_window, sign_aware=self.gear_sign_aware,
                          mean_preserving=self.gear_mean_preserving)

    @property
    def teacher_prompt_config(self) -> TeacherPromptConfig:
        """Where and how the reference is shown to the teacher."""
        return TeacherPromptConfig(placement=self.gear_placement)


class GEARTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages are GEAR's per-token ``[B, T]`` advantages.

    Takes the same arguments as ``GRPOTrainer``; ``args`` must be a :class:`GEARGRPOConfig` and
    the dataset must have ``args.reference_column``. Logs ``gear/weight_mean_pos``,
    ``gear/weight_mean_neg`` (mean ``W`` per advantage sign), ``gear/segment_token_frac``,
    ``gear/divergence_mean`` and how the teacher prompts were made.
    """

    def __init__(self, *positional: Any, **kwargs: Any) -> None:
        args = kwargs.get("args", positional[2] if len(positional) > 2 else None)
        if not isinstance(args, GEARGRPOConfig):
            raise ValueError(
                f"args must be a GEARGRPOConfig (GRPOConfig plus the GEAR knobs), "
                f"got {type(args).__name__}"
            )
        super().__init__(*positional, **kwargs)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        return self._apply_gear(inputs, output)

    def _apply_gear(self, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
        """Replace ``output["advantages"]`` (``[B]``, TRL's) by GEAR's ``[B, T]``; returns a new
        dict (TRL buffers and reuses the old one)."""
        args: GEARGRPOConfig = self.args  # type: ignore[assignment]
        advantages = output["advantages"]
        if advantages.dim() != 1:
            raise ValueError(f"expected TRL's [B] advantages, got shape {tuple(advantages.shape)}")
        completion_ids = output["completion_ids"]
        policy = output["completion_mask"]
        if output.get("tool_mask") is not None:
            policy = policy * output["tool_mask"]
        if len(inputs) != completion_ids.shape[0]:
            raise ValueError(f"inputs has {len(inputs)} examples, the batch has "
                             f"{completion_ids.shape[0]} completions")
        prompts = [row[mask.bool()].tolist()
                   for row, mask in zip(output["prompt_ids"], output["prompt_mask"], strict=True)]
        teacher_prompts, hows = self._teacher_prompts(inputs, prompts)

        model = self.accelerator.unwrap_model(self.model)
        with torch.no_grad():
            signals = token_signals(
                model, prompts, teacher_prompts, completion_ids.tolist(),
                temperature=self.temperature, estimator=args.gear_divergence,
                topk=args.gear_topk, response_mask=policy, chunk_size=args.gear_chunk_size)
        device = advantages.device
        divergence, entropy = signals.divergence.to(device), signals.entropy.to(device)
        config = args.gear_config
        token_advantages = gear_advantages(advantages.float(), divergence, entropy, policy, config)

        new_output = dict(output)
        new_output["advantages"] = token_advantages.to(advantages.dtype)
        self._log_gear(advantages, divergence, entropy, policy, config, hows)
        return new_output

    def _teacher_prompts(self, inputs: list[dict[str, Any]],
                         prompts: list[list[int]]) -> tuple[list[list[int]], list[str]]:
        args: GEARGRPOConfig = self.args  # type: ignore[assignment]
        tokenizer = self._tokenizer
        teacher, hows = [], []
        for i, (example, stored) in enumerate(zip(inputs, prompts, strict=True)):
            if args.reference_column not in example:
                raise ValueError(
                    f"example {i} has no column {args.reference_column!r} "
                    "(GEARGRPOConfig.reference_column): the teacher needs each example's reference"
                )
            if "prompt" not in example:
                raise ValueError(f"example {i} has no 'prompt' column to build the teacher from")
            ids, how = teacher_prompt_ids(
                stored, example["prompt"], _reference_text(example[args.reference_column]),
                lambda messages: render_prompt_ids(tokenizer, messages),
                lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]),
                kind=args.gear_reference_kind, config=args.teacher_prompt_config)
            teacher.append(ids)
            hows.append(how)
        return teacher, hows

    def _log_gear(self, advantages: torch.Tensor, divergence: torch.Tensor,
                  entropy: torch.Tensor, policy: torch.Tensor, config: GEARConfig,
                  hows: list[str]) -> None:
        mode = "train" if self.model.training else "eval"
        mask = policy.bool()
        weights = gear_weights(advantages.float(), divergence, entropy, policy, config)
        onsets = gear_segments(divergence, entropy, policy, config)
        sign = advantages[:, None].expand_as(weights)
        values = {
            "gear/weight_mean_pos": _masked_mean(weights, mask & (sign > 0)),
            "gear/weight_mean_neg": _masked_mean(weights, mask & (sign < 0)),
            "gear/segment_token_frac": _masked_mean((onsets >= 0).float(), mask),
            "gear/divergence_mean": _masked_mean(divergence, mask),
        }
        for how in (SPLICED_HEAD, SPLICED_TAIL, RERENDERED, APPENDED, NO_REFERENCE):
            values[f"gear/teacher_prompt_{how}_frac"] = hows.count(how) / max(1, len(hows))
        for name, value in values.items():
            if value == value:  # NaN when a sign has no token in this batch: not logged
                self._metrics[mode][name].append(value)


def _reference_text(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if text.strip() else None


def _masked_mean(values: torch.Tensor, where: torch.Tensor) -> float:
    count = int(where.sum())
    return float(values.double()[where].sum() / count) if count else float("nan")
