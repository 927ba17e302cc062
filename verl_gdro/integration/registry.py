"""What the ``verl.plugins`` entry point failed to register, and the check the trainer runs at init
to make that loud; kept below the plugin and the trainer so neither imports the other."""

from __future__ import annotations

from verl_gdro.step.config import ESTIMATOR_NAME, TRAINER_MODES, TRAINER_NAME

#: name -> "ExceptionType: message" for every registration that failed in this process.
REGISTRATION_ERRORS: dict[str, str] = {}


def check_registered() -> None:
    """Raise RuntimeError unless verl's registries hold verl-gdro's estimator and trainer."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    problems = []
    if ESTIMATOR_NAME not in ADV_ESTIMATOR_REGISTRY:
        problems.append(f"advantage estimator '{ESTIMATOR_NAME}' ({REGISTRATION_ERRORS.get(ESTIMATOR_NAME, 'not imported')})")
    for name in TRAINER_MODES:  # one module (verl_gdro.integration.trainer) registers them all
        if name not in TRAINER_REGISTRY:
            problems.append(f"trainer '{name}' ({REGISTRATION_ERRORS.get(TRAINER_NAME, 'not imported')})")
    if problems:
        raise RuntimeError("verl-gdro is not registered with verl: " + "; ".join(problems) + ". Is the package "
                           "installed (pip install -e .) so that the verl.plugins entry point loads "
                           "verl_gdro.integration.plugin, and is VERL_USE_EXTERNAL_PLUGINS not 'none'?")
