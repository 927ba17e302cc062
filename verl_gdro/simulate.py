"""Controller-only simulation: what the classifier and both adversaries decide, step by step.

No model, no verl, no torch: prompts with a heavy-tailed difficulty mix whose latent success
probability rises with the (weighted) GRPO signal each level receives, to show in seconds what the
controllers do (bins, Prompt-GDRO weights, rollouts per bin) and compare the ``robust`` and ``paper``
presets. A toy model of learning, not evidence about LLMs (``verl-gdro demo`` trains a real policy).
The controllers are the step API's, called in the trainer's order (``tests/test_simulate_wiring.py``).

Learning model: prompt i of level l succeeds with probability sigmoid(theta_l + c_i); each group with
both a success and a failure (a non-zero GRPO gradient) moves theta of its level by
``lr * w_i * n_i / sum(n)`` (token-mean: every response counts once), ``spill`` of it reaching the
neighbouring levels (shared skills).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from verl_gdro.errors import positive_int
from verl_gdro.metrics import per_bin_series
from verl_gdro.step.controller import GDROController
from verl_gdro.step.sampler import PromptSampler

METHODS = ("grpo", "prompt_gdro", "rollout_gdro", "prompt_gdro_paper", "rollout_gdro_paper")


@dataclass
class SimConfig:
    """Every knob of the toy task, visible in one place."""

    num_prompts: int = 2000
    num_levels: int = 6
    batch_size: int = 64
    steps: int = 150
    n_mean: int = 4
    lr: float = 2.0
    spill: float = 0.15
    kl: float = 0.05  # surrogate loss signals (paper preset): mean per-token KL to the reference
    seed: int = 0


def make_task(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Levels (heavy-tailed: level l has weight 2^-l), per-prompt offsets, initial level skills."""
    rng = np.random.default_rng(cfg.seed)
    weights = 0.5 ** np.arange(cfg.num_levels)
    levels = rng.choice(cfg.num_levels, size=cfg.num_prompts, p=weights / weights.sum())
    offsets = rng.normal(0.0, 0.5, size=cfg.num_prompts)
    theta = np.linspace(2.0, -4.0, cfg.num_levels)  # easy levels solved, the tail nearly never
    return levels, offsets, theta


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def method_gdro_group(method: str, seed: int = 0) -> dict[str, Any]:
    """The ``gdro`` config group that defines ``method``, as the trainer and the demo read it: only the
    preset and the two switches, so every other key keeps its package default or preset value."""
    if method not in METHODS:
        raise ValueError(f"--methods: unknown method {method!r}; allowed: {list(METHODS)}")
    return {
        "enable": True,
        "preset": "paper" if method.endswith("_paper") else "robust",
        "prompt": {"enable": method.startswith("prompt_gdro")},
        "rollout": {"enable": method.startswith("rollout_gdro"), "seed": int(seed)},
    }


def build_controller(method: str, cfg: SimConfig) -> GDROController:
    """The step API's controller for ``method`` (:meth:`GDROController.from_config`), as the trainer builds it."""
    return GDROController.from_config(method_gdro_group(method, cfg.seed), rollout_n=cfg.n_mean)


