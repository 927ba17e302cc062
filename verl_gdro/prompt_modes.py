"""Prompt-GDRO's modes (``gdro.prompt.mode``), one small class each, registered by name.

A mode scales the advantages by the bin multipliers (``reweight``, Eq. 16) or draws the step's
prompts (``resample`` by q_t over the bins, the others by a per-prompt priority; docs/algorithm.md,
"Prompt sampling modes"). Prompt-GDRO's learner (Eqs. 13-15) runs in every mode, so its keys are
always read; each mode adds its own. The controller, the sampler and the config resolver ask only
:func:`get_prompt_mode` and these attributes. numpy only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from verl_gdro import evidence as ev
from verl_gdro.allocators.registry import T, lookup, registrar

__all__ = ["PROMPT_MODE_REGISTRY", "PromptMode", "get_prompt_mode", "register_prompt_mode", "sampling_modes"]

#: name -> prompt mode class
PROMPT_MODE_REGISTRY: dict[str, type[PromptMode]] = {}

#: Prompt-GDRO's learner (Eqs. 13-15: the scores and q_t, logged in every mode)
LEARNER_KEYS = ("prompt.eta", "prompt.beta", "prompt.gamma", "prompt.score_clip", "prompt.normalize_by_share",
                "prompt.share_floor")
#: the per-prompt evidence and the exploration floor of every sampling mode
_DRAW_KEYS = ("prompt.explore", "prompt.rate_decay")


def register_prompt_mode(name: str) -> Callable[[T], T]:
    """Class decorator: register a prompt mode under ``name``."""
    return registrar(PROMPT_MODE_REGISTRY, name)


def get_prompt_mode(name: str) -> type[PromptMode]:
    """The prompt mode registered under ``name``."""
    return lookup(PROMPT_MODE_REGISTRY, "prompt.mode", name)


def sampling_modes() -> tuple[str, ...]:
    """The names of the modes that draw the prompts."""
    return tuple(n for n, c in PROMPT_MODE_REGISTRY.items() if c.draws_prompts)


class PromptMode:
    """How Prompt-GDRO acts on a step: advantage multipliers, or the prompts' draw."""

    name: ClassVar[str] = ""
    reads: ClassVar[tuple[str, ...]] = LEARNER_KEYS
    #: the multipliers of Eq. 16 scale the advantages (else they are exactly 1)
    scales_advantages: ClassVar[bool] = False
    #: the sampler draws the prompts (the GDRO trainer's sampler only)
    draws_prompts: ClassVar[bool] = False
    #: the draw weights the bins with q_t (else a priority per prompt from its evidence)
    draws_by_bin: ClassVar[bool] = False

    @classmethod
    def describe(cls, prompt: Any) -> str:
        """The mode's part of the mode line (``describe_mode``)."""
        return f"prompt: {cls.name}, loss {prompt.loss_signal}, eta {prompt.eta:g}, max_weight {prompt.max_weight:g}"

    @classmethod
    def priority(cls, prompt: Any, successes: np.ndarray, trials: np.ndarray, streak: np.ndarray, n: int) -> np.ndarray:
        """Each prompt's draw priority from its evidence (the per-prompt sampling modes)."""
        raise NotImplementedError(f"gdro.prompt.mode={cls.name} has no per-prompt priority")


@register_prompt_mode("reweight")
class Reweight(PromptMode):
    """Eq. 16: each trajectory's advantage times its bin's multiplier (the paper's mode)."""

    reads = (*LEARNER_KEYS, "prompt.max_weight", "prompt.weight_normalization", "prompt.min_ess", "prompt.mix_support")
    scales_advantages = True


@register_prompt_mode("resample")
class Resample(PromptMode):
    """Draw the prompts with q_t over the bins (under the reweighting's ESS floor and weight cap)."""

    reads = (*LEARNER_KEYS, "prompt.max_weight", "prompt.min_ess", *_DRAW_KEYS)
    draws_prompts = True
    draws_by_bin = True


class _PerPromptPriority(PromptMode):
    draws_prompts = True
    #: (label, settings field) of each value the mode line shows
    shown: ClassVar[tuple[tuple[str, str], ...]] = (("decay", "rate_decay"), ("explore", "explore"))

    @classmethod
    def describe(cls, prompt: Any) -> str:
        return f"prompt: {cls.name} sampling ({', '.join(f'{label} {getattr(prompt, f):g}' for label, f in cls.shown)})"


@register_prompt_mode("failure_weighted")
class FailureWeighted(_PerPromptPriority):
    """Priority (1 - p)(1 - p^n - (1 - p)^n): the ``failure_weighted`` utility at the mean budget."""

    reads = (*LEARNER_KEYS, *_DRAW_KEYS)

    @classmethod
    def priority(cls, prompt: Any, successes: np.ndarray, trials: np.ndarray, streak: np.ndarray, n: int) -> np.ndarray:
        return ev.failure_weighted_priority(ev.smoothed_rate(successes, trials), n)


@register_prompt_mode("greso")
class Greso(_PerPromptPriority):
    """GRESO: a prompt after z zero-variance visits in a row is kept with revisit^z."""

    reads = (*LEARNER_KEYS, *_DRAW_KEYS, "prompt.revisit")
    shown = (("revisit", "revisit"), ("explore", "explore"))

    @classmethod
    def priority(cls, prompt: Any, successes: np.ndarray, trials: np.ndarray, streak: np.ndarray, n: int) -> np.ndarray:
        return ev.greso_keep_probability(streak, prompt.revisit)


@register_prompt_mode("band")
class Band(_PerPromptPriority):
    """A Gaussian band around p = 1/2 of the decayed rate."""

    reads = (*LEARNER_KEYS, *_DRAW_KEYS, "prompt.band_width")
    shown = (("decay", "rate_decay"), ("width", "band_width"), ("explore", "explore"))

    @classmethod
    def priority(cls, prompt: Any, successes: np.ndarray, trials: np.ndarray, streak: np.ndarray, n: int) -> np.ndarray:
        return ev.band_priority(ev.smoothed_rate(successes, trials), prompt.band_width)


@register_prompt_mode("expected_informative")
class ExpectedInformative(_PerPromptPriority):
    """Priority 1 - p^n - (1 - p)^n: the chance that a group is not all equal, so DAPO's filter keeps it."""

    reads = (*LEARNER_KEYS, *_DRAW_KEYS)

    @classmethod
    def priority(cls, prompt: Any, successes: np.ndarray, trials: np.ndarray, streak: np.ndarray, n: int) -> np.ndarray:
        return ev.expected_informative_utility(ev.smoothed_rate(successes, trials), np.array([n]))[:, 0]
