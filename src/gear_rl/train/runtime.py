"""Building a run: what it needs before its first step, built once for ``gear-rl train``,
``gear-rl eval`` and the credit check: the device and precision, the policy and its tokenizer,
the sampler copy, the stop and padding ids, the task, and the Python sandbox of tool-using
tasks (:class:`Runtime`, :func:`build_runtime`), and how its sampler samples
(:func:`sampling_params`, :func:`rollout_settings`).

A run's other lifecycle stages live beside it: opening its folder, a resume and its checks,
:mod:`gear_rl.train.resume`; held-out evaluation, :mod:`gear_rl.train.evaluate`; the heap's
mechanisms and their policy, :mod:`gear_rl.train.memory`.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gear_rl.agent.loop import AgentLimits
from gear_rl.sampling import SamplingParams, stop_token_ids
from gear_rl.tasks import Task, load_task
from gear_rl.train.config import EvalConfig, RolloutConfig, TrainConfig
from gear_rl.train.episodes import task_turns
from gear_rl.train.memory import keep_heap_pages

if TYPE_CHECKING:
    from gear_rl.agent.tools import PythonSandbox

__all__ = ["Runtime", "agent_limits", "bf16_is_native", "build_runtime", "config_task",
           "resolve_device", "resolves_to_bf16", "rollout_settings",
           "sampling_params", "sandbox_secrets", "task_sandbox"]


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


def resolves_to_bf16(setting: str, device: torch.device) -> bool:
    """Whether a precision setting (``precision``, which picks bf16 autocast for training and
    scoring, or ``rollout.dtype``, the sampler's weights: auto, bf16 or fp32) means bf16 on
    ``device``: ``auto`` is bf16 where it is native (:func:`bf16_is_native`), fp32 elsewhere."""
    return setting == "bf16" or (setting == "auto" and bf16_is_native(device))


def config_task(config: TrainConfig) -> Task:
    """The task ``config`` names, built as every run builds it: ``train_size`` training and
    ``eval.size`` held-out problems (seed 0), its options, instruction and ``eval_data``."""
    return load_task(config.task, options=config.task_options, train_size=config.train_size,
                     eval_size=config.eval.size, seed=0, instruction=config.instruction,
                     eval_path=config.eval_data)




def agent_limits(config: TrainConfig, task: Task, *, evaluation: bool = False) -> AgentLimits:
    """The multi-turn limits of ``config.agent`` for ``task`` (``agent.max_turns`` unset: the
    task's own; evaluation: at least ``eval.max_new_tokens`` per turn)."""
    agent = config.agent
    per_turn = agent.max_new_tokens_per_turn
    if evaluation:
        per_turn = max(per_turn, config.eval.max_new_tokens)
    turns = agent.max_turns if agent.max_turns is not None else task_turns(task)
    return AgentLimits(max_turns=turns or AgentLimits.max_turns,
                       max_new_tokens_per_turn=per_turn,
                       max_response_tokens=agent.max_response_tokens,
                       max_observation_tokens=agent.max_observation_tokens)


def sampling_params(settings: RolloutConfig | EvalConfig, runtime: Runtime) -> SamplingParams:
    """How ``runtime``'s sampler samples under ``settings`` (``config.rollout`` or
    ``config.eval``): their temperature, top-p, token cap and decoding batch, with the run's
    stop and padding ids."""
    return SamplingParams(max_new_tokens=settings.max_new_tokens, stop_ids=runtime.stop_ids,
                          pad_id=runtime.pad_id, temperature=settings.temperature,
                          top_p=settings.top_p, batch_size=settings.batch_size)


def rollout_settings(config: TrainConfig, runtime: Runtime) -> dict[str, Any]:
    """The keyword arguments of :func:`gear_rl.train.episodes.collect` for a rollout of
    ``runtime``'s task as training samples it: the sampler copy, its tokenizer,
    ``config.rollout``'s :class:`~gear_rl.sampling.SamplingParams` (:func:`sampling_params`),
    the multi-turn limits, the sandbox and whether turns reuse the KV cache (the problems,
    prompts and generator are the caller's)."""
    return {"model": runtime.sampler, "tokenizer": runtime.tokenizer,
            "sampling": sampling_params(config.rollout, runtime),
            "limits": agent_limits(config, runtime.task), "sandbox": runtime.sandbox,
            "reuse_cache": config.agent.reuse_kv_cache}


_DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def sandbox_secrets(config: TrainConfig, run_dir: str | Path | None) -> list[Path]:
    """What sandboxed code must never read: the run directory (its samples log every reference
    answer), the task's data files, the model caches. A declared mount may not overlap the run
    directory or a data file."""
    paths: list[Path] = []
    if run_dir is not None:
        paths.append(Path(run_dir).absolute())
    for spec in (config.task, config.eval_data):
        if spec:
            candidate = Path(str(spec).split(":", 1)[-1])
            if candidate.suffix in _DATA_SUFFIXES:
                paths.append(candidate.absolute())
    return paths


def _model_caches() -> list[Path]:
    from gear_rl.models import cache_root

    hf = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return [cache_root().absolute(), hf.absolute()]


def task_sandbox(task: Task, config: TrainConfig,
                 run_dir: str | Path | None = None) -> PythonSandbox | None:
    """A :class:`~gear_rl.agent.tools.PythonSandbox` with ``config.agent``'s limits when
    ``task`` runs Python tool calls, else None. The caller closes it.

    The code sees only the interpreter, the task's declared packages and
    ``agent.sandbox_mounts`` (read-only); the run directory, the folder of runs beside it, the
    task's data files and the model caches are hidden even where they lie under an exposed
    directory, and a mount that overlaps the run directory or a data file is refused."""
    if task.agent is None or task.agent.tool != "python":
        return None
    from gear_rl.agent.tools import PythonSandbox, check_mounts

    secrets = sandbox_secrets(config, run_dir)
    mounts = check_mounts(config.agent.sandbox_mounts, secrets, name="agent.sandbox_mounts")
    hidden = [*secrets, *_model_caches()]
    if run_dir is not None:
        hidden.append(Path(run_dir).absolute().parent)  # other runs log the same answers
    return PythonSandbox(workers=config.agent.sandbox_workers,
                         timeout_s=config.agent.sandbox_timeout_s,
                         memory_mb=config.agent.sandbox_memory_mb,
                         packages=task.agent.sandbox_packages, mounts=mounts, hidden=hidden)


@dataclass
class Runtime:
    """A built run.

    Attributes:
        device: where the policy lives. ``autocast``: training and scoring forwards run under
            bf16 autocast (weights stay fp32).
        model: the fp32 policy (trained, and scored with).
        tokenizer: its tokenizer. ``stop_ids``, ``pad_id``: end-of-turn ids and padding.
        sampler: what generates: a bf16 copy of the policy refreshed after every update
            (``rollout.dtype``), or the policy itself.
        task: problems, scorer and, for agents and environments, their specs.
        sandbox: warm Python workers for tool calls (tool tasks only), closed by :meth:`close`.
        heap_reuse: whether :func:`~gear_rl.train.memory.keep_heap_pages` was applied (config
            ``heap_reuse``); where not, the update trims the heap every few layers
            (:func:`~gear_rl.train.memory.heap_trims`) and
            frees the sampler copy's weights while it runs (:meth:`release_sampler`).
        checkpoint, checkpoint_step: the checkpoint folder loaded into the policy and its
            training step (None: the model's own weights).
    """

    device: torch.device
    autocast: bool
    model: torch.nn.Module
    tokenizer: Any
    sampler: torch.nn.Module
    stop_ids: list[int]
    pad_id: int
    task: Task
    sandbox: PythonSandbox | None
    heap_reuse: bool = False
    checkpoint: Path | None = None
    checkpoint_step: int | None = None

    def autocast_context(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on the run's device, or a no-op."""
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def sync_sampler(self) -> None:
        """Copy the policy's weights into the sampler (after an update or a checkpoint load),
        allocating them again where :meth:`release_sampler` freed them."""
        if self.sampler is self.model:
            return
        with torch.no_grad():
            for target, source in zip(self.sampler.parameters(), self.model.parameters(),
                                      strict=True):
                if target.shape == source.shape:
                    target.copy_(source)
                else:  # released: the same rounding as copy_ into the sampler's dtype
                    target.data = source.detach().to(target.dtype)

    def release_sampler(self) -> None:
        """Free the sampler copy's weights until the next :meth:`sync_sampler`: the update
        neither reads them nor leaves them current (0.27 GB for SmolLM2-135M in bf16). Nothing
        where the sampler is the policy itself."""
        if self.sampler is self.model:
            return
        for parameter in self.sampler.parameters():
            parameter.data = torch.empty(0, dtype=parameter.dtype, device=parameter.device)

    def close(self) -> None:
        """Stop the sandbox workers, if any."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None


def build_runtime(config: TrainConfig, *, model: torch.nn.Module | None = None,
                  tokenizer: Any = None, task: Task | None = None,
                  checkpoint: str | Path | None = None, training: bool = True,
                  run_dir: str | Path | None = None) -> Runtime:
    """Build everything ``config`` names (validated first).

    Args:
        config: the run's config.
        model, tokenizer: an already-loaded policy (tests); None loads ``config.model``.
        task: an already-built task; None builds ``config.task``.
        checkpoint: weights to load into the policy (a checkpoint folder or a run directory,
            whose newest intact checkpoint is used: :func:`~gear_rl.train.checkpoint.
            read_checkpoint`); the runtime's ``checkpoint`` and ``checkpoint_step`` say which.
        training: keep an fp32 policy beside a bf16 sampler copy; ``False`` (evaluation) casts
            the policy itself to the sampler's dtype.
        run_dir: the run's folder, hidden from the sandbox of tool-using tasks.
    """
    config.validate()
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    autocast = resolves_to_bf16(config.precision, device)
    sampler_bf16 = resolves_to_bf16(config.rollout.dtype, device)
    if model is None:
        from gear_rl.models import load_policy

        model, tokenizer = load_policy(config.model, dtype=torch.float32, device=device,
                                       seed=config.seed)
    elif tokenizer is None:
        raise ValueError("tokenizer is required when model is given")
    model = model.to(device).float()
    model.eval()  # no dropout: the loss must score the sampling distribution
    folder, loaded_step = None, None
    if checkpoint is not None:
        from gear_rl.train.checkpoint import read_checkpoint

        folder, state = read_checkpoint(checkpoint, model)
        loaded_step = int(state["step"])
        broken = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
        if broken:
            raise ValueError(f"checkpoint: {folder} holds NaN or inf weights ({broken[0]} and "
                             f"{len(broken) - 1} more); it cannot be evaluated")
    if not sampler_bf16:
        sampler = model
    elif training:
        sampler = copy.deepcopy(model).to(torch.bfloat16)
    else:
        sampler = model = model.to(torch.bfloat16)
    stops = stop_token_ids(tokenizer, model)
    pad = tokenizer.pad_token_id
    if task is None:
        task = config_task(config)
    # None: single-turn tasks only (multi-turn rows make the update the run's memory peak)
    reuse = bool(config.heap_reuse or (config.heap_reuse is None
                                      and task_turns(task) is None)) and keep_heap_pages()
    return Runtime(device=device, autocast=autocast, model=model, tokenizer=tokenizer,
                   sampler=sampler, stop_ids=stops, pad_id=int(pad if pad is not None
                                                               else stops[0]),
                   task=task, sandbox=task_sandbox(task, config, run_dir), heap_reuse=reuse,
                   checkpoint=folder, checkpoint_step=loaded_step)
