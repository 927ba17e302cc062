"""GDROController: the step code path shared by the verl trainer and the CPU demo (no verl needed)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from verl_gdro.classifier import OnlineDifficultyClassifier
from verl_gdro.metrics import PREFIX, metric_keys, step_keys
from verl_gdro.prompt_gdro import PromptGDRO
from verl_gdro.step.config import resolve_gdro
from verl_gdro.step.controller import (
    EXTRA_METRICS,
    ROLLOUT_METRICS,
    GDROController,
    describe_mode,
    mode_name,
)

#: What these tests exercise unless they say otherwise: Prompt-GDRO reweighting alone (the package
#: default is joint mode with a sampling mode, tested where named).
REWEIGHT_ALONE = {"prompt": {"mode": "reweight"}, "rollout": {"enable": False}}


def with_reweight(group: dict) -> dict:
    """``group`` over :data:`REWEIGHT_ALONE` (the group's own keys win)."""
    out = {k: dict(v) for k, v in REWEIGHT_ALONE.items()}
    for key, value in group.items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


def ctrl(rollout_n: int = 4, **group: object) -> GDROController:
    return GDROController.from_config(with_reweight(group), rollout_n=rollout_n)


def outcomes(uids: np.ndarray, n: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Trajectory group index and correctness: prompt difficulty grows with its id."""
    g = np.repeat(np.arange(uids.size), n)
    p = np.clip(1.0 - uids[g] / 40.0, 0.02, 0.98)
    rng = np.random.default_rng(step)
    return g, (rng.random(g.size) < p).astype(float)


def run(c: GDROController, steps: range, batch: int = 16) -> list[dict]:
    log = []
    for step in steps:
        uids = np.random.default_rng(1000 + step).choice(40, size=batch, replace=False)
        plan = c.before_generation(uids)
        g, acc = outcomes(uids, plan.rollout_n, step)
        mult = c.advantage_multipliers(g)
        metrics = c.after_advantage(g, acc)
        metrics.pop(PREFIX + "controller_time_s")
        log.append({"bins": plan.bins.tolist(), "n": plan.rollout_n.tolist(), "mult": mult.tolist(),
                    "metrics": metrics})
    return log


def test_metrics_are_the_spec_names_plus_integration_counters() -> None:
    c = ctrl(rollout={"enable": True})
    plan = c.before_generation(np.arange(8))
    g, acc = outcomes(np.arange(8), plan.rollout_n, 0)
    c.advantage_multipliers(g)
    m = c.after_advantage(g, acc)
    counts = [m[f"{PREFIX}count/bin_{b}"] for b in range(10)]
    assert set(m) == set(step_keys(counts)) | {PREFIX + k for k in EXTRA_METRICS + ROLLOUT_METRICS}
    assert set(step_keys(counts)) <= set(metric_keys(10))
    assert all(np.isfinite(v) for v in m.values())
    assert m[PREFIX + "num_rollouts"] == 32 and m[PREFIX + "num_trajectories"] == 32


def test_budget_is_exact_for_every_call_and_calls_accumulate() -> None:
    c = ctrl(rollout_n=4, rollout={"enable": True})
    run(c, range(5))  # move the allocator away from uniform
    a = c.before_generation(np.arange(6))
    b = c.before_generation(np.arange(10, 13))
    assert a.rollout_n.sum() == 24 and b.rollout_n.sum() == 12
    assert a.positions.tolist() == list(range(6)) and b.positions.tolist() == [6, 7, 8]
    assert c.pending_prompts == 9
    g = np.repeat(np.arange(9), np.concatenate([a.rollout_n, b.rollout_n]))
    c.advantage_multipliers(g)
    m = c.after_advantage(g, np.zeros(g.size))
    assert m[PREFIX + "num_prompts"] == 9 and c.pending_prompts == 0


def test_multipliers_follow_prompt_gdro_with_mean_one() -> None:
    c = ctrl()
    shadow = PromptGDRO(10, min_ess=0.8)  # the robust preset's ESS floor
    shadow_cls = OnlineDifficultyClassifier()
    for step in range(6):
        uids = np.arange(step, step + 20)
        plan = c.before_generation(uids)
        bins = shadow_cls.bins(uids)
        assert plan.bins.tolist() == bins.tolist()
        g, acc = outcomes(uids, plan.rollout_n, step)
        mult = c.advantage_multipliers(g)
        assert np.allclose(mult, shadow.multipliers(bins[g]))
        if step > 0 and mult.max() < 15:
            assert mult.mean() == pytest.approx(1.0)
        c.after_advantage(g, acc)
        fail = 1.0 - np.bincount(g, weights=acc) / np.bincount(g)
        shadow.update(bins, fail)
        shadow_cls.observe(uids, np.bincount(g, weights=acc).astype(int), np.bincount(g))
    assert np.allclose(c.prompt.scores, shadow.scores)


@pytest.mark.parametrize("group", [{"prompt": {"enable": False}}, {"prompt": {"mode": "resample"}}])
def test_multipliers_exactly_one_when_not_reweighting(group: dict) -> None:
    c = ctrl(**group)
    for entry in run(c, range(4)):
        assert all(m == 1.0 for m in entry["mult"])
        assert all(entry["metrics"].get(f"gdro/prompt_weight/bin_{b}", 1.0) == 1.0 for b in range(10))


def test_prompts_without_trajectories_are_left_out() -> None:
    c = ctrl(rollout={"enable": True})
    plan = c.before_generation(np.arange(4))
    g = np.repeat(np.arange(4), plan.rollout_n)
    keep = g != 2  # every rollout of prompt 2 failed to generate
    keep[np.flatnonzero(g == 1)[0]] = False  # and one of prompt 1
    c.advantage_multipliers(g[keep])
    before = copy.deepcopy(c.rollout.state_dict())
    m = c.after_advantage(g[keep], np.ones(keep.sum()))
    assert m[PREFIX + "num_prompts"] == 3 and m[PREFIX + "incomplete_groups"] == 2
    assert m[PREFIX + "rollout_update_skipped"] == 1
    assert c.rollout.state_dict()["steps"] == before["steps"]  # no update from a partial budget
    assert np.isnan(c.classifier.pass_at_k(np.array([2])))[0]  # never observed
    assert c.classifier.pass_at_k(np.array([1]))[0] == 1.0


def test_repeated_prompt_pools_into_one_visit_and_fits_the_cap() -> None:
    c = ctrl(prompt={"mode": "resample"})
    c.before_generation(np.full(30, 3))  # a resampling sampler drew prompt 3 thirty times
    g = np.repeat(np.arange(30), 10)  # 300 trials of one prompt: more than 255 per visit
    c.advantage_multipliers(g)
    m = c.after_advantage(g, (np.arange(300) % 3 == 0).astype(float))
    assert m[PREFIX + "num_prompts"] == 30  # thirty groups for Prompt-GDRO and the metrics
    assert c.classifier.num_seen == 1  # one pooled visit for the classifier
    # rate 1/3 kept when scaled to 85 / 255: pooled pass@8 = 1 - C(170, 8) / C(255, 8)
    expected = 1.0 - np.prod([(170 - j) / (255 - j) for j in range(8)])
    assert c.classifier.pass_at_k(np.array([3]))[0] == pytest.approx(expected)


def test_state_round_trip_continues_bit_identically() -> None:
    group = {"rollout": {"enable": True, "allocator": "bandit", "arm_utility": "informative"}}  # sampled selection: RNG state
    full = run(ctrl(**group), range(20))
    first = ctrl(**group)
    run(first, range(10))
    state = copy.deepcopy(first.state_dict())
    resumed = ctrl(**group)
    resumed.load_state_dict(state)
    assert run(resumed, range(10, 20)) == full[10:]


def test_state_from_other_settings_is_refused() -> None:
    c = ctrl()
    run(c, range(2))
    with pytest.raises(ValueError, match=r"gdro.prompt.eta: saved 0.65 vs configured 0.5"):
        ctrl(prompt={"eta": 0.5}).load_state_dict(c.state_dict())
    with pytest.raises(ValueError, match="actor_rollout_ref.rollout.n=4, this run has 8"):
        ctrl(rollout_n=8).load_state_dict(c.state_dict())
    with pytest.raises(ValueError, match=r"gdro.advantage_clip: saved None vs configured 5.0"):
        ctrl(advantage_clip=5.0).load_state_dict(c.state_dict())


def test_state_saved_before_advantage_clip_existed_resumes_as_no_clip() -> None:
    c = ctrl()
    run(c, range(3))
    old = copy.deepcopy(c.state_dict())
    del old["settings"]["advantage_clip"]  # the 0.1.0 pre-release state had no such key
    resumed = ctrl()
    resumed.load_state_dict(old)
    assert run(resumed, range(3, 6)) == run(c, range(3, 6))
    with pytest.raises(ValueError, match=r"gdro.advantage_clip: saved None vs configured 5.0"):
        ctrl(advantage_clip=5.0).load_state_dict(old)


def test_disabled_controller_is_inert() -> None:
    c = GDROController(resolve_gdro({"enable": False}), rollout_n=4)
    plan = c.before_generation(np.arange(5))
    assert plan.rollout_n.tolist() == [4] * 5 and plan.bins.tolist() == [0] * 5
    g = np.repeat(np.arange(5), 4)
    assert np.all(c.advantage_multipliers(g) == 1.0)
    assert c.after_advantage(g, np.ones(20)) == {}


def test_bad_group_index_is_refused() -> None:
    c = ctrl()
    c.before_generation(np.arange(3))
    with pytest.raises(ValueError, match=r"group_index must hold plan positions in \[0, 3\)"):
        c.advantage_multipliers(np.array([0, 3]))


@pytest.mark.parametrize("utility", ["expected_informative", "loss"])
def test_joint_mode_matches_the_three_controllers_called_directly(utility: str) -> None:
    from verl_gdro.allocators import RolloutGDRO

    c = ctrl(rollout={"enable": True, "allocator": "bandit", "arm_utility": utility})
    cls, prompt = OnlineDifficultyClassifier(), PromptGDRO(10, min_ess=0.8)
    alloc = RolloutGDRO(10, arm_utility=utility, selection="auto")
    for step in range(12):
        uids = np.random.default_rng(step).choice(40, size=16, replace=False)
        plan = c.before_generation(uids)
        bins = cls.bins(uids)
        n = alloc.allocate(bins)
        assert plan.bins.tolist() == bins.tolist() and plan.rollout_n.tolist() == n.tolist()
        g, acc = outcomes(uids, n, step)
        assert np.array_equal(c.advantage_multipliers(g), prompt.multipliers(bins[g]))
        c.after_advantage(g, acc)
        succ = np.bincount(g, weights=acc).astype(int)
        loss = 1.0 - succ / n
        prompt.update(bins, loss)
        alloc.update(bins, n, succ, loss)
        cls.observe(uids, succ, n)
    assert c.rollout.mu == alloc.mu and np.array_equal(c.rollout.arm_probs(), alloc.arm_probs())
    assert np.array_equal(c.prompt.scores, prompt.scores)


@pytest.mark.parametrize("failing", ["classifier", "prompt", "rollout"])
def test_a_refused_step_leaves_every_controller_as_it_was(monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """after_advantage is all or nothing: a refusal by any controller restores the others, and
    retrying the step then gives exactly the uninterrupted run's decisions."""
    group = {"rollout": {"enable": True}}
    reference = ctrl(**group)
    run(reference, range(3))
    c = ctrl(**group)
    run(c, range(2))

    uids = np.random.default_rng(1002).choice(40, size=16, replace=False)  # step 2 of run()
    plan = c.before_generation(uids)  # commits this step's bins: part of the plan, not the update
    g, acc = outcomes(uids, plan.rollout_n, 2)
    c.advantage_multipliers(g)
    before = copy.deepcopy(c.state_dict())
    target = getattr(c, failing)
    method = "observe_prepared" if failing == "classifier" else "update"
    real = getattr(target, method)

    def refuse(*args: object, **kwargs: object) -> None:
        raise ValueError(f"{failing} refuses this step")

    monkeypatch.setattr(target, method, refuse)
    with pytest.raises(ValueError, match=f"{failing} refuses this step"):
        c.after_advantage(g, acc)
    monkeypatch.setattr(target, method, real)
    after = c.state_dict()
    for name in ("classifier", "prompt", "rollout"):
        np.testing.assert_equal(after[name], before[name], err_msg=name)
    assert after["num_steps"] == before["num_steps"]

    c.after_advantage(g, acc)  # the same step again, accepted this time
    np.testing.assert_equal(c.state_dict(), reference.state_dict())
    assert run(c, range(3, 6)) == run(reference, range(3, 6))


@pytest.mark.parametrize(
    ("group", "mode"),
    [
        ({}, "joint"),  # the package default: both adversaries on
        ({"rollout": {"enable": False}}, "Prompt-GDRO"),
        ({"prompt": {"enable": False}}, "Rollout-GDRO"),
        ({"prompt": {"enable": False}, "rollout": {"enable": False}}, "GRPO"),
        ({"enable": False}, "GRPO"),
    ],
)
def test_mode_line_names_the_adversaries_and_key_settings(group: dict, mode: str) -> None:
    settings = resolve_gdro(group)
    assert mode_name(settings) == mode
    line = describe_mode(settings, rollout_n=4)
    assert "\n" not in line and line.startswith(f"verl-gdro mode: {mode}")
    if group.get("enable", True):
        assert "preset robust" in line and "classifier: 10 bins" in line
    assert ("prompt: failure_weighted sampling (decay 0.5, explore 0.2)" in line) == (mode in ("Prompt-GDRO", "joint"))
    if mode != "GRPO":
        reweight = describe_mode(resolve_gdro({**group, "prompt": {**group.get("prompt", {}), "mode": "reweight"}}))
        assert ("prompt: reweight, loss failure_rate, eta 0.65, max_weight 15" in reweight) == (mode != "Rollout-GDRO")
    assert ("rollout: per_prompt/failure_weighted (decay 0.5), n 2..12, mean n 4" in line) == (
        mode in ("Rollout-GDRO", "joint")
    )
    if mode == "joint":
        assert "gdro.prompt.enable=false for Rollout-GDRO alone" in line
    paper = describe_mode(resolve_gdro({**group, "preset": "paper"}))
    assert ("preset paper" in paper) == group.get("enable", True)


def test_the_documented_own_loop_runs():
    """docs/integration.md's "GDRO outside verl" block runs as written (numpy and the controller only)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "integration.md").read_text()
    (block,) = re.findall(r"```python own-loop\n(.*?)```", doc, flags=re.S)
    scope: dict = {}
    exec(compile(block, "docs/integration.md", "exec"), scope)
    assert scope["ctrl"].num_steps == 20 and scope["metrics"]["gdro/num_rollouts"] == 128
    assert "prompt" in scope["state"] and "rollout" in scope["state"]
