"""The ``gdro`` config group: resolution (YAML defaults, presets), validation, cross-checks with verl's keys.

Importable without verl, Ray or torch, so a launch mistake surfaces in a second. Every error is a
``ValueError`` starting with the offending key (``gdro.rollout.n_min=1 is invalid: ...``), each listed
in docs/configuration.md.
"""

from __future__ import annotations

import copy
import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from verl_gdro.allocators import RolloutGDRO, allocator_names, get_allocator
from verl_gdro.classifier import OnlineDifficultyClassifier
from verl_gdro.presets import MIX_SUPPORTS, PRESETS, resolve_preset
from verl_gdro.prompt_gdro import PromptGDRO
from verl_gdro.prompt_modes import PROMPT_MODE_REGISTRY, get_prompt_mode, sampling_modes
from verl_gdro.rollout_gdro import ARM_UTILITIES, PER_PROMPT_UTILITIES, SELECTIONS
from verl_gdro.signals import LOSS_SIGNAL_REGISTRY, get_loss_signal

#: the registered allocators (verl_gdro/allocators/)
ALLOCATORS = allocator_names()

__all__ = [
    "ALLOCATORS", "ARM_UTILITIES", "ESTIMATOR_NAME", "PASSK_ESTIMATORS", "PROMPT_MODES", "SAMPLING_MODES",
    "ROW_INDEX_FIELD", "SELECTIONS", "TRAINER_MODES", "TRAINER_NAME", "UID_KEYS", "WEIGHT_NORMALIZATIONS",
    "ClassifierSettings", "GDROSettings", "PromptSettings", "RolloutSettings", "default_gdro_group",
    "estimator_settings", "keys_read", "leaves", "nest", "read_key", "read_path", "resolve_gdro", "to_plain",
    "validate_gdro_config",
]

ESTIMATOR_NAME = "gdro_grpo"
TRAINER_NAME = "gdro_sync"
#: Every GDRO trainer mode -> the verl V1 trainer mode it extends (verl_gdro/integration/trainer.py).
TRAINER_MODES: dict[str, str] = {
    TRAINER_NAME: "sync", "gdro_colocate_async": "colocate_async", "gdro_separate_async": "separate_async"
}

# `index`: verl's RLHFDataset's prompt column from `extra_info.index` (0 when missing: the trainer validates
# it). `row_index`: the dataset row position the GDRO dataset class (`data.custom_cls`) adds as ROW_INDEX_FIELD.
UID_KEYS = ("index", "row_index")
ROW_INDEX_FIELD = "gdro_row_index"

PASSK_ESTIMATORS = ("pooled", "any_of_n")
#: Prompt-GDRO modes that draw the prompts (the sampler), the bin-level one and the per-prompt ones
SAMPLING_MODES = sampling_modes()
PROMPT_MODES = tuple(PROMPT_MODE_REGISTRY)
WEIGHT_NORMALIZATIONS = ("mean_one", "raw")

# Same bound as PromptGDRO: exp(eta * score_clip) must stay finite in float64.
_MAX_EXPONENT = 600.0


def _constructor_kwargs(cls: type, settings: object, **given: Any) -> dict[str, Any]:
    """``cls``'s constructor arguments: ``given``, else the settings' field of that name (an argument added
    without its config key fails here instead of taking its default)."""
    params = list(inspect.signature(cls.__init__).parameters)[1:]  # __init__'s, past self (__new__ may be generic)
    return {name: given[name] if name in given else getattr(settings, name) for name in params}


# ---- resolved settings ----


@dataclass(frozen=True)
class ClassifierSettings:
    """``gdro.classifier.*`` resolved: ``num_bins`` is derived from ``bin_edges`` when given."""

    num_bins: int
    bin_edges: tuple[float, ...] | None
    window: int
    hysteresis: float
    k: int
    passk_estimator: str
    unseen_bin: int

    def inner_edges(self) -> tuple[float, ...]:
        """The B-1 inner edges actually used (the uniform ones when none are given)."""
        if self.bin_edges is not None:
            return self.bin_edges
        return tuple(i / self.num_bins for i in range(1, self.num_bins))

    def kwargs(self) -> dict[str, Any]:
        """Constructor arguments of :class:`verl_gdro.classifier.OnlineDifficultyClassifier`."""
        edges = None if self.bin_edges is None else list(self.bin_edges)
        return _constructor_kwargs(OnlineDifficultyClassifier, self, bin_edges=edges, estimator=self.passk_estimator)


