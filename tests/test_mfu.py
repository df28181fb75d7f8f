"""The update's model FLOPs utilisation (gear_rl.train.mfu): the FLOPs count, the measured
matmul peak and its cache, and the MFU a tiny run logs and summarises."""

from __future__ import annotations

import json
import math

import pytest
import torch

import gear_rl.train.mfu as mfu
from conftest import tiny_trainer
from gear_rl.models import tiny_random_model
from gear_rl.train.mfu import ModelShape, matmul_peak, pass_flops, peak_key
from gear_rl.train.records import format_summary

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = ModelShape(body=10, layers=2, attention=4, hidden=3, vocab=5, inner=6)


def test_pass_flops_counts_body_causal_attention_and_the_head_on_responses() -> None:
    # one row, prompt 2 + response 3: 5 backbone tokens; causal pairs 1+2+3+4+5 = 15; the head
    # on the 3 response positions
    forward = 2 * (10 * 5 + 2 * 2 * 4 * 15 + 3 * 5 * 3)
    assert pass_flops(SHAPE, [[1, 2]], [[3, 4, 5]], gradients=False) == forward
    assert pass_flops(SHAPE, [[1, 2]], [[3, 4, 5]], gradients=True) == 3 * forward
    # a shared prompt runs and counts once; its responses still attend to it
    two = pass_flops(SHAPE, [[1, 2], [1, 2]], [[3, 4, 5], [6]], gradients=False)
    shared = pass_flops(SHAPE, [[1, 2], [1, 2]], [[3, 4, 5], [6]], gradients=False,
                        share_prompts=True)
    second_prompt = 2 * (10 * 2 + 2 * 2 * 4 * 3)  # its 2 tokens and their 3 causal pairs
    assert two - shared == second_prompt
    assert pass_flops(SHAPE, [], [], gradients=True) == 0.0
    with pytest.raises(ValueError, match="2 prompts for 1 responses"):
        pass_flops(SHAPE, [[1], [2]], [[3]], gradients=False)


def test_model_shape_of_a_llama_model() -> None:
    model = tiny_random_model("llama", vocab_size=64, seed=3, num_layers=3)
    shape = ModelShape.of(model)
    config = model.config
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    layers = sum(p.numel() for p in model.model.layers.parameters())
    assert shape.body == layers + model.model.norm.weight.numel()
    assert shape.body + embeddings.weight.numel() + (
        0 if head.weight is embeddings.weight else head.weight.numel()) == sum(
        p.numel() for p in model.parameters())
    assert (shape.layers, shape.hidden, shape.vocab) == (3, config.hidden_size, 64)
    assert shape.attention == config.num_attention_heads * (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _counting(monkeypatch) -> list[tuple]:
    """Count the real measurements matmul_peak makes (each in its child process)."""
    calls: list[tuple] = []
    real = mfu._measure_apart

    def measure(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(mfu, "_measure_apart", measure)
    return calls


def test_the_peak_is_measured_once_and_cached_per_key(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "peak.json"
    calls = _counting(monkeypatch)
    cpu = torch.device("cpu")
    first = matmul_peak(cpu, torch.float32, SHAPE, path=cache, seconds=0.05)
    assert first > 0 and math.isfinite(first) and len(calls) == 1
    key = peak_key(cpu, torch.float32, (mfu.PEAK_ROWS, SHAPE.hidden, SHAPE.inner))
    assert json.loads(cache.read_text())[key]["flops_per_s"] == first
    assert matmul_peak(cpu, torch.float32, SHAPE, path=cache, seconds=0.05) == first
    assert len(calls) == 1  # reused
    # another key: precision, thread count, matmul shape each measure again
    matmul_peak(cpu, torch.bfloat16, SHAPE, path=cache, seconds=0.05)
    torch.set_num_threads(2)  # the one_thread fixture restores the count
    matmul_peak(cpu, torch.float32, SHAPE, path=cache, seconds=0.05)
    torch.set_num_threads(1)
    wider = ModelShape(body=10, layers=2, attention=4, hidden=8, vocab=5, inner=6)
    matmul_peak(cpu, torch.float32, wider, path=cache, seconds=0.05)
    assert len(calls) == 4
    assert len(json.loads(cache.read_text())) == 4
    assert "threads" in key and "float32" in key and torch.__version__ in key


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"KEY": {"flops_per_s": "fast"}}',
                                  '{"KEY": {"flops_per_s": -1}}', ""])
def test_a_corrupt_cache_is_measured_again(tmp_path, monkeypatch, text) -> None:
    cache = tmp_path / "peak.json"
    cpu = torch.device("cpu")
    key = peak_key(cpu, torch.float32, (mfu.PEAK_ROWS, SHAPE.hidden, SHAPE.inner))
    cache.write_text(text.replace("KEY", key))
    calls = _counting(monkeypatch)
    peak = matmul_peak(cpu, torch.float32, SHAPE, path=cache, seconds=0.05)
    assert len(calls) == 1 and peak > 0
    assert json.loads(cache.read_text())[key]["flops_per_s"] == peak


def test_a_tiny_run_logs_and_summarises_its_update_mfu(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GEAR_RL_CACHE", str(tmp_path / "cache"))  # the test's own peak
    trainer = tiny_trainer(tmp_path / "run", "steps=2")
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    assert (tmp_path / "cache" / mfu.PEAK_CACHE).is_file()
    records = [r for r in trainer.history if "reward_mean" in r]
    values = [r["perf/update_mfu"] for r in records]
    assert len(values) == 2 and all(math.isfinite(v) and 0 < v <= 1.5 for v in values), values
    assert summary["update_mfu"] == pytest.approx(sum(values) / 2)
    assert summary["matmul_peak_dtype"] in ("bfloat16", "float32")
    assert summary["matmul_peak_tflops"] == pytest.approx(trainer.matmul_peak / 1e12)
    assert "update MFU" in format_summary(summary)
