"""Every knob of the CPU demo in one place, visible at the top (the single-file-RL style).

Two sizes: the default (the README's ``verl-gdro demo``, <= 10 minutes on a 2-core machine) and
``--quick`` (CI, <= 2 minutes). Both use the spec's GRPO settings where they apply: temperature
1.0, mean budget n = 4 with arms 2..12, clip 0.2 / 0.28, low-variance KL 0.001 against the frozen
warm start, 8 evaluation samples per problem.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = ["DEFAULT_METHODS", "METHODS", "METHOD_KEYS", "QUICK_METHODS", "DemoConfig", "method_gdro_group"]

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
}
DEFAULT_METHODS = ("grpo", "prompt_gdro", "rollout_gdro", "prompt_gdro_paper", "rollout_gdro_paper")
QUICK_METHODS = ("grpo", "prompt_gdro", "rollout_gdro")


#: ``gdro`` keys that define a method; ``--gdro`` may not change them (pick another method instead).
METHOD_KEYS = ("enable", "preset", "prompt.enable", "rollout.enable", "rollout.seed")


def method_gdro_group(
    method: str, seed: int = 0, overrides: tuple[tuple[str, Any], ...] = ()
) -> dict[str, Any]:
    """The ``gdro`` config group (as the verl trainer reads it) that defines ``method``.

    ``overrides`` are ``(dotted key under gdro, value)`` pairs from ``--gdro``, applied to every
    method alike (e.g. ``("prompt.max_weight", 3.0)``), so an ablation changes one knob and keeps
    the methods comparable. The keys that define a method (:data:`METHOD_KEYS`) are refused.
    """
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
        *parents, leaf = key.split(".")
        node = group
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"--gdro {key}: gdro.{part} is not a group")
            node = child
        node[leaf] = value
    return group


@dataclass(frozen=True)
class DemoConfig:
    # task
    train_size: int = 128  # fixed train set; small so every prompt is revisited (the classifier needs history)
    eval_per_level: int = 40  # held-out problems per difficulty level
    # model
    hidden: int = 64
    layers: int = 2
    max_new_tokens: int = 14  # "Answer: " + up to 4 digits + end of turn, with slack
    # warm start (supervised, cached; the same weights for every method)
    sft_steps: int = 600
    sft_batch: int = 64
    sft_lr: float = 1e-2
    # RL (GRPO / GDRO)
    steps: int = 64  # 8 epochs of the train set: GDRO acts from the 2nd visit of a prompt on
    batch_prompts: int = 16
    n_mean: int = 4  # GRPO's n = the mean budget of Rollout-GDRO
    temperature: float = 1.0
    lr: float = 3e-4  # 1e-3 collapsed the policy within 10 steps (measured); 1e-4 and 3e-4 both improve
    mini_batches: int = 2  # PPO mini-batches per step (one epoch): the 2nd is off-policy, so clipping acts
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    kl_coef: float = 0.001
    kl_type: str = "low_var_kl"
    loss_agg_mode: str = "token-mean"
    # evaluation
    eval_samples: int = 8
    eval_temperature: float = 1.0
    eval_batch: int = 512
    # run
    methods: tuple[str, ...] = field(default=DEFAULT_METHODS)
    # (dotted key under gdro, value) pairs applied to every method (``--gdro prompt.max_weight=3``)
    gdro: tuple[tuple[str, Any], ...] = ()
    seeds: int = 1
    threads: int = 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
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
            methods=QUICK_METHODS,
        )
        return replace(base, **overrides)

    def validate(self) -> None:
        for name in ("train_size", "eval_per_level", "steps", "batch_prompts", "eval_samples", "seeds", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.batch_prompts > self.train_size:
            raise ValueError(f"batch_prompts={self.batch_prompts} must be <= train_size={self.train_size}")
        if not 2 <= self.n_mean <= 12:
            raise ValueError(f"n_mean={self.n_mean} must be in [2, 12] (the arms of Rollout-GDRO)")
        if self.eval_samples < 8:
            raise ValueError(f"eval_samples={self.eval_samples} must be >= 8 (pass@8 is reported)")
        from verl_gdro.integration.config import resolve_gdro

        for m in self.methods:
            resolve_gdro(method_gdro_group(m, overrides=self.gdro))  # names the bad gdro.* key
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"--methods has duplicates: {list(self.methods)}")
