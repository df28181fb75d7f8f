"""``release_free_memory``: the trainer hands the heap's free pages back between phases."""

from __future__ import annotations

import ctypes
import sys

import pytest

from gear_rl.train.memory import release_free_memory, status_bytes


def _rss_mb() -> float:
    return (status_bytes("VmRSS") or 0) / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap only")
def test_freed_heap_pages_go_back_to_the_os() -> None:
    """Blocks under glibc's mmap threshold live on the heap; freeing them (with a live block
    above them, so free cannot shrink the heap's top itself) leaves their pages resident until
    release_free_memory returns them."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "malloc_trim"):
        pytest.skip("not glibc")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 3200  # 200 MiB in blocks far below the mmap threshold
    release_free_memory()
    blocks = []
    for _ in range(count):
        block = libc.malloc(size)
        assert block
        ctypes.memset(block, 1, size)  # touch every page: resident
        blocks.append(block)
    guard = libc.malloc(size)  # keeps the heap's top in use
    ctypes.memset(guard, 1, size)
    for block in blocks:
        libc.free(block)
    held = _rss_mb()
    release_free_memory()
    released = _rss_mb()
    libc.free(guard)
    assert held - released > 150, (held, released)


_REUSE_PROBE = """
import ctypes, resource, sys
from gear_rl.train.memory import keep_heap_pages
if sys.argv[1] == "keep":
    assert keep_heap_pages()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 96 * 2**20  # above glibc's largest dynamic mmap threshold (32 MiB)
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(max(faults[1:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap only")
def test_keep_heap_pages_reuses_large_blocks() -> None:
    """By default glibc maps a 96 MiB block afresh each time (every page faulted in again);
    after keep_heap_pages the heap keeps it and the next allocations reuse its pages. Each case
    in its own process: the setting is process-wide."""
    import subprocess

    if not hasattr(ctypes.CDLL(None), "mallopt"):
        pytest.skip("not glibc")
    pages = 96 * 2**20 // 4096

    def probe(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _REUSE_PROBE, mode], capture_output=True,
                              text=True, check=True)
        return int(done.stdout.strip().splitlines()[-1])

    assert probe("default") > pages // 2  # every later allocation faults its pages in again
    assert probe("keep") < pages // 20  # reused: (almost) no new faults


@pytest.mark.parametrize(("task", "overrides", "applied"), [
    (None, (), True),  # single-turn (the toy task): on by default
    ("config", ("task=sokoban",), False),  # multi-turn: off by default (memory)
    ("config", ("task=sokoban", "heap_reuse=true"), True),
    (None, ("heap_reuse=false",), False),
])
def test_heap_reuse_default_follows_the_task(tmp_path, monkeypatch, task, overrides,
                                             applied) -> None:
    import gear_rl.train.runtime as runtime
    from conftest import tiny_trainer

    calls: list[bool] = []
    monkeypatch.setattr(runtime, "keep_heap_pages", lambda: calls.append(True) or True)
    trainer = tiny_trainer(tmp_path / "run", *overrides, task=task)
    trainer.close()
    assert bool(calls) == applied
    assert trainer.runtime.heap_reuse is applied  # off: the update trims every few layers


def test_heap_trims_every_few_layers_forward_and_backward(monkeypatch) -> None:
    """heap_trims: a forward with gradients trims after every ``every``-th layer and its
    backward again at those layers; a forward without gradients does not trim; after the
    block the hooks are gone; the outputs and gradients are those of the plain model."""
    import torch

    import gear_rl.train.memory as memory
    from gear_rl.models import tiny_random_model

    calls: list[str] = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: calls.append("trim"))
    model = tiny_random_model("llama", vocab_size=64, seed=3, num_layers=5)
    layers = model.base_model.layers
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    want = model(input_ids=ids).logits
    want.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with memory.heap_trims(layers, every=2):
        with torch.no_grad():
            model(input_ids=ids)
        assert calls == []
        got = model(input_ids=ids).logits
        assert len(calls) == 3  # layers 0, 2 and 4
        got.sum().backward()
        assert len(calls) == 6
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    for grad, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, grad, atol=0, rtol=0)
    model(input_ids=ids).logits.sum().backward()
    assert len(calls) == 6


