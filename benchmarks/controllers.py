#!/usr/bin/env python
"""Per-step cost and state size of the verl-gdro controllers (issue 2; scale part of issue 6).

What it measures, all in one process on synthetic steps (numpy only, no verl, no torch):

1. Per-step time of each controller on steps of 256 x 4 and 512 x 4 responses, and of 256 / 512
   prompts whose n varies in 2..12 (mean 4, as Rollout-GDRO allocates them):
   - classifier: ``bins(uids)`` + ``observe(uids, successes, n)`` over a 14,116-prompt dataset
     (the size of DAPO-Math-17k);
   - Prompt-GDRO: ``multipliers(response bins)`` + ``update(prompt bins, losses)``;
   - Rollout-GDRO: ``allocate(bins)`` + ``update(bins, n, successes, losses)`` for the bandit with
     MAP selection (robust preset), the bandit with sampled selection and played-arm utility
     (paper-style exploration) and the Neyman allocator;
   - ``solve_exact_budget`` on 10 bins x 11 arms x a budget of 4096 (target: < 5 ms).
2. The classifier at scale (10k, 1M and 10M seen prompts; ``--quick``: 10k and 200k): fill time,
   per-step time (must stay flat in the number of seen prompts), allocated memory and state bytes
   per prompt, checkpoint size (``np.savez``), save time (``state_dict`` + ``np.savez``) and load
   time (``np.load`` + ``load_state_dict``); also pickle of the state dict. Each prompt gets
   ``--visits`` visits (default 2: a 1M-prompt dataset is seen about once or twice in a run); the
   worst case, every ring full (``window`` = 100 visits per prompt), is measured at 1M prompts
   (``--quick``: 50k).

Prints one table per part and, last, one JSON line with every number. Times are medians over
repeated steps, in milliseconds unless the column says seconds.

    python benchmarks/controllers.py            # full run (~a few minutes, ~4 GB RAM at 10M)
    python benchmarks/controllers.py --quick    # ~20 s, for CI
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verl_gdro.allocators import RolloutGDRO
from verl_gdro.classifier import OnlineDifficultyClassifier
from verl_gdro.prompt_gdro import PromptGDRO
from verl_gdro.rollout_gdro import solve_exact_budget

NUM_BINS = 10
DATASET = 14_116  # DAPO-Math-17k (en) rows
DP_TARGET_MS = 5.0


def step_times_ms(fn: Callable[[int], Any], repeats: int, warmup: int = 3) -> np.ndarray:
    """Wall time of each ``fn(i)`` in ms after ``warmup`` untimed calls; ``i`` picks the step."""
    for i in range(warmup):
        fn(i)
    times = np.empty(repeats)
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(warmup + i)
        times[i] = time.perf_counter() - t0
    return 1e3 * times


def median_ms(fn: Callable[[int], Any], repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``fn(i)`` in ms."""
    return float(np.median(step_times_ms(fn, repeats, warmup)))


