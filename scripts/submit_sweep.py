#!/usr/bin/env python3
"""Submit a Table 1 sweep (methods x models x seeds [x presets]) as SLURM jobs.

    python scripts/submit_sweep.py --partition gpu --seeds 0 1 2 --dry-run   # validate, print the sbatch lines
    python scripts/submit_sweep.py --partition gpu --seeds 0 1 2              # validate, submit them

Every job is validated first by its recipe's dry run (``DRY_RUN=1``, with the job's variables and
node count, all jobs in one ``python -m verl_gdro.dryrun --each`` process; needs verl and
verl-gdro in ``--python``); one refusal submits nothing.

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


def _check_choices(methods: list[str], models: list[str], seeds: list[int], presets: list[str]) -> None:
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
    _check_choices(methods, models, seeds, presets)
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


def build_parser() -> argparse.ArgumentParser:
    """Command-line options, each with its help."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=["grpo", "prompt_gdro", "rollout_gdro"], choices=METHODS,
                   help="methods to run (default: grpo prompt_gdro rollout_gdro)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS, help="model sizes (default: all)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="seeds, one job each (default: 0)")
    p.add_argument("--presets", nargs="+", default=["robust"], choices=PRESETS,
                   help="gdro presets of the GDRO methods (default: robust; GRPO runs once, with the first)")
    p.add_argument("--template", default="answer", choices=["answer", "boxed"], help="prompt template and scorer")
    p.add_argument("--partition", default=None, help="sbatch --partition")
    p.add_argument("--account", default=None, help="sbatch --account")
    p.add_argument("--gpus-per-node", type=_positive, default=8, help="GPUs per node (default: 8)")
    p.add_argument("--nodes", nargs="*", default=[], metavar="MODEL=N",
                   help="e.g. 8b=4 (default: the recipe's NNODES, 1 / 1 / 2 for 1.7b / 4b / 8b)")
    p.add_argument("--time", default="72:00:00", help="sbatch --time (default: 72:00:00)")
    p.add_argument("--extra-args", default="", help="Hydra overrides passed to every recipe (space-separated)")
    p.add_argument("--log-dir", default=str(REPO / "logs"), help="folder of the jobs' logs (created)")
    p.add_argument(
        "--env",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more exports, e.g. DATA_DIR=/data/verl_gdro OUTPUT_DIR=/ckpt",
    )
    p.add_argument("--dry-run", action="store_true", help="validate and print the sbatch commands, submit nothing")
    p.add_argument("--no-validate", action="store_true",
                   help="skip each job's recipe dry run (by default every job is validated before any is submitted)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter with verl and verl-gdro for the validation (default: this one)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    return build_parser().parse_args(argv)


def _positive(text: str) -> int:
    """verl_gdro.errors.positive_int's rule, kept here: this script is standard library only (login nodes)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is invalid: must be an integer >= 1")
    return value


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"{what} expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def _nodes(items: list[str]) -> dict[str, int]:
    out = {}
    for model, count in _pairs(items, "--nodes").items():
        if model not in MODELS or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--nodes {model}={count} is invalid: expects MODEL=N with MODEL in {list(MODELS)}, N >= 1")
        out[model] = int(count)
    return out


def recipe_dry_run_argv(job: Job, capture: Path) -> list[str]:
    """The arguments the job's recipe gives its dry run (``DRY_RUN=1``, the job's variables and node
    count), read with a stand-in interpreter that records them: shell only, no verl."""
    nodes = next(a.split("=", 1)[1] for a in job.argv if a.startswith("--nodes="))
    gpus = next(a.split("=", 1)[1] for a in job.argv if a.startswith("--gpus-per-node="))
    out = capture.parent / "argv"
    env = {**os.environ, **job.env, "DRY_RUN": "1", "PYTHON": str(capture), "ARGV_OUT": str(out), "NNODES": nodes,
           "GPUS_PER_NODE": gpus}
    cmd = ["bash", str(REPO / "recipes" / f"{job.env['RECIPE']}.sh"), *job.env.get("EXTRA_ARGS", "").split()]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    argv = out.read_text(encoding="utf-8").split("\0")[:-1]
    assert argv[:2] == ["-m", "verl_gdro.dryrun"], argv
    return argv[2:]


def validate_jobs(jobs: list[Job], python: str) -> list[tuple[Job, str]]:
    """Each job's recipe dry run, as the sbatch script runs it before starting Ray, all in one
    ``python -m verl_gdro.dryrun --each`` process; returns the refused jobs with their one line."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        capture = Path(tmp) / "capture"
        capture.write_text('#!/usr/bin/env bash\nfor a in "$@"; do printf "%s\\0" "$a"; done > "$ARGV_OUT"\n')
        capture.chmod(0o755)
        listing = Path(tmp) / "jobs.jsonl"
        listing.write_text("".join(json.dumps(recipe_dry_run_argv(job, capture)) + "\n" for job in jobs))
        res = subprocess.run([python, "-m", "verl_gdro.dryrun", "--each", str(listing)], capture_output=True,
                             text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    refused = [line.split("\t", 1) for line in res.stdout.splitlines() if "\t" in line]
    if res.returncode not in (0, 2) or (res.returncode == 2 and not refused):
        tail = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        raise RuntimeError(f"--python {python}: the validation did not run: {tail}")
    return [(jobs[int(number)], reason) for number, reason in refused]


def main(argv: list[str] | None = None) -> int:
    """Validate, then print or submit the sweep."""
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        jobs = build_jobs(
            a.methods,
            a.models,
            a.seeds,
            a.presets,
            template=a.template,
            partition=a.partition,
            account=a.account,
            gpus_per_node=a.gpus_per_node,
            nodes=_nodes(a.nodes),
            time=a.time,
            extra_args=a.extra_args,
            env=_pairs(a.env, "--env"),
            log_dir=Path(a.log_dir).resolve(),
        )
    except ValueError as e:
        parser.error(str(e))  # one line, exit 2
    refused = [] if a.no_validate else validate_jobs(jobs, a.python)
    for job, reason in refused:
        name = next(x for x in job.argv if x.startswith("--job-name=")).split("=", 1)[1]
        print(f"submit_sweep.py: error: job {name}: {reason}; nothing submitted", file=sys.stderr)
    if refused:
        return 2
    for job in jobs:
        print(job.shell())
        if not a.dry_run:
            assert job.log_dir is not None
            job.log_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(job.argv, check=True, env={**os.environ, **job.env})
    checked = "validated, " if not a.no_validate else ""
    print(f"# {len(jobs)} job(s) {checked}{'listed (dry run)' if a.dry_run else 'submitted'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
