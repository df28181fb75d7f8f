"""`gear-rl` command line. Subcommands: ``demo`` (credit functions on a synthetic batch),
``train`` (RL fine-tuning, GEAR by default), ``eval`` (held-out Mean@k / pass@k), ``export``
(a checkpoint as a Hugging Face model directory), ``report``
(curves and the token-credit viewer of a run), ``compare`` (methods over seeds),
``credit-check`` (every estimator's per-token credit against a Monte-Carlo ground truth),
``study`` (pre-registered paired multi-seed studies, docs/study.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import sys
import textwrap

from gear_rl.rundir import DISK_FULL  # the ground floor: no torch, cheap to import
from gear_rl.stop import StopSignal, exit_code, stop_signals


def _demo(argv: list[str]) -> int:
    from gear_rl.demo import run_demo

    parser = argparse.ArgumentParser(prog="gear-rl demo", description=run_demo.__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=8, help="trajectories (groups of 4)")
    parser.add_argument("--length", type=int, default=24, help="response tokens per trajectory")
    args = parser.parse_args(argv)
    run_demo(seed=args.seed, batch=args.batch, length=args.length)
    return 0


_TRAIN_USAGE = """usage: gear-rl train [CONFIG.yaml] [key=value ...]

RL fine-tuning of a causal LM with a credit estimator (GEAR by default) on a laptop CPU.
Defaults: SmolLM2-135M-Instruct on one-digit products (reasoning-gym). Keys use dots for
nested fields, e.g.
  gear-rl train estimator=grpo steps=20 rollout.temperature=0.8 credit.lambda_kl=0.2
