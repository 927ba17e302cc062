#!/usr/bin/env python3
"""Submit a Table 1 sweep (methods x models x seeds [x presets]) as SLURM jobs.

    python scripts/submit_sweep.py --partition gpu --seeds 0 1 2 --dry-run   # print the sbatch lines
    python scripts/submit_sweep.py --partition gpu --seeds 0 1 2              # submit them

Each job is scripts/slurm/ray_job.sbatch running recipes/<method>_qwen3_<model>.sh with SEED,
PRESET and TEMPLATE exported. The GRPO baseline ignores the preset, so it is submitted once per
(model, seed, template), not once per preset. Standard library only: runs on a login node.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
METHODS = ("grpo", "prompt_gdro", "rollout_gdro", "joint")
MODELS = ("1.7b", "4b", "8b")
PRESETS = ("robust", "paper")
# Nodes of 8 x 80 GB GPUs per model (the recipes' defaults; docs/reproduce.md has the timings).
DEFAULT_NODES = {"1.7b": 1, "4b": 1, "8b": 2}


def build_jobs(
    methods: list[str],
    models: list[str],
    seeds: list[int],
    presets: list[str],
    template: str = "answer",
    partition: str | None = None,
    account: str | None = None,
    gpus_per_node: int = 8,
    nodes: dict[str, int] | None = None,
    time: str = "72:00:00",
    extra_args: str = "",
    env: dict[str, str] | None = None,
) -> list[list[str]]:
    """The sbatch command lines of the sweep, one per job, in a stable order."""
    for name, given, allowed in (
        ("--methods", methods, METHODS),
        ("--models", models, MODELS),
        ("--presets", presets, PRESETS),
    ):
        bad = [x for x in given if x not in allowed]
        if bad or not given:
            raise ValueError(f"{name}={given} is invalid; allowed (non-empty): {list(allowed)}")
    if not seeds:
        raise ValueError("--seeds must name at least one seed")
    node_map = {**DEFAULT_NODES, **(nodes or {})}
    jobs: list[list[str]] = []
    for model in models:
        for method in methods:
            for preset in presets[:1] if method == "grpo" else presets:
                for seed in seeds:
                    recipe = f"{method}_qwen3_{model}"
                    exports = {
                        "RECIPE": recipe,
                        "SEED": str(seed),
                        "PRESET": preset,
                        "TEMPLATE": template,
                        "REPO_DIR": str(REPO),
                        **(env or {}),
                    }
                    if extra_args:
                        exports["EXTRA_ARGS"] = extra_args
                    tag = recipe if method == "grpo" else f"{recipe}_{preset}"
                    cmd = [
                        "sbatch",
                        f"--job-name=gdro_{tag}_s{seed}",
                        f"--nodes={node_map[model]}",
                        f"--gpus-per-node={gpus_per_node}",
                        f"--time={time}",
                    ]
                    if partition:
                        cmd.append(f"--partition={partition}")
                    if account:
                        cmd.append(f"--account={account}")
                    # sbatch's --export is comma-separated: values must not contain commas.
                    for k, v in exports.items():
                        if "," in v:
                            raise ValueError(f"{k}={v!r}: sbatch --export values cannot contain ','")
                    cmd.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in exports.items()))
                    cmd.append(str(REPO / "scripts" / "slurm" / "ray_job.sbatch"))
                    jobs.append(cmd)
    return jobs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=["grpo", "prompt_gdro", "rollout_gdro"])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--presets", nargs="+", default=["robust"])
    p.add_argument("--template", default="answer", choices=["answer", "boxed"])
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes", nargs="*", default=[], metavar="MODEL=N", help="e.g. 8b=4")
    p.add_argument("--time", default="72:00:00")
    p.add_argument("--extra-args", default="", help="Hydra overrides passed to every recipe (no commas)")
    p.add_argument(
        "--env",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more exports, e.g. DATA_DIR=/data/verl_gdro OUTPUT_DIR=/ckpt",
    )
    p.add_argument("--dry-run", action="store_true", help="print the sbatch commands, submit nothing")
    return p.parse_args(argv)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"{what} expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    """Print or submit the sweep."""
    a = parse_args(argv)
    jobs = build_jobs(
        a.methods,
        a.models,
        a.seeds,
        a.presets,
        template=a.template,
        partition=a.partition,
        account=a.account,
        gpus_per_node=a.gpus_per_node,
        nodes={k: int(v) for k, v in _pairs(a.nodes, "--nodes").items()},
        time=a.time,
        extra_args=a.extra_args,
        env=_pairs(a.env, "--env"),
    )
    for cmd in jobs:
        print(shlex.join(cmd))
        if not a.dry_run:
            subprocess.run(cmd, check=True)
    print(f"# {len(jobs)} job(s) {'listed (dry run)' if a.dry_run else 'submitted'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
