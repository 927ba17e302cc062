"""``verl-gdro demo`` and ``verl-gdro study``: GRPO vs GDRO on a tiny Qwen3, on CPU, at equal rollouts.

``demo`` is one seed of GRPO and the default adversaries on the development task; ``study`` is the
same engine with 5 seeds, two worker processes and paired statistics. Both write a run directory
(``--out``; default ``runs/demo``, ``runs/demo-quick``, ``runs/study-<task>``)::

    config.json  tokenizer.json  warm_start.pt       the task, tokenizer and warm start
    metrics/<method>_seed<s>.jsonl                   one row per step (gdro/ names), per run
    metrics.jsonl                                    all runs' rows, merged when the runs are done
    ckpt/<method>_seed<s>.pt                         latest per-step checkpoint of a run
    done/<method>_seed<s>.json                       a finished run: its evaluation curve and final eval
    results.json  results.md  plots/*.png            the summary, paired differences and figures

Every method starts from the same warm start, sees the same prompt batches for a seed (paired
seeds) and consumes exactly the same number of rollouts (asserted). Held-out mean@8, pass@8 and
per-level accuracy are evaluated every ``eval_every`` steps with the seed's own evaluation stream
(common random numbers across methods). A run directory is reused: finished runs are skipped and
an interrupted one continues from its last step with identical decisions (``--resume`` for the
demo; a study always resumes when its configuration matches, ``--fresh`` starts over).

Methods are named in :data:`verl_gdro.demo.config.METHODS`; a variant is
``LABEL=METHOD:key=value,key=value`` with ``gdro.*`` keys, e.g.
``pg_ess=prompt_gdro:prompt.min_ess=0.5`` (an ablation arm with its own label).
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

from verl_gdro.errors import UsageError

from .config import DEFAULT_METHODS, METHODS, DemoConfig, gdro_override, method_steps, parse_method

__all__ = ["add_arguments", "add_study_arguments", "main", "main_study", "run_demo"]


def _add_common(parser: argparse.ArgumentParser, study: bool) -> None:
    parser.add_argument("--quick", action="store_true", help="CI size: fewer and smaller steps (<= 2 minutes)")
    parser.add_argument(
        "--out", default=None, help="run directory (default runs/demo, runs/demo-quick; runs/study-<task> for study)"
    )
    parser.add_argument("--task", default=None, help="task: missing (development, default), add or sort (confirmation)")
    parser.add_argument(
        "--seeds", type=int, default=5 if study else 1, help="paired seeds (results report paired differences to grpo)"
    )
    parser.add_argument(
        "--jobs", type=int, default=2 if study else 1, help="runs in parallel, one process and one torch thread each"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        metavar="METHOD",
        help=f"methods (default: {', '.join(DEFAULT_METHODS)}); allowed: {', '.join(METHODS)}, or a variant "
        "LABEL=METHOD:key=value,key=value of gdro.* keys",
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps per method (overrides the size's default)")
    parser.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="evaluate the held-out set every N steps (default 20 for demo, 10 for study)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default 1)")
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser, study=False)
    parser.add_argument("--resume", action="store_true", help="continue a killed run from its checkpoints")


def add_study_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser, study=True)
    parser.add_argument("--fresh", action="store_true", help="discard the run directory's earlier results")


#: the study evaluates every 10 steps: the compute figure (rollouts to GRPO's final accuracy) is only
#: as fine as the evaluation grid, and 20 steps is an eighth of a run
STUDY_EVAL_EVERY = 10


def _config_from_args(args: argparse.Namespace, study: bool = False) -> DemoConfig:
    cfg = DemoConfig.for_task(None if args.task is None else str(args.task), quick=bool(args.quick))
    over: dict[str, Any] = {"seeds": int(args.seeds), "jobs": int(getattr(args, "jobs", 1) or 1)}
    if study and not args.quick:
        over["eval_every"] = STUDY_EVAL_EVERY
    if args.methods:
        over["methods"] = tuple(m.strip() for arg in args.methods for m in _split_methods(arg) if m.strip())
    if args.steps is not None:
        over["steps"] = int(args.steps)
    if getattr(args, "eval_every", None) is not None:
        over["eval_every"] = int(args.eval_every)
    if args.threads is not None:
        over["threads"] = int(args.threads)
    fields = DemoConfig.__dataclass_fields__
    settable = sorted(set(fields) - {"methods", "seeds", "gdro", "jobs"})
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or key not in settable:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of {settable}")
        kind = type(getattr(cfg, key))
        try:
            over[key] = _set_value(kind, value)
        except ValueError:
            raise ValueError(f"--set {key}={value!r}: expected a {kind.__name__}") from None
    gdro: list[tuple[str, Any]] = []
    for item in args.gdro or []:
        parsed = gdro_override(item)
        if parsed is None:
            raise ValueError(f"--gdro {item!r}: expected KEY=VALUE with KEY a gdro.* key, e.g. prompt.max_weight=3")
        gdro.append(parsed)
    if gdro:
        over["gdro"] = tuple(gdro)
    cfg = replace(cfg, **over)
    cfg.validate()
    return cfg


def _set_value(kind: type, value: str) -> Any:
    """``--set``'s VALUE as the field's type: ints accept ``1e3``, booleans true/false (or 1/0)."""
    if kind is bool:
        low = value.strip().lower()
        if low not in ("true", "false", "1", "0"):
            raise ValueError(value)
        return low in ("true", "1")
    return kind(float(value)) if kind is int else kind(value)


def _split_methods(arg: str) -> list[str]:
    """``--methods a,b`` and ``--methods a b`` both work; a variant's own commas stay with it."""
    if "=" in arg:
        return [arg]
    return arg.split(",")


