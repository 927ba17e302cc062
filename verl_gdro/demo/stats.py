"""The study's statistics: per-method summaries, paired differences to GRPO with bootstrap
intervals, and the compute each method needs to reach GRPO's final accuracy (hardest level, mean@8).

Why paired: every method of a seed starts from the same warm start, sees the same prompt order and
is evaluated with the same sampling stream, so the seed-to-seed spread (which is larger than most
method effects on a tiny model) cancels in the per-seed difference. The interval is a percentile
bootstrap over seeds of the mean paired difference (10,000 resamples, fixed generator); with 5
seeds it is a rough interval, which is why the per-seed signs are reported beside it. Below
:data:`MIN_SEEDS_FOR_INTERVALS` seeds no interval, significance mark or median is computed at all:
the per-seed differences are all there is.

numpy only (no torch): ``results.json`` can be re-summarised anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "BASELINE",
    "DROP",
    "MIN_LIFT",
    "MIN_SEEDS_FOR_INTERVALS",
    "bootstrap_ci",
    "compute_figure",
    "compute_share",
    "curve_value",
    "interpolated_share",
    "late_drops",
    "markdown",
    "paired",
    "rank_value",
    "rollouts_to_reach",
    "summarise",
]

BASELINE = "grpo"
_KEYS = ("mean@8", "pass@8", "worst_level_acc")
#: fewer paired seeds than this print per-seed differences only (no interval, no ``*``, no median)
MIN_SEEDS_FOR_INTERVALS = 3
#: the compute figure counts a seed only where GRPO lifts the figure by at least this much
MIN_LIFT = 0.10
#: a fall of held-out mean@8 this large between two consecutive evaluations counts as a late drop
DROP = 0.04


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


def _hardest(r: Mapping[str, Any]) -> float:
    """The hardest level's accuracy (the last level in difficulty order) of a result or curve point."""
    return float(r["level_acc"][max(r["level_acc"], key=int)])


def curve_value(r: Mapping[str, Any], key: str) -> float:
    """A figure of a result or curve point: a field (``mean@8``) or ``hardest_level_acc``."""
    return _hardest(r) if key == "hardest_level_acc" else float(r[key])


def compute_share(
    base_curve: Sequence[Mapping[str, Any]],
    other_curve: Sequence[Mapping[str, Any]],
    key: str,
    min_lift: float = MIN_LIFT,
) -> tuple[str, float | None]:
    """Share of GRPO's rollouts at which ``other`` first reaches GRPO's final ``key`` (same seed).

    Returns ``("excluded", None)`` when GRPO lifts ``key`` by less than ``min_lift`` over the run
    (its first curve point, the warm start, to its last): reaching a figure that barely moved is
    evaluation noise, not learning. Else ``("reached", share)`` or ``("never", None)``. ``key`` is a
    curve field (``mean@8``) or ``hardest_level_acc``.
    """
    target = curve_value(base_curve[-1], key)
    if target - curve_value(base_curve[0], key) < min_lift:
        return "excluded", None
    for point in other_curve:
        if curve_value(point, key) >= target - 1e-12:
            return "reached", int(point["rollouts"]) / int(base_curve[-1]["rollouts"])
    return "never", None


def interpolated_share(
    base_curve: Sequence[Mapping[str, Any]], other_curve: Sequence[Mapping[str, Any]], key: str
) -> float | None:
    """:func:`compute_share` between evaluations: the rollouts at which the straight line between the
    last evaluation below GRPO's final ``key`` and the first one at or above it crosses it, as a
    share of GRPO's rollouts (None: never reached). Reaching at the first evaluation reads its
    rollouts (the warm start reads 0)."""
    target = curve_value(base_curve[-1], key)
    prev = None
    for point in other_curve:
        v = curve_value(point, key)
        if v >= target - 1e-12:
            r = float(point["rollouts"])
            if prev is not None and v > prev[1]:
                r = prev[0] + (target - prev[1]) / (v - prev[1]) * (r - prev[0])
            return r / float(base_curve[-1]["rollouts"])
        prev = (float(point["rollouts"]), v)
    return None


def compute_figure(
    base: Mapping[int, Mapping], other: Mapping[int, Mapping], key: str, min_lift: float = MIN_LIFT
) -> dict[str, Any]:
    """:func:`compute_share` and :func:`interpolated_share` over the paired seeds of two arms' done
    records, with the median the tables print and the value `verl-gdro decide` ranks. ``min_lift``
    is the baseline's exclusion rule: GRPO's figures exclude seeds where it barely moved; the
    figures against DAPO (``-inf``) count every seed, since there DAPO's final is the bar itself."""
    seeds = sorted(set(base) & set(other))
    rows = [compute_share(base[s]["curve"], other[s]["curve"], key, min_lift) for s in seeds]
    interp = [interpolated_share(base[s]["curve"], other[s]["curve"], key) for s in seeds]
    counted = [share for status, share in rows if status != "excluded"]
    reached = [share for share in counted if share is not None]
    reached_interp = [x for (status, _), x in zip(rows, interp) if status == "reached"]
    every = bool(counted) and len(reached) == len(counted)
    enough = every and len(counted) >= MIN_SEEDS_FOR_INTERVALS
    return {
        "per_seed": [share if status == "reached" else status for status, share in rows],
        "per_seed_interpolated": [x if status == "reached" else status for (status, _), x in zip(rows, interp)],
        "counted": len(counted),
        "reached": len(reached),
        # a median only from enough seeds, all of them counted and reaching
        "median": float(np.median(reached)) if enough else None,
        "median_interpolated": float(np.median(reached_interp)) if enough else None,
        "rank_value": rank_value(counted),
    }


