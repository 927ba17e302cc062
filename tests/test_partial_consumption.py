"""Rollout-GDRO under the way verl 0.9.1 consumes a dispatch (docs/algorithm.md, "Rollout-GDRO"):
the async trainers train a subset of a generation call, DAPO filters and refills, and a group
whose rollouts all failed arrives with no trajectories. For every allocator x arm utility x
selection, random sequences of those events must keep the exact budget of every generation call,
never raise, and keep a finite state; a step Rollout-GDRO cannot learn from is counted, not fatal.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_gdro.allocators import LEARNER_ALLOCATORS as ALLOCATORS
from verl_gdro.allocators import get_allocator
from verl_gdro.rollout_gdro import ARM_UTILITIES, PER_PROMPT_UTILITIES, SELECTIONS
from verl_gdro.step.controller import ROLLOUT_SKIP_REASONS, GDROController


def _valid(allocator: str, utility: str | None) -> bool:
    if get_allocator(allocator).per_prompt_evidence:
        return utility in PER_PROMPT_UTILITIES
    return utility != "hit"


def _choices(allocator: str, key: str, values: tuple[str, ...]) -> tuple[str | None, ...]:
    """Every value of a key the allocator reads; None (left to the preset) for one it does not."""
    return values if f"rollout.{key}" in get_allocator(allocator).reads else (None,)


COMBOS = [(a, u, s) for a in ALLOCATORS for u in _choices(a, "arm_utility", ARM_UTILITIES)
          for s in _choices(a, "selection", SELECTIONS) if _valid(a, u if u is not None else "failure_weighted")]
UID_POOL = 40


def _finite_state(value: Any) -> bool:
    """Every float in the (nested) state is finite, except the NaN 'not yet seen' markers of the
    smoothed pass rates, which are allowed by design (docs/algorithm.md, section 3)."""
    if isinstance(value, dict):
        return all(_finite_state(v) for k, v in value.items() if k != "pass_rate")
    if isinstance(value, (list, tuple)):
        return all(_finite_state(v) for v in value)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return bool(np.all(np.isfinite(value)))
    if isinstance(value, float):
        return math.isfinite(value)
    return True


@st.composite
def event_streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Steps of: generation calls (dispatch sizes), then the consumption of a random part of the
    groups in flight, each consumed group complete, partly failed, all failed, or filtered."""
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        steps.append({
            "calls": draw(st.lists(st.integers(1, 9), min_size=0, max_size=3)),
            "consume": draw(st.integers(0, 2**31 - 1)),
            "seed": draw(st.integers(0, 2**31 - 1)),
        })
    return steps


@pytest.mark.parametrize(("allocator", "arm_utility", "selection"), COMBOS, ids=["-".join(str(x) for x in c) for c in COMBOS])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(stream=event_streams())
def test_partial_consumption_never_stops_training(
    allocator: str, arm_utility: str | None, selection: str | None, stream: list[dict[str, Any]]
) -> None:
    rollout = {"enable": True, "allocator": allocator, "arm_utility": arm_utility, "selection": selection}
    ctrl = GDROController.from_config(
        {"preset": "robust", "prompt": {"mode": "reweight"}, "rollout": {k: v for k, v in rollout.items() if v is not None}},
        rollout_n=4,
    )
    inflight: list[tuple[int, int, int]] = []  # (stable uid, dispatch-time bin, dispatch-time n)
    next_uid = 0
    learned = 0
    for step in stream:
        rng = np.random.default_rng(step["seed"])
        for size in step["calls"]:
            uids = (np.arange(next_uid, next_uid + size) % UID_POOL).astype(np.int64)
            next_uid += size
            plan = ctrl.decide(uids)
            assert int(plan.rollout_n.sum()) == 4 * size  # the exact budget of every generation call
            assert plan.rollout_n.min() >= 2 and plan.rollout_n.max() <= 12
            inflight.extend(zip(uids.tolist(), plan.bins.tolist(), plan.rollout_n.tolist(), strict=True))
        if not inflight:
            continue
        pick = np.random.default_rng(step["consume"]).random(len(inflight)) < 0.6
        taken = [g for g, p in zip(inflight, pick, strict=True) if p]
        inflight = [g for g, p in zip(inflight, pick, strict=True) if not p]
        if not taken:
            continue
        uids, bins, n = (np.array(col, dtype=np.int64) for col in zip(*taken, strict=True))
        positions = ctrl.adopt(uids, bins, n)
        index, acc = [], []
        for pos, count in zip(positions.tolist(), n.tolist(), strict=True):
            fate = rng.integers(0, 4)  # 0 complete, 1 partly failed, 2 all failed, 3 filtered
            arrived = count if fate in (0, 3) else int(rng.integers(1, count)) if fate == 1 else 0
            values = np.full(arrived, float(rng.integers(0, 2))) if fate == 3 else rng.integers(0, 2, arrived)
            index.extend([pos] * arrived)
            acc.extend(values.tolist())
        metrics = ctrl.after_advantage(np.array(index, dtype=np.int64), np.array(acc, dtype=np.float64))
        assert all(math.isfinite(v) for v in metrics.values())
        skips = [metrics[f"gdro/rollout_skip/{r}"] for r in ROLLOUT_SKIP_REASONS]
        assert sum(skips) == metrics["gdro/rollout_update_skipped"] <= 1.0
        learned += metrics["gdro/rollout_update_skipped"] == 0.0
        assert ctrl.pending_prompts == 0
        assert _finite_state(ctrl.state_dict())
    # the saved state resumes into the same decisions
    twin = GDROController.from_config(ctrl.settings, rollout_n=4)
    twin.load_state_dict(ctrl.state_dict())
    probe = np.arange(12, dtype=np.int64)
    a, b = ctrl.decide(probe), twin.decide(probe)
    np.testing.assert_array_equal(a.rollout_n, b.rollout_n)


def test_a_subset_of_one_call_is_learned_from_under_sample() -> None:
    """The case that used to raise 'n must spend the exact budget' out of verl's advantage stage:
    the bandit with a played-arm utility and sampled configurations (``allocator=bandit
    arm_utility=loss`` on the robust preset) trains a subset of a generation call."""
    ctrl = GDROController.from_config(
        {"preset": "robust", "rollout": {"enable": True, "allocator": "bandit", "arm_utility": "loss"}}, rollout_n=4
    )
    assert ctrl.rollout is not None and ctrl.rollout.effective_selection == "sample"
    rng = np.random.default_rng(0)
    for _ in range(3):
        plan = ctrl.decide(np.arange(16))
        keep = np.arange(16) % 4 != 0  # a quarter of the dispatch stays in flight
        positions = ctrl.adopt(plan.uids[keep], plan.bins[keep], plan.rollout_n[keep])
        g = np.repeat(positions, plan.rollout_n[keep])
        before = ctrl.state_dict()["rollout"]["scores"].copy()
        metrics = ctrl.after_advantage(g, rng.integers(0, 2, g.size).astype(np.float64))
        assert metrics["gdro/rollout_update_skipped"] == 0.0
        assert metrics["gdro/rollout_unweighted_bins"] == 0.0
        assert not np.array_equal(before, ctrl.state_dict()["rollout"]["scores"])
