"""The registry of Rollout-GDRO allocators, shaped like verl's estimator registry in ``core_algos``:
``@register_allocator("name")`` on the class, :func:`get_allocator` by name. The controller, the config
resolver and the dry run only go through this table (docs/integration.md, "Add your own allocator").
Import-free: every floor may read it; :func:`registrar` and :func:`lookup` serve the prompt modes'
and loss signals' registries of the same shape too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ALLOCATOR_REGISTRY", "allocator_names", "get_allocator", "lookup", "register_allocator", "registrar"]

#: name -> allocator class (the built-ins register when :mod:`verl_gdro.allocators` is imported)
ALLOCATOR_REGISTRY: dict[str, type[Any]] = {}

T = TypeVar("T", bound=type)


def registrar(table: dict[str, Any], name: str, kind: str | None = None) -> Callable[[T], T]:
    """Class decorator: set ``cls.name`` and enter ``cls`` in ``table``; with ``kind``, another class
    under a taken name is refused."""

    def decorate(cls: T) -> T:
        existing = table.get(name)
        if kind is not None and existing is not None and existing is not cls:
            raise ValueError(f"{kind} {name!r} is already registered ({existing.__qualname__})")
        cls.name = name  # type: ignore[attr-defined]
        table[name] = cls
        return cls

    return decorate


def lookup(table: dict[str, Any], key: str, name: str) -> Any:
    """The class registered under ``name`` in ``table``; an unknown name is refused naming ``gdro.<key>``."""
    cls = table.get(name)
    if cls is None:
        raise ValueError(f"gdro.{key}={name!r} is invalid: allowed values are {list(table)}")
    return cls


def register_allocator(name: str) -> Callable[[T], T]:
    """Class decorator: register the allocator under ``name`` (its ``gdro.rollout.allocator`` value)."""
    return registrar(ALLOCATOR_REGISTRY, name, "allocator")


def allocator_names() -> tuple[str, ...]:
    """The registered names, in registration order (the built-ins first)."""
    return tuple(ALLOCATOR_REGISTRY)


def get_allocator(name: str) -> type[Any]:
    """The allocator class registered under ``name``."""
    return lookup(ALLOCATOR_REGISTRY, "rollout.allocator", name)
