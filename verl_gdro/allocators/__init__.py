"""Rollout-GDRO's allocators: one small class per allocator, registered by name (numpy only).

:mod:`.registry` (:func:`register_allocator` / :func:`get_allocator`), :mod:`.protocol` (what the
controller asks of an allocator and hands it after a step), :mod:`.base` (the per-bin family's shared
configuration and state) and one module per built-in; the math they share is in :mod:`verl_gdro.rollout_gdro`.
"""

from __future__ import annotations

from verl_gdro.allocators.bandit import BinBandit
from verl_gdro.allocators.base import RolloutGDRO
from verl_gdro.allocators.neyman import Neyman
from verl_gdro.allocators.per_prompt import PerPrompt
from verl_gdro.allocators.protocol import Observation, ObservedStep, RolloutAllocator
from verl_gdro.allocators.registry import (
    ALLOCATOR_REGISTRY,
    allocator_names,
    get_allocator,
    register_allocator,
)
from verl_gdro.allocators.release_as_run import ReleaseAsRunAllocator

#: the built-in allocators of the learner family (:class:`RolloutGDRO`: one config and state layout)
LEARNER_ALLOCATORS: tuple[str, ...] = tuple(n for n, c in ALLOCATOR_REGISTRY.items() if issubclass(c, RolloutGDRO))

__all__ = [
    "ALLOCATOR_REGISTRY", "LEARNER_ALLOCATORS", "BinBandit", "Neyman", "Observation", "ObservedStep", "PerPrompt",
    "ReleaseAsRunAllocator", "RolloutAllocator", "RolloutGDRO", "allocator_names", "get_allocator", "register_allocator"
]
