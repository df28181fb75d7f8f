"""Estimators defined outside gear-rl, registered with verl 0.9.1 from the registry's
declarations: through ``algorithm.gear.plugins`` and ``GEAR_RL_PLUGINS``, run by verl's own
``compute_advantage``. Every test removes what it registered (gear-rl's registry, verl's, the
imported module), so the other tests see the stock estimators only."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

import gear_rl.integrations.verl as gear_verl  # noqa: E402
from gear_rl.credit import CreditBatch, OutcomeConfig, get_estimator  # noqa: E402
from gear_rl.credit import registry as credit_registry  # noqa: E402
from gear_rl.credit.grpo import broadcast_outcome  # noqa: E402

NAME = "plugin_entropy_scaled"
MODULE = "gear_rl_test_credit_plugin"
PLUGIN = textwrap.dedent(f'''
    """A credit estimator outside gear-rl: GRPO's advantage times scale * entropy."""
    from dataclasses import dataclass

    from gear_rl.credit import OutcomeConfig, register_estimator
    from gear_rl.credit.grpo import outcome_advantages


    @dataclass(frozen=True)
    class EntropyScaledConfig(OutcomeConfig):
        scale: float = 2.0


    @register_estimator("{NAME}", config=EntropyScaledConfig, needs=("entropy",),
                        description="GRPO advantage times scale * entropy")
    def entropy_scaled(batch, config):
        advantage = outcome_advantages(batch, config)[:, None]
        return config.scale * advantage * batch.entropy * batch.mask
''')


def _forget(*names: str) -> None:
    """Remove estimators from gear-rl's registry, verl's and the adapter cache."""
    from gear_rl.integrations.verl import estimators

    for name in names:
        credit_registry._REGISTRY.pop(name, None)
        estimators._ADAPTERS.pop(name, None)
        for verl_estimator in (name, gear_verl.RENAME_PREFIX + name):
            fn = core_algos.ADV_ESTIMATOR_REGISTRY.get(verl_estimator)
            if fn is not None and fn.__module__.startswith("gear_rl."):
                core_algos.ADV_ESTIMATOR_REGISTRY.pop(verl_estimator)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield MODULE
    _forget(NAME)
    sys.modules.pop(MODULE, None)


def _batch():
    """Two groups of three, ragged responses, outcome reward on the last token, entropy."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 5, 2, 5, 4, 1])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).long()
    scores = torch.tensor([1.0, 0.0, 2.0, 0.0, 1.0, 1.0])
    rewards = torch.zeros(6, 5)
    rewards[torch.arange(6), lengths - 1] = scores
    uids = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uids})
    return data, scores, list(uids), mask, torch.rand(6, 5, generator=gen) * 2


def test_algorithm_plugins_register_and_compute_through_verl(plugin) -> None:
    assert NAME not in core_algos.ADV_ESTIMATOR_REGISTRY
    algorithm = OmegaConf.create({"adv_estimator": NAME, "norm_adv_by_std_in_grpo": True,
                                  "gear": {"plugins": [plugin], "scale": 3.0}})
    settings = gear_verl.settings_from_algorithm(algorithm)
    assert settings.plugins == (plugin,) and settings.config.scale == 3.0
    assert core_algos.ADV_ESTIMATOR_REGISTRY[NAME] is gear_verl.VERL_ESTIMATORS[NAME]
    assert NAME in gear_verl.register_estimators()  # again: a no-op

    data, scores, uids, mask, entropy = _batch()
    signals = gear_verl.signals_from_logprobs(mask, entropy=entropy)
    with gear_verl.provide_signals(signals):
        out = compute_advantage(data, NAME, config=algorithm).batch["advantages"]
    estimator = get_estimator(NAME)
    expected = estimator(CreditBatch(rewards=scores, group_ids=uids, mask=mask, entropy=entropy),
                         estimator.make_config(scale=3.0))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    assert out.abs().sum() > 0
    assert {"gear/adv_abs_mean", "gear/weight_mean_pos"} <= set(signals.metrics)


def test_env_plugins_register_with_verl(plugin, monkeypatch) -> None:
    monkeypatch.setenv(gear_verl.PLUGINS_ENV, f" {plugin}, ")
    assert gear_verl.load_env_plugins() == [NAME]
    assert NAME in core_algos.ADV_ESTIMATOR_REGISTRY
    assert NAME in gear_verl.register()  # what importing the module runs: idempotent


def test_bad_plugin_modules_are_named() -> None:
    with pytest.raises(ValueError, match="no_such_credit_module"):
        gear_verl.settings_from_algorithm(
            {"adv_estimator": "gear", "gear": {"plugins": ["no_such_credit_module"]}})
    with pytest.raises(ValueError, match=r"algorithm\.gear\.plugins"):
        gear_verl.settings_from_algorithm({"adv_estimator": "gear", "gear": {"plugins": [3]}})


def test_names_verl_owns_are_prefixed_and_taken_names_refused() -> None:
    """A registry name verl defines itself (``rloo``) becomes ``gear_rl_rloo``; a name that
    another verl estimator holds is refused, and the rest are registered regardless."""
    taken = "plugin_taken_name"

    def another_plugins_estimator(token_level_rewards, response_mask, **_):
        return token_level_rewards, token_level_rewards

    core_algos.register_adv_est(taken)(another_plugins_estimator)
    try:
        credit_registry.register_estimator("rloo", config=OutcomeConfig)(broadcast_outcome)
        credit_registry.register_estimator(taken, config=OutcomeConfig)(broadcast_outcome)
        with pytest.raises(RuntimeError, match=taken):
            gear_verl.register_estimators()
        assert gear_verl.verl_name("rloo") == "gear_rl_rloo"
        assert gear_verl.gear_rl_name("gear_rl_rloo") == "rloo"
        assert core_algos.get_adv_estimator_fn("rloo") is not gear_verl.VERL_ESTIMATORS[
            "gear_rl_rloo"]
        data, *_ = _batch()
        ours = compute_advantage(data, "gear_rl_rloo", config=None).batch["advantages"].clone()
        theirs = compute_advantage(data, "gear_rl_grpo", config=None).batch["advantages"]
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)  # this "rloo" is GRPO
    finally:
        _forget("rloo", taken)
        core_algos.ADV_ESTIMATOR_REGISTRY.pop(taken, None)
