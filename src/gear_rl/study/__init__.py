"""Orchestration: training many runs and studying them. Pre-registered, paired, multi-seed
studies of credit estimators (``gear-rl study``), and the in-process training of a plain
comparison (``gear-rl compare --estimators``).

- :mod:`gear_rl.study.spec`: the study file (tasks, methods, seeds, budget, baseline, metric);
- :mod:`gear_rl.study.runner`: trains every cell, resumably, in parallel processes
  (:mod:`gear_rl.study.cell`: one cell's process); :func:`~gear_rl.study.runner.run_state`:
  what a planned run folder holds;
- :mod:`gear_rl.study.report`: ``study.md``, ``study.json`` and the figures, with the paired
  bootstrap, seed-level test, verdicts and MDD of :mod:`gear_rl.stats`;
- :mod:`gear_rl.study.compare`: ``gear-rl compare --estimators`` (train each estimator and seed,
  then :func:`gear_rl.report.compare.compare_runs`);
- :mod:`gear_rl.study.cli`: ``gear-rl study``'s command line.

docs/study.md describes the file and every number.
"""

from gear_rl.study.report import StudyResult, analyze_study, write_study
from gear_rl.study.runner import StudyRun, run_study
from gear_rl.study.spec import Cell, MethodSpec, StudySpec, TaskSpec, load_spec, parse_spec

__all__ = ["Cell", "MethodSpec", "StudyResult", "StudyRun", "StudySpec", "TaskSpec",
           "analyze_study", "load_spec", "parse_spec", "run_study", "write_study"]
