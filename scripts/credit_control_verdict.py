"""The credit-control study's pre-registered decisions, applied to its report as written
(issue 39; the rules are in ``studies/credit_control.yaml``, written before its first cell).

    python scripts/credit_control_verdict.py [results/study/credit_control/study.json]

Reads the study report's numbers (``study.json``: held-out Mean@4 at the final step, each
method's paired difference from grpo and the file's ``contrasts``) and prints, in markdown:

- per task, H1 (``spo_chain`` or ``vineppo`` better than grpo: the 95% interval of the paired
  difference lies above 0), H2 (the same against ``grpo_tokens``, grpo at equal sampled tokens)
  and the task's verdict: "credit does not limit learning here" when neither holds; when one
  does, "credit limits learning, and GEAR finds it" if gear's difference over grpo lies inside
  that Monte-Carlo method's interval over grpo and gear's own interval lies above 0, and "credit
  limits learning, GEAR does not find it" if gear's interval includes 0. The rule compares gear
  with grpo (not with grpo_tokens, for which the file registers no gear contrast) whichever
  hypothesis held. On step 5's task (``products_first``) it adds the share of the Monte-Carlo
  method's gain that gear captures (gear's difference over the method's, point estimates), as
  the file's step-5 reading asks. A case the rules do not name (gear beyond noise on either
  side of the Monte-Carlo interval, or below grpo beyond noise) is printed as such;
- GEAR's default (issue 39, step 6), on the first two tasks (the file keeps the rule to them):
  ``gear_mp`` replaces ``gear`` if on both its paired difference over gear is not below
  -MDD, and on at least one the difference's interval lies above 0 or gear has a collapsed seed
  (final Mean@4 below the step-0 score) that gear_mp does not have.

"gear's MDD" in the file is read as the MDD of the paired ``gear_mp`` - ``gear`` contrast (the
rule says "paired, 5 seeds"; that contrast is the paired comparison of the two). This reading was
written down on 2026-12-06 (fifth session) with grpo_weak's task at 2 of 5 seeds; the other
reading (gear's MDD against grpo) is printed beside it with whether the two agree.

A task or rule whose methods have fewer than 5 finished seeds is printed as pending, with what is
left. The rules are registered for one reading of the report (:data:`REGISTERED`: held-out
Mean@4, 95% intervals, against grpo): a ``study.json`` judged under another (the study file's
metric, baseline, confidence or k changed) is refused, naming what differs, and the amendments
its registration records (``gear-rl study ... amend=``) are printed above the verdicts. Needs no
model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SEEDS = 5
MONTE_CARLO = ("spo_chain", "vineppo")
DEFAULT_TASKS = ("products", "products_work")  # the rule's "both tasks" (the study file)
STEP5 = "products_first"  # issue 39 step 5's task: the file adds the share gear captures
DEFAULT = Path("results/study/credit_control/study.json")
REGISTERED = {"metric": "mean@k", "baseline": "grpo", "confidence": 0.95, "k": 4}
"""The reading of the report the file's rules were written for (held-out Mean@4 at the final
step, 95% paired intervals, every method against grpo)."""
# the report's own reading of each interval (gear_rl.stats.verdict, stored in every "versus")
BETTER, WITHIN = "better beyond noise", "within noise"


def _method(task: dict[str, Any], key: str) -> dict[str, Any]:
    for method in task["methods"]:
        if method["key"] == key:
            return method
    raise KeyError(f"task {task['key']!r} has no method {key!r}")


def _versus(task: dict[str, Any], key: str, against: str, baseline: str) -> dict[str, Any]:
    """The paired difference ``key - against`` at the final step, as the report computed it."""
    if against == baseline:
        versus = _method(task, key)["versus"]
    else:
        versus = next((c["versus"] for c in task.get("contrasts", [])
                       if c["key"] == key and c["against"] == against), None)
    if versus is None:
        raise KeyError(f"task {task['key']!r}: the report has no contrast {key} vs {against}")
    return versus


def _pending(task: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """The cells still missing before ``keys`` have :data:`SEEDS` finished seeds each."""
    missing: list[str] = []
    for key in keys:
        method = _method(task, key)
        if len(method["seeds"]) < SEEDS:
            missing.extend(method["unfinished"] or [f"{key} ({len(method['seeds'])} seeds)"])
    return missing


def _diff(versus: dict[str, Any]) -> str:
    return f"{versus['difference']:+.3f} [{versus['low']:+.3f}, {versus['high']:+.3f}]"


def task_verdict(task: dict[str, Any], baseline: str = "grpo") -> list[str]:
    """Markdown lines: H1, H2 and the verdict on one task (or what it still waits for)."""
    keys = (baseline, *MONTE_CARLO, "gear", "grpo_tokens")
    lines = [f"### `{task['key']}`: {task['label']}", ""]
    missing = _pending(task, keys)
    if missing:
        return [*lines, f"Pending: {len(missing)} cell(s) left ({', '.join(missing)}).", ""]
    held = []
    for hypothesis, against in (("H1", baseline), ("H2", "grpo_tokens")):
        for key in MONTE_CARLO:
            versus = _versus(task, key, against, baseline)
            holds = versus["verdict"] == BETTER
            lines.append(f"- {hypothesis}: {key} vs {against}: {_diff(versus)}: "
                         + ("**holds**" if holds else "does not hold"))
            if holds:
                held.append(key)
    if not held:
        even = ", even where the truth concentrates on a few tokens" if task["key"] == STEP5 else ""
        return [*lines, "", f"**Verdict: credit does not limit learning here{even}.**", ""]
    gear = _versus(task, "gear", baseline, baseline)
    lines.append(f"- gear vs {baseline}: {_diff(gear)}")
    outcomes = set()
    for key in dict.fromkeys(held):
        mc = _versus(task, key, baseline, baseline)
        inside = mc["low"] <= gear["difference"] <= mc["high"]
        if gear["verdict"] == WITHIN:
            outcomes.add("credit limits learning, GEAR does not find it")
        elif inside and gear["verdict"] == BETTER:
            outcomes.add("credit limits learning, and GEAR finds it")
        else:
            outcomes.add(f"a case the rules do not name: gear's difference {_diff(gear)} against "
                         f"{key}'s interval [{mc['low']:+.3f}, {mc['high']:+.3f}]")
        if task["key"] == STEP5 and mc["difference"] > 0:
            lines.append(f"- share of {key}'s gain that gear captures (point estimates, the "
                         f"file's step-5 reading): {gear['difference'] / mc['difference']:.2f}")
    return [*lines, "", *(f"**Verdict: {text}.**" for text in sorted(outcomes)), ""]


def gear_default(tasks: list[dict[str, Any]], baseline: str = "grpo") -> list[str]:
    """Markdown lines: GEAR's default rule over :data:`DEFAULT_TASKS`."""
    lines = ["### GEAR's default (issue 39, step 6)", ""]
    by_key = {task["key"]: task for task in tasks}
    absent = [key for key in DEFAULT_TASKS if key not in by_key]
    if absent:
        return [*lines, f"Pending: the report has no task {', '.join(absent)}.", ""]
    missing = [cell for key in DEFAULT_TASKS
               for cell in _pending(by_key[key], ("gear", "gear_mp"))]
    if missing:
        return [*lines, f"Pending: {len(missing)} cell(s) left ({', '.join(missing)}).", ""]
    keeps = {"contrast": True, "against grpo": True}
    better = False
    for key in DEFAULT_TASKS:
        task = by_key[key]
        versus = _versus(task, "gear_mp", "gear", baseline)
        gear_mdd = _method(task, "gear")["versus"]["mdd"]
        collapsed = sorted(set(_method(task, "gear")["ended_below_start"])
                           - set(_method(task, "gear_mp")["ended_below_start"]))
        keeps["contrast"] &= versus["difference"] >= -versus["mdd"]
        keeps["against grpo"] &= versus["difference"] >= -gear_mdd
        better |= versus["verdict"] == BETTER or bool(collapsed)
        lines.append(f"- `{key}`: gear_mp - gear {_diff(versus)}, MDD {versus['mdd']:.3f} "
                     f"(gear's against {baseline}: {gear_mdd:.3f}); gear's collapsed seeds that "
                     f"gear_mp's are not: {', '.join(map(str, collapsed)) or 'none'}")
    replace = keeps["contrast"] and better
    other = keeps["against grpo"] and better
    lines += ["", f"Not below gear by more than the MDD on both tasks: "
              f"{'yes' if keeps['contrast'] else 'no'} (the other reading of the MDD: "
              f"{'yes' if keeps['against grpo'] else 'no'}); better on at least one: "
              f"{'yes' if better else 'no'}.", "",
              "**Decision: " + ("gear_mp replaces gear as the default (credit.mean_preserving="
                                "true)." if replace else "the default stays (credit."
                                "mean_preserving=false).") + "**"
              + ("" if replace == other else " The other reading of the MDD would decide "
                 "otherwise."), ""]
    return lines


