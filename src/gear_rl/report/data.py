"""Reading a run directory for the report: ``config.yaml``, ``metrics.jsonl``, ``samples.jsonl``,
``summary.json`` and the credit check's ``credit_check/credit_check.json`` (the names are
:mod:`gear_rl.rundir`'s).

The readers are tolerant by design: unknown keys are kept, missing or null per-token fields stay
``None`` (GRPO logs no divergence; step-level estimators may add keys), and a metric that a run
never logged is simply absent from :meth:`RunData.series`. Derived per-token signals (the GEAR
normalised divergence) reuse the credit package's own normaliser, so the viewer shows exactly the
``n_t`` the estimator thresholded.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gear_rl.credit.config import GEARConfig
from gear_rl.credit.registry import upgrade_recorded_config
from gear_rl.credit.segments import normalize_reference
from gear_rl.dataclass_config import check_folder
from gear_rl.rundir import CONFIG, CREDIT_CHECK_DIR, CREDIT_CHECK_JSON, METRICS, RunDir

__all__ = [
    "RunData",
    "TokenCount",
    "eval_keys",
    "finite",
    "load_run",
    "normalized_divergence",
    "policy_mask",
    "top_divergence_tokens",
    "weight_stats_by_step",
]

# Per-token fields of a samples.jsonl record (all optional except tokens); ``mc_advantage``
# only in the records read from a credit check.
TOKEN_FIELDS = ("mask", "entropy", "divergence", "student_logprobs", "teacher_logprobs",
                "token_advantage", "weight", "segment_onset", "mc_advantage")


@dataclass
class RunData:
    """One run directory, read.

    Attributes:
        path: the run directory.
        config: ``config.yaml`` as a dict ({} when absent).
        metrics: ``metrics.jsonl`` records in file order.
        samples: ``samples.jsonl`` records in file order.
        summary: ``summary.json`` ({} when absent: an unfinished run).
        credit_check: the trajectories of ``RUN_DIR/credit_check/credit_check.json`` (``gear-rl
            credit-check RUN_DIR``) as sample records with their Monte-Carlo advantage
            (``mc_advantage``), [] when the run has no credit check.
        credit_check_step: the checkpoint step the credit check was run at (None: none).
        info: ``run.json``, the run's facts ({} when absent or unreadable).
    """

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    credit_check: list[dict[str, Any]] = field(default_factory=list)
    credit_check_step: int | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def engine(self) -> str:
        """Which engine trained the run (``run.json``'s ``engine``: ``gear-rl``, ``trl`` or
        ``verl``; ``gear-rl`` when absent)."""
        return str(self.info.get("engine") or "gear-rl")

    @property
    def estimator(self) -> str:
        """The run's credit estimator (``config.yaml``'s ``estimator``; ``unknown`` if none)."""
        return str(self.config.get("estimator") or "unknown")

    @property
    def seed(self) -> int | None:
        """The run's seed, or None when ``config.yaml`` has none."""
        seed = self.config.get("seed")
        return int(seed) if isinstance(seed, (int, float)) else None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of a metric over the run, finite numeric values only."""
        steps, values = [], []
        for record in self.metrics:
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
                    value) and isinstance(record.get("step"), int):
                steps.append(record["step"])
                values.append(float(value))
        return steps, values

    @property
    def normalize_mode(self) -> str:
        """The GEAR ``normalize`` mode of the run (``credit.normalize``, else the default)."""
        credit = self.config.get("credit") or {}
        return str(credit.get("normalize", GEARConfig().normalize))

    @property
    def lambda_kl(self) -> float:
        """The run's segment-onset threshold (``credit.lambda_kl``, else the default)."""
        credit = self.config.get("credit") or {}
        return float(credit.get("lambda_kl", GEARConfig().lambda_kl))


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory: a ``gear-rl train`` run, or one written by the TRL or verl
    adapter (:class:`gear_rl.runlog.EngineRunLog`, same files; ``run.json`` names the engine).

    Raises:
        ValueError: when ``run_dir`` is not a directory or holds neither ``metrics.jsonl`` nor
            ``config.yaml``, or a file in it is malformed.
    """
    path = check_folder(run_dir, "run directory")  # a file, a FIFO...: says which
    run = RunDir(path)
    if not run.metrics_path.is_file() and not run.is_run():
        raise ValueError(f"{path} is not a gear-rl run directory (no {METRICS} or {CONFIG})")
    samples = run.read_samples()
    for number, sample in enumerate(samples, start=1):
        _check_sample(sample, run.samples_path, number)
    checked, step = credit_check_samples(path)
    try:
        info = run.read_info()
    except ValueError:  # the facts are shown, not needed: a damaged run.json hides them
        info = {}
    # a credit default changed since the run was recorded reads as what it trained with
    return RunData(path=path, config=upgrade_recorded_config(run.read_config()),
                   metrics=run.read_metrics(),
                   samples=samples, summary=run.read_summary(), credit_check=checked,
                   credit_check_step=step, info=info)


def credit_check_samples(run_dir: str | Path) -> tuple[list[dict[str, Any]], int | None]:
    """The scored trajectories of the run's credit check (``RUN_DIR/credit_check/
    credit_check.json``, written by ``gear-rl credit-check RUN_DIR``) as ``samples.jsonl``-like
    records with ``mc_advantage`` (each token's share of its unit's Monte-Carlo advantage), the
    run's own estimator's ``token_advantage`` and ``weight``, and the checkpoint step they were
    sampled at. ``([], None)`` when the run has no credit check; a malformed file raises
    ``ValueError`` naming it."""
    path = Path(run_dir) / CREDIT_CHECK_DIR / CREDIT_CHECK_JSON
    if not path.is_file():
        return [], None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        step = int(data["settings"]["checkpoint_step"])
        trajectories = data["trajectories"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a credit_check.json ({error})") from error
    records = []
    for number, traj in enumerate(trajectories, start=1):
        own = traj.get("run_estimator")
        advantages = (traj.get("advantages") or {}).get(own) if own else None
        outcome = finite(traj.get("advantage"))
        weight = None
        if advantages is not None and outcome:
            weight = [None if (a := finite(v)) is None else a / outcome for v in advantages]
        record = {key: traj.get(key) for key in (
            "row", "group", "problem_id", "prompt", "answer", "response", "extracted", "reward",
            "advantage", "finished", "tokens", "token_ids", "mask", "entropy", "divergence",
            "student_logprobs", "teacher_logprobs", "segment_onset", "mc_advantage")}
        record.update(step=step, token_advantage=advantages, weight=weight)
        _check_sample(record, path, number)
        records.append(record)
    return records, step


def _check_sample(sample: dict[str, Any], path: Path, number: int) -> None:
    tokens = sample.get("tokens")
    if not isinstance(tokens, list):
        raise ValueError(f"{path}: record {number} has no 'tokens' list")
    for name in TOKEN_FIELDS:
        values = sample.get(name)
        if values is not None and (not isinstance(values, list) or len(values) != len(tokens)):
            raise ValueError(f"{path}: record {number}: '{name}' must be a list as long as "
                             f"'tokens' ({len(tokens)}), or null")


def eval_keys(metrics: list[dict[str, Any]], prefix: str = "eval/mean@") -> list[str]:
    """The ``eval/mean@K`` (or other ``prefix``) keys present in ``metrics``, sorted by K."""
    keys = {key for record in metrics for key in record if key.startswith(prefix)}

    def k_of(key: str) -> tuple[int, str]:
        tail = key[len(prefix):]
        return (int(tail), key) if tail.isdigit() else (10**9, key)

    return sorted(keys, key=k_of)


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None (a missing value: JSON
    ``NaN``/``Infinity``, null, a string, a bool)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def policy_mask(sample: dict[str, Any]) -> list[int]:
    """The sample's policy-token mask (all 1 when not logged; a value that is not a finite
    number counts as 1, like a mask that was not logged)."""
    mask = sample.get("mask")
    if mask is None:
        return [1] * len(sample["tokens"])
    return [1 if (value := finite(m)) is None else int(value) for m in mask]


def normalized_divergence(sample: dict[str, Any], mode: str = "minmax"
                          ) -> list[float | None] | None:
    """GEAR's per-trajectory normalised divergence ``n_t`` of one sample (docs/design.md step 3:
    min-max over policy tokens by default, 0 on observation tokens), computed by the credit
    package's own :func:`gear_rl.credit.segments.normalize_reference`. None when the sample has
    no divergence. A token whose divergence is missing (null, NaN, infinite) is None and takes
    no part in the normalisation of the others."""
    divergence = sample.get("divergence")
    if divergence is None:
        return None
    values = [finite(v) for v in divergence]
    mask = [m if v is not None else 0 for v, m in zip(values, policy_mask(sample), strict=True)]
    normalized = normalize_reference([0.0 if v is None else v for v in values], mask, mode)
    return [None if v is None else n for v, n in zip(values, normalized, strict=True)]


@dataclass(frozen=True)
class TokenCount:
    """One row of the top-divergence-tokens table.

    Attributes:
        token: the decoded token text.
        above: policy-token occurrences with normalised divergence above the threshold.
        total: all policy-token occurrences of the token in the samples.
        mean_normalized: mean normalised divergence over the ``above`` occurrences.
    """

    token: str
    above: int
    total: int
    mean_normalized: float


def top_divergence_tokens(samples: list[dict[str, Any]], threshold: float = 0.1,
                          mode: str = "minmax", limit: int = 30) -> list[TokenCount]:
    """The tokens most often above a normalised divergence of ``threshold`` across ``samples``
    (the paper's Figure 2 analysis), most frequent first (ties: higher share above first).
    Only policy tokens count; samples without divergence are skipped."""
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit!r}")
    above: Counter[str] = Counter()
    total: Counter[str] = Counter()
    sums: defaultdict[str, float] = defaultdict(float)
    for sample in samples:
        normalized = normalized_divergence(sample, mode)
        if normalized is None:
            continue
        for token, value, on in zip(sample["tokens"], normalized, policy_mask(sample), strict=True):
            if not on or value is None:
                continue
            total[token] += 1
            if value > threshold:
                above[token] += 1
                sums[token] += value
    rows = [TokenCount(token, count, total[token], sums[token] / count)
            for token, count in above.items()]
    rows.sort(key=lambda r: (-r.above, -r.above / r.total, r.token))
    return rows[:limit]


def weight_stats_by_step(samples: list[dict[str, Any]]) -> dict[str, dict[int, tuple[float,
                                                                                      float]]]:
    """Per sign (``pos``: advantage > 0, ``neg``: < 0) and step, ``(mean, std)`` of the token
    weights ``W_t`` over the policy tokens of that step's logged samples. The trainer logs only
    the mean weight per sign in ``metrics.jsonl``; the spread comes from here. Weights and
    advantages that are not finite numbers (``NaN``, null) are left out."""
    pooled: dict[str, defaultdict[int, list[float]]] = {"pos": defaultdict(list),
                                                        "neg": defaultdict(list)}
    for sample in samples:
        weights, advantage, step = sample.get("weight"), finite(sample.get("advantage")), \
            sample.get("step")
        if weights is None or not advantage or not isinstance(step, int):
            continue
        sign = "pos" if advantage > 0 else "neg"
        pooled[sign][step] += [w for w, m in zip(map(finite, weights), policy_mask(sample),
                                                 strict=True) if m and w is not None]
    return {sign: {step: (statistics.fmean(v), statistics.pstdev(v))
                   for step, v in sorted(by_step.items()) if v}
            for sign, by_step in pooled.items()}
