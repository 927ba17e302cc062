"""Every knob of the CPU demo in one place, visible at the top (the single-file-RL style).

Two sizes: the default (the README's ``verl-gdro demo``, <= 10 minutes on a 2-core machine) and
``--quick`` (CI, <= 2 minutes). Both use the spec's GRPO settings where they apply: temperature
1.0, mean budget n = 4 with arms 2..12, clip 0.2 / 0.28, low-variance KL 0.001 against the frozen
warm start, 8 evaluation samples per problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = [
    "DEFAULT_METHODS",
    "DYNAMIC_KEYS",
    "DynamicSampling",
    "METHODS",
    "METHOD_KEYS",
    "UNHONOURED_KEYS",
    "QUICK_METHODS",
    "DemoConfig",
    "gdro_override",
    "method_gdro_group",
    "method_steps",
    "method_study_keys",
    "parse_method",
]

#: method -> (preset, Prompt-GDRO on, Rollout-GDRO on). ``grpo`` keeps the classifier and the
#: metrics on (adversaries off) so its curriculum plots are the baseline of the GDRO ones.
METHODS: dict[str, tuple[str, bool, bool]] = {
    "grpo": ("robust", False, False),
    "prompt_gdro": ("robust", True, False),
    "rollout_gdro": ("robust", False, True),
    "prompt_gdro_paper": ("paper", True, False),
    "rollout_gdro_paper": ("paper", False, True),
    "joint": ("robust", True, True),
    "joint_paper": ("paper", True, True),
    "prompt_gdro_release": ("release", True, False),
    "rollout_gdro_release": ("release", False, True),
}
#: GRPO, each adversary alone and the default (joint: the data adversary chooses prompts, the
#: compute adversary allocates rollouts per prompt)
DEFAULT_METHODS = ("grpo", "prompt_gdro", "rollout_gdro", "joint")
QUICK_METHODS = ("grpo", "rollout_gdro", "joint")


#: ``gdro`` keys that define a method; ``--gdro`` may not change them (pick another method instead).
METHOD_KEYS = ("enable", "preset", "prompt.enable", "rollout.enable", "rollout.seed")
#: ``gdro`` keys the demo and the study have nothing to apply to (refused rather than ignored): the
#: demo's prompts carry their own stable ids and its reward its own correctness, and it never runs
#: the standalone estimator.
UNHONOURED_KEYS: dict[str, str] = {
    "uid_key": "the demo's prompts carry their own stable ids",
    "acc_key": "the demo's reward reports correctness itself",
    "correct_threshold": "the demo's reward reports binary correctness itself",
}

#: the settings of the filter, as ``--set`` keys (all methods) or a variant's own keys (one arm)
DYNAMIC_KEYS = ("dynamic_sampling", "filter_metric", "max_num_gen_batches", "gen_batch_size")
#: the reward fields the filter may read (``algorithm.filter_groups.metric``): the study's scorer
#: returns verl's math_dapo ``acc`` and its +-1 ``score``
FILTER_METRICS = ("acc", "score")


@dataclass(frozen=True)
class DynamicSampling:
    """One run's filter settings (verl's names; ``enable`` = ``algorithm.filter_groups.enable``)."""

    enable: bool = False
    metric: str = "acc"
    max_num_gen_batches: int = 0  # 0: no limit (verl's default)
    gen_batch_size: int = 0  # prompts per generation call; 0: verl 0.9.1's V1 refills (refill_size)

    @classmethod
    def from_settings(cls, base: Mapping[str, Any], own: Mapping[str, Any] | None = None) -> DynamicSampling:
        """From ``DemoConfig`` fields (``base``), then a method's own keys (``own`` win)."""
        merged = {k: base[k] for k in DYNAMIC_KEYS if k in base}
        merged.update(own or {})
        ds = cls(
            enable=_flag(merged.get("dynamic_sampling", False)),
            metric=str(merged.get("filter_metric", "acc")),
            max_num_gen_batches=_count(merged.get("max_num_gen_batches", 0), "max_num_gen_batches"),
            gen_batch_size=_count(merged.get("gen_batch_size", 0), "gen_batch_size"),
        )
        if ds.metric not in FILTER_METRICS:
            raise ValueError(f"filter_metric={ds.metric!r}: allowed {list(FILTER_METRICS)} (the scorer's fields)")
        return ds

    def call_size(self, train_batch: int) -> int:
        """Prompts of a step's first generation call."""
        return self.gen_batch_size if self.enable and self.gen_batch_size > 0 else train_batch

    def refill_size(self, train_batch: int, kept: int, filtered: int, credit: int) -> tuple[int, int]:
        """(prompts of the next call, credit carried) after a call that dropped ``filtered`` groups.

        ``gen_batch_size > 0``: the DAPO recipe's fixed calls. 0: verl 0.9.1's V1 sync replay
        buffer (``ReplayBuffer.sample``): every dropped group earns a credit of two prompts, and a
        call dispatches the credit up to ``train_batch`` prompts in flight
        (``max_inflight_gen_batches=1``); the rest carries to the next call.
        """
        if self.gen_batch_size > 0:
            return self.gen_batch_size, 0
        credit += 2 * filtered
        size = min(credit, train_batch) or train_batch - kept  # never 0 while the batch is short
        return size, max(0, credit - size)

    def done(self, kept: int, calls: int, train_batch: int) -> bool:
        """Whether the step stops generating: filter off, the batch is full, or the bound is hit."""
        if not self.enable or kept >= train_batch:
            return True
        return self.max_num_gen_batches > 0 and calls >= self.max_num_gen_batches


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        low = value.strip().lower()
        if low not in ("true", "false", "1", "0"):
            raise ValueError(f"dynamic_sampling={value!r}: expected true or false")
        return low in ("true", "1")
    return bool(value)