@dataclass(frozen=True)
class PromptSettings:
    """``gdro.prompt.*`` resolved (``loss_signal`` filled in from the preset)."""

    enable: bool
    mode: str
    loss_signal: str
    eta: float
    beta: float
    gamma: float
    max_weight: float
    #: Eq. 14's clip of S; inf = no clip (the release)
    score_clip: float
    normalize_by_share: bool
    share_floor: float | None
    weight_normalization: str
    min_ess: float
    kl_coef: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    #: the sampling modes' keys (docs/algorithm.md, "Prompt sampling modes")
    explore: float
    rate_decay: float
    revisit: float
    band_width: float
    #: Eq. 15's exploration mixture over ``all`` B bins or the bins ``present`` in the step (the release)
    mix_support: str = "all"

    def kwargs(self, num_bins: int) -> dict[str, Any]:
        """Constructor arguments of :class:`verl_gdro.prompt_gdro.PromptGDRO`."""
        return _constructor_kwargs(PromptGDRO, self, num_bins=num_bins)


@dataclass(frozen=True)
class RolloutSettings:
    """``gdro.rollout.*`` resolved (``arm_utility`` / ``selection`` filled in from the preset)."""

    enable: bool
    n_min: int
    n_max: int
    eta: float
    gamma: float
    score_ema: float
    dual_lr: float
    allocator: str
    arm_utility: str
    selection: str
    seed: int
    #: per-visit decay of the per_prompt allocator's evidence; None = the classifier's window
    rate_decay: float | None = None

    def kwargs(self, num_bins: int, n_mean: int) -> dict[str, Any]:
        """Constructor arguments of :class:`RolloutGDRO` (``n_mean``: verl's ``rollout.n``, the mean budget)."""
        return _constructor_kwargs(RolloutGDRO, self, num_bins=num_bins, n_mean=n_mean)


@dataclass(frozen=True)
class GDROSettings:
    """The whole ``gdro`` group, resolved and validated. Frozen: safe to share and to compare."""

    enable: bool
    preset: str
    uid_key: str
    acc_key: str
    classifier: ClassifierSettings
    prompt: PromptSettings
    rollout: RolloutSettings
    advantage_clip: float | None = None
    #: a response is correct when its correctness value (or the estimator's outcome reward) is above this
    correct_threshold: float = 0.0

    @property
    def num_bins(self) -> int:
        return self.classifier.num_bins

    @property
    def reweights(self) -> bool:
        """Whether Prompt-GDRO scales advantages (on, and in ``reweight`` mode)."""
        return self.enable and self.prompt.enable and get_prompt_mode(self.prompt.mode).scales_advantages

    @property
    def resamples(self) -> bool:
        """Whether the sampler draws the prompts (a sampling ``mode``: q_t or a per-prompt priority)."""
        return self.enable and self.prompt.enable and get_prompt_mode(self.prompt.mode).draws_prompts

    @property
    def allocates(self) -> bool:
        """Whether Rollout-GDRO chooses the rollouts per prompt."""
        return self.enable and self.rollout.enable

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (for state dicts and logs)."""
        d = asdict(self)
        if d["classifier"]["bin_edges"] is not None:
            d["classifier"]["bin_edges"] = list(d["classifier"]["bin_edges"])
        return d


# ---- helpers ----


def to_plain(cfg: Any) -> Any:
    """A DictConfig/ListConfig (resolved) or mapping as plain Python containers (omegaconf is imported
    only for its own containers)."""
    if type(cfg).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(cfg, resolve=True)
    if isinstance(cfg, Mapping):
        return {k: to_plain(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_plain(v) for v in cfg]
    return cfg


@lru_cache(maxsize=1)
def _yaml_defaults() -> dict[str, Any]:
    from omegaconf import OmegaConf

    text = resources.files("verl_gdro.config").joinpath("gdro_trainer.yaml").read_text(encoding="utf-8")
    group = OmegaConf.to_container(OmegaConf.create(text)["gdro"], resolve=True)
    assert isinstance(group, dict)
    return group


def default_gdro_group() -> dict[str, Any]:
    """The ``gdro`` group's defaults, read from the package YAML (the one source of defaults)."""
    return copy.deepcopy(_yaml_defaults())


