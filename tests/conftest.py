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

import pytest
import torch


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