def _count(value: Any, name: str) -> int:
    try:
        ok = not isinstance(value, bool) and int(value) == float(value) and int(value) >= 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name}={value!r}: expected an integer >= 0")
    return int(value)


def gdro_override(item: str) -> tuple[str, Any] | None:
    """``(dotted key under gdro, YAML value)`` of one ``key=value`` item (a leading ``gdro.`` is
    dropped), or None when it is not ``key=value``: the one parser of ``--gdro`` and of a variant's
    keys, so both read values the same way. Callers name their own flag in the error."""
    import yaml

    key, sep, value = item.partition("=")
    key = key.strip().removeprefix("gdro.")
    if not sep or not key:
        return None
    return key, yaml.safe_load(value)


def parse_method(spec: str) -> tuple[str, str, tuple[tuple[str, Any], ...]]:
    """``(label, method, overrides)`` of a ``--methods`` entry.

    A plain method name is its own label. A variant ``LABEL=METHOD:key=value,key=value`` is an
    ablation arm: METHOD's group with those ``gdro.*`` keys set (values parsed as YAML), reported
    under LABEL, e.g. ``pg_ess=prompt_gdro:prompt.min_ess=0.5,classifier.k=1``.
    """
    if "=" not in spec.split(":", 1)[0]:
        if ":" in spec:
            raise ValueError(f"--methods {spec!r}: a variant needs a label, LABEL=METHOD:key=value,...")
        return spec, spec, ()
    label, _, rest = spec.partition("=")
    method, _, keys = rest.partition(":")
    label, method = label.strip(), method.strip()
    if not label or not label.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"--methods {spec!r}: the label must be letters, digits, '_' or '-'")
    overrides = []
    for item in filter(None, (k.strip() for k in keys.split(","))):
        parsed = gdro_override(item)
        if parsed is None:
            raise ValueError(f"--methods {spec!r}: {item!r} is not key=value")
        overrides.append(parsed)
    return label, method, tuple(overrides)