def _read_config(args: argparse.Namespace, study: bool = False) -> DemoConfig:
    from verl_gdro.errors import usage_errors

    with usage_errors(yaml.YAMLError):  # bad --set / --gdro / --methods / --task: one line, exit 2
        return _config_from_args(args, study)


def main(args: argparse.Namespace) -> int:
    cfg = _read_config(args)
    default = "demo-quick" if args.quick else "demo"
    out = Path(args.out) if args.out else Path("runs") / default
    results = run_demo(cfg, out, resume=bool(args.resume), plots=not args.no_plots, progress=not args.no_progress)
    print(f"\nresults: {out / 'results.md'}")
    print((out / "results.md").read_text())
    return 0 if results else 1


def main_study(args: argparse.Namespace) -> int:
    cfg = _read_config(args, study=True)
    out = Path(args.out) if args.out else Path("runs") / f"study-{cfg.task}{'-quick' if args.quick else ''}"
    results = run_demo(cfg, out, resume=not args.fresh, plots=not args.no_plots, progress=not args.no_progress)
    print(f"\nresults: {out / 'results.md'}")
    print((out / "results.md").read_text())
    return 0 if results else 1


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _truncate_metrics(path: Path, keep_below: int) -> None:
    """Drop a run's rows with step >= keep_below: they are recomputed after a resume."""
    if path.exists():
        kept = [r for r in _rows(path) if int(r.get("step", -1)) < keep_below]
        _atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))


# ------------------------------------------------------------------------------------------------
# one run (a worker process when jobs > 1)
# ------------------------------------------------------------------------------------------------


