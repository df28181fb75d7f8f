"""Checkpoints, run directories and resume under hostile conditions (issue 40): data files
replaced under a run, checkpoints that must survive a power loss, checkpoints pruned under a
reader, a full disk, and run folders holding what is not the run's own."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN, tiny_trainer
from gear_rl.cli import main
from gear_rl.train import load_config
from gear_rl.train.resume import resume_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(out: Path, *overrides: str):
    """:data:`TINY_RUN` with ``overrides`` replacing its keys, writing to ``out``."""
    given = {item.split("=", 1)[0] for item in overrides}
    kept = [item for item in TINY_RUN if item.split("=", 1)[0] not in given]
    return load_config(None, [*kept, f"out={out}", *overrides])


def _trainer(out: Path, *overrides: str, task=None):
    return tiny_trainer(out, config=_config(out, *overrides), task=task)


def _resume(run: Path, *, task=None, **overrides):
    return tiny_trainer(run, config=resume_config(run, overrides), task=task)


# --- 1. resume trusts the data file -----------------------------------------------------------
def _rows(start: int, count: int) -> str:
    return "".join(json.dumps({
        "data_source": "test", "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)}}) + "\n"
        for i in range(start, start + count))


def test_resume_refuses_data_files_replaced_since_the_run_started(tmp_path) -> None:
    train, held_out = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text(_rows(0, 12))
    held_out.write_text(_rows(50, 4))
    run = tmp_path / "run"
    _trainer(run, f"task={train}", f"eval_data={held_out}", "train_size=8", "eval.size=2",
             "steps=1", task="config").train()
    original = train.read_bytes()

    train.write_text(_rows(100, 12))  # other rows under the same name
    with pytest.raises(ValueError, match=r"was started on other data: task=.*train\.jsonl "
                                         r"changed since the run started.*training problems"):
        _resume(run, task="config", steps=2)
    # the command line says it in one line, and trains nothing
    assert main(["train", f"resume={run}", "steps=2"]) == 2
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").open())] == [1]

    train.write_bytes(original)  # the same bytes again: the run continues
    held_out.write_text(_rows(60, 4))
    with pytest.raises(ValueError, match=r"eval_data=.*held\.jsonl changed.*held-out problems"):
        _resume(run, task="config", steps=2)
    held_out.write_text(_rows(50, 4))
    trainer = _resume(run, task="config", steps=2)
    assert trainer.start_step == 1
    trainer.close()


def test_data_fingerprint_covers_every_file_a_run_reads(tmp_path) -> None:
    from conftest import toy_task
    from gear_rl.train.resume import data_fingerprint

    files = {name: tmp_path / name for name in ("a.jsonl", "b.json", "levels.txt", "t.json")}
    for path in files.values():
        path.write_text("x\n")
    config = load_config(None, [f"task={files['a.jsonl']}", f"eval_data={files['b.json']}"],
                         validate=False)
    config.task_options = {"env": {"levels": str(files["levels.txt"])}, "size": 3}
    found = data_fingerprint(config, toy_task())
    assert set(found["files"]) == {"task", "eval_data", "task_options.env.levels"}
    assert found["files"]["task"]["path"] == str(files["a.jsonl"].resolve())
    assert found["train"]["count"] == 10 and found["eval"]["count"] == 2
    config = load_config(None, [f"task=toolrl:{files['t.json']}"], validate=False)
    assert set(data_fingerprint(config, toy_task())["files"]) == {"task"}


# --- 6. checkpoints are fsynced before `latest` moves ---------------------------------------
def test_every_checkpoint_file_and_folder_is_fsynced_before_latest_moves(tmp_path,
                                                                       monkeypatch) -> None:
    from gear_rl.models import tiny_random_model
    from gear_rl.rundir import RunDir
    from gear_rl.train.checkpoint import save_checkpoint

    model = tiny_random_model("llama", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    run = RunDir(tmp_path / "run")
    save_checkpoint(run, 1, model, optimizer, keep=1)

    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_rmtree = os.fsync, os.replace, shutil.rmtree

    def fsync(descriptor: int) -> None:  # records, then flushes for real
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        real_fsync(descriptor)

    def replace(source, target) -> None:
        events.append(("rename", str(target)))
        real_replace(source, target)

    def rmtree(path, *args, **kwargs) -> None:
        events.append(("rmtree", str(path)))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    final = save_checkpoint(run, 2, model, optimizer, keep=1)

    root = str(run.checkpoints.resolve())
    tmp = f"{root}/.tmp-step-000002"
    latest = events.index(("rename", f"{run.checkpoints}/latest"))
    before = events[:latest]
    for name in os.listdir(final):  # every file, while still in its temporary folder
        assert ("fsync", f"{tmp}/{name}") in before, name
    placed = before.index(("rename", str(final)))
    assert ("fsync", tmp) in before[:placed]  # the folder's entries, before its rename
    assert ("fsync", root) in before[placed:]  # the rename itself, before latest moves
    pruned = events.index(("rmtree", str(run.checkpoint_folder(1))))
    assert ("fsync", f"{root}/.latest.{os.getpid()}.tmp") in events[:latest]
    assert ("fsync", root) in events[latest:pruned]  # latest durable before step 1 goes
    assert not run.checkpoint_folder(1).exists()


# --- 7. a checkpoint pruned under a reader ----------------------------------------------------
def test_eval_moves_on_when_the_checkpoint_it_reads_is_pruned(tmp_path, monkeypatch,
                                                              capsys) -> None:
    from gear_rl.models import tiny_random_model
    from gear_rl.train.checkpoint import save_checkpoint

    run = tmp_path / "run"
    main(["train", *_tiny_cli(run, "steps=1")])
    capsys.readouterr()
    writer = tiny_random_model("llama", seed=0)
    optimizer = torch.optim.AdamW(writer.parameters(), lr=1e-3)
    real_load = torch.load
    pending = [2]

    def load_after_a_checkpoint(*args, **kwargs):
        # the trainer of the run writes step 2 (keep_checkpoints=1, pruning step 1) between
        # the reader choosing step 1 and reading its state.pt
        if pending:
            save_checkpoint(run, pending.pop(), writer, optimizer, keep=1)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load_after_a_checkpoint)
    assert main(["eval", str(run), "eval.size=2", "eval.k=1", "eval.max_new_tokens=2"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["checkpoint_step"] == 2
    assert result["checkpoint_folder"] == str(run / "checkpoints" / "step-000002")
    assert "scored " in captured.err and "step-000002 (step 2)" in captured.err

    # a checkpoint folder named outright is not swapped for another: a clear error instead
    pending.append(3)
    code = main(["eval", str(run / "checkpoints" / "step-000002"), "eval.size=2"])
    err = capsys.readouterr().err
    assert code == 2 and "was removed while it was read" in err and "Traceback" not in err


def _tiny_cli(out: Path, *extra: str) -> list[str]:
    return ["model=tiny-random", "task=arithmetic", "train_size=16", "estimator=grpo",
            "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=4", "eval.size=2", "eval.k=1", "eval.max_new_tokens=4",
            "eval.at_start=false", "log.progress=false", "log.report_to=none", "threads=1",
            f"out={out}", *extra]


# --- 8. a full disk (a real tmpfs, mounted in a user namespace) ---------------------------------
def _can_mount_tmpfs() -> str | None:
    """Why a tmpfs cannot be mounted here (None: it can)."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                          capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"cannot mount a tmpfs: {done.stderr.strip()}"


