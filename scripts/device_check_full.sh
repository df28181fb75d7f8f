#!/usr/bin/env bash
# `scripts/device_check.sh --full`: the full check for your own GPU machine (one with network
# access to PyPI): builds .venv, loads the real SmolLM2-135M-Instruct, and runs verl with real
# vLLM. The lent machine (no network, 64 MiB per call) runs scripts/device_check.sh without --full.
# Prints PASS/FAIL per check with timings and exits 0 when every check passed, 1 when one
# failed, 2 when there is no GPU here (64: a bad argument).
#
#   scripts/device_check.sh --full              # all checks: a, b, c
#   scripts/device_check.sh --full --only a,b   # a subset
#   scripts/device_check.sh --full --dry-run    # print the commands, run nothing (no GPU needed)
#
# (a) the built-in trainer on CUDA: `gear-rl train` on the bundled SmolLM2-135M-Instruct, 3 steps,
#     GEAR and then GRPO, device=cuda, precision=bf16, a small held-out eval; PASS if it exits 0
#     and metrics.jsonl has steps 1..3, every number finite, run on CUDA with bf16 autocast.
# (b) the signal pass and the credit estimators on CUDA against the CPU (scripts/device_check.py):
#     log-probs, entropy, divergence (1e-4), the update's loss and gradients, and GEAR's credit
#     (bit-identical: its numba kernel runs on the CPU for tensors on any device).
# (c) verl 0.9.1 + vLLM on the GPU: recipes/verl/gear_qwen3_4b.yaml cut down to SmolLM2, 2 steps,
#     1 GPU, a few rows of arithmetic; PASS if main_ppo exits 0 and its console shows finite gear/
#     metrics for both steps. Needs the environment .venv/verl-gpu (verl[vllm]==0.9.1,
#     TransferQueue==0.1.11, gear-rl editable), built here on first use (network to PyPI; several
#     GB) and only where nvidia-smi lists a GPU.
#     With c, (d): the same job on gear-rl's Sokoban levels, GiGPO through the gear_env agent loop;
#     (e): a 2-cell verl study (gear-rl study, engine: verl): GRPO and GEAR, 1 seed, 2 steps on
#     SmolLM2 and gear-rl's default task (products), real vLLM, the paired report written
#     (multi-turn: each move sampled by vLLM, the next board back as observation tokens); PASS as c.
#
# Environment:
#   GEAR_RL_TORCH, PIP_INDEX_URL   the torch requirement and index for .venv (scripts/setup_venv.sh)
#   GEAR_RL_PYTHON                 use this python (gear-rl and a CUDA torch installed) for a, b
#                                  instead of building/reusing .venv
#   GEAR_RL_VERL_GPU_PY            use this python (verl[vllm]==0.9.1 and gear-rl installed) for c
#                                  instead of building/reusing .venv/verl-gpu
#   DEVICE_CHECK_OUT               output folder (default runs/device-check-<time>)
#   DEVICE_CHECK_VERL_TIMEOUT      seconds for the verl job (default 1800)
# Everything runs offline (HF_HUB_OFFLINE=1) except building .venv / .venv/verl-gpu the first time.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

dry_run=0
only="a,b,c"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --only) only="${2:?--only needs a list such as a,b}"; shift ;;
    --only=*) only="${1#--only=}" ;;
    --full) ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_check.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
  shift
done
want() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
for c in ${only//,/ }; do
  case "$c" in a|b|c) ;; *) echo "device_check.sh: --only takes a, b, c (got $c)" >&2; exit 64 ;; esac
done

# --- is there a GPU? (said at once, before anything is installed)
gpu_list="$(nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
have_smi=0
[ -n "$gpu_list" ] && have_smi=1
have_gpu=$have_smi
if [ $have_gpu = 0 ]; then
  probe="${GEAR_RL_PYTHON:-$repo_root/.venv/bin/python}"
  if [ -x "$probe" ] && "$probe" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    have_gpu=1
  fi
fi
if [ $have_gpu = 0 ] && [ $dry_run = 0 ]; then
  echo "device_check.sh: no NVIDIA GPU here (nvidia-smi lists none, torch.cuda.is_available() is False): nothing to check; --dry-run prints the commands" >&2
  exit 2
