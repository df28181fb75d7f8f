"""gear-rl: fine-grained credit assignment for RL on LLM agents."""

import os

__version__ = "0.1.0"

ONEDNN_PRIMITIVE_CACHE = 128
"""The most compiled oneDNN kernels a gear-rl process keeps (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``,
oneDNN's default 1024). Under bf16 autocast on a CPU, oneDNN compiles a kernel per operand
shape, and a run's shapes change every step (prompt and response lengths), so the cache filled
with one-off kernels and a run's resident memory grew about 1 MB a step, 250 MB over 300 steps
(flat in fp32, which oneDNN does not serve, and with a capacity of 8). Set here, where gear-rl is
first imported and before torch starts oneDNN (which reads it once); torch has no API for it. A
value the user sets wins. docs/speed.md has the measurements."""
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_PRIMITIVE_CACHE))
