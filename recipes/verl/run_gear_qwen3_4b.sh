#!/usr/bin/env bash
# GEAR on Qwen3-4B with verl, in the paper's three settings. Extra arguments are Hydra overrides.
#
#   SETTING=math   bash recipes/verl/run_gear_qwen3_4b.sh            # single-turn math
#   SETTING=tir    bash recipes/verl/run_gear_qwen3_4b.sh            # tool-integrated math
#   SETTING=toolrl bash recipes/verl/run_gear_qwen3_4b.sh            # ToolRL tool calling
#   SETTING=sokoban bash recipes/verl/run_gear_qwen3_4b.sh algorithm.adv_estimator=gigpo
#                                                   # an agent setting: sokoban, keydoor, textarena:GAME
#   SETTING=math   bash recipes/verl/run_gear_qwen3_4b.sh algorithm.adv_estimator=gear_rl_grpo
#
# Data: verl-format parquet (prompt as chat messages, reward_model.ground_truth), see README.md;
# `python -m gear_rl.integrations.verl.data SETTING SRC OUT_DIR` writes it from GSM8K / MATH /
# ToolRL files. On a CPU: scripts/verl_cpu.sh runs this script scaled down.
# GEAR_DATA (default ~/data/gear) holds <setting>/train.parquet and <setting>/test.parquet.
# GPUs: one node of 8 by default (NNODES, GPUS_PER_NODE to change).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
setting="${SETTING:-math}"
data="${GEAR_DATA:-$HOME/data/gear}"
# gear-rl's reward functions for verl (math-verify as `gear-rl train` scores, ToolRL's format +
# correctness): compute_score picks by data_source. REWARD_FN / REWARD_NAME to use your own.
gear_rewards="$(python -c "import gear_rl.integrations.verl.rewards as m; print(m.__file__)")" \
  || { echo "gear-rl (with the verl extra) must be installed: pip install 'gear-rl[verl]'" >&2; exit 1; }

common=(
  "data.train_files=$data/$setting/train.parquet"
  "data.val_files=$data/$setting/test.parquet"
  "actor_rollout_ref.model.path=${GEAR_MODEL:-Qwen/Qwen3-4B}"
  "trainer.nnodes=${NNODES:-1}"
  "trainer.n_gpus_per_node=${GPUS_PER_NODE:-8}"
  "trainer.experiment_name=gear_qwen3_4b_$setting"
  "reward.custom_reward_function.path=${REWARD_FN:-$gear_rewards}"
  "reward.custom_reward_function.name=${REWARD_NAME:-compute_score}"
)
case "$setting" in
  math|products)  # products: gear-rl train's default task as it is (single-turn)
    extra=()
    ;;
  tir)
    # Multi-turn rollouts with a code tool: tool output lands in the response with
    # response_mask 0, so it stays in the context (student and teacher) and out of the loss
    # and of GEAR's normalisation. TOOL_CONFIG: a verl tool config; default gear-rl's sandboxed
    # Python tool (python_tool.yaml: gear_rl.integrations.verl.tools.PythonSandboxTool).
    extra=(
      "actor_rollout_ref.rollout.multi_turn.enable=true"
      "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=${MAX_TURNS:-5}"
      "actor_rollout_ref.rollout.multi_turn.tool_config_path=${TOOL_CONFIG:-$here/python_tool.yaml}"
      "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"
      "algorithm.gear.reference_kind=answer"
    )
    ;;
  toolrl)
    # The reference shown as a hint is the gold <tool_call> block (gear_rl.integrations.verl.data
    # writes it to extra_info.reference, as gear-rl train shows it); the reward reads the whole
    # gold output (reward_model.ground_truth) for ToolRL's format check.
    extra=(
      "algorithm.gear.reference_kind=tool_call"
      "algorithm.gear.reference_key=${REFERENCE_KEY:-extra_info.reference}"
      "data.max_response_length=${MAX_RESPONSE_LENGTH:-1024}"
    )
    ;;
  sokoban|keydoor|textarena:*)
    # Multi-turn text games (gear_rl.envs) played by gear-rl's agent loop gear_env
    # (gear_rl.integrations.verl.agent_loop): each turn one move, the next board back as a user
    # turn (response_mask 0); reward 1 when the level is solved; per-step spans, state keys and
    # shaping rewards for the step-level estimators (algorithm.adv_estimator=gigpo, gagpo,
    # gated_bepo, turn_level, gear_steps). The teacher is shown the planner's shortest moves.
    # Data: python -m gear_rl.integrations.verl.data writes the levels (write_example_data).
    extra=(
      "actor_rollout_ref.rollout.agent.default_agent_loop=gear_env"
      "algorithm.gear.reference_kind=solution"
      "algorithm.gear.reference_key=extra_info.reference"
    )
    ;;
  *)
    echo "SETTING must be math, products, tir, toolrl, sokoban, keydoor or textarena:GAME, got $setting" >&2
    exit 2
    ;;
esac

exec python -m verl.trainer.main_ppo --config-path "$here" --config-name gear_qwen3_4b \
  "${common[@]}" "${extra[@]}" "$@"