def _merge(defaults: dict[str, Any], given: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Overlay ``given`` on ``defaults``; an unknown key is an error (a typo would be silently ignored)."""
    out = dict(defaults)
    for key, value in given.items():
        name = f"{prefix}.{key}"
        if key not in defaults:
            raise ValueError(f"{name} is not a known key; known keys of {prefix}: {sorted(defaults)}")
        if isinstance(defaults[key], dict):
            value = {} if value is None else value
            if not isinstance(value, Mapping):
                raise ValueError(f"{name} must be a group of keys ({sorted(defaults[key])}), got {value!r}")
            value = _merge(defaults[key], value, name)
        out[key] = value
    return out


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r} is invalid: must be true or false")
    return value


def _int(key: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    ok_type = isinstance(value, int) and not isinstance(value, bool)
    if not ok_type and hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu":
        ok_type, value = True, int(value)
    if not ok_type or (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{key}={value!r} is invalid: must be an integer {_range_text(low, high, False, False)}".rstrip())
    return int(value)


def _range_text(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high}"
    return ""


def _float(key: str, value: Any, low: float | None = None, high: float | None = None, low_open: bool = False,
           high_open: bool = False) -> float:
    rng = _range_text(low, high, low_open, high_open)
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise ValueError(f"{key}={value!r} is invalid: must be a number {rng}".rstrip())
    v = float(value)
    above = low is None or (v > low if low_open else v >= low)
    if not (math.isfinite(v) and above and (high is None or (v < high if high_open else v <= high))):
        raise ValueError(f"{key}={value!r} is invalid: must be a finite number {rng}".rstrip())
    return v


def _choice(key: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)  # a registry is read when the key is checked
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is invalid: allowed values are {list(allowed)}")
    return str(value)


#: the ranges the keys share: > 0, (0, 1], [0, 1)
_POSITIVE, _UNIT_OPEN_LOW, _UNIT_OPEN_HIGH = (0.0, None, True), (0.0, 1.0, True), (0.0, 1.0, False, True)

#: Per section, the keys checked alone: ``(key, check, *range)`` in the order they are checked, after
#: the section's keys that are checked together (a config with two errors names the same one first).
_ALONE: dict[str, tuple[tuple[Any, ...], ...]] = {
    "classifier": (("window", _int, 1), ("k", _int, 1), ("passk_estimator", _choice, PASSK_ESTIMATORS)),
    "prompt": (
        ("enable", _bool), ("mode", _choice, PROMPT_MODE_REGISTRY), ("loss_signal", _choice, LOSS_SIGNAL_REGISTRY),
        ("beta", _float, *_UNIT_OPEN_LOW), ("gamma", _float, *_UNIT_OPEN_HIGH), ("max_weight", _float, *_POSITIVE),
        ("normalize_by_share", _bool), ("kl_coef", _float, 0.0), ("clip_ratio_c", _float, 1.0, None, True),
        *((key, _float, *_UNIT_OPEN_LOW) for key in ("explore", "rate_decay", "revisit")),
        ("band_width", _float, *_POSITIVE),
    ),
    "rollout": (("enable", _bool), ("eta", _float, *_POSITIVE), ("gamma", _float, *_UNIT_OPEN_HIGH),
                ("score_ema", _float, *_UNIT_OPEN_LOW), ("dual_lr", _float, 0.0), ("selection", _choice, SELECTIONS),
                ("seed", _int, 0)),
}


def _alone(section: str, c: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``_ALONE[section]`` in ``c``, checked."""
    return {key: check(f"gdro.{section}.{key}", c[key], *args) for key, check, *args in _ALONE[section]}


# ---- the gdro group alone ----


def _resolve_classifier(c: dict[str, Any]) -> ClassifierSettings:
    p = "gdro.classifier"
    edges_raw = c["bin_edges"]
    num_bins_raw = c["num_bins"]
    if edges_raw is not None:
        if not isinstance(edges_raw, (list, tuple)) or len(edges_raw) == 0:
            raise ValueError(f"{p}.bin_edges={edges_raw!r} is invalid: must be null or a non-empty list of inner edges "
                "strictly increasing inside (0, 1)")
        edges = tuple(_float(f"{p}.bin_edges[{i}]", e, 0.0, 1.0, True, True) for i, e in enumerate(edges_raw))
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"{p}.bin_edges={list(edges)} is invalid: inner edges must be strictly increasing")
        derived = len(edges) + 1
        if num_bins_raw is not None and num_bins_raw != derived:
            raise ValueError(f"{p}.num_bins={num_bins_raw!r} disagrees with {p}.bin_edges: {len(edges)} inner edges "
                f"give {derived} bins; set {p}.num_bins={derived} or null")
        num_bins = derived
    else:
        if num_bins_raw is None:
            raise ValueError(f"{p}.num_bins=None is invalid: give num_bins, or bin_edges to derive it from")
        num_bins = _int(f"{p}.num_bins", num_bins_raw, low=1)
        edges = None
    full = (0.0, *(edges or (i / num_bins for i in range(1, num_bins))), 1.0)
    narrowest = min(b - a for a, b in zip(full, full[1:]))
    hysteresis = _float(f"{p}.hysteresis", c["hysteresis"], low=0.0)
    if hysteresis >= narrowest:
        raise ValueError(f"{p}.hysteresis={c['hysteresis']!r} is invalid: must be >= 0 and smaller than the narrowest "
            f"bin ({narrowest:.6g}), or a prompt could never leave its bin")
    return ClassifierSettings(**_alone("classifier", c), num_bins=num_bins, bin_edges=edges, hysteresis=hysteresis,
                              unseen_bin=_int(f"{p}.unseen_bin", c["unseen_bin"], low=0, high=num_bins - 1))


