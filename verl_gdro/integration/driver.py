"""Validate the ``gdro`` config in the ``main_ppo`` driver, before Ray starts.

verl builds the trainer inside the ``TaskRunner`` Ray actor, after Ray has started; ``main_ppo.main``
calls ``verl.utils.config.validate_config`` in the driver first (imported after the ``verl.plugins``
entry points ran), so the plugin wraps it with verl-gdro's checks, run before verl's own.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any

from verl_gdro.integration.estimator_keys import estimator_path_settings, honoured_group, runs_estimator_alone
from verl_gdro.step.config import ESTIMATOR_NAME, TRAINER_MODES, read_path, validate_gdro_config

logger = logging.getLogger(__name__)

_MARK = "_verl_gdro_driver_validation"


def uses_gdro_trainer(config: Any) -> bool:
    """True when the config selects a GDRO trainer mode (a partial or foreign config: False)."""
    return read_path(config, "trainer.v1.trainer_mode") in TRAINER_MODES


def uses_gdro(config: Any) -> bool:
    """True for the GDRO trainer, the ``gdro_grpo`` estimator, or a ``gdro`` / ``algorithm.gdro`` group."""
    return (uses_gdro_trainer(config) or read_path(config, "gdro") is not None
            or read_path(config, "algorithm.gdro") is not None
            or read_path(config, "algorithm.adv_estimator") == ESTIMATOR_NAME)


def select_standalone_checkpoint(config: Any) -> str:
    """Have verl save the estimator's state through ``trainer.checkpoint_callback_class`` unless the run
    names its own: ``selected``, ``kept`` (ours already) or ``warned`` (another, or the legacy trainer)."""
    from omegaconf import open_dict

    from verl_gdro.integration.checkpoint import CALLBACK_CLASS

    trainer = config.trainer
    current = trainer.get("checkpoint_callback_class", None)
    if current == CALLBACK_CLASS:
        return "kept"
    if trainer.get("use_v1", True) is True and not current:
        with open_dict(config):
            trainer.checkpoint_callback_class = CALLBACK_CLASS
        logger.info("verl-gdro: trainer.checkpoint_callback_class=%s saves the gdro_grpo estimator's state", CALLBACK_CLASS)
        return "selected"
    why = f"trainer.checkpoint_callback_class={current}" if current else "trainer.use_v1=false has no checkpoint hook"
    logger.warning("verl-gdro: the gdro_grpo estimator's Prompt-GDRO state is not saved with this run's checkpoints "
                   "(%s): a resumed run restarts it. Use trainer.checkpoint_callback_class=%s (or a subclass of it) on "
                   "the V1 trainer", why, CALLBACK_CLASS)
    return "warned"


#: a URI verl copies or streams from elsewhere (``hdfs://``, ``s3://``, ``gs://``, ...): not checked here
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def data_files(config: Any, key: str) -> list[str]:
    """The paths a ``data.*_files`` key names (one string or a list; none when unset)."""
    v = read_path(config, key)
    return [] if v is None else [v] if isinstance(v, str) else [str(f) for f in v]


def check_launch_keys(config: Any) -> None:
    """verl keys whose mistakes verl reports late or under another name (``data.custom_cls``, ``seed``)."""
    custom = read_path(config, "data.custom_cls")
    if custom is not None and custom.get("path", None) and not custom.get("name", None):
        raise ValueError(f"data.custom_cls.name={custom.get('name', None)!r} is invalid with data.custom_cls.path="
                         f"{custom.get('path')}: name the dataset class in that file (e.g. "
                         "data.custom_cls.name=GDRODataset)")
    seed = read_path(config, "seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed={seed!r} is invalid: must be an integer >= 0 (it seeds the data order, vLLM "
                         "sampling and gdro.rollout.seed)")


def check_batch_fits(config: Any, train_rows: int) -> None:
    """Refuse a training set that does not fill one batch (verl's loader drops it: an epoch of 0 steps)."""
    bs = int(config.data.train_batch_size)
    if train_rows < bs:
        raise ValueError(f"data.train_files has {train_rows} rows, fewer than data.train_batch_size={bs}: verl drops "
                         "the incomplete last batch, so an epoch would have 0 steps; use more training rows or a "
                         "smaller data.train_batch_size")


def check_data_files(config: Any) -> None:
    """Every local ``data.train_files`` / ``data.val_files`` path exists and the local training parquet
    files hold a batch (remote URIs apart); a ValueError names the key."""
    import pyarrow.parquet as pq

    rows: int | None = 0
    for key in ("data.train_files", "data.val_files"):
        for f in data_files(config, key):
            if _REMOTE.match(f):
                rows = None if key == "data.train_files" else rows
                continue
            path = os.path.expanduser(f)
            if not os.path.isfile(path):
                raise ValueError(f"{key}={f} does not exist on this machine ({os.path.abspath(path)}); give an "
                                 "existing local file or a remote URI (hdfs://, s3://, gs://)")
            if key == "data.train_files" and rows is not None:
                rows = rows + pq.read_metadata(path).num_rows if path.endswith(".parquet") else None
    if rows is None or not data_files(config, "data.train_files"):
        return
    cap = read_path(config, "data.train_max_samples")
    if isinstance(cap, int) and 0 < cap < rows:
        rows = cap
    check_batch_fits(config, rows)


def _check_resume(config: Any, settings: Any) -> None:
    """:func:`~verl_gdro.integration.resume_check.check_resume_folder`; an unreadable checkpoint is left to verl."""
    from verl_gdro.integration.resume_check import check_resume_folder

    try:
        check_resume_folder(config, settings)
    except ValueError:
        raise
    except Exception as e:  # a partial or foreign data.pt: verl reports it when it loads it
        logger.warning("verl-gdro: could not read the checkpoint to resume from before Ray: %s", e)


def install_driver_validation() -> None:
    """Wrap ``verl.utils.config.validate_config`` once."""
    import verl.utils.config as verl_config

    original = verl_config.validate_config
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def validate_config(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("config", args[0] if args else None)
        if config is not None and uses_gdro(config):
            check_launch_keys(config)
            settings = validate_gdro_config(config)
            check_data_files(config)
            if uses_gdro_trainer(config):
                _check_resume(config, settings)
            if runs_estimator_alone(config):
                from omegaconf import OmegaConf, open_dict

                # the estimator alone: the logged algorithm.gdro says what ran (it resolves to the same settings)
                settings = estimator_path_settings(config.algorithm)
                with open_dict(config):
                    config.algorithm.gdro = OmegaConf.create(honoured_group(settings))
                if settings.enable and settings.prompt.enable:
                    select_standalone_checkpoint(config)
        return original(*args, **kwargs)

    setattr(validate_config, _MARK, True)
    verl_config.validate_config = validate_config
