"""Adapters that run gear-rl's credit estimators inside other RL engines.

- ``gear_rl.integrations.verl``: a ``verl.plugins`` entry point that registers GEAR and every
  registry estimator with verl's ``algorithm.adv_estimator``, and the ``gear`` trainer mode that
  adds the ground-truth-conditioned teacher pass (docs/verl.md).
- ``gear_rl.integrations.trl``: ``GEARTrainer``, a TRL ``GRPOTrainer`` subclass (docs/trl.md).

The maths is ``gear_rl.credit`` in both; these modules only move tensors in and out. Neither is
imported by ``import gear_rl``: each needs its engine installed (extras ``verl`` / ``trl``).
"""
