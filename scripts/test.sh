#!/usr/bin/env bash
# The README's test command: sets up .venv (and the verl/TRL integration environments), checks
# lint and types (mypy), runs the whole suite (slow tests too, real verl jobs among them) and the
# lent GPU machine's check rehearsed on this CPU (scripts/device_check.sh --rehearse --quick). Extra
# arguments go to pytest, e.g. scripts/test.sh -m "not slow"; naming test paths runs just those,
# in the main environment (tests/test_verl_cpu_job.py and test_integration_verl_trainer.py skip
# there: run them with .venv/verl-cpu/bin/python -m pytest ...). The main suite runs on two
# pytest-xdist workers (GEAR_RL_TEST_WORKERS=N to change, 0 for one process).
#
# scripts/test.sh --quick: the inner loop while editing (about 2 minutes on a 2-core EPYC): ruff
# and the tests marked quick (the credit core, the loss, config, the registry, the package
# floors, the sandbox's refusals; the set is named once, in tests/conftest.py). It sets up only
# .venv and its integrations (each a no-op once its stamp matches) and skips mypy (minutes from
# a cold cache), the verl environment, the browser and every test that trains or starts a
# process. CI (.ci/run) runs this script without --quick: everything.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
quick=false
if [ "${1:-}" = "--quick" ]; then
  quick=true
  shift
fi
source scripts/setup_venv.sh
source scripts/setup_integrations.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
if $quick; then
  ruff check src tests benchmarks scripts
  exec python -m pytest -m quick "$@"
fi
source scripts/setup_verl_cpu.sh  # .venv/verl-cpu: verl's v1 trainer, vLLM-CPU, TransferQueue
bash scripts/setup_browser.sh  # chromium for tests/test_report_browser.py
ruff check src tests benchmarks scripts
python -m mypy  # type check of src/ ([tool.mypy] in pyproject.toml)
# two workers, a test file to each at a time (its module fixtures built once): most tests use
# one core, so this nearly halves the main suite on 2 cores (the verl jobs below run one at a time)
python -m pytest -n "${GEAR_RL_TEST_WORKERS:-2}" --dist loadfile "$@"
# the lent GPU machine's check, rehearsed on this CPU (.venv/device-rehearsal; docs/verl.md)
case " $* " in *" tests/"*|*".py"*|*"::"*) ;; *) bash scripts/device_check.sh --rehearse --quick ;; esac
# verl's v1 trainer needs hydra's antlr 4.9, which clashes with math-verify's antlr 4.13 in
# .venv, and real verl jobs need vLLM-CPU: their tests run in .venv/verl-cpu.
for arg in "$@"; do
  case "$arg" in tests/*|*.py|*::*) exit 0 ;; esac
done
"$GEAR_RL_VERL_PY" -m pytest tests/test_integration_verl_trainer.py tests/test_verl_cpu_job.py \
  tests/test_verl_agent_job.py tests/test_verl_values.py tests/test_verl_recipe_parts.py \
  tests/test_verl_study.py "$@"
