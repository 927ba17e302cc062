"""Hydra composition of the package config (as ``main_ppo --config-path=pkg://verl_gdro.config``
composes it) and of the experiment configs in ``hydra_configs/``, with overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from verl_gdro.step.config import validate_gdro_config

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "hydra_configs" / "experiment").glob("*.yaml"))


def composed(*overrides: str) -> object:
    with initialize_config_module(config_module="verl_gdro.config", version_base=None):
        return compose(config_name="gdro_trainer", overrides=list(overrides))


def test_package_config_extends_ppo_trainer_with_the_gdro_group() -> None:
    cfg = composed()
    assert cfg.algorithm.adv_estimator == "gdro_grpo"
    assert cfg.trainer.v1.trainer_mode == "gdro_sync" and cfg.trainer.use_v1 is True
    assert cfg.data.dataloader_num_workers == 0
    # verl's own groups are all there (the config extends ppo_trainer)
    for key in ("actor_rollout_ref.rollout.n", "reward.reward_manager.name", "transfer_queue", "critic"):
        assert OmegaConf.select(cfg, key) is not None, key
    assert OmegaConf.to_container(cfg.algorithm.gdro, resolve=True) == OmegaConf.to_container(cfg.gdro)
    settings = validate_gdro_config(cfg)
    # the package default: joint mode, the data adversary choosing prompts (failure-weighted priority)
    assert settings.preset == "robust" and settings.rollout.enable and settings.prompt.mode == "failure_weighted"
    # the same group with the estimator in verl's own sync trainer: what that path can run
    standalone = validate_gdro_config(composed("trainer.v1.trainer_mode=sync", "~algorithm.gdro", "~gdro"))
    assert not standalone.rollout.enable and standalone.prompt.mode == "reweight"
    # a gdro group without the GDRO trainer would be read by nothing: refused, naming algorithm.gdro
    with pytest.raises(ValueError, match=r"^gdro is invalid with trainer.v1.trainer_mode='sync'.*algorithm\.gdro"):
        validate_gdro_config(composed("trainer.v1.trainer_mode=sync"))


def test_overrides_reach_the_estimator_group() -> None:
    cfg = composed("gdro.rollout.enable=true", "gdro.prompt.eta=0.4", "actor_rollout_ref.rollout.n=6",
                   "gdro.classifier.num_bins=null", "gdro.classifier.bin_edges=[0.25,0.5,0.75]")
    OmegaConf.resolve(cfg)  # what verl's TaskRunner does before building the trainer
    assert cfg.algorithm.gdro.prompt.eta == 0.4 and cfg.algorithm.gdro.rollout.enable is True
    settings = validate_gdro_config(cfg)
    assert settings.num_bins == 4 and settings.rollout.enable


def test_verl_accepts_the_composed_config(tmp_path) -> None:
    """verl's own validate_config (main_ppo runs it before Ray, wrapped by the plugin's driver
    check, which also wants the data files to exist) passes on the package config."""
    from integration_harness import write_dataset
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    data = write_dataset(tmp_path, 8)
    cfg = composed(
        f"data.train_files={data}", f"data.val_files={data}", "gdro.rollout.enable=true", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    )
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert need_critic(cfg) is False


def test_a_bad_override_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"^actor_rollout_ref.rollout.n=16 is invalid"):
        validate_gdro_config(composed("gdro.rollout.enable=true", "actor_rollout_ref.rollout.n=16"))
    with pytest.raises(ValueError, match=r"^gdro.prompt.beta=0 is invalid"):
        validate_gdro_config(composed("gdro.prompt.beta=0"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_config_composes_and_validates(experiment: str) -> None:
    cfg = composed(
        f"hydra.searchpath=[pkg://verl.trainer.config,file://{ROOT / 'hydra_configs'}]",
        f"+experiment={experiment}",
        "gdro.prompt.eta=0.5",
    )
    assert cfg.trainer.experiment_name.startswith(experiment.rsplit("_qwen3", 1)[0])
    settings = validate_gdro_config(cfg)
    assert settings.prompt.eta == 0.5
    if experiment.startswith(("rollout_gdro", "joint")):
        assert settings.rollout.enable


@pytest.mark.slow
def test_main_ppo_entry_point_composes_the_package_config() -> None:
    """The real command line: ``main_ppo --config-path=pkg://verl_gdro.config`` (``--cfg job`` prints
    the composed config and exits before main runs, so no Ray)."""
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path=pkg://verl_gdro.config",
         "--config-name=gdro_trainer", "--cfg", "job", "--resolve",
         "gdro.rollout.enable=true", "gdro.prompt.eta=0.4", "actor_rollout_ref.rollout.n=6"],
        capture_output=True, text=True, timeout=300, cwd="/", env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = OmegaConf.create(proc.stdout[proc.stdout.index("actor_rollout_ref:"):])
    assert cfg.trainer.v1.trainer_mode == "gdro_sync" and cfg.algorithm.adv_estimator == "gdro_grpo"
    assert cfg.algorithm.gdro.prompt.eta == 0.4 and cfg.gdro.rollout.enable is True
    assert validate_gdro_config(cfg).rollout.enable