#: The loss signals' coefficients when no actor config gives them (the step API, the CPU demo):
#: the paper's (Appendix A). Under verl, ``null`` follows the actor (:data:`ACTOR_SIGNAL_KEYS`).
SIGNAL_DEFAULTS: dict[str, float] = {"kl_coef": 0.001, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                     "clip_ratio_c": 3.0}
#: gdro.prompt key -> the actor key it must equal: the signal measures what the actor optimises.
ACTOR_SIGNAL_KEYS: dict[str, str] = {
    "kl_coef": "actor_rollout_ref.actor.kl_loss_coef", "clip_ratio_low": "actor_rollout_ref.actor.clip_ratio_low",
    "clip_ratio_high": "actor_rollout_ref.actor.clip_ratio_high", "clip_ratio_c": "actor_rollout_ref.actor.clip_ratio_c"
}


def _resolve_prompt(c: dict[str, Any]) -> PromptSettings:
    p = "gdro.prompt"
    c = {**c, **{k: default if c[k] is None else c[k] for k, default in SIGNAL_DEFAULTS.items()}}
    eta = _float(f"{p}.eta", c["eta"], *_POSITIVE)
    raw_clip = c["score_clip"]
    if isinstance(raw_clip, (int, float)) and not isinstance(raw_clip, bool) and math.isinf(raw_clip) and raw_clip > 0:
        score_clip = math.inf  # no clip (the release): exp is taken of eta * (S - max S)
    else:
        score_clip = _float(f"{p}.score_clip", raw_clip, *_POSITIVE)
    if math.isfinite(score_clip) and eta * score_clip > _MAX_EXPONENT:
        raise ValueError(f"{p}.eta={c['eta']!r} is invalid with {p}.score_clip={c['score_clip']!r}: eta * score_clip "
            f"must be <= {_MAX_EXPONENT} so that exp(eta * S) stays finite")
    floor = c["share_floor"]
    share_floor = None if floor is None else _float(f"{p}.share_floor", floor, *_UNIT_OPEN_LOW)
    min_ess = _float(f"{p}.min_ess", c["min_ess"], *_UNIT_OPEN_HIGH)
    weight_normalization = _choice(f"{p}.weight_normalization", c["weight_normalization"], WEIGHT_NORMALIZATIONS)
    if min_ess > 0 and weight_normalization != "mean_one":
        raise ValueError(f"{p}.min_ess={min_ess} is invalid with {p}.weight_normalization={weight_normalization!r}: "
            "the effective-sample-size floor acts on mean_one multipliers")
    mix_support = _choice(f"{p}.mix_support", c["mix_support"], MIX_SUPPORTS)
    if (math.isinf(score_clip) or mix_support == "present") and (min_ess > 0 or weight_normalization != "mean_one"):
        raise ValueError(f"{p}.score_clip={score_clip} / {p}.mix_support={mix_support} (the release's multipliers) is "
            f"invalid with {p}.min_ess={min_ess} / {p}.weight_normalization={weight_normalization!r}: without a clip "
            "omega is only known up to a common factor, and the present-bins mixture is defined for mean_one "
            "multipliers without an ESS floor only")
    low = _float(f"{p}.clip_ratio_low", c["clip_ratio_low"], *_UNIT_OPEN_HIGH)
    high = _float(f"{p}.clip_ratio_high", c["clip_ratio_high"], 0.0)
    return PromptSettings(**_alone("prompt", c), eta=eta, score_clip=score_clip, share_floor=share_floor,
                          weight_normalization=weight_normalization, min_ess=min_ess, clip_ratio_low=low,
                          clip_ratio_high=high, mix_support=mix_support)


def _resolve_rollout(c: dict[str, Any]) -> RolloutSettings:
    p = "gdro.rollout"
    n_min = _int(f"{p}.n_min", c["n_min"])
    if n_min < 2:
        raise ValueError(f"{p}.n_min={n_min} is invalid: must be >= 2 (one rollout gives a GRPO group no baseline: its "
            "advantage would be its raw reward)")
    n_max = _int(f"{p}.n_max", c["n_max"])
    if n_max < n_min:
        raise ValueError(f"{p}.n_max={n_max} is invalid: must be >= {p}.n_min={n_min}")
    # unknown names first, so that they get the plain "allowed values" message
    allocator = _choice(f"{p}.allocator", c["allocator"], allocator_names())
    arm_utility = _choice(f"{p}.arm_utility", c["arm_utility"], ARM_UTILITIES)
    cls = get_allocator(allocator)
    per_prompt = getattr(cls, "per_prompt_evidence", False)
    if per_prompt and arm_utility not in PER_PROMPT_UTILITIES:
        raise ValueError(f"{p}.arm_utility={arm_utility!r} is invalid with {p}.allocator=per_prompt: allowed "
            f"{list(PER_PROMPT_UTILITIES)} (the allocator needs u(p, n) for every n)")
    if arm_utility == "hit" and not per_prompt:
        raise ValueError(f"{p}.arm_utility='hit' is invalid with {p}.allocator={c['allocator']!r}: HORA's hit utility "
            f"needs each prompt's own counts, set {p}.allocator=per_prompt")
    rate_decay = c["rate_decay"]
    if rate_decay is not None:
        rate_decay = _float(f"{p}.rate_decay", rate_decay, *_UNIT_OPEN_LOW)
        if "rollout.rate_decay" not in cls.reads:
            raise ValueError(f"{p}.rate_decay={rate_decay} is invalid with {p}.allocator={c['allocator']!r}: it "
                f"decays the per_prompt allocator's evidence; set {p}.allocator=per_prompt or leave it null")
    return RolloutSettings(**_alone("rollout", c), n_min=n_min, n_max=n_max, allocator=allocator,
                           arm_utility=arm_utility, rate_decay=rate_decay)


