"""Tests of Rollout-GDRO (docs/algorithm.md, section 3): the exact-budget solver against brute force,
the conditioned sampler and its marginals, each equation by hand, the update order, the spec's
behavioural claims, validation and bit-identical resume."""

from __future__ import annotations

import itertools
import math
import pickle
from copy import deepcopy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_gdro.allocators import RolloutGDRO
from verl_gdro.rollout_gdro import (
    TIE_RTOL,
    InfeasibleBudgetError,
    argmax_toward,
    dual_update,
    exact_budget_marginals,
    exp_weights_arm_log_probs,
    exp_weights_arm_probs,
    expected_informative_utility,
    gain_with_shadow_price,
    neyman_implied_price,
    neyman_scores,
    sample_exact_budget,
    score_ema,
    smoothed_rate,
    solve_exact_budget,
)

HYP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------------------------
# Brute-force references
# --------------------------------------------------------------------------------------------


def feasible_configs(counts, arms, budget, log_probs):
    """Every arm-index tuple meeting the budget with no -inf entry, with its float score.

    The score is summed bin 0 first, the same order the DP adds terms in, so exactly tied
    optima are tied here too."""
    counts, arms = np.asarray(counts), np.asarray(arms)
    out = []
    for combo in itertools.product(range(arms.size), repeat=counts.size):
        n = arms[list(combo)]
        if int((counts * n).sum()) != budget:
            continue
        score = 0.0
        for b, a in enumerate(combo):
            score += log_probs[b, a]
        if score == -np.inf:
            continue
        out.append((combo, score))
    return out


def brute_force_solve(log_probs, counts, arms, budget):
    """The spec's rule, literally: maximum score (ties within TIE_RTOL), then the smallest
    sum |n_b - budget / sum(counts)|, then the lexicographically smallest arm vector."""
    counts, arms = np.asarray(counts), np.asarray(arms)
    configs = feasible_configs(counts, arms, budget, log_probs)
    if not configs:
        return None
    best = max(s for _, s in configs)
    tol = TIE_RTOL * max(1.0, abs(best))
    target = budget / counts.sum()
    near = [c for c, s in configs if s >= best - tol]

    def key(combo):
        n = arms[list(combo)]
        return (round(float(np.abs(n - target).sum()), 9), tuple(n))

    return arms[list(min(near, key=key))]


def brute_force_marginals(log_probs, counts, arms, budget):
    configs = feasible_configs(counts, arms, budget, log_probs)
    marg = np.zeros(np.asarray(log_probs).shape)
    z = 0.0
    for combo, score in configs:
        w = math.exp(score)
        z += w
        for b, a in enumerate(combo):
            marg[b, a] += w
    return marg / z


@st.composite
def budget_problems(draw, max_bins=4, max_arms=4):
    num_bins = draw(st.integers(1, max_bins))
    num_arms = draw(st.integers(1, max_arms))
    arms = sorted(draw(st.sets(st.integers(1, 8), min_size=num_arms, max_size=num_arms)))
    counts = draw(st.lists(st.integers(1, 4), min_size=num_bins, max_size=num_bins))
    # Small integers give many exact ties (exercising the tie-break); floats give unique optima.
    value = st.one_of(
        st.sampled_from([-2.0, -1.0, 0.0, -np.inf]),
        st.floats(-5, 5, allow_nan=False, allow_infinity=False),
    )
    flat = draw(st.lists(value, min_size=num_bins * num_arms, max_size=num_bins * num_arms))
    log_probs = np.array(flat, dtype=np.float64).reshape(num_bins, num_arms)
    top = int(np.sum(np.array(counts) * arms[-1]))
    budget = draw(st.integers(0, top + 2))
    return log_probs, np.array(counts), np.array(arms), budget


# --------------------------------------------------------------------------------------------
# solve_exact_budget
# --------------------------------------------------------------------------------------------


@HYP
@given(budget_problems())
def test_dp_matches_brute_force(problem):
    log_probs, counts, arms, budget = problem
    expected = brute_force_solve(log_probs, counts, arms, budget)
    if expected is None:
        with pytest.raises(InfeasibleBudgetError, match=f"budget={budget}"):
            solve_exact_budget(log_probs, counts, arms, budget)
        return
    got = solve_exact_budget(log_probs, counts, arms, budget)
    assert got.dtype == np.int64
    assert int((counts * got).sum()) == budget
    np.testing.assert_array_equal(got, expected)


@HYP
@given(budget_problems(max_bins=3, max_arms=4))
def test_marginals_match_brute_force(problem):
    log_probs, counts, arms, budget = problem
    if not feasible_configs(counts, arms, budget, log_probs):
        with pytest.raises(InfeasibleBudgetError):
            exact_budget_marginals(log_probs, counts, arms, budget)
        return
    got = exact_budget_marginals(log_probs, counts, arms, budget)
    np.testing.assert_allclose(got, brute_force_marginals(log_probs, counts, arms, budget), atol=1e-12)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-12)


def test_ties_prefer_smallest_deviation_from_the_mean_budget():
    # All configurations score the same; (1, 5) is lexicographically first but (3, 3) is uniform.
    got = solve_exact_budget(np.zeros((2, 5)), [1, 1], [1, 2, 3, 4, 5], 6)
    np.testing.assert_array_equal(got, [3, 3])


def test_equal_deviation_ties_prefer_smaller_arms_lexicographically():
    # target 3.5: (3, 4) and (4, 3) both deviate by 1 in total; bin 0 takes the smaller arm.
    got = solve_exact_budget(np.zeros((2, 5)), [1, 1], [1, 2, 3, 4, 5], 7)
    np.testing.assert_array_equal(got, [3, 4])


