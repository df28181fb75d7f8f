"""``gear-rl study SPEC.yaml [out=DIR] [budget=NAME] [jobs=N] [threads=N] [methods=A,B]
[seeds=0,1] [tasks=A,B] [train=false] [progress=false] [amend=WHY]``."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

USAGE = """usage: gear-rl study SPEC.yaml [out=DIR] [budget=NAME] [jobs=N] [threads=N]
                     [methods=A,B] [seeds=0,1] [tasks=A,B] [train=false]
                     [progress=false] [amend=WHY]

Train every cell (task x method x seed) of a study file with identical settings, then write
study.md, study.json and plots/ into out= (default runs/study/<name>). Rerun the same command
to continue an interrupted study: finished cells are never rerun, interrupted ones resume from
their checkpoint. The study files of the project are under studies/; docs/study.md describes
the file and every number.

  out=DIR       the study folder (cells/, logs, results; default runs/study/<name>, or
                runs/study/<name>-<budget> with budget=)
  budget=NAME   lay the study file's budgets.NAME over its budget (verl: in a verl study),
                e.g. a GPU study scaled to a CPU
  jobs=N        cells trained at once, each in its own process (default: one per core,
                bounded by memory; measured faster than fewer cells with more threads,
                benchmarks/study_parallel.py). A verl study (engine: verl): one cell at a time
                on a CPU; with GPUs, N cells of trainer.n_gpus_per_node GPUs each (default:
                as many as the visible GPUs hold), each with its own CUDA_VISIBLE_DEVICES
  threads=N     torch threads per cell (default: cores / jobs; a verl cell: its ranks share
                the cores)
  methods=A,B   train only these methods' cells (e.g. the baseline and the method under
                test first); the others wait for a later run. The report covers every
                finished cell.
  seeds=0,1     train only these seeds' cells (with methods=, both must match)
  tasks=A,B     train only these tasks' cells (e.g. the cheaper task first; with methods=
                or seeds=, all must match)
  train=false   only write the results from the cells finished so far
  progress=false  no progress bar
  amend=WHY     record a change of the study file made after cells finished (its metric,
                baseline, statistics, methods, seeds...) as an amendment, with this reason:
                without it such a change is refused. The date, the reason and the old and
                new values go into OUT/registration.json and study.md. What a finished cell
                trained under cannot be amended (retrain it, or choose another out=).
"""

_KEYS = ("out", "budget", "jobs", "threads", "methods", "seeds", "tasks", "train", "progress",
         "amend")


def _bool(key: str, value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"{key} must be true or false, got {value!r}")


def _positive(key: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return int(value)


def _names(key: str, value: str) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise ValueError(f"{key} must be a comma-separated list, got {value!r}")
    return names


def _seeds(value: str) -> list[int]:
    names = _names("seeds", value)
    if not all(name.lstrip("-").isdigit() for name in names):
        raise ValueError(f"seeds must be comma-separated integers, got {value!r}")
    return [int(name) for name in names]


def main(argv: list[str]) -> int:
    """The ``gear-rl study`` command; returns its exit status (0 done, 1 a cell failed or the
    study was interrupted, 2 a bad spec or argument)."""
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0 if argv else 2
    from gear_rl.dataclass_config import check_output_folder, is_override
    from gear_rl.rundir import RunDir
    from gear_rl.study.report import analyze_study, write_study
    from gear_rl.study.runner import register_study, run_study, select_cells
    from gear_rl.study.spec import load_spec

    try:
        path, *rest = argv
        if is_override(path):
            raise ValueError(f"the first argument is the study file, got {path!r}")
        options: dict[str, str] = {}
        for item in rest:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"argument {item!r} is not key=value")
            if key not in _KEYS:
                close = difflib.get_close_matches(key, _KEYS, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"valid: {', '.join(_KEYS)}"
                raise ValueError(f"unknown argument {key!r}; {hint}")
            options[key] = value
        spec = load_spec(path, budget=options.get("budget"))
        default = spec.name + (f"-{spec.budget_name}" if spec.budget_name else "")
        out = check_output_folder(options.get("out") or Path("runs") / "study" / default,
                                  "out")  # a file there: one line, not a traceback
        jobs = _positive("jobs", options["jobs"]) if "jobs" in options else None
        threads = _positive("threads", options["threads"]) if "threads" in options else None
        train = _bool("train", options.get("train", "true"))
        progress = _bool("progress", options.get("progress", "true"))
        methods = _names("methods", options["methods"]) if "methods" in options else None
        seeds = _seeds(options["seeds"]) if "seeds" in options else None
        tasks = _names("tasks", options["tasks"]) if "tasks" in options else None
        selected = select_cells(spec, methods, seeds, tasks)  # a bad one fails before training
        amend = options.get("amend")
        run = None
        if train:
            run = run_study(spec, out, jobs=jobs, threads=threads, progress=progress,
                            methods=methods, seeds=seeds, tasks=tasks, amend=amend)
        else:
            for line in register_study(spec, out, amend=amend):
                print(line, file=sys.stderr)
        result = write_study(analyze_study(spec, out))
    except ValueError as error:
        print(f"gear-rl study: {error}", file=sys.stderr)
        return 2
    print(f"[gear-rl] wrote {result.markdown} and {result.json}", file=sys.stderr)
    if run is not None and run.interrupted:
        print("gear-rl study: interrupted; rerun the same command to continue (finished cells "
              "are kept)", file=sys.stderr)
        return 1
    if run is not None and len(selected) < len(run.planned):
        waiting = [p.cell.name for p in run.planned if p.cell not in selected
                   and not RunDir(p.run_dir).finished()]
        if waiting:
            print(f"gear-rl study: {len(waiting)} cell(s) outside methods=/seeds=/tasks= not "
                  f"trained yet ({', '.join(waiting[:6])}{', ...' if len(waiting) > 6 else ''}); "
                  "rerun without them to complete the study", file=sys.stderr)
    if run is not None and run.failed:
        names = ", ".join(o.cell.name for o in run.failed)
        print(f"gear-rl study: {len(run.failed)} cell(s) failed: {names}; their logs are "
              f"beside their folders under {out}/cells; rerun to retry them", file=sys.stderr)
        return 1
    return 0
