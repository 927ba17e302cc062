"""Markdown tables in the layout of the paper's Table 1, with relative gains against a baseline run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from verl_gdro.eval.metrics import TABLE_COLUMNS, RunResult

# The paper's Table 1 (arXiv 2601.19280; docs/reproduce.md), percentages: MATH500, AIME24+25, AMC, Minerva,
# Olympiad, GPQA (mean@8) and pass@8 pooled over all validation prompts.
PAPER_TABLE1: dict[str, dict[str, tuple[float, ...]]] = {
    "1.7B": {
        "GRPO": (50.62, 5.42, 34.69, 14.56, 23.07, 26.39, 50.74),
        "Prompt-GDRO": (63.20, 6.88, 39.38, 14.61, 25.07, 29.29, 55.68),
        "Rollout-GDRO": (63.98, 7.50, 36.87, 17.28, 26.71, 27.72, 56.14),
    },
    "4B": {
        "GRPO": (72.05, 11.25, 60.94, 17.79, 30.48, 35.54, 56.31),
        "Prompt-GDRO": (75.78, 12.92, 64.06, 26.72, 40.98, 40.88, 63.70),
        "Rollout-GDRO": (75.20, 13.96, 67.50, 26.47, 39.28, 38.51, 62.27),
    },
    "8B": {
        "GRPO": (73.45, 14.38, 66.56, 28.17, 36.92, 42.25, 62.04),
        "Prompt-GDRO": (76.18, 16.04, 70.94, 32.17, 42.43, 43.81, 67.60),
        "Rollout-GDRO": (77.88, 15.63, 66.88, 29.55, 43.62, 43.31, 67.75),
    },
}


def row_values(result: RunResult) -> list[float]:
    """A run's row in percent, in :data:`TABLE_COLUMNS` order, then pooled pass@k."""
    return [100.0 * result.column(members) for _, members in TABLE_COLUMNS] + [100.0 * result.pooled_pass_at_k]


def _cell(value: float, base: float | None) -> str:
    if value is None or math.isnan(value):
        return "–"
    text = f"{value:.2f}"
    if base is not None and not math.isnan(base) and base != 0:
        text += f" ({100.0 * (value - base) / base:+.1f}%)"
    return text


def markdown_table(
    runs: Mapping[str, RunResult],
    baseline: str | None = None,
    k: int = 8,
    paper_rows: Mapping[str, Sequence[float]] | None = None,
) -> str:
    """The Markdown table: one row per run (percent), ``(+x.x%)`` relative to ``baseline``; ``paper_rows``
    (e.g. ``PAPER_TABLE1["4B"]``) above the runs, marked "(paper)"."""
    if baseline is not None and baseline not in runs:
        raise ValueError(f"baseline={baseline!r} is not one of the runs {sorted(runs)}")
    cols = ["run"] + [title for title, _ in TABLE_COLUMNS] + [f"pass@{k}"]  # benchmark columns: mean@k
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, vals in (paper_rows or {}).items():
        lines.append("| " + " | ".join([f"{name} (paper)"] + [f"{v:.2f}" for v in vals]) + " |")
    base_vals = row_values(runs[baseline]) if baseline is not None else None
    for name, res in runs.items():
        vals = row_values(res)
        bases = base_vals if (base_vals is not None and name != baseline) else [None] * len(vals)
        lines.append("| " + " | ".join([name] + [_cell(v, b) for v, b in zip(vals, bases, strict=True)]) + " |")
    return "\n".join(lines) + "\n"


def detail_table(runs: Mapping[str, RunResult]) -> str:
    """Per-benchmark detail: prompts, samples, mean@k, pass@k, prompts padded with failures."""
    lines = ["| run | benchmark | prompts | samples | mean@k | pass@k | padded |", "|---|---|---|---|---|---|---|"]
    for name, res in runs.items():
        for b in res.benchmarks.values():
            lines.append(
                f"| {name} | {b.name} | {b.prompts} | {b.samples} | {100 * b.mean_at_k:.2f} | "
                f"{100 * b.pass_at_k:.2f} | {b.padded_prompts} |"
            )
    return "\n".join(lines) + "\n"