def test_floating_point_equal_scores_are_ties():
    # (2, 4) scores 0.3 + 0.0 = 0.3, (4, 2) scores 0.1 + 0.2 = 0.30000000000000004: equal in
    # exact arithmetic, so the lexicographic rule (not the rounding) must pick (2, 4).
    assert 0.1 + 0.2 > 0.3
    log_probs = np.array([[0.3, 0.1], [0.2, 0.0]])
    np.testing.assert_array_equal(solve_exact_budget(log_probs, [1, 1], [2, 4], 6), [2, 4])
    # A real difference well above the tolerance still wins.
    log_probs = np.array([[0.3, 0.1], [0.2 + 1e-6, 0.0]])
    np.testing.assert_array_equal(solve_exact_budget(log_probs, [1, 1], [2, 4], 6), [4, 2])


def test_score_dominates_deviation_and_forbidden_arms_are_never_chosen():
    log_probs = np.array([[0.0, -np.inf, -1.0], [0.0, -1.0, 0.5]])
    # arms 2, 4, 6 with counts 1, 1 and budget 8: (2, 6) = 0.5 beats (6, 2) = -1; (4, 4) forbidden.
    np.testing.assert_array_equal(solve_exact_budget(log_probs, [1, 1], [2, 4, 6], 8), [2, 6])


def test_counts_weight_the_budget():
    # 3 prompts in bin 0, 1 in bin 1, budget 4 * 4 = 16: 3 n0 + n1 = 16 allows (3, 7) and (4, 4).
    # Both score log .1 + log .8 (float addition commutes: an exact tie); deviation from 4 is
    # 1 + 3 for (3, 7) and 0 for (4, 4).
    log_probs = np.log(np.array([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8]]))
    np.testing.assert_array_equal(solve_exact_budget(log_probs, [3, 1], [3, 4, 7], 16), [4, 4])
    # Without the tie, the higher score wins even though it is further from uniform.
    log_probs[1, 2] = np.log(0.9)
    np.testing.assert_array_equal(solve_exact_budget(log_probs, [3, 1], [3, 4, 7], 16), [3, 7])


def test_common_divisor_infeasibility_and_reduction():
    # Every cost is even, so an odd budget is infeasible; an even one is solved as usual.
    with pytest.raises(InfeasibleBudgetError, match="budget=13"):
        solve_exact_budget(np.zeros((2, 3)), [2, 4], [2, 4, 6], 13)
    log_probs = np.array([[0.0, 1.0, 0.0], [0.5, 0.0, 0.0]])
    got = solve_exact_budget(log_probs, [2, 4], [2, 4, 6], 16)
    np.testing.assert_array_equal(
        got, brute_force_solve(log_probs, np.array([2, 4]), np.array([2, 4, 6]), 16)
    )


def test_empty_problem():
    np.testing.assert_array_equal(solve_exact_budget(np.zeros((0, 3)), [], [1, 2, 3], 0), [])
    with pytest.raises(InfeasibleBudgetError):
        solve_exact_budget(np.zeros((0, 3)), [], [1, 2, 3], 2)


def test_infeasible_error_is_a_value_error_naming_the_budget():
    with pytest.raises(ValueError, match="budget=100"):
        solve_exact_budget(np.zeros((2, 2)), [1, 1], [2, 3], 100)
    # All arms of a bin forbidden.
    with pytest.raises(InfeasibleBudgetError, match="budget=4"):
        solve_exact_budget(np.array([[0.0], [-np.inf]]), [1, 1], [2], 4)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((np.zeros((2, 3)), [1, 1], [1, 2, 3], -1), "budget"),
        ((np.zeros((2, 3)), [1, 1], [1, 2, 3], 2.5), "budget"),
        ((np.zeros((2, 3)), [1, 1], [1, 2, 3], True), "budget"),
        ((np.zeros((2, 2)), [1, 1], [1, 2, 3], 4), "log_probs"),
        ((np.zeros((2, 3)), [1, 0], [1, 2, 3], 4), "counts"),
        ((np.zeros((2, 3)), [1, 1.5], [1, 2, 3], 4), "counts"),
        ((np.zeros((2, 3)), [1, 1], [1, 3, 2], 4), "arms"),
        ((np.zeros((2, 3)), [1, 1], [0, 1, 2], 4), "arms"),
        ((np.zeros((2, 3)), [1, 1], [1, 1, 2], 4), "arms"),
        ((np.array([[0.0, np.nan, 0.0], [0, 0, 0]]), [1, 1], [1, 2, 3], 4), "log_probs"),
        ((np.array([[0.0, np.inf, 0.0], [0, 0, 0]]), [1, 1], [1, 2, 3], 4), "log_probs"),
    ],
)
def test_solver_validates_inputs(args, match):
    with pytest.raises(ValueError, match=match) as excinfo:
        solve_exact_budget(*args)
    assert not isinstance(excinfo.value, InfeasibleBudgetError)


def test_solver_on_a_realistic_problem_meets_the_budget():
    rng = np.random.default_rng(3)
    log_probs = np.log(rng.dirichlet(np.ones(11), size=10))
    counts = rng.multinomial(1014, np.ones(10) / 10) + 1
    got = solve_exact_budget(log_probs, counts, np.arange(2, 13), 4096)
    assert int((counts * got).sum()) == 4096
    assert got.min() >= 2 and got.max() <= 12


# --------------------------------------------------------------------------------------------
# Sampler under the exact budget
# --------------------------------------------------------------------------------------------