def resolve_gdro(group: Any = None, standalone: bool = False) -> GDROSettings:
    """Resolve and validate the ``gdro`` group (a mapping, a DictConfig, settings, or None for defaults):
    YAML defaults, ``null`` keys from the preset, every key checked. Left ``null``, ``rollout.enable`` and
    ``prompt.mode`` take the path's default: on and the preset's mode, or ``false`` and ``reweight`` for
    the estimator alone (``standalone``)."""
    if isinstance(group, GDROSettings):
        return group
    given = to_plain(group) or {}
    if not isinstance(given, Mapping):
        raise ValueError(f"gdro must be a group of keys, got {given!r}")
    c = _merge(default_gdro_group(), given, "gdro")
    preset = c["preset"]
    if preset not in PRESETS:
        raise ValueError(f"gdro.preset={preset!r} is invalid: allowed values are {sorted(PRESETS)}")
    if c["rollout"]["enable"] is None:
        c["rollout"]["enable"] = not standalone
    if standalone and c["prompt"]["mode"] is None:
        c["prompt"]["mode"] = "reweight"
    # null keys that the preset decides take the preset's value (explicit values win)
    for section, keys in resolve_preset(preset).items():
        if section == "classifier" and (c["classifier"]["num_bins"] is not None or c["classifier"]["bin_edges"] is not None):
            # the bins are one choice: a user who gives num_bins or bin_edges chooses both
            keys = {k: v for k, v in keys.items() if k not in ("num_bins", "bin_edges")}
        for key, value in keys.items():
            if c[section][key] is None:
                if (section, key) == ("prompt", "min_ess") and c["prompt"]["weight_normalization"] != "mean_one":
                    value = 0.0  # the floor acts on mean_one multipliers; raw weights keep the preset's other choices
                if (section, key) == ("rollout", "rate_decay") and not _reads_rate_decay(c[section]["allocator"]):
                    value = None  # the decay is the per_prompt allocator's; a per-bin one keeps the other choices
                c[section][key] = value
    uid_key = _choice("gdro.uid_key", c["uid_key"], UID_KEYS)
    acc_key = c["acc_key"]
    if not isinstance(acc_key, str) or not acc_key:
        raise ValueError(f"gdro.acc_key={acc_key!r} is invalid: must be the non-empty name of the reward's correctness key")
    classifier = _resolve_classifier(c["classifier"])
    clip = c["advantage_clip"]
    advantage_clip = None if clip is None else _float("gdro.advantage_clip", clip, *_POSITIVE)
    settings = GDROSettings(
        enable=_bool("gdro.enable", c["enable"]), preset=str(preset), uid_key=uid_key, acc_key=acc_key,
        classifier=classifier, prompt=_resolve_prompt(c["prompt"]), rollout=_resolve_rollout(c["rollout"]),
        advantage_clip=advantage_clip,
        correct_threshold=_float("gdro.correct_threshold", c["correct_threshold"])
    )
    for key, value in unread_keys(given, settings, standalone).items():
        raise ValueError(_unread_message(key, value, settings))  # the first, naming it
    return settings


def _reads_rate_decay(allocator: Any) -> bool:
    return allocator in allocator_names() and "rollout.rate_decay" in get_allocator(allocator).reads


# ---- what a resolved configuration reads: derived from the strategies' declarations ----

#: keys every enabled configuration reads (the switches, the run's identity, the classifier)
_ALWAYS_READ = ("enable", "preset", "uid_key", "acc_key", "correct_threshold", "advantage_clip", "prompt.enable",
                "rollout.enable", *(f"classifier.{f.name}" for f in fields(ClassifierSettings)))


#: strategy keys accepted whatever the strategy: the run's seed (a sweep sets it for every method alike)
RUN_KEYS = ("rollout.seed",)


