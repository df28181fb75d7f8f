"""``GEARTrainer`` (TRL 1.16 ``GRPOTrainer`` subclass) on CPU with a tiny random model and an
in-process tokenizer: no hub, no download."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from trl import GRPOTrainer  # noqa: E402

from gear_rl.integrations.trl import GEARGRPOConfig, GEARTrainer  # noqa: E402
from gear_rl.models import build_tiny_tokenizer, tiny_random_model  # noqa: E402

NUM_GENERATIONS = 4
QUESTIONS = [("2+3?", "5"), ("7*6?", "42")]


def _reward(completions, **_):
    # Deterministic and varied within a group, so advantages have both signs.
    return [float(sum(map(ord, c[0]["content"])) % 3) for c in completions]


def _trainer(tmp_path, **gear) -> GEARTrainer:
    torch.manual_seed(0)
    dataset = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": q}], "reference": ref} for q, ref in QUESTIONS])
    args = GEARGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], save_strategy="no",
        per_device_train_batch_size=NUM_GENERATIONS, num_generations=NUM_GENERATIONS,
        max_completion_length=6, max_steps=2, logging_steps=1, learning_rate=1e-2, seed=0,
        beta=0.0, temperature=1.0, gear_lambda_kl=0.05, **gear)
    return GEARTrainer(model=tiny_random_model("llama", seed=1), reward_funcs=_reward,
                       args=args, train_dataset=dataset,
                       processing_class=build_tiny_tokenizer())


def test_config_checks_the_gear_knobs(tmp_path) -> None:
    with pytest.raises(ValueError, match="gear_divergence"):
        GEARGRPOConfig(output_dir=str(tmp_path), use_cpu=True, gear_divergence="exact")
    with pytest.raises(ValueError, match="gear_topk"):
        GEARGRPOConfig(output_dir=str(tmp_path), use_cpu=True, gear_divergence="topk")
    with pytest.raises(ValueError, match="lambda_kl"):
        GEARGRPOConfig(output_dir=str(tmp_path), use_cpu=True, gear_lambda_kl=float("nan"))
    config = GEARGRPOConfig(output_dir=str(tmp_path), use_cpu=True, gear_alpha=0.5)
    assert config.gear_config.resolved_beta == 0.75


@pytest.mark.slow
def test_two_training_steps_on_cpu(tmp_path) -> None:
    trainer = _trainer(tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    logged = {k for entry in trainer.state.log_history for k in entry}
    assert {"gear/divergence_mean", "gear/segment_token_frac"} <= logged
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def _grads(trainer: GEARTrainer, batch: dict) -> dict[str, torch.Tensor]:
    trainer.model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one batch here
    trainer.compute_loss(trainer.model, batch).backward()
    return {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
            if p.grad is not None}


def test_gear_weights_change_the_gradient_relative_to_grpo(tmp_path) -> None:
    trainer = _trainer(tmp_path)
    trainer.model.train()
    inputs = [{"prompt": [{"role": "user", "content": q}], "reference": ref}
              for q, ref in QUESTIONS for _ in range(NUM_GENERATIONS)]
    grpo = GRPOTrainer._generate_and_score_completions(trainer, inputs)
    assert grpo["advantages"].dim() == 1 and grpo["advantages"].abs().sum() > 0
    gear = trainer._apply_gear(inputs, grpo)
    mask = grpo["completion_mask"].bool()
    assert gear["advantages"].shape == grpo["completion_ids"].shape
    assert torch.all(gear["advantages"][~mask] == 0)
    assert grpo["advantages"].dim() == 1  # TRL's buffered dict is left alone

    grad_grpo = _grads(trainer, grpo)
    grad_gear = _grads(trainer, gear)
    differs = [n for n in grad_grpo if not torch.allclose(grad_grpo[n], grad_gear[n],
                                                          rtol=1e-4, atol=1e-7)]
    assert differs, "GEAR's token weights left every gradient as GRPO's"

    # Control: alpha=0 makes every weight W = beta = 1, so GEAR's gradient is GRPO's.
    trainer.args.gear_alpha = 0.0
    flat = trainer._apply_gear(inputs, grpo)
    torch.testing.assert_close(flat["advantages"],
                               grpo["advantages"][:, None] * mask.float(), rtol=0, atol=1e-6)
    grad_flat = _grads(trainer, flat)
    for name in grad_grpo:
        torch.testing.assert_close(grad_flat[name], grad_grpo[name], rtol=1e-5, atol=1e-7)


def test_missing_reference_column_is_named(tmp_path) -> None:
    trainer = _trainer(tmp_path)
    inputs = [{"prompt": [{"role": "user", "content": "1+1?"}]}] * NUM_GENERATIONS
    output = {"advantages": torch.zeros(NUM_GENERATIONS),
              "completion_ids": torch.ones(NUM_GENERATIONS, 3, dtype=torch.long),
              "completion_mask": torch.ones(NUM_GENERATIONS, 3, dtype=torch.long),
              "prompt_ids": torch.ones(NUM_GENERATIONS, 2, dtype=torch.long),
              "prompt_mask": torch.ones(NUM_GENERATIONS, 2, dtype=torch.long)}
    with pytest.raises(ValueError, match="'reference'"):
        trainer._apply_gear(inputs, output)
