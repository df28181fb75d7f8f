"""The ``gear`` trainer modes inside verl 0.9.1's v1 trainer.

verl's v1 trainer imports hydra, whose grammar needs antlr 4.9 (the main .venv holds 4.13 for
math-verify), so this file runs in the verl environment that scripts/setup_verl_cpu.sh builds:

    .venv/verl-cpu/bin/python -m pytest tests/test_integration_verl_trainer.py

and skips elsewhere. No Ray cluster or TransferQueue service: the trainer's real verl code runs
against an in-memory stand-in for TransferQueue's kv calls and an actor whose
``compute_log_prob`` follows the engine's contract with a tiny random model, which pins the
contract cheaply; tests/test_verl_cpu_job.py runs the same trainer mode in a real verl job.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
try:
    import hydra  # noqa: F401
    import verl.trainer.ppo.v1 as verl_v1
except Exception as err:
    pytest.skip(f"verl's v1 trainer does not import here ({err!r}); run in .venv/verl-cpu",
                allow_module_level=True)

import verl
from hydra import compose, initialize_config_dir
from tensordict import NonTensorStack, TensorDict
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from gear_rl.credit import GEARConfig, gear_advantages, grpo_advantages
from gear_rl.integrations.verl import divergence_from_logprobs
from gear_rl.integrations.verl import trainer as gear_trainer


def _config(*overrides: str):
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=[
            "algorithm.adv_estimator=gear", "trainer.use_v1=True", "trainer.v1.trainer_mode=gear",
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.temperature=0.8",
            "actor_rollout_ref.model.path=/nonexistent", *overrides])


def test_trainer_modes_resolve_through_verls_registry() -> None:
    assert verl_v1.get_trainer_cls("gear") is gear_trainer.GEARTrainerSync
    assert issubclass(gear_trainer.GEARTrainerSync, verl_v1.PPOTrainerSync)
    assert verl_v1.get_trainer_cls("gear_colocate_async") is gear_trainer.GEARTrainerColocateAsync


def test_gear_mode_builds_from_verls_config_and_behaves_as_sync() -> None:
    config = _config("+algorithm.gear.lambda_kl=0.2", "+algorithm.gear.divergence=k1")
    trainer = verl_v1.get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    assert trainer.trainer_mode == "sync" and trainer.gear_trainer_mode == "gear"
    assert type(trainer.replay_buffer) is ReplayBuffer
    assert trainer.gear_settings.config.lambda_kl == 0.2
    assert trainer.gear_settings.divergence == "k1"

    # Why trainer_mode is reported as "sync": a plain subclass under another name gets verl's
    # asynchronous replay buffer, because the base class compares the name with "sync".
    class Plain(verl_v1.PPOTrainerSync):
        pass

    assert type(Plain(config).replay_buffer) is ReplayBufferAsync


def test_a_plugin_estimator_selects_the_gear_mode(tmp_path, monkeypatch) -> None:
    """``algorithm.gear.plugins`` is loaded before the estimator is looked up."""
    import sys

    from verl.trainer.ppo import core_algos

    from gear_rl.credit import registry
    from gear_rl.integrations.verl import estimators

    (tmp_path / "trainer_credit_plugin.py").write_text(
        "from gear_rl.credit import TopEntropyConfig, register_estimator\n"
        "from gear_rl.credit.token import top_entropy\n"
        "register_estimator('trainer_plugin', config=TopEntropyConfig, needs=('entropy',))"
        "(top_entropy)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        config = _config("algorithm.adv_estimator=trainer_plugin",
                         "+algorithm.gear.plugins=[trainer_credit_plugin]",
                         "+algorithm.gear.rho=0.5")
        trainer = gear_trainer.GEARTrainerSync(config)
        assert trainer.gear_settings.estimator.name == "trainer_plugin"
        assert trainer.gear_settings.config.rho == 0.5
        assert not trainer.gear_settings.needs_teacher
        assert "trainer_plugin" in core_algos.ADV_ESTIMATOR_REGISTRY
    finally:
        registry._REGISTRY.pop("trainer_plugin", None)
        estimators._ADAPTERS.pop("trainer_plugin", None)
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("trainer_plugin", None)
        sys.modules.pop("trainer_credit_plugin", None)


def test_verls_own_validation_metrics_give_the_run_logs_held_out_mean() -> None:
    """The keys verl's validation writes (its own ``_val_metrics_update``, 2 problems x 4
    samples of one data source) give ``eval/mean@4``, the mean of the scores."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from gear_rl.runlog import verl_held_out

    scores = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    metrics = PPOTrainer._val_metrics_update(
        None, ["products"] * 8, ["p0"] * 4 + ["p1"] * 4,  # type: ignore[arg-type]
        {"reward": scores, "acc": scores}, [])
    assert verl_held_out(metrics) == {"eval/mean@4": pytest.approx(0.5)}


