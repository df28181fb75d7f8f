"""Tools an agent can call: a sandboxed Python executor.

``PythonSandbox`` runs model-written Python in warm, isolated worker processes, each in a root of
its own built from an allowlist; see :mod:`gear_rl.agent.tools.sandbox` for what is enforced and
how, and ``docs/sandbox.md``.
"""

from gear_rl.agent.tools.sandbox import (
    DEFAULT_PACKAGES,
    GUARANTEES,
    LIMIT_NAMES,
    PythonSandbox,
    SandboxResult,
    check_mounts,
)

__all__ = ["DEFAULT_PACKAGES", "GUARANTEES", "LIMIT_NAMES", "PythonSandbox", "SandboxResult",
           "check_mounts"]
