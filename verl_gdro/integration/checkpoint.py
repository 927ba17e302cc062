"""The standalone ``gdro_grpo`` estimator's state beside verl's checkpoint, and its metrics in verl's log.

verl 0.9.1's one checkpoint hook, ``trainer.checkpoint_callback_class``: ``on_save`` writes
``<global_step_N>/gdro_estimator.json``, the constructor restores the folder verl resumes from and wraps
``Tracking.log`` (no hook sees the step's metrics) (docs/integration.md, "1. Estimator only").
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any

from verl.trainer.ppo.checkpoint_callback import CheckpointCallback

from verl_gdro.integration import estimator
from verl_gdro.integration.resume_check import resume_folder

logger = logging.getLogger(__name__)

STATE_FILE = "gdro_estimator.json"
CALLBACK_CLASS = "verl_gdro.integration.checkpoint.StandaloneEstimatorCheckpoint"
_MARK = "_verl_gdro_standalone_metrics"


def install_metrics_logging() -> None:
    """Wrap ``Tracking.log`` once: a training-step row gets the estimator's last ``gdro/`` metrics."""
    from verl.utils.tracking import Tracking

    original = Tracking.log
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def log(self: Any, data: Any, step: Any, backend: Any = None) -> Any:
        if isinstance(data, dict) and "training/global_step" in data:
            extra = estimator.pop_standalone_metrics()
            if extra:
                data = {**data, **extra}
        return original(self, data=data, step=step, backend=backend)

    setattr(log, _MARK, True)
    Tracking.log = log


class StandaloneEstimatorCheckpoint(CheckpointCallback):
    """The ``trainer.checkpoint_callback_class``; subclass it (calling ``super()``) to add your own."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config=config)
        install_metrics_logging()
        folder = resume_folder(config) if config is not None else None
        if folder is None:
            return
        path = os.path.join(folder, STATE_FILE)
        if not os.path.isfile(path):
            logger.warning("gdro_grpo (standalone): resuming from %s, which holds no %s: Prompt-GDRO's state restarts "
                           "(the checkpoint was saved without %s)", folder, STATE_FILE, CALLBACK_CLASS)
            return
        with open(path, encoding="utf-8") as fh:
            estimator.import_standalone(json.load(fh))
        logger.info("gdro_grpo (standalone): Prompt-GDRO state read from %s", path)

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False,
                **kwargs: Any) -> None:
        state = estimator.export_standalone()
        if state is None:
            return  # no standalone step has run (e.g. the GDRO trainer drives the estimator)
        os.makedirs(checkpoint_dir, exist_ok=True)
        tmp = os.path.join(checkpoint_dir, STATE_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(state, fh)
        os.replace(tmp, os.path.join(checkpoint_dir, STATE_FILE))
