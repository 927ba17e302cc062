"""The options added from the evidence study: per-prompt allocation, failure-weighted and knapsack
utilities, the Prompt-GDRO effective-sample-size floor, the classifier's window counts, and the
study's statistics and method variants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_gdro.allocators import RolloutGDRO
from verl_gdro.classifier import OnlineDifficultyClassifier
from verl_gdro.demo.config import METHODS, method_gdro_group, parse_method
from verl_gdro.demo.stats import bootstrap_ci, markdown, rollouts_to_reach, summarise
from verl_gdro.prompt_gdro import (
    PromptGDRO,
    advantage_multipliers,
    effective_sample_size,
    ess_floor_multipliers,
    exp_weights,
    mix_probs,
)
from verl_gdro.rollout_gdro import (
    arm_utility_values,
    expected_informative_utility,
    per_prompt_allocation,
    smoothed_rate,
)
from verl_gdro.step.config import resolve_gdro
from verl_gdro.step.controller import GDROController

ARMS = np.arange(2, 13)

# ---------------------------------------------------------------------------------------------
# utilities
# ---------------------------------------------------------------------------------------------


def test_utilities_match_their_formulas_and_only_the_symmetric_one_is_symmetric():
    p = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    sym = expected_informative_utility(p, ARMS)
    np.testing.assert_allclose(arm_utility_values("expected_informative", p, ARMS), sym)
    np.testing.assert_allclose(arm_utility_values("failure_weighted", p, ARMS), (1 - p)[:, None] * sym)
    np.testing.assert_allclose(arm_utility_values("knapsack", p, ARMS), (p * (1 - p) ** 2)[:, None] * sym)
    # p <-> 1 - p: equal informative probability, but the failing prompt is worth more when weighted
    np.testing.assert_allclose(sym[0], sym[-1])
    fw = arm_utility_values("failure_weighted", p, ARMS)
    assert np.all(fw[0] > fw[-1])
    with pytest.raises(ValueError, match="full-information"):
        arm_utility_values("loss", p, ARMS)


@pytest.mark.parametrize("name", ["expected_informative", "failure_weighted", "knapsack"])
def test_utilities_are_concave_in_n(name):
    u = arm_utility_values(name, np.linspace(0.01, 0.99, 50), ARMS)
    inc = np.diff(u, axis=1)
    assert np.all(inc >= -1e-15) and np.all(np.diff(inc, axis=1) <= 1e-15)


def test_smoothed_rate_keeps_hard_prompts_hard_but_informative():
    assert smoothed_rate(np.array([0]), np.array([4]))[0] == pytest.approx(0.1)
    assert smoothed_rate(np.array([4]), np.array([4]))[0] == pytest.approx(0.9)
    assert smoothed_rate(np.array([0]), np.array([0]))[0] == 0.5  # unseen


# ---------------------------------------------------------------------------------------------
# per-prompt allocation
# ---------------------------------------------------------------------------------------------


def _brute(u: np.ndarray, n_min: int, budget: int) -> float:
    rows, arms = u.shape
    best = -np.inf
    for combo in itertools.product(range(arms), repeat=rows):
        if sum(n_min + c for c in combo) == budget:
            best = max(best, sum(u[i, c] for i, c in enumerate(combo)))
    return best


@settings(max_examples=60, deadline=None)
@given(
    p=st.lists(st.floats(0.02, 0.98), min_size=1, max_size=4),
    name=st.sampled_from(["expected_informative", "failure_weighted", "knapsack"]),
    n_mean=st.integers(2, 5),
)
def test_per_prompt_greedy_is_exact_budget_and_optimal(p, name, n_mean):
    arms = np.arange(2, 7)
    u = arm_utility_values(name, np.array(p), arms)
    budget = n_mean * len(p)
    n, price = per_prompt_allocation(u, 2, budget)
    assert int(n.sum()) == budget and n.min() >= 2 and n.max() <= 6
    got = sum(u[i, k - 2] for i, k in enumerate(n))
    assert got == pytest.approx(_brute(u, 2, budget), abs=1e-12)
    assert price >= 0.0


def test_failure_weighted_allocation_leans_to_the_hard_tail_and_symmetric_does_not():
    p = smoothed_rate(np.array([0, 0, 4, 4, 2, 2, 4, 4]), np.full(8, 4))  # 0.1, 0.1, 0.9, ..., 0.5
    fw, _ = per_prompt_allocation(arm_utility_values("failure_weighted", p, ARMS), 2, 32)
    sym, _ = per_prompt_allocation(arm_utility_values("expected_informative", p, ARMS), 2, 32)
    assert fw[0] > fw[2] and fw.sum() == sym.sum() == 32
    assert sym[0] == sym[2]  # p and 1 - p are the same to the symmetric utility


def test_per_prompt_allocation_rejects_infeasible_budgets():
    u = arm_utility_values("failure_weighted", np.array([0.5, 0.5]), ARMS)
    with pytest.raises(ValueError, match="infeasible"):
        per_prompt_allocation(u, 2, 3)
    with pytest.raises(ValueError, match="infeasible"):
        per_prompt_allocation(u, 2, 25)


def test_rollout_gdro_per_prompt_needs_rates_and_a_full_information_utility():
    r = RolloutGDRO(num_bins=10, allocator="per_prompt", arm_utility="failure_weighted")
    with pytest.raises(ValueError, match="needs rates"):
        r.allocate(np.zeros(4, dtype=int))
    n = r.allocate(np.zeros(4, dtype=int), rates=np.array([0.1, 0.5, 0.9, 0.5]))
    assert n.sum() == 16 and n[0] > n[2]
    with pytest.raises(ValueError, match="arm_utility"):
        RolloutGDRO(num_bins=10, allocator="per_prompt", arm_utility="informative")


def test_bandit_accepts_the_new_full_information_utilities():
    for name in ("failure_weighted", "knapsack"):
        r = RolloutGDRO(num_bins=3, arm_utility=name)
        assert r.effective_selection == "map"
        bins = np.array([0, 0, 1, 2])
        n = r.allocate(bins)
        info = r.update(bins, n, np.minimum(n, np.array([0, 1, 2, 4])))
        assert np.all(np.isfinite(info["utility"][[0, 1, 2]]))


# ---------------------------------------------------------------------------------------------
# Prompt-GDRO's effective-sample-size floor
# ---------------------------------------------------------------------------------------------


def test_ess_of_equal_weights_is_one_and_of_one_heavy_weight_is_small():
    assert effective_sample_size(np.ones(10)) == pytest.approx(1.0)
    assert effective_sample_size(np.r_[np.zeros(9), 1.0]) == pytest.approx(0.1)


@settings(max_examples=80, deadline=None)
@given(
    scores=st.lists(st.floats(0.0, 5.0), min_size=4, max_size=4),
    bins=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    rho=st.floats(0.05, 0.99),
)
def test_ess_floor_holds_and_the_step_is_the_largest_that_does(scores, bins, rho):
    s, b = np.array(scores), np.array(bins)
    w, scale = ess_floor_multipliers(s, b, eta=0.65, score_clip=10.0, gamma=0.01, max_weight=15.0, min_ess=rho)
    assert 0.0 <= scale <= 1.0
    assert effective_sample_size(w[b]) >= rho - 1e-9
    if 0.0 < scale < 0.99:
        # a slightly larger step breaks the floor: the bisection did not stop early
        bigger, _ = ess_floor_multipliers(s, b, eta=0.65 * (scale + 0.01), score_clip=10.0, gamma=0.01,
                                          max_weight=15.0, min_ess=0.0)
        assert effective_sample_size(bigger[b]) < rho + 1e-6


def _ess_floor_reference(scores, bins, eta, score_clip, gamma, max_weight, min_ess, iterations=40):
    """The floor's bisection with every step decided by the per-element ESS share (the code before
    the per-bin fast path), the reference the fast path must match bit for bit."""
    def weights_at(scale):
        q = mix_probs(exp_weights(scores, scale * eta, score_clip), gamma)
        return advantage_multipliers(q, q, bins, max_weight, "mean_one")

    w = weights_at(1.0)
    if bins.size == 0 or effective_sample_size(w[bins]) >= min_ess:
        return w, 1.0
    lo, hi = 0.0, 1.0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if effective_sample_size(weights_at(mid)[bins]) >= min_ess:
            lo = mid
        else:
            hi = mid
    return weights_at(lo), lo


@settings(max_examples=150, deadline=None)
@given(
    scores=st.lists(st.floats(-12.0, 12.0), min_size=2, max_size=12),
    seed=st.integers(0, 2**16),
    size=st.integers(1, 2048),
    rho=st.floats(0.05, 0.99),
    max_weight=st.sampled_from([1.5, 3.0, 15.0]),
    gamma=st.sampled_from([0.0, 0.01, 0.2]),
    on_a_step=st.booleans(),
)
def test_ess_floor_fast_path_is_bit_identical_to_the_per_element_bisection(
    scores, seed, size, rho, max_weight, gamma, on_a_step
):
    s = np.array(scores)
    b = np.random.default_rng(seed).integers(0, s.size, size=size)
    args = {"eta": 2.0, "score_clip": 10.0, "gamma": gamma, "max_weight": max_weight}
    if on_a_step:
        # a floor equal to the per-element share at a dyadic scale the bisection visits: the
        # per-bin share then lies within the margin and the per-element one must decide
        q = mix_probs(exp_weights(s, 0.375 * args["eta"], 10.0), gamma)
        rho = effective_sample_size(advantage_multipliers(q, q, b, max_weight, "mean_one")[b])
    w, scale = ess_floor_multipliers(s, b, min_ess=rho, **args)
    w_ref, scale_ref = _ess_floor_reference(s, b, min_ess=rho, **args)
    assert scale == scale_ref
    np.testing.assert_array_equal(w, w_ref)


def test_ess_floor_falls_back_to_the_per_element_share_next_to_the_floor(monkeypatch):
    import verl_gdro.prompt_gdro as pg

    s = np.array([3.0, 0.0, -1.0, 2.0])
    b = np.random.default_rng(1).integers(0, 4, size=300)
    q = mix_probs(exp_weights(s, 0.375 * 2.0, 10.0), 0.01)
    rho = effective_sample_size(advantage_multipliers(q, q, b, 15.0, "mean_one")[b])
    calls = []
    monkeypatch.setattr(pg, "effective_sample_size", lambda w: calls.append(1) or effective_sample_size(w))
    _, scale = pg.ess_floor_multipliers(s, b, eta=2.0, score_clip=10.0, gamma=0.01, max_weight=15.0, min_ess=rho)
    assert scale == 0.375  # reached exactly: the floor holds with equality there
    # only the steps whose per-bin share lies within the margin of the floor go per element: the
    # step at 0.375 itself (share equal to the floor) and at most a few beside it
    assert 1 <= len(calls) <= 15


def test_prompt_gdro_without_the_floor_is_unchanged_and_with_it_is_milder():
    bins = np.array([9] * 28 + [0, 1, 2, 3])
    losses = np.r_[np.full(28, 0.1), np.full(4, 0.9)]
    plain, floored = PromptGDRO(10), PromptGDRO(10, min_ess=0.8)
    for c in (plain, floored):
        for _ in range(10):
            c.update(bins, losses)
    resp = np.repeat(bins, 4)
    w_plain, w_floor = plain.multipliers(resp), floored.multipliers(resp)
    assert effective_sample_size(w_plain) < 0.8 <= effective_sample_size(w_floor) + 1e-9
    assert floored.last_eta_scale < 1.0 and plain.last_eta_scale == 1.0
    # the floor changes how far, not which way: the hard bins still weigh more than the easy one
    assert w_floor[-1] > w_floor[0]
    with pytest.raises(ValueError, match="min_ess"):
        PromptGDRO(10, min_ess=1.0)
    with pytest.raises(ValueError, match="min_ess"):
        PromptGDRO(10, min_ess=0.5, weight_normalization="raw")


def test_prompt_state_saved_before_the_floor_existed_loads_as_no_floor():
    c = PromptGDRO(10)
    c.update(np.array([0, 9]), np.array([1.0, 0.0]))
    state = c.state_dict()
    del state["config"]["min_ess"]
    d = PromptGDRO(10)
    d.load_state_dict(state)
    np.testing.assert_array_equal(d.scores, c.scores)
    with pytest.raises(ValueError, match="min_ess"):
        PromptGDRO(10, min_ess=0.5).load_state_dict(state)


# ---------------------------------------------------------------------------------------------
# config and controller
# ---------------------------------------------------------------------------------------------


def test_config_names_the_key_for_bad_combinations():
    with pytest.raises(ValueError, match=r"gdro\.rollout\.arm_utility='informative' is invalid with gdro\.rollout\.allocator=per_prompt"):
        resolve_gdro({"rollout": {"enable": True, "allocator": "per_prompt", "arm_utility": "informative"}})
    with pytest.raises(ValueError, match=r"gdro\.prompt\.min_ess"):
        resolve_gdro({"prompt": {"min_ess": 0.5, "weight_normalization": "raw"}})
    with pytest.raises(ValueError, match=r"gdro\.prompt\.min_ess"):
        resolve_gdro({"prompt": {"min_ess": 1.5}})
    with pytest.raises(ValueError, match=r"gdro\.rollout\.allocator"):
        resolve_gdro({"rollout": {"allocator": "greedy"}})


def _drive(ctrl: GDROController, steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        uids = rng.choice(64, 16, replace=False)
        plan = ctrl.before_generation(uids)
        out.append(plan.rollout_n.copy())
        g = np.repeat(plan.positions, plan.rollout_n)
        ctrl.advantage_multipliers(g)
        acc = (rng.random(g.size) < (uids[g] % 8) / 8.0).astype(float)
        ctrl.after_advantage(g, acc)
    return out


def test_per_prompt_controller_keeps_the_exact_budget_and_resume_reproduces_it():
    group = {"prompt": {"enable": True, "mode": "reweight", "min_ess": 0.7}, "rollout": {"enable": True, "allocator": "per_prompt",
                                                                      "arm_utility": "failure_weighted"}}
    a = GDROController.from_config(group, rollout_n=4)
    first = _drive(a, 6)
    assert all(int(n.sum()) == 64 for n in first)
    assert any(n.min() != n.max() for n in first[1:])  # it allocates unequally once prompts have history
    state = a.state_dict()
    b = GDROController.from_config(group, rollout_n=4)
    b.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate(_drive(a, 4, seed=1)), np.concatenate(_drive(b, 4, seed=1)))


def test_classifier_window_counts_pool_the_visits():
    c = OnlineDifficultyClassifier(window=2)
    c.observe([5, 7], [1, 4], [4, 4])
    c.observe([5], [3, ], [4])
    c.observe([5], [0], [2])  # the window holds the last two visits of uid 5
    s, t = c.window_counts([5, 7, 99])
    assert s.tolist() == [3, 4, 0] and t.tolist() == [6, 4, 0]


# ---------------------------------------------------------------------------------------------
# study: variants and statistics
# ---------------------------------------------------------------------------------------------


def test_method_variants_parse_and_apply_after_global_overrides():
    assert parse_method("grpo") == ("grpo", "grpo", ())
    label, method, over = parse_method("pp=rollout_gdro:rollout.allocator=per_prompt,gdro.classifier.k=1")
    assert (label, method) == ("pp", "rollout_gdro") and over == (("rollout.allocator", "per_prompt"), ("classifier.k", 1))
    g = method_gdro_group("x=prompt_gdro:prompt.eta=0.2", overrides=(("prompt.eta", 0.5), ("prompt.beta", 0.3)))
    assert g["prompt"]["eta"] == 0.2 and g["prompt"]["beta"] == 0.3 and g["prompt"]["enable"] is True
    with pytest.raises(ValueError, match="needs a label"):
        parse_method("prompt_gdro:prompt.eta=0.2")
    with pytest.raises(ValueError, match="defines the method"):
        method_gdro_group("x=grpo:prompt.enable=true")
    with pytest.raises(ValueError, match="not key=value"):
        parse_method("x=grpo:prompt.eta")
    assert set(METHODS) >= {"grpo", "prompt_gdro", "rollout_gdro"}


def test_bootstrap_interval_and_rollouts_to_reach():
    lo, hi = bootstrap_ci([0.1, 0.2, 0.3, 0.4, 0.5])
    assert 0.1 <= lo < 0.3 < hi <= 0.5
    assert bootstrap_ci([0.2]) == (0.2, 0.2)
    curve = [{"rollouts": 0, "worst_level_acc": 0.0}, {"rollouts": 100, "worst_level_acc": 0.2},
             {"rollouts": 200, "worst_level_acc": 0.5}]
    assert rollouts_to_reach(curve, 0.2) == 100 and rollouts_to_reach(curve, 0.6) is None


def test_summary_pairs_each_seed_with_grpos_same_seed():
    from types import SimpleNamespace

    ws = {"mean@8": 0.1, "pass@8": 0.4, "worst_level_acc": 0.0, "level_acc": {"0": 0.2, "1": 0.0}}

    def run(m, s, acc0, acc1):
        ev = {"mean@8": (acc0 + acc1) / 2, "pass@8": 0.5, "level_acc": {"0": acc0, "1": acc1},
              "worst_level_acc": min(acc0, acc1), "worst_level": 1}
        curve = [{"step": 0, "rollouts": 0, **ws}, {"step": 10, "rollouts": 50, **ev},
                 {"step": 20, "rollouts": 100, **ev}]
        return {"method": m, "seed": s, "rollouts": 100, "wall_s": 1.0, "curve": curve, **ev}

    results = {}
    for s in range(3):
        results[("grpo", s)] = run("grpo", s, 0.5 + 0.1 * s, 0.1)
        results[("x", s)] = run("x", s, 0.5 + 0.1 * s, 0.2)  # +0.1 on level 1 every seed
    cfg = SimpleNamespace(task="add", seeds=3, to_dict=lambda: {})
    summary = summarise(cfg, ["grpo", "x"], results, ws, 1.0)
    p = summary["paired"]["x"]
    assert p["worst_level_acc"]["mean"] == pytest.approx(0.1) and p["worst_level_acc"]["positive"] == 3
    assert p["level_acc"]["0"]["mean"] == pytest.approx(0.0)
    hardest = p["compute_to_grpo_final"]["hardest_level_acc"]
    assert hardest["per_seed"] == [0.5, 0.5, 0.5] and hardest["median"] == 0.5 and hardest["counted"] == 3
    # GRPO's mean@8 rose by 0.25-0.35 from the warm start: counted; x reached it at the first point
    assert p["compute_to_grpo_final"]["mean@8"]["per_seed"] == [0.5, 0.5, 0.5]
    assert p["mean@8"]["ci95"][0] is not None
    assert summary["testbed"]["grpo_gain_mean@8_per_seed"] == pytest.approx([0.2, 0.25, 0.3])
    md = markdown(summary)
    assert "[+" in md and "decide nothing" not in md
    # the per-level table carries intervals: level 1 gains +0.1 on every seed
    per_level = md.split("### Per level")[1]
    assert "+0.100 [+0.100, +0.100]* (3/3)" in per_level
    assert "every method consumed the same rollouts" in md
    # an arm that generated more (a filter arm, a longer run) must not be called "the same rollouts"
    results[("x", 0)] = {**results[("x", 0)], "rollouts": 130}
    md_unequal = markdown(summarise(cfg, ["grpo", "x"], results, ws, 1.0))
    assert "same rollouts" not in md_unequal and "methods generated different rollouts" in md_unequal

    # two seeds: per-seed differences only, no interval, no star, no median, and a line that says so
    two = {k: v for k, v in results.items() if k[1] < 2}
    summary2 = summarise(SimpleNamespace(task="add", seeds=2, to_dict=lambda: {}), ["grpo", "x"], two, ws, 1.0)
    p2 = summary2["paired"]["x"]
    assert p2["worst_level_acc"]["ci95"] == [None, None]
    assert p2["compute_to_grpo_final"]["hardest_level_acc"]["median"] is None
    md2 = markdown(summary2)
    assert "2 seeds decide nothing" in md2 and "verl-gdro study --task add" in md2
    assert "*" not in md2.split("decide nothing")[1].replace("**", "") and "[+" not in md2
    assert "+0.100 / +0.100" in md2 and "### Per level" not in md2


def test_compute_share_counts_only_what_grpo_lifted():
    """GRPO's final hardest level is reached at 0.5 of its rollouts; a figure GRPO lifted by less
    than MIN_LIFT is excluded, and one never reached says so."""
    from verl_gdro.demo.stats import compute_share

    def pt(r, h, m):
        return {"rollouts": r, "mean@8": m, "level_acc": {"0": 0.9, "1": h}}

    grpo = [pt(0, 0.0, 0.30), pt(100, 0.1, 0.32), pt(200, 0.3, 0.35)]
    fast = [pt(0, 0.0, 0.30), pt(100, 0.3, 0.50), pt(200, 0.5, 0.60)]
    slow = [pt(0, 0.0, 0.30), pt(100, 0.1, 0.30), pt(200, 0.2, 0.30)]
    assert compute_share(grpo, fast, "hardest_level_acc") == ("reached", 0.5)
    assert compute_share(grpo, slow, "hardest_level_acc") == ("never", None)
    assert compute_share(grpo, fast, "mean@8") == ("excluded", None)  # GRPO lifted mean@8 by 0.05 only


def test_late_drops_count_only_falls_of_the_second_half():
    """A fall of mean@8 by DROP or more between consecutive evaluations counts only after half the
    run; a smaller fall or an early one does not; results.md prints the count and its seeds."""
    from types import SimpleNamespace

    from verl_gdro.demo.stats import DROP, late_drops, markdown, summarise

    def curve(means):
        return [{"step": 10 * i, "rollouts": 50 * i, "mean@8": m, "pass@8": 0.5, "worst_level_acc": m,
                 "level_acc": {"0": m}} for i, m in enumerate(means)]

    #            steps 0    10   20 (early fall)  30   40 (late fall) 50 (small fall) 60
    bumpy = curve([0.1, 0.5, 0.5 - DROP, 0.6, 0.6 - DROP, 0.6 - DROP - 0.03, 0.7])
    assert late_drops(bumpy) == [{"step": 40, "from": 0.6, "to": pytest.approx(0.6 - DROP)}]
    assert late_drops(curve([0.1, 0.2, 0.3, 0.4])) == []
    ws = {"mean@8": 0.1, "pass@8": 0.4, "worst_level_acc": 0.1, "level_acc": {"0": 0.1}}

    def run(m, s, c):
        return {"method": m, "seed": s, "rollouts": 300, "wall_s": 1.0, "curve": c, "worst_level": 0,
                **{k: c[-1][k] for k in c[-1]}}

    results = {("grpo", s): run("grpo", s, curve([0.1, 0.3, 0.5, 0.6, 0.7, 0.7, 0.7])) for s in range(3)}
    results |= {("x", s): run("x", s, bumpy if s == 1 else curve([0.1, 0.3, 0.5, 0.6, 0.7, 0.7, 0.7])) for s in range(3)}
    summary = summarise(SimpleNamespace(task="add", seeds=3, to_dict=lambda: {}), ["grpo", "x"], results, ws, 1.0)
    assert summary["methods"]["x"]["late_drops"] == {"count": 1, "seeds_with": 1, "per_seed": [0, 1, 0]}
    table = markdown(summary).split("## Late drops")[1]
    assert "| grpo | 0 | 0/3 |" in table and "| x | 1 | 1/3 |" in table


def test_ess_share_by_bin_matches_the_per_element_share():
    """The per-bin share that decides most bisection steps equals the per-element one to far inside
    the margin (rounding only: at most a twentieth of it), on random scores, bin mixes, caps, mixing
    weights and step sizes, up to 16 bins and 4,096 elements."""
    from verl_gdro.prompt_gdro import _ESS_MARGIN, _ess_share_by_bin

    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(600):
        num_bins = int(rng.integers(2, 17))
        s = rng.uniform(-12, 12, num_bins)
        b = rng.integers(0, num_bins, int(rng.integers(1, 4097)))
        if rng.random() < 0.5:
            b[: int(b.size * 0.9)] = num_bins - 1  # one majority bin, as in training
        gamma, cap = float(rng.choice([0.0, 0.01, 0.2])), float(rng.choice([1.5, 3.0, 15.0]))
        eta = float(rng.choice([0.65, 2.0, 5.0]))
        share = _ess_share_by_bin(s, b, eta, 10.0, gamma, cap)
        for scale in rng.random(5):
            q = mix_probs(exp_weights(s, scale * eta, 10.0), gamma)
            exact = effective_sample_size(advantage_multipliers(q, q, b, cap, "mean_one")[b])
            worst = max(worst, abs(share(scale) - exact) / exact)
    assert worst < _ESS_MARGIN / 20


def test_interpolated_share_reads_the_crossing_between_evaluations():
    from verl_gdro.demo.stats import interpolated_share

    def curve(values: list[float]) -> list[dict]:
        return [{"rollouts": 100 * i, "mean@8": v} for i, v in enumerate(values)]

    grpo = curve([0.2, 0.4, 0.6])  # final 0.6 at 200 rollouts
    assert interpolated_share(grpo, curve([0.2, 0.5, 0.7]), "mean@8") == pytest.approx(150 / 200)
    assert interpolated_share(grpo, curve([0.2, 0.6, 0.7]), "mean@8") == pytest.approx(100 / 200)
    assert interpolated_share(grpo, curve([0.2, 0.3, 0.5]), "mean@8") is None


def test_train_stats_from_the_runs_rows():
    from verl_gdro.demo.run import _train_stats

    rows = [
        {"gdro/zero_adv_share": z, "train/distinct_prompts": 10.0 + i, "train/response_tokens_total": 5.0 * i}
        for i, z in enumerate([0.2, 0.2, 0.4, 0.8])
    ]
    t = _train_stats(rows)
    assert t == {
        "zero_adv_share": pytest.approx(0.4),
        "zero_adv_share_last_quarter": pytest.approx(0.8),
        "distinct_prompts": 13.0,
        "response_tokens": 15.0,
    }