Continue an interrupted run:  gear-rl train resume=runs/RUN_DIR [steps=N]
The credit keys listed are those of the estimator chosen on the command line (or in CONFIG.yaml):
gear-rl train estimator=rlsd --help
"""

_HELP_WIDTH = 100
_HELP_INDENT = "      "


def _shown(value: object) -> str:
    """``value`` as it would be written in a ``key=value`` override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if re.fullmatch(r"[\w.:/+-]+", value) else json.dumps(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return str(value)


def _plain(doc: str) -> str:
    """``doc`` without its reST literal quotes (``x`` -> x)."""
    return re.sub(r"``(.*?)``", r"\1", doc)


def _key_lines(key: str, default: object, doc: str) -> list[str]:
    """``key = default`` and its meaning, wrapped below it."""
    return [f"  {key} = {_shown(default)}", *textwrap.wrap(
        _plain(doc) or "(undocumented)", _HELP_WIDTH, initial_indent=_HELP_INDENT,
        subsequent_indent=_HELP_INDENT, break_on_hyphens=False, break_long_words=False)]


def _train_help(argv: list[str]) -> str:
    """``gear-rl train --help``: every key with its default and meaning (each field's
    ``Attributes:`` entry), the credit keys of the estimator ``argv`` chooses, and the
    registered estimators."""
    from gear_rl.credit import estimator_names, get_estimator
    from gear_rl.dataclass_config import field_default, field_docs
    from gear_rl.train.config import TrainConfig, load_config

    config_path, overrides = _split_train_args([a for a in argv if a not in ("-h", "--help")])
    estimator = load_config(config_path, overrides, validate=False).credit_estimator()
    paper = f" ({estimator.paper})" if estimator.paper else ""
    lines = [_TRAIN_USAGE, f"estimator={estimator.name}: {estimator.description}{paper}",
             "credit keys (credit.KEY=VALUE):"]
    docs = field_docs(estimator.config_cls)
    try:  # each key's default as it resolves (a None that means "not set" shows its value)
        resolved = estimator.make_config()
    except (TypeError, ValueError):
        resolved = None
    for name, credit_field in estimator.config_fields().items():
        default = field_default(credit_field) if resolved is None else getattr(resolved, name)
        lines.extend(_key_lines(f"credit.{name}", default, docs[name]))
    lines.extend(f"  (credit.{name} is pinned to {_shown(value)} by this estimator's name)"
                 for name, value in estimator.fixed.items())
    names = estimator_names()
    width = max(len(name) for name in names) + 2
    lines.append("\nregistered estimators (estimator=NAME --help lists its credit keys):")
    lines.extend(f"  {name:<{width}}{get_estimator(name).description}" for name in names)
    lines.append("\nkeys (KEY = DEFAULT, then what it sets):")
    sections = []
    docs = field_docs(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        default, doc = field_default(f), docs[f.name]
        if dataclasses.is_dataclass(default):
            sections.append((f.name, default))
        elif isinstance(default, dict):
            listed = (f"; those of estimator={estimator.name} are listed above."
                      if f.name == "credit" else ".")
            lines.extend(_key_lines(f"{f.name}.<key>", default, doc.rstrip(".") + listed))
        else:
            lines.extend(_key_lines(f.name, default, doc))
    for name, section in sections:
        headline = " ".join((type(section).__doc__ or "").split("\n\n")[0].split())
        lines.append("")
        lines.extend(textwrap.wrap(f"{name}: {_plain(headline)}", _HELP_WIDTH,
                                   subsequent_indent="  "))
        docs = field_docs(type(section))
        for f in dataclasses.fields(section):
            lines.extend(_key_lines(f"{name}.{f.name}", field_default(f), docs[f.name]))
    return "\n".join(lines)


_EVAL_USAGE = """usage: gear-rl eval [RUN_DIR | CHECKPOINT_DIR] [key=value ...]

Held-out Mean@k and pass@k (eval.k samples per problem, eval.temperature, eval.top_p). With a run
directory, its config (model, task) and latest checkpoint are used; otherwise the keys say which
model (model=smollm2-135m | tiny-random | PATH) and task. Prints one JSON object; records=true
adds per-problem results.
"""


def _split_train_args(argv: list[str], first: str = "a config file"
                      ) -> tuple[str | None, list[str]]:
    """``[FIRST] key=value ...``: the optional positional first argument (``first`` names it
    in the error) and the overrides."""
    from gear_rl.dataclass_config import is_override, shown

    config_path: str | None = None
    overrides: list[str] = []
    for arg in argv:
        if not is_override(arg) and config_path is None and not overrides:
            config_path = arg
        elif not is_override(arg):
            raise ValueError(f"argument {shown(arg)} is not key=value (only the first argument "
                             f"may be {first})")
        else:
            overrides.append(arg)
    return config_path, overrides




def _no_space(verb: str, error: OSError, where: object, then: str) -> int:
    """Say that the disk is full (where, and ``then``: what was kept and the command that
    continues) instead of an ``OSError`` traceback; returns the exit status, 1."""
    print(f"gear-rl {verb}: no space left on {error.filename or where}; {then}", file=sys.stderr)
    return 1


def _train_stopped(run_dir: object, argv: list[str]) -> str:
    """What a run stopped early keeps, and the command that continues it: ``resume=`` when it
    has a checkpoint, else starting it again (a run folder without one cannot be resumed)."""
    from gear_rl.rundir import RunDir

    run = RunDir(str(run_dir))
    last = run.latest_checkpoint()
    if last is not None:
        return (f"the last checkpoint, {last.name}, is kept (steps logged after it are dropped "
                f"when the run continues); continue with: gear-rl train resume={run.path}")
    return (f"no checkpoint was written yet, so there is nothing to resume: remove {run.path} "
            f"and start again with: {shlex.join(['gear-rl', 'train', *argv])}")


def _train(argv: list[str]) -> int:
    from gear_rl.dataclass_config import parse_overrides
    from gear_rl.train.config import load_config

    config = None
    try:
        if any(a in ("-h", "--help") for a in argv):
            print(_train_help(argv))
            return 0
        config_path, overrides = _split_train_args(argv)
        parsed = parse_overrides(overrides)
        if parsed.get("resume"):
            from gear_rl.train.resume import resume_config

            if config_path is not None:
                raise ValueError("resume=RUN_DIR takes the run's own config; drop CONFIG.yaml")
            run_dir = parsed.pop("resume")
            config = resume_config(str(run_dir), parsed)
        else:
            config = load_config(config_path, overrides)
        from gear_rl.train.resume import run_path
        from gear_rl.train.trainer import Trainer, format_summary

        config.out = config.out or str(run_path(config))  # fixed: a full disk message names it
        trainer = Trainer(config)
    except ValueError as error:
        print(f"gear-rl train: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.errno not in DISK_FULL or config is None:
            raise
        return _no_space("train", error, config.out, _train_stopped(config.out, argv))
    print(f"[gear-rl] run directory: {trainer.run_dir}", file=sys.stderr)
    from gear_rl.train.trainer import NonFiniteTrainingError

    try:
        summary = trainer.train()
    except KeyboardInterrupt:
        print(f"\ngear-rl train: interrupted; {_train_stopped(trainer.run_dir, argv)}",
              file=sys.stderr)
        return 130
    except NonFiniteTrainingError as error:
        print(f"gear-rl train: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        return _no_space("train", error, trainer.run_dir,
                         _train_stopped(trainer.run_dir, argv))
    print(format_summary(summary))
    return 0


def _eval(argv: list[str]) -> int:
    from gear_rl.dataclass_config import coerce, parse_overrides
    from gear_rl.train.config import load_config, valid_keys

    if any(a in ("-h", "--help") for a in argv):
        print(_EVAL_USAGE + "\nvalid keys:\n  " + "\n  ".join(valid_keys()))
        return 0
    try:
        target, overrides = _split_train_args(argv)
        parsed = parse_overrides(overrides)
        records = coerce("records", parsed.pop("records", False), bool)
        overrides = [o for o in overrides if o.partition("=")[0].strip() != "records"]
        checkpoint = None
        if target is not None:
            from pathlib import Path

            from gear_rl.rundir import RunDir
            from gear_rl.train.config import config_from_dict, recorded_config

            path = Path(target)
            # a run directory, or one of its checkpoints/step-N folders
            run = RunDir(path) if RunDir(path).is_run() else RunDir(path.parent.parent)
            if not run.is_run():
                hint = (f"; to score the model directory (gear-rl export) use model={target}"
                        if (path / "config.json").is_file() else "")
                raise ValueError(f"{target} is not a gear-rl run directory or checkpoint "
                                 f"folder{hint}")
            config = recorded_config(run.read_config())
            config.resume = None
            config_from_dict(parsed, config)
            config.validate()
            checkpoint = path
        else:
            config = load_config(None, overrides)
        from gear_rl.train.evaluate import evaluate_model

        result = evaluate_model(config, checkpoint)
    except ValueError as error:
        print(f"gear-rl eval: {error}", file=sys.stderr)
        return 2
    if not records:
        result.pop("records")
    result.update({"model": config.model, "checkpoint": str(checkpoint) if checkpoint else None,
                   "task": config.task})
    if result.get("checkpoint_folder"):  # a run's newest checkpoint: say which step was scored
        print(f"[gear-rl] scored {result['checkpoint_folder']} (step "
              f"{result['checkpoint_step']})", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


_EXPORT_USAGE = """usage: gear-rl export RUN [step=N] OUT [dtype=auto|fp32|bf16]

Write the weights of a run's checkpoint (step=N, default: the latest) with the run's tokenizer
and chat template into OUT, a new folder that AutoModelForCausalLM.from_pretrained(OUT),
AutoTokenizer.from_pretrained(OUT), vLLM and `gear-rl eval model=OUT` load. dtype=auto keeps
the checkpoint's fp32. OUT must not exist (or be an empty folder); it appears whole or not at all.
"""


def _export(argv: list[str]) -> int:
    from gear_rl.dataclass_config import is_override, parse_overrides

    if any(a in ("-h", "--help") for a in argv):
        print(_EXPORT_USAGE)
        return 0
    paths: list[str] = []
    try:
        paths = [a for a in argv if not is_override(a)]  # runs/lr=3e-5 is a path
        parsed = parse_overrides([a for a in argv if is_override(a)])
        unknown = sorted(set(parsed) - {"step", "dtype", "out"})
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}: export takes step=N and "
                             "dtype=auto|fp32|bf16")
        if "out" in parsed:
            paths.append(str(parsed["out"]))
        if len(paths) != 2:
            raise ValueError(f"expected a run directory and an output folder, got {paths}: "
                             "gear-rl export RUN [step=N] OUT [dtype=auto|fp32|bf16]")
        step = parsed.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise ValueError(f"step={step!r} is not a whole number")
        from gear_rl.train.export import export_policy

        info = export_policy(paths[0], paths[1], step=step, dtype=str(parsed.get("dtype", "auto")))
    except ValueError as error:
        print(f"gear-rl export: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        return _no_space("export", error, paths[1], "nothing was written; free some space and "
                         "run the same command again")
    print(f"[gear-rl] exported step {info['step']} of {info['run']} ({info['dtype']}) to "
          f"{info['out']}", file=sys.stderr)
    print(json.dumps(info, indent=2))
    return 0


def _report(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gear-rl report",
        description="Write a self-contained HTML report (curves, token-credit viewer, tokens "
                    "most often above a normalised divergence) and PNG curves of a run.")
    parser.add_argument("run_dir", help="a gear-rl train run directory")
    parser.add_argument("--out", default=None, help="output folder (default RUN_DIR/report)")
    parser.add_argument("--max-steps", type=int, default=60,
                        help="most logged steps the viewer embeds, evenly spaced (default 60)")
    parser.add_argument("--threshold", type=float, default=0.1,
                        help="normalised-divergence threshold of the top-tokens table")
    args = parser.parse_args(argv)
    from gear_rl.report import build_report

    try:
        report = build_report(args.run_dir, args.out, max_steps=args.max_steps,
                              threshold=args.threshold)
    except ValueError as error:
        print(f"gear-rl report: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        return _no_space("report", error, args.out or args.run_dir,
                         "the run itself is untouched (the report only reads it); free some "
                         "space and write the report again with: "
                         f"{shlex.join(['gear-rl', 'report', *argv])}")
    for note in report.skipped:
        print(f"[gear-rl] skipped {note}", file=sys.stderr)
    for path in report.plots:
        print(f"[gear-rl] plot {path}", file=sys.stderr)
    print(report.html)
    return 0


_COMPARE_EPILOG = """examples:
  gear-rl compare runs/grpo-s0 runs/grpo-s1 runs/gear-s0 runs/gear-s1 --out cmp/
  gear-rl compare --estimators grpo,gear --seeds 0,1,2 --out cmp/ steps=20 eval.every=5

Runs are grouped by estimator (and credit.* overrides) and seed from their config.yaml. Each
run's final held-out Mean@k is one observation; the table gives the mean over seeds, a Student-t
interval, and Welch's test against the baseline (grpo when present), saying "within noise" when
it is not significant.
"""


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") \
            from error


def _compare_stopped(args: argparse.Namespace, argv: list[str]) -> str:
    """What an interrupted ``gear-rl compare`` keeps, and how to continue: with
    ``--estimators``, the same command reuses the finished runs and resumes the interrupted
    ones from their last checkpoint, except a run stopped before its first checkpoint, which
    must be removed first (:func:`gear_rl.study.compare.run_comparison` refuses it)."""
    from pathlib import Path

    from gear_rl.rundir import RunDir

    again = shlex.join(["gear-rl", "compare", *argv])
    if args.estimators is None or args.out is None or not Path(args.out).is_dir():
        return f"the run directories are untouched; compare them again with: {again}"
    stuck = [str(path) for path in sorted(Path(args.out).iterdir())
             if path.is_dir() and RunDir(path).state() == "no_checkpoint"]
    first = (f"first remove {', '.join(stuck)} (stopped before its first checkpoint, there is "
             "nothing to resume), then " if stuck else "")
    return (f"the finished runs under {args.out} are kept, and a run with a checkpoint continues "
            f"from it; {first}continue with the same command: {again}")


def _compare(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gear-rl compare", epilog=_COMPARE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare credit estimators over seeds: read run directories, or train each "
                    "(estimator, seed) with the same config and budget; writes compare.md, "
                    "compare.json and curves.png.")
    parser.add_argument("items", nargs="*", metavar="RUN_DIR | key=value",
                        help="run directories to compare, or (with --estimators) train "
                             "overrides shared by every run")
    parser.add_argument("--estimators", default=None,
                        help="comma-separated estimators to train, e.g. grpo,gear")
    parser.add_argument("--seeds", type=_int_list, default=None,
                        help="comma-separated seeds (with --estimators; default 0,1)")
    parser.add_argument("--config", default=None, help="train config YAML shared by all runs")
    parser.add_argument("--out", default=None,
                        help="output folder (default ./compare; required with --estimators: "
                             "the runs go under it)")
    parser.add_argument("--baseline", default=None, help="method to compare against "
                        "(default grpo when present, else the first)")
    parser.add_argument("--confidence", type=float, default=0.95, help="interval level")
    parser.add_argument("--alpha", type=float, default=0.05, help="Welch-test level")
    parser.add_argument("--allow-mismatch", action="store_true",
                        help="compare runs whose task, model, budget or eval settings differ "
                             "(the tables then list the differing settings)")
    args = parser.parse_args(argv)
    from gear_rl.dataclass_config import check_output_folder, is_override
    from gear_rl.report.compare import compare_runs, format_comparison

    try:
        if args.estimators is not None:
            from gear_rl.study.compare import run_comparison  # trains: imports the trainer

            overrides = list(args.items)
            if not all(is_override(item) for item in overrides):
                raise ValueError("with --estimators, positional arguments are train key=value "
                                 "overrides; pass run directories without --estimators")
            if args.out is None:
                raise ValueError("--out is required with --estimators (the runs go under it)")
            check_output_folder(args.out, "--out")  # before any run trains
            estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
            comparison = run_comparison(
                estimators, args.seeds if args.seeds is not None else [0, 1], args.out,
                config_path=args.config, overrides=overrides, baseline=args.baseline,
                confidence=args.confidence, alpha=args.alpha,
                allow_mismatch=args.allow_mismatch)
        else:
            if args.seeds is not None or args.config is not None:
                raise ValueError("--seeds and --config need --estimators (they say what to "
                                 "train)")
            if not args.items or any(is_override(item) for item in args.items):
                raise ValueError("give run directories to compare, or --estimators to train")
            comparison = compare_runs(args.items, args.out or "compare", baseline=args.baseline,
                                      confidence=args.confidence, alpha=args.alpha,
                                      allow_mismatch=args.allow_mismatch)
    except ValueError as error:
        print(f"gear-rl compare: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ngear-rl compare: interrupted; {_compare_stopped(args, argv)}", file=sys.stderr)
        return 130
    print(format_comparison(comparison))
    print(f"\n[gear-rl] wrote {comparison.markdown} and {comparison.curves}", file=sys.stderr)
    return 0


_CREDIT_CHECK_USAGE = """usage: gear-rl credit-check [RUN_DIR | model=... task=...] [key=value ...]

Is the credit right? Samples trajectories in full prompt groups with the trainer's sampler,
estimates each chosen trajectory's per-token Monte-Carlo advantage V(x, y_<=t) - V(x, y_<t)
(continuations from every prefix), scores every applicable estimator (and the variants asked
for) against it, and writes credit_check.md, credit_check.json and credit_check.png under out=
(default RUN_DIR/credit_check, or ./credit_check). Rerunning the same command continues an
interrupted check. Definitions: docs/credit_check.md.

With RUN_DIR, the run's config (model, task, sampler, signals) and newest intact checkpoint are
used; only device, threads, precision, rollout.batch_size, signals.batch_size,
signals.chunk_size and plugins may change. Otherwise any gear-rl train key sets them
(model=smollm2-135m task=products rollout.temperature=...).

examples:
  gear-rl credit-check runs/RUN_DIR groups=32 continuations=16
  gear-rl credit-check model=smollm2-135m task=products estimators=grpo,gear,rlsd \\
      variant.gear_k1.estimator=gear variant.gear_k1.signals.divergence=k1 \\
      variant.gear_lh.estimator=gear variant.gear_lh.credit.lambda_h=1.2 out=cc/
"""


def _credit_check_help() -> str:
    from gear_rl.credit_check import CreditCheckConfig
    from gear_rl.dataclass_config import field_default, field_docs

    lines = [_CREDIT_CHECK_USAGE, "keys (KEY = DEFAULT, then what it sets):",
             *_key_lines("out", None, "the output folder (default RUN_DIR/credit_check, or "
                         "./credit_check)")]
    docs = field_docs(CreditCheckConfig)
    for f in dataclasses.fields(CreditCheckConfig):
        if f.name == "variants":
            lines.extend(_key_lines("variant.NAME.estimator", None,
                                    "a reading scored beside the defaults, named NAME"))
            lines.extend(_key_lines("variant.NAME.credit.FIELD", None,
                                    "a config field of that estimator"))
            lines.extend(_key_lines("variant.NAME.signals.KEY", None,
                                    "divergence, topk, placement or answer_template for that "
                                    "variant only"))
            continue
        lines.extend(_key_lines(f.name, field_default(f), docs[f.name]))
    return "\n".join(lines)


def _credit_check(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(_credit_check_help())
        return 0
    out = None
    try:
        import dataclasses as _dc
        from pathlib import Path

        from gear_rl.credit_check import (
            CREDIT_CHECK_DIR,
            CreditCheckConfig,
            credit_check,
            run_check_config,
        )
        from gear_rl.dataclass_config import parse_overrides
        from gear_rl.train.config import TrainConfig, config_from_dict

        target, items = _split_train_args(argv, first="a run directory")
        parsed = parse_overrides(items)
        fields = {f.name for f in _dc.fields(CreditCheckConfig)}
        check_values = {k: v for k, v in parsed.items()
                        if k in fields or k.startswith("variant.")}
        train_values = {k: v for k, v in parsed.items()
                        if k not in check_values and k != "out"}
        check = CreditCheckConfig.from_overrides(check_values)
        checkpoint, step = None, 0
        if target is not None:
            config, checkpoint, step = run_check_config(target, train_values)
            out = Path(parsed.get("out") or Path(target) / CREDIT_CHECK_DIR)
        else:
            config = config_from_dict(train_values, TrainConfig())
            config.validate()
            out = Path(parsed.get("out") or CREDIT_CHECK_DIR)
        result = credit_check(config, check, out, checkpoint=checkpoint, checkpoint_step=step)
    except ValueError as error:
        print(f"gear-rl credit-check: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        from gear_rl.rundir import CREDIT_CHECK_VALUES

        values = Path(out or ".") / CREDIT_CHECK_VALUES
        kept = (f"the finished trajectories are kept in {values}" if values.is_file()
                else "no trajectory was finished yet")
        return _no_space("credit-check", error, out or ".",
                         f"{kept}; free some space and continue with the same command: "
                         f"{shlex.join(['gear-rl', 'credit-check', *argv])}")
    except KeyboardInterrupt:
        print(f"\ngear-rl credit-check: interrupted; the finished trajectories are kept in "
              f"{out}/values.jsonl: rerun the same command to continue", file=sys.stderr)
        return 130
    print(result.table)
    written = [result.markdown, result.json] + ([result.plot] if result.plot else [])
    print(f"[gear-rl] wrote {', '.join(map(str, written))}", file=sys.stderr)
    if not result.complete:
        print("[gear-rl] the token budget stopped the check before every trajectory had its "
              "truth; rerun with a larger budget= to continue", file=sys.stderr)
    return 0


def _study(argv: list[str]) -> int:
    from gear_rl.study.cli import main as study

    return study(argv)


COMMANDS = {"demo": _demo, "train": _train, "eval": _eval, "export": _export, "report": _report,
            "compare": _compare, "credit-check": _credit_check, "study": _study}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gear-rl`` console script."""
    # OpenMP's default spin-waiting makes torch's CPU threads burn their time slices when the
    # cores are shared (measured here: a SmolLM2 decoding step 0.6 s of CPU alone, 7-8 s with
    # two spinning threads beside other busy processes). Passive waiting costs little when the
    # machine is idle. Must be set before torch starts its thread pool; an explicit setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: gear-rl {" + ",".join(COMMANDS) + "} [args...]")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"gear-rl: unknown command {command!r}; choose from {sorted(COMMANDS)}",
              file=sys.stderr)
        return 2
    # SIGTERM and SIGHUP take each command's Ctrl-C path (gear_rl.stop): a run keeps its
    # checkpoints, a study stops its cells, instead of dying on the spot
    with stop_signals():
        try:
            return COMMANDS[command](rest)
        except StopSignal as stop:  # a command without a Ctrl-C path of its own
            print(f"gear-rl {command}: stopped by {stop}", file=sys.stderr)
            return exit_code(stop)


if __name__ == "__main__":
    sys.exit(main())