fi

out="${DEVICE_CHECK_OUT:-$repo_root/runs/device-check-$(date +%Y%m%d-%H%M%S)}"
py="${GEAR_RL_PYTHON:-$repo_root/.venv/bin/python}"
vpy_default="$repo_root/.venv/verl-gpu/bin/python"
vpy="${GEAR_RL_VERL_GPU_PY:-$vpy_default}"
helper="$repo_root/scripts/device_check.py"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

summary=()
failed=0
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
record() {  # STATUS NAME DETAIL
  local line
  line="$(printf '%-4s  %-28s %s' "$1" "$2" "$3")"
  summary+=("$line")
  echo "$line"
  [ "$1" = FAIL ] && failed=1
  return 0
}
show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
tail_log() { echo "  --- last lines of $1:"; tail -n "${2:-25}" "$1" | sed 's/^/  | /'; }

echo "== gear-rl device check ($(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%Y-%m-%dT%H:%MZ))"
if [ $have_smi = 1 ]; then
  echo "GPU: $gpu_list" | sed '2,$s/^/     /'
  [ "$(printf '%s\n' "$gpu_list" | wc -l)" -gt 1 ] \
    && echo "note: several GPUs visible; the checks use the first (cuda:0); set CUDA_VISIBLE_DEVICES to pick one"
elif [ $have_gpu = 1 ]; then
  echo "GPU: torch sees CUDA, but nvidia-smi does not work here"
else
  echo "GPU: none here; dry run: the commands a GPU run would execute"
fi
echo "output: $out"

# --- the main environment (a, b; c's data helper) and the dequantised SmolLM2 (a, c)
model_dir='$MODEL_DIR'
venv_ok=1   # .venv (or GEAR_RL_PYTHON) is there
main_ok=1   # ... and its torch uses the GPU: (a) and (b) can run
if [ $dry_run = 1 ]; then
  echo
  echo "# set-up: .venv (created on a fresh clone; GEAR_RL_TORCH / PIP_INDEX_URL pick the torch build)"
  [ -n "${GEAR_RL_PYTHON:-}" ] || show bash -c "source scripts/setup_venv.sh"
  show "$py" -c 'import torch; assert torch.cuda.is_available()'
  echo "# the bundled SmolLM2 as a Hugging Face directory (dequantised once into ~/.cache/gear-rl)"
  echo "MODEL_DIR=\$($py -c 'from gear_rl.models import ensure_smollm2; print(ensure_smollm2())')"
else
  mkdir -p "$out"
  t0="$(now)"
  if [ -z "${GEAR_RL_PYTHON:-}" ] \
      && ! bash -c "source '$repo_root/scripts/setup_venv.sh'" > "$out/setup.log" 2>&1; then
    record FAIL "set-up .venv" "scripts/setup_venv.sh failed ($(since "$t0") s; $out/setup.log)"
    tail_log "$out/setup.log"
    venv_ok=0; main_ok=0
  elif ! torch_info="$("$py" -c 'import torch; assert torch.cuda.is_available(), "no CUDA"; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")' 2>&1)"; then
    record FAIL "set-up .venv" "torch in $py cannot use the GPU: $(echo "$torch_info" | tail -n 1). Rebuild .venv with a CUDA torch (rm -rf .venv; GEAR_RL_TORCH=torch==2.13.0 PIP_INDEX_URL=<CUDA wheel index> scripts/device_check.sh) or set GEAR_RL_PYTHON"
    main_ok=0
  else
    record PASS "set-up .venv" "$torch_info ($(since "$t0") s)"
  fi
  if [ $venv_ok = 1 ] && { want a || want c; }; then
    t0="$(now)"
    if model_dir="$("$py" -c 'from gear_rl.models import ensure_smollm2; print(ensure_smollm2())' 2> "$out/model.log" | tail -n 1)" \
        && [ -f "$model_dir/config.json" ]; then
      record PASS "set-up SmolLM2 directory" "$model_dir ($(since "$t0") s)"
    else
      record FAIL "set-up SmolLM2 directory" "ensure_smollm2 failed ($out/model.log)"
      tail_log "$out/model.log"
      model_dir='$MODEL_DIR'
    fi
  fi
