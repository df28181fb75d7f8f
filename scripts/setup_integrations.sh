#!/usr/bin/env bash
# Adds verl 0.9.1 and TRL 1.16 to the .venv that scripts/setup_venv.sh made. Source it after
# setup_venv.sh. Re-installs only when this file changes. verl's v1 trainer (the GEAR trainer mode)
# and real verl jobs run in a separate environment, .venv/verl-cpu (scripts/setup_verl_cpu.sh):
# hydra-core 1.3.8 needs antlr4 4.9 where .venv holds 4.13 for math-verify, and TRL 1.16 here
# breaks verl's FSDP worker.
#
# .venv gets verl (--no-deps) with what `import verl` and verl.trainer.ppo.core_algos need on
#    CPU, and TRL. Not `pip install gear-rl[verl]`: verl 0.9.1 pins tensordict<=0.10 and its CPU
#    extra pins torch==2.11, neither of which fits this CPU env (torch==2.13.0); verl itself is
#    pure Python. A constraints file holds torch, transformers, numpy and tokenizers at what is
#    installed, so nothing here can swap them (a plain resolve could pull a multi-GB CUDA torch).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/.venv"
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "[setup-integrations] $venv is missing: source scripts/setup_venv.sh first" >&2
  return 1 2>/dev/null || exit 1
fi
stamp="$(cat "$repo_root/scripts/setup_integrations.sh" "$venv/.gear-rl-stamp" 2>/dev/null \
  | sha256sum | cut -c1-16)"
if [ "$(cat "$venv/.gear-rl-integrations-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "[setup-integrations] installing verl 0.9.1 and TRL 1.16 into .venv" >&2
  constraints="$(mktemp)"
  "$py" - "$constraints" <<'EOF'
import sys
from importlib.metadata import version
with open(sys.argv[1], "w") as f:
    for name in ("torch", "transformers", "numpy", "tokenizers"):
        f.write(f"{name}=={version(name)}\n")
EOF
  pip_install() {
    local python="$1"
    shift
    "$python" -m pip install -q --disable-pip-version-check --no-warn-conflicts \
      -c "$constraints" "$@"
  }
  pip_install "$py" --no-deps "verl==0.9.1"
  # tensordict: verl asks <=0.10, whose wheels are built for older torch; 0.15 runs DataProto on
  # torch 2.13 (tests/test_integration_verl.py). omegaconf 2.4: the one that runs on antlr 4.13.
  # torchdata, peft, cachetools, fastapi, uvicorn: imported at module level by
  # verl.trainer.ppo.ray_trainer (where compute_advantage lives), checked on a fresh clone.
  pip_install "$py" "ray>=2.41" "tensordict>=0.10" "omegaconf>=2.4" codetiming orjson \
    torchdata peft cachetools fastapi uvicorn "trl==1.16.0"
  # Re-register gear-rl's entry points (verl.plugins) in case pyproject.toml changed them.
  "$py" -m pip install -q --disable-pip-version-check --no-deps -e "$repo_root"
  rm -f "$constraints"
  # pip's conflict warnings are off above (--no-warn-conflicts): verl keeps its tensordict pin
  # and bfcl-eval (setup_venv.sh) its numpy, networkx and filelock pins. This accepts exactly
  # those, saying why each is safe, and fails on any other.
  "$py" "$repo_root/scripts/pip_conflicts.py"
  echo "$stamp" > "$venv/.gear-rl-integrations-stamp"
fi
