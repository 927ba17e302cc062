"""The ``main_ppo`` driver refuses a checkpoint folder holding a run of other ``gdro`` settings,
before Ray (issue 36, item 13): the saved controller state is restored into this run's controller
with the controller's own comparison, as the trainer would after the models load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from verl_gdro.integration.resume_check import check_resume_folder
from verl_gdro.step.config import resolve_gdro
from verl_gdro.step.controller import GDROController


def _checkpoint(folder: Path, preset: str, step: int = 5, rollout_n: int = 4) -> None:
    """What verl's checkpoint holds: data.pt with the dataloader state, the sampler's state (and
    its controller's) nested inside, and the tracker file naming the step."""
    (folder / f"global_step_{step}").mkdir(parents=True)
    controller = GDROController(resolve_gdro({"preset": preset}), rollout_n=rollout_n).state_dict()
    torch.save({"_index_sampler_state": {"sampler": {"mode": "shuffle", "controller": controller}}, "epoch": 0},
               folder / f"global_step_{step}" / "data.pt")
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))


def _config(folder: Path, mode: str = "auto", **trainer: str) -> object:
    return OmegaConf.create({"trainer": {"default_local_dir": str(folder), "resume_mode": mode, **trainer},
                             "actor_rollout_ref": {"rollout": {"n": 4}}})


def test_a_folder_of_other_settings_is_refused_before_ray(tmp_path: Path) -> None:
    _checkpoint(tmp_path, "release")
    with pytest.raises(ValueError, match=rf"^trainer.default_local_dir={tmp_path} holds a run this configuration "
                                         r"cannot resume .*saved under different gdro settings .*EXP_NAME"):
        check_resume_folder(_config(tmp_path), resolve_gdro({"preset": "robust"}))
    check_resume_folder(_config(tmp_path), resolve_gdro({"preset": "release"}))  # the same run resumes
    check_resume_folder(_config(tmp_path, mode="disable"), resolve_gdro({"preset": "robust"}))  # not resuming
    check_resume_folder(_config(tmp_path / "fresh"), resolve_gdro({"preset": "robust"}))  # nothing saved


def test_resume_path_and_budget(tmp_path: Path) -> None:
    _checkpoint(tmp_path, "robust", step=3)
    path = str(tmp_path / "global_step_3")
    with pytest.raises(ValueError, match=r"^trainer.resume_from_path=.*rollout.n=4, this run has 8"):
        cfg = _config(tmp_path, mode="resume_path", resume_from_path=path)
        cfg.actor_rollout_ref.rollout.n = 8
        check_resume_folder(cfg, resolve_gdro({"preset": "robust", "rollout": {"n_max": 12}}))


@pytest.mark.slow
def test_the_driver_wrapper_runs_it(tmp_path: Path) -> None:
    """verl's validate_config as main_ppo's driver calls it (the plugin's wrapper installed)."""
    from hydra import compose, initialize_config_module
    from integration_harness import write_dataset
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils import config as verl_config

    from verl_gdro.integration.driver import install_driver_validation

    install_driver_validation()
    _checkpoint(tmp_path / "ckpt", "paper")
    data = write_dataset(tmp_path, 8)
    with initialize_config_module(config_module="verl_gdro.config", version_base=None):
        cfg = compose(config_name="gdro_trainer", overrides=[
            f"data.train_files={data}", f"data.val_files={data}", "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8", f"trainer.default_local_dir={tmp_path / 'ckpt'}"])
    with pytest.raises(ValueError, match="saved under different gdro settings"):
        verl_config.validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg),
                                    use_critic=need_critic(cfg))