fi

# --- (a) the built-in trainer on CUDA, GEAR then GRPO
if want a; then
  [ $dry_run = 1 ] && { echo; echo "# (a) gear-rl train on CUDA, GEAR then GRPO"; }
  for est in gear grpo; do
    run_dir="$out/train-$est"
    cmd=("$py" -m gear_rl.cli train "estimator=$est" steps=3 seed=0 device=cuda precision=bf16
         eval.size=16 eval.k=2 "out=$run_dir")
    verdict=("$py" "$helper" train-metrics "$run_dir" --steps 3 --expect-device cuda --expect-bf16
             --label "estimator=$est")
    if [ $dry_run = 1 ]; then
      show "${cmd[@]}"; show "${verdict[@]}" --wall '$WALL_S'
      continue
    fi
    if [ $main_ok = 0 ] || [ "$model_dir" = '$MODEL_DIR' ]; then
      record FAIL "(a) train estimator=$est" "not run: the set-up above failed"
      continue
    fi
    echo; echo "-- (a) gear-rl train estimator=$est (log: $run_dir.log)"
    t0="$(now)"
    "${cmd[@]}" > "$run_dir.log" 2>&1
    rc=$?
    wall="$(since "$t0")"
    if [ $rc != 0 ]; then
      record FAIL "(a) train estimator=$est" "exit $rc after $wall s ($run_dir.log)"
      tail_log "$run_dir.log"
    elif verdict_line="$("${verdict[@]}" --wall "$wall" 2>&1)"; then
      record PASS "(a) train estimator=$est" "${verdict_line#*: }"
    else
      record FAIL "(a) train estimator=$est" "${verdict_line#*: }"
    fi
  done
fi

# --- (b) the signal pass and the credit estimators, CUDA against CPU
if want b; then
  cmd=("$py" "$helper" signals --device cuda --ref-device cpu)
  if [ $dry_run = 1 ]; then
    echo; echo "# (b) signal pass and credit, cuda against cpu (dry run of its code path here:"
    echo "#     $py $helper --device cpu)"
    show "${cmd[@]}"
  elif [ $main_ok = 0 ]; then
    record FAIL "(b) signals + credit" "not run: the set-up above failed"
  else
    echo; echo "-- (b) signal pass and credit, cuda vs cpu (log: $out/signals.log)"
    t0="$(now)"
    "${cmd[@]}" 2>&1 | tee "$out/signals.log"
    rc=${PIPESTATUS[0]}
    checks="$(grep -cE '^(PASS|FAIL)  ' "$out/signals.log")"
    fails="$(grep -cE '^FAIL  ' "$out/signals.log")"
    if [ "$rc" = 0 ]; then
      record PASS "(b) signals + credit" "$checks checks, $(since "$t0") s ($out/signals.log)"
    else
      record FAIL "(b) signals + credit" "exit $rc, $fails of $checks checks failed, $(since "$t0") s ($out/signals.log)"
    fi
  fi
fi

# --- (c) verl 0.9.1 + vLLM on the GPU
verl_pkgs=("verl[vllm]==0.9.1" "TransferQueue==0.1.11")
verl_spec="${verl_pkgs[*]}"
build_verl_env() {  # builds .venv/verl-gpu, logging to $1; fails at the first failing step
  local log="$1" env_dir="$repo_root/.venv/verl-gpu"
  local env_py="$env_dir/bin/python"
  # verl's stack first; then gear-rl's own requirements without moving verl's torch / vLLM /
  # transformers, and with math-verify's ANTLR 4.9.3 grammar (hydra-core pins ANTLR 4.9, gear-rl's
  # default extra would install 4.13 and break Hydra's override parser); then gear-rl itself.
  {
    rm -rf "$env_dir" \
    && "${PYTHON:-python3}" -m venv "$env_dir" \
    && "$env_py" -m pip install --upgrade pip \
    && "$env_py" -m pip install "${verl_pkgs[@]}" \
    && "$env_py" -m pip freeze | grep -iE '^(torch|vllm|transformers|numpy|verl)==' \
      > "$env_dir/constraints.txt" \
    && "$env_py" "$repo_root/scripts/verl_requirements.py" "$repo_root/pyproject.toml" \
      > "$env_dir/gear-rl-requirements.txt" \
    && "$env_py" -m pip install -c "$env_dir/constraints.txt" \
      -r "$env_dir/gear-rl-requirements.txt" \
    && "$env_py" -m pip install --no-deps -e "$repo_root" \
    && "$env_py" -c 'import torch, vllm, verl, hydra, gear_rl.integrations.verl
assert torch.cuda.is_available(), "torch sees no GPU"' \
    && printf '%s' "$verl_spec" > "$env_dir/.gear-rl-device-check"
  } > "$log" 2>&1
}

