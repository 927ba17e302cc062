"""Controller traces of a ``verl-gdro study`` run in the release's regime, as markdown tables.

Reads ``<run dir>/metrics/<method>_seed<s>.jsonl`` (the study's per-step ``gdro/`` metrics) and
prints, averaged over seeds and over windows of training steps:

1. each bin's loss signal and failure rate for the ``release`` Prompt-GDRO arm (is the update-time
   signal informative: does it order the bins by difficulty?), with the share of steps where the
   bin with the largest loss is the hardest bin present;
2. the path of each bin's advantage multiplier (the weights) for the reweighting arms;
3. the allocation: mean rollouts per prompt of each bin, and for ``release_as_run`` the arm each
   class got (``gdro/release_arm/*``).

    python benchmarks/release_regime.py runs/study-release-regime [--window 20]

Used for docs/studies/release-regime.md.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np


def load(run: Path) -> dict[str, list[list[dict]]]:
    """method -> [per-seed list of step records]."""
    out: dict[str, list[list[dict]]] = defaultdict(list)
    for path in sorted((run / "metrics").glob("*_seed*.jsonl")):
        method = re.sub(r"_seed\d+$", "", path.stem)
        out[method].append([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    return dict(out)


def num_bins(records: list[dict]) -> int:
    return 1 + max(int(k.rsplit("bin_", 1)[1]) for r in records for k in r if k.startswith("gdro/count/bin_"))


def windowed(seeds: list[list[dict]], key: str, window: int, present_key: str | None = None) -> list[float]:
    """Mean of ``key`` over seeds and the steps of each window (steps where the bin is present)."""
    steps = max(len(s) for s in seeds)
    out = []
    for start in range(0, steps, window):
        vals = [
            r[key]
            for s in seeds
            for r in s[start : start + window]
            if key in r and (present_key is None or r.get(present_key, 0.0) > 0)
        ]
        out.append(float(np.mean(vals)) if vals else float("nan"))
    return out


def fmt(x: float, digits: int = 3) -> str:
    return "-" if not np.isfinite(x) else f"{x:+.{digits}f}" if digits > 3 else f"{x:.{digits}f}"


def loss_table(seeds: list[list[dict]], window: int) -> str:
    B = num_bins(seeds[0])
    steps = max(len(s) for s in seeds)
    head = "| steps | " + " | ".join(f"loss bin {b}" for b in range(B)) + " | " + " | ".join(
        f"failure bin {b}" for b in range(B)) + " |"
    rows = [head, "|---|" + "---|" * (2 * B)]
    loss = [windowed(seeds, f"gdro/loss/bin_{b}", window, f"gdro/count/bin_{b}") for b in range(B)]
    fail = [[1 - v for v in windowed(seeds, f"gdro/acc/bin_{b}", window, f"gdro/count/bin_{b}")] for b in range(B)]
    for w, start in enumerate(range(0, steps, window)):
        rows.append(f"| {start}-{min(start + window, steps) - 1} | "
                    + " | ".join(fmt(loss[b][w], 5) for b in range(B)) + " | "
                    + " | ".join(fmt(fail[b][w]) for b in range(B)) + " |")
    return "\n".join(rows)


def order_agreement(seeds: list[list[dict]]) -> tuple[float, float, int]:
    """(share of steps whose largest-loss bin is the hardest bin present, mean Spearman rho between
    bin loss and bin failure rate, steps counted): steps with >= 2 bins present."""
    hits, rhos, n = 0, [], 0
    for s in seeds:
        for r in s:
            bins = [b for b in range(num_bins(s)) if r.get(f"gdro/count/bin_{b}", 0) > 0 and f"gdro/loss/bin_{b}" in r]
            if len(bins) < 2:
                continue
            loss = np.array([r[f"gdro/loss/bin_{b}"] for b in bins])
            fail = np.array([1 - r[f"gdro/acc/bin_{b}"] for b in bins])
            n += 1
            hits += int(np.argmax(loss) == np.argmax(fail))
            if np.ptp(loss) > 0 and np.ptp(fail) > 0:
                rl = np.argsort(np.argsort(loss))
                rf = np.argsort(np.argsort(fail))
                rhos.append(float(np.corrcoef(rl, rf)[0, 1]))
    return (hits / n if n else float("nan")), (float(np.mean(rhos)) if rhos else float("nan")), n


def per_bin_path(seeds: list[list[dict]], name: str, window: int, digits: int = 3) -> str:
    B = num_bins(seeds[0])
    steps = max(len(s) for s in seeds)
    rows = ["| steps | " + " | ".join(f"bin {b}" for b in range(B)) + " |", "|---|" + "---|" * B]
    cols = [windowed(seeds, f"gdro/{name}/bin_{b}", window, f"gdro/count/bin_{b}") for b in range(B)]
    for w, start in enumerate(range(0, steps, window)):
        rows.append(f"| {start}-{min(start + window, steps) - 1} | " + " | ".join(fmt(cols[b][w], digits) for b in range(B)) + " |")
    return "\n".join(rows)


def release_arms(seeds: list[list[dict]]) -> str:
    """How often each class got each arm under release_as_run (steps with an allocation)."""
    counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    uniform = 0
    total = 0
    for s in seeds:
        for r in s:
            total += 1
            arms = {k.split("/")[-1]: int(v) for k, v in r.items() if k.startswith("gdro/release_arm/")}
            if not arms:
                uniform += 1
            for cls, arm in arms.items():
                counts[cls][arm] += 1
    rows = [f"Steps without a previous step's classes (n = 4 for all): {uniform} of {total}.", "",
            "| class | arm: steps |", "|---|---|"]
    for cls in sorted(counts):
        rows.append(f"| {cls} | " + ", ".join(f"n={a}: {c}" for a, c in sorted(counts[cls].items())) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--window", type=int, default=20)
    args = ap.parse_args()
    data = load(args.run)
    for method, seeds in data.items():
        print(f"## {method} ({len(seeds)} seeds)\n")
        print("Loss signal and failure rate per bin (mean over seeds and steps where the bin is present):\n")
        print(loss_table(seeds, args.window) + "\n")
        share, rho, n = order_agreement(seeds)
        print(f"Largest-loss bin = hardest bin on {share:.2f} of {n} steps with >= 2 bins; "
              f"mean Spearman rho(loss, failure rate) {rho:+.2f}.\n")
        print("Advantage multiplier per bin:\n")
        print(per_bin_path(seeds, "prompt_weight", args.window) + "\n")
        print("Rollouts per prompt per bin:\n")
        print(per_bin_path(seeds, "rollout_n", args.window, digits=2) + "\n")
        if any(k.startswith("gdro/release_arm/") for s in seeds for r in s for k in r):
            print(release_arms(seeds) + "\n")


if __name__ == "__main__":
    main()
