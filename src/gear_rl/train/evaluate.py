"""Held-out evaluation: Mean@k (average correctness over k samples per problem) and pass@k
(share of problems with at least one correct sample among k), with per-problem records.

**Paired draws.** On single-turn tasks every sample has its own uniform numbers: sample ``j``
of problem ``i`` is row ``i * k + j`` of its generation batch, and before decoding each batch
draws ``[rows, max_new_tokens]`` numbers from the ``seed`` stream, row after row
(``SamplingParams(paired_draws=True)``). A row's token at step ``s`` is sampled by inverse CDF
with its own number ``s``, whatever any other row generates and whenever it finishes, so two
models evaluated with the same ``seed``, problems, ``k`` and ``batch_size`` sample each
(problem, sample) with identical random numbers: a comparison of two methods is paired problem
by problem and draw by draw (common random numbers). Finished rows still leave the batch, as in
training. (One draw per live row and step instead, what training does, would shift the later
rows' draws by how many rows a model has already finished.) Multi-turn tasks (agents,
environments) sample from one stream seeded by ``seed``: they are paired by problem only.

**Records.** :func:`write_eval_records` stores one evaluation's per-problem records in the run
directory (``eval_records/step-NNNNNN.json``, one file per evaluated step, written atomically,
so a resumed run rewrites the same files and leaves nothing behind); :func:`read_eval_records`
reads them back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gear_rl.agent.loop import AgentLimits
from gear_rl.rundir import atomic_write_text
from gear_rl.sampling import SamplingParams
from gear_rl.signals import prompt_ids as build_prompt_ids
from gear_rl.tasks import Problem, Task
from gear_rl.train.episodes import collect, decode_response

if TYPE_CHECKING:
    from gear_rl.agent.tools import PythonSandbox

__all__ = ["EVAL_RECORDS", "decode_response", "evaluate", "read_eval_records",
           "write_eval_records"]

EVAL_RECORDS = "eval_records"
"""The folder of a run directory holding the per-problem records of each evaluation."""


def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    *,
    sampling: SamplingParams,
    problems: Sequence[Problem] | None = None,
    k: int = 4,
    seed: int = 1234,
    limits: AgentLimits | None = None,
    sandbox: PythonSandbox | None = None,
    reuse_cache: bool = True,
) -> dict[str, Any]:
    """Sample ``k`` responses per held-out problem and score them.

    Args:
        model: the sampler (a causal LM; its device is used).
        tokenizer: its tokenizer (chat template for the prompts).
        task: scorer and, unless ``problems`` is given, the held-out problems (``task.eval``).
        sampling: how to sample (:class:`~gear_rl.sampling.SamplingParams`; ``batch_size``:
            rows per generation batch); single-turn tasks always sample with paired draws
            (see the module docstring).
        k: samples per problem.
        seed: seeds the sampling stream, so the same model and seed give the same score
            (single-turn tasks: the same draws for each (problem, sample) whatever the model,
            see the module docstring).
        limits, sandbox: multi-turn limits and the Python sandbox for agent / environment
            tasks (see :func:`gear_rl.train.episodes.collect`).

    Returns:
        ``{"mean@k": float, "pass@k": float, "problems": int, "samples": int,
        "response_len": float, "truncated": float, "records": [...]}`` where ``records`` has one
        entry per problem in the order of ``problems`` (``id``, ``answer``, the k per-sample
        ``rewards``, ``extracted`` answers and response ``lengths`` in tokens), plus the
        agent / environment metrics of multi-turn tasks (``agent/...``, ``env/...``).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    problems = list(task.eval if problems is None else problems)
    if not problems:
        raise ValueError("no problems to evaluate")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(int(seed))
    prompts = [build_prompt_ids(tokenizer, p.prompt) for p in problems]
    row_problems = [p for p in problems for _ in range(k)]
    row_prompts = [p for p in prompts for _ in range(k)]
    rows = collect(task, row_problems, row_prompts, model=model, tokenizer=tokenizer,
                   sampling=replace(sampling, paired_draws=True), generator=generator,
                   limits=limits, sandbox=sandbox, reuse_cache=reuse_cache)
    records, correct, any_correct = [], 0.0, 0
    for index, problem in enumerate(problems):
        chosen = range(index * k, (index + 1) * k)
        rewards = [rows.rewards[row] for row in chosen]
        hits = [r >= 1.0 for r in rewards]
        correct += sum(hits)
        any_correct += any(hits)
        records.append({"id": problem.id, "answer": problem.answer, "rewards": rewards,
                        "extracted": [rows.extracted[row] for row in chosen],
                        "lengths": [len(rows.response_ids[row]) for row in chosen]})
    samples = len(problems) * k
    return {
        f"mean@{k}": correct / samples,
        f"pass@{k}": any_correct / len(problems),
        "problems": len(problems),
        "samples": samples,
        "response_len": sum(len(r) for r in rows.response_ids) / samples,
        "truncated": 1.0 - sum(rows.finished) / samples,
        "records": records,
        **rows.metrics,
    }


def _records_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / EVAL_RECORDS / f"step-{step:06d}.json"


def write_eval_records(run_dir: str | Path, step: int, result: dict[str, Any], *, k: int,
                       seed: int) -> Path:
    """Store the per-problem ``records`` of one :func:`evaluate` ``result`` at training
    ``step`` as ``RUN_DIR/eval_records/step-NNNNNN.json`` (atomically; an existing file of the
    same step, left by an interrupted run that is resumed, is replaced). Returns its path."""
    path = _records_path(run_dir, step)
    atomic_write_text(path, json.dumps({"step": step, "k": k, "seed": seed,
                                        "records": result["records"]}) + "\n")
    return path


def read_eval_records(run_dir: str | Path) -> dict[int, dict[str, Any]]:
    """Every evaluation's records of a run directory: step -> ``{"step", "k", "seed",
    "records"}`` ({} when the run stored none). A malformed file raises ``ValueError`` naming
    it."""
    folder = Path(run_dir) / EVAL_RECORDS
    out: dict[int, dict[str, Any]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("step-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            step, records = int(data["step"]), data["records"]
            if not isinstance(records, list) or not all(
                    isinstance(r, dict) and isinstance(r.get("rewards"), list) for r in records):
                raise TypeError("records must be a list of objects with rewards")
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}: not an eval records file ({error})") from error
        out[step] = data
    return out
