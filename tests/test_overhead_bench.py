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
from typing import Any

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
    from verl_gdro.step.controller import GDROController

    assert "decide" not in vars(GDROController)  # an inherited method is not left on the subclass
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


# ---------------------------------------------------------------------------------------------
# The benchmark times the trainer's path: same functions, same order (issue 23)
# ---------------------------------------------------------------------------------------------

#: Where the per-step path of the ``gdro_sync`` trainer lives. Every function defined in these
#: modules, and every method of the classes defined there (but the trainer classes themselves,
#: which are the callers), is wrapped by a recorder.
STEP_PATH_MODULES = (
    "verl_gdro.step.controller",
    "verl_gdro.step.plan",
    "verl_gdro.step.context",
    "verl_gdro.integration.glue",
    "verl_gdro.integration.ledger",
    "verl_gdro.integration.trainer",
    "verl_gdro.integration.estimator",
)


class CallRecorder:
    """Records the outermost calls into :data:`STEP_PATH_MODULES` (calls they make among themselves
    are their implementation, the same whoever calls them). Each wrapper replaces the original in
    its module or class and in every ``verl_gdro`` module that imported it by name, and the
    ``gdro_grpo`` entry of verl's estimator registry, which holds the function itself."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import importlib
        import inspect

        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

        self.calls: list[str] = []
        self._depth = 0
        wrapped: dict[int, Any] = {}
        for name in STEP_PATH_MODULES:
            module = importlib.import_module(name)
            for attr, obj in list(vars(module).items()):
                if getattr(obj, "__module__", None) != name:
                    continue
                if inspect.isfunction(obj):
                    wrapped[id(obj)] = self._wrap(obj, attr)
                    monkeypatch.setattr(module, attr, wrapped[id(obj)])
                elif inspect.isclass(obj) and not attr.startswith("GDROTrainer"):
                    for meth, fn in list(vars(obj).items()):
                        if inspect.isfunction(fn) and not meth.startswith("__"):
                            monkeypatch.setattr(obj, meth, self._wrap(fn, f"{attr}.{meth}"))
        for module in [m for n, m in sys.modules.items() if n.startswith("verl_gdro") and m is not None]:
            for attr, obj in list(vars(module).items()):
                if id(obj) in wrapped and getattr(module, attr) is not wrapped[id(obj)]:
                    monkeypatch.setattr(module, attr, wrapped[id(obj)])
        estimator = ADV_ESTIMATOR_REGISTRY["gdro_grpo"]
        monkeypatch.setitem(ADV_ESTIMATOR_REGISTRY, "gdro_grpo", self._wrap(estimator, estimator.__name__))

    def _wrap(self, fn: Any, label: str) -> Any:
        import functools

        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            # the sampler's calls happen inside verl's data loader, whose cost the benchmark's
            # GRPO column does not time either (verl's own sampler runs there)
            if self._depth == 0 and caller != "verl_gdro.integration.sampler":
                self.calls.append(label)
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return recorded


@pytest.mark.parametrize(
    ("adversary", "preset", "variant"),
    [("prompt", "robust", ""), ("rollout", "robust", ""), ("prompt", "paper", ""), ("rollout", "paper", ""),
     ("rollout", "robust", "rollout.allocator=per_prompt,rollout.arm_utility=failure_weighted")],
)
def test_the_benchmark_calls_what_the_trainer_calls(
    tmp_path: Path, fake_tq: Any, monkeypatch: pytest.MonkeyPatch, adversary: str, preset: str, variant: str
) -> None:
    """Two steps of a real ``gdro_sync`` trainer (its real ``_next_train_batch`` /
    ``_compute_advantage`` on the in-memory TransferQueue) and two of ``Bench.step`` on a batch of
    the same shape make the same calls into the step API and the glue, in the same order."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import overhead
        from integration_harness import make_trainer, run_step
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    overrides = overhead.parse_overrides(variant)
    trainer = make_trainer(
        tmp_path, f"gdro.preset={preset}", f"gdro.prompt.enable={adversary == 'prompt'}",
        f"gdro.rollout.enable={adversary == 'rollout'}", *(f"gdro.{k}={v}" for k, v in overrides.items()),
        *(["actor_rollout_ref.actor.use_kl_loss=true"] if preset == "paper" else []),
        # the loss signals follow the actor: give it the coefficients the step API defaults to
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
    )
    rng = np.random.default_rng(0)
    bench = overhead.Bench(adversary, preset, 8, rng, history=1, overrides=overrides)
    assert bench.ctrl.settings == trainer.gdro.settings  # the same controller configuration
    shape = overhead.Shape("6x4", 6, 4)  # the harness trainer's batch: 6 prompts, rollout.n 4
    tokens = overhead.TokenArrays(6 * overhead.N_MEAN, 8, rng)

    sequences = []
    for side in ("trainer", "benchmark"):
        with monkeypatch.context() as patch:
            recorder = CallRecorder(patch)
            for step in (1, 2):
                if side == "trainer":
                    trainer.global_steps = step
                    run_step(trainer, fake_tq, step)
                else:
                    bench.step(shape, tokens, grpo_first=True)
        sequences.append(recorder.calls)
    trainer_calls, bench_calls = sequences
    assert "StepPlanner.decide" in trainer_calls and "compute_gdro_grpo_advantage" in trainer_calls
    assert "observe_update" in trainer_calls
    assert bench_calls == trainer_calls