def method_gdro_group(
    method: str, seed: int = 0, overrides: tuple[tuple[str, Any], ...] = ()
) -> dict[str, Any]:
    """The ``gdro`` config group (as the verl trainer reads it) that defines ``method``.

    ``method`` is a name of :data:`METHODS` or a variant spec (:func:`parse_method`), whose own
    keys apply after ``overrides``. ``overrides`` are ``(dotted key under gdro, value)`` pairs from
    ``--gdro``, applied to every method alike (e.g. ``("prompt.max_weight", 3.0)``), so an
    ablation changes one knob and keeps the methods comparable. The keys that define a method
    (:data:`METHOD_KEYS`) are refused.
    """
    _, method, own = parse_method(method)
    overrides = tuple(overrides) + tuple(kv for kv in own if kv[0] not in STUDY_KEYS)
    if method not in METHODS:
        raise ValueError(f"--methods: unknown method {method!r}; allowed: {sorted(METHODS)}")
    preset, prompt_on, rollout_on = METHODS[method]
    group: dict[str, Any] = {
        "enable": True,
        "preset": preset,
        "prompt": {"enable": prompt_on},
        "rollout": {"enable": rollout_on, "n_min": 2, "n_max": 12, "seed": int(seed)},
    }
    for key, value in overrides:
        if key in METHOD_KEYS:
            raise ValueError(f"--gdro {key}: this key defines the method; choose --methods instead")
        if key in UNHONOURED_KEYS:
            raise ValueError(f"--gdro {key}: the demo and the study cannot honour it ({UNHONOURED_KEYS[key]})")
        *parents, leaf = key.split(".")
        node = group
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"--gdro {key}: gdro.{part} is not a group")
            node = child
        node[leaf] = value
    return group


#: a variant's own keys that set the study's loop rather than the ``gdro`` group: the filter and
#: the arm's run length (``joint_long=joint:steps=112``: a no-filter arm run on to the generated
#: rollouts of a filter arm; its first steps are those of the shorter run, bit for bit)
STUDY_KEYS = (*DYNAMIC_KEYS, "steps")


def method_study_keys(method: str) -> dict[str, Any]:
    """A variant's own study keys (:data:`STUDY_KEYS`, e.g. ``dapo=grpo:dynamic_sampling=true``):
    settings of the study's loop rather than of the ``gdro`` group, for one arm."""
    return {k: v for k, v in parse_method(method)[2] if k in STUDY_KEYS}


def method_steps(method: str, default: int) -> int:
    """The arm's RL steps: its own ``steps`` key, else ``default`` (``DemoConfig.steps``)."""
    steps = method_study_keys(method).get("steps", default)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--methods {method!r}: steps={steps!r} must be an integer >= 1")
    return steps