@pytest.mark.parametrize("reuse", [False, True])
def test_update_frees_the_sampler_copy_without_heap_reuse(tmp_path, monkeypatch, reuse) -> None:
    """Without heap reuse the bf16 sampler copy holds no weights while the update runs and
    gets them back after it, equal to the updated policy's cast to bf16 bit for bit; with heap
    reuse it is kept (and synced) as before."""
    import torch

    import gear_rl.train.runtime as runtime
    from conftest import tiny_trainer

    monkeypatch.setattr(runtime, "keep_heap_pages", lambda: True)  # process-wide otherwise
    trainer = tiny_trainer(tmp_path / "run", f"heap_reuse={str(reuse).lower()}",
                           "rollout.dtype=bf16")
    try:
        assert trainer.sampler is not trainer.model
        held: list[int] = []
        forward = trainer.engine.forward

        def spy(*args, **kwargs):
            held.append(sum(p.numel() for p in trainer.sampler.parameters()))
            return forward(*args, **kwargs)

        monkeypatch.setattr(trainer.engine, "forward", spy)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.step(1)
        total = sum(p.numel() for p in trainer.model.parameters())
        assert held and all(n == (total if reuse else 0) for n in held), held
        assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters(),
                                                         strict=True))
        for sampled, trained in zip(trainer.sampler.parameters(), trainer.model.parameters(),
                                    strict=True):
            assert sampled.dtype == torch.bfloat16
            assert torch.equal(sampled, trained.detach().to(torch.bfloat16))
    finally:
        trainer.close()


@pytest.mark.parametrize(("reuse", "growth", "trims"), [
    (False, 1.1, [3, 3, 3]),  # no heap reuse: after the rollout, the scoring and the update
    (True, 1.1, [0, 0, 0]),  # heap reuse: the pages stay for the next phase
    (True, 0.0, [0, 0, 3]),  # ... until the resident set outgrows the ceiling of step 2
])
def test_the_trainer_trims_between_phases_only_without_heap_reuse(tmp_path, monkeypatch,
                                                                  reuse, growth, trims) -> None:
    """Without heap reuse a step hands the heap's free pages back after the rollout, the
    scoring pass and the update. With it the heap keeps them for the next phase (a trim had
    every update page-fault its buffers in again), unless the resident set has grown past
    HEAP_GROWTH times the process's peak after its second step (here 0: any)."""
    import gear_rl.train.memory as memory_module
    import gear_rl.train.runtime as runtime
    from conftest import tiny_trainer

    # the setting is process-wide: the test's process keeps glibc's defaults
    monkeypatch.setattr(runtime, "keep_heap_pages", lambda: True)
    monkeypatch.setattr(memory_module, "HEAP_GROWTH", growth)
    trainer = tiny_trainer(tmp_path / "run", f"heap_reuse={str(reuse).lower()}",
                           "estimator=grpo")
    calls: list[str] = []  # who trimmed: the policy between phases, or heap_trims' hooks

    def spy() -> None:
        calls.append(sys._getframe(1).f_code.co_name)

    monkeypatch.setattr(memory_module, "release_free_memory", spy)
    counts, layer_trims = [], 0
    try:
        assert trainer.runtime.heap_reuse is reuse
        for step in (1, 2, 3):
            calls.clear()
            trainer.step(step)
            counts.append(calls.count("after_phase"))
            layer_trims += len(calls) - counts[-1]
    finally:
        trainer.close()
    assert counts == trims
    assert (layer_trims > 0) is not reuse  # the update's layer trims only without reuse