def test_bad_gear_settings_fail_before_any_worker_starts() -> None:
    with pytest.raises(ValueError, match="unknown key"):
        gear_trainer.GEARTrainerSync(_config("+algorithm.gear.lamda_kl=0.2"))
    with pytest.raises(ValueError, match="bypass_mode"):
        gear_trainer.GEARTrainerSync(_config("algorithm.rollout_correction.bypass_mode=True"))


@pytest.mark.parametrize("estimator", ["spo_chain", "vineppo"])
def test_a_monte_carlo_estimator_runs_single_turn_in_the_sync_gear_mode_only(
        estimator: str) -> None:
    trainer = gear_trainer.GEARTrainerSync(_config(f"algorithm.adv_estimator={estimator}"))
    assert trainer.gear_settings.needs_signals
    with pytest.raises(ValueError, match="replay its tools or environment"):
        gear_trainer.GEARTrainerSync(_config(
            f"algorithm.adv_estimator={estimator}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"))
    with pytest.raises(ValueError, match=r"needs trainer\.v1\.trainer_mode=gear"):
        gear_trainer.GEARTrainerColocateAsync(_config(
            f"algorithm.adv_estimator={estimator}", "trainer.v1.trainer_mode=gear_colocate_async"))


@pytest.mark.parametrize("estimator", ["gigpo", "turn_level", "gagpo", "gated_bepo",
                                       "gear_steps"])
def test_a_step_level_estimator_on_the_single_turn_loop_is_refused_before_workers(
        estimator: str) -> None:
    with pytest.raises(ValueError, match=r"default_agent_loop is single_turn_agent.*gear_env"):
        gear_trainer.GEARTrainerSync(_config(f"algorithm.adv_estimator={estimator}"))
    for loop in ("gear_env", "tool_agent"):  # multi-turn loops build
        trainer = gear_trainer.GEARTrainerSync(_config(
            f"algorithm.adv_estimator={estimator}",
            f"actor_rollout_ref.rollout.agent.default_agent_loop={loop}"))
        assert trainer.gear_settings.estimator.name == estimator
        assert trainer.gear_settings.needs_signals