def test_sampler_distribution_matches_the_conditioned_product():
    log_probs = np.log(np.array([[0.5, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]))
    counts, arms, budget = np.array([1, 2, 1]), np.array([2, 3, 4, 5]), 12
    configs = feasible_configs(counts, arms, budget, log_probs)
    probs = np.array([math.exp(s) for _, s in configs])
    probs /= probs.sum()
    draws = 20000
    values, marg = sample_exact_budget(log_probs, counts, arms, budget, np.random.default_rng(7), size=draws)
    assert values.shape == (draws, 3) and marg.shape == (draws, 3)
    np.testing.assert_array_equal((values * counts).sum(axis=1), budget)
    index = {tuple(arms[list(c)]): i for i, (c, _) in enumerate(configs)}
    observed = np.bincount([index[tuple(v)] for v in values], minlength=len(configs))
    expected = probs * draws
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    dof = len(configs) - 1
    assert dof >= 5
    assert chi2 < dof + 5 * math.sqrt(2 * dof), (chi2, dof)
    # The returned marginals are the forward-backward marginals of the drawn arms.
    full = brute_force_marginals(log_probs, counts, arms, budget)
    idx = np.searchsorted(arms, values)
    np.testing.assert_allclose(marg, full[np.arange(3)[None, :], idx], atol=1e-12)


def test_single_sample_is_reproducible_and_never_draws_forbidden_arms():
    log_probs = np.array([[np.log(0.5), np.log(0.5), -np.inf], np.log([0.2, 0.3, 0.5])])
    for seed in range(20):
        a, ma = sample_exact_budget(log_probs, [1, 1], [2, 3, 4], 6, np.random.default_rng(seed))
        b, mb = sample_exact_budget(log_probs, [1, 1], [2, 3, 4], 6, np.random.default_rng(seed))
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ma, mb)
        assert a[0] != 4 and int(a.sum()) == 6


# --------------------------------------------------------------------------------------------
# Equations, by hand
# --------------------------------------------------------------------------------------------


def test_eq17_exp_weights_arm_probs_by_hand():
    scores = np.array([[0.0, 1.0, 2.0]])
    eta, gamma = 0.5, 0.1
    e = np.exp([0.0, 0.5, 1.0])
    expected = 0.9 * e / e.sum() + 0.1 / 3
    np.testing.assert_allclose(exp_weights_arm_probs(scores, eta, gamma)[0], expected, rtol=1e-14)
    np.testing.assert_allclose(exp_weights_arm_log_probs(scores, eta, gamma)[0], np.log(expected), rtol=1e-14)
    # gamma = 0: plain softmax; huge scores stay finite in log space.
    np.testing.assert_allclose(exp_weights_arm_probs(scores, eta, 0.0)[0], e / e.sum(), rtol=1e-14)
    logp = exp_weights_arm_log_probs(np.array([[0.0, 1e6]]), 1.0, 0.01)
    assert np.all(np.isfinite(logp))
    np.testing.assert_allclose(logp[0, 0], math.log(0.01 / 2), rtol=1e-12)


def test_eq18_gain_with_shadow_price_by_hand():
    got = gain_with_shadow_price(np.array([0.5, 0.7, 0.9]), np.array([2, 4, 6]), 0.1, 4)
    np.testing.assert_allclose(got, [0.5 + 0.2, 0.7, 0.9 - 0.2])


def test_eq19_score_ema_by_hand():
    np.testing.assert_allclose(score_ema(np.array([1.0, -1.0]), np.array([0.0, 2.0]), 0.4), [0.6, 0.2])


def test_eq21_dual_update_by_hand():
    assert dual_update(0.1, 5.0, 4, 0.05) == pytest.approx(0.15)
    assert dual_update(0.1, 3.0, 4, 0.05) == pytest.approx(0.05)
    assert dual_update(0.01, 2.0, 4, 0.05) == 0.0  # projected onto mu >= 0


def test_eq28_31_neyman_by_hand():
    counts, v, arms = np.array([2, 1]), np.array([0.25, 0.09]), np.array([2, 4])
    np.testing.assert_allclose(neyman_scores(counts, v, arms), [[-0.25, -0.125], [-0.045, -0.0225]])
    # (2 * 0.5 + 1 * 0.3) / 12 squared
    assert neyman_implied_price(counts, v, 12) == pytest.approx((1.3 / 12) ** 2)


def test_expected_informative_utility_by_hand():
    u = expected_informative_utility(np.array([0.5, 0.0, 1.0, 0.1]), np.array([2, 3]))
    np.testing.assert_allclose(u[0], [0.5, 0.75])
    np.testing.assert_allclose(u[1], [0.0, 0.0])
    np.testing.assert_allclose(u[2], [0.0, 0.0])
    np.testing.assert_allclose(u[3], [1 - 0.01 - 0.81, 1 - 0.001 - 0.729])


def test_argmax_ties_go_toward_the_mean_budget():
    arms = np.array([2, 3, 4, 5, 6])
    np.testing.assert_array_equal(argmax_toward(np.full((1, 5), 0.2), arms, 4), [4])
    # a unique maximum wins wherever it is
    np.testing.assert_array_equal(argmax_toward(np.array([[0.1, 0.1, 0.1, 0.1, 0.3]]), arms, 4), [6])
    # maxima at 2 and 5: 5 is closer to nbar = 4
    np.testing.assert_array_equal(argmax_toward(np.array([[0.3, 0.1, 0.1, 0.3, 0.2]]), arms, 4), [5])
    # equidistant maxima (2 and 6, or 3 and 5): the smaller arm
    np.testing.assert_array_equal(argmax_toward(np.array([[0.3, 0.1, 0.1, 0.2, 0.3]]), arms, 4), [2])
    np.testing.assert_array_equal(argmax_toward(np.array([[0.1, 0.3, 0.1, 0.3, 0.1]]), arms, 4), [3])
    # rows are independent
    np.testing.assert_array_equal(
        argmax_toward(np.array([[0.2] * 5, [0.1, 0.1, 0.1, 0.1, 0.3]]), arms, 4), [4, 6]
    )


# --------------------------------------------------------------------------------------------
# The controller: update order by hand
# --------------------------------------------------------------------------------------------