def _run_one(cfg: DemoConfig, out: str, method: str, seed: int, resume: bool) -> dict:
    """Train and evaluate one method x seed into ``out``; returns its done record."""
    import torch

    from .task import make_eval_set, make_train_set
    from .tokenizer import CharTokenizer
    from .train import MethodRun

    torch.set_num_threads(cfg.threads)
    root = Path(out)
    tag = f"{method}_seed{seed}"
    done_path = root / "done" / f"{tag}.json"
    spec = cfg.method_spec(method)
    if done_path.exists():
        res = json.loads(done_path.read_text())
        if res.get("spec", spec) != spec:
            raise UsageError(
                f"--methods {spec!r}: {done_path} holds a run of {res['spec']!r} under the same label; use another label"
            )
        return res
    derived = _from_longer(cfg, root, method, seed)
    if derived is not None:
        _atomic_write(done_path, json.dumps(derived))
        return derived
    tok = CharTokenizer()
    train_set = make_train_set(cfg.train_size, seed=0, task=cfg.task)
    eval_set = make_eval_set(cfg.eval_per_level, seed=0, exclude=train_set, task=cfg.task)
    init_state = torch.load(root / "warm_start.pt", map_location="cpu", weights_only=False)["state_dict"]
    run = MethodRun(method, seed, cfg, tok, train_set, init_state)
    ckpt_path = root / "ckpt" / f"{tag}.pt"
    ws = json.loads((root / "done" / "warm_start.json").read_text())
    progress: dict[str, Any] = {"wall_s": 0.0, "eval_s": 0.0, "curve": [_curve_point(0, 0, ws)]}
    if resume and ckpt_path.exists():
        blob = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if blob.get("spec", spec) != spec:
            raise UsageError(f"--methods {spec!r}: {ckpt_path} is a run of {blob['spec']!r}; use another label")
        run.load_state_dict(blob["run"])
        progress = {"wall_s": float(blob.get("wall_s", 0.0)), "eval_s": float(blob.get("eval_s", 0.0)),
                    "curve": blob["curve"]}
    metrics_path = root / "metrics" / f"{tag}.jsonl"
    _truncate_metrics(metrics_path, run.step)
    _train_loop(run, tok, eval_set, progress, ckpt_path, metrics_path, spec)
    final = progress["curve"][-1]
    res = {
        "method": method,
        "spec": spec,
        "seed": seed,
        "rollouts": run.rollouts,
        "trained_rollouts": run.trained_rollouts,
        "dynamic_sampling": run.dynamic.enable,
        "steps": run.step,
        **progress,
        **{k: final[k] for k in ("pass@8", "mean@8", "level_acc", "level_pass@8", "worst_level_acc", "worst_level")},
        "train_stats": _train_stats(_rows(metrics_path)),
    }
    _atomic_write(done_path, json.dumps(res))
    return res


def _signature(spec: str) -> tuple[str, tuple]:
    """What defines an arm's run apart from its length: the method and its own keys but ``steps``."""
    _, method, own = parse_method(spec)
    return method, tuple(sorted((k, json.dumps(v)) for k, v in own if k != "steps"))


def _from_longer(cfg: DemoConfig, root: Path, method: str, seed: int) -> dict | None:
    """The done record of ``method`` read from a finished longer arm of the same signature and seed
    (``joint`` from ``joint_long=joint:steps=112``), or None. Nothing in a run depends on its
    length (no schedule reads the total steps), so its first S steps are the shorter run's, bit
    for bit: the rows, the evaluations (every ``eval_every`` steps; S must be one of them) and the
    counters. ``wall_s`` and ``eval_s`` are the longer run's, scaled by S / its steps."""
    spec = cfg.method_spec(method)
    steps = method_steps(spec, cfg.steps)
    if steps % cfg.eval_every:
        return None
    for other in cfg.methods:
        label = parse_method(other)[0]
        path = root / "done" / f"{label}_seed{seed}.json"
        if label == method or _signature(other) != _signature(spec) or not path.exists():
            continue
        longer = json.loads(path.read_text())
        if longer["steps"] <= steps:
            continue
        rows = [r for r in _rows(root / "metrics" / f"{label}_seed{seed}.jsonl") if int(r["step"]) < steps]
        _atomic_write(root / "metrics" / f"{method}_seed{seed}.jsonl",
                      "".join(json.dumps({**r, "method": method}) + "\n" for r in rows))
        curve = [p for p in longer["curve"] if p["step"] <= steps]
        final, last, scale = curve[-1], rows[-1], steps / longer["steps"]
        return {
            **longer, "method": method, "spec": spec, "steps": steps, "curve": curve, "derived_from": label,
            "rollouts": int(last["train/rollouts_total"]),
            "trained_rollouts": int(last.get("train/trained_rollouts_total", last["train/rollouts_total"])),
            "wall_s": longer["wall_s"] * scale, "eval_s": longer["eval_s"] * scale,
            **{k: final[k] for k in ("pass@8", "mean@8", "level_acc", "level_pass@8", "worst_level_acc", "worst_level")},
            "train_stats": _train_stats(rows),
        }
    return None


