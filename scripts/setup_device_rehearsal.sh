#!/usr/bin/env bash
# Builds (once) and reuses .venv/device-rehearsal: a CPU stand-in for the lent GPU machine's own
# python3, for `scripts/device_check.sh --rehearse`. Source it or run it; it leaves
# $GEAR_RL_REHEARSAL_PY naming the environment's python. Rebuilt only when this file,
# scripts/device_wheels.py or pyproject.toml changes.
#
# A venv without system site-packages holding only what the lent machine has that gear-rl uses
# (scripts/device_wheels.py --rehearsal-requirements: the machine's versions where known,
# transformers 5.17.0 among them; torch 2.13.0+cpu instead of 2.11.0+cu130, the nearest a
# registry here serves). gear-rl itself is NOT installed here, and neither is anything it needs
# beyond the machine: scripts/device_check.sh installs the carried wheels with pip --no-index at
# every run, as on the machine, and puts src/ on PYTHONPATH.
_gear_rl_reh_saved_opts="$(set +o)"
case $- in *e*) _gear_rl_reh_saved_opts+=$'\nset -o errexit' ;; *) _gear_rl_reh_saved_opts+=$'\nset +o errexit' ;; esac
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
reh_env="$repo_root/.venv/device-rehearsal"
python_bin="${PYTHON:-python3}"
stamp="$(cat "$repo_root/scripts/setup_device_rehearsal.sh" "$repo_root/scripts/device_wheels.py" \
  "$repo_root/pyproject.toml" | sha256sum | cut -c1-16)"
py="$reh_env/bin/python"
if [ "$(cat "$reh_env/.gear-rl-stamp" 2>/dev/null)" != "$stamp" ] || [ ! -x "$py" ]; then
  echo "[setup-device-rehearsal] building $reh_env (the lent machine's packages, CPU torch)" >&2
  rm -rf "$reh_env"
  mkdir -p "$repo_root/.venv"
  "$python_bin" -m venv "$reh_env"
  "$py" -m pip install -q --disable-pip-version-check --upgrade pip packaging
  pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  # the wheel set for this python (its manifest names the machine-side requirements)
  "$py" "$repo_root/scripts/device_wheels.py" --python-version "$pyver" > "$reh_env.wheels.log"
  "$py" "$repo_root/scripts/device_wheels.py" --python-version "$pyver" --rehearsal-requirements \
    > "$reh_env/requirements.txt"
  "$py" -m pip install -q --disable-pip-version-check -r "$reh_env/requirements.txt"
  rm -f "$reh_env.wheels.log"
  echo "$stamp" > "$reh_env/.gear-rl-stamp"
fi
export GEAR_RL_REHEARSAL_PY="$py"
eval "$_gear_rl_reh_saved_opts"
unset _gear_rl_reh_saved_opts