def test_expected_informative_update_follows_the_spec_order_by_hand():
    ctl = RolloutGDRO(2, n_min=2, n_max=4, n_mean=3, eta=1.0, gamma=0.0, score_ema=0.5, dual_lr=0.1)
    arms = np.array([2.0, 3.0, 4.0])
    # Step 1: bin 0 pooled rate 3 / 6 = 0.5 (first observation sets p), bin 1 rate 0 / 3.
    info = ctl.update([0, 0, 1], [3, 3, 3], [1, 2, 0], None)
    u0 = 1 - 0.5**arms - 0.5**arms
    g0 = u0 - 0.0 * (arms - 3)  # mu = 0 before the update
    s0 = 0.5 * g0
    np.testing.assert_allclose(info["utility"][0], u0)
    np.testing.assert_allclose(ctl.state_dict()["scores"][0], s0)
    np.testing.assert_allclose(ctl.state_dict()["scores"][1], 0.0)  # u = 0 for p = 0
    # nhat from the UPDATED probabilities: bin 0 prefers 4, bin 1 is flat -> 3 (toward nbar).
    assert info["nhat"] == pytest.approx((2 / 3) * 4 + (1 / 3) * 3)
    mu1 = 0.1 * (info["nhat"] - 3)
    assert ctl.mu == pytest.approx(mu1)
    # Step 2: bin 0 rate 1 / 3 smoothed with rate 0.5 -> p = 0.5 * 0.5 + 0.5 / 3; gains use mu1.
    info = ctl.update([0], [3], [1], None)
    p = 0.5 * 0.5 + 0.5 * (1 / 3)
    u = 1 - p**arms - (1 - p) ** arms
    g = u - mu1 * (arms - 3)
    s = 0.5 * s0 + 0.5 * g
    np.testing.assert_allclose(ctl.state_dict()["scores"][0], s, rtol=1e-13)
    np.testing.assert_allclose(info["gain"][0], g, rtol=1e-13)
    probs = np.exp(s) / np.exp(s).sum()
    nhat = float(arms[np.argmax(probs)])
    assert info["nhat"] == nhat
    assert ctl.mu == pytest.approx(max(0.0, mu1 + 0.1 * (nhat - 3)))


