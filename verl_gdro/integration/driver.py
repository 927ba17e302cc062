"""Validate the ``gdro`` config in the ``main_ppo`` driver, before Ray starts.

The GDRO trainer validates its config at init (:func:`validate_gdro_config`), but verl constructs
the trainer inside the ``TaskRunner`` Ray actor: a bad key would only be reported after Ray, its
dashboard and the TaskRunner have started (about a minute on a small machine, longer on a busy
cluster head). verl 0.9.1's ``main_ppo.main`` calls ``verl.utils.config.validate_config(config=...)``
in the driver right before ``run_ppo`` starts Ray, and ``main_ppo`` imports that name only after
``import verl`` has loaded the ``verl.plugins`` entry points. So the plugin wraps
``verl.utils.config.validate_config``: the wrapper runs verl-gdro's validation first whenever the
run uses the GDRO trainer or the ``gdro_grpo`` estimator, then verl's own checks. Every other caller is unaffected.

The wrapper also refuses what would otherwise fail inside the TaskRunner: a local training or
validation file that does not exist, a training set smaller than one batch (:func:`check_data_files`),
``data.custom_cls.path`` without a class name or a non-integer ``seed`` (:func:`check_launch_keys`),
and, for the GDRO trainer, a checkpoint folder holding a run of other settings
(:mod:`verl_gdro.integration.resume_check`).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any

from verl_gdro.integration.estimator_keys import estimator_path_settings
from verl_gdro.step.config import ESTIMATOR_NAME, TRAINER_MODES, validate_gdro_config

__all__ = [
    "check_batch_fits",
    "check_data_files",
    "check_launch_keys",
    "install_driver_validation",
    "select_standalone_checkpoint",
    "uses_gdro",
    "uses_gdro_trainer",
]

logger = logging.getLogger(__name__)

_MARK = "_verl_gdro_driver_validation"


def uses_gdro_trainer(config: Any) -> bool:
    """True when the config selects a GDRO trainer mode (``gdro_sync``, ``gdro_colocate_async``,
    ``gdro_separate_async``; the trainer validates the rest)."""
    try:
        mode = config.trainer.v1.trainer_mode
    except Exception:  # not a PPO trainer config (or a partial one): nothing to validate here
        return False
    return mode in TRAINER_MODES


def uses_gdro(config: Any) -> bool:
    """True for the GDRO trainer, the ``gdro_grpo`` estimator alone (whose group checks, e.g.
    ``rollout.n >= 2`` or Rollout-GDRO without the trainer, also belong before Ray), or a config
    with a top-level ``gdro`` group (refused outside the GDRO trainer: nothing would read it)."""
    if uses_gdro_trainer(config):
        return True
    try:
        if config.get("gdro", None) is not None:
            return True
    except Exception:
        pass
    try:
        return config.algorithm.adv_estimator == ESTIMATOR_NAME
    except Exception:
        return False


def _log_resolved_estimator_group(config: Any, settings: Any) -> None:
    """The estimator alone: ``algorithm.gdro`` becomes the keys it reads with their resolved values
    (the preset's values instead of nulls, no key it does not read), so the config verl logs (e.g.
    wandb's run config) says what ran; the estimator resolves it to the same settings."""
    from omegaconf import OmegaConf, open_dict

    from verl_gdro.integration.estimator_keys import honoured_group

    with open_dict(config):
        config.algorithm.gdro = OmegaConf.create(honoured_group(settings))


def select_standalone_checkpoint(config: Any) -> str:
    """The estimator alone keeps Prompt-GDRO's state in the trainer process: have verl save it with
    its checkpoints through its one hook, ``trainer.checkpoint_callback_class``
    (:class:`verl_gdro.integration.checkpoint.StandaloneEstimatorCheckpoint`), when the run names no
    callback of its own. Returns what was done: ``selected``, ``kept`` (ours already), or
    ``warned`` (another callback, or the legacy trainer, which has no such hook)."""
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
    logger.warning(
        "verl-gdro: the gdro_grpo estimator's Prompt-GDRO state is not saved with this run's checkpoints (%s): a "
        "resumed run restarts it. Use trainer.checkpoint_callback_class=%s (or a subclass of it) on the V1 trainer",
        f"trainer.checkpoint_callback_class={current}" if current else "trainer.use_v1=false has no checkpoint hook",
        CALLBACK_CLASS,
    )
    return "warned"


#: a URI verl copies or streams from elsewhere (``hdfs://``, ``s3://``, ``gs://``, ...): not checked here
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _files(config: Any, key: str) -> list[str]:
    node = _get(config, key)
    if node is None:
        return []
    return [node] if isinstance(node, str) else [str(f) for f in node]


def check_launch_keys(config: Any) -> None:
    """verl keys a verl-gdro launch reads whose mistakes verl reports late or under another name:

    - ``data.custom_cls.path`` without ``data.custom_cls.name``: verl's ``get_dataset_class`` fails
      in the TaskRunner with ``TypeError: attribute name must be string``;
    - the recipes' top-level ``seed`` (data order, vLLM sampling and ``gdro.rollout.seed`` interpolate
      it): not an integer, the error would name ``gdro.rollout.seed``.
    """
    custom = _get(config, "data.custom_cls")
    if custom is not None and custom.get("path", None) and not custom.get("name", None):
        raise ValueError(
            f"data.custom_cls.name={custom.get('name', None)!r} is invalid with data.custom_cls.path="
            f"{custom.get('path')}: name the dataset class in that file (e.g. data.custom_cls.name=GDRODataset)"
        )
    try:
        seed = config.get("seed", None) if "seed" in config else None
    except Exception:
        return
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(
            f"seed={seed!r} is invalid: must be an integer >= 0 (it seeds the data order, vLLM sampling and "
            "gdro.rollout.seed)"
        )


def _get(config: Any, path: str) -> Any:
    node = config
    for part in path.split("."):
        try:
            node = node.get(part, None)
        except Exception:
            return None
        if node is None:
            return None
    return node


def check_batch_fits(config: Any, train_rows: int) -> None:
    """Refuse a training set that does not fill one batch (after ``data.train_max_samples``): verl's
    loader drops the incomplete last batch, so an epoch has 0 steps and ``fit`` divides by it."""
    bs = int(config.data.train_batch_size)
    if train_rows < bs:
        raise ValueError(
            f"data.train_files has {train_rows} rows, fewer than data.train_batch_size={bs}: verl drops the incomplete "
            "last batch, so an epoch would have 0 steps; use more training rows or a smaller data.train_batch_size"
        )


def check_data_files(config: Any) -> None:
    """Before Ray: every local ``data.train_files`` / ``data.val_files`` path exists (remote URIs apart),
    and the local training parquet files hold at least one batch. Raises ValueError naming the key."""
    rows: int | None = 0
    for key in ("data.train_files", "data.val_files"):
        for f in _files(config, key):
            if _REMOTE.match(f):
                rows = None if key == "data.train_files" else rows
                continue
            path = os.path.expanduser(f)
            if not os.path.isfile(path):
                raise ValueError(
                    f"{key}={f} does not exist on this machine ({os.path.abspath(path)}); give an existing local "
                    "file or a remote URI (hdfs://, s3://, gs://)"
                )
            if key == "data.train_files" and rows is not None:
                rows = rows + _parquet_rows(path) if path.endswith(".parquet") else None
    if rows is None or not _files(config, "data.train_files"):
        return
    try:
        cap = config.data.get("train_max_samples", -1)
    except Exception:
        cap = -1
    if isinstance(cap, int) and 0 < cap < rows:
        rows = cap
    check_batch_fits(config, rows)


def _parquet_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return int(pq.read_metadata(path).num_rows)


def _check_resume(config: Any, settings: Any) -> None:
    """:func:`verl_gdro.integration.resume_check.check_resume_folder`; a checkpoint this check cannot
    read (not a refusal) is left to verl, with a warning."""
    from verl_gdro.integration.resume_check import check_resume_folder

    try:
        check_resume_folder(config, settings)
    except ValueError:
        raise
    except Exception as e:  # a partial or foreign data.pt: verl reports it when it loads it
        logger.warning("verl-gdro: could not read the checkpoint to resume from before Ray: %s", e)


def install_driver_validation() -> bool:
    """Wrap ``verl.utils.config.validate_config`` once; returns True when the wrapper is in place."""
    import verl.utils.config as verl_config

    original = verl_config.validate_config
    if getattr(original, _MARK, False):
        return True

    @functools.wraps(original)
    def validate_config(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("config", args[0] if args else None)
        if config is not None and uses_gdro(config):
            check_launch_keys(config)
            settings = validate_gdro_config(config)
            check_data_files(config)
            if uses_gdro_trainer(config):
                _check_resume(config, settings)
            if not uses_gdro_trainer(config) and config.algorithm.get("adv_estimator") == ESTIMATOR_NAME:
                settings = estimator_path_settings(config.algorithm)
                _log_resolved_estimator_group(config, settings)
                if settings.enable and settings.prompt.enable:
                    select_standalone_checkpoint(config)
        return original(*args, **kwargs)

    setattr(validate_config, _MARK, True)
    verl_config.validate_config = validate_config
    return True
