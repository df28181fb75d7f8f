"""Pre-registered, paired, multi-seed studies of credit estimators (``gear-rl study``).

- :mod:`gear_rl.study.spec`: the study file (tasks, methods, seeds, budget, baseline, metric);
- :mod:`gear_rl.study.runner`: trains every cell, resumably, in parallel processes;
- :mod:`gear_rl.study.stats`: the paired bootstrap, seed-level test, verdicts and MDD;
- :mod:`gear_rl.study.report`: ``study.md``, ``study.json`` and the figures.

docs/study.md describes the file and every number.
"""

from gear_rl.study.report import StudyResult, analyze_study, write_study
from gear_rl.study.runner import StudyRun, run_study
from gear_rl.study.spec import Cell, MethodSpec, StudySpec, TaskSpec, load_spec, parse_spec
from gear_rl.study.stats import paired_difference, verdict

__all__ = ["Cell", "MethodSpec", "StudyResult", "StudyRun", "StudySpec", "TaskSpec",
           "analyze_study", "load_spec", "paired_difference", "parse_spec", "run_study",
           "verdict", "write_study"]