def test_played_arm_gain_is_importance_weighted_under_sample():
    ctl = RolloutGDRO(3, n_min=2, n_max=6, n_mean=4, arm_utility="informative", selection="sample", seed=5)
    # Make the learner non-uniform first, with a positive price.
    state = ctl.state_dict()
    state["scores"] = np.random.default_rng(0).normal(size=(3, 5))
    state["mu"] = 0.2
    ctl.load_state_dict(state)
    bins = np.array([0, 0, 1, 2, 2, 2])
    n = ctl.allocate(bins)
    logp = exp_weights_arm_log_probs(state["scores"][[0, 1, 2]], ctl.eta, ctl.gamma)
    marg = exact_budget_marginals(logp, [2, 1, 3], np.arange(2, 7), 24)
    successes = np.minimum(n, np.array([0, 1, 1, n[3] // 2, n[4], 1]))
    before = ctl.state_dict()["scores"]
    info = ctl.update(bins, n, successes, None)
    after = ctl.state_dict()["scores"]
    for b, rows in ((0, [0, 1]), (1, [2]), (2, [3, 4, 5])):
        played = int(n[rows[0]])
        a = played - 2
        share = np.mean([(0 < successes[i] < n[i]) for i in rows])
        gain = (share - 0.2 * (played - 4)) / marg[b, a]
        assert info["played_marginal"][b] == pytest.approx(marg[b, a], rel=1e-12)
        assert after[b, a] == pytest.approx(0.6 * before[b, a] + 0.4 * gain, rel=1e-12)
        others = np.arange(5) != a
        np.testing.assert_array_equal(after[b, others], before[b, others])


# --------------------------------------------------------------------------------------------
# Behaviour the spec claims
# --------------------------------------------------------------------------------------------


def simulate(ctl: RolloutGDRO, true_p, steps, seed=0, batch=64):
    rng = np.random.default_rng(seed)
    true_p = np.asarray(true_p)
    history = []
    for _ in range(steps):
        bins = rng.integers(0, true_p.size, batch)
        n = ctl.allocate(bins)
        successes = rng.binomial(n, true_p[bins])
        losses = 1.0 - successes / n
        info = ctl.update(bins, n, successes, losses)
        history.append((bins, n, info["mu"]))
    return history


def test_loss_utility_with_map_stays_at_grpo():
    """The spec's observation: played-arm bin loss + most-probable selection never leaves nbar."""
    ctl = RolloutGDRO(3, arm_utility="loss", selection="map")
    for _bins, n, mu in simulate(ctl, [0.05, 0.5, 0.95], 60):
        assert np.all(n == 4)
        assert mu == 0.0


def test_expected_informative_moves_rollouts_to_transition_bins_and_prices_them():
    ctl = RolloutGDRO(3)  # robust defaults: expected_informative, auto -> map
    history = simulate(ctl, [0.001, 0.5, 0.999], 80)
    mean_n = {
        b: np.mean([n[bins == b].mean() for bins, n, _ in history[40:] if np.any(bins == b)])
        for b in range(3)
    }
    # The bin near p = 0.5 gets more rollouts than the bins near 0 and 1 (the budget frontier).
    assert mean_n[1] > mean_n[0] + 0.25 and mean_n[1] > mean_n[2] + 0.25, mean_n
    assert mean_n[1] > 4.25
    # At mu = 0 every bin prefers more rollouts than nbar, so the price rises at the first step.
    assert history[0][2] > 0.0
    # When every bin is a transition bin, the price stays positive: it rations the extra rollouts.
    mus = [mu for _, _, mu in simulate(RolloutGDRO(3), [0.3, 0.5, 0.7], 60)]
    assert min(mus[5:]) > 0.0


def test_played_arm_utilities_explore_under_sample():
    ctl = RolloutGDRO(3, arm_utility="informative")  # auto -> sample
    assert ctl.effective_selection == "sample"
    seen = set()
    for _bins, n, _mu in simulate(ctl, [0.05, 0.5, 0.95], 30):
        seen.update(np.unique(n).tolist())
    assert len(seen) > 3


@HYP
@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=80),
    st.sampled_from(
        [
            {},
            {"selection": "sample"},
            {"arm_utility": "informative"},
            {"arm_utility": "loss", "selection": "map"},
            {"allocator": "neyman"},
            {"n_min": 3, "n_max": 5, "n_mean": 3},
            {"n_min": 2, "n_max": 12, "n_mean": 12},
        ]
    ),
    st.integers(0, 3),
)
def test_allocations_exact_and_in_range(bins, kwargs, warmup):
    ctl = RolloutGDRO(10, seed=1, **kwargs)
    rng = np.random.default_rng(warmup)
    for _ in range(warmup):
        wb = rng.integers(0, 10, 16)
        wn = ctl.allocate(wb)
        ctl.update(wb, wn, rng.binomial(wn, 0.3), rng.random(16))
    bins = np.array(bins)
    n = ctl.allocate(bins)
    assert n.shape == bins.shape and n.dtype == np.int64
    assert int(n.sum()) == ctl.n_mean * bins.size
    assert n.min() >= ctl.n_min and n.max() <= ctl.n_max
    for b in np.unique(bins):
        assert np.unique(n[bins == b]).size == 1


def test_allocate_empty_batch():
    assert RolloutGDRO(3).allocate([]).size == 0


# --------------------------------------------------------------------------------------------
# Neyman allocator
# --------------------------------------------------------------------------------------------


def test_neyman_allocation_matches_brute_force_and_updates_variances():
    ctl = RolloutGDRO(4, n_min=2, n_max=8, n_mean=4, allocator="neyman", score_ema=0.5)
    assert ctl.mu == 0.0
    bins = np.array([0, 0, 0, 1, 2, 2, 3])
    n0 = ctl.allocate(bins)  # v = 0.25 everywhere
    successes = np.array([0, 0, 0, 2, 1, 2, 4])
    successes = np.minimum(successes, n0)
    info = ctl.update(bins, n0, successes, None)
    v = np.full(4, 0.25)
    for b in range(4):
        m = bins == b
        p = successes[m].sum() / n0[m].sum()
        v[b] = max(0.5 * 0.25 + 0.5 * p * (1 - p), 0.01)
    np.testing.assert_allclose(info["variance"], v, rtol=1e-14)
    counts = np.array([3, 1, 2, 1])
    assert ctl.mu == pytest.approx(float((counts * np.sqrt(v)).sum() / 28) ** 2)
    n = ctl.allocate(bins)
    arms = np.arange(2, 9)
    expected = brute_force_solve(neyman_scores(counts, v, arms), counts, arms, 28)
    np.testing.assert_array_equal([n[bins == b][0] for b in range(4)], expected)
    # The floor: a bin with rate 0 for long enough sits at v = 0.01.
    for _ in range(20):
        ctl.update([0], [4], [0], None)
    assert ctl.state_dict()["variance"][0] == 0.01


@HYP
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.lists(st.floats(0.01, 0.25), min_size=4, max_size=4),
)
def test_neyman_dp_matches_brute_force(counts, v):
    counts = np.array(counts)
    v = np.array(v[: counts.size])
    arms = np.arange(2, 7)
    budget = 4 * int(counts.sum())
    scores = neyman_scores(counts, v, arms)
    np.testing.assert_array_equal(
        solve_exact_budget(scores, counts, arms, budget), brute_force_solve(scores, counts, arms, budget)
    )


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_bins": 0}, "num_bins"),
        ({"n_min": 1, "n_mean": 4}, "n_min"),
        ({"n_min": 5, "n_mean": 4}, "n_min"),
        ({"n_mean": 13, "n_max": 12}, "n_mean"),
        ({"n_mean": 4.5}, "n_mean"),
        ({"eta": 0.0}, "eta"),
        ({"eta": -1.0}, "eta"),
        ({"eta": float("nan")}, "eta"),
        ({"gamma": 1.0}, "gamma"),
        ({"gamma": -0.1}, "gamma"),
        ({"score_ema": 0.0}, "score_ema"),
        ({"score_ema": 1.5}, "score_ema"),
        ({"dual_lr": -0.1}, "dual_lr"),
        ({"allocator": "greedy"}, "allocator"),
        ({"arm_utility": "reward"}, "arm_utility"),
        ({"selection": "argmax"}, "selection"),
        ({"seed": -1}, "seed"),
    ],
)
def test_constructor_validation_names_the_argument(kwargs, name):
    kwargs = {"num_bins": 3, **kwargs}
    with pytest.raises(ValueError, match=name):
        RolloutGDRO(**kwargs)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([0, 3], [4, 4], [1, 1], [0.0, 0.0]), "bins"),
        (([0, -1], [4, 4], [1, 1], [0.0, 0.0]), "bins"),
        (([0, 1], [4, 13], [1, 1], [0.0, 0.0]), "n must lie"),
        (([0, 1], [1, 4], [1, 1], [0.0, 0.0]), "n must lie"),
        (([0, 1], [4, 4], [5, 1], [0.0, 0.0]), "successes"),
        (([0, 1], [4, 4], [-1, 1], [0.0, 0.0]), "successes"),
        (([0, 1], [4, 4], [1], [0.0, 0.0]), "equal lengths"),
        (([0, 1], [4, 4], [1, 1], [0.0]), "losses"),
        (([], [], [], []), "at least one"),
    ],
)
@pytest.mark.parametrize("kwargs", [{}, {"arm_utility": "loss"}, {"allocator": "neyman"}])
def test_update_validation_leaves_state_unchanged(args, match, kwargs):
    ctl = RolloutGDRO(3, **kwargs)
    simulate(ctl, [0.2, 0.5, 0.8], 3, batch=12)
    before = pickle.dumps(ctl.state_dict())
    with pytest.raises(ValueError, match=match):
        ctl.update(*args)
    assert pickle.dumps(ctl.state_dict()) == before


