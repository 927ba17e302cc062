"""``verl.plugins`` entry point: registers the ``gdro_grpo`` estimator and the GDRO trainer modes.

verl imports it on every ``import verl`` and swallows a plugin's exceptions, so each registration is
lazy (right after verl imports its registry: docs/integration.md, "Plugin import cost") and loud (a
failure is logged and recorded in :data:`~verl_gdro.integration.registry.REGISTRATION_ERRORS`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from verl_gdro.integration.registry import REGISTRATION_ERRORS
from verl_gdro.step.config import ESTIMATOR_NAME, TRAINER_NAME

logger = logging.getLogger(__name__)


def _register(module: str, name: str, what: str) -> None:
    """Import ``module`` (which registers ``name`` with verl); a failure is recorded and logged, not raised."""
    try:
        importlib.import_module(module)
        REGISTRATION_ERRORS.pop(name, None)
    except Exception as e:  # verl would swallow it: record and shout instead
        REGISTRATION_ERRORS[name] = f"{type(e).__name__}: {e}"
        logger.warning("verl-gdro: registering the %s %s failed: %s", name, what, e, exc_info=True)


#: verl module -> the registration that runs right after verl has imported it
REGISTER_AFTER: dict[str, Callable[[], None]] = {
    "verl.trainer.ppo.core_algos": partial(_register, "verl_gdro.integration.estimator", ESTIMATOR_NAME, "estimator"),
    "verl.trainer.ppo.v1": partial(_register, "verl_gdro.integration.trainer", TRAINER_NAME, "trainer"),
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """A post-import hook: wraps a named module's ``exec_module`` to run a callback after it."""

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
    """Register what verl has imported now, the rest after it does; install the driver check; return failures."""
    pending = {}
    for module, callback in REGISTER_AFTER.items():
        if module in sys.modules:
            callback()
        else:
            pending[module] = callback
    if pending and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(pending))
    try:  # the driver-side config check: not a registration, a failure only warns
        from verl_gdro.integration.driver import install_driver_validation

        install_driver_validation()
    except Exception as e:
        logger.warning("verl-gdro: driver-side config validation not installed: %s", e, exc_info=True)
    return dict(REGISTRATION_ERRORS)


register()
