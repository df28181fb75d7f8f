"""Agent rollouts: multi-turn generation with tool calls and observation masks.

- :mod:`gear_rl.agent.parsing`: the ``<python>``, Markdown-fence and ``<tool_call>`` formats and
  their parser.
- :mod:`gear_rl.agent.loop`: the batched multi-turn loop (``run_agent``) over any ``generate``
  function, tool executors, per-token masks / turn ids / observation spans, metrics.
- :mod:`gear_rl.agent.tools`: ``PythonSandbox``, the isolated executor for model-written code.

Importing this package does not import torch.
"""

from gear_rl.agent.loop import (
    AgentLimits,
    AgentLoopConfig,
    EpisodePrefix,
    GenerateFn,
    PythonExecutor,
    ToolExecutor,
    ToolOutput,
    Trajectory,
    TurnRecord,
    format_sandbox_output,
    holds_call,
    run_agent,
    trajectories_to_tensors,
    trajectory_metrics,
)
from gear_rl.agent.parsing import (
    JSON_FORMAT,
    MARKDOWN_PYTHON_FORMAT,
    MARKDOWN_TOOL_INSTRUCTIONS,
    PYTHON_FORMAT,
    PYTHON_TOOL_INSTRUCTIONS,
    ParsedTurn,
    ToolCall,
    ToolCallFormat,
    get_format,
    parse_json_calls,
    parse_turn,
)

__all__ = [
    "JSON_FORMAT",
    "MARKDOWN_PYTHON_FORMAT",
    "MARKDOWN_TOOL_INSTRUCTIONS",
    "PYTHON_FORMAT",
    "PYTHON_TOOL_INSTRUCTIONS",
    "AgentLimits",
    "AgentLoopConfig",
    "EpisodePrefix",
    "GenerateFn",
    "ParsedTurn",
    "PythonExecutor",
    "ToolCall",
    "ToolCallFormat",
    "ToolExecutor",
    "ToolOutput",
    "Trajectory",
    "TurnRecord",
    "format_sandbox_output",
    "get_format",
    "holds_call",
    "parse_json_calls",
    "parse_turn",
    "run_agent",
    "trajectories_to_tensors",
    "trajectory_metrics",
]
