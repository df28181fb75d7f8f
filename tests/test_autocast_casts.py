"""Under bf16 autocast the gradient passes drop autocast's cached bf16 copies of the decoder
layers' weights once the backbone has run (``divergence._drop_backbone_casts``): the LM-head
chunks no longer run beside a 16-bit copy of every layer (0.21 GB on SmolLM2-135M, the
tool-math update forward's peak on AVX-512 machines), with the same values and gradients bit
for bit; the trainer's heap trims then hand their pages back before the LM head."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gear_rl.models import tiny_random_model
from gear_rl.signals import divergence as divergence_module
from gear_rl.signals import response_logprobs, token_signals

pytestmark = pytest.mark.usefixtures("one_thread")

GROUPS = (0, 1, 0, 2, 1, 0)  # repeated prompts: the shared-prompt pass reads each layer twice


def _model():
    return tiny_random_model("llama", vocab_size=301, initializer_range=0.3, seed=1,
                             num_layers=3, tie_word_embeddings=True)


def _batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(0, 301, (n,), generator=generator).tolist()

    prompts = [ids(n) for n in (6, 9, 1)]
    teachers = [ids(n) for n in (11, 4, 7)]
    responses = [ids(n) for n in (7, 12, 1, 9, 3, 5)]
    return ([prompts[g] for g in GROUPS], [teachers[g] for g in GROUPS], responses)


class _LayerCasts(TorchDispatchMode):
    """Weak references to the bf16 copies autocast makes of the decoder layers' weights."""

    def __init__(self, weights: set[int]) -> None:
        super().__init__()
        self.weights, self.copies = weights, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func is torch.ops.aten._to_copy.default and id(args[0]) in self.weights
                and out.dtype == torch.bfloat16):
            self.copies.append(weakref.ref(out))
        return out


def _run(kind: str, model, prompts, teachers, responses, **options):
    if kind == "signals":
        sig = token_signals(model, prompts, teachers, responses, chunk_size=5,
                            temperature=0.7, student_requires_grad=True,
                            divergence_requires_grad=False, entropy_requires_grad=False,
                            **options)
        return sig.student_logprobs, sig.entropy, sig.divergence
    own = response_logprobs(model, prompts, responses, chunk_size=5, temperature=0.7,
                            requires_grad=True, entropy_requires_grad=False, **options)
    return own.logprobs, own.entropy


@pytest.mark.parametrize("kind", ["signals", "logprobs"])
def test_layer_casts_are_gone_before_the_lm_head(kind):
    """When the LM head first runs, no bf16 copy of a decoder layer's weight is alive (before
    the change autocast's cache held all of them until the autocast block's end)."""
    model = _model()
    prompts, teachers, responses = _batch()
    layer_weights = {id(p) for p in model.base_model.layers.parameters()}
    alive_at_head: list[int] = []
    mode = _LayerCasts(layer_weights)

    def count(_module, _args):
        if not alive_at_head:
            alive_at_head.append(sum(ref() is not None for ref in mode.copies))

    handle = model.get_output_embeddings().register_forward_pre_hook(count)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16), mode:
            _run(kind, model, prompts, teachers, responses, share_prompts=True,
                 checkpoint_layers=True)
    finally:
        handle.remove()
    assert mode.copies, "autocast made no bf16 copies of the layers' weights"
    assert alive_at_head == [0], (alive_at_head, len(mode.copies))


@pytest.mark.parametrize("kind", ["signals", "logprobs"])
@pytest.mark.parametrize(("share", "checkpointed"), [(True, True), (False, True), (True, False)])
def test_dropping_the_casts_changes_no_value_or_gradient(monkeypatch, kind, share, checkpointed):
    """Under bf16 autocast, the same outputs and parameter gradients bit for bit as with the
    cache kept (the LM head's copy is still one cast shared by every chunk, and each layer's
    one cast shared by the prompt and response passes)."""
    model = _model()
    prompts, teachers, responses = _batch(seed=3)
    weights = torch.rand(len(responses), max(len(r) for r in responses),
                         generator=torch.Generator().manual_seed(5)) - 0.5
    runs = []
    for drop in (True, False):
        if not drop:
            monkeypatch.setattr(divergence_module, "_drop_backbone_casts", lambda _grad: None)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = _run(kind, model, prompts, teachers, responses, share_prompts=share,
                        checkpoint_layers=checkpointed)
        loss = (outs[0] * weights).sum()
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        runs.append((outs, grads))
    (outs_a, grads_a), (outs_b, grads_b) = runs
    for got, want in zip(outs_a, outs_b, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert any(g is not None and g.abs().max() > 0 for g in grads_b)
    for got, want in zip(grads_a, grads_b, strict=True):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_heap_trims_once_before_the_lm_head(monkeypatch):
    """``heap_trims(..., head=)``: a forward with gradients trims the heap once more, before
    the head's first call after the layers (where the gradient passes have just dropped the
    layers' bf16 copies), not before the next calls until layers run again; a forward without
    gradients does not trim; the values and gradients are the plain model's."""
    import gear_rl.train.memory as memory

    calls: list[str] = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: calls.append("trim"))
    model = tiny_random_model("llama", vocab_size=64, seed=3, num_layers=5)
    head = model.get_output_embeddings()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    want = model(input_ids=ids).logits
    want.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    order: list[str] = []
    handle = head.register_forward_pre_hook(lambda _m, _a: order.append(f"head{len(calls)}"))
    try:
        with memory.heap_trims(model.base_model.layers, every=2, head=head):
            with torch.no_grad():
                model(input_ids=ids)
            assert calls == []
            got = model(input_ids=ids).logits
            assert len(calls) == 4  # layers 0, 2 and 4, then the head
            head(torch.zeros(2, head.in_features))  # a second chunk: no layer ran since
            assert len(calls) == 4
            got.sum().backward()
            assert len(calls) == 7  # the backward at layers 4, 2 and 0
    finally:
        handle.remove()
    assert order == ["head0", "head3", "head4"]  # the probe runs before the trim
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    for grad, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, grad, atol=0, rtol=0)
