"""verl-gdro: Multi-Adversary Group DRO for LLM reasoning RL (arXiv 2601.19280) on verl 0.9.1.

Floors, each importing only those below (docs/development.md, ``tests/test_layering.py``): the
numpy math (classifier, prompt_gdro, rollout_gdro, metrics, presets), the step API
(:mod:`verl_gdro.step`, no verl or torch), the verl glue (:mod:`verl_gdro.integration`), the tools.
The names of :data:`__all__` load on first use (PEP 562): verl's plugin entry point imports this
package on every ``import verl``, so ``import verl_gdro`` imports nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_gdro.step.config import GDROSettings, resolve_gdro, validate_gdro_config
    from verl_gdro.step.context import gdro_step
    from verl_gdro.step.controller import GDROController, StepPlan, describe_mode

try:  # one source of the version: pyproject.toml, through the installed metadata
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("verl-gdro")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

#: public name -> the step-API module that defines it
_STEP_API = {name: f"verl_gdro.step.{module}" for module, names in (
    ("controller", ("GDROController", "StepPlan", "describe_mode")),
    ("config", ("GDROSettings", "resolve_gdro", "validate_gdro_config")),
    ("context", ("gdro_step",)),
    ("sampler", ("PromptSampler",)),
) for name in names}

__all__ = ["GDROController", "GDROSettings", "PromptSampler", "StepPlan", "__version__", "describe_mode",
           "gdro_step", "resolve_gdro", "validate_gdro_config"]


def __getattr__(name: str) -> Any:
    """Load a step-API name on first access, so that ``import verl_gdro`` stays free."""
    module = _STEP_API.get(name)
    if module is None:
        raise AttributeError(f"module 'verl_gdro' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_STEP_API})
