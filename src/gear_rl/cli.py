"""`gear-rl` command line. Subcommands: ``demo`` (credit functions on a synthetic batch)."""

from __future__ import annotations

import argparse
import sys


def _demo(argv: list[str]) -> int:
    from gear_rl.demo import run_demo

    parser = argparse.ArgumentParser(prog="gear-rl demo", description=run_demo.__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=8, help="trajectories (groups of 4)")
    parser.add_argument("--length", type=int, default=24, help="response tokens per trajectory")
    args = parser.parse_args(argv)
    run_demo(seed=args.seed, batch=args.batch, length=args.length)
    return 0


COMMANDS = {"demo": _demo}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gear-rl`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: gear-rl {" + ",".join(COMMANDS) + "} [args...]")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"gear-rl: unknown command {command!r}; choose from {sorted(COMMANDS)}",
              file=sys.stderr)
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
