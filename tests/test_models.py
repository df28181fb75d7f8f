"""Policy loading: tiny random models and tokenizer, local directories, the SmolLM2 cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from gear_rl.models import (
    build_tiny_tokenizer,
    cache_root,
    load_policy,
    smollm2_gguf_path,
    tiny_random_model,
)
from gear_rl.models import smollm2 as smollm2_module

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tiny_tokenizer_round_trips_and_has_chatml():
    tokenizer = build_tiny_tokenizer()
    assert len(tokenizer) == 259
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (256, 258)
    text = "héllo, wörld! 7 * 8 = 56 \n\t{}"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode())  # one token per byte
    assert tokenizer.decode(ids) == text
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                             add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0] == 257 and ids.count(258) == 1


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_random_model_is_deterministic_and_leaves_the_rng_alone(arch):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    one = tiny_random_model(arch, seed=4)
    after = torch.rand(3)
    two = tiny_random_model(arch, seed=4)
    other = tiny_random_model(arch, seed=5)
    assert torch.equal(after, expected_next)
    for (name, p), q in zip(one.named_parameters(), two.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(one.lm_head.weight, other.lm_head.weight)
    assert type(one).__name__.lower().startswith(arch)
    assert not one.training
    assert sum(p.numel() for p in one.parameters()) < 200_000


def test_tiny_random_model_rejects_bad_shapes():
    with pytest.raises(ValueError, match="hidden_size"):
        tiny_random_model(hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="arch must be"):
        tiny_random_model("gpt2")


def test_load_policy_names_and_local_directory(tmp_path):
    model, tokenizer = load_policy("tiny-random", seed=3)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == len(tokenizer)
    qwen, _ = load_policy("tiny-random-qwen3", dtype=torch.bfloat16)
    assert type(qwen).__name__ == "Qwen3ForCausalLM" and qwen.dtype == torch.bfloat16

    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_policy(tmp_path)
    ids = torch.tensor([tokenizer("a + b", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert not loaded.training

    with pytest.raises(ValueError, match="name_or_path 'no-such-model'"):
        load_policy("no-such-model")
    with pytest.raises(ValueError, match="dtype must be"):
        load_policy("tiny-random", dtype=torch.int64)


@pytest.mark.parametrize("value", ["", "   "])
def test_load_policy_empty_name_names_the_choices(value):
    with pytest.raises(ValueError, match="name_or_path is empty") as excinfo:
        load_policy(value)
    message = str(excinfo.value)
    assert "\n" not in message and "smollm2-135m" in message and "tiny-random" in message
    assert "local Hugging Face model directory" in message


def test_load_policy_path_that_is_not_a_model_directory(tmp_path):
    with pytest.raises(ValueError, match="neither a known model name nor an existing") as excinfo:
        load_policy(tmp_path / "missing")
    assert "tiny-random" in str(excinfo.value)
    with pytest.raises(ValueError, match=r"without a config\.json") as excinfo:
        load_policy(tmp_path)
    assert repr(str(tmp_path)) in str(excinfo.value) and "\n" not in str(excinfo.value)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # no weights, no tokenizer
    with pytest.raises(ValueError, match="transformers could not load") as excinfo:
        load_policy(tmp_path)
    assert "\n" not in str(excinfo.value)


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GEAR_RL_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("GEAR_RL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "gear-rl"


def test_smollm2_gguf_is_found_through_the_installed_package():
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6


def test_cache_is_written_atomically(monkeypatch, tmp_path):
    """The cache directory appears whole or not at all, and a later call reuses it. (The real
    dequantisation is exercised by the slow test below; here it is replaced by a quick writer so
    the failure path can be driven.)"""
    monkeypatch.setenv("GEAR_RL_CACHE", str(tmp_path))
    calls = []

    def failing(gguf: Path, out_dir: Path) -> None:
        (out_dir / "partial.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    def writing(gguf: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        tiny_random_model().save_pretrained(out_dir)
        build_tiny_tokenizer().save_pretrained(out_dir)

    monkeypatch.setattr(smollm2_module, "_dequantise_into", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        smollm2_module.ensure_smollm2()
    assert os.listdir(tmp_path) == []  # no half-written cache, no leftover staging directory

    monkeypatch.setattr(smollm2_module, "_dequantise_into", writing)
    first = smollm2_module.ensure_smollm2()
    second = smollm2_module.ensure_smollm2()
    assert first == second and len(calls) == 1
    assert calls[0].parent == tmp_path and calls[0] != first  # written elsewhere, then renamed
    assert sorted(os.listdir(tmp_path)) == [first.name]


@pytest.mark.slow
def test_load_smollm2():
    """The real bundled model (dequantised into the user cache on first use)."""
    model, tokenizer = load_policy("smollm2-135m")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == 49_152 == len(tokenizer)
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    assert tokenizer.eos_token == "<|im_end|>" == tokenizer.pad_token
    assert tokenizer.eos_token_id == model.config.eos_token_id
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                        add_generation_prompt=True, tokenize=False)
    ids = tokenizer(ids, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "5" in reply