def keys_read(settings: GDROSettings) -> frozenset[str]:
    """The ``gdro`` keys (dotted: ``rollout.eta``) the controller reads under ``settings``: the active
    strategies' ``reads`` (the loss signal's when Prompt-GDRO is on or the allocator logs it)."""
    if not settings.enable:
        return frozenset({"enable"})
    keys = set(_ALWAYS_READ)
    p, r = settings.prompt, settings.rollout
    if p.enable:
        keys.update(get_prompt_mode(p.mode).reads, ("prompt.mode",))
    if r.enable:
        keys.update(get_allocator(r.allocator).reads, ("rollout.allocator",))
    if p.enable or (r.enable and getattr(get_allocator(r.allocator), "logs_loss_signal", False)):
        keys.update(get_loss_signal(p.loss_signal).reads)
    return frozenset(keys)


def leaves(given: Any, prefix: str = "") -> dict[str, Any]:
    """The leaf values of a nested group by dotted key (an empty group has none)."""
    out: dict[str, Any] = {}
    for key, value in given.items() if isinstance(given, Mapping) else ():
        out.update(leaves(value, f"{prefix}{key}.") if isinstance(value, Mapping) else {f"{prefix}{key}": value})
    return out


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested group of dotted keys (the inverse of :func:`leaves`)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def unread_keys(given: Any, settings: GDROSettings, standalone: bool = False) -> dict[str, Any]:
    """The strategy keys (``prompt.*`` / ``rollout.*``) ``given`` sets to a value other than the one it
    resolves to without it, and no active strategy reads (:func:`keys_read`). A switched-off section's
    keys are left alone; the coefficients that follow the actor are :func:`validate_gdro_config`'s."""
    if not settings.enable or not isinstance(given, Mapping):
        return {}
    read = keys_read(settings)
    defaults = leaves(default_gdro_group())
    candidates = {
        key: value for key, value in leaves(given).items()
        if key.split(".")[0] in ("prompt", "rollout") and key.count(".") == 1 and key not in read
        and value != defaults.get(key)
        and getattr(settings, key.split(".")[0]).enable and key.split(".")[1] not in ACTOR_SIGNAL_KEYS
        and key not in RUN_KEYS
    }
    if not candidates:
        return {}
    others = {k: v for k, v in leaves(given).items() if k not in candidates}
    baseline = resolve_gdro(nest(others), standalone=standalone).to_dict()
    return {k: v for k, v in candidates.items() if v != baseline[k.split(".")[0]][k.split(".")[1]]}


def _unread_message(key: str, value: Any, settings: GDROSettings) -> str:
    owner = (f"gdro.prompt.mode={settings.prompt.mode} with loss_signal={settings.prompt.loss_signal}"
             if key.startswith("prompt.") else f"gdro.rollout.allocator={settings.rollout.allocator}")
    return (f"gdro.{key}={value!r} is set but nothing reads it under {owner}: remove it (the keys each strategy "
            "reads are listed in docs/configuration.md)")


def read_key(config: Any, key: str, default: Any = None) -> Any:
    """``config.get(key, default)`` of a mapping, DictConfig or verl's config dataclass (an attribute)."""
    if config is None:
        return default
    try:
        return config.get(key, default)
    except (AttributeError, TypeError):
        return getattr(config, key, default)


_GDRO_KEY = re.compile(r"(?<![\w.])gdro(?=[.= ])")


def estimator_settings(algorithm: Any) -> GDROSettings:
    """The ``gdro_grpo`` estimator alone's settings: ``algorithm.gdro`` resolved with the standalone defaults,
    errors naming ``algorithm.gdro.<key>`` (the estimator and :func:`validate_gdro_config` both call it)."""
    try:
        return resolve_gdro(read_key(algorithm, "gdro"), standalone=True)
    except ValueError as e:
        raise ValueError(_GDRO_KEY.sub("algorithm.gdro", str(e))) from None


# ---- the gdro group against the rest of the verl config ----

def read_path(cfg: Any, path: str, default: Any = None) -> Any:
    """The value at a dotted ``path`` of a config, or ``default`` where it is missing or does not resolve."""
    node = cfg
    for part in path.split("."):
        try:
            if not (isinstance(node, Mapping) or hasattr(node, "keys")) or part not in node:
                return default
            node = node[part]
        except Exception:  # an interpolation that cannot resolve, a missing value (???)
            return default
    return node


def validate_gdro_config(cfg: Any) -> GDROSettings:
    """Validate a whole verl config (DictConfig or nested dict) that uses verl-gdro; return the settings.
    One namespace per path (:func:`_path_settings`), then the settings against the rest of the config."""
    trainer_mode = read_path(cfg, "trainer.v1.trainer_mode")
    settings = _path_settings(cfg, trainer_mode)
    if trainer_mode in TRAINER_MODES:
        _check_trainer(cfg, trainer_mode, settings)
    _check_budget(cfg, trainer_mode, settings)
    return _check_strategies(cfg, trainer_mode, settings)


