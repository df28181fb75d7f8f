"""A study whose cells are verl jobs (``engine: verl``; gear_rl.study.verl_cells): the file is
checked before anything trains, each cell's Hydra overrides are the study's, the task's, the
method's and the study's own per-cell settings in that order, and a verl cell's folder is read
for resuming. The jobs themselves run in tests/test_verl_study.py (the verl environment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gear_rl.study.registration import registered_fields
from gear_rl.study.runner import plan_cells, verl_parallelism
from gear_rl.study.spec import Cell, load_spec, parse_spec
from gear_rl.study.verl_cells import hydra_value, verl_cell_state


def _spec(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "v", "engine": "verl", "seeds": [0, 1],
        "verl": {"trainer": {"total_training_steps": 2}, "data.train_batch_size": 4},
        "tasks": {"math": {}},
        "methods": {"grpo": {}, "gear": {"overrides": {"algorithm.gear.lambda_kl": 0.2}}}}
    data.update(changes)
    return data


def test_a_cells_overrides_are_the_studys_the_tasks_the_methods_then_its_own() -> None:
    spec = parse_spec(_spec(tasks={"sums": {"setting": "math", "overrides": {
        "data.max_response_length": 32}}}))
    assert spec.engine == "verl" and spec.steps == 2
    cell = Cell(spec.tasks[0], spec.method("gear"), 1)
    config = spec.verl_cell(cell)
    assert config.setting == "math" and config.estimator == "gear" and config.seed == 1
    assert config.overrides[:4] == ("trainer.total_training_steps=2", "data.train_batch_size=4",
                                    "data.max_response_length=32",
                                    "algorithm.gear.lambda_kl=0.2")
    assert {"data.seed=1", "actor_rollout_ref.rollout.seed=1", "trainer.v1.trainer_mode=gear",
            "trainer.val_before_train=true", "trainer.test_freq=2", "trainer.save_freq=1",
            "trainer.resume_mode=auto"} <= set(config.overrides)
    # the same seed: the same data order and sampling seed in every method's cell
    other = spec.verl_cell(Cell(spec.tasks[0], spec.method("grpo"), 1))
    assert [o for o in other.overrides if "seed" in o] == [o for o in config.overrides
                                                           if "seed" in o]
    started = config.command_overrides(Path("out/cells/sums/gear-s1"), cell.name)
    assert started[-1] == "trainer.experiment_name=sums-gear-s1"
    assert any(o.startswith("trainer.default_local_dir=/") and o.endswith(
        "out/cells/sums/gear-s1/checkpoints") for o in started)
    fields = registered_fields(spec)
    assert fields["engine"] == "verl" and fields["verl.trainer.total_training_steps"] == 2
    assert fields["tasks.sums.setting"] == "math"
    assert "engine" not in registered_fields(parse_spec({
        "seeds": [0], "tasks": {"products": {}}, "methods": {"grpo": {}}}))


@pytest.mark.parametrize(("value", "text"), [
    (True, "true"), (None, "null"), (3e-6, "3e-06"), (["console"], "[console]"),
    ("Qwen/Qwen3-4B", "Qwen/Qwen3-4B"), ("a b", "'a b'"), ("it's", "'it\\'s'"),
    ("true", "'true'"), ("1e5", "'1e5'"), ({"a": 1}, "{a:1}")])
def test_yaml_values_become_hydra_values(value: Any, text: str) -> None:
    assert hydra_value(value) == text


@pytest.mark.parametrize(("changes", "match"), [
    ({"budget": {"steps": 2}}, "gives its budget as verl:"),
    ({"engine": "trl"}, "engine must be one of"),
    ({"verl": {"data.train_batch_size": 4}}, "total_training_steps must be an integer"),
    ({"verl": {"trainer.total_training_steps": 2, "data.seed": 3}}, "data.seed.*seeds lists"),
    ({"verl": {"trainer.total_training_steps": 2, "algorithm.adv_estimator": "gear"}},
     "set by each method"),
    ({"methods": {"grpo": {"overrides": {"data.train_batch_size": 8}}}},
     "every cell of a task must share"),
    ({"methods": {"grpo": {"overrides": {"actor_rollout_ref.rollout.n": 4}}}},
     "every cell of a task must share"),
    ({"methods": {"x": {"estimator": "no_such"}}}, "methods.x.estimator"),
    ({"methods": {"grpo": {"samples_per_prompt": {"math": 4}}}}, "equal-token arm"),
    ({"tasks": {"chess": {}}}, "setting must be one of"),
    ({"tasks": {"t": {"setting": "math", "overrides": {"trainer.resume_mode": "disable"}}}},
     "resumes interrupted cells"),
    ({"verl": {"trainer.total_training_steps": 2,
               "actor_rollout_ref.model.path": "/no/such/model"}}, "is not a folder here"),
    ({"keep_checkpoints": "policy"}, "a verl cell's are verl's"),
])
def test_a_bad_verl_study_is_refused_before_anything_trains(changes: dict[str, Any],
                                                            match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_spec(_spec(**changes))


def test_a_gear_rl_study_may_not_hold_a_verl_block() -> None:
    with pytest.raises(ValueError, match="gives its budget as budget:"):
        parse_spec({"seeds": [0], "verl": {"a": 1}, "tasks": {"products": {}},
                    "methods": {"grpo": {}}})


def test_a_named_budget_is_laid_over_the_study(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_spec(
        verl={"trainer": {"total_training_steps": 200}, "data.train_batch_size": 128,
              "data.max_prompt_length": 1024},
        tasks={"math": {"label": "math"}},
        budgets={"cpu": {"verl": {"trainer.total_training_steps": 2,
                                  "data": {"max_prompt_length": None},
                                  "actor_rollout_ref.model.path": "smollm2"},
                         "tasks": {"math": {"setting": "products"}}}})))
    big, small = load_spec(path), load_spec(path, budget="cpu")
    assert big.steps == 200 and big.budget_name is None and big.tasks[0].setting == "math"
    assert small.steps == 2 and small.budget_name == "cpu"
    assert small.verl == {"trainer.total_training_steps": 2, "data.train_batch_size": 128,
                          "actor_rollout_ref.model.path": "smollm2"}  # null: removed
    assert small.tasks[0].setting == "products" and small.tasks[0].label == "math"
    with pytest.raises(ValueError, match="no such budgets: entry"):
        load_spec(path, budget="gpu")


def test_a_verl_cells_folder_says_where_it_stands(tmp_path: Path) -> None:
    run = tmp_path / "cell"
    assert verl_cell_state(run) == "new"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    assert verl_cell_state(run) == "no_checkpoint"
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
    assert verl_cell_state(run) == "interrupted"
    (run / "summary.json").write_text("{}")
    assert verl_cell_state(run) == "finished"


def test_a_started_cell_of_other_settings_or_another_engine_is_refused(tmp_path: Path) -> None:
    spec = parse_spec(_spec(seeds=[0]))
    out = tmp_path / "study"
    cell = spec.cells()[0]
    run = cell.run_dir(out)
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    saved = spec.verl_cell(cell).as_dict()
    run.with_suffix(".yaml").write_text(yaml.safe_dump(saved))
    assert [p.state for p in plan_cells(spec, out)] == ["no_checkpoint", "new"]
    run.with_suffix(".yaml").write_text(yaml.safe_dump({**saved, "seed": 5}))
    with pytest.raises(ValueError, match=r"other settings \(differs in \['seed'\]\)"):
        plan_cells(spec, out)
    run.with_suffix(".yaml").write_text(yaml.safe_dump(saved))
    (run / "run.json").write_text(json.dumps({"run_id": "x"}))  # a gear-rl train run
    with pytest.raises(ValueError, match="one study's cells run on one engine"):
        plan_cells(spec, out)


def test_jobs_split_the_visible_gpus_and_a_cpu_runs_one_cell() -> None:
    spec = parse_spec(_spec(verl={"trainer.total_training_steps": 2,
                                  "trainer.n_gpus_per_node": 2}))
    assert verl_parallelism(spec, None, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == (
        2, [["0", "1"], ["2", "3"]])
    assert verl_parallelism(spec, 1, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == (1, [["4", "5"]])
    with pytest.raises(ValueError, match="need 6, and 4 are visible"):
        verl_parallelism(spec, 3, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert verl_parallelism(spec, None, {"CUDA_VISIBLE_DEVICES": ""}) == (1, [])
    with pytest.raises(ValueError, match="one cell at a time on a CPU"):
        verl_parallelism(spec, 2, {"CUDA_VISIBLE_DEVICES": ""})


def test_a_verl_cell_leaves_its_threads_to_the_job() -> None:
    """A gear-rl cell gets the study's threads; a verl cell (threads 0) gets none from the
    study, so the CPU mode shares the cores among the job's ranks (OMP_NUM_THREADS), unless
    the user set them."""
    from gear_rl.study.runner import cell_environment

    assert cell_environment(2, {"PATH": "/bin"}) == {
        "PATH": "/bin", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert "OMP_NUM_THREADS" not in cell_environment(0, {"PATH": "/bin"})
    assert cell_environment(0, {"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"
