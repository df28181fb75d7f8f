"""Plots and the token-credit viewer of a run (``gear-rl report``), and the method comparison
across seeds (``gear-rl compare``). Reads what the trainer writes: ``config.yaml``,
``metrics.jsonl``, ``samples.jsonl``."""

from gear_rl.report.compare import (
    Comparison,
    MethodResult,
    compare_runs,
    run_comparison,
    t_interval,
    welch_test,
)
from gear_rl.report.data import RunData, load_run, normalized_divergence, top_divergence_tokens
from gear_rl.report.html import Report, build_report
from gear_rl.report.plots import training_curves

__all__ = [
    "Comparison",
    "MethodResult",
    "Report",
    "RunData",
    "build_report",
    "compare_runs",
    "load_run",
    "normalized_divergence",
    "run_comparison",
    "t_interval",
    "top_divergence_tokens",
    "training_curves",
    "welch_test",
]