def _path_settings(cfg: Any, trainer_mode: Any) -> GDROSettings:
    """The settings of the path's own namespace: ``gdro`` under the GDRO trainer (an ``algorithm.gdro`` that
    differs is refused), ``algorithm.gdro`` for the estimator alone (a top-level ``gdro`` is refused)."""
    gdro_trainer = trainer_mode in TRAINER_MODES
    top = read_path(cfg, "gdro")
    algo_group = read_path(cfg, "algorithm.gdro")
    if gdro_trainer:
        if top is None and algo_group is not None:
            raise ValueError(f"algorithm.gdro is invalid with trainer.v1.trainer_mode={trainer_mode}: the GDRO "
                "trainer reads the top-level gdro group (and hands it to the estimator); set +gdro.<key>=... instead")
        differs = algo_group is not None and to_plain(top) != to_plain(algo_group)
        if differs and resolve_gdro(top) != resolve_gdro(algo_group):
            raise ValueError("algorithm.gdro disagrees with gdro: the GDRO trainer reads gdro and hands it to the "
                "estimator; set only gdro.* (the package config mirrors it into algorithm.gdro) or make them equal")
        return resolve_gdro(top)
    else:
        if top is not None:
            raise ValueError(f"gdro is invalid with trainer.v1.trainer_mode={trainer_mode!r}: the top-level gdro "
                f"group is read only by the GDRO trainer ({'|'.join(TRAINER_MODES)}); the {ESTIMATOR_NAME} estimator "
                "in verl's own trainer reads algorithm.gdro: set +algorithm.gdro.<key>=... on verl's ppo_trainer "
                f"config instead, or set trainer.v1.trainer_mode={TRAINER_NAME}")
        adv = read_path(cfg, "algorithm.adv_estimator")
        if algo_group is not None and adv != ESTIMATOR_NAME:
            raise ValueError(f"algorithm.gdro is invalid with algorithm.adv_estimator={adv}: only the {ESTIMATOR_NAME} "
                f"estimator reads it, so nothing would; set algorithm.adv_estimator={ESTIMATOR_NAME}, or remove "
                "algorithm.gdro")
        return estimator_settings(read_path(cfg, "algorithm"))


def _check_trainer(cfg: Any, trainer_mode: str, settings: GDROSettings) -> None:
    """The GDRO trainer against verl's trainer keys (estimator, V1, loader workers, sync step, sampler, cache)."""
    on = settings.enable
    checks: tuple[tuple[str, Any, Callable[[Any], bool], str], ...] = (
        ("algorithm.adv_estimator", None, lambda v: v != ESTIMATOR_NAME, "the GDRO trainer applies Prompt-GDRO "
         f"through the '{ESTIMATOR_NAME}' estimator; set algorithm.adv_estimator={ESTIMATOR_NAME}"),
        ("trainer.use_v1", True, lambda v: v is not True, "the GDRO trainer is a V1 trainer; set trainer.use_v1=true"),
        ("data.dataloader_num_workers", 0, lambda v: v != 0,
         "must be 0, or the adaptive sampler's draws run batches ahead of the controller updates"),
        (f"trainer.v1.{TRAINER_MODES[trainer_mode]}.parameter_sync_step", 1, lambda v: v != 1,
         "must be 1 (one generation batch, one advantage stage and one controller update per step)"),
        ("trainer.v1.sampler.custom_sampler.path", None, lambda v: bool(v) and on, "the GDRO trainer installs its "
         "own replay buffer to observe every generated group, including those verl filters, evicts or discards; "
         "remove the custom sampler"),
        ("skip.rollout_tq.enable", False, lambda v: bool(v) and on, "verl's rollout cache replays trajectories GDRO "
         "did not plan (no dispatch-time bin or rollout count); set skip.rollout_tq.enable=false, or gdro.enable=false"),
    )
    for key, default, refused, why in checks:
        value = read_path(cfg, key, default)
        if refused(value):
            raise ValueError(f"{key}={value!r} is invalid with trainer.v1.trainer_mode={trainer_mode}: {why}")


def _check_budget(cfg: Any, trainer_mode: Any, settings: GDROSettings) -> None:
    """verl's ``rollout.n``: a group (>= 2) and, under Rollout-GDRO, a mean budget within its arms."""
    gdro_trainer = trainer_mode in TRAINER_MODES
    adv = read_path(cfg, "algorithm.adv_estimator")
    n = read_path(cfg, "actor_rollout_ref.rollout.n")
    if (gdro_trainer or adv == ESTIMATOR_NAME) and (not isinstance(n, int) or isinstance(n, bool) or n < 2):
        raise ValueError(f"actor_rollout_ref.rollout.n={n!r} is invalid with algorithm.adv_estimator={adv}: must "
            "be an integer >= 2 (GRPO needs a group; with Rollout-GDRO it is the mean budget per prompt)")
    if settings.allocates:
        r = settings.rollout
        if not gdro_trainer:
            raise ValueError("algorithm.gdro.rollout.enable=True is invalid with trainer.v1.trainer_mode="
                f"{trainer_mode!r}: Rollout-GDRO chooses rollouts before generation, which only the GDRO trainer "
                f"does; set trainer.v1.trainer_mode={TRAINER_NAME}")
        if isinstance(n, int) and not (r.n_min <= n <= r.n_max):
            raise ValueError(f"actor_rollout_ref.rollout.n={n} is invalid: the mean budget must lie in "
                f"[gdro.rollout.n_min={r.n_min}, gdro.rollout.n_max={r.n_max}], or the exact budget "
                "batch_size * n cannot be met")


