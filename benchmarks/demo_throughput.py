"""Rollouts per second of the CPU demo's RL loop (training steps: sample, score, advantage, update).

Run it with one torch thread on an otherwise quiet machine. ``--repo`` points the import at another
checkout of verl-gdro (e.g. an older commit in a git worktree) so two versions of the loop are
timed side by side by the same script in one session::

    python benchmarks/demo_throughput.py                        # this checkout, its default testbed
    python benchmarks/demo_throughput.py --repo /tmp/old-gdro   # an older checkout, its own defaults

Each configuration trains ``--steps`` timed GRPO steps after 2 untimed ones, from the cached warm
start, and prints rollouts/s (training rollouts only; evaluation is excluded).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=None, help="import verl_gdro from this checkout instead")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="DemoConfig overrides")
    args = ap.parse_args()
    if args.repo:
        sys.path.insert(0, str(Path(args.repo).resolve()))
    import torch

    import verl_gdro
    from verl_gdro.demo import task as task_mod
    from verl_gdro.demo.config import DemoConfig
    from verl_gdro.demo.tokenizer import CharTokenizer
    from verl_gdro.demo.train import MethodRun, warm_start

    torch.set_num_threads(1)
    # the development task with its own settings, as `verl-gdro demo` runs it (older checkouts: the plain config)
    cfg = getattr(DemoConfig, "for_task", DemoConfig)()
    over = {}
    for item in args.set:
        key, _, value = item.partition("=")
        kind = type(getattr(cfg, key))
        over[key] = kind(float(value)) if kind is int else kind(value)
    cfg = replace(cfg, **over)
    tok = CharTokenizer()
    if hasattr(cfg, "task"):
        train = task_mod.make_train_set(cfg.train_size, seed=0, task=cfg.task)
    else:  # a checkout from before the task families
        train = task_mod.make_train_set(cfg.train_size, seed=0)
    tag = Path(verl_gdro.__file__).resolve().parent.parent.name
    state = warm_start(cfg, tok, Path("runs") / f"bench_throughput_{tag}" / "warm_start.pt", log=lambda m: None)
    run = MethodRun("grpo", 0, cfg, tok, train, state)
    for _ in range(2):
        run.train_step()
    r0, t0 = run.rollouts, time.perf_counter()
    for _ in range(args.steps):
        run.train_step()
    dt = time.perf_counter() - t0
    print(
        f"{tag}: batch {cfg.batch_prompts} x n {cfg.n_mean}, "
        f"mini_batches {cfg.mini_batches}, kl_coef {cfg.kl_coef}: {(run.rollouts - r0) / dt:.0f} rollouts/s "
        f"({dt / args.steps * 1000:.0f} ms/step over {args.steps} steps)"
    )


if __name__ == "__main__":
    main()
