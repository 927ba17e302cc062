"""Controller-only simulation: what the classifier and both adversaries decide, step by step.

No model, no verl, no torch: a population of prompts with a heavy-tailed difficulty mix whose
latent success probability rises with the (weighted) GRPO signal each level receives. It exists to
make the controllers' behaviour visible in seconds (bins, Prompt-GDRO weights, rollouts per bin)
and to compare the ``robust`` and ``paper`` presets on the same synthetic task. It is a toy model
of learning, not evidence about LLMs: the CPU demo (``verl-gdro demo``) trains a real policy.

Learning model: prompt i of level l succeeds with probability sigmoid(theta_l + c_i). A group with
both a success and a failure gives a non-zero GRPO gradient; each such group moves theta of its
level by ``lr * w_i * n_i / sum(n)`` (token-mean aggregation: every response counts once), with
``spill`` of it reaching the neighbouring levels (shared skills).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from verl_gdro.classifier import OnlineDifficultyClassifier
from verl_gdro.errors import positive_int
from verl_gdro.metrics import step_metrics
from verl_gdro.presets import preset_value
from verl_gdro.prompt_gdro import PromptGDRO, failure_rate_loss
from verl_gdro.rollout_gdro import RolloutGDRO

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
    kl_scale: float = 0.02  # paper preset: per-prompt KL of the simulated policy (beta_KL * KL)
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


def run_method(method: str, cfg: SimConfig, verbose: bool = False) -> dict[str, Any]:
    """Simulate one method; returns final per-level success and the per-step metric rows."""
    levels, offsets, theta = make_task(cfg)
    preset = "paper" if method.endswith("_paper") else "robust"
    use_prompt = method.startswith("prompt_gdro")
    use_rollout = method.startswith("rollout_gdro")
    rng = np.random.default_rng(cfg.seed + 1)
    classifier = OnlineDifficultyClassifier()
    prompt = PromptGDRO(classifier.num_bins, min_ess=preset_value(preset, "prompt", "min_ess"))
    rollout = RolloutGDRO(
        classifier.num_bins,
        n_mean=cfg.n_mean,
        arm_utility=preset_value(preset, "rollout", "arm_utility"),
        selection=preset_value(preset, "rollout", "selection"),
        seed=cfg.seed,
    )
    loss_signal = preset_value(preset, "prompt", "loss_signal")
    rows: list[dict[str, float]] = []
    total_rollouts = 0
    for step in range(cfg.steps):
        uids = rng.choice(cfg.num_prompts, size=cfg.batch_size, replace=False).astype(np.int64)
        bins = classifier.bins(uids)
        n = rollout.allocate(bins) if use_rollout else np.full(uids.size, cfg.n_mean, dtype=np.int64)
        assert int(n.sum()) == cfg.n_mean * cfg.batch_size
        total_rollouts += int(n.sum())
        p = _sigmoid(theta[levels[uids]] + offsets[uids])
        succ = rng.binomial(n, p)
        resp_bins = np.repeat(bins, n)
        w_bin = prompt.bin_multipliers(resp_bins) if use_prompt else np.ones(classifier.num_bins)
        informative = (succ > 0) & (succ < n)
        push = cfg.lr * w_bin[bins] * n * informative / n.sum()
        grad = np.bincount(levels[uids], weights=push, minlength=cfg.num_levels)
        theta = theta + grad + cfg.spill * (np.roll(grad, 1) * (np.arange(cfg.num_levels) > 0)
                                            + np.roll(grad, -1) * (np.arange(cfg.num_levels) < cfg.num_levels - 1))
        group = np.repeat(np.arange(uids.size), n)
        if loss_signal == "failure_rate":
            losses = failure_rate_loss(_bernoulli_flat(succ, n), group)
        else:  # surrogate(_kl) at the on-policy point: beta_KL * KL, small and positive
            losses = cfg.kl_scale * rng.gamma(2.0, 0.5, size=uids.size)
        prompt_kwargs: dict[str, Any] = {}
        if use_prompt:
            prompt_kwargs = {"prompt_weights": w_bin, "q": prompt.bin_probs(), "scores": prompt.scores,
                             "omega": prompt.omega()}
            info = prompt.update(bins, losses)
            prompt_kwargs["bin_losses"] = info["mean_losses"]
        if use_rollout:
            rollout.update(bins, n, succ, losses)
        metrics = step_metrics(
            classifier.num_bins, bins, succ, n, n_mean=cfg.n_mean,
            shadow_price=rollout.mu if use_rollout else 0.0, **prompt_kwargs,
        )
        classifier.observe(uids, succ, n)
        metrics["reward/mean"] = float(succ.sum() / n.sum())
        rows.append(metrics)
        if verbose and (step % max(1, cfg.steps // 10) == 0 or step == cfg.steps - 1):
            print(_describe_step(method, step, bins, n, w_bin, classifier.num_bins, metrics))
    final = _sigmoid(theta[:, None] + offsets[None, :])
    per_level = np.array([final[lvl, levels == lvl].mean() for lvl in range(cfg.num_levels)])
    return {"per_level": per_level, "rows": rows, "rollouts": total_rollouts}


def _bernoulli_flat(succ: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per-response correctness consistent with per-prompt success counts (successes first)."""
    starts = np.repeat(np.cumsum(n) - n, n)
    pos = np.arange(int(n.sum())) - starts
    return (pos < np.repeat(succ, n)).astype(np.float64)


def _describe_step(method: str, step: int, bins: np.ndarray, n: np.ndarray, w_bin: np.ndarray,
                   num_bins: int, metrics: dict[str, float]) -> str:
    counts = np.bincount(bins, minlength=num_bins)
    n_bin = [f"{int(n[bins == b][0])}" if counts[b] else "-" for b in range(num_bins)]
    return (
        f"[{method:>18}] step {step:4d}  reward {metrics['reward/mean']:.3f}  "
        f"prompts/bin {counts.tolist()}  weight/bin {np.round(w_bin, 2).tolist()}  "
        f"n/bin [{' '.join(n_bin)}]  mu {metrics.get('gdro/shadow_price', 0.0):.3f}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=positive_int, default=SimConfig.steps)
    parser.add_argument("--seed", type=int, default=SimConfig.seed)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
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
