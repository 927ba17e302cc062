"""Refuse, in the ``main_ppo`` driver, a checkpoint folder that holds a run of other ``gdro`` settings.

verl resumes (and the trainer refuses a controller state "saved under different gdro settings") only
after Ray and the models have started, so the driver first restores the saved state into a controller
of this run's settings with the controller's own ``load_state_dict`` (the trainer's comparison).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["check_resume_folder", "resume_folder", "saved_controller_state"]

#: the keys of :meth:`verl_gdro.step.controller.GDROController.state_dict` that identify it
_CONTROLLER_KEYS = {"version", "settings", "rollout_n", "controller_version"}


def resume_folder(config: Any) -> str | None:
    """The ``global_step_N`` folder verl's V1 trainer resumes from (``_load_checkpoint``'s rules), or None
    (a fresh run, without verl's print that the tracker file is missing)."""
    trainer = config.trainer
    mode = trainer.get("resume_mode", "auto")
    if mode == "auto":
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

        folder = trainer.get("default_local_dir", None)
        if not folder or not os.path.isfile(os.path.join(str(folder), "latest_checkpointed_iteration.txt")):
            return None
        return find_latest_ckpt_path(os.path.abspath(str(folder)))
    path = trainer.get("resume_from_path", None)
    if mode == "resume_path" and isinstance(path, str) and "global_step_" in path:  # verl asserts on the rest
        return os.path.abspath(path)
    return None


def saved_controller_state(node: Any, depth: int = 0) -> Mapping[str, Any] | None:
    """The GDRO controller's state anywhere inside verl's dataloader state (depth-first), or None."""
    if isinstance(node, Mapping) and _CONTROLLER_KEYS <= set(node):
        return node
    children = node.values() if isinstance(node, Mapping) else node if isinstance(node, (list, tuple)) else ()
    found = (saved_controller_state(child, depth + 1) for child in (children if depth <= 8 else ()))
    return next((state for state in found if state is not None), None)


def check_resume_folder(config: Any, settings: Any) -> None:
    """Raise ValueError naming the folder when the checkpoint verl would resume from holds controller
    state that this run's settings cannot take (other settings or rollout budget)."""
    folder = resume_folder(config) if settings.enable else None
    path = None if folder is None else os.path.join(folder, "data.pt")
    if path is None or not os.path.isfile(path):
        return
    import torch

    from verl_gdro.step.controller import GDROController

    state = saved_controller_state(torch.load(path, weights_only=False, map_location="cpu"))
    if state is None:
        return
    rollout_n = int(config.actor_rollout_ref.rollout.n)
    try:
        GDROController(settings, rollout_n=rollout_n).load_state_dict(state)
    except ValueError as e:
        by_path = config.trainer.get("resume_mode", "auto") == "resume_path"
        key = "trainer.resume_from_path" if by_path else "trainer.default_local_dir"
        raise ValueError(f"{key}={config.trainer.get(key.split('.')[1])} holds a run this configuration cannot resume "
                         f"({path}): {e}; give this run its own trainer.experiment_name (the recipes' EXP_NAME) or "
                         "resume with that run's settings") from None
