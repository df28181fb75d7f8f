"""The single-machine trainer (``gear-rl train``): rollout with a KV cache, rewards, the signal
pass, any registry estimator, PPO-clipped updates, checkpoints, held-out evaluation."""

from gear_rl.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from gear_rl.train.config import (
    EvalConfig,
    LogConfig,
    LossConfig,
    OptimConfig,
    RolloutConfig,
    SignalConfig,
    TrainConfig,
    load_config,
    valid_keys,
)
from gear_rl.train.evaluate import evaluate, evaluate_model
from gear_rl.train.loss import aggregate, kl_penalty, ppo_policy_loss
from gear_rl.train.resume import resume_config
from gear_rl.train.runtime import Runtime, build_runtime
from gear_rl.train.trainer import StepOutput, Trainer, format_summary, train

__all__ = [
    "EvalConfig",
    "LogConfig",
    "LossConfig",
    "OptimConfig",
    "RolloutConfig",
    "Runtime",
    "SignalConfig",
    "StepOutput",
    "TrainConfig",
    "Trainer",
    "aggregate",
    "build_runtime",
    "evaluate",
    "evaluate_model",
    "format_summary",
    "kl_penalty",
    "latest_checkpoint",
    "load_checkpoint",
    "load_config",
    "ppo_policy_loss",
    "resume_config",
    "save_checkpoint",
    "train",
    "valid_keys",
]
