"""GEAR inside verl: the ``verl.plugins`` entry point of gear-rl.

GEAR: "Granularity-adaptivE Advantage Reweighting", arXiv 2605.11853.

verl 0.9.1 imports every entry point of the group ``verl.plugins`` at the end of ``import verl``
(``verl/__init__.py``; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns that off, and a plugin that fails is
logged only at DEBUG). gear-rl's entry point is this module; importing it

1. registers every token-level gear-rl estimator with ``verl.trainer.ppo.core_algos``
   (``algorithm.adv_estimator=gear``, its ablations and the baselines; the names are the
   registry's, see ``estimators.py``), including those of installed distributions that declare
   the entry-point group ``gear_rl.estimators``;
2. imports the modules named in the environment variable ``GEAR_RL_PLUGINS`` (comma-separated)
   and registers their estimators too: a Ray worker that imports verl gets them without any
   config (``algorithm.gear.plugins`` does the same when the ``gear`` trainer parses its
   settings); and
3. makes the trainer modes ``gear`` (verl's ``sync`` loop) and ``gear_colocate_async`` available to
   ``trainer.v1.trainer_mode``, and the agent loop ``gear_env`` (gear-rl's text environments,
   ``gear_rl.integrations.verl.agent_loop``) to ``actor_rollout_ref.rollout.agent``. verl
   imports its v1 trainer package and its agent loops lazily (only the processes that run them
   need them, and they pull TransferQueue, Ray, FastAPI and more), so these classes are
   registered the moment ``verl.trainer.ppo.v1`` (the trainer modes) or
   ``verl.experimental.agent_loop.agent_loop`` (the agent loop) finishes importing, not here.

Switch GEAR on (docs/verl.md)::

    algorithm.adv_estimator=gear trainer.use_v1=True trainer.v1.trainer_mode=gear \\
    +algorithm.gear.lambda_kl=0.1 +algorithm.gear.lambda_h=1.5 +algorithm.gear.alpha=1.0

Without the entry point (``VERL_USE_EXTERNAL_PLUGINS=none``, or gear-rl not pip-installed in the
Ray workers' env), ``VERL_USE_EXTERNAL_MODULES=gear_rl.integrations.verl`` loads the same module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from types import ModuleType
from typing import Any

from gear_rl.integrations.verl.cpu import register_platform
from gear_rl.integrations.verl.estimators import (
    METRIC_PREFIX,
    RENAME_PREFIX,
    VERL_ESTIMATORS,
    VerlGEARSettings,
    VerlSignals,
    divergence_from_logprobs,
    gear_rl_name,
    load_algorithm_plugins,
    load_verl_plugins,
    plugin_modules,
    provide_signals,
    register_estimators,
    settings_from_algorithm,
    signals_from_logprobs,
    verl_estimator_names,
    verl_name,
)

logger = logging.getLogger(__name__)

TRAINER_MODES: tuple[str, ...] = ("gear", "gear_colocate_async")
# Comma-separated modules with estimators to register in every process that imports verl.
PLUGINS_ENV = "GEAR_RL_PLUGINS"
_V1 = "verl.trainer.ppo.v1"
_TRAINER_MODULE = "gear_rl.integrations.verl.trainer"
# verl module -> the gear-rl module that registers its classes with it, once it is imported
_AFTER_IMPORT: dict[str, str] = {
    _V1: _TRAINER_MODULE,
    "verl.experimental.agent_loop.agent_loop": "gear_rl.integrations.verl.agent_loop",
}

__all__ = [
    "METRIC_PREFIX",
    "PLUGINS_ENV",
    "RENAME_PREFIX",
    "TRAINER_MODES",
    "VERL_ESTIMATORS",
    "VerlGEARSettings",
    "VerlSignals",
    "divergence_from_logprobs",
    "gear_rl_name",
    "load_algorithm_plugins",
    "load_env_plugins",
    "load_verl_plugins",
    "provide_signals",
    "register",
    "register_agent_loop",
    "register_estimators",
    "register_trainer_modes",
    "settings_from_algorithm",
    "signals_from_logprobs",
    "verl_estimator_names",
    "verl_name",
]


class _RegisteringLoader(importlib.abc.Loader):
    """Runs verl's own loader for a module of :data:`_AFTER_IMPORT`, then imports the gear-rl
    module that registers with it."""

    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _import_registering_module(self._name)

    def __getattr__(self, name: str) -> Any:  # resource readers, is_package, ...
        return getattr(self._inner, name)


class _RegisterAfterImportHook(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`_AFTER_IMPORT` still waiting the normal way and wraps their
    loaders."""

    def __init__(self) -> None:
        self.waiting: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.waiting:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        self.waiting.discard(fullname)
        if not self.waiting:
            _remove_hook()
        spec.loader = _RegisteringLoader(spec.loader, fullname)
        return spec


_HOOK = _RegisterAfterImportHook()


def _remove_hook() -> None:
    while _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def _import_registering_module(verl_module: str) -> bool:
    try:
        importlib.import_module(_AFTER_IMPORT[verl_module])
    except Exception as err:
        logger.warning("gear-rl: could not register its classes with %s (%s): %r", verl_module,
                       _AFTER_IMPORT[verl_module], err)
        return False
    return True


def _register_after_import(verl_module: str) -> bool:
    """Import ``verl_module``'s registering gear-rl module now if ``verl_module`` is imported,
    else as soon as it is. Returns ``True`` when it is registered now."""
    if verl_module in sys.modules:
        _HOOK.waiting.discard(verl_module)
        return _import_registering_module(verl_module)
    _HOOK.waiting.add(verl_module)
    if _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
    return False


def register_trainer_modes() -> bool:
    """Register the ``gear`` trainer modes now if verl's v1 trainer is imported, else as soon as
    it is. Returns ``True`` when they are registered now."""
    module = sys.modules.get(_V1)
    if module is not None and getattr(module, "register_trainer", None) is None:
        return False  # verl's v1 package is being imported right now: its loader registers
    return _register_after_import(_V1)


def register_agent_loop() -> bool:
    """Register the ``gear_env`` agent loop now if verl's agent-loop module is imported, else
    as soon as it is. Returns ``True`` when it is registered now."""
    return _register_after_import("verl.experimental.agent_loop.agent_loop")


def load_env_plugins() -> list[str]:
    """Import the modules named in ``GEAR_RL_PLUGINS`` and register their estimators with verl
    (:func:`load_verl_plugins`). Returns the estimator names they registered."""
    return load_verl_plugins(plugin_modules(os.environ.get(PLUGINS_ENV), PLUGINS_ENV))


def register() -> list[str]:
    """Register the estimators (now), the trainer modes (now or on import of verl's v1
    trainer), then the ``GEAR_RL_PLUGINS`` estimators. Idempotent; runs when this module is
    imported. Returns the verl names of the registered estimators."""
    register_platform()
    register_estimators()
    register_trainer_modes()
    register_agent_loop()
    load_env_plugins()
    return register_estimators()


try:
    register()
except Exception as error:
    # verl logs a plugin that fails to import only at DEBUG: say it where it will be seen.
    # gear-rl's own estimators are registered before a GEAR_RL_PLUGINS module is imported.
    logger.error("gear-rl's verl plugin failed to register: %s", error)
    raise
