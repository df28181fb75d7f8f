"""Shared test fixtures."""

from __future__ import annotations

import os
import signal
import time

# Idle OpenMP workers sleep instead of spinning (what the `gear-rl` CLI sets for itself): GEAR's
# parallel numba kernel otherwise leaves workers spinning that slowed later torch work in the
# same process 5-10x on a 2-core machine. Set before torch and numba start their runtimes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# --- the quick loop (`scripts/test.sh --quick`, or `pytest -m quick`) -------------------------
# The one list of what the quick loop runs: the credit core, the loss, config, the registry,
# the package floors and the sandbox's refusals. A file named here with ``None`` contributes
# every test in it, with a tuple only the tests it names; QUICK_EXCEPT takes tests back out of
# a whole file. A quick test may start no process, run no model's forward pass and take no
# optimiser step: the guard below fails any that does, so a test added to a quick file that
# trains or spawns is refused loudly instead of slowing the loop (move it to another file or
# into QUICK_EXCEPT). Everything else runs in the full suite, which CI runs.
QUICK: dict[str, tuple[str, ...] | None] = {
    "test_study_verl_spec.py": None,
    "test_credit_errors.py": None,
    "test_credit_gear_examples.py": None,
    "test_credit_gear_preset.py": None,
    "test_credit_gear_properties.py": None,
    "test_credit_gear_signed.py": None,
    "test_credit_grpo_registry.py": None,
    "test_credit_mc.py": None,
    "test_credit_steps.py": None,
    "test_credit_token_faithful.py": None,
    "test_step_returns.py": None,
    "test_train_loss.py": None,
    "test_train_config.py": None,
    "test_hostile_config.py": None,
    "test_changed_defaults.py": None,
    "test_package_floors.py": None,
    "test_engine_table.py": None,
    "test_quick_loop.py": (
        "test_a_quick_test_may_start_no_process_run_no_model_and_step_no_optimiser",
        "test_the_quick_set_names_existing_files"),
    "test_sandbox.py": ("test_bad_constructor_arguments_raise_value_error_naming_them",
                        "test_limit_names_are_documented"),
    "test_sandbox_fs.py": ("test_check_mounts_refuses_what_overlaps_a_forbidden_path",
                           "test_pool_refuses_mounts_of_hidden_paths_and_of_the_checkout"),
}
QUICK_EXCEPT: dict[str, tuple[str, ...]] = {
    "test_credit_gear_preset.py": ("test_trainer_and_trl_read_credit_preset",),
    "test_credit_gear_properties.py": ("test_the_kernel_leaves_torch_thread_count_alone",),
    "test_credit_token_faithful.py": (
        "test_trainer_selects_per_micro_batch_and_normalises_over_selected",
        "test_trainer_credit_hands_the_step_to_rlsd",
        "test_the_trainer_hands_the_step_to_a_scheduled_estimator"),
    "test_hostile_config.py": ("test_ctrl_c_during_compare_estimators_says_how_to_continue",
                               "test_train_trl_and_verl_refuse_alike"),  # imports TRL, verl
    "test_changed_defaults.py": (
        "test_a_run_recorded_before_the_change_resumes_as_it_trained",),
}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m quick`` exactly, files that hold no quick test are not even imported (most
    of the quick loop's time would otherwise go to importing them)."""
    if (config.getoption("markexpr", "") == "quick" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")
            and collection_path.name not in QUICK):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests :data:`QUICK` names ``quick``; a name in QUICK or QUICK_EXCEPT that its
    file does not define fails the collection, so a renamed test cannot drop out unseen."""
    checked: set[str] = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or item.path.name not in QUICK:
            continue
        name = item.path.name
        if name not in checked:
            checked.add(name)
            named = (QUICK[name] or ()) + QUICK_EXCEPT.get(name, ())
            missing = [test for test in named if not hasattr(module, test)]
            if missing:
                raise pytest.UsageError(f"tests/conftest.py's quick set names tests {name} "
                                        f"does not define: {missing}")
        function = getattr(item, "originalname", item.name)
        chosen = QUICK[name]
        if (function in chosen) if chosen is not None else (
                function not in QUICK_EXCEPT.get(name, ())):
            item.add_marker(pytest.mark.quick)


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a quick test {what}: take it out of the quick set "
                             "(QUICK / QUICK_EXCEPT in tests/conftest.py)")
    return refuse


@pytest.fixture(autouse=True)
def quick_stays_quick(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                      ) -> Iterator[None]:
    """What keeps the quick loop quick, in the full suite as in the quick one: a test marked
    ``quick`` that starts a process, runs a model or steps an optimiser fails."""
    if request.node.get_closest_marker("quick") is None:
        yield
        return
    import _posixsubprocess
    import subprocess

    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    for owner, name in ((_posixsubprocess, "fork_exec"), (subprocess, "_fork_exec"),
                        (os, "posix_spawn"), (os, "posix_spawnp")):
        monkeypatch.setattr(owner, name, _refuse("starts a process"))
    monkeypatch.setattr(os, "fork", _refuse("forks"))
    forward = register_module_forward_pre_hook(_refuse("runs a model"))
    step = register_optimizer_step_pre_hook(_refuse("steps an optimiser"))
    try:
        yield
    finally:
        forward.remove()
        step.remove()


@pytest.fixture(scope="session", autouse=True)
def interruptible() -> Iterator[None]:
    """Ctrl-C's usual handler for the whole suite, as a terminal gives it. A suite started in
    the background by a non-interactive shell inherits SIGINT ignored: Python then installs no
    KeyboardInterrupt handler, and the processes it starts inherit the ignore, so the
    interrupts the Ctrl-C tests raise in process or send to a ``gear-rl`` subprocess would be
    dropped. A handled signal is reset to its default at exec, so subprocesses get Python's
    handler again."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Run a module's torch work on one intra-op thread. Tiny models gain nothing from more,
    and on a shared 2-core machine two OpenMP threads contending with other jobs ran the
    tiny-model tests several times slower. Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- tiny training runs ---------------------------------------------------------------------
# One recipe for every test that trains: a tiny random Llama, the in-process tokenizer, a few
# steps of a few rows. Modules add their own overrides (task, estimator, batch shape).
TINY_RUN = (
    "model=tiny-random", "steps=2", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
    "rollout.max_new_tokens=10", "eval.at_start=false", "eval.k=1", "eval.max_new_tokens=6",
    "log.report_to=none", "log.progress=false", "log.samples_per_step=2",
    "loss.micro_batch_size=3", "optim.lr=1e-3",
)


def toy_task():
    """Reward 1 when the response has an even number of lowercase letters: about half of a
    random model's samples, so most groups have mixed outcomes and non-zero advantages."""
    from gear_rl.tasks import Problem, Task

    problems = [Problem(id=f"p{i}", prompt=[{"role": "user", "content": f"count to {i}"}],
                        answer="even", reference="an even number of letters")
                for i in range(12)]

    def scorer(problem, text: str) -> float:
        return float(sum(c.islower() for c in text) % 2 == 0)

    return Task(name="toy", train=problems[:10], eval=problems[10:], scorer=scorer,
                extract=lambda text: text[:8])


def tiny_trainer(out, *overrides: str, task=None, model_seed: int = 1, config=None):
    """A :class:`~gear_rl.train.Trainer` on a tiny random model writing to ``out``:
    :data:`TINY_RUN` then ``overrides`` (or a ready ``config``, e.g. a resume config);
    ``task``: a Task object (default :func:`toy_task`), or ``"config"`` to build the task the
    overrides name (``task=sokoban``)."""
    from gear_rl.models import build_tiny_tokenizer, tiny_random_model
    from gear_rl.train import Trainer, load_config

    if config is None:
        config = load_config(None, [*TINY_RUN, f"out={out}", *overrides])
    model = tiny_random_model("llama", seed=model_seed, initializer_range=0.2)
    task_obj = None if task == "config" else (task if task is not None else toy_task())
    return Trainer(config, model=model, tokenizer=build_tiny_tokenizer(), task=task_obj)


def kill_when(process, ready, *, timeout: float, poll: float = 0.02, what: str = "the run"
              ) -> None:
    """SIGKILL ``process`` (a ``subprocess.Popen``) as soon as ``ready()`` holds, polling every
    ``poll`` seconds for at most ``timeout``; fails if the process ended first. The process is
    killed in every case."""
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and process.poll() is None:
            if ready():
                break
            time.sleep(poll)
        assert process.poll() is None, f"{what} finished before it could be interrupted"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
