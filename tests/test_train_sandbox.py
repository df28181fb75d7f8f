"""The trainer's sandbox shows tool calls only what they need: a tool-math training step whose
policy writes code that hunts for the run's answers never sees them in any observation.

The policy is scripted (a tiny random model would never write such code); everything else is
the real trainer: its runtime builds the sandbox with the run directory hidden, the agent loop
runs the code in the warm workers, and the output comes back as observation tokens."""

from __future__ import annotations

import pytest

import gear_rl.train.episodes as episodes
from conftest import tiny_trainer
from gear_rl.agent.tools import check_mounts

pytestmark = pytest.mark.usefixtures("one_thread")

SENTINEL = "SENTINEL-7f3a-the-answers-are-here"

HUNT = '''```python
# hunt for the answers
import os
found = []
for top in ("/", "{run}", "{runs}"):
    for root, dirs, files in os.walk(top):
        # system software is exposed by design; reading all of it would take minutes
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/usr", "/proc", "/sys")]
        for name in files:
            path = os.path.join(root, name)
            try:
                with open(path, errors="ignore") as handle:
                    if "{marker}" in handle.read(65536):
                        found.append(path)
            except OSError:
                pass
for path in ("{run}/secret.txt", "{runs}/other-run/samples.jsonl", "{run}/samples.jsonl"):
    try:
        print(open(path).read())
    except OSError as error:
        print(type(error).__name__)
print("found", len(found), found[:3])
```'''


def test_tool_calls_never_see_the_run_directory(tmp_path, monkeypatch) -> None:
    runs = tmp_path / "runs"
    run = runs / "run"
    other = runs / "other-run"
    other.mkdir(parents=True)
    (other / "samples.jsonl").write_text(f'{{"answer": "{SENTINEL}"}}\n')
    trainer = tiny_trainer(run, "task=tool-math", "train_size=4", "eval.size=2",
                           "rollout.samples_per_prompt=2", "agent.max_turns=2",
                           "agent.max_new_tokens_per_turn=1500", "agent.max_response_tokens=6000",
                           "agent.max_observation_tokens=400", "agent.sandbox_workers=1",
                           "agent.sandbox_timeout_s=30",
                           task="config")
    (run / "secret.txt").write_text(SENTINEL)  # planted where the run logs its answers
    tokenizer = trainer.tokenizer
    stop = trainer.stop_ids[0]
    code = HUNT.format(run=run, runs=runs, marker=SENTINEL[:12])

    def scripted(model, sampling, generator, row_stop=None, reuse_cache=True):
        def generate(prompts, stop_strings, budgets):
            out = []
            for prompt in prompts:
                answered = "# hunt for the answers" in tokenizer.decode(prompt)
                # the call turn ends at its closing fence, the answer turn at end of turn
                ids = tokenizer.encode("The answer is 42." if answered else code,
                                       add_special_tokens=False)
                out.append([*ids, stop] if answered else ids)
            return out
        return generate

    monkeypatch.setattr(episodes, "_generate_fn", scripted)
    try:
        _, output = trainer.step(1)
    finally:
        trainer.close()
    transcripts = [tokenizer.decode(ids, skip_special_tokens=False)
                   for ids in output.batch.response_ids]
    ran = [t for t in transcripts if "found 0 []" in t]
    assert ran, "the hunting code did not run: " + transcripts[0][-600:]
    for transcript in transcripts:
        assert SENTINEL not in transcript
        assert "FileNotFoundError" in transcript or "PermissionError" in transcript


def test_a_mount_over_the_run_directory_or_a_data_file_is_refused(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("{}\n")
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"agent\.sandbox_mounts"):
        tiny_trainer(run, "task=tool-math", "train_size=4", "eval.size=2",
                     f"agent.sandbox_mounts=[{tmp_path}]", task="config")
    from gear_rl.train import load_config
    from gear_rl.train.runtime import sandbox_secrets

    config = load_config(None, [f"task={data / 'train.jsonl'}"], validate=False)
    secrets = sandbox_secrets(config, run)
    with pytest.raises(ValueError, match="overlaps"):
        check_mounts([str(data)], secrets, name="agent.sandbox_mounts")
    assert check_mounts([str(tmp_path / "data")], [run], name="m") == [str(data)]
