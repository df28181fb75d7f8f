"""What GEAR's weights would be on a run's logged trajectories, if each succeeded or failed.

    python scripts/gear_weights_by_sign.py RUN_DIR [--format markdown] [credit.KEY=VALUE ...]

For every trajectory of ``RUN_DIR/samples.jsonl`` (per-token divergence, entropy and policy
mask, as the trainer logged them), recomputes GEAR's per-token weight ``W`` (docs/design.md,
steps 3-7) for a hypothetical outcome advantage ``A = +1`` and ``A = -1`` under the run's credit
config (``credit.KEY=VALUE`` overrides it), and prints the mean ``W`` per sign: over all
trajectories, over those that made a tool call (an observation in the response) and those that
did not, and over the policy tokens inside a tool call (``--format``'s call spans) and outside.
GRPO's weight is 1 everywhere; a mean below 1 on successes and above 1 on failures is the sign
asymmetry of docs/credit_check.md ("mean W"). Needs no model: the signals are the logged ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import yaml

from gear_rl.agent.parsing import get_format
from gear_rl.credit import GEARConfig
from gear_rl.credit.gear import gear_advantages
from gear_rl.credit.registry import upgrade_recorded_config
from gear_rl.rundir import RunDir


def call_flags(tokens: list[str], fmt_name: str) -> list[bool]:
    """Per token, whether it lies inside a complete tool call of format ``fmt_name``."""
    fmt = get_format(fmt_name)
    starts, text = [], ""
    for token in tokens:
        starts.append(len(text))
        text += token
    spans, offset = [], 0
    while (span := fmt.call_span(text[offset:])) is not None:
        spans.append((offset + span[0], offset + span[1]))
        offset += span[1]
    return [any(a <= s < b for a, b in spans) for s in starts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--format", default="markdown", help="tool-call format of the task")
    parser.add_argument("overrides", nargs="*", help="credit.KEY=VALUE")
    args = parser.parse_args()
    # read as a recorded config: a run recorded before mean_preserving became the default
    # keeps the False it trained with
    credit = dict(upgrade_recorded_config(RunDir(args.run_dir).read_config()).get("credit")
                  or {})
    for item in args.overrides:
        key, _, value = item.partition("=")
        if not key.startswith("credit."):
            parser.error(f"{item!r}: only credit.KEY=VALUE overrides")
        credit[key.removeprefix("credit.")] = yaml.safe_load(value)
    gear = GEARConfig(**credit)
    lines = (args.run_dir / "samples.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    if not records or records[0].get("divergence") is None:
        print(f"{args.run_dir}: no logged divergence (run GEAR with log.samples_per_step > 0)",
              file=sys.stderr)
        return 2
    by_kind: dict[str, list[float]] = {}
    for record in records:
        shape = (1, len(record["mask"]))
        divergence = torch.tensor(record["divergence"]).reshape(shape)
        entropy = torch.tensor(record["entropy"]).reshape(shape)
        mask = torch.tensor(record["mask"], dtype=torch.float32).reshape(shape)
        weights = {sign: (gear_advantages(torch.tensor([sign]), divergence, entropy, mask, gear)
                          / sign)[0] for sign in (1.0, -1.0)}
        policy = [i for i, m in enumerate(record["mask"]) if m]
        called = 0 in record["mask"]
        inside = call_flags(record["tokens"], args.format)
        for sign, name in ((1.0, "success"), (-1.0, "failure")):
            w = weights[sign]
            mean = float(w[policy].mean())
            by_kind.setdefault(f"{name}: every trajectory", []).append(mean)
            by_kind.setdefault(f"{name}: trajectories with a tool call" if called else
                               f"{name}: trajectories without", []).append(mean)
            for flag, label in ((True, "tokens inside a call"), (False, "tokens outside")):
                tokens = [float(w[i]) for i in policy if inside[i] == flag]
                by_kind.setdefault(f"{name}: {label}", []).extend(tokens)
    print(f"{len(records)} logged trajectories of {args.run_dir}; credit {credit or 'default'}")
    for label, values in by_kind.items():
        if values:
            print(f"  mean W if {label:42s} {statistics.mean(values):.3f}  (n={len(values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
