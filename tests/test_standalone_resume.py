"""The standalone ``gdro_grpo`` estimator survives a resume and logs its ``gdro/`` metrics (issue 31.5).

Its Prompt-GDRO state is written beside verl's checkpoint by verl 0.9.1's own checkpoint hook
(``trainer.checkpoint_callback_class`` -> ``StandaloneEstimatorCheckpoint.on_save``) and read back
when verl builds the callback of the resumed run; the metrics of each step reach the row verl's
``Tracking`` logs for it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from omegaconf import OmegaConf
from test_integration_estimator import SIZES, advantages

from verl_gdro.integration import checkpoint as ckpt
from verl_gdro.integration import estimator as est


def _config(tmp_path: Path, mode: str = "auto", path: str | None = None):
    return OmegaConf.create({"trainer": {
        "resume_mode": mode, "resume_from_path": path, "default_local_dir": str(tmp_path / "ckpt"),
        "checkpoint_callback_class": ckpt.CALLBACK_CLASS,
    }})


def _save(tmp_path: Path, step: int) -> Path:
    """What verl's V1 trainer does at a save: write global_step_N (its own parts), the tracker
    file, then call the callback's on_save with the folder."""
    folder = tmp_path / "ckpt" / f"global_step_{step}"
    folder.mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text(str(step))
    ckpt.StandaloneEstimatorCheckpoint(_config(tmp_path, "disable")).on_save(None, step, str(folder))
    return folder


def test_a_resumed_run_continues_the_estimator_bit_for_bit(grpo_batch, tmp_path: Path) -> None:
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

    batches = [grpo_batch(SIZES, seed=40 + s) for s in range(5)]
    uninterrupted = [advantages(b, "gdro_grpo") for b in batches]
    est.reset_standalone()
    for b in batches[:3]:
        advantages(b, "gdro_grpo")
    folder = _save(tmp_path, 3)
    saved = json.loads((folder / ckpt.STATE_FILE).read_text())
    assert saved["steps"] == 3 and len(saved["prompt"]["scores"]) == 10
    est.reset_standalone()  # a new process
    callback = build_checkpoint_callback(_config(tmp_path))  # verl builds it in the trainer's __init__
    assert isinstance(callback, ckpt.StandaloneEstimatorCheckpoint)
    resumed = [advantages(b, "gdro_grpo") for b in batches[3:]]
    for got, want in zip(resumed, uninterrupted[3:]):
        assert torch.equal(got, want)
    assert est.standalone_state()["steps"] == 5
    # resume_path finds the same folder
    assert ckpt.resume_folder(_config(tmp_path, "resume_path", str(folder))) == str(folder)


def test_state_of_other_settings_or_no_state_warns_and_restarts(grpo_batch, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING)
    (tmp_path / "ckpt" / "global_step_2").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    ckpt.StandaloneEstimatorCheckpoint(_config(tmp_path))
    assert any("holds no gdro_estimator.json" in r.getMessage() for r in caplog.records)
    est.reset_standalone()
    advantages(grpo_batch(SIZES, seed=1), "gdro_grpo")
    state = est.export_standalone()
    est.reset_standalone()
    est.import_standalone(state)
    fresh = advantages(grpo_batch(SIZES, seed=2), "gdro_grpo", prompt={"eta": 0.3})  # other settings
    assert any("saved under other algorithm.gdro settings" in r.getMessage() for r in caplog.records)
    assert est.standalone_state()["steps"] == 1
    est.reset_standalone()
    assert torch.equal(fresh, advantages(grpo_batch(SIZES, seed=2), "gdro_grpo", prompt={"eta": 0.3}))


def test_each_steps_gdro_metrics_reach_verls_logged_row(grpo_batch, tmp_path: Path, monkeypatch) -> None:
    from verl.utils.tracking import Tracking

    ckpt.StandaloneEstimatorCheckpoint(_config(tmp_path, "disable"))  # installs the logging
    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tracking = Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    advantages(grpo_batch(SIZES, seed=5), "gdro_grpo")
    tracking.log({"val-core/acc": 0.5}, step=1)  # a validation row: not the step's
    tracking.log({"training/global_step": 1, "actor/pg_loss": 0.1}, step=1)
    tracking.log({"training/global_step": 2, "actor/pg_loss": 0.1}, step=2)  # no estimator step since
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert not any(k.startswith("gdro/") for k in rows[0]["data"])
    step = rows[1]["data"]
    assert step["gdro/standalone_steps"] == 1.0
    shares = [v for k, v in step.items() if k.startswith("gdro/prompt_share/bin_")]
    assert len(shares) == 10 and abs(sum(shares) - 1.0) < 1e-9
    present = [int(k.rsplit("_", 1)[1]) for k, v in step.items() if k.startswith("gdro/count/bin_") and v > 0]
    assert present and all(f"gdro/prompt_weight/bin_{b}" in step for b in present)
    assert all(f"gdro/q/bin_{b}" in step for b in range(10))
    assert not any(k.startswith("gdro/") for k in rows[2]["data"])  # each step's metrics once


def test_the_driver_selects_the_callback_for_the_estimator_alone() -> None:
    from hydra import compose, initialize_config_module
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

    from verl_gdro.integration.driver import select_standalone_checkpoint

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=["algorithm.adv_estimator=gdro_grpo"])
    assert cfg.trainer.checkpoint_callback_class is None
    assert select_standalone_checkpoint(cfg) == "selected"
    assert isinstance(build_checkpoint_callback(cfg), ckpt.StandaloneEstimatorCheckpoint)
    assert select_standalone_checkpoint(cfg) == "kept"
    cfg.trainer.checkpoint_callback_class = "my.Callback"
    assert select_standalone_checkpoint(cfg) == "warned"


def test_the_driver_logs_the_estimators_resolved_group(tmp_path: Path) -> None:
    """issue 32, item 5 for the estimator alone: after main_ppo's (wrapped) validate_config the
    config verl will log carries the resolved algorithm.gdro (preset values; issue 36: only the keys
    this path reads, no preset loss signal it does not run), which the estimator resolves to the
    very same settings."""
    from hydra import compose, initialize_config_module
    from integration_harness import write_dataset
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils import config as verl_config

    from verl_gdro.integration.driver import install_driver_validation
    from verl_gdro.integration.estimator_keys import ESTIMATOR_READS, estimator_path_settings

    install_driver_validation()
    data = write_dataset(tmp_path, 1024)
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[
            "algorithm.adv_estimator=gdro_grpo", "actor_rollout_ref.rollout.n=4", "+algorithm.gdro.preset=paper",
            "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
            f"data.train_files={data}", f"data.val_files={data}"])
    before = estimator_path_settings(cfg.algorithm)
    verl_config.validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    group = OmegaConf.to_container(cfg.algorithm.gdro, resolve=True)
    assert (group["prompt"]["mode"], group["prompt"]["min_ess"], group["rollout"]) == ("reweight", 0.0, {"enable": False})
    assert "loss_signal" not in group["prompt"] and "window" not in group["classifier"]
    assert len(ESTIMATOR_READS) == sum(len(v) if isinstance(v, dict) else 1 for v in group.values())
    assert estimator_path_settings(cfg.algorithm) == before and before.prompt.loss_signal == "failure_rate"
    assert cfg.trainer.checkpoint_callback_class == ckpt.CALLBACK_CLASS