def _on_small_disk(tmp_path: Path, script: str) -> None:
    """Run the shell ``script`` in a new mount namespace where ``$M`` is a fresh tmpfs; ``gr``
    runs ``gear-rl``, ``say NAME`` keeps the last command's status, stdout and stderr as
    ``NAME.rc``, ``NAME.out`` and ``NAME.err`` under ``tmp_path``."""
    reason = _can_mount_tmpfs()
    if reason:
        pytest.skip(reason)
    mount = tmp_path / "mnt"
    mount.mkdir()
    prelude = (f"set -u\nM={mount}\nR={tmp_path}\n"
               f"gr() {{ {sys.executable} -m gear_rl.cli \"$@\" >$R/last.out 2>$R/last.err; "
               "echo $? >$R/last.rc; }\n"
               "say() { for x in rc out err; do mv $R/last.$x $R/$1.$x; done; }\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(["unshare", "-rm", "sh", "-c", prelude + script], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def _said(tmp_path: Path, name: str) -> tuple[int, str]:
    return (int((tmp_path / f"{name}.rc").read_text()),
            (tmp_path / f"{name}.err").read_text())


@pytest.mark.parametrize("size", ["2000k", "1650k"], ids=["optimizer", "weights"])
def test_a_full_disk_during_a_checkpoint_keeps_the_last_one_and_says_how_to_resume(
        tmp_path, size: str) -> None:
    # one checkpoint (1.3 MB) fits, the second does not: with 2000k the disk fills in
    # optimizer.pt (torch.save), with 1650k in model.safetensors
    args = " ".join(_tiny_cli(Path("$M/run"), "steps=3", "log.checkpoint_every=1"))
    _on_small_disk(tmp_path, f"""
mount -t tmpfs -o size={size} tmpfs $M
gr train {args}; say full
ls -a $M/run/checkpoints > $R/listing
mount -o remount,size=8m $M
gr train resume=$M/run; say resumed
cp $M/run/metrics.jsonl $R/metrics.jsonl
""")
    code, err = _said(tmp_path, "full")
    run = tmp_path / "mnt" / "run"
    assert code == 1, err[-2000:]
    assert f"no space left on {run}/checkpoints" in err
    assert "the last checkpoint, step-000001, is kept" in err
    assert f"continue with: gear-rl train resume={run}" in err
    assert "Traceback" not in err and "enforce fail" not in err
    assert (tmp_path / "listing").read_text().split() == [".", "..", "latest", "step-000001"]
    code, err = _said(tmp_path, "resumed")
    assert code == 0, err[-2000:]
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()]
    assert steps == [1, 2, 3]