@dataclass(frozen=True)
class DemoConfig:
    # task
    task: str = "missing"  # verl_gdro.demo.task.TASKS: missing (development), add and sort (confirmation)
    train_size: int = 512  # fixed train set, revisited steps * batch_prompts / train_size = 10 times
    eval_per_level: int = 32  # held-out problems per difficulty level
    # model
    hidden: int = 64
    layers: int = 2
    max_new_tokens: int = 0  # 0 = the task's longest reference response + end of turn + 2 tokens of slack
    # warm start (supervised, cached; the same weights for every method)
    sft_steps: int = 1500
    sft_batch: int = 64
    sft_lr: float = 1e-2
    sft_noise: float = 0.3  # probability that a target answer digit is replaced by a random one (train._corrupt)
    # RL (GRPO / GDRO)
    steps: int = 160  # 10 epochs of the train set: GDRO acts from the 2nd visit of a prompt on
    batch_prompts: int = 32
    n_mean: int = 4  # GRPO's n = the mean budget of Rollout-GDRO
    temperature: float = 1.0
    lr: float = 3e-4  # measured on GRPO alone (docs/benchmarks.md, testbed): 1e-4 learns slower, 1e-3 is noisier
    mini_batches: int = 1  # PPO mini-batches per step: 1 = on-policy (one forward serves old and new log-probs)
    shuffle: bool = False  # verl's actor.shuffle: false splits the mini-batches in batch order (verl's default)
    # DAPO's dynamic sampling (verl's algorithm.filter_groups; verl_gdro/demo/dynamic.py): drop groups
    # whose filter_metric is all-equal, refill until batch_prompts groups are kept
    dynamic_sampling: bool = False  # algorithm.filter_groups.enable
    filter_metric: str = "acc"  # algorithm.filter_groups.metric: acc or score
    max_num_gen_batches: int = 0  # algorithm.filter_groups.max_num_gen_batches: generation calls per step, 0 = no limit
    gen_batch_size: int = 0  # data.gen_batch_size: prompts per call (the DAPO recipe); 0 = verl 0.9.1's V1 refills
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    kl_coef: float = 0.0  # 0 skips the reference forward (DAPO-style); the paper's 0.001 with --set kl_coef=0.001
    kl_type: str = "low_var_kl"
    loss_agg_mode: str = "token-mean"
    # evaluation
    eval_samples: int = 8
    eval_temperature: float = 1.0
    eval_batch: int = 512
    eval_every: int = 20  # held-out evaluation every N steps (the learning curves); always at the end
    # run
    methods: tuple[str, ...] = field(default=DEFAULT_METHODS)
    # (dotted key under gdro, value) pairs applied to every method (``--gdro prompt.max_weight=3``)
    gdro: tuple[tuple[str, Any], ...] = ()
    seeds: int = 1
    threads: int = 1
    jobs: int = 1  # runs in parallel (processes); not part of what a run computes

    @property
    def response_tokens(self) -> int:
        """The sampling length limit: ``max_new_tokens``, or the task's own when it is 0."""
        from .task import get_task

        return self.max_new_tokens or get_task(self.task).max_new_tokens

    def method_spec(self, label: str) -> str:
        """The ``--methods`` entry whose label is ``label``."""
        for spec in self.methods:
            if parse_method(spec)[0] == label:
                return spec
        raise KeyError(label)

    def to_dict(self) -> dict[str, Any]:
        """What the run directory's results depend on (``jobs`` is left out: it changes no number)."""
        d = asdict(self)
        d.pop("jobs")
        d["methods"] = list(self.methods)
        d["gdro"] = [list(kv) for kv in self.gdro]
        return d

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        """The CI size: three methods, fewer and smaller steps, a smaller eval set."""
        base = cls(
            train_size=72,
            eval_per_level=12,
            sft_steps=300,
            steps=16,
            batch_prompts=12,
            eval_samples=8,
            eval_every=8,
            methods=QUICK_METHODS,
        )
        return replace(base, **overrides)

    @classmethod
    def for_task(cls, task: str | None = None, quick: bool = False, **overrides: Any) -> DemoConfig:
        """The full (or ``quick``) size for ``task`` (default: the development task) with the
        family's own settings (:attr:`~verl_gdro.demo.task.Task.config`), then ``overrides``.

        Why a family sets some fields: a testbed is a task *and* the warm start and run length at
        which GRPO's hardest level is learnable yet lags; ``verl-gdro study --task missing`` must
        reproduce that testbed without extra flags. The CI size keeps its own small sizes.
        """
        from .task import get_task

        full = cls()
        base = cls.quick() if quick else full
        name = base.task if task is None else task
        sized = {f for f in cls.__dataclass_fields__ if getattr(base, f) != getattr(full, f)}  # empty unless quick
        family = {k: v for k, v in get_task(name).config if k not in sized}
        return replace(base, task=name, **{**family, **overrides})

    def validate(self) -> None:
        from .task import get_task

        get_task(self.task)  # names --task
        for name in (
            "train_size", "eval_per_level", "steps", "batch_prompts", "eval_samples", "seeds", "threads", "jobs",
            "eval_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.batch_prompts > self.train_size:
            raise ValueError(f"batch_prompts={self.batch_prompts} must be <= train_size={self.train_size}")
        if not 2 <= self.n_mean <= 12:
            raise ValueError(f"n_mean={self.n_mean} must be in [2, 12] (the arms of Rollout-GDRO)")
        if self.eval_samples < 8:
            raise ValueError(f"eval_samples={self.eval_samples} must be >= 8 (pass@8 is reported)")
        from verl_gdro.step.config import resolve_gdro

        for m in self.methods:
            resolve_gdro(method_gdro_group(m, overrides=self.gdro))  # names the bad gdro.* key
            DynamicSampling.from_settings(self.to_dict(), method_study_keys(m))  # names the bad filter key
            method_steps(m, self.steps)
        labels = [parse_method(m)[0] for m in self.methods]
        if len(set(labels)) != len(labels):
            raise ValueError(f"--methods has duplicate labels: {labels}")
