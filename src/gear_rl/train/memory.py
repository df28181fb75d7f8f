"""The trainer's memory policy: when the heap hands pages back and when the sampler copy holds
weights. One owner, :class:`MemoryPolicy`, with two entry points: :meth:`~MemoryPolicy.
after_phase` (between a step's phases) and :meth:`~MemoryPolicy.update` (around the update).

The mechanisms are :mod:`gear_rl.train.runtime`'s (:func:`~gear_rl.train.runtime.
release_free_memory`, :func:`~gear_rl.train.runtime.heap_trims`, :func:`~gear_rl.train.runtime.
keep_heap_pages`, the sampler's release and sync); one more lives in the signal pass itself,
because every engine's gradient pass needs it: autocast's bf16 weight copies are dropped
before the LM head (``gear_rl.signals.divergence._drop_backbone_casts``), after which
:func:`~gear_rl.train.runtime.heap_trims` trims the heap where this policy asks for trims.
Measurements behind each choice: docs/speed.md.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from gear_rl.train.runtime import heap_trims, release_free_memory, status_bytes

if TYPE_CHECKING:
    from gear_rl.train.runtime import Runtime

__all__ = ["HEAP_CEILING_STEP", "HEAP_GROWTH", "RELEASE_AFTER", "MemoryPolicy"]

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
    decoder layers and before the LM head (:func:`~gear_rl.train.runtime.heap_trims`), and
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
