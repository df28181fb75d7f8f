#!/usr/bin/env bash
# gear-rl's GPU check. Three forms:
#
#   scripts/device_check.sh                    # the lent machine: its own python3 + carried wheels
#   scripts/device_check.sh --rehearse [--quick]  # the same path on this CPU (CI: --quick)
#   scripts/device_check.sh --full [...]       # your own GPU machine: real SmolLM2, verl + vLLM
#                                              # (scripts/device_check_full.sh; --help there)
#
# The lent machine's path (docs/verl.md, "The lent GPU machine") installs nothing from a
# network: it says what travelled (scripts/device_wheels.py --size-only: the tree + the wheels,
# refused over 64 MiB), installs .device-wheels/pyXY/*.whl (made here beforehand by
# `python scripts/device_wheels.py`, carried with the call) with `pip install --no-index --no-deps
# --target`, puts src/ on PYTHONPATH and runs scripts/device_check.py lent: (a) gear-rl train in
# bf16 (GEAR, GRPO, VinePPO, GiGPO on Sokoban) on a SmolLM2-135M-shaped model with random weights
# built in place and on the tiny test model, with the credit exact against the CPU; (b) the
# signal pass (full KL, top-k, k3, entropy) at SmolLM2's vocabulary and up to 4k tokens, device
# against CPU, with peak GPU memory; (c) step time and MFU, GEAR against GRPO, at the default
# budget and on a paper-like batch (128 x 8, 1-2k tokens). PASS/FAIL per check, a summary table;
# at most DEVICE_CHECK_TIMEOUT seconds (480). Uses cuda where torch sees one, else the CPU.
#
# --rehearse builds (once) .venv/device-rehearsal (scripts/setup_device_rehearsal.sh: only the
# lent machine's packages, torch 2.13.0+cpu standing in for 2.11.0+cu130) and runs this path
# with its python; --quick scales the sizes down for a CPU.
#
# Environment: DEVICE_CHECK_PYTHON (default python3), DEVICE_CHECK_OUT (output folder),
# DEVICE_CHECK_TIMEOUT (seconds, default 480). Exit: 0 pass, 1 a check failed, 2 set-up failed,
# 124 timed out, 64 a bad argument.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
for arg in "$@"; do
  [ "$arg" = --full ] && exec bash "$repo_root/scripts/device_check_full.sh" "$@"
done
rehearse=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rehearse) rehearse=1 ;;
    --quick) args+=(--quick) ;;
    --only) args+=(--only "${2:?--only needs a list such as a,b}"); shift ;;
    --only=*) args+=(--only "${1#--only=}") ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_check.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
  shift
done
py="${DEVICE_CHECK_PYTHON:-python3}"
if [ $rehearse = 1 ]; then
  # its own shell, so that its set -e holds (a `source ... ||` would switch it off)
  bash "$repo_root/scripts/setup_device_rehearsal.sh" || exit 2
  py="$repo_root/.venv/device-rehearsal/bin/python"
fi
tag="$("$py" -c 'import sys; print("%d%d" % sys.version_info[:2])')" || exit 2
wheels="$repo_root/.device-wheels/py$tag"
if [ $rehearse = 1 ] && ! ls "$wheels"/*.whl > /dev/null 2>&1; then
  "$py" "$repo_root/scripts/device_wheels.py" --python-version "${tag:0:1}.${tag:1}" > /dev/null || exit 2
fi
if ! ls "$wheels"/*.whl > /dev/null 2>&1; then
  echo "device_check.sh: no wheels in .device-wheels/py$tag: run 'python scripts/device_wheels.py --python-version ${tag:0:1}.${tag:1}' where pip can reach PyPI, and carry .device-wheels/py$tag" >&2
  exit 2
fi
echo "== gear-rl device check: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
# the travelling size, said before anything starts (and refused over the limit)
"$py" "$repo_root/scripts/device_wheels.py" --size-only --dest "$wheels" || exit 2
site="$(mktemp -d "${TMPDIR:-/tmp}/gear-rl-device-site.XXXXXX")"
trap 'rm -rf "$site"' EXIT
t0=$(date +%s)
if ! "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --no-cache-dir --target "$site" "$wheels"/*.whl; then
  echo "FAIL  set-up wheels  pip install --no-index of $wheels failed" >&2
  exit 2
fi
echo "PASS  set-up wheels  $(ls "$wheels"/*.whl | wc -l) wheels installed offline into $site in $(( $(date +%s) - t0 )) s"
export PYTHONPATH="$site:$repo_root/src" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 \
  TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1
out="${DEVICE_CHECK_OUT:-$repo_root/runs/device-check-$(date +%Y%m%d-%H%M%S)}"
timeout --kill-after=10 "${DEVICE_CHECK_TIMEOUT:-480}" \
  "$py" "$repo_root/scripts/device_check.py" lent --out "$out" "${args[@]}"
rc=$?
[ $rc = 124 ] && echo "device check: FAIL (timed out after ${DEVICE_CHECK_TIMEOUT:-480} s)"
exit $rc
