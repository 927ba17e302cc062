"""The ``gdro`` keys the ``gdro_grpo`` estimator alone reads (docs/integration.md, "1. Estimator only"):
one declaration, :data:`ESTIMATOR_READS`; a key it does not read is refused, not ignored. The estimator,
the ``main_ppo`` driver check and the dry run all resolve through :func:`estimator_path_settings`. No
torch, no verl (the driver imports it before Ray starts).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from typing import Any

from verl_gdro.prompt_gdro import PromptGDRO
from verl_gdro.step.config import (
    ESTIMATOR_NAME,
    TRAINER_MODES,
    TRAINER_NAME,
    GDROSettings,
    default_gdro_group,
    estimator_settings,
    leaves,
    nest,
    read_key,
    read_path,
    to_plain,
)

__all__ = ["ESTIMATOR_READS", "ESTIMATOR_SIGNAL", "check_estimator_keys", "estimator_path_settings",
           "honoured_group", "read_key", "read_path", "runs_estimator_alone"]

#: The loss signal the estimator alone feeds Prompt-GDRO: the only one it can compute from rewards.
ESTIMATOR_SIGNAL = "failure_rate"

#: Every ``gdro`` key the estimator alone reads (dotted, relative to ``algorithm.gdro``); Prompt-GDRO's
#: are its constructor's arguments, so a new one is read here as soon as it exists.
ESTIMATOR_READS: tuple[str, ...] = (
    "enable",
    "preset",  # decides the null keys below (bins, score clip, ESS floor, mixture support)
    "correct_threshold",  # a response is correct when its outcome reward is above it
    "advantage_clip",
    "classifier.num_bins",  # each group binned by its own success rate this step
    "classifier.bin_edges",
    "prompt.enable",
    "prompt.mode",  # reweight only (the other modes are refused: only the GDRO trainer's sampler draws)
    *(f"prompt.{name}" for name in inspect.signature(PromptGDRO).parameters if name != "num_bins"),
    "rollout.enable",  # false only (Rollout-GDRO is refused: it chooses rollouts before generation)
)


@lru_cache(maxsize=1)
def _known_keys() -> frozenset[str]:
    """Every leaf key of the package YAML's ``gdro`` group (read once: the estimator checks every step)."""
    return frozenset(leaves(default_gdro_group()))


def check_estimator_keys(group: Any, prefix: str = "algorithm.gdro") -> None:
    """Refuse, naming it, every known ``gdro`` key in ``group`` that the estimator alone does not read
    (unknown keys are left to the resolution). A group with ``enable=false`` runs verl's ``grpo``:
    its keys are inert, as a switched-off section's are on the trainer path."""
    given = to_plain(group) or {}
    if not isinstance(given, Mapping) or given.get("enable", True) is False:
        return  # the resolution names a malformed group
    for key in leaves(given):
        if key not in ESTIMATOR_READS and key in _known_keys():
            raise ValueError(
                f"{prefix}.{key} is invalid for the {ESTIMATOR_NAME} estimator alone: it does not read it (no online "
                f"classifier, actor-side loss signal, sampler or Rollout-GDRO); the GDRO trainer does: remove it, "
                f"or set trainer.v1.trainer_mode={TRAINER_NAME} and gdro.{key} on the package config")


def estimator_path_settings(algorithm: Any) -> GDROSettings:
    """The settings the estimator alone runs with, from ``algorithm`` (verl's ``config=``): unread keys
    refused, the rest resolved by :func:`verl_gdro.step.config.estimator_settings`, the loss signal the
    one this path computes (whatever the preset names)."""
    check_estimator_keys(read_key(algorithm, "gdro"))
    settings = estimator_settings(algorithm)
    return replace(settings, prompt=replace(settings.prompt, loss_signal=ESTIMATOR_SIGNAL))


def honoured_group(settings: GDROSettings) -> dict[str, Any]:
    """The keys of :data:`ESTIMATOR_READS` with their resolved values, as a nested ``gdro`` group (what
    the logged config says ran; it resolves to the same settings again)."""
    full = leaves(settings.to_dict())
    return nest({key: full[key] for key in ESTIMATOR_READS})


def runs_estimator_alone(cfg: Any) -> bool:
    """True when a composed verl config runs ``gdro_grpo`` in a trainer of verl's own."""
    return (read_path(cfg, "algorithm.adv_estimator") == ESTIMATOR_NAME
            and read_path(cfg, "trainer.v1.trainer_mode") not in TRAINER_MODES)
