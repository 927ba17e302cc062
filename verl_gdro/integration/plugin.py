"""``verl.plugins`` entry point: registers the ``gdro_grpo`` estimator and the GDRO trainer modes.

verl imports this module on every ``import verl`` (driver, TaskRunner actor, workers, and any
other program of the environment that imports verl) and swallows any exception a plugin raises
(logged at DEBUG only). Two consequences shape it:

- **Lazy.** Registering means importing the estimator (verl's ``core_algos``, ~0.6 s) and the
  trainer module (verl's whole V1 trainer stack, ~3-6 s and ~1,500 modules), which a process that
  never trains pays for nothing. So nothing is imported here: each registration runs right after
  verl itself imports the registry it belongs to (``verl.trainer.ppo.core_algos`` for the
  estimator, the package ``verl.trainer.ppo.v1`` for the trainers, whose ``__init__`` defines all
  four trainer classes), through a post-import hook on ``sys.meta_path``. Whoever looks a name up
  in those registries has imported them first, so the names are always there when looked up.
  ``docs/benchmarks.md`` ("Plugin import cost") has the measurement.
- **Loud.** Each registration is attempted on its own, a failure is logged at WARNING and recorded
  in :data:`REGISTRATION_ERRORS`, and the GDRO trainer calls
  :func:`verl_gdro.integration.registry.check_registered` at init. The record lives in
  :mod:`~verl_gdro.integration.registry`, which imports neither this module nor the trainer.

``VERL_USE_EXTERNAL_PLUGINS=none`` (verl's own switch) keeps verl from loading any plugin, this
one included.
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import sys
from collections.abc import Callable
from typing import Any

from verl_gdro.integration.registry import REGISTRATION_ERRORS
from verl_gdro.step.config import ESTIMATOR_NAME, TRAINER_NAME

__all__ = ["REGISTER_AFTER", "register"]

logger = logging.getLogger(__name__)


def _register_estimator() -> None:
    try:
        importlib.import_module("verl_gdro.integration.estimator")  # registers gdro_grpo
        REGISTRATION_ERRORS.pop(ESTIMATOR_NAME, None)
    except Exception as e:  # verl would swallow it: record and shout instead
        REGISTRATION_ERRORS[ESTIMATOR_NAME] = f"{type(e).__name__}: {e}"
        logger.warning("verl-gdro: registering the %s estimator failed: %s", ESTIMATOR_NAME, e, exc_info=True)


def _register_trainers() -> None:
    try:
        importlib.import_module("verl_gdro.integration.trainer")  # registers gdro_sync and the async modes
        REGISTRATION_ERRORS.pop(TRAINER_NAME, None)
    except Exception as e:
        REGISTRATION_ERRORS[TRAINER_NAME] = f"{type(e).__name__}: {e}"
        logger.warning("verl-gdro: registering the %s trainer failed: %s", TRAINER_NAME, e, exc_info=True)


#: verl module -> the registration that runs right after verl has imported it
REGISTER_AFTER: dict[str, Callable[[], None]] = {
    "verl.trainer.ppo.core_algos": _register_estimator,
    "verl.trainer.ppo.v1": _register_trainers,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a named module has been executed (a post-import hook).

    It finds the module's spec with the other finders and wraps that spec's loader's
    ``exec_module``; the module itself is loaded exactly as it would be without the hook.
    """

    def __init__(self, callbacks: dict[str, Callable[[], None]]) -> None:
        self.callbacks = dict(callbacks)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        callback = self.callbacks.pop(name)
        exec_module = loader.exec_module

        def exec_then_register(module: Any) -> None:
            exec_module(module)
            callback()

        loader.exec_module = exec_then_register  # this spec's own loader instance
        if not self.callbacks:
            sys.meta_path.remove(self)
        return spec


def register() -> dict[str, str]:
    """Register now what verl has already imported, the rest right after verl imports it
    (idempotent); install the driver-side config check. Returns the failures recorded so far."""
    pending = {}
    for module, callback in REGISTER_AFTER.items():
        if module in sys.modules:
            callback()
        else:
            pending[module] = callback
    if pending and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(pending))
    try:
        # Added by the e2e tier (issue 7): refuse a bad gdro config in the main_ppo driver, before
        # Ray starts (verl_gdro/integration/driver.py). Not a registration: failure only warns.
        # Cheap: verl.utils.config is loaded by `import verl`, the checks are numpy-only.
        from verl_gdro.integration.driver import install_driver_validation

        install_driver_validation()
    except Exception as e:
        logger.warning("verl-gdro: driver-side config validation not installed: %s", e, exc_info=True)
    return dict(REGISTRATION_ERRORS)


register()
