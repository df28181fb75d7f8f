"""A verl tool that runs model-written Python in gear-rl's sandbox (``PythonSandbox``).

For the tool-integrated math setting (``SETTING=tir`` in ``recipes/verl/run_gear_qwen3_4b.sh``,
verl's ``tool_agent`` loop): ``recipes/verl/python_tool.yaml`` declares it. The class follows verl
0.9.1's ``verl/tools/base_tool.py`` (``BaseTool``: ``create`` / ``execute`` / ``calc_reward`` /
``release``, all ``async``; ``OpenAIFunctionToolSchema`` and ``ToolResponse`` from
``verl/tools/schemas.py``) and is built by ``verl/tools/tool_registry.py``
(``initialize_tools_from_config``) from a tool-config YAML::

    tools:
      - class_name: gear_rl.integrations.verl.tools.PythonSandboxTool
        config: {type: native, workers: 4, timeout_s: 10, memory_mb: 1024}
        tool_schema: {type: function, function: {name: python, ...}}

How verl 0.9.1 drives it (``verl/experimental/agent_loop/tool_agent_loop.py``, ``_call_tool``):
for every call, ``create(create_kwargs=...)``, then ``execute(instance_id, arguments,
agent_data=...)``, then ``release(instance_id)``; an exception becomes the text "Error executing
tool ..." shown to the model; the response text is cut again at
``actor_rollout_ref.rollout.multi_turn.max_tool_response_length``. verl also builds the tools in
the process that filters over-long prompts (``verl/utils/dataset/rl_dataset.py``), which never
calls them; so the sandbox's workers start at the first ``execute``, not in ``__init__``.

Isolation: the code runs only inside :class:`~gear_rl.agent.tools.PythonSandbox`, used as is
(its allowlisted root, namespaces, uid drop, seccomp, limits; see ``docs/sandbox.md``): nothing of
the host but the interpreter and the declared ``packages`` shows (not the checkout, the data, the
model cache or the run's outputs), and ``hidden`` paths never show even under an exposed
directory. The tool owns the warm workers: one pool per tool object, shared by all its instances
(``create`` / ``release`` only book-keep an instance), stopped by :meth:`PythonSandboxTool.close`,
by garbage collection (``__del__``) and at interpreter exit (the pool's own finaliser).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from gear_rl.agent.loop import format_sandbox_output
from gear_rl.agent.tools import DEFAULT_PACKAGES, PythonSandbox, SandboxResult, check_mounts
from gear_rl.integrations.verl.data import TOOL_NAME

__all__ = ["PythonSandboxTool", "SandboxToolConfig", "default_tool_schema"]

logger = logging.getLogger(__name__)

CODE_PARAMETER = "code"
"""The one argument the tool reads: Python source."""


def default_tool_schema(name: str = TOOL_NAME) -> OpenAIFunctionToolSchema:
    """The schema used when the tool config gives none: one required string ``code``."""
    return OpenAIFunctionToolSchema.model_validate({
        "type": "function",
        "function": {
            "name": name,
            "description": "Run Python code in a sandbox and return what it prints (stdout; on "
                           "an error also the end of the traceback). Each call starts fresh: "
                           "nothing is kept between calls. No network, no files of the host.",
            "parameters": {
                "type": "object",
                "properties": {CODE_PARAMETER: {
                    "type": "string",
                    "description": "Python source to run; print() whatever you need to see."}},
                "required": [CODE_PARAMETER],
            },
        },
    })


# (minimum, maximum) of each numeric key; one call's limits, except workers (the pool's size)
_RANGES: dict[str, tuple[float, float]] = {
    "workers": (1, 64),
    "timeout_s": (0.1, 600.0),
    "memory_mb": (64, 65536),
    "cpu_s": (0.1, 600.0),
    "max_processes": (1, 1024),
    "max_output_bytes": (1024, 16 * 1024 * 1024),
    "max_response_chars": (64, 1024 * 1024),
    "scratch_mb": (1, 4096),
}
_INTEGER_KEYS = ("workers", "memory_mb", "max_processes", "max_output_bytes",
                 "max_response_chars", "scratch_mb")


@dataclass(frozen=True)
class SandboxToolConfig:
    """The ``config:`` mapping of the tool's entry in a verl tool-config YAML.

    Attributes:
        type: verl's tool type; ``"native"``, the only one verl 0.9.1 has.
        workers: warm sandbox workers of this tool object (calls that run at once; verl builds
            one tool object per agent-loop worker process).
        timeout_s: wall-time limit of one call, seconds (whole process tree killed).
        memory_mb: address-space limit of each process of one call, MiB (>= 64).
        cpu_s: CPU-time limit of one call (None: ``timeout_s``).
        max_processes: processes and threads one call may have at once.
        max_output_bytes: cap on each of stdout and stderr; a call printing more is killed and
            told "output too long".
        max_response_chars: the text returned to the model is cut to this many characters (its
            start and end kept).
        scratch_mb: size of the call's private scratch file system.
        packages: what the code may import (with their requirements); the standard library is
            always there.
        mounts: absolute paths the code may read (read-only, same path).
        hidden: absolute paths the code must never see, even under an exposed directory (the
            run's data and output directories; the checkout is always hidden).
        require_isolation: refuse to start unless the sandbox has full root-mode isolation
            (the error is logged once and every call returns it as its text); false: a reduced
            mode is logged as a warning and the calls run.
    """

    type: str = "native"
    workers: int = 2
    timeout_s: float = 10.0
    memory_mb: int = 1024
    cpu_s: float | None = None
    max_processes: int = 32
    max_output_bytes: int = 64 * 1024
    max_response_chars: int = 4096
    scratch_mb: int = 64
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    mounts: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    require_isolation: bool = False

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any] | None) -> SandboxToolConfig:
        """Check ``config`` (the YAML's ``config:``) and build the settings.

        Raises:
            ValueError: naming the key, for an unknown key, a value of the wrong type, a number
                outside its range (``_RANGES``), a path that is not absolute or a mount that
                does not exist or overlaps a hidden path.
        """
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise ValueError(f"tool config must be a mapping, got {type(config).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(config) - set(names))
        if unknown:
            raise ValueError(f"tool config: unknown key(s) {unknown}; known: {names}")
        values: dict[str, Any] = dict(config)
        if values.get("type", "native") != "native":
            raise ValueError(f"tool config 'type' must be 'native', got {values['type']!r}")
        for key, (low, high) in _RANGES.items():
            if key not in values or (key == "cpu_s" and values[key] is None):
                continue
            value = values[key]
            integer = key in _INTEGER_KEYS
            if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
                kind = "an integer" if integer else "a number"
                raise ValueError(f"tool config '{key}' must be {kind}, got {value!r}")
            if not math.isfinite(value) or not low <= value <= high:
                raise ValueError(f"tool config '{key}' must be in [{low:g}, {high:g}], got "
                                 f"{value!r}")
        if not isinstance(values.get("require_isolation", False), bool):
            raise ValueError("tool config 'require_isolation' must be true or false, got "
                             f"{values['require_isolation']!r}")
        for key in ("packages", "mounts", "hidden"):
            if key in values:
                items = values[key]
                if isinstance(items, str) or not isinstance(items, Sequence) or not all(
                        isinstance(item, str) and item for item in items):
                    raise ValueError(f"tool config '{key}' must be a list of strings, got "
                                     f"{items!r}")
                values[key] = tuple(items)
        bad = [p for p in values.get("hidden", ()) if not os.path.isabs(p)]
        if bad:
            raise ValueError(f"tool config 'hidden': {bad[0]!r} is not an absolute path")
        check_mounts(list(values.get("mounts", ())), list(values.get("hidden", ())),
                     name="tool config 'mounts'")
        return cls(**values)


def _cut(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, its start and end kept."""
    if len(text) <= limit:
        return text
    marker = f"\n...[{len(text) - limit} characters cut]...\n"
    head = (limit - len(marker)) // 2
    tail = max(limit - len(marker) - head, 0)
    return text[:max(head, 0)] + marker + (text[-tail:] if tail else "")


class PythonSandboxTool(BaseTool):
    """Runs the ``code`` argument in a :class:`~gear_rl.agent.tools.PythonSandbox` and returns
    what it printed (``gear_rl.agent.loop.format_sandbox_output``: stdout; on failure the end of
    stderr and a line naming the limit that was hit), cut to ``max_response_chars``.

    Args:
        config: the YAML's ``config:`` mapping (:class:`SandboxToolConfig`).
        tool_schema: the YAML's ``tool_schema`` (None: :func:`default_tool_schema`); its
            parameters must include a string ``code``.

    The step reward of a call (``execute``'s second value, and ``calc_reward``) is 0.0: the
    outcome reward decides. ``execute``'s metrics: ``exit_code`` (-1: none), ``timed_out``,
    ``limit_hit`` (1.0 when any limit ended the call), ``duration_s``.
    """

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None
                 ) -> None:
        self.settings = SandboxToolConfig.from_mapping(config)
        schema = tool_schema if tool_schema is not None else default_tool_schema()
        parameters = schema.function.parameters
        code = parameters.properties.get(CODE_PARAMETER)
        if code is None or code.type != "string":
            raise ValueError(f"tool schema of {schema.function.name!r}: its parameters need a "
                             f"string {CODE_PARAMETER!r} property (got "
                             f"{sorted(parameters.properties)})")
        self._sandbox: PythonSandbox | None = None
        self._start_error: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._instances: dict[str, int] = {}
        super().__init__(dict(config or {}), schema)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    # --- the sandbox ---------------------------------------------------------------------------
    def _pool(self) -> PythonSandbox:
        """The warm pool, started on first use (in the calling thread)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"tool {self.name!r} is closed")
            if self._start_error is not None:  # not retried: a start fails for a reason
                raise RuntimeError(f"the Python sandbox did not start: {self._start_error}")
            if self._sandbox is None:
                s = self.settings
                try:
                    self._sandbox = PythonSandbox(
                        workers=s.workers, timeout_s=s.timeout_s, memory_mb=s.memory_mb,
                        cpu_s=s.cpu_s, max_processes=s.max_processes,
                        max_output_bytes=s.max_output_bytes, scratch_mb=s.scratch_mb,
                        packages=s.packages, mounts=s.mounts, hidden=s.hidden,
                        require_isolation=s.require_isolation)
                except Exception as exc:  # logged once, loudly; every call then reports it
                    logger.error("tool %r: the Python sandbox did not start: %s", self.name, exc)
                    self._start_error = exc
                    raise RuntimeError(f"the Python sandbox did not start: {exc}") from exc
            return self._sandbox

    @property
    def sandbox(self) -> PythonSandbox | None:
        """The running pool, or None before the first call and after :meth:`close`."""
        return self._sandbox

    def close(self) -> None:
        """Stop the sandbox's workers (idempotent); later calls are refused."""
        with self._lock:
            self._closed = True
            sandbox, self._sandbox = self._sandbox, None
            self._instances.clear()
        if sandbox is not None:
            sandbox.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> PythonSandboxTool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- verl's BaseTool interface -------------------------------------------------------------
    async def create(self, instance_id: str | None = None, **kwargs: Any
                     ) -> tuple[str, ToolResponse]:
        """A new instance id (``instance_id`` if given). verl passes ``create_kwargs`` (the row's
        ``extra_info.tools_kwargs``); the tool needs none and never shows them to the code."""
        instance_id = instance_id if instance_id is not None else str(uuid.uuid4())
        self._instances[instance_id] = 0
        return instance_id, ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        """Run ``parameters["code"]`` in the sandbox (in a thread: the event loop keeps serving
        other trajectories). A missing or non-string ``code`` is answered with an error text."""
        code = parameters.get(CODE_PARAMETER) if isinstance(parameters, Mapping) else None
        if not isinstance(code, str) or not code.strip():
            given = sorted(parameters) if isinstance(parameters, Mapping) else parameters
            return (ToolResponse(text=f"Error: call {self.name} with a non-empty string "
                                      f"argument {CODE_PARAMETER!r} (got {given!r})"),
                    0.0, {"exit_code": -1.0, "timed_out": 0.0, "limit_hit": 0.0,
                          "duration_s": 0.0})
        if instance_id in self._instances:
            self._instances[instance_id] += 1
        result = await asyncio.to_thread(self._run, code)
        text = format_sandbox_output(result.stdout, result.stderr, result.exit_code,
                                     result.limit_hit, timeout_s=self.settings.timeout_s)
        metrics = {
            "exit_code": float(result.exit_code if result.exit_code is not None else -1),
            "timed_out": 1.0 if result.limit_hit == "timeout" else 0.0,
            "limit_hit": 1.0 if result.limit_hit is not None else 0.0,
            "duration_s": float(result.duration_s),
        }
        return ToolResponse(text=_cut(text, self.settings.max_response_chars)), 0.0, metrics

    def _run(self, code: str) -> SandboxResult:
        return self._pool().run(code)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """0.0: the tool gives no step reward."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget ``instance_id``. The warm workers stay (verl releases after every call); they
        stop with :meth:`close`."""
        self._instances.pop(instance_id, None)