@pytest.mark.slow
def test_a_full_disk_elsewhere_says_what_was_kept_and_what_to_run(tmp_path) -> None:
    args = " ".join(_tiny_cli(Path("$M/run"), "steps=3", "log.checkpoint_every=3"))
    finished = " ".join(_tiny_cli(Path("$M/done"), "steps=1"))
    _on_small_disk(tmp_path, f"""
mount -t tmpfs -o size=12k tmpfs $M
gr train {args}; say logging
umount $M; mount -t tmpfs -o size=4m tmpfs $M
gr train {finished}; say trained
dd if=/dev/zero of=$M/fill bs=4k 2>/dev/null
gr report $M/done; say report
gr credit-check $M/done groups=1 per_group=2 continuations=2 replicates=1 bootstrap=10 \
    progress=false; say check
""")
    mount = tmp_path / "mnt"
    # the disk fills before the first checkpoint: nothing to resume, so no resume= advice
    code, err = _said(tmp_path, "logging")
    assert code == 1 and f"no space left on {mount}/run/" in err, err[-2000:]
    assert "no checkpoint was written yet, so there is nothing to resume" in err
    assert f"remove {mount}/run and start again with: gear-rl train model=tiny-random" in err
    assert "resume=" not in err and "Traceback" not in err
    assert _said(tmp_path, "trained")[0] == 0
    for name, kept in (("report", "the run itself is untouched"),
                       ("check", "continue with the same command: gear-rl credit-check")):
        code, err = _said(tmp_path, name)
        assert code == 1 and f"no space left on {mount}/done/" in err, err[-2000:]
        assert kept in err and "Traceback" not in err and "Errno" not in err