def _train_loop(run: Any, tok: Any, eval_set: list, progress: dict[str, Any], ckpt_path: Path, metrics_path: Path,
                spec: str) -> None:
    """Train ``run`` to its steps (``run.steps``): a metrics row per step, an evaluation every ``eval_every``
    steps and at the end (appended to ``progress['curve']``), a checkpoint after every step."""
    import numpy as np
    import torch

    from .train import evaluate

    cfg = run.cfg
    tag = f"{run.method}_seed{run.seed}"
    t0 = time.perf_counter() - progress["wall_s"]
    while run.step < run.steps:
        step = run.step
        metrics = run.train_step()
        bad = [k for k, v in metrics.items() if not np.isfinite(v)]
        if bad:
            raise FloatingPointError(f"{tag} step {step}: non-finite metrics {bad}")
        with metrics_path.open("a") as fh:
            fh.write(json.dumps({"method": run.method, "seed": run.seed, "step": step, **metrics}) + "\n")
        if run.step % cfg.eval_every == 0 or run.step == run.steps:
            te = time.perf_counter()
            ev = evaluate(run.model, tok, eval_set, cfg, seed=run.seed)
            progress["eval_s"] += time.perf_counter() - te
            progress["curve"].append(_curve_point(run.step, run.rollouts, ev))
        progress["wall_s"] = time.perf_counter() - t0
        tmp = ckpt_path.with_name(ckpt_path.name + ".tmp")
        torch.save({"run": run.state_dict(), "spec": spec, **progress}, tmp)
        os.replace(tmp, ckpt_path)


