"""The curriculum figures of docs/algorithm.md, section 4: ``verl-gdro plot RUN_OR_JSONL [--out DIR]``.

Reads the demo's ``metrics.jsonl`` (flat rows with ``method``, ``seed``, ``step``) or verl's
``file`` logger JSONL (``{"step": N, "data": {...}}``, one series named ``verl``; a recipe's
``metrics/`` folder of one file per start reads as one series): the same ``gdro/`` names. Draws per
series a bins x steps heat map of each :data:`HEATMAPS` metric (absent bins masked), and over all
series the lead-lag (Eq. 32), the WSE proxy against its uniform baseline (Eq. 33) and the share of
zero-advantage groups. numpy, json and matplotlib (imported when drawing) only.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: heatmap file stem -> (per-bin metric name, title, colour-bar label)
HEATMAPS: dict[str, tuple[str, str, str]] = {
    "bin_share": ("prompt_share", "prompt share per bin", "share of the step's prompts"),
    "prompt_weight": ("prompt_weight", "Prompt-GDRO advantage weight per bin", "multiplier w(b)"),
    "reward_per_bin": ("acc", "reward (mean correctness) per bin", "accuracy"),
    "rollouts_per_bin": ("rollout_n", "rollouts per prompt per bin", "n_b"),
    "zero_adv_per_bin": ("zero_adv", "zero-advantage groups per bin (all correct or all wrong)", "share of groups"),
}

_BIN_RE = re.compile(r"^gdro/prompt_share/bin_(\d+)$")


def _rows_of(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open() as fh:
        for i, line in enumerate(fh):
            if not (line := line.strip()):
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i + 1} is not a JSON line: {e}") from e
    return rows


def load_series(path: str | Path, name: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """``{series name: flat rows sorted by step}`` of a run directory, a JSONL file or a folder of
    them; demo series are named ``method`` (``method/seed<s>`` for several seeds), rows without a
    ``gdro/`` metric are skipped."""
    p = Path(path)
    if p.is_dir() and not (p / "metrics.jsonl").exists():
        # the recipes' metrics folder (a new file per resume): name order is start order
        files = sorted(p.glob("*.jsonl"))
        if not files:
            raise ValueError(f"RUN_OR_JSONL={str(path)!r}: a folder with neither metrics.jsonl nor any *.jsonl file")
        return series_from_rows([row for f in files for row in _rows_of(f)], name, source=str(p))
    if p.is_dir():
        p = p / "metrics.jsonl"
    if not p.exists():
        raise ValueError(f"RUN_OR_JSONL={str(path)!r}: no such file (expected a run directory or a .jsonl file)")
    return series_from_rows(_rows_of(p), name, source=str(p))


def series_from_rows(rows: list[dict[str, Any]], name: str | None = None,
                     source: str = "rows") -> dict[str, list[dict[str, Any]]]:
    """:func:`load_series` on rows already in memory (demo rows or verl file-logger rows)."""
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    seeds = {r.get("seed") for r in rows if "data" not in r}
    for r in rows:
        if "data" in r and isinstance(r["data"], Mapping):  # verl FileLogger
            flat = {**r["data"], "step": int(r["step"])}
            key = name or "verl"
        else:
            flat = dict(r)
            key = str(flat.get("method", name or "run"))
            if len(seeds) > 1:
                key = f"{key}/seed{flat.get('seed')}"
        if not any(k.startswith("gdro/") for k in flat):
            continue
        series[key].append(flat)
    if not series:
        raise ValueError(f"{source}: no rows with gdro/ metrics (is this a GDRO run's metrics file?)")
    by_step = {key: {int(r["step"]): r for r in rs} for key, rs in series.items()}  # a re-logged step: its last row
    return {key: [steps[s] for s in sorted(steps)] for key, steps in by_step.items()}


def num_bins_of(rows: Iterable[Mapping[str, Any]]) -> int:
    """Number of bins, from the ``gdro/prompt_share/bin_<b>`` keys present."""
    bins = [int(m.group(1)) for r in rows for k in r for m in [_BIN_RE.match(k)] if m]
    if not bins:
        raise ValueError("no gdro/prompt_share/bin_<b> metric found")
    return max(bins) + 1


#: Per-bin metrics that are controller state, defined for every bin whether or not it is in the step.
STATE_METRICS = ("q", "score", "omega")


def series_matrix(rows: Sequence[Mapping[str, Any]], metric: str, num_bins: int, mask_absent: bool = True) -> np.ndarray:
    """[num_bins, steps] matrix of per-bin ``metric``; NaN where the key is missing or, but for the
    controller state (:data:`STATE_METRICS`), the bin was absent."""
    mat = np.full((num_bins, len(rows)), np.nan)
    masked = mask_absent and metric not in STATE_METRICS
    for j, r in enumerate(rows):
        for b in range(num_bins):
            v, count = r.get(f"gdro/{metric}/bin_{b}"), r.get(f"gdro/count/bin_{b}")
            if v is not None and not (masked and count is not None and float(count) == 0):
                mat[b, j] = float(v)
    return mat


def _scalar(rows: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
    return np.array([float(r[key]) if key in r and r[key] is not None else np.nan for r in rows])


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def draw_all(series: Mapping[str, Sequence[Mapping[str, Any]]], out_dir: str | Path) -> list[Path]:
    """Draw every figure into ``out_dir``; returns the PNG paths written."""
    import matplotlib

    matplotlib.use("Agg")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [_heatmap(rows, metric, f"{name}: {title}", label, out / f"{_safe(name)}_{stem}.png")
               for name, rows in series.items() if rows for stem, (metric, title, label) in HEATMAPS.items()]
    written.append(_line_figure(series, (("gdro/lead_lag", "-", ""),), "mu_weight - mu_data",
                                "lead-lag of the weighted bin index (Eq. 32)", out / "lead_lag.png", zero_line=True))
    written.append(_line_figure(series, (("gdro/zero_adv_share", "-", ""),), "share of the step's groups",
                                "zero-advantage groups (all correct or all wrong)", out / "zero_adv_share.png",
                                ylim=(0.0, 1.0)))
    # Eq. 33's proxy beside its compute-matched uniform baseline, one colour per series
    wse = (("gdro/wse", "-", ": WSE"), ("gdro/wse_uniform", "--", ": uniform n (compute-matched)"))
    written.append(_line_figure(series, wse, "sum_b qhat(b) sigma_b / sqrt(n_b)",
                                "weighted standard error proxy vs uniform allocation (Eq. 33)", out / "wse.png", legend=6))
    return written


def _save(fig: Any, path: Path, dpi: int = 90) -> Path:
    """Save one figure to ``path`` and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _finish(fig: Any, ax: Any, path: Path, ylabel: str, title: str, legend: int = 0) -> Path:
    """Label one figure's axes, save it to ``path`` and close it."""
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.legend(fontsize=legend)
    return _save(fig, path)