# --- 10. what a run folder holds must be the run's own ------------------------------------------
def test_resume_accepts_the_runs_own_values_and_names_a_changed_one(tmp_path) -> None:
    run = tmp_path / "run"
    assert main(["train", *_tiny_cli(run, "steps=1")]) == 0
    config = resume_config(run, {"model": "tiny-random", "estimator": "grpo", "steps": 2,
                                 "rollout.temperature": 1.0})
    assert config.steps == 2 and config.model == "tiny-random"
    with pytest.raises(ValueError, match=r"'model' cannot change when resuming \(the run's "
                                         r"value, then the one given: model: 'tiny-random', "
                                         r"then 'tiny-random-qwen3'\)"):
        resume_config(run, {"model": "tiny-random-qwen3"})
    assert main(["train", f"resume={run}", "model=tiny-random", "steps=2"]) == 0


def test_resume_refuses_another_runs_checkpoints(tmp_path) -> None:
    mine, other, twin = tmp_path / "mine", tmp_path / "other", tmp_path / "twin"
    for out, seed in ((mine, 0), (other, 1), (twin, 0)):
        _trainer(out, "steps=1", f"seed={seed}").train()
    shutil.rmtree(mine / "checkpoints")
    shutil.copytree(other / "checkpoints", mine / "checkpoints")
    with pytest.raises(ValueError, match=rf"written by another run \({re.escape(str(other))}, "
                                         rf"run id \w+\), not by {re.escape(str(mine))} .*"
                                         r"seed: 1, then 0"):
        _resume(mine, steps=2)
    # the same config but another run (another folder, another start): the run ids differ
    shutil.rmtree(mine / "checkpoints")
    shutil.copytree(twin / "checkpoints", mine / "checkpoints")
    with pytest.raises(ValueError, match=rf"another run \({re.escape(str(twin))}, run id"):
        _resume(mine, steps=2)
    # a copy of the whole run folder is the same run
    shutil.copytree(other, tmp_path / "copy")
    _resume(tmp_path / "copy", steps=2).close()


@pytest.mark.parametrize("pointer", ["../../other/checkpoints/step-000001", "ABSOLUTE",
                                     "step-000009"], ids=["relative", "absolute", "link"])
def test_a_latest_pointing_outside_the_run_is_refused(tmp_path, pointer: str) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    for out, seed in ((mine, 0), (other, 1)):
        _trainer(out, "steps=1", f"seed={seed}").train()
    elsewhere = other / "checkpoints" / "step-000001"
    if pointer == "ABSOLUTE":
        pointer = str(elsewhere)
    if pointer == "step-000009":
        (mine / "checkpoints" / pointer).symlink_to(elsewhere)
    (mine / "checkpoints" / "latest").write_text(pointer + "\n")
    with pytest.raises(ValueError, match="not one of this run's checkpoint folders"):
        _resume(mine, steps=2)
    assert main(["eval", str(mine), "eval.size=2"]) == 2


def test_a_config_yaml_edited_to_another_model_is_one_clear_error(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", *_tiny_cli(run, "steps=1")]) == 0
    capsys.readouterr()
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("model: tiny-random\n",
                                                 "model: tiny-random-qwen2\n"))
    assert main(["train", f"resume={run}", "steps=2"]) == 2
    err = capsys.readouterr().err
    assert "config.yaml differs from the config step-000001 was trained with (model: " \
           "'tiny-random', then 'tiny-random-qwen2'" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert main(["eval", str(run), "eval.size=2"]) == 2
    err = capsys.readouterr().err
    assert "does not match the model being loaded (it was trained with model=tiny-random)" in err
    assert len(err.strip().splitlines()) == 1


def test_a_checkpoint_of_another_size_names_the_first_tensor_that_differs(tmp_path) -> None:
    from gear_rl.models import tiny_random_model
    from gear_rl.train.checkpoint import load_checkpoint

    run = tmp_path / "run"
    _trainer(run, "steps=1").train()
    smaller = tiny_random_model("llama", hidden_size=32)
    with pytest.raises(ValueError, match=r"does not match the model being loaded \(it was "
                                         r"trained with model=tiny-random\): [\w.]+ is "
                                         r"\[259, 64\] there and \[259, 32\] in the model and "
                                         r"\d+ more tensors differ; load it into the model it was "
                                         r"trained with"):
        load_checkpoint(run / "checkpoints" / "step-000001", smaller)
