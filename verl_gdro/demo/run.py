"""``verl-gdro demo``: GRPO vs Prompt-GDRO vs Rollout-GDRO on a tiny Qwen3, on CPU, in minutes.

Writes a run directory (``--out``, default ``runs/demo`` or ``runs/demo-quick``)::

    config.json  tokenizer.json  warm_start.pt       the cached task, tokenizer and warm start
    metrics.jsonl                                    one row per step, method and seed (gdro/ names)
    ckpt/<method>_seed<s>.pt                         latest per-step checkpoint (--resume)
    done/<method>_seed<s>.json                       a finished run's evaluation
    results.json  results.md  plots/*.png            the summary and the curriculum figures

Every method starts from the same warm start, sees the same prompt batches (same seed) and
consumes exactly the same number of rollouts (asserted). Kill it at any point and run it again
with ``--resume``: finished methods are skipped and the interrupted one continues from its last
step with identical decisions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from .config import METHODS, DemoConfig

__all__ = ["add_arguments", "main", "run_demo"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="CI size: 3 methods, fewer steps (<= 2 minutes)")
    parser.add_argument("--out", default=None, help="run directory (default runs/demo, runs/demo-quick with --quick)")
    parser.add_argument("--seeds", type=int, default=1, help="number of seeds (results report mean and spread)")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        metavar="METHOD",
        help=f"methods to run (default: grpo, prompt_gdro, rollout_gdro and the two *_paper); allowed: {', '.join(METHODS)}",
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps per method (overrides the size's default)")
    parser.add_argument("--resume", action="store_true", help="continue a killed run from its checkpoints")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default 1: fastest for this tiny model on a shared 2-core box)")
    parser.add_argument(
        "--set",
        nargs="+",
        default=None,
        metavar="KEY=VALUE",
        help="override any DemoConfig field (verl_gdro/demo/config.py), e.g. --set lr=3e-4 train_size=128",
    )
    parser.add_argument(
        "--gdro",
        nargs="+",
        default=None,
        metavar="KEY=VALUE",
        help="override a gdro.* key for every method (dotted, YAML value), e.g. --gdro prompt.max_weight=3 prompt.eta=0.3",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (plain log lines)")


def _config_from_args(args: argparse.Namespace) -> DemoConfig:
    cfg = DemoConfig.quick() if args.quick else DemoConfig()
    over: dict[str, Any] = {"seeds": int(args.seeds)}
    if args.methods:
        over["methods"] = tuple(m.strip() for arg in args.methods for m in arg.split(",") if m.strip())
    if args.steps is not None:
        over["steps"] = int(args.steps)
    if args.threads is not None:
        over["threads"] = int(args.threads)
    for item in args.set or []:
        key, sep, value = item.partition("=")
        fields = DemoConfig.__dataclass_fields__
        if not sep or key not in fields or key in ("methods", "seeds"):
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of {sorted(set(fields) - {'methods', 'seeds'})}")
        kind = type(getattr(cfg, key))
        over[key] = kind(float(value)) if kind is int else kind(value)
    gdro: list[tuple[str, Any]] = []
    for item in args.gdro or []:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("gdro.")
        if not sep or not key:
            raise ValueError(f"--gdro {item!r}: expected KEY=VALUE with KEY a gdro.* key, e.g. prompt.max_weight=3")
        gdro.append((key, yaml.safe_load(value)))
    if gdro:
        over["gdro"] = tuple(gdro)
    cfg = replace(cfg, **over)
    cfg.validate()
    return cfg


def main(args: argparse.Namespace) -> int:
    from verl_gdro.errors import usage_errors

    with usage_errors(yaml.YAMLError):  # bad --set / --gdro / --methods: one line, exit 2
        cfg = _config_from_args(args)
    out = Path(args.out) if args.out else Path("runs") / ("demo-quick" if args.quick else "demo")
    results = run_demo(
        cfg, out, resume=bool(args.resume), plots=not args.no_plots, progress=not args.no_progress
    )
    print(f"\nresults: {out / 'results.md'}")
    print((out / "results.md").read_text())
    return 0 if results else 1


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _truncate_metrics(path: Path, method: str, seed: int, keep_below: int) -> None:
    """Drop rows of (method, seed) with step >= keep_below: they are recomputed after a resume."""
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    kept = []
    for line in lines:
        if not line.strip():
            continue
        r = json.loads(line)
        if r.get("method") == method and r.get("seed") == seed and int(r.get("step", -1)) >= keep_below:
            continue
        kept.append(line)
    _atomic_write(path, "".join(k + "\n" for k in kept))


def run_demo(cfg: DemoConfig, out: Path, resume: bool = False, plots: bool = True, progress: bool = True) -> dict:
    """Run every method x seed of ``cfg`` into ``out`` and write the summary files."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from verl_gdro.integration.controller import describe_mode

    from .task import make_eval_set, make_train_set
    from .tokenizer import CharTokenizer
    from .train import MethodRun, evaluate, warm_start

    torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    (out / "ckpt").mkdir(exist_ok=True)
    (out / "done").mkdir(exist_ok=True)
    cfg_path = out / "config.json"
    if cfg_path.exists() and resume:
        saved = json.loads(cfg_path.read_text())
        if saved != cfg.to_dict():
            raise ValueError(f"--resume: {cfg_path} was written with a different configuration; use a new --out")
    elif not resume:
        # a fresh run: never mix rows of an earlier run into this one
        for stale in [out / "metrics.jsonl", *(out / "ckpt").glob("*.pt"), *(out / "done").glob("*.json")]:
            stale.unlink(missing_ok=True)
    _atomic_write(cfg_path, json.dumps(cfg.to_dict(), indent=1))

    def log(msg: str) -> None:
        if progress:
            tqdm.write(msg)
            sys.stdout.flush()
        else:
            print(msg, flush=True)

    tok = CharTokenizer()
    tok.save(out / "tokenizer.json")
    train_set = make_train_set(cfg.train_size, seed=0)
    eval_set = make_eval_set(cfg.eval_per_level, seed=0, exclude=train_set)
    init_state = warm_start(cfg, tok, out / "warm_start.pt", log=log)

    ws_path = out / "done" / "warm_start.json"
    if ws_path.exists():
        ws_eval = json.loads(ws_path.read_text())
    else:
        from .model import build_model

        m0 = build_model(tok.vocab_size, cfg.hidden, cfg.layers)
        m0.load_state_dict(init_state)
        ws_eval = evaluate(m0, tok, eval_set, cfg, seed=0)
        _atomic_write(ws_path, json.dumps(ws_eval))
    log(f"warm start eval: mean@8 {ws_eval['mean@8']:.3f} pass@8 {ws_eval['pass@8']:.3f} per level "
        + " ".join(f"{v:.2f}" for v in ws_eval["level_acc"].values()))

    metrics_path = out / "metrics.jsonl"
    total = cfg.steps * len(cfg.methods) * cfg.seeds
    bar = tqdm(total=total, disable=not progress, dynamic_ncols=True, file=sys.stderr)
    per_run: dict[str, list[dict]] = {m: [] for m in cfg.methods}
    for seed in range(cfg.seeds):
        for method in cfg.methods:
            tag = f"{method}_seed{seed}"
            done_path = out / "done" / f"{tag}.json"
            if done_path.exists():
                per_run[method].append(json.loads(done_path.read_text()))
                bar.update(cfg.steps)
                continue
            run = MethodRun(method, seed, cfg, tok, train_set, init_state)
            log(f"{tag}: {describe_mode(run.ctrl.settings, cfg.n_mean)}")
            ckpt_path = out / "ckpt" / f"{tag}.pt"
            wall = 0.0
            if resume and ckpt_path.exists():
                blob = torch.load(ckpt_path, map_location="cpu", weights_only=False)
                run.load_state_dict(blob["run"])
                wall = float(blob.get("wall_s", 0.0))
                log(f"{tag}: resumed at step {run.step}")
            _truncate_metrics(metrics_path, method, seed, run.step)
            bar.update(run.step)
            t0 = time.perf_counter() - wall
            while run.step < cfg.steps:
                step = run.step
                metrics = run.train_step()
                bad = [k for k, v in metrics.items() if not np.isfinite(v)]
                if bad:
                    raise FloatingPointError(f"{tag} step {step}: non-finite metrics {bad}")
                row = {"method": method, "seed": seed, "step": step, **metrics}
                with metrics_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                wall = time.perf_counter() - t0
                tmp = ckpt_path.with_suffix(".tmp")
                torch.save({"run": run.state_dict(), "wall_s": wall}, tmp)
                os.replace(tmp, ckpt_path)
                bar.set_postfix_str(
                    f"{method} s{seed} step {step + 1}/{cfg.steps} reward {metrics['train/reward']:+.2f} "
                    f"acc {metrics['train/acc']:.2f} elapsed {time.perf_counter() - t_start:.0f}s"
                )
                bar.update(1)
            t_eval = time.perf_counter()
            ev = evaluate(run.model, tok, eval_set, cfg, seed=seed)
            wall = time.perf_counter() - t0
            res = {
                "method": method,
                "seed": seed,
                "rollouts": run.rollouts,
                "steps": run.step,
                "wall_s": wall,
                "eval_s": time.perf_counter() - t_eval,
                **ev,
            }
            _atomic_write(done_path, json.dumps(res))
            per_run[method].append(res)
            log(
                f"{tag}: pass@8 {ev['pass@8']:.3f} mean@8 {ev['mean@8']:.3f} worst level {ev['worst_level']} "
                f"acc {ev['worst_level_acc']:.3f} ({wall:.0f}s)"
            )
    bar.close()

    rollouts = {m: sorted({r["rollouts"] for r in rs}) for m, rs in per_run.items()}
    expected = cfg.steps * cfg.batch_prompts * cfg.n_mean
    if any(v != [expected] for v in rollouts.values()):
        raise AssertionError(f"methods consumed different rollout budgets: {rollouts} (expected {expected} each)")

    summary = _summarise(cfg, per_run, ws_eval, time.perf_counter() - t_start)
    _atomic_write(out / "results.json", json.dumps(summary, indent=1))
    _atomic_write(out / "results.md", _markdown(summary))
    if plots:
        from verl_gdro.plots import draw_all, load_series

        draw_all(load_series(metrics_path), out / "plots")
    return summary


