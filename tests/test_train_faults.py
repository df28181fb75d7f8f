"""Runs that must end correctly or with a one-line error, never look successful and be wrong:
non-finite training, run-directory collisions (a foreign folder, two trainers), interrupted
writes, resume overrides, and user errors caught before any work is done."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from conftest import tiny_trainer
from gear_rl.credit import get_estimator, grpo_advantages
from gear_rl.train import load_config
from gear_rl.train.resume import resume_config
from gear_rl.train.trainer import NonFiniteTrainingError

pytestmark = pytest.mark.usefixtures("one_thread")

CLI_ARGS = ["model=tiny-random", "task=arithmetic", "train_size=32", "estimator=grpo",
            "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
            "rollout.max_new_tokens=8", "eval.size=2", "eval.k=1", "eval.at_start=false",
            "eval.max_new_tokens=4", "log.progress=false", "log.report_to=none",
            "log.checkpoint_every=1", "optim.lr=1e-3", "threads=1"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gear_rl.cli", "train", *CLI_ARGS, *args]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


# --- non-finite values ----------------------------------------------------------------------
def test_divisor_eps_zero_is_refused_and_constant_groups_stay_zero() -> None:
    with pytest.raises(ValueError, match="eps must be > 0 when norm_by_std"):
        load_config(None, ["estimator=grpo", "credit.eps=0"])
    with pytest.raises(ValueError, match="eps must be > 0"):
        get_estimator("gear").make_config(eps=0.0)
    # Dr.GRPO does not divide: eps=0 is fine there, and a constant group is exactly 0
    load_config(None, ["estimator=dr_grpo", "credit.eps=0"])
    out = grpo_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), [0, 0, 1, 1], eps=0.0)
    assert out[:2].tolist() == [0.0, 0.0] and torch.isfinite(out).all()


@pytest.mark.parametrize("override", ["optim.lr=inf", "loss.kl_coef=nan", "optim.eps=0"])
def test_non_finite_or_degenerate_knobs_are_refused(override: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_non_finite_training_stops_before_the_checkpoint(tmp_path) -> None:
    # a finite learning rate so large that step 1's update overflows the model's activations:
    # step 2's loss is not finite
    trainer = tiny_trainer(tmp_path / "run", "estimator=grpo", "optim.lr=1e10", "steps=3",
                           "log.checkpoint_every=1")
    with pytest.raises(NonFiniteTrainingError,
                       match=r"step 2: the loss is not finite.*last good checkpoint is "
                             r".*step-000001"):
        trainer.train()
    assert trainer.run.latest_checkpoint().name == "step-000001"
    assert not (tmp_path / "run" / "checkpoints" / "step-000002").exists()
    assert [r["step"] for r in trainer.run.read_metrics()] == [1]  # step 2 never logged


def test_eval_refuses_a_checkpoint_with_nan_weights(tmp_path) -> None:
    trainer = tiny_trainer(tmp_path / "run", "estimator=grpo", "steps=1")
    trainer.train()
    from safetensors.torch import load_file, save_file

    weights = trainer.run.latest_checkpoint() / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(iter(tensors))
    tensors[name] = torch.full_like(tensors[name], math.nan)
    save_file(tensors, str(weights))
    from gear_rl.rundir import write_manifest

    write_manifest(weights.parent)  # as if the NaN weights had been saved as they are
    from gear_rl.train.evaluate import evaluate_model

    config = load_config(None, ["model=tiny-random", "eval.size=2", "eval.k=1"])
    with pytest.raises(ValueError, match="NaN or inf weights"):
        evaluate_model(config, tmp_path / "run")


# --- the run directory ----------------------------------------------------------------------
def test_out_refuses_a_foreign_folder_and_a_file(tmp_path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.yaml").write_text("my: own file\n")
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="its files would be overwritten"):
        tiny_trainer(folder, "steps=1")
    assert (folder / "config.yaml").read_text() == "my: own file\n"
    assert (folder / "notes.txt").read_text() == "keep me"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a regular file, not a folder"):
        tiny_trainer(a_file, "steps=1")


def test_two_trainers_cannot_share_a_run_directory(tmp_path) -> None:
    out = tmp_path / "run"
    # the first trainer runs until it is interrupted, so it holds the folder throughout
    first = subprocess.Popen(_cli("steps=100000", f"out={out}"), env=_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(out / "config.yaml", first)
        second = subprocess.run(_cli("steps=4", f"out={out}"), env=_env(), text=True,
                                capture_output=True, timeout=300, check=False)
        assert second.returncode == 2, second.stderr[-2000:]
        assert "in use by another trainer (pid" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=300)
    assert first.returncode == 130, err[-2000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").open()]
    assert steps == list(range(1, len(steps) + 1))  # one writer: no interleaved records


def test_half_written_last_metrics_line_is_dropped_on_resume(tmp_path) -> None:
    trainer = tiny_trainer(tmp_path / "run", "estimator=grpo", "steps=2",
                           "log.checkpoint_every=1")
    trainer.train()
    metrics = tmp_path / "run" / "metrics.jsonl"
    with metrics.open("a") as handle:
        handle.write('{"step": 3, "loss": 0.1, "reward_me')  # a write cut short
    config = resume_config(tmp_path / "run", {"steps": 3})
    with pytest.warns(UserWarning, match="half-written last line"):
        resumed = tiny_trainer(tmp_path / "run", config=config)
    resumed.train()
    steps = [json.loads(line)["step"] for line in metrics.open()]
    assert steps == [1, 2, 3]
    assert "steps: 3" in (tmp_path / "run" / "config.yaml").read_text()  # written back


def test_a_resume_records_where_it_trains_and_warns_when_that_changes(tmp_path) -> None:
    """run.json keeps where each resume continued the run (step, processor, precision); a
    resume under another processor or precision than the run's last says so, and the study
    report groups the run under both."""
    from gear_rl.rundir import RunDir, trained_on

    run = RunDir(tmp_path / "run")
    tiny_trainer(run.path, "estimator=grpo", "steps=1", "log.checkpoint_every=1").train()
    started = run.read_info()
    here = trained_on(started)
    assert len(here) == 1 and here[0].startswith(f"{started['cpu']}, ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same machine: nothing to say
        tiny_trainer(run.path, config=resume_config(run.path, {"steps": 2})).train()
    (resume,) = run.read_info()["resumes"]
    assert resume["step"] == 1 and resume["cpu"] == started["cpu"]
    assert resume["autocast_bf16"] == started["autocast_bf16"]
    assert trained_on(run.read_info()) == here
    other = {"cpu": "Another CPU", "autocast_bf16": True,  # as if both ran elsewhere
             "sampler_dtype": "torch.bfloat16"}
    elsewhere = {**run.read_info(), **other, "resumes": [{**resume, **other}]}
    (run.path / "run.json").write_text(json.dumps(elsewhere))
    with pytest.warns(UserWarning, match=r"trained up to step 2 on Another CPU, bf16 autocast "
                                         rf"and continues on {re.escape(here[0])}"):
        tiny_trainer(run.path, config=resume_config(run.path, {"steps": 3})).train()
    assert [r["step"] for r in run.read_info()["resumes"]] == [1, 2]
    assert trained_on(run.read_info()) == ["Another CPU, bf16 autocast", here[0]]


def test_resume_refuses_another_out(tmp_path) -> None:
    tiny_trainer(tmp_path / "run", "steps=1").train()
    with pytest.raises(ValueError, match="stays in its own folder"):
        resume_config(tmp_path / "run", {"out": str(tmp_path / "elsewhere"), "steps": 2})
    assert resume_config(tmp_path / "run", {"out": str(tmp_path / "run")}).steps == 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_exits_cleanly_and_says_how_to_resume(tmp_path, sig) -> None:
    """Ctrl-C, and the stop signals that kill, timeout, a CI cancel or a closed terminal send
    (gear_rl.stop: they take the same path; before, SIGTERM killed the run on the spot)."""
    out = tmp_path / "run"
    process = subprocess.Popen(_cli("steps=50", f"out={out}"), env=_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(out / "checkpoints" / "latest", process)
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    assert f"resume={out}" in err and "Traceback" not in err
    if sig != signal.SIGINT:
        return
    resumed = subprocess.run([sys.executable, "-m", "gear_rl.cli", "train", f"resume={out}",
                              "steps=3"], env=_env(), text=True, capture_output=True,
                             timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] >= 3


# --- user errors before any work -------------------------------------------------------------
@pytest.mark.parametrize(("args", "match"), [
    (["device=tpu"], "device must be auto, cpu, cuda or cuda:N"),
    (["model="], "model must be"),
    (["threads=-1"], "threads"),
    (["rollout.batch_size=0"], "rollout.batch_size"),
    (["signals.divergence=topk"], "signals.topk"),
])
def test_user_errors_are_one_line_before_any_work(tmp_path, args, match) -> None:
    out = tmp_path / "run"
    done = subprocess.run(_cli(*args, f"out={out}"), env=_env(), text=True,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == 2 and match in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not out.exists()  # nothing was written


def test_malformed_yaml_names_the_file_and_line(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("steps: 3\nrollout:\n  temperature: [0.7\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.* not valid YAML at line"):
        load_config(path)


# --- damaged checkpoints ----------------------------------------------------------------------
def _two_checkpoints(tmp_path) -> Path:
    run = tmp_path / "run"
    tiny_trainer(run, "estimator=grpo", "steps=2", "log.checkpoint_every=1",
                 "log.keep_checkpoints=2").train()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()
                  if p.is_dir()) == ["step-000001", "step-000002"]
    return run


def test_a_truncated_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path) -> None:
    run = _two_checkpoints(tmp_path)
    weights = run / "checkpoints" / "step-000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # what a crash mid-write could leave
    config = resume_config(run, {"steps": 3})
    with pytest.warns(UserWarning, match="step-000002: model.safetensors has 1000 bytes.*"
                                         "newest intact checkpoint, step-000001"):
        trainer = tiny_trainer(run, config=config)
    assert trainer.start_step == 1
    trainer.train()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()] == [1, 2, 3]
    # the resumed run wrote step 2 again, intact; loading a truncated file directly is an error
    from gear_rl.train.checkpoint import load_checkpoint

    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"cannot be read.*damaged"):
        load_checkpoint(weights.parent, trainer.model)


def test_an_empty_latest_pointer_uses_the_newest_intact_checkpoint(tmp_path) -> None:
    run = _two_checkpoints(tmp_path)
    (run / "checkpoints" / "latest").write_text("")
    config = resume_config(run, {"steps": 2})
    with pytest.warns(UserWarning, match="latest is missing or empty.*step-000002"):
        trainer = tiny_trainer(run, config=config)
    assert trainer.start_step == 2
    trainer.close()


def test_a_flipped_byte_is_caught_by_the_checksum(tmp_path) -> None:
    from gear_rl.rundir import checkpoint_problem

    run = _two_checkpoints(tmp_path)
    folder = run / "checkpoints" / "step-000002"
    data = bytearray((folder / "optimizer.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "optimizer.pt").write_bytes(bytes(data))
    assert checkpoint_problem(folder) == "optimizer.pt does not match its checksum"
    assert checkpoint_problem(run / "checkpoints" / "step-000001") is None


def test_weights_blown_up_by_one_update_stop_that_step(tmp_path) -> None:
    # lr 1e30: step 1's update leaves weights near 1e30 (their norm overflows float32)
    trainer = tiny_trainer(tmp_path / "run", "estimator=grpo", "optim.lr=1e30",
                           "log.checkpoint_every=1")
    with pytest.raises(NonFiniteTrainingError, match=r"step 1: the weights' norm"):
        trainer.train()
    assert trainer.run.latest_checkpoint() is None and trainer.run.read_metrics() == []
