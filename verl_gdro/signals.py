"""Prompt-GDRO's loss signals l(x) (docs/algorithm.md, section 2), one small class each, registered by name.

A loss signal says what it measures and where: ``failure_rate`` from the outcomes alone (at the
driver, before verl's estimator), ``surrogate`` / ``surrogate_kl`` from the step's per-token arrays
(at the driver, after the estimator), ``update_surrogate`` inside the actor's PPO update (handed
to ``GDROController.after_update``). Each declares the ``gdro`` keys it reads; the controller asks
only :func:`get_loss_signal` and these attributes. numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.allocators.registry import T, lookup, registrar
from verl_gdro.prompt_gdro import failure_rate_loss, group_mean_from_sums, surrogate_kl_loss, surrogate_loss

__all__ = ["LOSS_SIGNAL_REGISTRY", "LossSignal", "get_loss_signal", "register_loss_signal", "update_time_signals"]

#: name -> loss signal class (``gdro.prompt.loss_signal``)
LOSS_SIGNAL_REGISTRY: dict[str, type[LossSignal]] = {}

_CLIP_KEYS = ("prompt.clip_ratio_low", "prompt.clip_ratio_high", "prompt.clip_ratio_c")


def register_loss_signal(name: str) -> Callable[[T], T]:
    """Class decorator: register a loss signal under ``name``."""
    return registrar(LOSS_SIGNAL_REGISTRY, name)


def get_loss_signal(name: str) -> type[LossSignal]:
    """The loss signal registered under ``name``."""
    return lookup(LOSS_SIGNAL_REGISTRY, "prompt.loss_signal", name)


def update_time_signals() -> tuple[str, ...]:
    """The names of the signals measured during the actor's update."""
    return tuple(n for n, c in LOSS_SIGNAL_REGISTRY.items() if c.measured_during_update)


class LossSignal:
    """A per-prompt loss signal: what it reads, what it needs per trajectory, where it is measured."""

    name: ClassVar[str] = ""
    #: the ``gdro`` keys it reads
    reads: ClassVar[tuple[str, ...]] = ("prompt.loss_signal",)
    #: per-trajectory arrays ``after_advantage`` must receive for it
    needs: ClassVar[tuple[str, ...]] = ()
    #: from the outcomes (``acc``) alone: computable before verl's estimator
    from_outcomes: ClassVar[bool] = False
    #: measured inside the actor's PPO update and handed over by ``after_update``
    measured_during_update: ClassVar[bool] = False

    @classmethod
    def driver_losses(cls, prompt: Any, g: NDArray[np.int64], num_groups: int, correct_sums: NDArray[np.float64],
                      trials: NDArray[np.int64], arrays: Mapping[str, ArrayLike | None]) -> NDArray[np.float64]:
        """l(x) per planned prompt at the driver (NaN: no trajectory, or measured elsewhere)."""
        return np.full(num_groups, np.nan)


@register_loss_signal("failure_rate")
class FailureRate(LossSignal):
    """1 - the prompt's success rate: the 0/1 loss of Group DRO's worst-group objective."""

    from_outcomes = True

    @classmethod
    def driver_losses(cls, prompt: Any, g: NDArray[np.int64], num_groups: int, correct_sums: NDArray[np.float64],
                      trials: NDArray[np.int64], arrays: Mapping[str, ArrayLike | None]) -> NDArray[np.float64]:
        return failure_rate_loss(group_mean_from_sums(correct_sums, trials))


class Surrogate(LossSignal):
    """Eq. 6 without the KL term: the clipped surrogate at the driver, on the step's arrays."""

    reads = ("prompt.loss_signal", *_CLIP_KEYS)
    needs = ("response_mask", "old_log_probs", "advantages")

    @classmethod
    def driver_losses(cls, prompt: Any, g: NDArray[np.int64], num_groups: int, correct_sums: NDArray[np.float64],
                      trials: NDArray[np.int64], arrays: Mapping[str, ArrayLike | None]) -> NDArray[np.float64]:
        missing = [name for name in cls.needs if arrays.get(name) is None]
        if missing:
            raise ValueError(f"gdro.prompt.loss_signal={cls.name} needs {missing} per trajectory (the reference "
                "policy's log-probs come from actor_rollout_ref.actor.use_kl_loss=true)")
        current = arrays["old_log_probs"] if arrays.get("log_probs") is None else arrays["log_probs"]
        losses = cls._measure(
            prompt, arrays, log_prob=current, old_log_prob=arrays["old_log_probs"], advantages=arrays["advantages"],
            response_mask=arrays["response_mask"], group_index=g, num_groups=num_groups,
            clip_ratio_low=prompt.clip_ratio_low, clip_ratio_high=prompt.clip_ratio_high, clip_ratio_c=prompt.clip_ratio_c,
        )
        return unmeasured_to_nan(losses, arrays["response_mask"], g, num_groups)

    @classmethod
    def _measure(cls, prompt: Any, arrays: Mapping[str, Any], **common: Any) -> NDArray[np.float64]:
        return surrogate_loss(**common)


@register_loss_signal("surrogate_kl")
class SurrogateKL(Surrogate):
    """Eq. 6: the clipped surrogate plus beta_KL times the low-variance KL to the reference policy."""

    reads = ("prompt.loss_signal", *_CLIP_KEYS, "prompt.kl_coef")
    needs = ("response_mask", "old_log_probs", "advantages", "ref_log_probs")

    @classmethod
    def _measure(cls, prompt: Any, arrays: Mapping[str, Any], **common: Any) -> NDArray[np.float64]:
        return surrogate_kl_loss(ref_log_prob=arrays["ref_log_probs"], kl_coef=prompt.kl_coef, **common)


register_loss_signal("surrogate")(Surrogate)  # registered after surrogate_kl: the documented order


@register_loss_signal("update_surrogate")
class UpdateSurrogate(LossSignal):
    """The clipped surrogate measured during the actor's PPO update (the release's quantity,
    verl_gdro/integration/policy_loss.py), with the actor's clip ratios."""

    reads = ("prompt.loss_signal", *_CLIP_KEYS)
    measured_during_update = True


def unmeasured_to_nan(losses: NDArray[np.float64], response_mask: Any, g: NDArray[np.int64],
                      num_groups: int) -> NDArray[np.float64]:
    """NaN for a prompt none of whose responses has a measured token (a group removed before the
    log-prob stage, handed over zero-masked): dropped and counted like a prompt without
    trajectories (section 2), never a loss of exactly 0."""
    mask = np.asarray(response_mask)
    # a real response's mask starts with a generated token, so only rows whose first entry is
    # 0 need the whole-row look (O(N) instead of another pass over [N, T])
    first_off = np.flatnonzero(mask[:, 0] == 0) if mask.ndim == 2 and mask.shape[1] else np.zeros(0, np.int64)
    if first_off.size:
        unmeasured = first_off[~mask[first_off].any(axis=1)]
        if unmeasured.size:
            measured = np.ones(mask.shape[0], dtype=bool)
            measured[unmeasured] = False
            has = np.bincount(g, weights=measured, minlength=num_groups) > 0
            losses = np.where(has, losses, np.nan)
    return losses