class SyntheticTask:
    """Prompts with fixed true pass rates (a heavy tail of hard prompts), sampled per step."""

    def __init__(self, num_prompts: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.num_prompts = num_prompts
        self.true_p = self.rng.beta(0.5, 1.0, num_prompts)

    def batch(self, size: int) -> np.ndarray:
        return self.rng.choice(self.num_prompts, size, replace=False).astype(np.int64)

    def successes(self, uids: np.ndarray, n: np.ndarray) -> np.ndarray:
        return self.rng.binomial(n, self.true_p[uids % self.num_prompts])


# ---------------------------------------------------------------------------------------------
# Part 1: per-step time at realistic batch shapes
# ---------------------------------------------------------------------------------------------


def random_allocation(bins: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per-prompt n in 2..12, constant within a bin, summing to exactly 4 per prompt."""
    present, inverse, counts = np.unique(bins, return_inverse=True, return_counts=True)
    arms = np.arange(2, 13)
    log_probs = np.log(rng.dirichlet(np.full(arms.size, 0.3), present.size) + 1e-12)
    per_bin = solve_exact_budget(log_probs, counts, arms, int(4 * bins.size))
    return per_bin[inverse].astype(np.int64)


@dataclass
class Steps:
    """Pre-generated synthetic steps, so the timed calls contain controller work only."""

    prompts: int
    batches: list[np.ndarray]
    bins: list[np.ndarray]
    ns: list[np.ndarray]
    successes: list[np.ndarray]
    losses: list[np.ndarray]


def classifier_step(clf: OnlineDifficultyClassifier, steps: Steps) -> Callable[[int], None]:
    def step(i: int) -> None:
        clf.bins(steps.batches[i])
        clf.observe(steps.batches[i], steps.successes[i], steps.ns[i])

    return step


def prompt_step(ctrl: PromptGDRO, steps: Steps) -> Callable[[int], None]:
    def step(i: int) -> None:
        ctrl.multipliers(np.repeat(steps.bins[i], steps.ns[i]))  # one entry per response
        ctrl.update(steps.bins[i], steps.losses[i])

    return step


def rollout_step(ctrl: RolloutGDRO, steps: Steps) -> Callable[[int], None]:
    def step(i: int) -> None:
        n = ctrl.allocate(steps.bins[i])
        assert int(n.sum()) == 4 * steps.prompts
        ctrl.update(steps.bins[i], n, np.minimum(steps.successes[i], n), steps.losses[i])

    return step


def make_steps(prompts: int, n_kind: str, count: int) -> tuple[OnlineDifficultyClassifier, Steps]:
    task = SyntheticTask(DATASET, seed=prompts)
    # A warmed-up classifier: every dataset prompt already seen a few times.
    clf = OnlineDifficultyClassifier()
    uids = np.arange(DATASET, dtype=np.int64)
    for _ in range(3):
        clf.observe(uids, task.successes(uids, np.full(DATASET, 4)), np.full(DATASET, 4))
    batches = [task.batch(prompts) for _ in range(count)]
    bins = [clf.bins(u) for u in batches]
    if n_kind == "4":
        ns = [np.full(prompts, 4, dtype=np.int64) for _ in batches]
    else:
        # Variable n, one value per bin (as Rollout-GDRO hands it out) and mean exactly 4:
        # the exact-budget solver on random, peaked arm scores spreads the bins over 2..12.
        ns = [random_allocation(b, task.rng) for b in bins]
    successes = [task.successes(u, n) for u, n in zip(batches, ns)]
    losses = [1.0 - s / n for s, n in zip(successes, ns)]
    return clf, Steps(prompts, batches, bins, ns, successes, losses)


def step_shapes(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for prompts, n_kind in [(256, "4"), (512, "4"), (256, "2..12"), (512, "2..12")]:
        clf, steps = make_steps(prompts, n_kind, repeats + 3)
        row = {
            "prompts": prompts,
            "n": n_kind,
            "n_range": f"{min(int(n.min()) for n in steps.ns)}..{max(int(n.max()) for n in steps.ns)}",
            "responses": int(np.mean([n.sum() for n in steps.ns])),
            "classifier_ms": median_ms(classifier_step(clf, steps), repeats),
            "prompt_gdro_ms": median_ms(prompt_step(PromptGDRO(NUM_BINS), steps), repeats),
            "rollout_bandit_map_ms": median_ms(rollout_step(RolloutGDRO(NUM_BINS), steps), repeats),
            "rollout_bandit_sample_ms": median_ms(
                rollout_step(RolloutGDRO(NUM_BINS, arm_utility="informative", selection="sample"), steps),
                repeats,
            ),
            "rollout_neyman_ms": median_ms(
                rollout_step(RolloutGDRO(NUM_BINS, allocator="neyman"), steps), repeats
            ),
        }
        row["stack_ms"] = row["classifier_ms"] + row["prompt_gdro_ms"] + row["rollout_bandit_map_ms"]
        rows.append(row)
    return rows


def dp_benchmark(repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    arms = np.arange(2, 13)
    counts = rng.multinomial(1024 - NUM_BINS, np.full(NUM_BINS, 1 / NUM_BINS)) + 1
    budget = int(4 * counts.sum())
    problems = [np.log(rng.dirichlet(np.ones(arms.size), NUM_BINS)) for _ in range(repeats + 3)]

    def solve(i: int) -> None:
        n = solve_exact_budget(problems[i], counts, arms, budget)
        assert int((counts * n).sum()) == budget

    times = step_times_ms(solve, repeats)
    return {
        "bins": NUM_BINS,
        "arms": int(arms.size),
        "budget": budget,
        "ms": float(np.median(times)),
        "min_ms": float(times.min()),
        "target_ms": DP_TARGET_MS,
    }


# ---------------------------------------------------------------------------------------------
# Part 2: the classifier at scale
# ---------------------------------------------------------------------------------------------


def fill(clf: OnlineDifficultyClassifier, num_prompts: int, visits: int, rng: np.random.Generator) -> float:
    """Observe ``visits`` visits of every prompt (sparse uids), in chunks of 1M; returns seconds."""
    t0 = time.perf_counter()
    chunk = 1_000_000
    for _ in range(visits):
        for start in range(0, num_prompts, chunk):
            uids = np.arange(start, min(num_prompts, start + chunk), dtype=np.int64) * 7919 + 11
            trials = np.full(uids.size, 4, dtype=np.int64)
            clf.observe(uids, rng.binomial(trials, 0.3), trials)
    return time.perf_counter() - t0


def scale_row(
    num_prompts: int, visits: int, step_prompts: int, repeats: int, workdir: Path
) -> dict[str, Any]:
    rng = np.random.default_rng(num_prompts + visits)
    clf = OnlineDifficultyClassifier()
    fill_s = fill(clf, num_prompts, visits, rng)

    batches = [
        rng.choice(num_prompts, step_prompts, replace=False).astype(np.int64) * 7919 + 11
        for _ in range(repeats + 3)
    ]

    def step(i: int) -> None:
        clf.bins(batches[i])
        n = np.full(step_prompts, 4, dtype=np.int64)
        clf.observe(batches[i], rng.binomial(n, 0.3), n)

    # The first steps give some prompts a 3rd visit, which widens every ring (a growth event,
    # amortised O(1) per stored cell but one long step): report it apart from the median.
    times = step_times_ms(step, repeats + 3, warmup=0)
    first_step_ms = float(times[0])
    step_ms, step_max_ms = float(np.median(times[3:])), float(times[3:].max())

    ckpt = checkpoint_times(clf, batches[0], workdir / f"clf_{num_prompts}_{visits}.npz")
    return {
        "seen_prompts": clf.num_seen,
        "visits_per_prompt": visits,
        "fill_s": fill_s,
        "step_prompts": step_prompts,
        "first_step_ms": first_step_ms,
        "step_ms": step_ms,
        "step_max_ms": step_max_ms,
        "memory_bytes_per_prompt": clf.memory_bytes() / clf.num_seen,
        "state_bytes_per_prompt": ckpt.pop("state_bytes") / clf.num_seen,
        **ckpt,
    }


def checkpoint_times(clf: OnlineDifficultyClassifier, probe: np.ndarray, path: Path) -> dict[str, float]:
    """Save and load the classifier's state as verl's checkpoint does (``np.savez``) and by pickle;
    the restored classifier must give the same estimates and bins."""
    t0 = time.perf_counter()
    state = clf.state_dict()
    t1 = time.perf_counter()
    np.savez(path, **state)
    t2 = time.perf_counter()
    state_bytes = sum(np.asarray(v).nbytes for v in state.values())
    del state
    with np.load(path) as f:
        loaded = dict(f)
    t3 = time.perf_counter()
    restored = OnlineDifficultyClassifier()
    restored.load_state_dict(loaded)
    t4 = time.perf_counter()
    assert np.array_equal(restored.pass_at_k(probe), clf.pass_at_k(probe), equal_nan=True)
    assert np.array_equal(restored.bins(probe), clf.bins(probe))
    ckpt_bytes = path.stat().st_size
    path.unlink()
    del loaded, restored

    pkl = path.with_name("clf.pkl")
    t5 = time.perf_counter()
    with open(pkl, "wb") as f:
        pickle.dump(clf.state_dict(), f, protocol=pickle.HIGHEST_PROTOCOL)
    with open(pkl, "rb") as f:
        OnlineDifficultyClassifier().load_state_dict(pickle.load(f))
    t7 = time.perf_counter()
    pkl.unlink()
    return {"state_bytes": state_bytes, "checkpoint_mb": ckpt_bytes / 2**20, "state_dict_s": t1 - t0,
            "savez_s": t2 - t1, "npload_s": t3 - t2, "load_state_dict_s": t4 - t3, "save_load_s": t4 - t0,
            "pickle_save_load_s": t7 - t5}


# ---------------------------------------------------------------------------------------------


def print_table(title: str, rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> None:
    print(f"\n{title}")
    header = " | ".join(label for _, label, _ in columns)
    print(f"| {header} |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        cells = [format(row[key], fmt) if fmt else str(row[key]) for key, _, fmt in columns]
        print(f"| {' | '.join(cells)} |")


STEP_COLUMNS = [
    ("prompts", "prompts", ""),
    ("n", "n", ""),
    ("n_range", "n seen", ""),
    ("responses", "responses", ""),
    ("classifier_ms", "classifier bins+observe", ".3f"),
    ("prompt_gdro_ms", "PromptGDRO multipliers+update", ".3f"),
    ("rollout_bandit_map_ms", "RolloutGDRO bandit/map", ".3f"),
    ("rollout_bandit_sample_ms", "RolloutGDRO bandit/sample", ".3f"),
    ("rollout_neyman_ms", "RolloutGDRO neyman", ".3f"),
    ("stack_ms", "all three (classifier + PromptGDRO + bandit/map)", ".3f"),
]
SCALE_COLUMNS = [
    ("seen_prompts", "seen prompts", ","),
    ("visits_per_prompt", "visits each", ""),
    ("fill_s", "fill s", ".2f"),
    ("first_step_ms", "first step ms", ".1f"),
    ("step_ms", "median step ms", ".3f"),
    ("step_max_ms", "max later step ms", ".1f"),
    ("step_vs_first", "median step vs first row", ".2f"),
    ("memory_bytes_per_prompt", "RAM B/prompt", ".1f"),
    ("state_bytes_per_prompt", "state B/prompt", ".1f"),
    ("checkpoint_mb", "npz MiB", ".1f"),
    ("state_dict_s", "state_dict", ".3f"),
    ("savez_s", "savez", ".3f"),
    ("npload_s", "np.load", ".3f"),
    ("load_state_dict_s", "load_state_dict", ".3f"),
    ("save_load_s", "save+load", ".3f"),
    ("pickle_save_load_s", "pickle save+load", ".3f"),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (CI)")
    parser.add_argument("--visits", type=int, default=2, help="visits per prompt in the scale runs")
    parser.add_argument(
        "--scale",
        type=int,
        nargs="*",
        default=None,
        help="seen-prompt counts (default 1e4 1e6 1e7; quick 1e4 2e5)",
    )
    parser.add_argument(
        "--full-window-prompts", type=int, default=None, help="prompts for the full-ring case"
    )
    return parser.parse_args(argv)


def scale_rows(args: argparse.Namespace, repeats: int) -> list[dict[str, Any]]:
    """The classifier at each seen-prompt count (2 visits each), then one full-ring case."""
    scale = (
        args.scale
        if args.scale is not None
        else ([10_000, 200_000] if args.quick else [10_000, 1_000_000, 10_000_000])
    )
    full_window = (
        args.full_window_prompts
        if args.full_window_prompts is not None
        else (50_000 if args.quick else 1_000_000)
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="gdro-bench-") as tmp:
        for num in scale:
            rows.append(scale_row(num, args.visits, 512, repeats, Path(tmp)))
        if full_window:
            rows.append(scale_row(full_window, 100, 512, repeats, Path(tmp)))
    base = rows[0]["step_ms"]
    for row in rows:
        row["step_vs_first"] = row["step_ms"] / base
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repeats = 10 if args.quick else 50
    print(
        f"verl-gdro controllers benchmark  python {platform.python_version()}  numpy {np.__version__}  "
        f"cpus {os.cpu_count()}  load average {os.getloadavg()[0]:.1f}  {'--quick' if args.quick else 'full'}"
    )
    results: dict[str, Any] = {"quick": args.quick, "load_average_start": os.getloadavg()[0]}
    results["step"] = rows = step_shapes(repeats)
    print_table(
        "Per-step time (ms, median) at realistic step shapes; classifier over a 14,116-prompt dataset",
        rows, STEP_COLUMNS,
    )
    results["solve_exact_budget"] = dp = dp_benchmark(repeats * 2)
    verdict = "OK" if dp["ms"] < DP_TARGET_MS else "OVER TARGET"
    print(
        f"\nsolve_exact_budget: {dp['bins']} bins x {dp['arms']} arms x budget {dp['budget']}: "
        f"{dp['ms']:.3f} ms median, {dp['min_ms']:.3f} ms min (target < {DP_TARGET_MS} ms for the median: {verdict})"
    )
    results["scale"] = scaled = scale_rows(args, repeats)
    print_table(
        "Classifier at scale (window 100; step = bins + observe of 512 prompts; times in s unless ms)",
        scaled, SCALE_COLUMNS,
    )
    results["load_average_end"] = os.getloadavg()[0]
    print(f"\nload average at the end: {results['load_average_end']:.1f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
