"""Metrics (docs/algorithm.md, section 4): names, hand-computed Eqs. 32-33, finiteness always."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_gdro.metrics import (
    METRIC_NAMES,
    PER_BIN_METRICS,
    PRESENT_ONLY_METRICS,
    SCALAR_METRICS,
    bin_accuracy,
    bin_key,
    bin_rollouts,
    bin_shares,
    lead_lag,
    metric_keys,
    per_bin_series,
    step_keys,
    step_metrics,
    step_metrics_prepared,
    weight_entropy,
    weighted_shares,
    wse_proxy,
    wse_uniform,
)
from verl_gdro.prompt_gdro import PromptGDRO

# The spec-4 list, written out independently of the module: every one must be logged.
SPEC4_PER_BIN = {"prompt_share", "prompt_weight", "q", "score", "acc", "rollout_n", "budget_share", "loss", "omega"}
SPEC4_SCALARS = {
    "mu_data",
    "mu_weight",
    "lead_lag",
    "weight_entropy",
    "mean_n",
    "shadow_price",
    "wse",
    "wse_uniform",
    "controller_time_s",
    "dropped_nonfinite",
}


def test_every_spec4_metric_is_named() -> None:
    assert SPEC4_PER_BIN <= set(PER_BIN_METRICS)
    assert SPEC4_SCALARS <= set(SCALAR_METRICS)
    assert METRIC_NAMES == PER_BIN_METRICS + SCALAR_METRICS
    assert len(set(METRIC_NAMES)) == len(METRIC_NAMES)
    keys = metric_keys(3)
    assert "gdro/prompt_share/bin_2" in keys and "gdro/lead_lag" in keys and "gdro/wse_uniform" in keys
    assert all(k.startswith("gdro/") for k in keys)
    assert len(keys) == 3 * len(PER_BIN_METRICS) + len(SCALAR_METRICS)
    assert bin_key("budget_share", 7) == "gdro/budget_share/bin_7"


# Hand case: B = 3, four prompts.
BINS = np.array([0, 0, 2, 1])
SUCC = np.array([1.0, 0.0, 3.0, 2.0])
N = np.array([2.0, 2.0, 4.0, 8.0])
W = np.array([2.0, 1.0, 0.5])


def test_per_bin_quantities_hand_case() -> None:
    shares, counts = bin_shares(BINS, 3)
    np.testing.assert_allclose(shares, [0.5, 0.25, 0.25])
    np.testing.assert_array_equal(counts, [2, 1, 1])
    # pooled: bin 0 (1 + 0) / (2 + 2); bin 1 2 / 8; bin 2 3 / 4
    np.testing.assert_allclose(bin_accuracy(BINS, SUCC, N, 3), [0.25, 0.25, 0.75])
    n_b, budget = bin_rollouts(BINS, N, 3)
    np.testing.assert_allclose(n_b, [2.0, 8.0, 4.0])
    np.testing.assert_allclose(budget, [4 / 16, 8 / 16, 4 / 16])


def test_eq32_lead_lag_hand_case() -> None:
    shares = np.array([0.5, 0.25, 0.25])
    # mass = share * w = [1.0, 0.25, 0.125], total 1.375
    np.testing.assert_allclose(weighted_shares(shares, W), [1.0 / 1.375, 0.25 / 1.375, 0.125 / 1.375])
    mu_data, mu_weight, lag = lead_lag(shares, W)
    assert mu_data == pytest.approx(0 * 0.5 + 1 * 0.25 + 2 * 0.25)
    assert mu_weight == pytest.approx((0.25 + 2 * 0.125) / 1.375)
    assert lag == pytest.approx((0.25 + 2 * 0.125) / 1.375 - 0.75)
    assert lead_lag(shares, np.ones(3))[2] == pytest.approx(0.0)  # unit weights: no lead, no lag


def test_eq33_wse_and_uniform_baseline_hand_case() -> None:
    shares = np.array([0.5, 0.25, 0.25])
    acc = np.array([0.25, 0.25, 0.75])
    sigma = math.sqrt(0.25 * 0.75)
    expected = 0.5 * sigma / math.sqrt(2) + 0.25 * sigma / math.sqrt(8) + 0.25 * sigma / math.sqrt(4)
    assert wse_proxy(shares, acc, np.array([2.0, 8.0, 4.0])) == pytest.approx(expected)
    assert wse_uniform(shares, acc, 4.0) == pytest.approx(sigma / 2.0)
    # An absent bin contributes nothing even with n = 0; a solved bin (p = 1) has sigma = 0.
    assert wse_proxy(np.array([1.0, 0.0]), np.array([0.5, 0.5]), np.array([4.0, 0.0])) == pytest.approx(0.25)
    assert wse_proxy(np.array([1.0]), np.array([1.0]), np.array([4.0])) == 0.0


def test_weight_entropy_hand_case() -> None:
    assert weight_entropy(np.array([0.5, 0.25, 0.25])) == pytest.approx(-(0.5 * math.log(0.5) + 0.5 * math.log(0.25)))
    assert weight_entropy(np.full(4, 0.25)) == pytest.approx(math.log(4))
    assert weight_entropy(np.array([1.0, 0.0])) == 0.0


def test_step_metrics_hand_case_end_to_end() -> None:
    q = np.array([0.6, 0.3, 0.1])
    m = step_metrics(
        3,
        BINS,
        SUCC,
        N,
        n_mean=4.0,
        prompt_weights=W,
        q=q,
        scores=np.array([1.0, 0.5, 0.0]),
        omega=np.array([2.0, 1.5, 1.0]),
        bin_losses=np.array([0.75, 0.75, 0.25]),
        shadow_price=0.3,
        controller_time_s=0.002,
        dropped_nonfinite=2,
        dropped_nonfinite_total=5,
    )
    assert list(m) == metric_keys(3)
    np.testing.assert_allclose(per_bin_series(m, "prompt_share", 3), [0.5, 0.25, 0.25])
    np.testing.assert_allclose(per_bin_series(m, "prompt_weight", 3), W)
    np.testing.assert_allclose(per_bin_series(m, "q", 3), q)
    np.testing.assert_allclose(per_bin_series(m, "acc", 3), [0.25, 0.25, 0.75])
    np.testing.assert_allclose(per_bin_series(m, "rollout_n", 3), [2.0, 8.0, 4.0])
    np.testing.assert_allclose(per_bin_series(m, "budget_share", 3), [0.25, 0.5, 0.25])
    np.testing.assert_allclose(per_bin_series(m, "loss", 3), [0.75, 0.75, 0.25])
    np.testing.assert_allclose(per_bin_series(m, "count", 3), [2, 1, 1])
    assert m["gdro/mean_n"] == 4.0
    assert m["gdro/lead_lag"] == pytest.approx(0.5 / 1.375 - 0.75)
    assert m["gdro/shadow_price"] == 0.3
    assert m["gdro/wse_uniform"] == pytest.approx(math.sqrt(0.25 * 0.75) / 2)
    assert m["gdro/weight_entropy"] == pytest.approx(weight_entropy(q))
    assert m["gdro/num_prompts"] == 4 and m["gdro/num_rollouts"] == 16
    assert m["gdro/dropped_nonfinite"] == 2 and m["gdro/dropped_nonfinite_total"] == 5
    assert m["gdro/controller_time_s"] == 0.002
    assert all(isinstance(v, float) for v in m.values())


def test_absent_bins_log_true_zeros_and_no_averages() -> None:
    # issue 13: a per-bin average (weight, loss, acc, n) of a bin absent from the step has no
    # value; logging a placeholder made every mean over steps in wandb/TensorBoard wrong
    m = step_metrics(4, [1, 1], [1, 2], [4, 4], prompt_weights=[3.0, 0.5, 7.0, 7.0], bin_losses=[9.0, 0.5, 9.0, 9.0])
    assert set(PRESENT_ONLY_METRICS) == {"prompt_weight", "loss", "acc", "rollout_n", "zero_adv"}
    for b in (0, 2, 3):
        for name in ("prompt_share", "count", "budget_share"):
            assert m[bin_key(name, b)] == 0.0, (name, b)
        for name in PRESENT_ONLY_METRICS:
            assert bin_key(name, b) not in m, (name, b)
        for name in ("q", "score", "omega"):  # controller state: defined for every bin
            assert bin_key(name, b) in m
    assert m["gdro/loss/bin_1"] == 0.5 and m["gdro/prompt_weight/bin_1"] == 0.5
    assert list(m) == step_keys([0, 2, 0, 0])
    assert set(m) < set(metric_keys(4))
    np.testing.assert_array_equal(per_bin_series(m, "rollout_n", 4), [np.nan, 4.0, np.nan, np.nan])
    assert m["gdro/mu_data"] == 1.0 and m["gdro/lead_lag"] == 0.0
    assert all(np.isfinite(v) for v in m.values())


def test_empty_step_and_adversaries_off_give_neutral_finite_values() -> None:
    m = step_metrics(5, [], [], [])
    assert list(m) == step_keys(np.zeros(5))
    assert all(np.isfinite(v) for v in m.values())
    assert m["gdro/num_prompts"] == 0.0 and m["gdro/wse"] == 0.0
    off = step_metrics(5, [0, 4], [1, 1], [4, 4])
    np.testing.assert_allclose(per_bin_series(off, "prompt_weight", 5)[[0, 4]], 1.0)
    np.testing.assert_allclose(per_bin_series(off, "q", 5), 0.2)
    np.testing.assert_allclose(per_bin_series(off, "omega", 5), 1.0)
    assert off["gdro/weight_entropy"] == pytest.approx(math.log(5))
    assert off["gdro/lead_lag"] == 0.0 and off["gdro/shadow_price"] == 0.0
    # Fixed n = nbar: the proxy equals its compute-matched baseline.
    assert off["gdro/wse"] == pytest.approx(off["gdro/wse_uniform"])


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"bins": [0, 3]}, "bins"),
        ({"bins": [0.5, 1]}, "bins"),
        ({"successes": [5, 1]}, "successes"),
        ({"successes": [-1, 1]}, "successes"),
        ({"successes": [np.nan, 1]}, "successes"),
        ({"n": [0, 4]}, r"^n\b"),
        ({"n": [4]}, r"^n\b"),
        ({"q": [0.5, 0.5]}, "q"),
        ({"prompt_weights": [1.0, np.inf, 1.0]}, "prompt_weights"),
        ({"shadow_price": np.nan}, "shadow_price"),
        ({"num_bins": 0}, "num_bins"),
        ({"n_mean": -1.0}, "n_mean"),
    ],
)
def test_malformed_input_raises_naming_the_argument(kwargs: dict, name: str) -> None:
    args = {"num_bins": 3, "bins": [0, 1], "successes": [1, 1], "n": [4, 4], **kwargs}
    with pytest.raises(ValueError, match=name):
        step_metrics(**args)


def test_with_a_real_prompt_gdro_the_logged_weights_average_to_one_over_responses() -> None:
    pg = PromptGDRO(4)
    pg.update([0, 0, 1, 2, 3], [1.0, 0.9, 0.5, 0.1, 0.0])
    bins = np.array([0, 1, 1, 3])
    n = np.array([6, 4, 2, 4])
    response_bins = np.repeat(bins, n)
    w = pg.bin_multipliers(response_bins)
    m = step_metrics(4, bins, [1, 2, 1, 4], n, prompt_weights=w, q=pg.bin_probs(), scores=pg.scores, omega=pg.omega())
    logged = per_bin_series(m, "prompt_weight", 4)
    assert np.mean(logged[response_bins]) == pytest.approx(1.0)
    np.testing.assert_array_equal(logged[response_bins], pg.multipliers(response_bins))
    assert m["gdro/lead_lag"] < 0  # hardest bin weighted up: the weights lead toward bin 0


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 10).flatmap(
        lambda B: st.tuples(
            st.just(B),
            st.lists(st.tuples(st.integers(0, B - 1), st.integers(1, 12), st.floats(0.0, 1.0)), max_size=50),
            st.lists(st.floats(0.0, 15.0), min_size=B, max_size=B),
        )
    )
)
def test_metrics_always_finite_and_shares_sum_to_one(case) -> None:
    B, prompts, weights = case
    bins = np.array([p[0] for p in prompts], dtype=np.int64)
    n = np.array([p[1] for p in prompts], dtype=np.float64)
    succ = np.floor(np.array([p[2] for p in prompts]) * n)
    m = step_metrics(B, bins, succ, n, prompt_weights=np.array(weights))
    assert list(m) == step_keys(np.bincount(bins, minlength=B))
    assert all(np.isfinite(v) for v in m.values())
    if prompts:
        assert per_bin_series(m, "prompt_share", B).sum() == pytest.approx(1.0)
        assert per_bin_series(m, "budget_share", B).sum() == pytest.approx(1.0)
        assert 0.0 <= m["gdro/mu_data"] <= B - 1 and 0.0 <= m["gdro/mu_weight"] <= B - 1
        assert m["gdro/mean_n"] * len(prompts) == pytest.approx(n.sum())


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10), st.lists(st.tuples(st.integers(0, 9), st.integers(1, 12), st.floats(0.0, 1.0)), max_size=40))
def test_step_metrics_per_bin_values_are_exactly_those_of_the_helpers(B: int, prompts: list) -> None:
    """step_metrics shares the helpers' bincounts (issue 13, per-step cost); the logged values
    must stay bit-identical to bin_shares / bin_accuracy / bin_rollouts."""
    bins = np.array([p[0] % B for p in prompts], dtype=np.int64)
    n = np.array([p[1] for p in prompts], dtype=np.float64)
    succ = np.floor(np.array([p[2] for p in prompts]) * n)
    m = step_metrics(B, bins, succ, n)
    shares, counts = bin_shares(bins, B)
    acc = bin_accuracy(bins, succ, n, B)
    n_b, budget = bin_rollouts(bins, n, B)
    present = counts > 0
    for name, ref, only_present in (("prompt_share", shares, False), ("count", counts, False), ("acc", acc, True),
                                    ("rollout_n", n_b, True), ("budget_share", budget, False)):
        got = per_bin_series(m, name, B)
        keep = present if only_present else np.ones(B, dtype=bool)
        np.testing.assert_array_equal(got[keep], np.asarray(ref, dtype=np.float64)[keep], err_msg=name)


def test_prepared_metrics_equal_step_metrics_and_still_refuse_a_non_finite_value() -> None:
    """The controller's path (inputs built in shape, argument checks skipped) logs the very values
    of step_metrics, and a non-finite input still raises, naming the metric it would have made."""
    rng = np.random.default_rng(3)
    B = 6
    bins = rng.integers(0, B, 40)
    n = rng.integers(2, 13, 40).astype(np.float64)
    succ = np.floor(rng.random(40) * (n + 1))
    per_bin = (rng.uniform(0.1, 3, B), rng.dirichlet(np.ones(B)), rng.normal(size=B), rng.uniform(1, 2, B),
               rng.random(B))
    names = ("prompt_weights", "q", "scores", "omega", "bin_losses")
    ref = step_metrics(B, bins, succ, n, n_mean=4.0, shadow_price=0.3, controller_time_s=0.01,
                       **dict(zip(names, per_bin, strict=True)))
    got = step_metrics_prepared(B, bins, succ, n, n_mean=4.0, per_bin=per_bin, shadow_price=0.3,
                                controller_time_s=0.01)
    assert got == ref
    assert step_metrics_prepared(B, bins, succ, n, n_mean=4.0, per_bin=(None,) * 5) == step_metrics(
        B, bins, succ, n, n_mean=4.0)
    bad = list(per_bin)
    bad[2] = bad[2].copy()
    bad[2][4] = np.nan
    with pytest.raises(ValueError, match="gdro/score/bin_4 is not finite"):
        step_metrics_prepared(B, bins, succ, n, n_mean=4.0, per_bin=tuple(bad))
    with pytest.raises(ValueError, match="gdro/shadow_price is not finite"):
        step_metrics_prepared(B, bins, succ, n, n_mean=4.0, per_bin=per_bin, shadow_price=math.inf)
