"""Issue 40, configuration and CLI errors: every estimator knob within the range where its method
means what its paper says (refused alike by ``gear-rl train``, TRL and verl), settings whose
advantages are zero by construction refused, and inputs that used to fail late, silently or with
a traceback (a ``topk`` with another divergence, an integer torch cannot take, a YAML key given
twice, a path that is a directory or a FIFO, an output folder that is a file, Ctrl-C during a
comparison) refused or reported in one line before any work."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shlex
import signal
import typing
from pathlib import Path

import pytest
import torch

from gear_rl.cli import main
from gear_rl.credit import (
    ESTIMATORS,
    CreditBatch,
    GEARConfig,
    RLSDConfig,
    TopEntropyConfig,
    estimator_names,
    gear_advantages,
    gear_signed_advantages,
    get_estimator,
)
from gear_rl.credit.steps import GAGPOConfig, GatedBEPOConfig, GiGPOConfig, TurnLevelConfig
from gear_rl.dataclass_config import INT64_MAX, parse_overrides
from gear_rl.study.spec import load_spec
from gear_rl.train.config import SignalConfig, TrainConfig, load_config
from test_compare_faults import write_run

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------- class 2: knob ranges
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"alpha": 5.0}, r"^alpha must be in \[0, 2\] while beta is unset, got 5.0: beta = 1 - "
                     r"alpha / 2 = -1.5 makes W"),
    ({"alpha": 2.5}, r"^alpha must be in \[0, 2\] while beta is unset"),
    ({"alpha": -0.5}, r"^alpha must be >= 0, got -0.5"),
    ({"alpha": -0.5, "beta": 2.0}, r"^alpha must be >= 0"),
    ({"beta": -0.1}, r"^beta must be >= 0, got -0.1"),
    ({"alpha": 0.0, "beta": 0.0}, r"^alpha and beta are both 0: every weight W"),
    ({"lambda_kl": -0.1}, r"^lambda_kl must be >= 0, got -0.1"),
    ({"lambda_kl": -0.1, "segmentation": "none"}, r"^lambda_kl must be >= 0"),
    ({"lambda_kl": 1.0}, r"^lambda_kl must be < 1 with normalize='minmax' and "
                         r"segmentation='kl_entropy', got 1.0: the minmax-normalised divergence"),
    ({"lambda_kl": 1.5, "normalize": "max"}, r"^lambda_kl must be < 1 with normalize='max'"),
    ({"lambda_kl": 1.5, "segmentation": "kl_only"}, r"^lambda_kl must be < 1"),
    ({"lambda_kl": 2.0, "normalize": "none", "segmentation": "entropy_only"},
     r"^lambda_kl must be < 1 .*the min-max-normalised entropy"),
    ({"lambda_h": 0.99}, r"^lambda_h must be >= 1, got 0.99"),
    ({"lambda_h": 0.0}, r"^lambda_h must be >= 1"),
    ({"lambda_h": -1.0, "segmentation": "entropy_window"}, r"^lambda_h must be >= 1"),
    ({"window": INT64_MAX + 1}, r"^window must be an integer <= 2\*\*63 - 1"),
    ({"skip_first": 10**23}, r"^skip_first must be an integer <= 2\*\*63 - 1"),
    ({"sign_aware": "ture"}, r"^sign_aware must be true or false, got 'ture'"),
    ({"mean_preserving": 1}, r"^mean_preserving must be true or false, got 1"),
    ({"norm_by_std": "yes"}, r"^norm_by_std must be true or false"),
])
def test_gear_knobs_outside_their_meaning_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GEARConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"alpha": 2.0}, {"alpha": 0.0}, {"alpha": 5.0, "beta": 0.0}, {"alpha": 0.0, "beta": 0.5},
    {"lambda_kl": 0.0}, {"lambda_kl": 0.999}, {"lambda_kl": 3.0, "normalize": "none"},
    {"lambda_kl": 3.0, "segmentation": "none"}, {"lambda_h": 1.0}, {"lambda_h": 40.0},
    {"skip_first": INT64_MAX}, {"window": INT64_MAX},
])
def test_gear_knobs_accept_the_edges_of_their_range(kwargs: dict) -> None:
    config = GEARConfig(**kwargs)
    assert all(getattr(config, key) == value for key, value in kwargs.items())


def _signals(rows: int = 6, length: int = 40, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    advantages = torch.tensor([1.5, -0.7, 0.4, -2.0, 0.9, -0.2])[:rows]
    divergence = torch.rand(rows, length, generator=generator) ** 3 * 4
    entropy = torch.rand(rows, length, generator=generator) * 2
    ratio = torch.randn(rows, length, generator=generator) * 2
    mask = torch.ones(rows, length)
    mask[1, 30:] = 0
    mask[4, 10:15] = 0
    return advantages, divergence, entropy, ratio, mask


def test_no_accepted_gear_weight_flips_an_advantage() -> None:
    """Why the range is [0, 2] with beta unset: within it no token's advantage changes sign (a
    failed trajectory's tokens are never pushed up), at alpha = 2 the least weight is exactly 0,
    and just above it signs flip."""
    advantages, divergence, entropy, ratio, mask = _signals()
    outcome = advantages[:, None]
    for alpha, beta in ((0.0, None), (1.0, None), (2.0, None), (0.5, 0.0), (4.0, 0.0),
                        (1.0, 0.3)):
        for sign_aware, mean_preserving, segmentation in itertools.product(
                (True, False), (False, True), ("kl_entropy", "none")):
            config = GEARConfig(alpha=alpha, beta=beta, sign_aware=sign_aware,
                                mean_preserving=mean_preserving, segmentation=segmentation)
            out = gear_advantages(advantages, divergence, entropy, mask, config)
            signed = gear_signed_advantages(
                advantages, divergence, entropy, ratio, mask,
                dataclasses.replace(config, score="log_ratio"))
            for result in (out, signed):
                assert (result * outcome >= 0).all(), config
    # token-level weights (no segment carries its onset's score): w = 0 at each row's extreme
    edge = gear_advantages(advantages, divergence, entropy, mask,
                           GEARConfig(alpha=2.0, segmentation="none"))
    assert ((edge == 0) & (mask == 1)).any()  # W = 0 there, not below
    beyond = GEARConfig(alpha=2.0, segmentation="none")
    object.__setattr__(beyond, "alpha", 2.5)  # what the check now refuses, computed anyway
    flipped = gear_advantages(advantages, divergence, entropy, mask, beyond)
    assert ((flipped * outcome < 0) & (outcome < 0)).any()  # a failure's token pushed up


@pytest.mark.parametrize(("build", "match"), [
    (lambda: GiGPOConfig(omega=-1.0), r"^omega must be >= 0, got -1.0"),
    (lambda: TurnLevelConfig(outcome_coef=-0.5), r"^outcome_coef must be >= 0, got -0.5"),
    (lambda: GatedBEPOConfig(min_successors=INT64_MAX + 1),
     r"^min_successors must be an integer <= 2\*\*63 - 1"),
    (lambda: GatedBEPOConfig(max_iters=True), r"^max_iters must be an integer >= 1"),
    (lambda: GAGPOConfig(outcome_in_returns="no"), r"^outcome_in_returns must be true or false"),
    (lambda: RLSDConfig(lam_decay_steps=2**64), r"^lam_decay_steps must be an integer <= "),
    (lambda: RLSDConfig(lam_warmup_steps=0), r"^lam_warmup_steps must be an integer >= 1"),
    (lambda: RLSDConfig(negative_only="false"), r"^negative_only must be true or false"),
    (lambda: TopEntropyConfig(norm_by_std=0), r"^norm_by_std must be true or false"),
])
def test_other_estimators_knobs_outside_their_meaning_are_refused(build, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_train_trl_and_verl_refuse_alike(tmp_path: Path, capsys) -> None:
    """The range lives in the config class, so each engine that builds it refuses: gear-rl
    train (before any work), TRL's CreditGRPOConfig and verl's algorithm.gear."""
    for override, said in (("credit.alpha=5", "credit.alpha must be in [0, 2]"),
                           ("credit.lambda_kl=-0.1", "credit.lambda_kl must be >= 0")):
        with pytest.raises(ValueError, match="^" + re.escape(said)):
            load_config(None, [override])
        out = tmp_path / "run"
        assert main(["train", "model=tiny-random", override, f"out={out}"]) == 2
        assert f"gear-rl train: {said}" in capsys.readouterr().err
        assert not out.exists()
    trl = pytest.importorskip("gear_rl.integrations.trl")
    for credit, match in (({"alpha": 5}, r"credit: alpha must be in \[0, 2\]"),
                          ({"lambda_kl": -0.1}, r"credit: lambda_kl must be >= 0")):
        with pytest.raises(ValueError, match=match):
            trl.CreditGRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, credit=credit)
    omegaconf = pytest.importorskip("omegaconf")
    verl = pytest.importorskip("gear_rl.integrations.verl.estimators")
    for gear, match in (({"alpha": 5}, r"algorithm.gear: alpha must be in \[0, 2\]"),
                        ({"lambda_h": 0.5}, r"algorithm.gear: lambda_h must be >= 1")):
        algorithm = omegaconf.OmegaConf.create({"adv_estimator": "gear",
                                                "norm_adv_by_std_in_grpo": True, "gear": gear})
        with pytest.raises(ValueError, match=match):
            verl.settings_from_algorithm(algorithm)


# ------------------------------------------------------- class 5: zero advantages by construction
# Advantages relative to the other samples of the prompt: a group of one has none.
GROUP_RELATIVE = {"grpo", "dr_grpo", "gear", "gear_token_kl", "gear_kl_only", "gear_entropy_only",
                  "gear_entropy_window", "gear_signed", "rlsd", "top_entropy", "turn_level"}


@pytest.mark.parametrize("name", estimator_names())
def test_one_sample_per_prompt_is_refused_where_every_advantage_would_be_0(name: str) -> None:
    overrides = [f"estimator={name}", "rollout.samples_per_prompt=1"]
    if name in GROUP_RELATIVE:
        with pytest.raises(ValueError, match=rf"^rollout.samples_per_prompt=1 gives estimator="
                                             rf"{name} nothing to learn from: .* set "
                                             r"rollout.samples_per_prompt >= 2$"):
            load_config(None, overrides)
    else:
        load_config(None, overrides)
    load_config(None, [f"estimator={name}", "rollout.samples_per_prompt=2"])


def test_settings_that_make_a_step_method_group_relative_are_refused_too() -> None:
    one = "rollout.samples_per_prompt=1"
    with pytest.raises(ValueError, match="estimator=gigpo nothing to learn from"):
        load_config(None, ["estimator=gigpo", "credit.omega=0", one])  # A^E alone
    with pytest.raises(ValueError, match="estimator=gear_steps nothing to learn from"):
        load_config(None, ["estimator=gear_steps", "credit.base=turn_level", one])
    load_config(None, ["estimator=gear_steps", "credit.base=gagpo", one])


def _groups_of_one(revisit: bool) -> CreditBatch:
    """Four trajectories of four prompts (group ids all different), three steps of two tokens
    each, every signal set; ``revisit``: each trajectory comes back to its first state."""
    generator = torch.Generator().manual_seed(3)
    rows, length = 4, 6
    student = -torch.rand(rows, length, generator=generator) * 3
    keys = [[f"r{b}s0", f"r{b}s1", f"r{b}s0" if revisit else f"r{b}s2"] for b in range(rows)]
    return CreditBatch(
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group_ids=[0, 1, 2, 3],
        mask=torch.ones(rows, length), divergence=torch.rand(rows, length, generator=generator),
        entropy=torch.rand(rows, length, generator=generator) * 2, student_logprobs=student,
        teacher_logprobs=student + torch.randn(rows, length, generator=generator),
        extras={"step_spans": [[(0, 2), (2, 4), (4, 6)]] * rows,
                "step_rewards": [[0.3, -0.2, 0.5]] * rows, "state_keys": keys})


def test_what_is_refused_is_zero_and_what_is_not_can_learn() -> None:
    """The declarations, computed: every refused estimator (and setting) gives exactly 0 to
    every token of groups of one, even where trajectories revisit states and steps pay rewards;
    the step methods that are not refused learn from a trajectory that revisits a state (an
    anchor group of its own visits), so they keep samples_per_prompt=1."""
    batch = _groups_of_one(revisit=True)
    refused = [(get_estimator(name), None) for name in sorted(GROUP_RELATIVE)] + [
        (get_estimator("gigpo"), GiGPOConfig(omega=0.0)),
        (get_estimator("gear_steps"), get_estimator("gear_steps").make_config(
            base="turn_level"))]
    for estimator, config in refused:
        assert estimator.needs_groups(config), estimator.name
        assert (estimator(batch, config) == 0).all(), estimator.name
    for name in ("gigpo", "gagpo", "gated_bepo", "gear_steps"):
        estimator = get_estimator(name)
        assert not estimator.needs_groups()
        assert (estimator(batch) != 0).any(), name
        if name != "gated_bepo":  # its gate needs two successors of one state: a revisit
            assert (estimator(_groups_of_one(revisit=False)) == 0).all(), name
    assert {n for n, e in ESTIMATORS.items() if e.needs_groups()} == GROUP_RELATIVE


def test_one_sample_per_prompt_is_refused_before_any_work(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["train", "model=tiny-random", "estimator=grpo", "rollout.samples_per_prompt=1",
                 f"out={out}"]) == 2
    assert "rollout.samples_per_prompt=1 gives estimator=grpo" in capsys.readouterr().err
    assert not out.exists()


# ------------------------------------------------------------------ class 10: config and CLI
def test_topk_with_another_divergence_is_refused_at_config_time(tmp_path: Path,
                                                                capsys) -> None:
    for divergence in ("full", "k1", "k3"):
        with pytest.raises(ValueError, match=rf"^signals.topk=5 applies to signals.divergence="
                                             rf"topk only, and signals.divergence is "
                                             rf"'{divergence}'"):
            SignalConfig(divergence=divergence, topk=5).validate()
    SignalConfig(divergence="topk", topk=5).validate()
    out = tmp_path / "run"
    assert main(["train", "model=tiny-random", "signals.topk=5", f"out={out}"]) == 2
    err = capsys.readouterr().err
    assert "signals.topk=5 applies to signals.divergence=topk only" in err
    assert "Traceback" not in err and not out.exists()


def int_keys() -> list[str]:
    """Every dotted key of TrainConfig whose field is an int (or an optional int)."""
    keys = []
    for name, hint in typing.get_type_hints(TrainConfig).items():
        if dataclasses.is_dataclass(hint):
            keys += [f"{name}.{key}" for key, sub in typing.get_type_hints(hint).items()
                     if int in (sub, *typing.get_args(sub)) and sub is not bool]
        elif int in (hint, *typing.get_args(hint)) and hint is not bool:
            keys.append(name)
    return keys


def test_int_keys_cover_the_knobs_that_reach_torch() -> None:
    keys = int_keys()
    for key in ("seed", "eval.seed", "steps", "rollout.max_new_tokens", "signals.topk",
                "loss.micro_batch_tokens", "agent.max_turns"):
        assert key in keys


@pytest.mark.parametrize("key", int_keys())
def test_every_integer_knob_must_fit_64_bits(key: str) -> None:
    extra = ["signals.divergence=topk"] if key == "signals.topk" else []
    with pytest.raises(ValueError, match=rf"^{key} must be an integer <= 2\*\*63 - 1 \(64 bits"):
        load_config(None, [f"{key}={10**22}", *extra])


def test_a_huge_seed_names_the_key_before_any_work(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["train", "model=tiny-random", "seed=12345678901234567890123",
                 f"out={out}"]) == 2
    err = capsys.readouterr().err
    assert "seed must be an integer <= 2**63 - 1" in err and "Overflow" not in err
    assert not out.exists()
    for key in ("seed", "eval.seed"):
        with pytest.raises(ValueError, match=rf"^{key} must be an integer >= 0, got -1"):
            load_config(None, [f"{key}=-1"])
        assert load_config(None, [f"{key}={INT64_MAX}"])
    for estimator, key in (("gear", "window"), ("gear", "skip_first"),
                           ("rlsd", "lam_decay_steps"), ("gated_bepo", "max_iters")):
        with pytest.raises(ValueError, match=rf"^credit.{key} must be an integer <= 2\*\*63"):
            load_config(None, [f"estimator={estimator}", f"credit.{key}={10**22}"])


def test_a_yaml_key_given_twice_is_refused_naming_the_key_and_file(tmp_path: Path,
                                                                   capsys) -> None:
    cases = {
        "top.yaml": ("steps: 3\nestimator: grpo\nsteps: 5\n",
                     r"top\.yaml' is not valid YAML at line 3: key 'steps' appears twice in one "
                     r"mapping \(lines 1 and 3\)"),
        "nested.yaml": ("rollout:\n  temperature: 0.5\n  top_p: 0.9\n  temperature: 0.9\n",
                        r"nested\.yaml' .*key 'temperature' appears twice .*lines 2 and 4"),
        "flow.yaml": ("credit: {alpha: 0.5, alpha: 1.5}\n", r"flow\.yaml' .*key 'alpha'"),
        "dotted.yaml": ("rollout:\n  temperature: 0.5\nrollout.temperature: 0.9\n",
                        r"^config file '.*dotted\.yaml': config key 'rollout.temperature' is "
                        r"set twice"),
        "whole.yaml": ("credit.alpha: 0.5\ncredit: {lambda_kl: 0.2}\n",
                       r"whole\.yaml': config key 'credit' is set as a whole after "
                       r"'credit.alpha', which it would drop"),
    }
    for name, (text, match) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ValueError, match=match):
            load_config(path)
        assert main(["train", str(path)]) == 2
        assert name in capsys.readouterr().err
    # A YAML merge may still override what it brings in; command-line overrides still layer.
    merged = tmp_path / "merge.yaml"
    merged.write_text("base: &b {temperature: 0.5, top_p: 0.9}\nrollout:\n  <<: *b\n"
                      "  temperature: 0.7\n")
    with pytest.raises(ValueError, match=r"unknown config key 'base'"):  # merged, not refused
        load_config(merged)
    assert load_config(None, ["steps=2", "steps=3"]).steps == 3
    with pytest.raises(ValueError, match=r"^override 'credit=\{a: 1, a: 2\}': key 'a' appears"):
        parse_overrides(["credit={a: 1, a: 2}"])


def test_a_study_file_with_a_key_given_twice_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("name: twice\nseeds: [0, 1]\nbudget: {steps: 2}\nseeds: [0]\n")
    with pytest.raises(ValueError, match=r"^study spec '.*spec\.yaml' is not valid YAML at line "
                                         r"4: key 'seeds' appears twice .*lines 2 and 4"):
        load_spec(path)
    assert main(["study", str(path)]) == 2
    assert "key 'seeds' appears twice" in capsys.readouterr().err


def test_a_task_path_that_is_a_directory_or_a_fifo_says_what_it_is(tmp_path: Path,
                                                                   capsys) -> None:
    folder = tmp_path / "rows.jsonl"
    folder.mkdir()
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "run"
    for key, path, what in (("task", folder, "is a directory, not a file"),
                            ("task", fifo, "is a named pipe (FIFO), not a file"),
                            ("task", tmp_path / "none.jsonl", "does not exist"),
                            ("task", f"toolrl:{folder}", "is a directory, not a file")):
        assert main(["train", "model=tiny-random", f"{key}={path}", f"out={out}"]) == 2
        err = capsys.readouterr().err
        assert f"dataset file '{str(path).removeprefix('toolrl:')}' {what}" in err, err
        assert not out.exists()
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({
        "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)}}) + "\n"
        for i in range(8)))
    assert main(["train", "model=tiny-random", f"task={train}", f"eval_data={fifo}",
                 f"out={out}"]) == 2
    assert f"dataset file '{fifo}' is a named pipe (FIFO), not a file" in capsys.readouterr().err


def test_a_config_file_that_is_a_directory_or_a_fifo_says_what_it_is(tmp_path: Path,
                                                                     capsys) -> None:
    folder = tmp_path / "run.yaml"
    folder.mkdir()
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # reading it would block until a writer came
    for path, what in ((folder, "is a directory, not a file"),
                       (fifo, "is a named pipe (FIFO), not a file")):
        assert main(["train", str(path)]) == 2
        assert f"config file '{path}' {what}" in capsys.readouterr().err
        assert main(["study", str(path)]) == 2
        assert f"study spec '{path}' {what}" in capsys.readouterr().err


def test_a_file_where_a_run_directory_is_expected_says_so(tmp_path: Path, capsys) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("a file\n")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for command in (["compare"], ["report"], ["credit-check"]):
        assert main([*command, str(file)]) == 2
        assert f"run directory '{file}' is a regular file, not a directory" in (
            capsys.readouterr().err)
    assert main(["compare", str(fifo)]) == 2
    assert f"run directory '{fifo}' is a named pipe (FIFO), not a directory" in (
        capsys.readouterr().err)
    assert main(["compare", str(tmp_path / "gone")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_output_folder_that_is_a_file_is_refused_in_one_line(tmp_path: Path,
                                                                capsys) -> None:
    run = write_run(tmp_path / "run", "estimator=grpo", "steps=2", evals={2: 0.5})
    file = tmp_path / "taken"
    file.write_text("x")
    for argv in (["report", str(run), "--out", str(file)],
                 ["compare", str(run), "--out", str(file)],
                 ["compare", "--estimators", "grpo", "--out", str(file), "model=tiny-random"],
                 ["study", str(Path(__file__).parents[1] / "studies" / "default.yaml"),
                  f"out={file}"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"'{file}' is a regular file, not a folder; give a folder" in err, err
    assert main(["report", str(run), "--out", str(file / "report")]) == 2
    assert (f"'{file / 'report'}' cannot be created: '{file}' on its path is a regular file"
            in capsys.readouterr().err)
    (run / "report").write_text("x")  # the default report folder, taken by a file
    assert main(["report", str(run)]) == 2
    assert "report folder" in capsys.readouterr().err
    assert file.read_text() == "x"


COMPARE = ["compare", "--estimators", "grpo", "--seeds", "0", "model=tiny-random", "steps=2",
           "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
           "rollout.max_new_tokens=6", "eval.size=4", "eval.k=2", "eval.max_new_tokens=4",
           "eval.at_start=false", "log.report_to=none", "log.progress=false",
           "log.checkpoint_every=1", "threads=1"]


@pytest.mark.parametrize("at_step", [1, 2])
def test_ctrl_c_during_compare_estimators_says_how_to_continue(tmp_path: Path, monkeypatch,
                                                               capsys, at_step: int) -> None:
    """A real SIGINT in the middle of training step ``at_step`` (step 1's checkpoint is
    written at its end): one message with the command that continues, and for a run stopped
    before its first checkpoint, the folder to remove first; no traceback."""
    from gear_rl.train.trainer import Trainer

    out = tmp_path / "cmp"
    argv = [*COMPARE, "--out", str(out)]
    step = Trainer.step

    def interrupted_in(self, number, *args, **kwargs):
        if number == at_step:
            signal.raise_signal(signal.SIGINT)
        return step(self, number, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", interrupted_in)
    assert main(argv) == 130  # SIGINT is handled even in a background suite: conftest.py
    err = capsys.readouterr().err
    run = out / "grpo-s0"
    assert "gear-rl compare: interrupted;" in err and "Traceback" not in err
    assert f"continue with the same command: {shlex.join(['gear-rl', *argv])}" in err
    if at_step == 1:
        assert f"first remove {run} (stopped before its first checkpoint" in err
    else:
        assert "first remove" not in err
        assert (run / "checkpoints" / "step-000001").is_dir()
