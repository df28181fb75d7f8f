"""The one switch of gear-rl's CPU mode for verl jobs: verl's own ``VERL_PLATFORM=cpu``.

Read by both plugins that make a verl job run on a CPU, the verl platform
(``gear_rl.integrations.verl.cpu``) and the vLLM-CPU weight fix (``gear_rl.integrations.vllm_cpu``).
This module imports neither verl nor vLLM, so a vLLM process without verl can read it too.
"""

from __future__ import annotations

import os

PLATFORM_ENV = "VERL_PLATFORM"  # verl's own switch (platform_manager._detect_platform_name)
PLATFORM_NAME = "cpu"


def cpu_mode_requested() -> bool:
    """Whether ``VERL_PLATFORM`` names the CPU platform (case and spaces ignored, as verl)."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM_NAME
