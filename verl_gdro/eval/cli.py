"""``verl-gdro eval``: Table 1 (mean@8 per benchmark, pooled pass@8) from validation dumps.

    verl-gdro eval --run GRPO=ckpts/grpo_4b/val_generations \\
                   --run Prompt-GDRO=ckpts/pgdro_4b/val_generations \\
                   --baseline GRPO --paper-model 4B --out table1_4b.md

Each ``--run NAME=PATH`` is a verl ``trainer.validation_data_dir`` (the latest ``<step>.jsonl``
unless ``--step``) or one JSONL file, e.g. from :mod:`verl_gdro.eval.vllm_eval`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from verl_gdro.eval.generations import group_by_prompt, read_dump
from verl_gdro.eval.metrics import RunResult, score_run
from verl_gdro.eval.table import PAPER_TABLE1, detail_table, markdown_table


def _parse_run(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not (sep and name and path):
        raise argparse.ArgumentTypeError(f"--run expects NAME=PATH, got {text!r}")
    return name, path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", action="append", type=_parse_run, required=True, metavar="NAME=PATH",
                        help="a run: its validation_data_dir or a dump JSONL (repeatable)")
    parser.add_argument("--baseline", default=None, help="run NAME the relative gains are computed against")
    parser.add_argument("--k", type=int, default=8, help="k of mean@k / pass@k (default 8, the paper's)")
    parser.add_argument("--n-expected", type=int, default=None,
                        help="samples per prompt; prompts with fewer are padded with failures (default k)")
    parser.add_argument("--step", default="latest", help="global step of the dump to read (default: latest)")
    parser.add_argument("--val-files", nargs="*", default=None,
                        help="validation parquet files, to map prompts when the dump has no data_source")
    parser.add_argument("--paper-model", choices=sorted(PAPER_TABLE1), default=None,
                        help="print the paper's rows for this model size above yours")
    parser.add_argument("--details", action="store_true", help="also print per-benchmark counts and pass@k")
    parser.add_argument("--out", default=None, help="write the Markdown table here")
    parser.add_argument("--json", default=None, help="write all numbers as JSON here")


def evaluate_runs(
    runs: list[tuple[str, str]], k: int = 8, step: str = "latest", val_files: list[str] | None = None,
    n_expected: int | None = None,
) -> dict[str, RunResult]:
    """Score every ``(name, path)`` run."""
    out: dict[str, RunResult] = {}
    for name, path in runs:
        if name in out:
            raise ValueError(f"--run name {name!r} is given twice")
        samples = read_dump(path, step=step, val_files=val_files)
        out[name] = score_run(group_by_prompt(samples), k=k, n_expected=n_expected)
    return out


def main(args: argparse.Namespace) -> int:
    """Print (and optionally write) the Table 1 Markdown."""
    from verl_gdro.errors import usage_errors

    with usage_errors(FileNotFoundError):  # a missing dump or a malformed one: one line, exit 2
        results = evaluate_runs(args.run, args.k, args.step, args.val_files, args.n_expected)
    paper = PAPER_TABLE1[args.paper_model] if args.paper_model else None
    text = markdown_table(results, baseline=args.baseline, k=args.k, paper_rows=paper)
    if args.details:
        text += "\n" + detail_table(results)
    padded = {n: sum(b.padded_prompts for b in r.benchmarks.values()) for n, r in results.items()}
    if any(padded.values()):
        text += f"\nPrompts with fewer than {args.n_expected or args.k} samples, padded with failures: {padded}\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps({n: asdict(r) for n, r in results.items()}, indent=2), encoding="utf-8")
    return 0

