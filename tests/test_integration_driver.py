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
from pathlib import Path

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


def _driver_results(tmp_path: Path, cases: list[list[str]], rows: int = 24) -> list[str]:
    """verl's validate_config (as main_ppo's driver calls it, our wrapper in place) on each case,
    with a local training/validation parquet of ``rows`` rows unless the case names its own."""
    from integration_harness import write_dataset

    data = write_dataset(tmp_path, rows)
    files = [f"data.train_files={data}", f"data.val_files={data}"]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps([files + BASE + c for c in cases])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS=")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    return json.loads(lines[0][len("RESULTS=") :])


@pytest.mark.slow
def test_driver_refuses_missing_data_and_a_set_smaller_than_a_batch(tmp_path: Path) -> None:
    """issue 36, items 7 and 8: before Ray, not in the TaskRunner (a hang) or in fit (0 steps per
    epoch, ZeroDivisionError); remote URIs are verl's to fetch; the estimator alone refuses a key
    it does not read."""
    missing = tmp_path / "absent.parquet"
    cases = [
        [f"data.train_files={missing}"],
        [f"data.val_files={missing}"],
        ["data.train_files=hdfs://cluster/data/train.parquet"],
        ["data.train_max_samples=4"],
        ["trainer.v1.trainer_mode=sync", *ESTIMATOR_ONLY, "+algorithm.gdro.classifier.window=5"],
    ]
    train, val, remote, small, unread = _driver_results(tmp_path, cases)
    assert train == f"REFUSED: data.train_files={missing} does not exist on this machine ({missing}); give an " \
        "existing local file or a remote URI (hdfs://, s3://, gs://)", train
    assert val.startswith(f"REFUSED: data.val_files={missing} does not exist"), val
    assert remote == "ACCEPTED", remote
    assert small.startswith("REFUSED: data.train_files has 4 rows, fewer than data.train_batch_size=8"), small
    assert unread.startswith("REFUSED: algorithm.gdro.classifier.window is invalid for the gdro_grpo estimator "
                             "alone: it does not read it"), unread
    (few,) = _driver_results(tmp_path, [[]], rows=5)
    assert few.startswith("REFUSED: data.train_files has 5 rows, fewer than data.train_batch_size=8"), few


@pytest.mark.slow
def test_driver_validation_refuses_bad_gdro_config_and_leaves_other_trainers_alone(tmp_path: Path) -> None:
    cases = [
        ["gdro.rollout.enable=true", "gdro.rollout.n_max=3"],  # rollout.n=4 outside [2, 3]
        ["gdro.rollout.enable=true"],  # a good config
        # the estimator alone reads algorithm.gdro (the package config's gdro group removed)
        ["trainer.v1.trainer_mode=sync", *ESTIMATOR_ONLY, "+algorithm.gdro.prompt.eta=0.3"],  # a key it reads: fine
        ["trainer.v1.trainer_mode=sync", *ESTIMATOR_ONLY, "+algorithm.gdro.rollout.enable=true"],  # cannot allocate
        ["trainer.v1.trainer_mode=sync", *ESTIMATOR_ONLY, "algorithm.adv_estimator=grpo",
         "actor_rollout_ref.rollout.n=1"],  # not ours
        ["trainer.v1.trainer_mode=sync", "gdro.prompt.eta=0.3"],  # a gdro group nothing would read: refused
        # algorithm.gdro under verl's own grpo estimator: nothing reads it (issue 36: accepted and ignored)
        ["trainer.v1.trainer_mode=sync", *ESTIMATOR_ONLY, "algorithm.adv_estimator=grpo", "+algorithm.gdro.prompt.eta=0.3"],
    ]
    bad, good, alone, alone_bad, other, unread, ignored = _driver_results(tmp_path, cases)
    assert bad.startswith("REFUSED"), bad
    assert "actor_rollout_ref.rollout.n=4" in bad and "gdro.rollout.n_max=3" in bad, bad
    assert good == "ACCEPTED", good
    assert alone == "ACCEPTED", alone
    assert alone_bad.startswith("REFUSED: algorithm.gdro.rollout.enable=True is invalid"), alone_bad
    assert other == "ACCEPTED", other
    assert unread.startswith("REFUSED: gdro is invalid with trainer.v1.trainer_mode='sync'"), unread
    assert "algorithm.gdro" in unread, unread
    assert ignored == "REFUSED: algorithm.gdro is invalid with algorithm.adv_estimator=grpo: only the gdro_grpo " \
        "estimator reads it, so nothing would; set algorithm.adv_estimator=gdro_grpo, or remove algorithm.gdro", ignored
