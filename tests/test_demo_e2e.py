"""End-to-end CPU demo runs (slow): ``verl-gdro demo --quick`` as CI runs it, and a SIGKILL + resume.

The warm start is cached per test session in a temporary ``VERL_GDRO_CACHE`` so the runs share
it (it is a pure function of its settings) without touching the user's cache.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

QUICK_TIMEOUT_S = 900  # generous: the machine running CI may be shared; the budget is measured in docs


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    env = dict(os.environ)
    env["VERL_GDRO_CACHE"] = str(tmp_path_factory.mktemp("warm_cache"))
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _demo(out: Path, env: dict, *extra: str, timeout: int = QUICK_TIMEOUT_S) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "verl_gdro.cli", "demo", "--quick", "--out", str(out), "--no-progress", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, cache_env):
    out = tmp_path_factory.mktemp("demo_quick")
    t0 = time.perf_counter()
    proc = _demo(out, cache_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, time.perf_counter() - t0


def test_quick_run_writes_every_output(quick_run):
    from verl_gdro.demo.config import QUICK_METHODS, DemoConfig
    from verl_gdro.plots import HEATMAPS

    out, _ = quick_run
    for name in ("config.json", "tokenizer.json", "warm_start.pt", "metrics.jsonl", "results.json", "results.md"):
        assert (out / name).is_file(), name
    cfg = DemoConfig.quick()
    res = json.loads((out / "results.json").read_text())
    assert list(res["methods"]) == list(QUICK_METHODS)
    budget = cfg.steps * cfg.batch_prompts * cfg.n_mean
    for m, e in res["methods"].items():
        for key in ("pass@8", "mean@8", "worst_level_acc"):
            assert isinstance(e[key], float) and 0.0 <= e[key] <= 1.0, (m, key)
        assert e["rollouts"] == budget  # exactly the same rollouts for every method
        assert e["worst_level_acc"] == pytest.approx(min(e["level_acc"].values()))
        assert e["mean@8"] <= e["pass@8"] + 1e-12
    md = (out / "results.md").read_text()
    assert all(m in md for m in QUICK_METHODS)
    pngs = {p.name for p in (out / "plots").glob("*.png")}
    assert {f"{m}_{stem}.png" for m in QUICK_METHODS for stem in HEATMAPS} | {"lead_lag.png", "wse.png"} <= pngs
    assert "learning_curves.png" in pngs
    # the learning curve: the warm start, every eval_every steps, and the end
    for m, e in res["methods"].items():
        assert [p["step"] for p in e["curve"]] == list(range(0, cfg.steps + 1, cfg.eval_every)), m
        assert e["curve"][-1]["mean@8"] == pytest.approx(e["mean@8"])
        assert e["curve"][0]["mean@8"] == pytest.approx(res["warm_start"]["mean@8"])


def test_quick_run_metrics_are_finite_and_the_budget_is_exact(quick_run):
    from verl_gdro.demo.config import QUICK_METHODS, DemoConfig
    from verl_gdro.metrics import step_keys

    out, _ = quick_run
    cfg = DemoConfig.quick()
    rows = _rows(out / "metrics.jsonl")
    assert len(rows) == cfg.steps * len(QUICK_METHODS)
    for r in rows:
        counts = [r[f"gdro/count/bin_{b}"] for b in range(10)]
        assert set(step_keys(counts)) <= set(r)  # per-bin averages of absent bins are not logged
        for k, v in r.items():
            if k not in ("method", "seed", "step"):
                assert math.isfinite(v), (r["method"], r["step"], k)
        assert r["gdro/num_rollouts"] == cfg.batch_prompts * cfg.n_mean
        assert r["gdro/mean_n"] == pytest.approx(cfg.n_mean)
        per_bin = sum(counts[b] * r[f"gdro/rollout_n/bin_{b}"] for b in range(10) if counts[b] > 0)
        assert per_bin == pytest.approx(cfg.batch_prompts * cfg.n_mean)
    by = {m: [r for r in rows if r["method"] == m] for m in QUICK_METHODS}
    # GRPO: multipliers 1 and n = 4 throughout; the adversaries actually act
    def logged(rs, name):  # per-bin values of the bins present in each step
        return [r[k] for r in rs for b in range(10) if (k := f"gdro/{name}/bin_{b}") in r]

    assert all(r.get(f"gdro/prompt_weight/bin_{b}") is None for r in rows for b in range(10) if r[f"gdro/count/bin_{b}"] == 0)
    assert all(w == 1.0 for w in logged(by["grpo"], "prompt_weight"))
    assert all(n == 4.0 for n in logged(by["grpo"], "rollout_n"))
    assert any(n != 4.0 for n in logged(by["rollout_gdro"], "rollout_n"))
    # the default, joint: the data adversary chooses the prompts (advantages untouched, batches of
    # the same size) and the compute adversary moves rollouts
    assert all(w == 1.0 for w in logged(by["joint"], "prompt_weight"))
    assert any(n != 4.0 for n in logged(by["joint"], "rollout_n"))
    assert all(r["gdro/num_prompts"] == cfg.batch_prompts for r in by["joint"])


def test_quick_run_training_moves_the_policy(quick_run):
    import torch

    out, _ = quick_run
    init = torch.load(out / "warm_start.pt", map_location="cpu", weights_only=False)["state_dict"]
    for ckpt in sorted((out / "ckpt").glob("*.pt")):
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["run"]["model"]
        delta = max(float((state[k].float() - init[k].float()).abs().max()) for k in init)
        assert delta > 1e-4, ckpt.name
    rows = _rows(out / "metrics.jsonl")
    assert any(r["actor/pg_loss"] != 0.0 for r in rows)


def _comparable(rows: list[dict]) -> list[dict]:
    """Rows without wall-clock fields, which legitimately differ between runs."""
    return [
        {k: v for k, v in r.items() if not k.startswith("timing/") and k != "gdro/controller_time_s"} for r in rows
    ]


def test_sigkill_and_resume_gives_identical_decisions(tmp_path, cache_env):
    args = ("--methods", "rollout_gdro", "prompt_gdro", "--steps", "8", "--no-plots")
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "killed"
    proc = _demo(ref_dir, cache_env, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]

    cmd = [sys.executable, "-m", "verl_gdro.cli", "demo", "--quick", "--out", str(run_dir), "--no-progress", *args]
    p = subprocess.Popen(cmd, env=cache_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics" / "prompt_gdro_seed0.jsonl"  # a run's rows, written step by step
    deadline = time.time() + QUICK_TIMEOUT_S
    try:
        # kill in the middle of the second method, with a checkpoint on disk
        while time.time() < deadline:
            if metrics.exists() and len(_rows(metrics)) >= 3:
                break
            assert p.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=60)
    before = _rows(metrics)
    warm_bytes = (run_dir / "warm_start.pt").read_bytes()
    done_first = (run_dir / "done" / "rollout_gdro_seed0.json").read_text()

    proc = _demo(run_dir, cache_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = _rows(metrics)
    assert _comparable(_rows(run_dir / "metrics.jsonl")) == _comparable(_rows(ref_dir / "metrics.jsonl"))
    # nothing earlier in the run directory was lost or rewritten
    assert _comparable(after[: len(before) - 1]) == _comparable(before[: len(before) - 1])
    assert (run_dir / "warm_start.pt").read_bytes() == warm_bytes
    assert (run_dir / "done" / "rollout_gdro_seed0.json").read_text() == done_first
    res, res_ref = (json.loads((d / "results.json").read_text())["methods"] for d in (run_dir, ref_dir))
    for m in res_ref:
        for key in ("pass@8", "mean@8", "worst_level_acc", "rollouts", "level_acc"):
            assert res[m][key] == res_ref[m][key], (m, key)


def test_study_runs_in_parallel_with_the_same_decisions_and_pairs_the_seeds(tmp_path, cache_env, quick_run):
    """``verl-gdro study --jobs 2``: worker processes make the same decisions as the sequential demo
    (seed 0 here equals the demo's seed 0), and results.md carries the paired table."""
    quick_out, _ = quick_run
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "verl_gdro.cli", "study", "--quick", "--out", str(out), "--no-progress",
           "--seeds", "2", "--jobs", "2", "--no-plots", "--methods", "grpo", "rollout_gdro",
           "pp=rollout_gdro:rollout.allocator=per_prompt,rollout.arm_utility=failure_weighted"]
    proc = subprocess.run(cmd, env=cache_env, capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out / "metrics.jsonl")
    demo_rows = _rows(quick_out / "metrics.jsonl")
    for m in ("grpo", "rollout_gdro"):
        mine = [r for r in rows if r["method"] == m and r["seed"] == 0]
        assert _comparable(mine) == _comparable([r for r in demo_rows if r["method"] == m]), m
    res = json.loads((out / "results.json").read_text())
    assert set(res["paired"]) == {"rollout_gdro", "pp"}
    assert res["paired"]["pp"]["mean@8"]["seeds"] == 2
    assert "Paired difference to GRPO" in (out / "results.md").read_text()
    pp = [r for r in rows if r["method"] == "pp"]
    assert all(r["gdro/num_rollouts"] == 12 * 4 for r in pp)
    # a rerun reuses every finished run: no record or checkpoint is rewritten
    stamps = {p.name: p.stat().st_mtime_ns for p in [*(out / "done").glob("*"), *(out / "ckpt").glob("*")]}
    proc = subprocess.run(cmd, env=cache_env, capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["paired"]["pp"] == res["paired"]["pp"]
    assert {p.name: p.stat().st_mtime_ns for p in [*(out / "done").glob("*"), *(out / "ckpt").glob("*")]} == stamps