class FakeTQ:
    """TransferQueue's kv calls over a dict: fields put nested come back nested, fields a row
    lacks are left out of a get (as verl's own select of optional fields expects)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict] = {}
        self.nested: dict[str, bool] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        if fields is not None:
            for name in fields.keys():  # noqa: SIM118 - iterating a TensorDict walks rows
                value = fields.get(name)
                if isinstance(value, NonTensorStack):
                    per_row = value.tolist()
                elif isinstance(value, torch.Tensor):
                    self.nested[name] = bool(value.is_nested)
                    per_row = list(value.unbind(0))
                else:
                    raise TypeError(f"field {name}: {type(value)}")
                for key, item in zip(keys, per_row, strict=True):
                    self.rows.setdefault((partition_id, key), {})[name] = item
        return None

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        rows = [self.rows[(partition_id, key)] for key in keys]
        names = select_fields or list(rows[0])
        names = [n for n in names if all(n in row for row in rows)]
        columns = {}
        for name in names:
            values = [row[name] for row in rows]
            if isinstance(values[0], torch.Tensor):
                columns[name] = (torch.nested.as_nested_tensor(values, layout=torch.jagged)
                                 if self.nested.get(name) else torch.stack(values))
            else:
                columns[name] = NonTensorStack(*values)
        return TensorDict(columns, batch_size=[len(keys)])

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.rows.pop((partition_id, key), None)


class FakeActor:
    """``compute_log_prob`` as verl's engines do it: for each sequence, entry ``j`` is
    ``log p(token j+1 | tokens <= j)`` at the batch's temperature; written back as ``log_probs``."""

    def __init__(self, store: FakeTQ, model) -> None:
        self.store, self.model, self.calls = store, model, []

    def compute_log_prob(self, batch):
        self.calls.append(batch)
        data = self.store.kv_batch_get(batch.keys, batch.partition_id, ["input_ids"])
        temperature = batch.extra_info["temperature"]
        out = []
        with torch.no_grad():
            for ids in data["input_ids"].unbind(0):
                logits = self.model(input_ids=ids[None]).logits[0].float() / temperature
                logp = torch.log_softmax(logits, -1)
                out.append(logp.gather(-1, torch.roll(ids, -1)[:, None]).squeeze(-1))
        nested = torch.nested.as_nested_tensor(out, layout=torch.jagged)
        self.store.kv_batch_put(batch.keys, batch.partition_id,
                                TensorDict({"log_probs": nested}, batch_size=[len(batch)]))
        return batch


