#!/usr/bin/env bash
# Installs (once) the headless browser the report's browser test drives: Debian's chromium.
# Idempotent: does nothing when a Chromium is already on PATH (or GEAR_RL_CHROMIUM names one).
# Never aborts the caller: when it cannot install (not root and no passwordless sudo, no apt),
# it says so, and tests/test_report_browser.py then fails with the same advice instead of
# skipping.
set -uo pipefail
if [ -n "${GEAR_RL_CHROMIUM:-}" ] && command -v "$GEAR_RL_CHROMIUM" >/dev/null 2>&1; then
  exit 0
fi
for name in chromium chromium-browser google-chrome; do
  command -v "$name" >/dev/null 2>&1 && exit 0
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[setup] no chromium and no apt-get: install Chromium yourself or set GEAR_RL_CHROMIUM" >&2
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo_cmd=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo_cmd=(sudo -n)
else
  echo "[setup] chromium is missing and installing it needs root: run" \
       "'apt-get install chromium' as root, or set GEAR_RL_CHROMIUM" >&2
  exit 0
fi
echo "[setup] installing chromium (Debian package) for the report's browser test" >&2
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; then
  "${sudo_cmd[@]}" apt-get update -q >/dev/null 2>&1 || true
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
    || echo "[setup] apt-get install chromium failed; the browser test will fail" >&2
fi
exit 0
