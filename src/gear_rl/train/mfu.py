"""How close to the hardware the update runs: its model FLOPs utilisation (MFU), as nanoGPT
prints it, against this machine's measured matmul peak at the run's precision.

**The count** (:func:`pass_flops`, :class:`ModelShape`). A pass over rows of ``P`` prompt and
``R`` response tokens costs, per token the backbone runs, ``2 N`` FLOPs forward (``N``: the
decoder's parameters without the embedding tables and the LM head, one multiply-add per weight
and token), plus causal attention, ``4 L d`` per (query, key) pair (``QK^T`` and ``AV``; ``L``
layers, ``d`` = heads x head size; a position attends to itself and its prefix), plus the LM
head, ``2 H V`` per position it scores (the response positions only: the signal pass runs the
head there and nowhere else). A pass with gradients costs three times its forward (backward:
twice), the ``6N + 12 L d T`` of nanoGPT's ``estimate_mfu`` and of PaLM's appendix B, with the
attention term counted over the causal prefix instead of the full context and the head over
the positions it runs on. Model FLOPs only: activation checkpointing's recomputation, padding
and the no-grad prefix a shared prompt skips are not counted. A prompt shared by its group's
rows (``loss.share_prompts``) runs once and counts once; the responses then attend to it.

The update's count (:meth:`gear_rl.train.update.UpdateEngine.run`) is every micro-batch's
student pass with gradients, plus, where the update's forward runs the teacher (self-
distillation, or fused scoring with an estimator that reads the teacher), the teacher's no-grad
pass over the taught rows; a reference model's log-probs come from the scoring pass, outside
the update.

**The peak** (:func:`matmul_peak`). ``[M, K] @ [K, N]`` matmuls shaped as the model's MLP
projection (``M`` = 1,024 token rows, ``K`` = hidden size, ``N`` = the MLP's inner size) in the
run's precision (bf16 under autocast, else fp32), on the run's device and thread count, timed
one call at a time for about a second: the fastest call (on a shared machine the one least
slowed by the neighbours; the load average is recorded beside it). Measured in a child
process, so that the run's own heap (whose pages the trainer keeps for reuse), thread pool and
oneDNN caches are as they would be without it. Measured once per machine and cached in
:func:`gear_rl.models.cache_root` (``matmul_peak.json``), keyed by the processor (model name
and feature flags, or the CUDA device), torch's version, the precision, the thread count and
the shape; an unreadable or corrupt cache is measured again and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["PEAK_CACHE", "ModelShape", "matmul_peak", "pass_flops", "peak_key"]

PEAK_CACHE = "matmul_peak.json"
"""The file, under :func:`gear_rl.models.cache_root`, that caches :func:`matmul_peak`."""

PEAK_ROWS = 1024  # token rows of the timed matmul: a micro-batch's order of magnitude


@dataclass(frozen=True)
class ModelShape:
    """What :func:`pass_flops` needs of a decoder-only model.

    Attributes:
        body: ``N``, the parameters a token's backbone pass multiplies (the decoder layers and
            the final norm: every parameter but the input embeddings and the LM head).
        layers: ``L``. attention: ``d``, heads x head size (the width of ``QK^T`` and ``AV``).
        hidden: ``H``, the LM head's input. vocab: ``V``, its output.
        inner: the MLP's inner size (the peak's matmul shape).
    """

    body: int
    layers: int
    attention: int
    hidden: int
    vocab: int
    inner: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        """The shape of a Hugging Face causal LM (``model.config``: ``num_hidden_layers``,
        ``num_attention_heads``, ``head_dim`` or ``hidden_size / heads``,
        ``intermediate_size``)."""
        config: Any = model.config
        head = model.get_output_embeddings()  # type: ignore[operator]
        embeddings = model.get_input_embeddings()  # type: ignore[operator]
        outside = {id(p) for module in (head, embeddings) for p in module.parameters()}
        body = sum(p.numel() for p in model.parameters() if id(p) not in outside)
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(body=body, layers=int(config.num_hidden_layers), attention=heads * head_dim,
                   hidden=int(head.in_features), vocab=int(head.out_features),
                   inner=int(getattr(config, "intermediate_size", 4 * config.hidden_size)))


def pass_flops(shape: ModelShape, prompts: Sequence[Sequence[int]],
               responses: Sequence[Sequence[int]], *, gradients: bool,
               share_prompts: bool = False) -> float:
    """Model FLOPs of one pass of ``shape`` over rows of ``prompts[b]`` then ``responses[b]``
    (token id lists), the head on the response positions; ``gradients``: forward and backward
    (3x the forward); ``share_prompts``: equal prompts run (and count) once. The count is the
    module docstring's."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
    tokens = pairs = positions = 0
    seen: set[tuple[int, ...]] = set()
    for prompt, response in zip(prompts, responses, strict=True):
        p, r = len(prompt), len(response)
        key = tuple(prompt)
        if not share_prompts or key not in seen:
            seen.add(key)
            tokens += p
            pairs += p * (p + 1) // 2
        tokens += r
        pairs += r * p + r * (r + 1) // 2
        positions += r
    forward = 2.0 * (shape.body * tokens + 2 * shape.layers * shape.attention * pairs
                     + shape.hidden * shape.vocab * positions)
    return 3.0 * forward if gradients else forward