# run_verl_job LABEL LOG VERDICT... -- CMD...: one verl job in its own session, time-limited,
# what is left of it ended and its /dev/shm segments removed; PASS/FAIL from the verdict.
run_verl_job() {
  local label="$1" log="$2"; shift 2
  local verdict_cmd=()
  while [ "$1" != "--" ]; do verdict_cmd+=("$1"); shift; done
  shift
  local t0 shm_before job rc wall reason verdict_line
  t0="$(now)"
  shm_before="$(ls /dev/shm 2>/dev/null)"
  # its own session (id $job), so that what is left of it afterwards can be ended
  (cd "$(dirname "$log")" && exec setsid --wait timeout --kill-after=30 "$timeout_s" "$@") \
    > "$log" 2>&1 &
  job=$!
  trap 'pkill -TERM -s "$job" 2>/dev/null; sleep 5; pkill -KILL -s "$job" 2>/dev/null; exit 130' INT TERM
  wait "$job"
  rc=$?
  trap - INT TERM
  wall="$(since "$t0")"
  pkill -KILL -s "$job" 2>/dev/null
  # vLLM's psm_*, verl's verl_weights_* (GBs) and sem.mp-* that the job left in /dev/shm
  comm -13 <(printf '%s\n' "$shm_before" | sort) <(ls /dev/shm 2>/dev/null | sort) \
    | grep -E '^(psm_|verl_weights_|sem\.mp-)' | while read -r name; do
      rm -f "/dev/shm/$name"; echo "removed /dev/shm/$name (left by the job)"; done
  if [ $rc != 0 ]; then
    reason="exit $rc"
    [ $rc = 124 ] && reason="timed out after $timeout_s s"
    record FAIL "$label" "$reason, wall $wall s ($log)"
    tail_log "$log" 40
  elif verdict_line="$("${verdict_cmd[@]}" 2>&1)"; then
    record PASS "$label" "wall $wall s (start-up included), ${verdict_line#*: }"
  else
    record FAIL "$label" "exit 0 but ${verdict_line#*: }"
    tail_log "$log" 40
  fi
}

