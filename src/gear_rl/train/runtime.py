"""What a run needs before its first step, built once for ``gear-rl train`` and ``gear-rl eval``:
the device and precision, the policy and its tokenizer, the sampler copy, the stop and padding
ids, the task, and the Python sandbox of tool-using tasks."""

from __future__ import annotations

import contextlib
import copy
import ctypes
import hashlib
import json
import os
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gear_rl.agent.loop import AgentLimits
from gear_rl.credit.registry import upgrade_recorded_config
from gear_rl.dataclass_config import flatten_keys
from gear_rl.rundir import RunDir, file_sha256, machine_label, trained_on
from gear_rl.sampling import SamplingParams, stop_token_ids
from gear_rl.tasks import Problem, Task, load_task
from gear_rl.tasks.verl_data import SUFFIXES
from gear_rl.train.config import (
    EvalConfig,
    RolloutConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    recorded_config,
    recorded_config_dict,
)
from gear_rl.train.episodes import task_turns

if TYPE_CHECKING:
    from gear_rl.agent.tools import PythonSandbox

__all__ = ["RESUMABLE", "Runtime", "agent_limits", "bf16_is_native", "build_runtime",
           "config_differences", "config_task", "cpu_model", "data_fingerprint", "evaluate_model",
           "memory_metrics", "open_run", "release_free_memory",
           "reset_device_peak", "resolve_device", "resolves_to_bf16", "resume_config",
           "rollout_settings", "run_evaluation", "run_path", "sampling_params",
           "sandbox_secrets", "status_bytes", "task_sandbox"]


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; anything else as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``; else what :mod:`platform` knows): bf16
    is native on some of the machines this project runs on and emulated on others, so results
    record it."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def release_free_memory() -> None:
    """Return the C heap's free pages to the OS (glibc's ``malloc_trim``; elsewhere nothing).

    Between a step's phases most of the previous phase's tensors are freed, but glibc keeps
    their pages for reuse, and pages scattered between live blocks are never reused for the
    next phase's differently-sized tensors: a tool-math run's resident memory grew by about
    0.6 GB a step that way. Trimming between phases (tens of milliseconds) keeps each phase's
    peak at what is live plus what the phase itself allocates."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


def _glibc(name: str) -> Callable[..., int] | None:
    """glibc's function ``name`` (``malloc_trim``, ``mallopt``), or None off Linux or where
    the C library has none (musl has neither)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_heap_pages() -> bool:
    """Let glibc's heap keep and reuse freed memory (``mallopt``; elsewhere nothing): blocks
    up to 1 GiB come from the heap instead of fresh ``mmap`` regions, and the heap's free top
    is not handed back automatically below 2 GiB. The trainer then skips
    :func:`release_free_memory` between a step's phases too, until the resident set outgrows
    the early steps' peak (``Trainer._release_between_phases``): the same pages serve every
    chunk, micro-batch and phase instead of being unmapped and page-faulted in again, and the
    resident set stays near the step's peak. By default glibc maps a block above its dynamic
    threshold (at most 32 MiB) afresh each time and trims a free top above twice that: the
    update's ``[chunk, V]`` buffers and ``[V, H]`` head gradients were page-faulted in on
    every use, about 2 GB of faults per default-task update, which on this project's VMs cost
    more CPU time in the kernel than the LM head's matmuls (docs/speed.md). Process-wide and not
    undone (glibc has no way back to the dynamic threshold). Returns whether it was applied."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                       2**31 - 1))


HEAP_TRIM_LAYERS = 5  # decoder layers between two heap trims in a gradient pass


@contextlib.contextmanager
def heap_trims(layers: Sequence[torch.nn.Module], every: int = HEAP_TRIM_LAYERS,
               head: torch.nn.Module | None = None) -> Iterator[None]:
    """Within the block, a forward with gradients through ``layers`` (a model's decoder
    layers) hands the heap's free pages back (:func:`release_free_memory`) after every
    ``every``-th layer, and its backward does the same when it reaches those layers.

    Why: where the heap does not keep pages for reuse (``heap_reuse`` off: agent and
    environment tasks), the update's backward grew the resident set layer by layer, about
    25 MB a layer on a 2,000-token tool-math micro-batch of SmolLM2-135M: blocks freed between
    blocks still live (saved inputs of the layers not yet reached, gradients waiting for the
    shared prompt's pass) are not reused whole. Its peak over its start was 1.38 GB; trimming
    every 5 layers took it to 0.72 GB, every 2 layers to 0.70, and having glibc unmap every
    block above 1 MiB at once to 0.55 GB, but at about half again the update's CPU time in
    page faults (docs/speed.md). A hook on every ``every``-th layer's output; the hooks on
    the graph's tensors go with the graph.

    ``head`` (the LM head): the heap is trimmed also before the head's first call after the
    layers, in a forward with gradients. Under bf16 autocast the gradient pass has just
    dropped autocast's bf16 copies of the layers' weights there (``signals.divergence.
    _drop_backbone_casts``), and the LM-head chunks' ``[C, V]`` buffers do not fit their freed
    blocks: without the trim their pages stayed resident through the chunks, which set the
    update forward's peak (a whole 3-step tool-math run on an EPYC with AVX-512 BF16: 4.06 and
    4.10 GB before, 3.82 and 3.86 GB after, peaks of its second step's update)."""
    after_layers = [False]  # a layer ran since the head's last trim

    def trim(_grad: torch.Tensor) -> None:
        release_free_memory()

    def before_head(_module: torch.nn.Module, _args: Any) -> None:
        if after_layers[0] and torch.is_grad_enabled():
            after_layers[0] = False
            release_free_memory()

    def after(index: int) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            after_layers[0] = True
            if index % every or not torch.is_grad_enabled():
                return
            release_free_memory()
            tensor = output[0] if isinstance(output, tuple) else output
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                tensor.register_hook(trim)
        return hook

    handles = [layer.register_forward_hook(after(i)) for i, layer in enumerate(layers)]
    if head is not None:
        handles.append(head.register_forward_pre_hook(before_head))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def status_bytes(field: str) -> int | None:
    """``field`` (``VmRSS``: resident now, ``VmHWM``: its peak since start or the last reset of
    ``/proc/self/clear_refs``) of ``/proc/self/status`` in bytes; None where there is none (not
    Linux)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_metrics(device: torch.device) -> dict[str, float]:
    """Memory of this process for a step's metrics record, in GB (1e9 bytes).

    ``memory/rss_gb``: resident now; ``memory/peak_rss_gb``: the process's resident peak so far
    (``VmHWM``; ``ru_maxrss`` where there is no ``/proc``); on CUDA, ``memory/cuda_peak_gb``:
    the most allocated since the last :func:`reset_device_peak`."""
    out: dict[str, float] = {}
    now, peak = status_bytes("VmRSS"), status_bytes("VmHWM")
    if now is not None:
        out["memory/rss_gb"] = now / 1e9
    if peak is None:
        try:
            import resource

            scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
        except (ImportError, OSError):
            peak = None
    if peak is not None:
        out["memory/peak_rss_gb"] = peak / 1e9
    if device.type == "cuda":
        out["memory/cuda_peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return out


def reset_device_peak(device: torch.device) -> None:
    """Start a new CUDA peak for :func:`memory_metrics` (elsewhere nothing)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


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
        heap_reuse: whether :func:`keep_heap_pages` was applied (config ``heap_reuse``);
            where not, the update trims the heap every few layers (:func:`heap_trims`) and
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


def run_path(config: TrainConfig) -> Path:
    """The run directory ``config`` names: ``resume``, else ``out``, else
    ``runs/<time>-<estimator>-s<seed>``."""
    if config.resume:
        return Path(config.resume)
    if config.out:
        return Path(config.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{config.estimator}-s{config.seed}"


def open_run(config: TrainConfig, runtime: Runtime, optimizer: torch.optim.Optimizer,
             path: str | Path | None = None) -> tuple[RunDir, int]:
    """The run directory of ``config``, locked for this process, and the step it continues
    after: a new one (``out``, refusing any folder whose files it would overwrite; its
    ``run.json`` records a new ``run_id`` and the :func:`data_fingerprint`), or, with
    ``resume``, the existing run with its newest intact checkpoint loaded into the policy and
    ``optimizer`` (RNG states restored, logs after that step dropped).

    A resume is refused (``ValueError``, naming what differs) when the data differ from what
    the run started with, when the checkpoint was written by another run, or when the config
    differs from the one the checkpoint was trained with beyond :data:`RESUMABLE`."""
    path = Path(path) if path is not None else run_path(config)
    if config.resume:
        run = RunDir(path)
        if not run.path.is_dir():
            raise ValueError(f"resume: {run.path} does not exist")
        run.lock()
        try:
            checkpoint = run.latest_checkpoint(verify=True)
            if checkpoint is None:
                raise ValueError(f"resume: {run.path} has no intact checkpoint to resume from")
            _check_resume(run, checkpoint, config, runtime.task)
            from gear_rl.train.checkpoint import load_checkpoint, set_rng_state

            state = load_checkpoint(checkpoint, runtime.model, optimizer)
            set_rng_state(state["rng"])
            runtime.sync_sampler()
            step = int(state["step"])
            run.truncate_logs(step)
            _record_resume(run, runtime, step)
            saved = upgrade_recorded_config(run.read_config())
            if saved.get("steps") != config.steps:  # keep config.yaml the run's truth
                run.write_config({**saved, "steps": config.steps})
        except BaseException:
            run.unlock()
            raise
        return run, step
    run = RunDir(path)
    run.claim_new()
    try:
        resolved = config_to_dict(config)
        resolved["out"] = str(run.path)
        run.create(resolved, {
            "engine": "gear-rl", "run_id": uuid.uuid4().hex,
            "data": data_fingerprint(config, runtime.task),
            "task": runtime.task.name, "train_problems": len(runtime.task.train),
            "eval_problems": len(runtime.task.eval), "device": str(runtime.device),
            "cpu": cpu_model(), "autocast_bf16": runtime.autocast,
            "sampler_dtype": str(next(runtime.sampler.parameters()).dtype),
            "parameters": sum(p.numel() for p in runtime.model.parameters()),
            "torch": torch.__version__, "argv": sys.argv,
            "sandbox_not_enforced": (None if runtime.sandbox is None
                                     else runtime.sandbox.not_enforced),
        })
    except BaseException:
        run.unlock()
        raise
    return run, 0


RESUMABLE = ("steps", "threads", "device", "log.", "eval.every", "resume", "out")
"""The config keys (dotted prefixes) a resumed run may change: anything else would make the
continued run a different run (``out`` may only name the run's own folder)."""


def config_differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The keys outside :data:`RESUMABLE` where two configs (``config_to_dict`` dicts, or what
    ``config.yaml`` / a checkpoint's ``state.json`` hold) differ, as ``"key: A, then B"``. Both
    are read as this version reads a run's config: an option added since counts as its
    default, a credit default changed since as its old value (``upgrade_recorded_config``)."""
    def normal(data: dict[str, Any]) -> dict[str, Any]:
        return flatten_keys(json.loads(json.dumps(recorded_config_dict(data), default=str)))

    first, second = normal(before), normal(after)
    return [f"{key}: {first.get(key)!r}, then {second.get(key)!r}"
            for key in sorted(first.keys() | second.keys())
            if not key.startswith(RESUMABLE) and first.get(key) != second.get(key)]


def _problems_digest(problems: Sequence[Problem]) -> dict[str, Any]:
    rows = [[p.id, p.prompt, p.answer, p.reference, p.reference_kind] for p in problems]
    text = json.dumps(rows, sort_keys=True, default=str)
    return {"count": len(rows), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def _data_files(config: TrainConfig) -> dict[str, Path]:
    """The data files ``config`` makes a run read, by the key that names them: ``task`` (a
    dataset file, or ``toolrl:PATH``), ``eval_data``, and any ``task_options`` value that names
    a file."""
    named: list[tuple[str, Any]] = [
        ("task", text) for text in {config.task, config.task.partition(":")[2]}
        if text.endswith(SUFFIXES)]
    named.append(("eval_data", config.eval_data))
    named.extend((f"task_options.{key}", value)
                 for key, value in flatten_keys(config.task_options).items())
    return {key: Path(value).expanduser() for key, value in named
            if isinstance(value, str) and value and Path(value).expanduser().is_file()}


def data_fingerprint(config: TrainConfig, task: Task) -> dict[str, Any]:
    """What a run trains and evaluates on, as ``run.json`` records it (``data``) for a resume
    to check: the path, size and SHA-256 of every data file ``config`` names (``files``, by
    key: ``task``, ``eval_data``, ``task_options.KEY``), and the count and a digest of the
    ``train`` and ``eval`` problems as loaded (ids, prompts, answers, references), which also
    covers generated tasks."""
    files = {key: {"path": str(path.resolve()), "size": path.stat().st_size,
                   "sha256": file_sha256(path)} for key, path in _data_files(config).items()}
    return {"files": files, "train": _problems_digest(task.train),
            "eval": _problems_digest(task.eval)}


def _data_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How the data now (:func:`data_fingerprint`) differ from those recorded."""
    changes = []
    then_files, now_files = recorded.get("files", {}), current["files"]
    for key in sorted(then_files.keys() | now_files.keys()):
        then, now = then_files.get(key), now_files.get(key)
        if then is None:
            changes.append(f"{key}={now['path']} was not read when the run started")
        elif now is None:
            changes.append(f"{key}={then['path']} is no longer read")
        elif (then["size"], then["sha256"]) != (now["size"], now["sha256"]):
            changes.append(f"{key}={now['path']} changed since the run started ({then['size']} "
                           f"bytes, sha256 {then['sha256'][:12]}... then; {now['size']} bytes, "
                           f"sha256 {now['sha256'][:12]}... now)")
    for split, what in (("train", "training"), ("eval", "held-out")):
        then, now = recorded.get(split), current[split]
        if then is not None and then != now:
            changes.append(f"the {now['count']} {what} problems loaded now differ from the "
                           f"{then['count']} the run started with")
    return changes


def _record_resume(run: RunDir, runtime: Runtime, step: int) -> None:
    """Add this resume's processor and precision to ``run.json`` (:meth:`RunDir.
    record_resume`), with a warning where they differ from where the run trained last."""
    before = trained_on(run.read_info())
    facts = {"step": step, "device": str(runtime.device), "cpu": cpu_model(),
             "autocast_bf16": runtime.autocast,
             "sampler_dtype": str(next(runtime.sampler.parameters()).dtype),
             "torch": torch.__version__}
    here = machine_label(facts)
    if before and before[-1] != here:
        warnings.warn(f"resume: {run.path} trained up to step {step} on {before[-1]} and "
                      f"continues on {here}: the same weights sample differently under another "
                      "precision (and can on another processor), so the rest of the run is not "
                      "what an uninterrupted run would have trained; run.json records both "
                      "(resumes), and gear-rl study and compare name such runs", stacklevel=3)
    run.record_resume(facts)


def _check_resume(run: RunDir, checkpoint: Path, config: TrainConfig, task: Task) -> None:
    """Refuse to resume ``run`` from ``checkpoint`` on other data, from another run's
    checkpoint, or with another config than the checkpoint's (see :func:`open_run`)."""
    from gear_rl.train.checkpoint import checkpoint_identity

    info = run.read_info()
    recorded = info.get("data")
    if recorded is None:
        warnings.warn(f"resume: {run.path}/run.json records no data fingerprint (a run started "
                      "by an older gear-rl): the data cannot be checked against what the run "
                      "started with", stacklevel=3)
    else:
        changes = _data_changes(recorded, data_fingerprint(config, task))
        if changes:
            raise ValueError(f"resume: {run.path} was started on other data: "
                             f"{'; '.join(changes)}. A resumed run trains and evaluates on the "
                             "data it started with: restore them, or train a new run (another "
                             "out=) on the new data")
    identity = checkpoint_identity(checkpoint)
    saved = identity.get("config")
    differences = ([] if saved is None
                   else config_differences(saved, config_to_dict(config)))
    ours, theirs = info.get("run_id"), identity.get("run_id")
    if ours and theirs and ours != theirs:
        written = (saved or {}).get("out") or "another folder"
        raise ValueError(f"resume: {checkpoint} was written by another run ({written}, run id "
                         f"{theirs}), not by {run.path} (run id {ours})"
                         + (f"; it differs in {'; '.join(differences)}" if differences else "")
                         + ": a run resumes only from its own checkpoints; remove them, or "
                         "resume the run they belong to")
    if differences:
        raise ValueError(f"resume: {run.path}/config.yaml differs from the config "
                         f"{checkpoint.name} was trained with ({'; '.join(differences)}, "
                         "checkpoint first): restore config.yaml; a resumed run may change only "
                         "steps, threads, device, log.* and eval.every")


def resume_config(run_dir: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """The saved config of ``run_dir`` with ``resume`` set; ``overrides`` may change only
    ``steps``, ``threads``, ``device``, ``log.*`` and ``eval.every`` (:data:`RESUMABLE`;
    anything else would make the continued run a different run), and may repeat any other
    key with the run's own value; ``out`` may only name the run's own folder."""
    run = RunDir(run_dir)
    if not run.is_run():
        raise ValueError(f"resume: {run_dir} has no config.yaml (not a gear-rl run directory)")
    config = recorded_config(run.read_config())
    out = (overrides or {}).get("out")
    if out is not None and Path(str(out)).resolve() != run.path.resolve():
        raise ValueError(f"resume: a resumed run stays in its own folder ({run.path}); drop "
                         f"out={out}")
    saved = config_to_dict(config)
    config_from_dict(dict(overrides or {}), config)
    changed = config_differences(saved, config_to_dict(config))
    if changed:
        raise ValueError(f"resume: {changed[0].split(':')[0]!r} cannot change when resuming "
                         f"(the run's value, then the one given: {'; '.join(changed)}); only "
                         "steps, threads, device, log.* and eval.every can")
    config.resume = str(run_dir)
    config.out = str(run_dir)
    config.validate()
    return config


def run_evaluation(config: TrainConfig, runtime: Runtime) -> dict[str, Any]:
    """Held-out Mean@k / pass@k of ``runtime``'s sampler with ``config.eval``'s settings
    (training and ``gear-rl eval`` alike)."""
    from gear_rl.train.evaluate import evaluate

    settings = config.eval
    sampling = sampling_params(settings, runtime)
    if task_turns(runtime.task) is not None:
        # a multi-turn episode's KV cache spans its whole context (prompt, turns and
        # observations): decode no more rows at once than a training rollout does (on
        # tool-math, 128 rows of it held 1.35 GB); these tasks are paired by problem only
        rollout_rows = config.rollout.prompts_per_step * config.rollout.samples_per_prompt
        batch_size = sampling.batch_size
        sampling = replace(sampling, batch_size=rollout_rows if batch_size is None
                           else min(batch_size, rollout_rows))
    return evaluate(runtime.sampler, runtime.tokenizer, runtime.task, sampling=sampling,
                    k=settings.k, seed=settings.seed,
                    limits=agent_limits(config, runtime.task, evaluation=True),
                    sandbox=runtime.sandbox, reuse_cache=config.agent.reuse_kv_cache)


def evaluate_model(config: TrainConfig, checkpoint: str | Path | None = None) -> dict[str, Any]:
    """Held-out Mean@k / pass@k of ``config.model`` (or of a checkpoint: a run directory, whose
    newest intact checkpoint is used, or a ``checkpoints/step-N`` folder) on ``config.task``
    with the ``config.eval`` settings. Returns :func:`gear_rl.train.evaluate.evaluate`'s dict,
    with ``checkpoint_folder`` and ``checkpoint_step``: the checkpoint scored (None for
    ``config.model``'s own weights)."""
    runtime = build_runtime(config, checkpoint=checkpoint, training=False)
    try:
        result = run_evaluation(config, runtime)
    finally:
        runtime.close()
    return {**result, "checkpoint_folder": None if runtime.checkpoint is None
            else str(runtime.checkpoint), "checkpoint_step": runtime.checkpoint_step}
