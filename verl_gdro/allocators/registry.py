"""The registry of Rollout-GDRO allocators, shaped like verl's estimator registry in ``core_algos``:
``@register_allocator("name")`` on the class, :func:`get_allocator` by name. The controller, the config
resolver and the dry run only go through this table (docs/integration.md, "Add your own allocator").
Import-free: every floor may read it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ALLOCATOR_REGISTRY", "allocator_names", "get_allocator", "register_allocator"]

#: name -> allocator class (the built-ins register when :mod:`verl_gdro.allocators` is imported)
ALLOCATOR_REGISTRY: dict[str, type[Any]] = {}

T = TypeVar("T", bound=type)


def register_allocator(name: str) -> Callable[[T], T]:
    """Class decorator: register the allocator under ``name`` (its ``gdro.rollout.allocator`` value)."""

    def decorate(cls: T) -> T:
        existing = ALLOCATOR_REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"allocator {name!r} is already registered ({existing.__qualname__})")
        cls.name = name  # type: ignore[attr-defined]
        ALLOCATOR_REGISTRY[name] = cls
        return cls

    return decorate


def allocator_names() -> tuple[str, ...]:
    """The registered names, in registration order (the built-ins first)."""
    return tuple(ALLOCATOR_REGISTRY)


def get_allocator(name: str) -> type[Any]:
    """The allocator class registered under ``name``."""
    cls = ALLOCATOR_REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"gdro.rollout.allocator={name!r} is invalid: allowed values are {list(ALLOCATOR_REGISTRY)}")
    return cls
