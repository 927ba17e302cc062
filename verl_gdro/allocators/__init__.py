"""Rollout-GDRO's allocators: one small class per allocator, registered by name (numpy only).

- :mod:`~verl_gdro.allocators.registry`: :func:`register_allocator` / :func:`get_allocator`, the
  table the controller, the config resolver and the dry run read;
- :mod:`~verl_gdro.allocators.protocol`: what the controller asks of an allocator
  (:class:`RolloutAllocator`) and hands it after a step (:class:`ObservedStep`);
- :mod:`~verl_gdro.allocators.base`: the per-bin family's shared configuration and state
  (:class:`RolloutGDRO`);
- the built-ins, one module each: ``bandit`` (:mod:`.bandit`), ``neyman`` (:mod:`.neyman`),
  ``per_prompt`` (:mod:`.per_prompt`), ``release_as_run`` (:mod:`.release_as_run`).

The math they share (the exact-budget DP and sampler, the partition, the shadow price, the
paper's equations) stays in :mod:`verl_gdro.rollout_gdro` as plain functions.
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