def test_played_arm_utilities_need_one_arm_per_bin_and_losses():
    ctl = RolloutGDRO(3, arm_utility="loss")
    before = pickle.dumps(ctl.state_dict())
    with pytest.raises(ValueError, match="losses"):
        ctl.update([0, 1], [4, 4], [1, 1], None)
    with pytest.raises(ValueError, match="same for every prompt"):
        ctl.update([0, 0], [3, 5], [1, 1], [0.1, 0.2])
    assert ctl.update_refusal([0, 0], [3, 5]) == "mixed_arms"
    assert ctl.update_refusal([0, 1], [5, 5]) == "unknown_draw"
    with pytest.raises(ValueError, match="no recorded draw"):
        ctl.update([0, 1], [5, 5], [1, 1], [0.1, 0.2])  # sample: no draw, and not the budget either
    assert pickle.dumps(ctl.state_dict()) == before


def test_nonfinite_losses_are_dropped_and_counted():
    ctl = RolloutGDRO(2, arm_utility="loss", selection="map")
    info = ctl.update([0, 0, 1], [4, 4, 4], [1, 2, 3], [0.5, np.nan, np.inf])
    assert info["dropped_losses"] == 2
    scores = ctl.state_dict()["scores"]
    assert scores[0, 2] == pytest.approx(0.4 * 0.5)  # arm 4 of bin 0: mean of the finite loss
    np.testing.assert_array_equal(scores[1], 0.0)  # bin 1 had no finite loss: untouched
    assert np.all(np.isfinite(scores))


def test_allocate_validation():
    ctl = RolloutGDRO(3, selection="sample")
    rng_before = pickle.dumps(ctl.state_dict())
    with pytest.raises(ValueError, match="bins"):
        ctl.allocate([0, 3])
    with pytest.raises(ValueError, match="bins"):
        ctl.allocate([0.5])
    assert pickle.dumps(ctl.state_dict()) == rng_before


# --------------------------------------------------------------------------------------------
# Checkpointing
# --------------------------------------------------------------------------------------------

RESUME_CONFIGS = [
    {},
    {"selection": "sample"},
    {"arm_utility": "informative"},
    {"arm_utility": "loss"},
    {"arm_utility": "loss", "selection": "map"},
    {"allocator": "neyman"},
]


def _run(ctl: RolloutGDRO, steps: range, seed: int):
    out = []
    true_p = np.linspace(0.02, 0.98, 10)
    for t in steps:
        rng = np.random.default_rng([seed, t])  # per-step data, independent of the controller
        bins = rng.integers(0, 10, 32)
        n = ctl.allocate(bins)
        successes = rng.binomial(n, true_p[bins])
        info = ctl.update(bins, n, successes, 1.0 - successes / n)
        out.append((n.copy(), info["mu"], info.get("nhat")))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", RESUME_CONFIGS)
def test_resume_at_step_100_is_bit_identical(kwargs):
    full = RolloutGDRO(10, seed=3, **kwargs)
    uninterrupted = _run(full, range(200), seed=11)

    first = RolloutGDRO(10, seed=3, **kwargs)
    head = _run(first, range(100), seed=11)
    saved = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = RolloutGDRO(10, seed=3, **kwargs)
    resumed.load_state_dict(saved)
    tail = _run(resumed, range(100, 200), seed=11)

    for (n_a, mu_a, nh_a), (n_b, mu_b, nh_b) in zip(uninterrupted, head + tail, strict=True):
        np.testing.assert_array_equal(n_a, n_b)
        assert mu_a == mu_b and nh_a == nh_b
    end_a, end_b = full.state_dict(), resumed.state_dict()
    for key in ("scores", "pass_rate", "variance"):
        np.testing.assert_array_equal(end_a[key], end_b[key])
    assert end_a["mu"] == end_b["mu"] and end_a["rng"] == end_b["rng"]


