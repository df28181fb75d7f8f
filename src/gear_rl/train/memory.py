"""The trainer's memory: the heap's mechanisms, their policy, and the memory a step reports.

**Mechanisms.** :func:`release_free_memory` (glibc's ``malloc_trim``), :func:`keep_heap_pages`
(``mallopt``: the heap keeps freed pages for reuse), :func:`heap_trims` (trims inside a
gradient pass, every few decoder layers and before the LM head), and the sampler copy's
release and sync (:meth:`~gear_rl.train.runtime.Runtime.release_sampler`,
:meth:`~gear_rl.train.runtime.Runtime.sync_sampler`). One more lives in the signal pass itself,
because every engine's gradient pass needs it: autocast's bf16 weight copies are dropped
before the LM head (``gear_rl.signals.divergence._drop_backbone_casts``), after which
:func:`heap_trims` trims the heap where the policy asks for trims.

**Policy.** One owner, :class:`MemoryPolicy`, with two entry points: :meth:`~MemoryPolicy.
after_phase` (between a step's phases) and :meth:`~MemoryPolicy.update` (around the update).

**Measurements.** :func:`status_bytes`, :func:`memory_metrics` (a step's ``memory/*``
metrics) and :func:`reset_device_peak`. Measurements behind each choice: docs/speed.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from gear_rl.train.runtime import Runtime

__all__ = ["HEAP_CEILING_STEP", "HEAP_GROWTH", "HEAP_TRIM_LAYERS", "RELEASE_AFTER",
           "MemoryPolicy", "heap_trims", "keep_heap_pages", "memory_metrics",
           "release_free_memory", "reset_device_peak", "status_bytes"]


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
    the early steps' peak (:meth:`MemoryPolicy.after_phase`): the same pages serve every
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

# Heap reuse: the phases trim the heap only where the resident set exceeds HEAP_GROWTH times
# the peak after the process's HEAP_CEILING_STEP-th step (the second: the optimiser's moments
# and a whole update's buffers are in by then).
HEAP_CEILING_STEP = 2
HEAP_GROWTH = 1.1
# The phases after which the heap may hand pages back: the sampler's KV caches (rollout), the
# scoring pass's buffers (signals), activations and gradients (update), evaluation's caches.
# The credit's buffers are small and go with the update's.
RELEASE_AFTER = frozenset({"rollout", "signals", "update", "eval"})


class MemoryPolicy:
    """Decides, for one process's run, when memory goes back to the OS.

    Where the heap keeps its pages for reuse (``runtime.heap_reuse``, single-turn tasks by
    default): nothing is trimmed until the resident set outgrows :data:`HEAP_GROWTH` times the
    process's peak at the end of its :data:`HEAP_CEILING_STEP`-th step. Until then the next
    phase's buffers reuse the pages in place (a trim had every default-task update page-fault
    about 580k pages, 2.3 GB, in again), but freed blocks that later allocations do not fit
    keep their pages, so the resident set creeps up (about 35 MB a step on the default task),
    and the ceiling bounds that.

    Without heap reuse (multi-turn tasks, whose long rows make the update the run's peak):
    every phase in :data:`RELEASE_AFTER` trims, the update's gradient passes trim every few
    decoder layers and before the LM head (:func:`heap_trims`), and
    the sampler's bf16 copy gives its weights up while the update runs.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._ceiling: float | None = None
        self._steps = 0

    def after_phase(self, phase: str) -> None:
        """Called when a phase (``rollout``, ``signals``, ``credit``, ``update``, ``eval``)
        ends: trims the heap per the policy above; the end of ``update`` ends a step."""
        if phase in RELEASE_AFTER and self._should_trim():
            release_free_memory()
        if phase == "update":
            self._steps += 1
            if self._steps == HEAP_CEILING_STEP:
                peak = status_bytes("VmHWM")
                self._ceiling = None if peak is None else HEAP_GROWTH * peak

    def _should_trim(self) -> bool:
        if not self.runtime.heap_reuse:
            return True
        resident = status_bytes("VmRSS")
        return self._ceiling is not None and resident is not None and resident > self._ceiling

    @contextlib.contextmanager
    def update(self) -> Iterator[Callable[[], contextlib.AbstractContextManager]]:
        """Around the update: yields the context each gradient forward runs in (the layer
        trims without heap reuse, else nothing). Without heap reuse the sampler copy's weights
        are freed first; either way the sampler gets the updated weights at the end (also
        when the update fails)."""
        runtime = self.runtime
        model = runtime.model
        layers = getattr(getattr(model, "base_model", None), "layers", None)
        trims: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        if not runtime.heap_reuse:
            if layers is not None:
                trims = functools.partial(heap_trims, layers,
                                          head=model.get_output_embeddings())  # type: ignore[operator]
            runtime.release_sampler()
        try:
            yield trims
        finally:
            runtime.sync_sampler()