if want c; then
  vdir="$out/verl"
  ray_cpus="$(nproc 2>/dev/null || echo 16)"
  [ "$ray_cpus" -lt 16 ] && ray_cpus=16  # logical Ray CPUs: TransferQueue's units take one each
  cmd=("$vpy" -m verl.trainer.main_ppo --config-path "$repo_root/recipes/verl"
       --config-name gear_qwen3_4b
       "data.train_files=$vdir/data/train.parquet" "data.val_files=$vdir/data/test.parquet"
       data.train_batch_size=4 data.max_prompt_length=256 data.max_response_length=64
       "actor_rollout_ref.model.path=$model_dir"
       # HF's flash_attention_2 (verl's default) needs the flash-attn package, not in verl[vllm]
       "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
       actor_rollout_ref.actor.ppo_mini_batch_size=4
       actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
       actor_rollout_ref.rollout.n=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.4
       actor_rollout_ref.rollout.tensor_model_parallel_size=1
       actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
       actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
       "reward.custom_reward_function.path=$vdir/reward.py"
       reward.custom_reward_function.name=compute_score reward.num_workers=2
       "ray_kwargs.ray_init.num_cpus=$ray_cpus"
       transfer_queue.backend.SimpleStorage.num_data_storage_units=2
       trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_epochs=1
       trainer.total_training_steps=2 trainer.val_before_train=False trainer.test_freq=-1
       trainer.save_freq=-1 "trainer.logger=[console]" trainer.experiment_name=device_check
       "trainer.default_local_dir=$vdir/checkpoints")
  # (d): the same job on gear-rl's Sokoban levels, played by the gear_env agent loop, GiGPO
  cmd_env=("${cmd[@]}" "data.train_files=$vdir/sokoban/train.parquet"
           "data.val_files=$vdir/sokoban/test.parquet" data.max_prompt_length=512
           data.max_response_length=384 algorithm.adv_estimator=gigpo
           actor_rollout_ref.rollout.agent.default_agent_loop=gear_env
           actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4
           algorithm.gear.reference_kind=solution algorithm.gear.reference_key=extra_info.reference
           trainer.experiment_name=device_check_sokoban "trainer.default_local_dir=$vdir/sokoban-checkpoints")
  # (e): the study file of a 2-cell verl study, the same model and sizes as (c)
  study_yaml="$vdir/study.yaml"
  study_cmd=(env "GEAR_RL_VERL_PY=$vpy" HF_HUB_OFFLINE=1 "$py" -m gear_rl.cli study "$study_yaml"
             "out=$vdir/study" progress=false)
  data_cmd=("$py" "$helper" verl-data "$vdir/data")
  verdict=("$py" "$helper" verl-log "$vdir/main_ppo.log" --steps 2)
  verdict_env=("$py" "$helper" verl-log "$vdir/sokoban.log" --steps 2 --label "(d) verl GiGPO on Sokoban")
  timeout_s="${DEVICE_CHECK_VERL_TIMEOUT:-1800}"
  if [ $dry_run = 1 ]; then
    echo; echo "# (c) verl + vLLM on the GPU (only where nvidia-smi lists a GPU)"
    if [ $have_smi = 0 ]; then
      echo "SKIP  (c) verl main_ppo            here: nvidia-smi lists no GPU, so .venv/verl-gpu would not be built"
    fi
    if [ -z "${GEAR_RL_VERL_GPU_PY:-}" ]; then
      echo "# build .venv/verl-gpu once (skipped while its stamp matches):"
      show "${PYTHON:-python3}" -m venv .venv/verl-gpu
      echo "+ .venv/verl-gpu/bin/python -m pip install $verl_spec"
      echo "+ .venv/verl-gpu/bin/python -m pip install -c <its torch/vllm/transformers/numpy/verl pins> -r <scripts/verl_requirements.py pyproject.toml>"
      echo "+ .venv/verl-gpu/bin/python -m pip install --no-deps -e ."
    fi
    show "${data_cmd[@]}"
    echo "# and $vdir/reward.py: compute_score(...) = 1.0 if the ground truth is a substring of the response, else 0.0"
    echo "+ cd $vdir && timeout $timeout_s \\"
    show "${cmd[@]}"
    show "${verdict[@]}"
    echo "# (d) GiGPO on Sokoban through the gear_env agent loop, after writing the levels:"
    echo "+ $vpy -c \"from gear_rl.integrations.verl.data import write_example_data as w; w('sokoban', '$vdir/sokoban')\""
    show "${cmd_env[@]}"
    show "${verdict_env[@]}"
    echo "# (e) a 2-cell verl study (GRPO, GEAR; products; SmolLM2), after writing $study_yaml:"
    show "${study_cmd[@]}"
  elif [ $have_smi = 0 ]; then
    record SKIP "(c) verl main_ppo" "nvidia-smi does not work here, so the vLLM env is not built"
  elif [ $venv_ok = 0 ] || [ "$model_dir" = '$MODEL_DIR' ]; then
    record FAIL "(c) verl main_ppo" "not run: the set-up above failed (.venv or the SmolLM2 directory)"
  else
    echo; echo "-- (c) verl main_ppo on SmolLM2, 2 steps (log: $vdir/main_ppo.log)"
    mkdir -p "$vdir"
    env_ok=1
    if [ -z "${GEAR_RL_VERL_GPU_PY:-}" ] \
        && { [ ! -x "$vpy_default" ] || [ "$(cat "$repo_root/.venv/verl-gpu/.gear-rl-device-check" 2>/dev/null)" != "$verl_spec" ]; }; then
      echo "building .venv/verl-gpu ($verl_spec + gear-rl; several GB, a few minutes; log: $vdir/env.log)"
      t0="$(now)"
      if build_verl_env "$vdir/env.log"; then
        record PASS "(c) set-up .venv/verl-gpu" "$(since "$t0") s"
      else
        record FAIL "(c) set-up .venv/verl-gpu" "build failed after $(since "$t0") s (needs PyPI; $vdir/env.log)"
        tail_log "$vdir/env.log"
        env_ok=0
      fi
    fi
    if [ $env_ok = 1 ]; then
      "${data_cmd[@]}" > "$vdir/data.log" 2>&1 || { env_ok=0; record FAIL "(c) verl main_ppo" "could not write the parquet data ($vdir/data.log)"; }
      cat > "$vdir/reward.py" <<'EOF'
