#!/usr/bin/env bash
# Adds verl 0.9.1 and TRL 1.16 to the .venv that scripts/setup_venv.sh made, and builds a thin venv
# (at .venv/verl-overlay) for the tests of the verl trainer mode. Source it after setup_venv.sh. Re-installs only when
# this file changes.
#
# 1. .venv gets verl (--no-deps) with what `import verl` and verl.trainer.ppo.core_algos need on
#    CPU, and TRL. Not `pip install gear-rl[verl]`: verl 0.9.1 pins tensordict<=0.10 and its CPU
#    extra pins torch==2.11, neither of which fits this CPU env (torch==2.13.0); verl itself is
#    pure Python. A constraints file holds torch, transformers, numpy and tokenizers at what is
#    installed, so nothing here can swap them (a plain resolve could pull a multi-GB CUDA torch).
# 2. .venv/verl-overlay: verl's v1 trainer (which the GEAR trainer mode subclasses) imports hydra, and
#    hydra-core 1.3.8 (the newest) needs antlr4-python3-runtime 4.9, while .venv holds 4.13.2 for
#    math-verify[antlr4_13_2] (and omegaconf 2.4 with it). So the overlay is a thin venv that
#    sees all of .venv through a .pth file and adds, ahead of it, antlr4 4.9.3, omegaconf 2.3.1,
#    hydra-core and the v1 trainer's other imports (TransferQueue, FastAPI, ...). Only
#    tests/test_integration_verl_trainer.py runs there:
#        .venv/verl-overlay/bin/python -m pytest tests/test_integration_verl_trainer.py
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/.venv"
verl_venv="$venv/verl-overlay"  # inside .venv: ignored by git, rebuilt with it
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "[setup-integrations] $venv is missing: source scripts/setup_venv.sh first" >&2
  return 1 2>/dev/null || exit 1
fi
stamp="$(cat "$repo_root/scripts/setup_integrations.sh" "$venv/.gear-rl-stamp" 2>/dev/null \
  | sha256sum | cut -c1-16)"
if [ "$(cat "$venv/.gear-rl-integrations-stamp" 2>/dev/null)" != "$stamp" ] \
    || [ ! -x "$verl_venv/bin/python" ]; then
  echo "[setup-integrations] installing verl 0.9.1 and TRL 1.16 into .venv, building .venv/verl-overlay" >&2
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
    "$python" -m pip install -q --disable-pip-version-check -c "$constraints" "$@"
  }
  # --- 1. .venv: verl core, TRL -------------------------------------------------------------
  pip_install "$py" --no-deps "verl==0.9.1"
  # tensordict: verl asks <=0.10, whose wheels are built for older torch; 0.15 runs DataProto on
  # torch 2.13 (tests/test_integration_verl.py). omegaconf 2.4: the one that runs on antlr 4.13.
  # torchdata, peft, cachetools, fastapi, uvicorn: imported at module level by
  # verl.trainer.ppo.ray_trainer (where compute_advantage lives), checked on a fresh clone.
  pip_install "$py" "ray>=2.41" "tensordict>=0.10" "omegaconf>=2.4" codetiming orjson \
    torchdata peft cachetools fastapi uvicorn "trl==1.16.0"
  # Re-register gear-rl's entry points (verl.plugins) in case pyproject.toml changed them.
  "$py" -m pip install -q --disable-pip-version-check --no-deps -e "$repo_root"
  # --- 2. the overlay: .venv plus what verl's v1 trainer imports ------------------------------
  rm -rf "$verl_venv"
  "$py" -m venv "$verl_venv"
  base_site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  verl_site="$("$verl_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # A .pth line that starts with "import" runs at start-up; addsitedir also processes .venv's own
  # .pth files (the editable gear-rl install among them). Its paths come after the overlay's own.
  echo "import site; site.addsitedir('$base_site')" > "$verl_site/zz_gear_rl_base_venv.pth"
  # pip sees .venv's packages as installed and adds only what is missing or must differ; it
  # never touches .venv ("outside environment").
  pip_install "$verl_venv/bin/python" "antlr4-python3-runtime==4.9.3" "omegaconf==2.3.1" \
    "hydra-core==1.3.8" "TransferQueue==0.1.11" pyzmq msgspec datasets torchdata cachetools \
    fastapi uvicorn peft
  rm -f "$constraints"
  echo "$stamp" > "$venv/.gear-rl-integrations-stamp"
fi
