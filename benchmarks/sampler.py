"""Cost of the data adversary's draws: one :class:`~verl_gdro.step.sampler.PromptSampler` draw and one
controller update per step, against the training-set size (up to a million prompts).

    python benchmarks/sampler.py [--sizes 10000 100000 1000000] [--batch 256] [--reps 5]

Prints, per sampling mode and training-set size, the median wall time of a draw of ``--batch``
distinct prompts and of the controller's update that feeds the evidence (the step's visit), after a
warm-up of 20 steps so that every prompt's evidence array is in use. numpy only; one thread is
what a trainer's driver gives it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from verl_gdro.step.config import SAMPLING_MODES, resolve_gdro
from verl_gdro.step.controller import GDROController
from verl_gdro.step.sampler import PromptSampler


def measure(mode: str, size: int, batch: int, reps: int, n: int = 4) -> tuple[float, float]:
    """(median draw seconds, median update seconds) for one mode and training-set size."""
    ctrl = GDROController(resolve_gdro({"prompt": {"mode": mode}}), rollout_n=n)
    uids = np.arange(size, dtype=np.int64) * 7 + 3  # stable ids that are not row positions
    sampler = PromptSampler(ctrl, uids, seed=0)
    rng = np.random.default_rng(0)
    skill = rng.uniform(0, 1, size=size)
    draws, updates = [], []
    for i in range(20 + reps):
        t0 = time.perf_counter()
        rows = sampler.draw(batch)
        t1 = time.perf_counter()
        plan = ctrl.before_generation(uids[rows])
        group = np.repeat(plan.positions, plan.rollout_n)
        acc = (rng.random(group.size) < skill[rows[group]]).astype(float)
        t2 = time.perf_counter()
        ctrl.after_advantage(group, acc)
        t3 = time.perf_counter()
        if i >= 20:
            draws.append(t1 - t0)
            updates.append(t3 - t2)
    return statistics.median(draws), statistics.median(updates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"batch {args.batch}, median of {args.reps} steps after 20 warm-up steps")
    print("| mode | prompts | draw (ms) | update (ms) |")
    print("|---|---|---|---|")
    for mode in SAMPLING_MODES:
        for size in args.sizes:
            d, u = measure(mode, size, args.batch, args.reps)
            print(f"| {mode} | {size:,} | {1e3 * d:.1f} | {1e3 * u:.1f} |", flush=True)


if __name__ == "__main__":
    main()
