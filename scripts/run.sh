#!/usr/bin/env bash
# The README's run command: sets up .venv and runs the main job on the bundled default.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
source scripts/setup_venv.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec gear-rl train "$@"