def run_method(method: str, cfg: SimConfig, verbose: bool = False) -> dict[str, Any]:
    """Simulate one method; returns final per-level success and the per-step metric rows."""
    levels, offsets, theta = make_task(cfg)
    rng = np.random.default_rng(cfg.seed + 1)
    ctrl = build_controller(method, cfg)
    # a sampling mode draws the batches through the step API's sampler, as the trainer does
    sampler = PromptSampler(ctrl, np.arange(cfg.num_prompts), seed=cfg.seed + 2) if ctrl.resamples else None
    rows: list[dict[str, float]] = []
    total_rollouts = 0
    for step in range(cfg.steps):
        if sampler is None:
            uids = rng.choice(cfg.num_prompts, size=cfg.batch_size, replace=False).astype(np.int64)
        else:
            uids = sampler.draw(cfg.batch_size)  # rows are the prompt ids here
        plan = ctrl.before_generation(uids)
        bins, n = plan.bins, plan.rollout_n
        assert int(n.sum()) == cfg.n_mean * cfg.batch_size
        total_rollouts += int(n.sum())
        group = np.repeat(plan.positions, n)
        # the Eq. 16 multiplier of each trajectory; one per prompt (all of a group's are equal)
        w_prompt = ctrl.advantage_multipliers(group)[np.cumsum(n) - n]
        p = _sigmoid(theta[levels[uids]] + offsets[uids])
        succ = rng.binomial(n, p)
        informative = (succ > 0) & (succ < n)
        push = cfg.lr * w_prompt * n * informative / n.sum()
        grad = np.bincount(levels[uids], weights=push, minlength=cfg.num_levels)
        theta = theta + grad + cfg.spill * (np.roll(grad, 1) * (np.arange(cfg.num_levels) > 0)
                                            + np.roll(grad, -1) * (np.arange(cfg.num_levels) < cfg.num_levels - 1))
        acc = _bernoulli_flat(succ, n)
        policy: dict[str, np.ndarray] = {}
        if ctrl.settings.prompt.loss_signal != "failure_rate":
            # the surrogate signals at the on-policy point: advantages of a group sum to zero (here:
            # zero), so only the KL to the reference remains (low_var_kl(d) ~ d^2 / 2 per token)
            zeros = np.zeros((acc.size, 1))
            kl = cfg.kl * rng.gamma(2.0, 0.5, size=acc.size)
            policy = {"response_mask": np.ones((acc.size, 1)), "old_log_probs": zeros, "advantages": zeros,
                      "ref_log_probs": -np.sqrt(2.0 * kl)[:, None]}
        metrics = ctrl.after_advantage(group, acc, **policy)
        metrics["reward/mean"] = float(succ.sum() / n.sum())
        rows.append(metrics)
        if verbose and (step % max(1, cfg.steps // 10) == 0 or step == cfg.steps - 1):
            print(_describe_step(method, step, bins, n, metrics, ctrl.num_bins))
    final = _sigmoid(theta[:, None] + offsets[None, :])
    per_level = np.array([final[lvl, levels == lvl].mean() for lvl in range(cfg.num_levels)])
    return {"per_level": per_level, "rows": rows, "rollouts": total_rollouts}


def _bernoulli_flat(succ: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per-response correctness consistent with per-prompt success counts (successes first)."""
    starts = np.repeat(np.cumsum(n) - n, n)
    pos = np.arange(int(n.sum())) - starts
    return (pos < np.repeat(succ, n)).astype(np.float64)


def _describe_step(method: str, step: int, bins: np.ndarray, n: np.ndarray, metrics: dict[str, float],
                   num_bins: int) -> str:
    counts = np.bincount(bins, minlength=num_bins)
    n_sum = np.bincount(bins, weights=n, minlength=num_bins)
    n_bin = [f"{n_sum[b] / counts[b]:.1f}" if counts[b] else "-" for b in range(num_bins)]
    weights = np.round(np.nan_to_num(per_bin_series(metrics, "prompt_weight", num_bins), nan=1.0), 2).tolist()
    return (
        f"[{method:>18}] step {step:4d}  reward {metrics['reward/mean']:.3f}  "
        f"prompts/bin {counts.tolist()}  weight/bin {weights}  "
        f"mean n/bin [{' '.join(n_bin)}]  mu {metrics.get('gdro/shadow_price', 0.0):.3f}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=positive_int, default=SimConfig.steps, help="simulated steps")
    parser.add_argument("--seed", type=int, default=SimConfig.seed, help="task and controller seed")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                        help="methods to simulate (each its preset, as the demo names them)")
    parser.add_argument("--json", action="store_true", help="print the final table as JSON")
    parser.add_argument("--quiet", action="store_true", help="only the final table")


def main(args: argparse.Namespace) -> int:
    cfg = SimConfig(steps=args.steps, seed=args.seed)
    results = {m: run_method(m, cfg, verbose=not args.quiet) for m in args.methods}
    table = {
        m: {
            "per_level_success": np.round(r["per_level"], 3).tolist(),
            "worst_level": round(float(r["per_level"].min()), 3),
            "rollouts": r["rollouts"],
        }
        for m, r in results.items()
    }
    if args.json:
        print(json.dumps(table))
    else:
        print("\nfinal success probability per difficulty level (0 = easiest), same rollouts:")
        for m, t in table.items():
            print(f"  {m:>18}: {t['per_level_success']}  worst {t['worst_level']:.3f}  rollouts {t['rollouts']}")
    return 0