def test_advantage_step_runs_the_teacher_pass_and_gear(monkeypatch) -> None:
    from transfer_queue import KVBatchMeta

    from gear_rl.models import build_tiny_tokenizer, tiny_random_model
    from gear_rl.signals import response_logprobs, teacher_prompt_ids, token_signals

    model, tokenizer = tiny_random_model("llama", seed=5), build_tiny_tokenizer()
    store = FakeTQ()
    monkeypatch.setattr(gear_trainer, "tq", store)
    monkeypatch.setattr(verl_v1.trainer_base, "tq", store)

    config = _config("+algorithm.gear.lambda_kl=0.15", "+algorithm.gear.alpha=0.9")
    trainer = gear_trainer.GEARTrainerSync.__new__(gear_trainer.GEARTrainerSync)
    trainer.config = config
    trainer.gear_settings = gear_trainer.gear_settings_for(config)
    trainer.tokenizer, trainer.processor, trainer.timing_raw = tokenizer, None, {}
    trainer.actor_rollout_wg = FakeActor(store, model)
    trainer.global_steps = 3

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    questions = [("3+4?", "7"), ("9-2?", "7")]
    answers = [["It is 7.", "8"], ["7!", "I think 6"]]
    rewards = [[1.0, 0.0], [1.0, 0.0]]
    keys, rows, prompts, responses = [], [], [], []
    for q, ((question, gold), outs, rs) in enumerate(zip(questions, answers, rewards,
                                                         strict=True)):
        messages = [{"role": "user", "content": question}]
        prompt = encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                      tokenize=False))
        for s, (text, reward) in enumerate(zip(outs, rs, strict=True)):
            response = encode(text)
            score = torch.zeros(len(response))
            score[-1] = reward
            keys.append(f"u{q}_{s}_0")
            prompts.append(prompt)
            responses.append(response)
            rows.append({"prompts": torch.tensor(prompt), "responses": torch.tensor(response),
                         "response_mask": torch.ones(len(response), dtype=torch.int64),
                         "rm_scores": score, "uid": f"u{q}", "raw_prompt": messages,
                         "reward_model": {"ground_truth": gold, "style": "rule"}})
    # What verl's old-log-prob pass leaves behind: old_log_probs and entropy.
    student = response_logprobs(model, prompts, responses, temperature=0.8)
    for row, lp, ent, response in zip(rows, student.logprobs, student.entropy, responses,
                                      strict=True):
        row["old_log_probs"], row["entropy"] = lp[:len(response)], ent[:len(response)]
    store.kv_batch_put(keys, "train", list_of_dict_to_tensordict(rows))

    batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{} for _ in keys],
                        extra_info={"temperature": 0.8})
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)

    # The teacher pass ran once, through the actor, on hinted prompts, and was cleaned up.
    assert len(trainer.actor_rollout_wg.calls) == 1
    assert not [k for k in store.rows if k[0] != "train"]
    assert metrics["gear/teacher_prompt_spliced_head_frac"] == 1.0
    stored = store.kv_batch_get(keys, "train", ["gear_teacher_log_probs", "advantages"])
    teacher_prompts = [teacher_prompt_ids(tokenizer, [{"role": "user", "content": q}], gold)
                       for q, gold in questions for _ in range(2)]
    reference = token_signals(model, prompts, teacher_prompts, responses, temperature=0.8,
                              estimator="k3")
    teacher = stored["gear_teacher_log_probs"].to_padded_tensor(0.0)
    mask = reference.mask
    torch.testing.assert_close(teacher * mask, reference.teacher_logprobs * mask, rtol=0,
                               atol=1e-5)

    # verl's own advantage step wrote GEAR's advantages back.
    divergence = divergence_from_logprobs(student.logprobs, teacher, mask, "k3")
    expected = gear_advantages(
        grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), ["u0", "u0", "u1", "u1"]),
        divergence, student.entropy, mask, GEARConfig(lambda_kl=0.15, alpha=0.9))
    advantages = stored["advantages"].to_padded_tensor(0.0)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-5)
    assert {"gear/adv_abs_mean", "gear/weight_mean_pos", "gear/weight_mean_neg",
            "gear/divergence_mean", "gear/segment_frac"} <= set(metrics)

    # The run log's records of the step (written once verl's metrics are complete): the
    # advantages verl wrote back, the signals the estimator read, the rows' scores and texts.
    own, records = trainer._gear_pending
    assert own["reward_mean"] == 0.5 and own["groups_mixed"] == 1.0
    assert [r["row"] for r in records] == [0, 1, 2, 3] and {r["step"] for r in records} == {3}
    for record in records:
        row, n = record["row"], len(responses[record["row"]])
        assert record["token_ids"] == responses[row] and record["problem_id"] == f"u{row // 2}"
        assert record["answer"] == "7" and record["reward"] == rewards[row // 2][row % 2]
        assert record["response"] == answers[row // 2][row % 2]
        for key, value in (("token_advantage", expected), ("divergence", divergence),
                           ("entropy", student.entropy)):
            torch.testing.assert_close(torch.tensor(record[key]), value[row, :n], rtol=0,
                                       atol=1e-5)
        assert len(record["segment_onset"]) == len(record["weight"]) == n


RECIPE_DIR = os.path.join(os.path.dirname(__file__), "..", "recipes", "verl")


@pytest.mark.parametrize("overrides", [
    [],
    ["algorithm.gear.reference_kind=tool_call", "data.max_response_length=1024"],
    ["actor_rollout_ref.rollout.multi_turn.enable=true",
     "actor_rollout_ref.rollout.multi_turn.tool_config_path=/tmp/tools.yaml",
     "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"],
], ids=["math", "toolrl", "tir"])
def test_recipe_config_composes_into_the_gear_trainer(overrides) -> None:
    with initialize_config_dir(config_dir=os.path.abspath(RECIPE_DIR), version_base=None):
        config = compose("gear_qwen3_4b", overrides=overrides)
    assert config.actor_rollout_ref.actor.optim.lr == 1e-6
    assert config.data.train_batch_size == 128 and config.actor_rollout_ref.rollout.n == 8
    assert config.trainer.total_epochs == 2
    trainer = verl_v1.get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    assert isinstance(trainer, gear_trainer.GEARTrainerSync)
    assert trainer.gear_settings.divergence == "k3" and trainer.gear_settings.needs_teacher
