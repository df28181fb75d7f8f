"""Tools an agent can call: a sandboxed Python executor.

``PythonSandbox`` runs model-written code in warm, isolated worker processes; see
:mod:`gear_rl.agent.tools.sandbox` for what is enforced and how.
"""

from gear_rl.agent.tools.sandbox import LIMIT_NAMES, PythonSandbox, SandboxResult

__all__ = ["LIMIT_NAMES", "PythonSandbox", "SandboxResult"]