def reading(study: dict[str, Any]) -> dict[str, Any]:
    """How ``study`` was judged, in :data:`REGISTERED`'s terms (its metric, baseline,
    confidence and each task's k)."""
    ks = sorted({task["k"] for task in study["tasks"] if task.get("final_step") is not None})
    return {"metric": study["metric"], "baseline": study["baseline"],
            "confidence": study["statistics"]["confidence"],
            "k": ks[0] if len(ks) == 1 else ks or REGISTERED["k"]}


def verdict(study: dict[str, Any]) -> list[str]:
    """All the markdown lines for one ``study.json``.

    Raises:
        ValueError: the report was judged under another reading than :data:`REGISTERED`.
    """
    judged = reading(study)
    wrong = [f"{key} {judged[key]!r} (the rules' {value!r})" for key, value in REGISTERED.items()
             if judged[key] != value]
    if wrong:
        raise ValueError("the report was judged under another reading than the one the file's "
                         f"rules are registered for: {', '.join(wrong)}; write it with the "
                         "registered study file")
    baseline = study["baseline"]
    lines = [f"## The pre-registered decisions of `{study['spec']}`", "",
             "Applied by `scripts/credit_control_verdict.py` to the report's numbers (held-out "
             "Mean@4 at the final step, 95% paired intervals over seeds).", ""]
    amendments = (study.get("registration") or {}).get("amendments") or []
    if amendments:
        lines += [f"The study's registration records {len(amendments)} amendment(s) (study.md "
                  "lists them):"] + [f"- {a['date']}: {a['reason']} ({', '.join(a['changes'])})"
                                     for a in amendments] + [""]
    for task in study["tasks"]:
        lines += task_verdict(task, baseline)
    return lines + gear_default(study["tasks"], baseline)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, nargs="?", default=DEFAULT,
                        help=f"the study report's study.json (default {DEFAULT})")
    args = parser.parse_args(argv)
    if not args.study.is_file():
        print(f"no study report at {args.study}: run `gear-rl study studies/credit_control.yaml "
              "out=results/study/credit_control train=false` first", file=sys.stderr)
        return 2
    study = json.loads(args.study.read_text(encoding="utf-8"))
    try:
        print("\n".join(verdict(study)))
    except KeyError as exc:
        print(f"{args.study}: {exc.args[0]}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"{args.study}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
