"""benchmarks/overhead.py runs end to end and reports its ratios as the last JSON line.

Timing is not a test (the machine is shared and the ratio targets are checked by reading the
benchmark's output, see docs/benchmarks.md), so this only checks that the benchmark runs the real
pipeline in ``--quick`` mode and that its machine-readable summary is complete and sane.
"""

from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_overhead_benchmark_quick_reports_finite_positive_ratios() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = json.loads(lines[-1])

    for key in ("prompt_gdro_ratio", "rollout_gdro_ratio"):
        value = summary[key]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    assert summary["quick"] is True
    # timed with the collector paused and (on glibc) an allocator that keeps freed memory
    assert summary["gc_paused"] is True and isinstance(summary["steady_allocator"], bool)
    # every (shape, adversary, preset) row was measured with positive, finite times
    rows = summary["rows"]
    assert {(r["adversary"], r["preset"]) for r in rows} == {
        ("prompt", "robust"), ("prompt", "paper"), ("rollout", "robust"), ("rollout", "paper")
    }
    for row in rows:
        for key in ("grpo_s", "gdro_s", "ratio", "ratio_min", "v1_grpo_s", "ratio_v1"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["shape"], key, row[key])
        assert row["ratio"] == pytest.approx(row["gdro_s"] / row["grpo_s"])
        assert row["reps"] >= 1
        assert set(row["parts_s"]) >= {"plan", "multipliers", "estimator", "update_metrics"}
    # the headline ratios are the worst rows of the default preset
    robust = [r for r in rows if r["preset"] == "robust"]
    assert summary["prompt_gdro_ratio"] == max(r["ratio"] for r in robust if r["adversary"] == "prompt")
    assert summary["rollout_gdro_ratio"] == max(r["ratio"] for r in robust if r["adversary"] == "rollout")
    # one human-readable line per row precedes the JSON
    assert sum(" grpo " in line and " gdro " in line for line in lines[:-1]) == len(rows)


@pytest.mark.slow
def test_overhead_benchmark_profile_times_the_trainers_functions_and_restores_them() -> None:
    """--profile attributes the GDRO step to the functions the trainer calls (the glue, the
    ledger, the controllers) and puts the originals back afterwards."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import overhead
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from verl_gdro.integration import glue

    original = glue.consume
    summary = overhead.main(["--quick", "--profile", "--presets", "robust", "--shapes", "32x4", "--reps", "2",
                             "--default-malloc"])  # in-process: leave the test process's allocator alone
    assert glue.consume is original
    assert gc.isenabled()  # paused only while each step was timed
    assert summary["steady_allocator"] is False
    for row in summary["rows"]:
        profile = row["profile_s"]
        assert {"glue.consume", "glue.real_rows", "DispatchLedger.dispatch", "GDROController.after_advantage",
                "GDROController.decide", "OnlineDifficultyClassifier.bins"} <= set(profile)
        assert all(math.isfinite(v) and v > 0 for v in profile.values())
        # the step's own parts contain the functions timed inside them
        assert profile["GDROController.after_advantage"] <= row["parts_s"]["update_metrics"] * 1.5 + 1e-3


@pytest.mark.slow
def test_trainer_path_digest_is_reproducible_and_sees_a_changed_value(monkeypatch) -> None:
    """The bit-identity check of the speed work: the same code gives the same digest twice, and a
    multiplier off by one ulp changes it (so equal digests do mean equal values)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import trainer_path_digest
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    first = trainer_path_digest.digest("robust", "prompt", 32, steps=4)
    assert first == trainer_path_digest.digest("robust", "prompt", 32, steps=4)
    from verl_gdro.step.controller import GDROController

    original = GDROController.advantage_multipliers
    monkeypatch.setattr(GDROController, "advantage_multipliers",
                        lambda self, g: np.nextafter(original(self, g), np.inf))
    assert trainer_path_digest.digest("robust", "prompt", 32, steps=4) != first