def _summarise(cfg: DemoConfig, per_run: dict[str, list[dict]], ws_eval: dict, wall: float) -> dict:
    import numpy as np

    methods = {}
    for m, rs in per_run.items():
        entry: dict[str, Any] = {}
        for key in ("pass@8", "mean@8", "worst_level_acc", "wall_s"):
            vals = np.array([r[key] for r in rs], dtype=float)
            entry[key] = float(vals.mean())
            entry[key + "_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        entry["rollouts"] = int(rs[0]["rollouts"])
        levels = sorted(rs[0]["level_acc"], key=int)
        entry["level_acc"] = {lv: float(np.mean([r["level_acc"][lv] for r in rs])) for lv in levels}
        entry["level_acc_std"] = {
            lv: float(np.std([r["level_acc"][lv] for r in rs], ddof=1)) if len(rs) > 1 else 0.0 for lv in levels
        }
        entry["seeds"] = [
            {k: r[k] for k in ("seed", "pass@8", "mean@8", "worst_level_acc", "worst_level", "level_acc", "wall_s")} for r in rs
        ]
        methods[m] = entry
    return {"methods": methods, "warm_start": ws_eval, "config": cfg.to_dict(), "wall_s": wall, "num_seeds": cfg.seeds}


def _markdown(summary: dict) -> str:
    ms = summary["methods"]
    seeds = summary["num_seeds"]
    levels = sorted(next(iter(ms.values()))["level_acc"], key=int)
    pm = " ± " if seeds > 1 else ""

    def fmt(e: dict, k: str) -> str:
        return f"{e[k]:.3f}" + (f"{pm}{e[k + '_std']:.3f}" if seeds > 1 else "")

    lines = [
        "# CPU demo results",
        "",
        f"{seeds} seed(s){' (mean ± sample std)' if seeds > 1 else ''}; 8 samples per held-out problem; "
        f"every method consumed the same rollouts. Total wall time {summary['wall_s']:.0f} s.",
        "",
        "| method | pass@8 | mean@8 | worst level acc | " + " | ".join(f"L{lv}" for lv in levels) + " | rollouts | wall s |",
        "|---|---|---|---|" + "---|" * len(levels) + "---|---|",
    ]
    ws = summary["warm_start"]
    lines.append(
        f"| warm start | {ws['pass@8']:.3f} | {ws['mean@8']:.3f} | {ws['worst_level_acc']:.3f} | "
        + " | ".join(f"{ws['level_acc'][lv]:.3f}" for lv in levels)
        + " | 0 | - |"
    )
    for m, e in ms.items():
        lines.append(
            f"| {m} | {fmt(e, 'pass@8')} | {fmt(e, 'mean@8')} | {fmt(e, 'worst_level_acc')} | "
            + " | ".join(f"{e['level_acc'][lv]:.3f}" for lv in levels)
            + f" | {e['rollouts']} | {e['wall_s']:.0f} |"
        )
    lines.append("")
    return "\n".join(lines)