"""device_check.sh's reward for verl: 1.0 if the ground truth appears in the response."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return 1.0 if str(ground_truth) in str(solution_str) else 0.0
EOF
    fi
    if [ $env_ok = 1 ]; then
      run_verl_job "(c) verl main_ppo" "$vdir/main_ppo.log" "${verdict[@]}" -- "${cmd[@]}"
      # (d) step-level credit on an environment: GiGPO on Sokoban through gear-rl's gear_env
      # agent loop (the rollout server plays each turn), same model and budget
      if "$vpy" -c "from gear_rl.integrations.verl.data import write_example_data as w; w('sokoban', '$vdir/sokoban')" \
          > "$vdir/sokoban-data.log" 2>&1; then
        run_verl_job "(d) verl GiGPO on Sokoban" "$vdir/sokoban.log" "${verdict_env[@]}" -- "${cmd_env[@]}"
      else
        record FAIL "(d) verl GiGPO on Sokoban" "could not write the levels ($vdir/sokoban-data.log)"
      fi
      # (e) a paired study whose cells are verl jobs on this GPU: both cells finish and the
      # report holds GEAR's paired row against GRPO (docs/study.md, "Studies on verl")
      cat > "$study_yaml" <<STUDY
engine: verl
seeds: [0]
verl:
  actor_rollout_ref.model.path: $model_dir
  +actor_rollout_ref.model.override_config.attn_implementation: sdpa
  data.train_batch_size: 4
  data.max_prompt_length: 256
  data.max_response_length: 64
  actor_rollout_ref.actor.ppo_mini_batch_size: 4
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 4
  actor_rollout_ref.rollout.n: 2
  actor_rollout_ref.rollout.gpu_memory_utilization: 0.4
  actor_rollout_ref.rollout.tensor_model_parallel_size: 1
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu: 8
  actor_rollout_ref.rollout.val_kwargs: {n: 2, temperature: 0.6, top_p: 0.95, do_sample: true}
  ray_kwargs.ray_init.num_cpus: $ray_cpus
  transfer_queue.backend.SimpleStorage.num_data_storage_units: 2
  trainer.n_gpus_per_node: 1
  trainer.total_training_steps: 2
  trainer.logger: [console]
tasks:
  products: {}
methods:
  grpo: {}
  gear: {}
STUDY
      echo; echo "-- (e) a 2-cell verl study (log: $vdir/study.log)"
      t0="$(now)"
      if timeout "$timeout_s" "${study_cmd[@]}" > "$vdir/study.log" 2>&1 \
          && grep -q "| gear |" "$vdir/study/study.md" \
          && [ -f "$vdir/study/cells/products/grpo-s0/summary.json" ] \
          && [ -f "$vdir/study/cells/products/gear-s0/summary.json" ]; then
        record PASS "(e) verl study, 2 cells" "wall $(since "$t0") s; report $vdir/study/study.md"
      else
        record FAIL "(e) verl study, 2 cells" "after $(since "$t0") s ($vdir/study.log)"
        tail_log "$vdir/study.log" 40
      fi
    fi
  fi
fi

if [ $dry_run = 1 ]; then
  echo; echo "dry run: nothing was run"
  exit 0
fi
echo
echo "== summary ($out)"
printf '%s\n' "${summary[@]}"
if [ $failed = 1 ]; then
  echo "device check: FAIL"
  exit 1
fi
echo "device check: PASS"
exit 0
