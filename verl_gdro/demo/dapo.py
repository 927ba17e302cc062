"""The study's figures under DAPO's dynamic sampling: every arm against DAPO (GRPO + the filter).

With the filter a method's cost is the rollouts it *generates* (trained, filtered and surplus
alike), not the rollouts it trains on, so every figure here is read on generated rollouts:

- final held-out mean@8 and hardest-level accuracy, paired differences to DAPO (same seed) with
  95 % bootstrap intervals from :data:`~verl_gdro.demo.stats.MIN_SEEDS_FOR_INTERVALS` seeds on;
- generated rollouts per trained batch (generated / trained rollouts), refill rounds per step
  (generation calls: each one a wall-clock round trip on GPUs), the filtered share of groups;
- mean@8 at equal generated rollouts (each arm's curve read at the no-filter budget, steps x
  batch x n, where a filter arm still has steps to go);
- generated rollouts to DAPO's final mean@8, as a share of DAPO's generated rollouts (median over
  seeds when every seed reaches it; the interpolated crossing in brackets).

numpy only: a run directory's ``done/`` records and ``metrics/`` rows are all it reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .stats import MIN_SEEDS_FOR_INTERVALS, compute_figure, curve_value, paired

__all__ = ["dapo_markdown", "dapo_summary", "value_at_rollouts"]


def value_at_rollouts(curve: Sequence[Mapping[str, Any]], rollouts: float, key: str = "mean@8") -> float | None:
    """``key`` of the curve at ``rollouts`` generated rollouts, linear between evaluations (None:
    the run ended before)."""
    prev = None
    for point in curve:
        r, v = float(point["rollouts"]), curve_value(point, key)
        if r >= rollouts:
            if prev is None or r == prev[0]:
                return v
            return prev[1] + (rollouts - prev[0]) / (r - prev[0]) * (v - prev[1])
        prev = (r, v)
    return None


def _steps(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per-step means of the filter's counters over a run (its last quarter for the rounds)."""
    gen = np.array([r.get("train/generated_rollouts", np.nan) for r in rows], dtype=float)
    trained = np.array([r.get("train/trained_groups", np.nan) for r in rows], dtype=float)
    calls = np.array([r.get("train/gen_calls", 1.0) for r in rows], dtype=float)
    last = calls[len(calls) - max(1, len(calls) // 4):]
    return {
        "generated_per_step": float(np.nanmean(gen)),
        "gen_calls": float(calls.mean()),
        "gen_calls_last_quarter": float(last.mean()),
        "filtered_share": float(np.mean([r.get("train/filtered_share", 0.0) for r in rows])),
        "short_batches": float(np.sum([r.get("train/short_batch", 0.0) for r in rows])),
        "trained_groups": float(np.nanmean(trained)),
    }


def dapo_summary(
    out: Path, labels: Sequence[str], base: str, budget: int, seeds: Sequence[int] | None = None
) -> dict[str, Any]:
    """Every arm of the run directory ``out`` against ``base`` (DAPO); ``budget`` is the no-filter
    rollouts of a run (steps x batch x n), where the equal-rollouts figure is read; ``seeds``: the
    seeds to read (default: every finished one)."""
    done: dict[str, dict[int, dict]] = {m: {} for m in labels}
    for path in sorted((out / "done").glob("*_seed*.json")):
        rec = json.loads(path.read_text())
        if rec.get("method") in done and (seeds is None or int(rec["seed"]) in seeds):
            done[rec["method"]][int(rec["seed"])] = rec
    arms: dict[str, Any] = {}
    for m in labels:
        runs = done[m]
        if not runs:
            continue
        steps = [_steps(_rows(out / "metrics" / f"{m}_seed{s}.jsonl")) for s in sorted(runs)]
        entry: dict[str, Any] = {
            "seeds": sorted(runs),
            "filter": bool(next(iter(runs.values())).get("dynamic_sampling", False)),
            "generated": float(np.mean([r["rollouts"] for r in runs.values()])),
            "trained": float(np.mean([r.get("trained_rollouts", r["rollouts"]) for r in runs.values()])),
            **{k: float(np.mean([x[k] for x in steps])) for k in steps[0]},
        }
        for key in ("mean@8", "hardest_level_acc"):
            entry[key] = float(np.mean([curve_value(r, key) for r in runs.values()]))
        entry["mean@8_at_budget"] = _mean_or_none([value_at_rollouts(r["curve"], budget) for r in runs.values()])
        if base in done and done[base] and m != base:
            b = done[base]
            entry["paired"] = {
                key: paired(b, runs, lambda r, k=key: curve_value(r, k)) for key in ("mean@8", "hardest_level_acc")
            }
            at = {s: value_at_rollouts(r["curve"], budget) for s, r in runs.items()}
            at_base = {s: value_at_rollouts(r["curve"], budget) for s, r in b.items()}
            entry["paired"]["mean@8_at_budget"] = paired(
                {s: v for s, v in at_base.items() if v is not None},
                {s: v for s, v in at.items() if v is not None},
                float,
            )
            entry["to_dapo_final"] = {k: compute_figure(b, runs, k, -np.inf) for k in ("mean@8", "hardest_level_acc")}
        arms[m] = entry
    return {"base": base, "budget": budget, "arms": arms}


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return float(np.mean(got)) if got and len(got) == len(values) else None


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ci(p: Mapping[str, Any] | None) -> str:
    if p is None:
        return ""
    lo, hi = p["ci95"]
    if lo is None:
        return " / ".join(f"{d:+.3f}" for d in p["per_seed"])
    star = "*" if (lo > 0 or hi < 0) else ""
    return f"{p['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]{star} ({p['positive']}/{p['seeds']})"


def _reach_cell(r: Mapping[str, Any] | None) -> str:
    if r is None:
        return ""
    if r["median"] is not None:
        return f"{r['median']:.2f} ({r['median_interpolated']:.2f})"
    return " / ".join(x if isinstance(x, str) else f"{x:.2f}" for x in r["per_seed"])


def dapo_markdown(summary: Mapping[str, Any], batch_rollouts: int) -> str:
    """The section of ``results.md`` with :func:`dapo_summary`'s table; ``batch_rollouts`` is the
    trained batch (prompts x n)."""
    base = summary["base"]
    lines = [
        f"## Against DAPO (`{base}`: GRPO with the filter), on generated rollouts",
        "",
        "Final: held-out mean@8 / hardest level (mean over seeds); Δ: paired difference to DAPO, mean [95 % "
        "bootstrap interval] (seeds better), per seed below "
        f"{MIN_SEEDS_FOR_INTERVALS} seeds; generated: rollouts generated over the run (mean over seeds); gen/batch: generated rollouts per trained batch of {batch_rollouts}; "
        "rounds: generation calls per step (last quarter in brackets); all-equal: share of generated groups whose "
        f"acc was the same for every response (dropped where the filter is on); at {summary['budget']}: mean@8 at that many generated rollouts (the no-filter "
        "budget), Δ to DAPO; to DAPO's final: generated rollouts at which the arm first reaches DAPO's final "
        "mean@8, as a share of DAPO's (interpolated in brackets; per seed when a seed never reaches it).",
        "",
        "| arm | filter | generated | mean@8 | hardest | Δ mean@8 | Δ hardest | gen/batch | rounds | all-equal | "
        f"Δ mean@8 at {summary['budget']} | to DAPO's final mean@8 | to DAPO's final hardest |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, e in summary["arms"].items():
        p = e.get("paired", {})
        reach = e.get("to_dapo_final", {})
        lines.append(
            f"| {m} | {'on' if e['filter'] else 'off'} | {e['generated']:.0f} | {e['mean@8']:.3f} | {e['hardest_level_acc']:.3f} | "
            f"{_ci(p.get('mean@8'))} | {_ci(p.get('hardest_level_acc'))} | "
            f"{e['generated_per_step'] / batch_rollouts:.2f} | {e['gen_calls']:.2f} ({e['gen_calls_last_quarter']:.2f}) | "
            f"{e['filtered_share']:.3f} | {_ci(p.get('mean@8_at_budget'))} | {_reach_cell(reach.get('mean@8'))} | "
            f"{_reach_cell(reach.get('hardest_level_acc'))} |"
        )
    lines.append("")
    return "\n".join(lines)
