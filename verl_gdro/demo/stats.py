"""The study's statistics: per-method summaries, paired differences to GRPO with bootstrap
intervals, and the compute each method needs to reach GRPO's final worst-level accuracy.

Why paired: every method of a seed starts from the same warm start, sees the same prompt order and
is evaluated with the same sampling stream, so the seed-to-seed spread (which is larger than most
method effects on a tiny model) cancels in the per-seed difference. The interval is a percentile
bootstrap over seeds of the mean paired difference (10,000 resamples, fixed generator); with 5
seeds it is a rough interval, which is why the per-seed signs are reported beside it.

numpy only (no torch): ``results.json`` can be re-summarised anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["BASELINE", "bootstrap_ci", "markdown", "rollouts_to_reach", "summarise"]

BASELINE = "grpo"
_KEYS = ("mean@8", "pass@8", "worst_level_acc")


def bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (equal ends for one value)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def rollouts_to_reach(curve: Sequence[Mapping[str, Any]], target: float, key: str = "worst_level_acc") -> int | None:
    """Rollouts consumed at the first evaluation where ``key`` >= ``target`` (None: never)."""
    for point in curve:
        if point[key] >= target - 1e-12:
            return int(point["rollouts"])
    return None


def _paired(base: Mapping[int, Mapping], other: Mapping[int, Mapping], get) -> dict[str, Any]:
    seeds = sorted(set(base) & set(other))
    d = np.array([get(other[s]) - get(base[s]) for s in seeds], dtype=np.float64)
    lo, hi = bootstrap_ci(d)
    return {
        "mean": float(d.mean()) if d.size else float("nan"),
        "ci95": [lo, hi],
        "positive": int((d > 0).sum()),
        "negative": int((d < 0).sum()),
        "seeds": len(seeds),
        "per_seed": d.tolist(),
    }


def summarise(
    cfg: Any, labels: Sequence[str], results: Mapping[tuple[str, int], Mapping], ws_eval: Mapping, wall: float
) -> dict:
    """``results.json``: every method's finals, curves, paired differences and compute-to-reach."""
    by: dict[str, dict[int, Mapping]] = {m: {} for m in labels}
    for (m, s), r in results.items():
        by[m][s] = r
    levels = sorted(ws_eval["level_acc"], key=int)
    methods: dict[str, Any] = {}
    for m in labels:
        rs = [by[m][s] for s in sorted(by[m])]
        entry: dict[str, Any] = {"spec": rs[0].get("spec", m), "rollouts": int(rs[0]["rollouts"])}
        for key in (*_KEYS, "wall_s"):
            vals = np.array([r[key] for r in rs], dtype=float)
            entry[key] = float(vals.mean())
            entry[key + "_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        entry["level_acc"] = {lv: float(np.mean([r["level_acc"][lv] for r in rs])) for lv in levels}
        entry["level_acc_std"] = {
            lv: float(np.std([r["level_acc"][lv] for r in rs], ddof=1)) if len(rs) > 1 else 0.0 for lv in levels
        }
        # the learning curve, averaged over seeds at each evaluation step
        steps = [p["step"] for p in rs[0]["curve"]]
        entry["curve"] = [
            {
                "step": st,
                "rollouts": rs[0]["curve"][i]["rollouts"],
                **{k: float(np.mean([r["curve"][i][k] for r in rs])) for k in _KEYS},
            }
            for i, st in enumerate(steps)
        ]
        entry["seeds"] = [
            {k: r[k] for k in ("seed", "pass@8", "mean@8", "worst_level_acc", "worst_level", "level_acc", "wall_s")}
            for r in rs
        ]
        methods[m] = entry

    summary: dict[str, Any] = {
        "task": cfg.task,
        "methods": methods,
        "warm_start": dict(ws_eval),
        "config": cfg.to_dict(),
        "wall_s": wall,
        "num_seeds": cfg.seeds,
    }
    if BASELINE in by and by[BASELINE]:
        base = by[BASELINE]
        summary["testbed"] = {
            "grpo_gain_mean@8_per_seed": [base[s]["mean@8"] - ws_eval["mean@8"] for s in sorted(base)],
            "warm_start_mean@8": ws_eval["mean@8"],
            "warm_start_pass@8": ws_eval["pass@8"],
            "warm_start_hardest_level_acc": ws_eval["level_acc"][levels[-1]],
        }
        paired: dict[str, Any] = {}
        for m in labels:
            if m == BASELINE:
                continue
            entry = {k: _paired(base, by[m], lambda r, k=k: r[k]) for k in _KEYS}
            entry["level_acc"] = {lv: _paired(base, by[m], lambda r, lv=lv: r["level_acc"][lv]) for lv in levels}
            # compute: rollouts to reach GRPO's final worst-level accuracy of the same seed
            fracs = []
            for s in sorted(set(base) & set(by[m])):
                need = rollouts_to_reach(by[m][s]["curve"], base[s]["worst_level_acc"])
                fracs.append(None if need is None else need / base[s]["rollouts"])
            reached = [f for f in fracs if f is not None]
            entry["rollouts_to_grpo_worst"] = {
                "per_seed": fracs,
                "reached": len(reached),
                "median": float(np.median(reached)) if len(reached) == len(fracs) and fracs else None,
            }
            paired[m] = entry
        summary["paired"] = paired
    return summary


def _fmt_ci(p: Mapping[str, Any]) -> str:
    lo, hi = p["ci95"]
    star = "*" if (lo > 0 or hi < 0) else ""
    return f"{p['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]{star} ({p['positive']}/{p['seeds']})"


def markdown(summary: Mapping[str, Any]) -> str:
    """``results.md``: the finals, the paired table and the compute figure."""
    ms = summary["methods"]
    seeds = summary["num_seeds"]
    ws = summary["warm_start"]
    levels = sorted(ws["level_acc"], key=int)
    pm = " ± " if seeds > 1 else ""

    def fmt(e: Mapping, k: str) -> str:
        return f"{e[k]:.3f}" + (f"{pm}{e[k + '_std']:.3f}" if seeds > 1 else "")

    lines = [
        f"# GRPO vs GDRO on the `{summary['task']}` task",
        "",
        f"{seeds} paired seed(s){' (mean ± sample std)' if seeds > 1 else ''}; held-out set, 8 samples per "
        f"problem; every method consumed the same rollouts. Wall time {summary['wall_s']:.0f} s.",
        "",
        "| method | mean@8 | pass@8 | worst level acc | " + " | ".join(f"L{lv}" for lv in levels) + " | rollouts |",
        "|---|---|---|---|" + "---|" * len(levels) + "---|",
        f"| warm start | {ws['mean@8']:.3f} | {ws['pass@8']:.3f} | {ws['worst_level_acc']:.3f} | "
        + " | ".join(f"{ws['level_acc'][lv]:.3f}" for lv in levels)
        + " | 0 |",
    ]
    for m, e in ms.items():
        lines.append(
            f"| {m} | {fmt(e, 'mean@8')} | {fmt(e, 'pass@8')} | {fmt(e, 'worst_level_acc')} | "
            + " | ".join(f"{e['level_acc'][lv]:.3f}" for lv in levels)
            + f" | {e['rollouts']} |"
        )
    tb = summary.get("testbed")
    if tb:
        gains = tb["grpo_gain_mean@8_per_seed"]
        lines += [
            "",
            f"Testbed check (no GDRO involved): GRPO's held-out mean@8 gain over the warm start per seed "
            f"{', '.join(f'{g:+.3f}' for g in gains)} (min {min(gains):+.3f}); warm start pass@8 "
            f"{tb['warm_start_pass@8']:.3f} vs mean@8 {tb['warm_start_mean@8']:.3f}; hardest level "
            f"{tb['warm_start_hardest_level_acc']:.3f}.",
        ]
    paired = summary.get("paired") or {}
    if paired:
        lines += [
            "",
            "## Paired difference to GRPO (same seed), mean [95 % bootstrap interval] (seeds better)",
            "",
            "`*`: the interval excludes 0. Rollouts to GRPO's worst level: the share of GRPO's rollouts at which "
            "the method first reaches GRPO's final worst-level accuracy of the same seed (median over seeds; "
            "'-' when some seed never reached it within the run).",
            "",
            "| method | Δ mean@8 | Δ pass@8 | Δ worst level | "
            + " | ".join(f"Δ L{lv}" for lv in levels)
            + " | rollouts to GRPO's worst (reached) |",
            "|---|---|---|---|" + "---|" * len(levels) + "---|",
        ]
        for m, p in paired.items():
            r = p["rollouts_to_grpo_worst"]
            med = "-" if r["median"] is None else f"{r['median']:.2f}"
            lines.append(
                f"| {m} | {_fmt_ci(p['mean@8'])} | {_fmt_ci(p['pass@8'])} | {_fmt_ci(p['worst_level_acc'])} | "
                + " | ".join(f"{p['level_acc'][lv]['mean']:+.3f}" for lv in levels)
                + f" | {med} ({r['reached']}/{len(r['per_seed'])}) |"
            )
    specs = {m: e["spec"] for m, e in ms.items() if e["spec"] != m}
    if specs:
        lines += ["", "Variants: " + "; ".join(f"`{m}` = `{s}`" for m, s in specs.items())]
    lines.append("")
    return "\n".join(lines)
