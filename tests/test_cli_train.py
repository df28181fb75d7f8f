"""`gear-rl train` / `gear-rl eval` argument handling."""

from __future__ import annotations

import json

from gear_rl.cli import main


def test_train_unknown_key_suggests_or_lists_valid_keys(capsys) -> None:
    assert main(["train", "bogus=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'bogus'" in err and "rollout.<key>" in err and "--help" in err
    assert main(["train", "rollout.temprature=0.7"]) == 2
    assert "did you mean 'rollout.temperature'?" in capsys.readouterr().err


def test_train_help_lists_keys(capsys) -> None:
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "gear-rl train [CONFIG.yaml]" in out and "estimator" in out and "loss.agg_mode" in out


def test_train_rejects_stray_arguments(capsys) -> None:
    assert main(["train", "a.yaml", "b.yaml"]) == 2
    assert "not key=value" in capsys.readouterr().err
    assert main(["train", "missing.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_train_then_eval_a_run_directory(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    code = main(["train", "model=tiny-random", "task=arithmetic", "train_size=16", "steps=1",
                 f"out={run}", "estimator=grpo", "rollout.prompts_per_step=2",
                 "rollout.samples_per_prompt=2", "rollout.max_new_tokens=4", "eval.size=2",
                 "eval.k=1", "eval.max_new_tokens=4", "log.progress=false",
                 "log.report_to=none"])
    assert code == 0
    out = capsys.readouterr().out
    assert "held-out" in out and str(run) in out
    assert main(["eval", str(run), "eval.k=2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["samples"] == 4 and 0.0 <= result["mean@2"] <= 1.0
    assert result["checkpoint"] == str(run)
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert "not a gear-rl run directory" in capsys.readouterr().err


def test_eval_a_named_model(capsys) -> None:
    assert main(["eval", "model=tiny-random", "task=products", "eval.size=2", "eval.k=1",
                 "eval.max_new_tokens=3", "records=true"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["problems"] == 2 and len(result["records"]) == 2
