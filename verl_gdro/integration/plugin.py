"""``verl.plugins`` entry point: registers the ``gdro_grpo`` estimator and the ``gdro_sync`` trainer.

verl imports this module on every ``import verl`` (driver, TaskRunner actor, workers) and swallows
any exception a plugin raises (logged at DEBUG only). So each registration is attempted on its own,
a failure is logged at WARNING and recorded in :data:`REGISTRATION_ERRORS`, and the GDRO trainer
calls :func:`verl_gdro.integration.registry.check_registered` at init to turn a silent failure
into a loud one. The record lives in :mod:`~verl_gdro.integration.registry`, which imports neither
this module nor the trainer, so the trainer can read it without an import circle.
"""

from __future__ import annotations

import logging

from verl_gdro.integration.registry import REGISTRATION_ERRORS
from verl_gdro.step.config import ESTIMATOR_NAME, TRAINER_NAME

__all__ = ["register"]

logger = logging.getLogger(__name__)


def register() -> dict[str, str]:
    """Import the modules whose decorators register the estimator and the trainer (idempotent)."""
    try:
        from verl_gdro.integration import estimator  # noqa: F401  (registers gdro_grpo)

        REGISTRATION_ERRORS.pop(ESTIMATOR_NAME, None)
    except Exception as e:  # verl would swallow it: record and shout instead
        REGISTRATION_ERRORS[ESTIMATOR_NAME] = f"{type(e).__name__}: {e}"
        logger.warning("verl-gdro: registering the %s estimator failed: %s", ESTIMATOR_NAME, e, exc_info=True)
    try:
        from verl_gdro.integration import trainer  # noqa: F401  (registers gdro_sync and the async modes)

        REGISTRATION_ERRORS.pop(TRAINER_NAME, None)
    except Exception as e:
        REGISTRATION_ERRORS[TRAINER_NAME] = f"{type(e).__name__}: {e}"
        logger.warning("verl-gdro: registering the %s trainer failed: %s", TRAINER_NAME, e, exc_info=True)
    try:
        # Added by the e2e tier (issue 7): refuse a bad gdro config in the main_ppo driver, before
        # Ray starts (verl_gdro/integration/driver.py). Not a registration: failure only warns.
        from verl_gdro.integration.driver import install_driver_validation

        install_driver_validation()
    except Exception as e:
        logger.warning("verl-gdro: driver-side config validation not installed: %s", e, exc_info=True)
    return dict(REGISTRATION_ERRORS)


register()