def _check_strategies(cfg: Any, trainer_mode: Any, settings: GDROSettings) -> GDROSettings:
    """What the strategies need from the path and the rest of the config; returns the settings with the
    signals' coefficients taken from the actor."""
    if trainer_mode not in TRAINER_MODES:
        if settings.resamples:
            raise ValueError(f"algorithm.gdro.prompt.mode={settings.prompt.mode} is invalid with trainer.v1."
                f"trainer_mode={trainer_mode!r}: only the GDRO trainer's sampler can draw the prompts; set "
                f"trainer.v1.trainer_mode={TRAINER_NAME} or algorithm.gdro.prompt.mode=reweight")
        return settings  # the loss signals and the row index are the GDRO trainer's only
    needs_ref = "ref_log_probs" in get_loss_signal(settings.prompt.loss_signal).needs
    has_ref = read_path(cfg, "actor_rollout_ref.actor.use_kl_loss") or read_path(cfg, "algorithm.use_kl_in_reward")
    if settings.enable and settings.prompt.enable and needs_ref and not has_ref:
        raise ValueError(f"gdro.prompt.loss_signal={settings.prompt.loss_signal} is invalid without a reference "
            "policy: it needs ref_log_prob; set actor_rollout_ref.actor.use_kl_loss=true (the paper's KL loss) or "
            "choose gdro.prompt.loss_signal=failure_rate")
    settings = _signals_follow_actor(cfg, settings, read_path(cfg, "gdro"))
    if settings.enable and settings.uid_key == "row_index" and not read_path(cfg, "data.custom_cls.path"):
        raise ValueError("gdro.uid_key=row_index is invalid without data.custom_cls: the row index comes from the "
            "GDRO dataset class; set data.custom_cls.path=pkg://verl_gdro.integration.dataset "
            "data.custom_cls.name=GDRODataset, or use gdro.uid_key=index")
    return settings


def _actor_value(cfg: Any, key: str) -> float | None:
    """The actor's value for a signal key (verl's own fallbacks: clip_ratio_low/high null -> clip_ratio;
    the KL coefficient of the KL the actor optimises: its KL loss, else the in-reward KL's)."""
    actor = "actor_rollout_ref.actor"
    if key in ("clip_ratio_low", "clip_ratio_high"):
        value = read_path(cfg, f"{actor}.{key}")
        return read_path(cfg, f"{actor}.clip_ratio") if value is None else value
    if key == "kl_coef":
        in_reward = read_path(cfg, "algorithm.use_kl_in_reward") and not read_path(cfg, f"{actor}.use_kl_loss")
        return read_path(cfg, "algorithm.kl_ctrl.kl_coef" if in_reward else f"{actor}.kl_loss_coef")
    return read_path(cfg, f"{actor}.{key}")


def _signals_follow_actor(cfg: Any, settings: GDROSettings, group: Any) -> GDROSettings:
    """The loss signals' kl_coef and clip ratios taken from the actor (docs/algorithm.md, section 2: the
    signal must measure what the actor optimises). A ``null`` key follows the actor; an explicit value
    that differs is refused when the signal reads it."""
    given = leaves(to_plain(group))
    follow: dict[str, float] = {}
    for key, actor_key in ACTOR_SIGNAL_KEYS.items():
        actor = _actor_value(cfg, key)
        if isinstance(actor, bool) or not isinstance(actor, (int, float)):
            continue  # no actor config (a bare gdro group): the step API's defaults stand
        explicit = given.get(f"prompt.{key}")
        if explicit is None:
            follow[key] = float(actor)
        elif float(explicit) == float(actor):
            continue
        elif settings.enable and settings.prompt.enable and f"prompt.{key}" not in keys_read(settings):
            raise ValueError(_unread_message(f"prompt.{key}", explicit, settings))
        elif f"prompt.{key}" in get_loss_signal(settings.prompt.loss_signal).reads:
            raise ValueError(f"gdro.prompt.{key}={explicit!r} disagrees with {actor_key}={actor!r}: the loss signal "
                f"({settings.prompt.loss_signal}) must measure what the actor optimises; leave gdro.prompt.{key} "
                "unset (it follows the actor) or make them equal")
    if not follow:
        return settings
    checked = {k: _float(f"{ACTOR_SIGNAL_KEYS[k]}", v, low=0.0) for k, v in follow.items()}
    return replace(settings, prompt=replace(settings.prompt, **checked))