def _heatmap(rows: Sequence[Mapping[str, Any]], metric: str, title: str, label: str, path: Path) -> Path:
    """One per-bin metric of one series as a bins x steps heat map (grey where a bin is absent)."""
    import matplotlib
    import matplotlib.pyplot as plt

    nb = num_bins_of(rows)
    steps = [int(r["step"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("#dddddd")
    im = ax.imshow(np.ma.masked_invalid(series_matrix(rows, metric, nb)), aspect="auto", origin="lower",
                   interpolation="nearest", cmap=cmap, extent=(steps[0] - 0.5, steps[-1] + 0.5, -0.5, nb - 0.5))
    fig.colorbar(im, ax=ax, label=label)
    return _finish(fig, ax, path, "bin (0 = hardest)", title)


def _line_figure(series: Mapping[str, Sequence[Mapping[str, Any]]], curves: Sequence[tuple[str, str, str]],
                 ylabel: str, title: str, path: Path, legend: int = 7, zero_line: bool = False,
                 ylim: tuple[float, float] | None = None) -> Path:
    """Scalar metrics over steps: per series (one colour each) a line per ``(key, linestyle, label
    suffix)`` of ``curves``, saved to ``path``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, (name, rows) in enumerate(series.items()):
        x = [r["step"] for r in rows]
        for key, ls, suffix in curves:
            ax.plot(x, _scalar(rows, key), color=f"C{i % 10}", ls=ls, label=f"{name}{suffix}")
    if zero_line:
        ax.axhline(0.0, color="k", lw=0.5)
    if ylim is not None:
        ax.set_ylim(*ylim)
    return _finish(fig, ax, path, ylabel, title, legend=legend)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="RUN_OR_JSONL", help="a demo run directory, its metrics.jsonl, verl's "
                        "file-logger JSONL, or a recipe's metrics/ folder of them")
    parser.add_argument("--out", default=None, help="output folder (default: <run>/plots, or next to the JSONL)")
    parser.add_argument("--name", default=None, help="series name for a verl file-logger JSONL (default: verl)")


def main(args: argparse.Namespace) -> int:
    from verl_gdro.errors import usage_errors

    src = Path(args.source)
    with usage_errors():  # missing file, not JSONL, no gdro/ rows: one line, exit 2
        series = load_series(src, args.name)
    out = Path(args.out) if args.out else src / "plots" if src.is_dir() else src.parent / f"{src.stem}_plots"
    paths = draw_all(series, out)
    print(f"wrote {len(paths)} figures for {len(series)} series to {out}")
    return 0


def draw_learning_curves(summary: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """Held-out mean@8 and worst-level accuracy against rollouts consumed, one line per method
    (the mean over seeds at each evaluation), from a demo/study ``results.json`` summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, entry in summary["methods"].items():
        curve = entry["curve"]
        x = [p["rollouts"] for p in curve]
        for ax, key in zip(axes, ("mean@8", "worst_level_acc"), strict=True):
            ax.plot(x, [p[key] for p in curve], marker=".", label=name)
    for ax, title in zip(axes, ("held-out mean@8", "worst-level accuracy"), strict=True):
        ax.set_xlabel("rollouts consumed")
        ax.set_title(f"{summary.get('task', '')}: {title} ({summary.get('num_seeds', 1)} seed mean)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return [_save(fig, out / "learning_curves.png", dpi=110)]