def _train_stats(rows: list[dict]) -> dict[str, float]:
    """What a run spent its rollouts on, from its per-step rows: the mean share of zero-advantage
    groups over the run and over its last quarter, the distinct prompts trained and the generated
    response tokens (0 where a row lacks the figure)."""
    zero = [float(r.get("gdro/zero_adv_share", float("nan"))) for r in rows]
    last = zero[len(zero) - max(1, len(zero) // 4):] if zero else []
    last_row = rows[-1] if rows else {}
    return {
        "zero_adv_share": float(sum(zero) / len(zero)) if zero else float("nan"),
        "zero_adv_share_last_quarter": float(sum(last) / len(last)) if last else float("nan"),
        "distinct_prompts": float(last_row.get("train/distinct_prompts", 0.0)),
        "response_tokens": float(last_row.get("train/response_tokens_total", 0.0)),
    }


def _curve_point(step: int, rollouts: int, ev: dict) -> dict:
    return {"step": step, "rollouts": rollouts, **ev}


# ------------------------------------------------------------------------------------------------
# the whole run directory
# ------------------------------------------------------------------------------------------------


def run_demo(cfg: DemoConfig, out: Path, resume: bool = False, plots: bool = True, progress: bool = True) -> dict:
    """Run every method x seed of ``cfg`` into ``out`` (``cfg.jobs`` at a time) and write the summary."""
    import torch
    from tqdm import tqdm

    torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    _prepare_dir(cfg, out, resume)

    def log(msg: str) -> None:
        if progress:
            tqdm.write(msg)
            sys.stdout.flush()
        else:
            print(msg, flush=True)

    ws_eval = _warm_start_eval(cfg, out, log)
    labels = [parse_method(m)[0] for m in cfg.methods]
    from verl_gdro.step.config import resolve_gdro
    from verl_gdro.step.controller import describe_mode

    from .config import DynamicSampling, method_gdro_group, method_study_keys

    for label in labels:
        spec = cfg.method_spec(label)
        ds = DynamicSampling.from_settings(cfg.to_dict(), method_study_keys(spec))
        refills = f"gen_batch_size {ds.gen_batch_size}" if ds.gen_batch_size else "verl V1 refills"
        dapo = (f" | DAPO filter on ({ds.metric}, {refills}, max_num_gen_batches "
                f"{ds.max_num_gen_batches or 'unbounded'})") if ds.enable else ""
        log(f"{label}: {describe_mode(resolve_gdro(method_gdro_group(spec, 0, cfg.gdro)), cfg.n_mean)}{dapo}")
    # paired seeds: all methods of seed 0 first, so a partial study already has complete pairs
    jobs = [(label, seed) for seed in range(cfg.seeds) for label in labels]
    results = _run_jobs(cfg, out, jobs, resume, progress, log, t_start)

    _check_budgets(cfg, results)
    # the merged per-step file, in (seed, method) order: what `verl-gdro plot` and users read
    merged = [row for label, seed in jobs for row in _rows(out / "metrics" / f"{label}_seed{seed}.jsonl")]
    _atomic_write(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in merged))

    from .stats import markdown, summarise

    summary = summarise(cfg, labels, results, ws_eval, time.perf_counter() - t_start)
    text = markdown(summary)
    dapo = _dapo_section(cfg, out, labels, results)
    if dapo is not None:
        summary["dynamic_sampling"], section = dapo
        text += "\n" + section
    _atomic_write(out / "results.json", json.dumps(summary, indent=1))
    _atomic_write(out / "results.md", text)
    if plots:
        from verl_gdro.plots import draw_all, draw_learning_curves, series_from_rows

        draw_all(series_from_rows([r for r in merged if r["seed"] == 0]), out / "plots")
        draw_learning_curves(summary, out / "plots")
    return summary


def _check_budgets(cfg: DemoConfig, results: dict[tuple[str, int], dict]) -> None:
    """Without the filter every run generates (and trains on) exactly steps x prompts x n rollouts;
    under DAPO's dynamic sampling the generated rollouts are the method's cost, so they differ."""
    per_step = cfg.batch_prompts * cfg.n_mean
    wrong = sorted(
        (label, res["rollouts"]) for (label, _), res in results.items()
        if not res.get("dynamic_sampling", False) and res["rollouts"] != res["steps"] * per_step
    )
    if wrong:
        raise AssertionError(f"methods consumed other rollout budgets than steps x {per_step}: {wrong}")


def _prepare_dir(cfg: DemoConfig, out: Path, resume: bool) -> None:
    """Create the run directory; refuse one written with another configuration (resume) or clear
    an earlier run's files (fresh); write ``config.json``."""
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("ckpt", "done", "metrics"):
        (out / sub).mkdir(exist_ok=True)
    cfg_path = out / "config.json"
    if cfg_path.exists() and resume:
        # Methods and seeds only choose which runs exist (each run's record names its own spec), so
        # a study can gain ablation arms or seeds in the same directory and reuse what is done.
        saved, mine = json.loads(cfg_path.read_text()), cfg.to_dict()
        diff = sorted(k for k in set(saved) | set(mine) if k not in ("methods", "seeds") and saved.get(k) != mine.get(k))
        if diff:
            raise UsageError(f"--out {out}: written with a different configuration ({', '.join(diff)}); use a new --out")
    elif not resume:
        # a fresh run: never mix rows of an earlier run into this one
        stale = [out / "metrics.jsonl", *(out / "metrics").glob("*.jsonl"), *(out / "ckpt").glob("*.pt")]
        for path in stale + list((out / "done").glob("*.json")):
            path.unlink(missing_ok=True)
    _atomic_write(cfg_path, json.dumps(cfg.to_dict(), indent=1))


def _warm_start_eval(cfg: DemoConfig, out: Path, log: Any) -> dict:
    """The warm start (trained or cached) in ``out`` and its held-out evaluation (cached too)."""
    from .model import build_model
    from .task import make_eval_set, make_train_set
    from .tokenizer import CharTokenizer
    from .train import evaluate, warm_start

    tok = CharTokenizer()
    tok.save(out / "tokenizer.json")
    train_set = make_train_set(cfg.train_size, seed=0, task=cfg.task)
    eval_set = make_eval_set(cfg.eval_per_level, seed=0, exclude=train_set, task=cfg.task)
    init_state = warm_start(cfg, tok, out / "warm_start.pt", log=log)
    ws_path = out / "done" / "warm_start.json"
    if ws_path.exists():
        ws_eval = json.loads(ws_path.read_text())
    else:
        m0 = build_model(tok.vocab_size, cfg.hidden, cfg.layers)
        m0.load_state_dict(init_state)
        ws_eval = evaluate(m0, tok, eval_set, cfg, seed=0)
        _atomic_write(ws_path, json.dumps(ws_eval))
    log(
        f"task {cfg.task}: warm start mean@8 {ws_eval['mean@8']:.3f} pass@8 {ws_eval['pass@8']:.3f} per level "
        + " ".join(f"{v:.2f}" for v in ws_eval["level_acc"].values())
    )
    return ws_eval


def _run_jobs(cfg: DemoConfig, out: Path, jobs: list[tuple[str, int]], resume: bool, progress: bool, log: Any,
              t_start: float) -> dict[tuple[str, int], dict]:
    """Every (label, seed) run, ``cfg.jobs`` processes at a time; their done records."""
    from tqdm import tqdm

    results: dict[tuple[str, int], dict] = {}
    steps = {label: method_steps(cfg.method_spec(label), cfg.steps) for label, _ in jobs}
    bar = tqdm(total=sum(steps[label] for label, _ in jobs), disable=not progress, dynamic_ncols=True, file=sys.stderr)

    def finished(res: dict) -> None:
        if "train_stats" not in res:  # a run finished before the study recorded them: read its rows
            res["train_stats"] = _train_stats(_rows(out / "metrics" / f"{res['method']}_seed{res['seed']}.jsonl"))
        results[(res["method"], res["seed"])] = res
        log(
            f"{res['method']}_seed{res['seed']}: mean@8 {res['mean@8']:.3f} pass@8 {res['pass@8']:.3f} worst level "
            f"{res['worst_level']} acc {res['worst_level_acc']:.3f} ({res['wall_s']:.0f}s)"
        )

    if cfg.jobs <= 1:
        for label, seed in jobs:
            before = _steps_done(out, label, seed)
            bar.update(before)
            finished(_run_one(cfg, str(out), label, seed, resume))
            bar.update(steps[label] - before)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # fresh interpreters: no forked torch thread pools
        with ctx.Pool(processes=cfg.jobs, initializer=_quiet_worker) as pool:
            pending = [pool.apply_async(_run_one, (cfg, str(out), label, seed, resume)) for label, seed in jobs]
            shown = 0
            while pending:
                for p in [p for p in pending if p.ready()]:
                    pending.remove(p)
                    finished(p.get())  # re-raises a worker's exception here
                done_steps = sum(_steps_done(out, label, seed) for label, seed in jobs)
                bar.update(done_steps - shown)
                shown = done_steps
                bar.set_postfix_str(f"{len(results)}/{len(jobs)} runs, {time.perf_counter() - t_start:.0f}s")
                time.sleep(0.5)
    bar.close()
    return results


def _dapo_section(cfg: DemoConfig, out: Path, labels: list[str], results: dict) -> tuple[dict, str] | None:
    """The figures against DAPO (:mod:`verl_gdro.demo.dapo`) when an arm is GRPO with the filter:
    the first such arm is the base. None when no arm is."""
    base = next(
        (m for m in labels if parse_method(cfg.method_spec(m))[1] == "grpo"
         and any(r.get("dynamic_sampling") for (lab, _), r in results.items() if lab == m)),
        None,
    )
    if base is None:
        return None
    from .dapo import dapo_markdown, dapo_summary

    batch = cfg.batch_prompts * cfg.n_mean
    summary = dapo_summary(out, labels, base, cfg.steps * batch, sorted({seed for _, seed in results}))
    return summary, dapo_markdown(summary, batch)


def _quiet_worker() -> None:
    """A study's worker process (ours, spawned for ``--jobs``): the same quiet as the command, so
    verl's CPU-platform lines that a user cannot act on stay out of the log there too."""
    from verl_gdro.cli import quiet_third_party_warnings

    quiet_third_party_warnings()


def _steps_done(out: Path, label: str, seed: int) -> int:
    path = out / "metrics" / f"{label}_seed{seed}.jsonl"
    if not path.exists():
        return 0
    with path.open() as fh:
        return sum(1 for line in fh if line.strip())
