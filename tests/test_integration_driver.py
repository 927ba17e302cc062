"""The ``main_ppo`` driver refuses a bad ``gdro`` config before Ray starts (integration/driver.py).

Runs in a fresh interpreter, importing names the way verl 0.9.1's ``main_ppo`` does: ``import verl``
(which loads the ``verl.plugins`` entry point) and then ``from verl.utils.config import
validate_config``. The e2e tier (tests/e2e) checks the same with a real ``main_ppo`` process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json
    import sys
    import verl  # noqa: F401  (loads verl-gdro's plugin, as main_ppo's first verl import does)
    from hydra import compose, initialize_config_module
    from verl.utils.config import validate_config
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    results = []
    for overrides in json.loads(sys.argv[1]):
        with initialize_config_module(config_module="verl_gdro.config", version_base=None):
            cfg = compose(config_name="gdro_trainer", overrides=overrides)
        try:
            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
            results.append("ACCEPTED")
        except ValueError as e:
            results.append("REFUSED: " + str(e))
    print("RESULTS=" + json.dumps(results))
    """
)

#: Remove the package config's gdro group (and its algorithm.gdro mirror): the estimator alone
#: reads algorithm.gdro only.
ESTIMATOR_ONLY = ["~algorithm.gdro", "~gdro"]

BASE = [
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
]


@pytest.mark.slow
def test_driver_validation_refuses_bad_gdro_config_and_leaves_other_trainers_alone() -> None:
    cases = [
        ["gdro.rollout.enable=true", "gdro.rollout.n_max=3"],  # rollout.n=4 outside [2, 3]
        ["gdro.rollout.enable=true"],  # a good config
        # the estimator alone reads algorithm.gdro (the package config's gdro group removed)
        ["trainer.v1.trainer_mode=sync", *ESTIMATOR_ONLY, "+algorithm.gdro.rollout.n_max=3"],  # Rollout-GDRO off: fine
        ["trainer.v1.trainer_mode=sync", *ESTIMATOR_ONLY, "+algorithm.gdro.rollout.enable=true"],  # cannot allocate
        ["trainer.v1.trainer_mode=sync", *ESTIMATOR_ONLY, "algorithm.adv_estimator=grpo",
         "actor_rollout_ref.rollout.n=1"],  # not ours
        ["trainer.v1.trainer_mode=sync", "gdro.prompt.eta=0.3"],  # a gdro group nothing would read: refused
    ]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps([BASE + c for c in cases])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS=")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    bad, good, alone, alone_bad, other, unread = json.loads(lines[0][len("RESULTS=") :])
    assert bad.startswith("REFUSED"), bad
    assert "actor_rollout_ref.rollout.n=4" in bad and "gdro.rollout.n_max=3" in bad, bad
    assert good == "ACCEPTED", good
    assert alone == "ACCEPTED", alone
    assert alone_bad.startswith("REFUSED: algorithm.gdro.rollout.enable=True is invalid"), alone_bad
    assert other == "ACCEPTED", other
    assert unread.startswith("REFUSED: gdro is invalid with trainer.v1.trainer_mode='sync'"), unread
    assert "algorithm.gdro" in unread, unread
