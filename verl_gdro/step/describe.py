"""The mode line a run prints at start, and the checks a saved controller state passes on load.

Both read the strategies' own declarations (``describe`` of the prompt mode and the allocator), so
neither names a strategy. numpy-free, verl-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_gdro.allocators import get_allocator
from verl_gdro.prompt_modes import get_prompt_mode
from verl_gdro.step.config import GDROSettings

__all__ = ["STATE_VERSION", "check_saved_state", "describe_mode", "dict_diff", "mode_name", "upgrade_saved_settings"]

#: the version of ``GDROController.state_dict``
STATE_VERSION = 1

#: gdro.prompt keys added with the sampling modes (filled in when loading an older state)
_SAMPLING_KEYS = ("explore", "rate_decay", "revisit", "band_width")


def mode_name(settings: GDROSettings) -> str:
    """Which adversaries run: ``GRPO``, ``Prompt-GDRO``, ``Rollout-GDRO`` or ``joint``."""
    prompt = settings.enable and settings.prompt.enable
    rollout = settings.enable and settings.rollout.enable
    if prompt and rollout:
        return "joint"
    return "Prompt-GDRO" if prompt else "Rollout-GDRO" if rollout else "GRPO"


def describe_mode(settings: GDROSettings, rollout_n: int | None = None) -> str:
    """One line naming the run's mode, preset and key settings, for the log at start: both adversaries
    are on by default (joint mode, the measured best), so a user who switches one off still runs the
    other; the line makes the choice visible before the first step and says how to get the others."""
    mode = mode_name(settings)
    if not settings.enable:
        return "verl-gdro mode: GRPO (gdro.enable=false: no classifier, no adversaries, no gdro/ metrics)"
    c, p, r = settings.classifier, settings.prompt, settings.rollout
    parts = [f"verl-gdro mode: {mode}"]
    if mode == "joint":
        parts[0] += (
            " (Prompt-GDRO + Rollout-GDRO, the default: gdro.prompt.enable=false for Rollout-GDRO alone, "
            "gdro.rollout.enable=false for Prompt-GDRO alone)"
        )
    elif mode == "GRPO":
        parts[0] += " (both adversaries off: classifier and gdro/ metrics only)"
    parts.append(f"preset {settings.preset}")
    if p.enable:
        parts.append(get_prompt_mode(p.mode).describe(p))
    if r.enable:
        budget = "" if rollout_n is None else f", mean n {int(rollout_n)}"
        parts.append(f"rollout: {get_allocator(r.allocator).describe(r)}, n {r.n_min}..{r.n_max}{budget}")
    elif rollout_n is not None:
        parts.append(f"n {int(rollout_n)} per prompt")
    parts.append(f"classifier: {c.num_bins} bins, window {c.window}, pass@{c.k}")
    if settings.advantage_clip is not None:
        parts.append(f"advantage_clip {settings.advantage_clip:g}")
    return " | ".join(parts)


def upgrade_saved_settings(saved: Any, current: Mapping[str, Any]) -> Any:
    """The saved ``settings`` of an older controller state, with the keys added since filled in
    with the values that describe what such a run did."""
    if not isinstance(saved, Mapping):
        return saved
    # Saved before gdro.advantage_clip existed (verl-gdro 0.1.0 pre-release), which meant no clip.
    saved = {"advantage_clip": None, **saved}
    if isinstance(saved.get("prompt"), Mapping):
        # Saved before the sampling modes' keys existed: they only act in a sampling mode, which such a
        # run could not use, so the current values describe it; before gdro.prompt.mix_support: Eq. 15
        # over all bins.
        new_keys = {k: v for k, v in current["prompt"].items() if k in _SAMPLING_KEYS}
        saved["prompt"] = {**new_keys, "mix_support": "all", **saved["prompt"]}
    return saved


def check_saved_state(state: Any, settings: Mapping[str, Any], rollout_n: int, built: Mapping[str, bool]) -> None:
    """Refuse a controller state of another version, other gdro settings, another ``rollout.n``,
    or other controllers built (``built``: name -> whether this run has it)."""
    if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not a GDROController state of version {STATE_VERSION}")
    saved = upgrade_saved_settings(state.get("settings"), settings)
    if saved != settings:
        raise ValueError("GDROController state was saved under different gdro settings ("
            f"{dict_diff(saved or {}, settings)}); resume with the same gdro.* config")
    if int(state["rollout_n"]) != rollout_n:
        raise ValueError(f"GDROController state was saved with actor_rollout_ref.rollout.n={state['rollout_n']}, "
            f"this run has {rollout_n}")
    for name, has in built.items():
        if has != (state.get(name) is not None):
            raise ValueError(f"GDROController state: {name} presence differs from this configuration")


def dict_diff(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "gdro") -> str:
    """``prefix.key: saved X vs configured Y`` for every differing leaf."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            sub = dict_diff(va, vb, f"{prefix}.{key}")
            if sub:
                out.append(sub)
        elif va != vb:
            out.append(f"{prefix}.{key}: saved {va!r} vs configured {vb!r}")
    return ", ".join(out)
