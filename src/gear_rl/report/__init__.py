"""Reading runs, never making them: the plots and the token-credit viewer of a run (``gear-rl
report``) and the method comparison across seeds of finished runs (``gear-rl compare``). Reads
what the trainer writes (``config.yaml``, ``metrics.jsonl``, ``samples.jsonl``,
``summary.json``) and the credit check's ``credit_check.json``, by :mod:`gear_rl.rundir`'s
names. It imports neither the trainer nor the credit check: training the runs of a comparison
is :mod:`gear_rl.study.compare`'s.
"""

from gear_rl.report.compare import Comparison, MethodResult, compare_runs
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
    "top_divergence_tokens",
    "training_curves",
]