def rank_value(shares: Sequence[float | None]) -> float | None:
    """The ranking figure of `verl-gdro decide` (against GRPO or DAPO): the median share over the
    counted seeds, a seed that never reaches (None) above 1; None without seeds."""
    return float(np.median([np.inf if x is None else x for x in shares])) if shares else None


def paired(base: Mapping[int, Any], other: Mapping[int, Any], get: Callable[[Any], float]) -> dict[str, Any]:
    """``get(other) - get(base)`` paired over the seeds both have: mean, bootstrap interval (from
    enough seeds), seeds better and worse; the study's tables and DAPO's read it."""
    seeds = sorted(set(base) & set(other))
    d = np.array([get(other[s]) - get(base[s]) for s in seeds], dtype=np.float64)
    lo, hi = bootstrap_ci(d) if d.size >= MIN_SEEDS_FOR_INTERVALS else (None, None)
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
    summary: dict[str, Any] = {
        "task": cfg.task,
        "methods": {m: _method_entry(m, [by[m][s] for s in sorted(by[m])], levels) for m in labels},
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
        summary["paired"] = {m: _paired_entry(base, by[m], levels) for m in labels if m != BASELINE}
    return summary


def late_drops(curve: Sequence[Mapping[str, Any]], threshold: float = DROP) -> list[dict[str, float]]:
    """The falls of held-out mean@8 by at least ``threshold`` between consecutive evaluations in the
    second half of a run (after half its last step). Why: a method that concentrates late updates
    on a few prompts can end high on average yet fall away between evaluations; the final figures
    and their intervals do not show it, a count beside them does."""
    half = float(curve[-1]["step"]) / 2
    return [
        {"step": b["step"], "from": float(a["mean@8"]), "to": float(b["mean@8"])}
        for a, b in zip(curve, curve[1:])
        if b["step"] > half and a["mean@8"] - b["mean@8"] >= threshold
    ]


def _method_entry(m: str, rs: Sequence[Mapping], levels: Sequence[str]) -> dict[str, Any]:
    """One method's finals (mean and sample std over seeds), its seed-mean curve and its seeds."""
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
    drops = [len(late_drops(r["curve"])) for r in rs]
    entry["late_drops"] = {"count": sum(drops), "seeds_with": sum(d > 0 for d in drops), "per_seed": drops}
    stats = [r["train_stats"] for r in rs if "train_stats" in r]
    if stats:
        entry["train_stats"] = {k: float(np.mean([x[k] for x in stats])) for k in stats[0]}
    return entry


def _paired_entry(base: Mapping[int, Mapping], other: Mapping[int, Mapping], levels: Sequence[str]) -> dict[str, Any]:
    """One method's paired differences to GRPO and its compute figures: the share of GRPO's rollouts
    at which it first reaches GRPO's final accuracy of the same seed (hardest level; mean@8)."""
    entry = {k: paired(base, other, lambda r, k=k: r[k]) for k in _KEYS}
    entry["level_acc"] = {lv: paired(base, other, lambda r, lv=lv: r["level_acc"][lv]) for lv in levels}
    entry["compute_to_grpo_final"] = {
        "hardest_level_acc": compute_figure(base, other, "hardest_level_acc"),
        "mean@8": compute_figure(base, other, "mean@8"),
    }
    return entry


def _fmt_ci(p: Mapping[str, Any]) -> str:
    lo, hi = p["ci95"]
    if lo is None:  # too few seeds for an interval: the per-seed differences only
        return " / ".join(f"{d:+.3f}" for d in p["per_seed"])
    star = "*" if (lo > 0 or hi < 0) else ""
    return f"{p['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]{star} ({p['positive']}/{p['seeds']})"


def _fmt_compute(c: Mapping[str, Any]) -> str:
    if c["median"] is not None:
        interp = c.get("median_interpolated")
        return f"{c['median']:.2f}" + ("" if interp is None else f" ({interp:.2f} interp.)") + f" ({c['reached']}/{c['counted']})"
    cells = ["-" if v == "excluded" else "never" if v == "never" else f"{v:.2f}" for v in c["per_seed"]]
    return " / ".join(cells) + f" ({c['reached']}/{c['counted']} counted reached)"


def _rollouts_sentence(methods: Mapping[str, Mapping[str, Any]]) -> str:
    """Say "the same rollouts" only when it is true (filter arms and longer arms generate more)."""
    if len({e["rollouts"] for e in methods.values()}) <= 1:
        return "every method consumed the same rollouts."
    return "methods generated different rollouts (last column: every generated rollout, filtered ones included)."


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
        f"problem; {_rollouts_sentence(ms)} Wall time {summary['wall_s']:.0f} s.",
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
    lines += _paired_lines(summary, levels) + _train_stats_lines(ms) + _late_drop_lines(ms)
    specs = {m: e["spec"] for m, e in ms.items() if e["spec"] != m}
    if specs:
        lines += ["", "Variants: " + "; ".join(f"`{m}` = `{s.removeprefix(m + '=')}`" for m, s in specs.items())]
    lines.append("")
    return "\n".join(lines)


def _paired_lines(summary: Mapping[str, Any], levels: Sequence[str]) -> list[str]:
    """The testbed check and the paired tables of ``results.md`` (per seed only below
    :data:`MIN_SEEDS_FOR_INTERVALS` seeds)."""
    lines: list[str] = []
    seeds = summary["num_seeds"]
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
    if not paired:
        return lines
    few = seeds < MIN_SEEDS_FOR_INTERVALS
    lines += [""]
    if few:
        lines += [
            f"**{seeds} seed{'s' if seeds > 1 else ''} decide{'' if seeds > 1 else 's'} nothing**: the differences "
            f"below are per seed, with no interval or median; `verl-gdro study --task {summary['task']}` (5 paired "
            "seeds) is the comparison that decides.",
            "",
            "## Paired difference to GRPO (same seed), per seed",
        ]
    else:
        lines += [
            "## Paired difference to GRPO (same seed), mean [95 % bootstrap interval] (seeds better)",
            "",
            "`*`: the interval excludes 0.",
        ]
    lines += [
        "",
        "Compute to GRPO's final: the share of GRPO's rollouts at which the method first reaches GRPO's final "
        "accuracy of the same seed (hardest level; mean@8) at an evaluation (in brackets: where the line between "
        "evaluations crosses it, interpolated), counted only on seeds where GRPO lifts that figure "
        f"by >= {MIN_LIFT:.2f} over the run ('-' not counted); "
        + ("per seed." if few else "median over seeds when every counted seed reached it, else per seed."),
        "",
        "| method | Δ mean@8 | Δ pass@8 | Δ worst level | "
        + " | ".join(f"Δ L{lv}" for lv in levels)
        + " | compute to GRPO's final hardest level | compute to GRPO's final mean@8 |",
        "|---|---|---|---|" + "---|" * len(levels) + "---|---|",
    ]
    for m, p in paired.items():
        c = p["compute_to_grpo_final"]
        lines.append(
            f"| {m} | {_fmt_ci(p['mean@8'])} | {_fmt_ci(p['pass@8'])} | {_fmt_ci(p['worst_level_acc'])} | "
            + " | ".join(f"{p['level_acc'][lv]['mean']:+.3f}" for lv in levels)
            + f" | {_fmt_compute(c['hardest_level_acc'])} | {_fmt_compute(c['mean@8'])} |"
        )
    return lines if few else lines + _per_level_lines(paired, levels)


def _per_level_lines(paired: Mapping[str, Any], levels: Sequence[str]) -> list[str]:
    """Per level with intervals: where a method's gain sits (hard tail or easy head)."""
    return [
        "",
        "### Per level: paired difference to GRPO, mean [95 % bootstrap interval]",
        "",
        "| method | " + " | ".join(f"Δ L{lv}" for lv in levels) + " |",
        "|---|" + "---|" * len(levels),
        *(f"| {m} | " + " | ".join(_fmt_ci(p["level_acc"][lv]) for lv in levels) + " |" for m, p in paired.items()),
    ]


def _train_stats_lines(ms: Mapping[str, Any]) -> list[str]:
    """``results.md``'s table of what the rollouts were spent on (when the runs recorded it)."""
    if not any("train_stats" in e for e in ms.values()):
        return []
    lines = [
        "",
        "## What the rollouts were spent on (mean over seeds)",
        "",
        "Zero-advantage share: groups whose rollouts all agree (all correct or all wrong), over the run and its "
        "last quarter; distinct prompts trained on; generated response tokens.",
        "",
        "| method | zero-adv share | last quarter | distinct prompts | response tokens |",
        "|---|---|---|---|---|",
    ]
    for m, e in ms.items():
        t = e.get("train_stats")
        if t:
            lines.append(
                f"| {m} | {t['zero_adv_share']:.3f} | {t['zero_adv_share_last_quarter']:.3f} | "
                f"{t['distinct_prompts']:.0f} | {t['response_tokens']:.0f} |"
            )
    return lines


def _late_drop_lines(ms: Mapping[str, Any]) -> list[str]:
    """``results.md``'s count of :func:`late_drops` per method (a count, not an interval)."""
    return [
        "",
        "## Late drops",
        "",
        f"Falls of held-out mean@8 by {DROP:.2f} or more between two consecutive evaluations in the second half "
        "of each run, summed over seeds, and the seeds with one: where a run was unstable late, which its "
        "final figures do not show.",
        "",
        "| method | late drops | seeds with one |",
        "|---|---|---|",
        *(f"| {m} | {e['late_drops']['count']} | {e['late_drops']['seeds_with']}/{len(e['seeds'])} |" for m, e in ms.items()),
    ]
