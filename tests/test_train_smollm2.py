"""The real bundled model through the real trainer path (slow: loads SmolLM2-135M)."""

from __future__ import annotations

import json
import math

import pytest

from gear_rl.train import Trainer, load_config


@pytest.mark.slow
def test_one_gear_step_on_smollm2(tmp_path) -> None:
    config = load_config(None, [
        f"out={tmp_path / 'run'}", "steps=1", "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2", "rollout.max_new_tokens=8", "eval.at_start=false",
        "eval.size=2", "eval.k=1", "eval.max_new_tokens=8", "log.progress=false",
        "log.report_to=none", "train_size=50",
        # the teacher on every row: with 2 samples a group is often constant, and the default
        # (nonzero_advantage) would then have no divergence to log
        "signals.teacher_rows=all",
    ])
    trainer = Trainer(config)
    vocab = trainer.tokenizer.get_vocab()
    assert vocab["<|im_end|>"] in trainer.stop_ids
    trainer.train()
    record = json.loads((trainer.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("reward_mean", "entropy_mean", "loss", "divergence_mean", "segment_frac"):
        assert math.isfinite(record[key]), key
    assert record["entropy_mean"] > 0
    sample = json.loads((trainer.run_dir / "samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"].startswith("<|im_start|>")
    assert len(sample["divergence"]) == len(sample["tokens"])
