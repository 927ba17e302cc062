#!/usr/bin/env python3
"""Submit a Table 1 sweep (methods x models x seeds [x presets]) as SLURM jobs.

    python scripts/submit_sweep.py --partition gpu --seeds 0 1 2 --dry-run   # print the sbatch lines
    python scripts/submit_sweep.py --partition gpu --seeds 0 1 2              # submit them

Each job is scripts/slurm/ray_job.sbatch running recipes/<method>_qwen3_<model>.sh with SEED,
PRESET and TEMPLATE exported (through sbatch's environment, so values may contain commas), on the
recipe's node count, logging to logs/%x-%j.out (the folder is created before submitting). The GRPO baseline runs no adversary, so it is submitted once per
(model, seed, template), with the first preset (its run's name says which). Standard library only: runs on a login node.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
METHODS = ("grpo", "prompt_gdro", "rollout_gdro", "joint")
MODELS = ("1.7b", "4b", "8b")
PRESETS = ("robust", "paper", "release")
SBATCH = REPO / "scripts" / "slurm" / "ray_job.sbatch"
_NNODES = re.compile(r"^export NNODES=\$\{NNODES:-(\d+)\}$", re.MULTILINE)


def recipe_nodes(recipe: str) -> int:
    """The node count a recipe assumes: its ``NNODES`` default (recipes/<recipe>.sh), the one source."""
    path = REPO / "recipes" / f"{recipe}.sh"
    match = _NNODES.search(path.read_text(encoding="utf-8")) if path.is_file() else None
    if match is None:
        raise ValueError(f"recipes/{recipe}.sh has no 'export NNODES=${{NNODES:-N}}' line to take the node count from")
    return int(match.group(1))


@dataclass
class Job:
    """One ``sbatch`` call: its arguments, and the variables it exports to the job.

    The variables travel in sbatch's own environment with ``--export=ALL`` rather than as
    ``--export=K=V,...``: sbatch splits that list on commas, so ``LOGGER=[console,wandb]`` or a
    ``bin_edges=[0.4,0.75]`` override would not reach the job intact.
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None

    def shell(self) -> str:
        """The job as one copy-pasteable shell line: ``KEY=VALUE ... sbatch ...``."""
        return " ".join([*(shlex.quote(f"{k}={v}") for k, v in self.env.items()), shlex.join(self.argv)])


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
    log_dir: Path | None = None,
) -> list[Job]:
    """The sbatch calls of the sweep, one per job, in a stable order.

    Nodes per job: ``nodes[model]`` when given, else the recipe's own ``NNODES`` default. Each job
    writes its log to ``log_dir/%x-%j.out`` (``<repo>/logs``), a folder :func:`main` creates before
    it submits (sbatch opens the output file before the job's script runs).
    """
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
    log_dir = (REPO / "logs") if log_dir is None else Path(log_dir)
    jobs: list[Job] = []
    for model in models:
        for method in methods:
            for preset in presets[:1] if method == "grpo" else presets:
                for seed in seeds:
                    recipe = f"{method}_qwen3_{model}"
                    count = (nodes or {}).get(model) or recipe_nodes(recipe)
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
                        f"--nodes={count}",
                        f"--gpus-per-node={gpus_per_node}",
                        f"--time={time}",
                        f"--output={log_dir}/%x-%j.out",
                    ]
                    if partition:
                        cmd.append(f"--partition={partition}")
                    if account:
                        cmd.append(f"--account={account}")
                    cmd += ["--export=ALL", str(SBATCH)]
                    jobs.append(Job(cmd, exports, log_dir))
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
    p.add_argument("--nodes", nargs="*", default=[], metavar="MODEL=N",
                   help="e.g. 8b=4 (default: the recipe's NNODES, 1 / 1 / 2 for 1.7b / 4b / 8b)")
    p.add_argument("--time", default="72:00:00")
    p.add_argument("--extra-args", default="", help="Hydra overrides passed to every recipe (space-separated)")
    p.add_argument("--log-dir", default=str(REPO / "logs"), help="folder of the jobs' logs (created)")
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
        log_dir=Path(a.log_dir).resolve(),
    )
    for job in jobs:
        print(job.shell())
        if not a.dry_run:
            assert job.log_dir is not None
            job.log_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(job.argv, check=True, env={**os.environ, **job.env})
    print(f"# {len(jobs)} job(s) {'listed (dry run)' if a.dry_run else 'submitted'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
