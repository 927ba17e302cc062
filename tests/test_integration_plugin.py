"""The ``verl.plugins`` entry point, in fresh interpreters (registration happens at ``import verl``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each case starts a Python that imports verl (10-30 s on 2 cores)


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO), **env}, cwd="/",
    )


REPO = Path(__file__).resolve().parent.parent


def test_import_verl_registers_estimator_and_trainer() -> None:
    proc = run(
        "import verl\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "from verl_gdro.integration.estimator import compute_gdro_grpo_advantage\n"
        "from verl_gdro.integration.trainer import GDROTrainerSync\n"
        "from verl_gdro.integration.registry import REGISTRATION_ERRORS, check_registered\n"
        "assert get_adv_estimator_fn('gdro_grpo') is compute_gdro_grpo_advantage\n"
        "assert get_trainer_cls('gdro_sync') is GDROTrainerSync\n"
        "assert REGISTRATION_ERRORS == {}, REGISTRATION_ERRORS\n"
        "check_registered()\n"
        "print('REGISTERED')\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REGISTERED" in proc.stdout


def test_registration_comes_from_the_entry_point() -> None:
    """With verl's plugin discovery off, nothing registers: proof that the entry point does it."""
    proc = run(
        "import sys, verl\n"
        "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "assert 'gdro_grpo' not in ADV_ESTIMATOR_REGISTRY\n"
        "assert 'verl_gdro.integration.plugin' not in sys.modules\n"
        "try:\n"
        "    get_trainer_cls('gdro_sync')\n"
        "except ValueError as e:\n"
        "    print('UNKNOWN:', e)\n",
        VERL_USE_EXTERNAL_PLUGINS="none",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "UNKNOWN: Unknown trainer 'gdro_sync'" in proc.stdout


def test_a_failing_registration_is_recorded_and_made_loud() -> None:
    """verl swallows a plugin's exception; ours records it, warns, and check_registered raises."""
    proc = run(
        "import sys\n"
        "sys.modules['verl_gdro.integration.estimator'] = None  # make its import fail\n"
        "import verl\n"
        "import verl.trainer.ppo.core_algos  # the estimator registers right after this import\n"
        "from verl_gdro.integration.registry import REGISTRATION_ERRORS, check_registered\n"
        "assert 'gdro_grpo' in REGISTRATION_ERRORS, REGISTRATION_ERRORS\n"
        "try:\n"
        "    check_registered()\n"
        "except RuntimeError as e:\n"
        "    print('LOUD:', e)\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOUD: verl-gdro is not registered with verl: advantage estimator 'gdro_grpo'" in proc.stdout
    assert "registering the gdro_grpo estimator failed" in proc.stderr


def test_import_verl_alone_imports_no_trainer() -> None:
    """issue 32: the plugin runs on every ``import verl`` in the environment; it imports neither
    verl's V1 trainer stack nor the estimator until verl itself imports their registries, and then
    registers at once."""
    proc = run(
        "import sys, verl\n"
        "heavy = [m for m in ('verl.trainer.ppo.v1', 'verl.trainer.ppo.core_algos', 'verl_gdro.integration.trainer',\n"
        "                     'verl_gdro.integration.estimator') if m in sys.modules]\n"
        "assert 'verl_gdro.integration.plugin' in sys.modules\n"
        "print('HEAVY', heavy)\n"
        "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY\n"
        "assert 'gdro_grpo' in ADV_ESTIMATOR_REGISTRY and 'verl_gdro.integration.trainer' not in sys.modules\n"
        "from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # a submodule first: the package runs first\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "assert get_trainer_cls('gdro_separate_async').__name__ == 'GDROTrainerSeparateAsync'\n"
        "print('LAZY OK')\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HEAVY []" in proc.stdout and "LAZY OK" in proc.stdout
