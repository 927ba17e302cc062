"""The ``gdro`` keys the ``gdro_grpo`` estimator alone reads: one declaration, and its refusals.

The estimator alone (``algorithm.adv_estimator=gdro_grpo`` in a trainer of verl's own, keys under
``algorithm.gdro``) bins each group by its own outcome reward this step and reweights with
Prompt-GDRO (the module docstring of :mod:`verl_gdro.integration.estimator`). It has no online
classifier (window, k, hysteresis, pass@k), no actor-side loss signal (it sees no log-probs: the
signal is the failure rate), no sampler and no Rollout-GDRO, and it groups by verl's ``uid``, not a
stable prompt id. A key it does not read would be accepted and then ignored, so it is refused
(docs/integration.md, "The estimator alone"). The estimator at run time, the ``main_ppo`` driver
check and the dry run all resolve the group through :func:`estimator_path_settings`, and the dry
run prints :func:`honoured_group`: all three derive from :data:`ESTIMATOR_READS`.

No torch, no verl: the driver imports it before Ray starts.
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
    TRAINER_NAME,
    GDROSettings,
    default_gdro_group,
    estimator_settings,
    to_plain,
)

__all__ = [
    "ESTIMATOR_READS",
    "ESTIMATOR_SIGNAL",
    "check_estimator_keys",
    "estimator_path_settings",
    "honoured_group",
    "runs_estimator_alone",
]

#: The loss signal the estimator alone feeds Prompt-GDRO: the only one it can compute from rewards.
ESTIMATOR_SIGNAL = "failure_rate"

#: Every ``gdro`` key the estimator alone reads (dotted, relative to ``algorithm.gdro``). Prompt-GDRO's
#: keys are its controller's constructor arguments, read from the signature, so a new argument is
#: read here as soon as it exists.
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


def _leaves(group: Mapping[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in group.items():
        name = f"{prefix}{key}"
        out += _leaves(value, f"{name}.") if isinstance(value, Mapping) and value else [name]
    return out


@lru_cache(maxsize=1)
def _known_keys() -> frozenset[str]:
    """Every leaf key of the package YAML's ``gdro`` group (read once: the estimator checks every step)."""
    return frozenset(_leaves(default_gdro_group()))


def _known(key: str) -> bool:
    return key in _known_keys()


def check_estimator_keys(group: Any, prefix: str = "algorithm.gdro") -> None:
    """Refuse every known ``gdro`` key in ``group`` that the estimator alone does not read, naming
    it. Unknown keys are left to the resolution (which lists the known ones). A group switched off
    (``enable=false``: verl's ``grpo``, e.g. the GDRO trainer's mirror with GDRO off) reads nothing
    and runs nothing, so its keys are inert, as a switched-off section's are on the trainer path."""
    given = to_plain(group) or {}
    if not isinstance(given, Mapping):
        return  # the resolution names the malformed group
    if given.get("enable", True) is False:
        return
    for key in _leaves(given):
        if key in ESTIMATOR_READS or not _known(key):
            continue
        raise ValueError(
            f"{prefix}.{key} is invalid for the {ESTIMATOR_NAME} estimator alone: it does not read it (no online "
            f"classifier, actor-side loss signal, sampler or Rollout-GDRO); the GDRO trainer does: remove it, or "
            f"set trainer.v1.trainer_mode={TRAINER_NAME} and gdro.{key} on the package config"
        )


def _group_of(algorithm: Any) -> Any:
    if algorithm is None:
        return None
    try:
        return algorithm.get("gdro", None)
    except (AttributeError, TypeError):
        return getattr(algorithm, "gdro", None)


def estimator_path_settings(algorithm: Any) -> GDROSettings:
    """The settings the estimator alone runs with, from ``algorithm`` (the group verl hands an
    estimator as ``config=``): unread keys refused, the rest resolved as
    :func:`verl_gdro.step.config.estimator_settings` does, and the loss signal the one this path
    computes (whatever the preset names: the paper's surrogate_kl needs the GDRO trainer)."""
    check_estimator_keys(_group_of(algorithm))
    settings = estimator_settings(algorithm)
    return replace(settings, prompt=replace(settings.prompt, loss_signal=ESTIMATOR_SIGNAL))


def honoured_group(settings: GDROSettings) -> dict[str, Any]:
    """The keys of :data:`ESTIMATOR_READS` with their resolved values, as a nested ``gdro`` group:
    what the run's logged config says ran, and what resolves to the same settings again."""
    full = settings.to_dict()
    out: dict[str, Any] = {}
    for key in ESTIMATOR_READS:
        *parents, leaf = key.split(".")
        src, dst = full, out
        for part in parents:
            src, dst = src[part], dst.setdefault(part, {})
        dst[leaf] = src[leaf]
    return out


def _get(cfg: Any, path: str) -> Any:
    node = cfg
    for part in path.split("."):
        try:
            node = node.get(part, None)
        except Exception:  # not a mapping, or an interpolation that does not resolve
            return None
        if node is None:
            return None
    return node


def runs_estimator_alone(cfg: Any) -> bool:
    """True when a composed verl config runs ``gdro_grpo`` in a trainer of verl's own."""
    from verl_gdro.step.config import TRAINER_MODES

    return _get(cfg, "algorithm.adv_estimator") == ESTIMATOR_NAME and _get(cfg, "trainer.v1.trainer_mode") not in TRAINER_MODES
