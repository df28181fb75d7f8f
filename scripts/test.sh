#!/usr/bin/env bash
# The README's test command: sets up .venv, checks lint, runs the whole suite (slow tests too).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow".
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
source scripts/setup_venv.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
ruff check src tests benchmarks
python -m pytest "$@"
