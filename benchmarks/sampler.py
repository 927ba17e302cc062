"""Cost of the data adversary's draws: one :class:`~verl_gdro.step.sampler.PromptSampler` draw and one
controller update per step, against the training-set size (up to a million prompts); and the
verl driver's sampling time per step through the GDRO trainer's data loader in each fetch pattern
verl uses.

    python benchmarks/sampler.py [--sizes 10000 100000 1000000] [--batch 256] [--reps 5]
    python benchmarks/sampler.py --driver [--driver-size 1000000] [--batch 256] [--reps 5]

The first form prints, per sampling mode and training-set size, the median wall time of a draw of
``--batch`` distinct prompts and of the controller's update that feeds the evidence (the step's
visit), after a warm-up of 20 steps so that every prompt's evidence array is in use.

``--driver`` prints, for the default mode (``failure_weighted``) at ``--driver-size`` prompts, the
median time per step of fetching the step's prompts through ``GDROSampler`` and verl's
``StatefulDataLoader`` (an index dataset, so the time is the sampler's and the loader's own), with
a controller update between steps so that every step recomputes the probabilities:

- ``sync``: the loader's batch is the step (``gen_batch_size`` = ``train_batch_size``);
- ``async / DAPO``: ``gen_batch_size=1`` (verl's async modes, DAPO, ``sync_refill_failed_groups``),
  the step's call announced by the trainer (``begin_call``), prompts in flight excluded;
- ``DAPO + 2 refills``: the same plus two refill rounds of ``batch / 8`` prompts;
- ``one draw per prompt``: ``gen_batch_size=1`` without the announcement (what verl-gdro did before
  issue 31: an O(N) draw per prompt), timed over ``--legacy-reps`` steps (seconds each at 1M).

One thread is what a trainer's driver gives it.
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


def measure_driver(size: int, batch: int, reps: int, loader_batch: int, announce: bool, refills: int = 0,
                   n: int = 4) -> float:
    """Median seconds per step of fetching a step's prompts (and ``refills`` refill rounds of
    ``batch // 8``) through GDROSampler and a StatefulDataLoader of batch ``loader_batch``."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from verl_gdro.integration.sampler import GDROSampler

    ctrl = GDROController(resolve_gdro({"prompt": {"mode": "failure_weighted"}}), rollout_n=n)
    uids = np.arange(size, dtype=np.int64) * 7 + 3
    sampler = GDROSampler(uids, ctrl, mode="resample", seed=0, batch_size=loader_batch)
    loader = StatefulDataLoader(range(size), batch_size=loader_batch, sampler=sampler, num_workers=0,
                                drop_last=True, collate_fn=list)
    it = iter(loader)
    rng = np.random.default_rng(0)
    skill = rng.uniform(0, 1, size=size)
    times = []
    for i in range(3 + reps):
        held: list[np.ndarray] = []
        t0 = time.perf_counter()
        for count in [batch] + [batch // 8] * refills:
            if announce:
                sampler.begin_call(count, np.concatenate(held) if held else ())
            try:
                rows = np.array([r for _ in range(count // loader_batch) for r in next(it)], dtype=np.int64)
            except StopIteration:  # an epoch ended at the call boundary (verl re-iterates)
                it = iter(loader)
                rows = np.array([r for _ in range(count // loader_batch) for r in next(it)], dtype=np.int64)
            held.append(uids[rows])
        elapsed = time.perf_counter() - t0
        drawn = np.concatenate(held)
        plan = ctrl.before_generation(drawn)
        group = np.repeat(plan.positions, plan.rollout_n)
        ctrl.after_advantage(group, (rng.random(group.size) < skill[(drawn[group] - 3) // 7]).astype(float))
        if i >= 3:
            times.append(elapsed)
    return statistics.median(times)


def driver(args: argparse.Namespace) -> None:
    size, batch = args.driver_size, args.batch
    print(f"failure_weighted, {size:,} prompts, train_batch_size {batch}; median of {args.reps} steps "
          f"({args.legacy_reps} for one draw per prompt) after 3 warm-up steps")
    print("| fetch pattern | gen_batch_size | driver sampling time per step (ms) |")
    print("|---|---|---|")
    rows = [("sync", batch, True, 0, args.reps), ("async / DAPO", 1, True, 0, args.reps),
            ("DAPO + 2 refills", 1, True, 2, args.reps), ("one draw per prompt (before)", 1, False, 0, args.legacy_reps)]
    for name, loader_batch, announce, refills, reps in rows:
        t = measure_driver(size, batch, reps, loader_batch, announce, refills)
        print(f"| {name} | {loader_batch} | {1e3 * t:.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--driver", action="store_true", help="time the trainer's data-loader path per fetch pattern")
    ap.add_argument("--driver-size", type=int, default=1_000_000)
    ap.add_argument("--legacy-reps", type=int, default=2)
    args = ap.parse_args()
    if args.driver:
        driver(args)
        return
    print(f"batch {args.batch}, median of {args.reps} steps after 20 warm-up steps")
    print("| mode | prompts | draw (ms) | update (ms) |")
    print("|---|---|---|---|")
    for mode in SAMPLING_MODES:
        for size in args.sizes:
            d, u = measure(mode, size, args.batch, args.reps)
            print(f"| {mode} | {size:,} | {1e3 * d:.1f} | {1e3 * u:.1f} |", flush=True)


if __name__ == "__main__":
    main()