def test_state_dict_is_a_copy_and_rejects_other_configurations():
    ctl = RolloutGDRO(3, selection="sample")
    simulate(ctl, [0.2, 0.5, 0.8], 5, batch=12)
    state = ctl.state_dict()
    state["scores"][:] = 99.0
    assert not np.any(ctl.state_dict()["scores"] == 99.0)
    with pytest.raises(ValueError, match="n_max"):
        RolloutGDRO(3, n_max=10, selection="sample").load_state_dict(ctl.state_dict())
    with pytest.raises(ValueError, match="selection"):
        RolloutGDRO(3).load_state_dict(ctl.state_dict())
    with pytest.raises(ValueError, match="version"):
        RolloutGDRO(3).load_state_dict({"version": 0})
    # A restored sampler draws the same next allocation.
    twin = RolloutGDRO(3, selection="sample")
    twin.load_state_dict(deepcopy(ctl.state_dict()))
    bins = np.array([0, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(ctl.allocate(bins), twin.allocate(bins))


def test_update_after_resume_between_allocate_and_update_is_identical():
    """The sampler's marginals are cached by allocate(); a controller restored between allocate
    and update recomputes them and must land on exactly the same state."""
    ctl = RolloutGDRO(4, arm_utility="informative", seed=9)
    simulate(ctl, [0.1, 0.4, 0.6, 0.9], 10, batch=24)
    bins = np.random.default_rng(1).integers(0, 4, 24)
    n = ctl.allocate(bins)
    twin = RolloutGDRO(4, arm_utility="informative", seed=9)
    twin.load_state_dict(ctl.state_dict())
    successes = np.minimum(n, 1)
    info_a = ctl.update(bins, n, successes)
    info_b = twin.update(bins, n, successes)
    assert info_a["played_marginal"] == info_b["played_marginal"]
    assert pickle.dumps(ctl.state_dict()) == pickle.dumps(twin.state_dict())


@settings(max_examples=120, deadline=None)
@given(
    arms=st.integers(1, 12),
    step=st.integers(-7, 7),
    width=st.integers(1, 300),
    gaps=st.booleans(),
    integer=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_dp_shift_is_the_per_arm_copy_whatever_the_starts(arms, step, width, gaps, integer, seed):
    """The DP's shifted copies (one strided view when the starts are an arithmetic progression, as
    for consecutive arms; a copy per arm otherwise) equal row[start + j] + add, value for value."""
    from verl_gdro.rollout_gdro import _shift_into

    rng = np.random.default_rng(seed)
    first = 7 * 12 + 5
    starts = first + step * np.arange(arms)
    if gaps and arms > 2:
        starts[-1] += 1  # not a progression: the per-arm path
    size = int(starts.max()) + width + 3
    row = rng.integers(-50, 50, size) if integer else rng.normal(size=size)
    row[rng.random(size) < 0.2] = -9 if integer else -np.inf
    add = rng.integers(-5, 5, arms) if integer else rng.normal(size=arms)
    out = np.empty((arms, width), dtype=row.dtype)
    _shift_into(out, row, starts, add)
    expected = np.stack([row[k : k + width] + add[a] for a, k in enumerate(starts.tolist())])
    np.testing.assert_array_equal(out, expected)


# ---- the 2026 per-prompt utilities: HORA's hit, VIP's variance (issue 22) ----------------------


def test_hit_utility_by_hand():
    """HORA: Beta(S + 1, T - S + 1) posterior; P(no success in n) = prod_{j<n} (b + j) / (a + b + j).
    After 0 of 4: a = 1, b = 5, so P(miss 2) = 5/6 * 6/7 = 5/7 and P(miss 3) = 5/7 * 7/8 = 5/8."""
    from verl_gdro.rollout_gdro import hit_utility

    u = hit_utility(np.array([0.0, 4.0, 0.0]), np.array([4.0, 4.0, 0.0]), np.array([2, 3]))
    assert u[0] == pytest.approx([1 - 5 / 7, 1 - 5 / 8])
    # 4 of 4: a = 5, b = 1: P(miss 2) = 1/6 * 2/7
    assert u[1, 0] == pytest.approx(1 - (1 / 6) * (2 / 7))
    # no evidence: uniform prior, P(miss n) = 1 / (n + 1)
    assert u[2] == pytest.approx([1 - 1 / 3, 1 - 1 / 4])


def test_variance_utility_by_hand():
    """VIP: u = -p (1 - p) / n; the increments p (1 - p) / (n (n + 1)) shrink with n."""
    from verl_gdro.rollout_gdro import variance_utility

    u = variance_utility(np.array([0.5, 0.1]), np.array([2, 3, 4]))
    assert u[0] == pytest.approx([-0.125, -0.25 / 3, -0.0625])
    assert u[1] == pytest.approx([-0.045, -0.03, -0.0225])


@pytest.mark.parametrize("utility", ["hit", "variance", "failure_weighted", "knapsack", "expected_informative"])
def test_per_prompt_utilities_are_concave_and_spend_the_exact_budget(utility):
    """Each per-prompt utility's increments shrink with n (so the greedy allocation is optimal) and
    the allocation spends exactly n_mean * prompts within [n_min, n_max]; it matches brute force."""
    from itertools import product

    from verl_gdro.rollout_gdro import per_prompt_utility

    rng = np.random.default_rng(0)
    arms = np.arange(2, 13)
    t = rng.integers(0, 40, 200).astype(float) * rng.random(200)  # fractional: decayed evidence
    s = t * rng.random(200)
    u = per_prompt_utility(utility, s, t, arms)
    inc = np.diff(u, axis=1)
    assert np.all(np.diff(inc, axis=1) <= 1e-12)
    ctl = RolloutGDRO(num_bins=10, allocator="per_prompt", arm_utility=utility)
    n = ctl.allocate(rng.integers(0, 10, 200), counts=(s, t))
    assert n.sum() == 800 and n.min() >= 2 and n.max() <= 12
    # brute force on 4 prompts, budget 16, arms 2..6
    small = RolloutGDRO(num_bins=1, n_max=6, allocator="per_prompt", arm_utility=utility)
    s4, t4 = np.array([0.0, 1.0, 3.0, 7.5]), np.array([4.0, 4.0, 4.0, 8.0])
    table = per_prompt_utility(utility, s4, t4, np.arange(2, 7))
    best = max(
        table[np.arange(4), np.array(c) - 2].sum() for c in product(range(2, 7), repeat=4) if sum(c) == 16
    )
    got = small.allocate(np.zeros(4, dtype=int), counts=(s4, t4))
    assert got.sum() == 16 and table[np.arange(4), got - 2].sum() == pytest.approx(best)


def test_hit_leans_to_hard_prompts_and_needs_counts():
    """A prompt that failed 0/8 gets more rollouts than one that passed 8/8 under HORA; a rate alone
    is refused (the posterior needs the counts), and so is 'hit' outside per_prompt."""
    ctl = RolloutGDRO(num_bins=10, allocator="per_prompt", arm_utility="hit")
    n = ctl.allocate([0, 9], counts=(np.array([0.0, 8.0]), np.array([8.0, 8.0])))
    assert n[0] > n[1] and n.sum() == 8
    with pytest.raises(ValueError, match="needs counts"):
        ctl.allocate([0, 9], rates=[0.1, 0.9])
    with pytest.raises(ValueError, match="arm_utility"):
        RolloutGDRO(num_bins=10, allocator="bandit", arm_utility="hit")
    with pytest.raises(ValueError, match="counts must hold"):
        ctl.allocate([0, 9], counts=(np.array([3.0, 1.0]), np.array([2.0, 1.0])))


def test_rates_and_counts_give_the_same_allocation_for_rate_utilities():
    """The counts path smooths the counts exactly as smoothed_rate does: same n as passing rates."""
    rng = np.random.default_rng(3)
    t = rng.integers(0, 30, 64).astype(float)
    s = np.floor(t * rng.random(64))
    bins = rng.integers(0, 10, 64)
    for utility in ("failure_weighted", "variance"):
        a = RolloutGDRO(num_bins=10, allocator="per_prompt", arm_utility=utility).allocate(bins, counts=(s, t))
        b = RolloutGDRO(num_bins=10, allocator="per_prompt", arm_utility=utility).allocate(bins, rates=smoothed_rate(s, t))
        np.testing.assert_array_equal(a, b)


def _drawn(ctl: RolloutGDRO, bins: np.ndarray) -> tuple[np.ndarray, dict[int, float]]:
    """Allocate ``bins`` and return (n, the drawn arm's marginal per present bin), recomputed
    independently from the scores the draw used."""
    logp = exp_weights_arm_log_probs(ctl.state_dict()["scores"][np.unique(bins)], ctl.eta, ctl.gamma)
    counts = np.bincount(bins, minlength=ctl.num_bins)[np.unique(bins)]
    n = ctl.allocate(bins)
    present = np.unique(bins)
    played = np.array([n[bins == b][0] for b in present])
    marg = exact_budget_marginals(logp, counts, ctl.arms, ctl.n_mean * bins.size)
    return n, {int(b): float(marg[i, played[i] - ctl.n_min]) for i, b in enumerate(present)}


def test_partial_consumption_weights_each_bin_by_its_draw():
    """A step that trains only part of a generation call (an async trainer's subset, a failed or
    filtered group) no longer stops training: every bin's gain is weighted by the marginal of the
    draw that chose its arm, computed by hand here from the same scores."""
    ctl = RolloutGDRO(3, arm_utility="loss", seed=3)
    simulate(ctl, [0.2, 0.5, 0.8], 5, batch=12)
    bins = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 2])
    n, marg = _drawn(ctl, bins)
    keep = np.array([0, 1, 3, 5, 6])  # a subset: no longer the call's exact budget
    before = ctl.state_dict()
    losses = np.array([0.3, 0.5, 0.2, 0.9, 0.1])
    info = ctl.update(bins[keep], n[keep], np.ones(keep.size, dtype=int), losses)
    after = ctl.state_dict()["scores"]
    for b, mean_loss in ((0, 0.4), (1, 0.2), (2, 0.5)):
        a = int(n[bins == b][0]) - ctl.n_min
        gain = (mean_loss - before["mu"] * (n[bins == b][0] - ctl.n_mean)) / marg[b]
        assert after[b, a] == pytest.approx(0.6 * before["scores"][b, a] + 0.4 * gain)
    assert info["unweighted_bins"] == 0


def test_bins_of_two_draws_use_their_own_draw_and_ambiguous_bins_are_left_out():
    """Two generation calls before one update (DAPO refills): a bin drawn in one call only is
    weighted by that call's marginal; a bin given the same arm by both calls cannot be attributed
    and is left out of the update (counted); the other bins still learn."""
    ctl = RolloutGDRO(4, arm_utility="informative", seed=0)
    b1, b2 = np.array([0, 0, 1, 1, 2]), np.array([2, 3, 3])
    n1, m1 = _drawn(ctl, b1)
    n2, m2 = _drawn(ctl, b2)
    same = int(n1[b1 == 2][0]) == int(n2[b2 == 2][0])
    bins, n = np.r_[b1, b2], np.r_[n1, n2]
    if not same:  # bin 2 got two arms: a mixed step, refused as a whole
        assert ctl.update_refusal(bins, n) == "mixed_arms"
        return
    before = ctl.state_dict()["scores"]
    s = np.ones(bins.size, dtype=int)
    info = ctl.update(bins, n, s)
    after = ctl.state_dict()["scores"]
    assert info["unweighted_bins"] == 1 and 2 not in info["played_marginal"]
    assert info["played_marginal"] == pytest.approx({0: m1[0], 1: m1[1], 3: m2[3]})
    np.testing.assert_array_equal(after[2], before[2])  # the ambiguous bin is untouched


def test_draw_record_is_saved_so_a_resume_weighs_the_same():
    ctl = RolloutGDRO(3, arm_utility="loss", seed=1)
    simulate(ctl, [0.2, 0.5, 0.8], 4, batch=12)
    bins = np.array([0, 1, 1, 2, 2, 2])
    n = ctl.allocate(bins)
    twin = RolloutGDRO(3, arm_utility="loss", seed=1)
    twin.load_state_dict(pickle.loads(pickle.dumps(ctl.state_dict())))
    args = (bins[:4], n[:4], np.ones(4, dtype=int), np.array([0.1, 0.2, 0.3, 0.4]))
    ctl.update(*args)
    twin.update(*args)
    assert pickle.dumps(ctl.state_dict()) == pickle.dumps(twin.state_dict())
    old = ctl.state_dict()
    old.pop("draws")  # a state saved before draws were recorded still loads
    RolloutGDRO(3, arm_utility="loss", seed=1).load_state_dict(old)