def peak_key(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int]) -> str:
    """The cache key of a peak: processor (model name and a digest of its flags, or the CUDA
    device's name), torch's version, ``dtype``, torch's thread count and the matmul ``shape``
    ``(M, K, N)``."""
    from gear_rl.rundir import cpu_flags, cpu_model

    if device.type == "cuda":
        processor = torch.cuda.get_device_name(device)
    else:
        flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
        processor = f"{cpu_model()} (flags {flags})"
    m, k, n = shape
    return (f"{processor} | torch {torch.__version__} | {str(dtype).removeprefix('torch.')} | "
            f"{torch.get_num_threads()} threads | {m}x{k}x{n}")


def _measure(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int],
             seconds: float) -> float:
    """FLOP/s of the fastest of many timed calls of ``[M, K] @ [K, N]`` (``2 M K N`` FLOPs
    each), after a warm-up; about ``seconds`` in all, in this process."""
    m, k, n = shape
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):  # warm-up: kernels chosen, pages touched
        torch.matmul(a, b, out=out)
    sync()
    best, end = math.inf, time.perf_counter() + seconds
    for calls in range(100_000):
        mark = time.perf_counter()
        torch.matmul(a, b, out=out)
        sync()
        now = time.perf_counter()
        best = min(best, now - mark)
        if now > end and calls >= 10:
            break
    return 2.0 * m * k * n / max(best, 1e-9)


_CHILD = """
import sys, torch
from gear_rl.train.mfu import _measure
device, dtype, m, k, n, threads, seconds = sys.argv[1:]
torch.set_num_threads(int(threads))
print(_measure(torch.device(device), getattr(torch, dtype), (int(m), int(k), int(n)),
               float(seconds)))
"""


def _measure_apart(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int],
                   seconds: float) -> float:
    """:func:`_measure` in a child process (this interpreter, this ``sys.path``, torch's
    thread count here), leaving this process's memory and caches untouched."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    args = [str(device), str(dtype).removeprefix("torch."), *map(str, shape),
            str(torch.get_num_threads()), str(seconds)]
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], env=env, capture_output=True,
                          text=True, timeout=300 + 10 * seconds, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measuring the matmul peak failed: {done.stderr.strip()[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def matmul_peak(device: torch.device, dtype: torch.dtype, shape: ModelShape, *,
                path: str | Path | None = None, seconds: float = 1.0) -> float:
    """This machine's matmul throughput in FLOP/s at ``dtype`` for a GEMM shaped as
    ``shape``'s MLP (module docstring): read from the cache ``path`` (default
    ``cache_root() / PEAK_CACHE``) under :func:`peak_key`, else measured in a child process
    (about ``seconds``, plus the child's start) and added to it. A cache that cannot be read
    or parsed is measured again and rewritten; one that cannot be written leaves the
    measurement uncached."""
    from gear_rl.models import cache_root
    from gear_rl.rundir import atomic_write_text

    file = Path(path) if path is not None else cache_root() / PEAK_CACHE
    gemm = (PEAK_ROWS, shape.hidden, shape.inner)
    key = peak_key(device, dtype, gemm)
    cache: dict[str, Any] = {}
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            cache = loaded
    except (OSError, ValueError):
        pass
    entry = cache.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("flops_per_s"), (int, float)) \
            and math.isfinite(entry["flops_per_s"]) and entry["flops_per_s"] > 0:
        return float(entry["flops_per_s"])
    peak = _measure_apart(device, dtype, gemm, seconds)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cache[key] = {"flops_per_s": peak, "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "load_average": load}
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(file, json.dumps(cache, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass
    return peak
