"""Tests of the online difficulty classifier (docs/algorithm.md, section 1).

Estimates are made exact where the test needs exact bins: with ``k=1`` the pooled estimator is
S/T over the window, and with ``window=1`` it is the last visit's success rate, so a visit of
``s`` successes out of 200 trials sets the estimate to s/200 (0.005 resolution).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import deque
from fractions import Fraction
from math import comb
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import verl_gdro.classifier as classifier_module
from verl_gdro.classifier import (
    OnlineDifficultyClassifier,
    any_of_n_rate,
    hysteresis_move,
    pooled_pass_at_k,
    raw_bin,
    snap,
)

REPO = Path(__file__).resolve().parents[1]


def exact_classifier(**kwargs) -> OnlineDifficultyClassifier:
    """A classifier whose estimate is the last visit's success rate (k=1, window=1)."""
    kwargs.setdefault("k", 1)
    kwargs.setdefault("window", 1)
    return OnlineDifficultyClassifier(**kwargs)


def visit(clf: OnlineDifficultyClassifier, uid: int, p: float) -> int:
    """Push one visit with success rate p (a multiple of 0.005) and classify, like one step."""
    s = round(p * 200)
    assert abs(s / 200 - p) < 1e-12, p
    clf.observe([uid], [s], [200])
    return int(clf.bins([uid])[0])


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
        assert np.asarray(a[key]).dtype == np.asarray(b[key]).dtype, key


# ---------------------------------------------------------------------------------------------
# Construction and validation
# ---------------------------------------------------------------------------------------------


def test_default_edges_are_ten_equal_bins() -> None:
    clf = OnlineDifficultyClassifier()
    assert clf.num_bins == 10
    np.testing.assert_allclose(clf.bin_edges, np.arange(1, 10) / 10)
    assert clf.num_seen == 0


def test_custom_edges_define_the_bin_count() -> None:
    clf = OnlineDifficultyClassifier(bin_edges=[0.2, 0.5, 0.8])
    assert clf.num_bins == 4
    np.testing.assert_array_equal(clf.bin_edges, [0.2, 0.5, 0.8])
    assert OnlineDifficultyClassifier(bin_edges=[0.2, 0.5, 0.8], num_bins=4).num_bins == 4
    # The property is a copy: mutating it does not move the classifier's edges.
    clf.bin_edges[0] = 0.9
    np.testing.assert_array_equal(clf.bin_edges, [0.2, 0.5, 0.8])


def test_six_bins_of_custom_edges_do_not_become_seven() -> None:
    """Released-patch defect 6: 'six bins' given as six inner edges silently made seven."""
    six_edges = [0.1, 0.2, 0.4, 0.6, 0.8, 0.9]
    with pytest.raises(ValueError, match=r"num_bins=6 .*6 inner edges define 7 bins"):
        OnlineDifficultyClassifier(bin_edges=six_edges, num_bins=6)
    assert OnlineDifficultyClassifier(bin_edges=six_edges[:5], num_bins=6).num_bins == 6


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 0}, "window"),
        ({"window": 2.5}, "window"),
        ({"window": True}, "window"),
        ({"k": 0}, "k must be"),
        ({"hysteresis": -0.01}, "hysteresis"),
        ({"hysteresis": 0.1}, r"hysteresis must be in \[0, 0.1\)"),  # equal to the bin width
        ({"hysteresis": float("nan")}, "hysteresis"),
        ({"bin_edges": [0.02, 0.5], "hysteresis": 0.03}, r"hysteresis must be in \[0, 0.02\)"),
        ({"bin_edges": [0.5, 0.3]}, "strictly increasing"),
        ({"bin_edges": [0.3, 0.3]}, "strictly increasing"),
        ({"bin_edges": [0.0, 0.5]}, r"strictly inside \(0, 1\)"),
        ({"bin_edges": [0.5, 1.0]}, r"strictly inside \(0, 1\)"),
        ({"bin_edges": [0.0, 0.5, 1.0], "num_bins": 2}, r"strictly inside \(0, 1\)"),
        ({"bin_edges": [[0.5]]}, "1-D"),
        ({"bin_edges": [0.5], "num_bins": 3}, "num_bins=3"),
        ({"num_bins": 0}, "num_bins"),
        ({"num_bins": 128}, "num_bins"),
        ({"estimator": "mean"}, "estimator must be one of"),
        ({"unseen_bin": 10}, r"unseen_bin must be an integer \[0, 9\]"),
        ({"unseen_bin": -1}, "unseen_bin"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OnlineDifficultyClassifier(**kwargs)


def test_single_bin_and_zero_hysteresis_are_valid() -> None:
    clf = OnlineDifficultyClassifier(num_bins=1, hysteresis=0.0)
    clf.observe([1], [3], [4])
    assert clf.bins([1, 2]).tolist() == [0, 0]


# ---------------------------------------------------------------------------------------------
# Estimators (hand-computed and brute force)
# ---------------------------------------------------------------------------------------------


def test_pooled_hand_computed() -> None:
    clf = OnlineDifficultyClassifier(k=8)
    clf.observe([7], [1], [4])  # T = 4 < k: 1 - (1 - 1/4)^8
    assert clf.pass_at_k([7])[0] == pytest.approx(1 - 0.75**8, abs=1e-12)
    clf.observe([7], [2], [4])  # S = 3, T = 8 = k: C(5, 8) = 0, so pass@8 = 1
    assert clf.pass_at_k([7])[0] == 1.0
    clf2 = OnlineDifficultyClassifier(k=2)
    clf2.observe([7], [1], [4])
    clf2.observe([7], [2], [4])  # 1 - C(5, 2) / C(8, 2) = 1 - 10/28
    assert clf2.pass_at_k([7])[0] == pytest.approx(1 - 10 / 28, abs=1e-12)
    assert np.isnan(clf2.pass_at_k([8])[0])


def test_pooled_window_evicts_old_visits() -> None:
    clf = OnlineDifficultyClassifier(window=2, k=2)
    for s in (4, 0, 1):
        clf.observe([3], [s], [4])
    # Window = visits (0/4, 1/4): S = 1, T = 8 -> 1 - C(7, 2) / C(8, 2) = 1 - 21/28.
    assert clf.pass_at_k([3])[0] == pytest.approx(1 - 21 / 28, abs=1e-12)
    clf.observe([3], [0], [4])
    clf.observe([3], [0], [4])
    assert clf.pass_at_k([3])[0] == 0.0


def test_any_of_n_hand_computed() -> None:
    clf = OnlineDifficultyClassifier(estimator="any_of_n", window=3)
    clf.observe([1], [0], [4])
    assert clf.pass_at_k([1])[0] == 0.0
    clf.observe([1], [1], [4])
    assert clf.pass_at_k([1])[0] == 0.5
    clf.observe([1], [3], [4])
    assert clf.pass_at_k([1])[0] == pytest.approx(2 / 3)
    clf.observe([1], [0], [2])  # the first visit (0 successes) leaves the window
    assert clf.pass_at_k([1])[0] == pytest.approx(2 / 3)
    clf.observe([1], [0], [2])  # the 1/4 visit leaves
    assert clf.pass_at_k([1])[0] == pytest.approx(1 / 3)
    np.testing.assert_allclose(any_of_n_rate(np.array([[0, 2, 1, 0]]), np.array([3])), [2 / 3])


def brute_force_pass_at_k(s: int, t: int, k: int) -> float:
    """Share of the k-subsets of t trials (s of them successes) with at least one success."""
    outcomes = [1] * s + [0] * (t - s)
    subsets = list(itertools.combinations(range(t), k))
    return sum(any(outcomes[i] for i in sub) for sub in subsets) / len(subsets)


@pytest.mark.parametrize("t", range(1, 11))
def test_pooled_matches_brute_force_enumeration(t: int) -> None:
    for s in range(t + 1):
        for k in range(1, t + 1):
            expected = brute_force_pass_at_k(s, t, k)
            got = pooled_pass_at_k(np.array([s]), np.array([t]), k)[0]
            assert got == pytest.approx(expected, abs=1e-12), (s, t, k)
            assert got == pytest.approx(1 - comb(t - s, k) / comb(t, k), abs=1e-12)


def _pooled_running_product(successes: np.ndarray, trials: np.ndarray, k: int) -> np.ndarray:
    """pooled_pass_at_k as first written: one running product over j (the bit-exact reference)."""
    s, t = successes.astype(np.float64), trials.astype(np.float64)
    ratio = np.ones(s.shape)
    for j in range(k):
        ratio *= np.maximum((t - s) - j, 0.0) / np.maximum(t - j, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        small = 1.0 - (1.0 - s / t) ** k
    return np.where(t >= k, 1.0 - ratio, small)


@pytest.mark.parametrize("k", [2, 3, 8, 16])
def test_pooled_factor_table_is_bit_identical_to_the_running_product(k: int) -> None:
    """Every (S, T) a window of 100 visits of up to 12 rollouts can hold (T <= 1200, and beyond):
    the [k, prompts] factor table multiplied row by row gives the running product's very bits."""
    t = np.repeat(np.arange(1, 1301), np.arange(2, 1302))
    s = np.concatenate([np.arange(0, n + 1) for n in range(1, 1301)])
    np.testing.assert_array_equal(pooled_pass_at_k(s, t, k), _pooled_running_product(s, t, k))
    big = t >= k  # the branch without the small-T formula
    np.testing.assert_array_equal(pooled_pass_at_k(s[big], t[big], k), _pooled_running_product(s[big], t[big], k))


@settings(max_examples=60, deadline=None)
@given(
    visits=st.lists(
        st.integers(1, 6).flatmap(lambda t: st.tuples(st.integers(0, t), st.just(t))), min_size=1, max_size=5
    ),
    k=st.integers(1, 8),
)
def test_classifier_pools_visits_like_brute_force(visits: list[tuple[int, int]], k: int) -> None:
    clf = OnlineDifficultyClassifier(k=k, window=10)
    for s, t in visits:
        clf.observe([42], [s], [t])
    s_sum = sum(s for s, _ in visits)
    t_sum = sum(t for _, t in visits)
    expected = brute_force_pass_at_k(s_sum, t_sum, k) if t_sum >= k else 1 - (1 - s_sum / t_sum) ** k
    assert clf.pass_at_k([42])[0] == pytest.approx(expected, abs=1e-12)


def test_pooled_is_independent_of_how_trials_are_split() -> None:
    a = OnlineDifficultyClassifier(k=4)
    b = OnlineDifficultyClassifier(k=4)
    a.observe([1], [3], [12])
    for s, t in ((1, 2), (0, 2), (2, 8)):
        b.observe([1], [s], [t])
    assert a.pass_at_k([1])[0] == pytest.approx(b.pass_at_k([1])[0], abs=1e-12)


def test_pass_at_k_handles_duplicates_and_unseen() -> None:
    clf = OnlineDifficultyClassifier(k=1)
    clf.observe([5, 9], [1, 3], [4, 4])
    out = clf.pass_at_k([9, 5, 9, 11])
    assert out[:3].tolist() == [0.75, 0.25, 0.75]
    assert np.isnan(out[3])


# ---------------------------------------------------------------------------------------------
# Raw bins and hysteresis
# ---------------------------------------------------------------------------------------------


def test_raw_bins_count_inner_edges_at_or_below() -> None:
    clf = OnlineDifficultyClassifier()
    got = clf.raw_bins([0.0, 0.05, 0.1, 0.3, 0.95, 0.9, 1.0])
    assert got.tolist() == [0, 0, 1, 3, 9, 9, 9]
    clf = OnlineDifficultyClassifier(bin_edges=[0.2, 0.3, 0.7])
    assert clf.raw_bins([0.0, 0.2, 0.29, 0.3, 0.69, 0.7, 1.0]).tolist() == [0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="p must"):
        clf.raw_bins([1.2])
    with pytest.raises(ValueError, match="p must"):
        clf.raw_bins([np.nan])


@settings(max_examples=100, deadline=None)
@given(
    edges=st.lists(st.floats(0.001, 0.999), min_size=0, max_size=8, unique=True),
    ps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50),
)
def test_raw_bins_are_monotone_in_the_estimate(edges: list[float], ps: list[float]) -> None:
    edges = sorted(edges)
    clf = OnlineDifficultyClassifier(bin_edges=edges, hysteresis=0.0)
    p = np.sort(np.asarray(ps))
    bins = clf.raw_bins(p)
    assert np.all(np.diff(bins) >= 0)
    assert bins.min() >= 0 and bins.max() <= clf.num_bins - 1
    assert clf.raw_bins([1.0])[0] == clf.num_bins - 1


def test_hysteresis_uniform_edges_down() -> None:
    """The released patch blocked every downward move for uniform edges (defect 4)."""
    clf = exact_classifier()  # ten bins, hysteresis 0.03
    assert visit(clf, 1, 0.55) == 5
    assert visit(clf, 1, 0.49) == 5  # below the edge 0.5 but not by 0.03
    assert visit(clf, 1, 0.475) == 5
    assert visit(clf, 1, 0.465) == 4  # < 0.5 - 0.03: moves down one bin
    assert visit(clf, 2, 0.55) == 5
    assert visit(clf, 2, 0.2) == 2  # a big drop goes straight to the raw bin
    assert visit(clf, 2, 0.0) == 0


def test_hysteresis_uniform_edges_up() -> None:
    clf = exact_classifier()
    assert visit(clf, 1, 0.55) == 5
    assert visit(clf, 1, 0.61) == 5
    assert visit(clf, 1, 0.625) == 5  # needs >= 0.63
    assert visit(clf, 1, 0.635) == 6
    assert visit(clf, 1, 1.0) == 9  # straight to the raw bin
    assert visit(clf, 1, 0.88) == 9  # 0.88 is not below 0.9 - 0.03
    assert visit(clf, 1, 0.865) == 8


def test_hysteresis_boundaries_are_inclusive_up_and_strict_down() -> None:
    # Dyadic edges and delta so the boundary values are exact in floating point.
    clf = exact_classifier(bin_edges=[0.25, 0.5, 0.75], hysteresis=0.125)
    assert visit(clf, 1, 0.6) == 2
    assert visit(clf, 1, 0.75) == 2  # raw bin 3 but below 0.75 + 0.125
    assert visit(clf, 1, 0.875) == 3  # exactly a_3 + delta: moves (>=)
    assert visit(clf, 2, 0.6) == 2
    assert visit(clf, 2, 0.375) == 2  # exactly a_2 - delta: stays (strict <)
    assert visit(clf, 2, 0.37) == 1


def test_hysteresis_custom_edges_both_directions() -> None:
    clf = exact_classifier(bin_edges=[0.2, 0.3, 0.7], hysteresis=0.05)  # widths 0.2, 0.1, 0.4, 0.3
    assert visit(clf, 1, 0.5) == 2
    assert visit(clf, 1, 0.26) == 2  # raw 1, not below 0.3 - 0.05
    assert visit(clf, 1, 0.245) == 1
    assert visit(clf, 1, 0.34) == 1  # raw 2, below 0.3 + 0.05
    assert visit(clf, 1, 0.355) == 2
    assert visit(clf, 1, 0.74) == 2
    assert visit(clf, 1, 0.8) == 3
    assert visit(clf, 1, 0.66) == 3  # raw 2, not below 0.7 - 0.05
    assert visit(clf, 1, 0.1) == 0  # straight down past two edges
    assert visit(clf, 1, 0.24) == 0  # raw 1 but below 0.2 + 0.05


def test_estimates_exactly_on_an_edge_land_on_it() -> None:
    """Floating point must not push a mathematically exact edge value into the bin below."""
    clf = OnlineDifficultyClassifier(k=2)
    clf.observe([1], [1], [10])  # pass@2 = 1 - C(9,2)/C(10,2) = 1 - 36/45 = 0.2 exactly
    assert clf.pass_at_k([1])[0] == 0.2
    assert clf.bins([1]).tolist() == [2]
    thirds = OnlineDifficultyClassifier(bin_edges=[1 / 3, 2 / 3], k=1, window=1, hysteresis=0.0)
    thirds.observe([1, 2], [1, 2], [3, 3])
    assert thirds.bins([1, 2]).tolist() == [1, 2]
    # Hysteresis thresholds too: from bin 5, 0.63 = 0.6 + 0.03 is enough to move up.
    clf = exact_classifier()
    assert visit(clf, 1, 0.55) == 5
    assert visit(clf, 1, 0.63) == 6
    assert visit(clf, 1, 0.57) == 6  # 0.57 = 0.6 - 0.03 is not strictly below it: stays
    assert visit(clf, 1, 0.565) == 5
    assert visit(clf, 2, 0.45) == 4
    assert visit(clf, 2, 0.53) == 5  # 0.53 = 0.5 + 0.03: moves up


def test_hysteresis_move_function_directly() -> None:
    full = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    committed = np.array([-1, 2, 2, 2, 2, 0, 3])
    p = np.array([0.3, 0.4, 0.3, 0.8, 0.9, 0.99, 0.0])
    raw = raw_bin(p, full[1:-1])
    got = hysteresis_move(committed, p, raw, full, 0.125)
    # no bin yet -> raw; 0.4 (raw 1) is not < 0.375: stays; 0.3 < 0.375 moves down; 0.8 < 0.875
    # stays; 0.9 moves up; 0.99 from 0 jumps to 3; 0.0 from 3 jumps to 0.
    assert got.tolist() == [1, 2, 1, 2, 3, 3, 0]


@settings(max_examples=200, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 99), min_size=1, max_size=11, unique=True),
    delta_share=st.floats(0.0, 0.99),
    seed=st.integers(0, 2**32 - 1),
)
def test_hysteresis_keep_equals_hysteresis_move(cuts: list[int], delta_share: float, seed: int) -> None:
    """The classifier's fast rule (every prompt committed, raw bins from p) moves exactly the
    prompts hysteresis_move moves, to the same bins: random edges and hysteresis widths, estimates
    drawn from the snap grid, the edges and both thresholds (ties decide)."""
    inner = np.array(sorted(cuts), dtype=np.float64) / 100.0
    full = np.concatenate([[0.0], inner, [1.0]])
    delta = delta_share * float(np.diff(full).min())
    thresholds = classifier_module.hysteresis_thresholds(full, delta)
    rng = np.random.default_rng(seed)
    specials = np.concatenate([full, thresholds[0], thresholds[1]])
    specials = specials[(specials >= 0.0) & (specials <= 1.0)]
    p = snap(np.concatenate([rng.random(300), rng.choice(specials, 300)]))
    raw = raw_bin(p, inner)
    committed = rng.integers(0, inner.size + 1, p.size)
    expected = hysteresis_move(committed, p, raw, full, delta, thresholds, snapped=True)
    got = classifier_module._hysteresis_keep(committed.astype(np.int8), p, raw, thresholds)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)
    # some prompts without a committed bin yet (-1): they take their raw bin
    committed[rng.random(p.size) < 0.3] = -1
    expected = hysteresis_move(committed, p, raw, full, delta, thresholds, snapped=True)
    c8 = committed.astype(np.int8)
    got = classifier_module._hysteresis_keep(c8, p, raw, thresholds, c8 >= 0)
    np.testing.assert_array_equal(got, expected)


def test_bins_commit_and_are_stable_without_new_visits() -> None:
    clf = exact_classifier()
    clf.observe([1, 2], [110, 96], [200, 200])  # 0.55 and 0.48
    first = clf.bins([1, 2]).tolist()
    assert first == [5, 4]
    assert clf.bins([1, 2]).tolist() == first
    assert clf.bins([2, 1, 2]).tolist() == [4, 5, 4]
    assert clf.committed_bins([1, 2, 3]).tolist() == [5, 4, -1]


def test_unseen_uid_gets_unseen_bin_without_commit() -> None:
    clf = exact_classifier(unseen_bin=3)
    assert clf.bins([10, 11]).tolist() == [3, 3]
    assert clf.committed_bins([10]).tolist() == [-1]
    assert clf.num_seen == 0
    # The first bin after the first visit is the raw bin: no hysteresis against unseen_bin 3.
    clf.observe([10, 11], [62, 158], [200, 200])  # 0.31 (just above edge 0.3), 0.79
    assert clf.bins([10, 11]).tolist() == [3, 7]
    clf2 = exact_classifier(unseen_bin=0)
    clf2.bins([5])
    clf2.observe([5], [61], [200])  # 0.305: raw bin 3 although 0 -> 3 with hysteresis would also move
    clf2.observe([6], [21], [200])  # 0.105: would stay in 0 if unseen_bin were committed
    assert clf2.bins([5, 6]).tolist() == [3, 1]


def test_a_prompt_observed_but_not_classified_keeps_its_committed_bin() -> None:
    clf = exact_classifier()
    assert visit(clf, 1, 0.55) == 5
    clf.observe([1], [10], [200])  # 0.05, not classified this step
    clf.observe([1], [96], [200])  # 0.48 (window=1): hysteresis still against bin 5
    assert clf.bins([1]).tolist() == [5]


# ---------------------------------------------------------------------------------------------
# observe() validation: rejected input leaves the state untouched
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uids", "successes", "trials", "match"),
    [
        ([1, 2], [0], [4, 4], "equal lengths"),
        ([1, 1], [0, 1], [4, 4], "distinct"),
        ([1, 2], [5, 1], [4, 4], r"successes must be in \[0, trials\]"),
        ([1, 2], [-1, 1], [4, 4], "successes"),
        ([1, 2], [0, 0], [0, 4], r"trials must be in \[1, 255\]"),
        ([1, 2], [0, 0], [-2, 4], "trials"),
        ([1, 2], [0, 0], [256, 4], r"trials must be in \[1, 255\]"),
        ([1.5, 2], [0, 0], [4, 4], "uids must hold integers"),
        ([1, 2], [0.0, 0.0], [4, 4], "successes must hold integers"),
        ([[1, 2]], [0, 0], [4, 4], "uids must be a 1-D"),
        ([1, 2], [True, False], [4, 4], "successes must hold integers"),
    ],
)
def test_observe_rejects_bad_input_and_keeps_state(uids, successes, trials, match) -> None:
    clf = OnlineDifficultyClassifier(window=3)
    clf.observe([1, 3], [1, 2], [4, 4])
    clf.bins([1, 3])
    before = clf.state_dict()
    with pytest.raises(ValueError, match=match):
        clf.observe(uids, successes, trials)
    assert_same_state(before, clf.state_dict())
    assert clf.num_seen == 2


def test_empty_observe_is_a_noop() -> None:
    clf = OnlineDifficultyClassifier()
    clf.observe([], [], [])
    assert clf.num_seen == 0
    assert clf.bins([]).size == 0 and clf.pass_at_k([]).size == 0


# ---------------------------------------------------------------------------------------------
# A reference model: plain Python, one deque per prompt
# ---------------------------------------------------------------------------------------------


def grid(x: float) -> float:
    """The classifier's comparison grid (12 decimals), as numpy rounds it."""
    return float(np.round(x, 12))


class ReferenceClassifier:
    """The spec's rules written the obvious way (dict of deques), to compare against."""

    def __init__(
        self, edges: list[float], window: int, delta: float, k: int, estimator: str, unseen: int
    ) -> None:
        self.edges, self.window, self.delta, self.k = edges, window, delta, k
        self.estimator, self.unseen = estimator, unseen
        self.full = [0.0, *edges, 1.0]
        self.hist: dict[int, deque] = {}
        self.committed: dict[int, int] = {}

    def observe(self, uids, successes, trials) -> None:
        for u, s, t in zip(uids, successes, trials):
            self.hist.setdefault(u, deque(maxlen=self.window)).append((s, t))

    def estimate(self, u: int) -> float:
        """Exact rational estimate, correctly rounded, then put on the 12-decimal compare grid."""
        if u not in self.hist:
            return float("nan")
        h = self.hist[u]
        if self.estimator == "any_of_n":
            exact = Fraction(sum(s >= 1 for s, _ in h), len(h))
        else:
            s, t = sum(x for x, _ in h), sum(y for _, y in h)
            if t >= self.k:
                exact = 1 - Fraction(comb(t - s, self.k), comb(t, self.k))
            else:
                exact = 1 - (1 - Fraction(s, t)) ** self.k
        return grid(float(exact))

    def bins(self, uids) -> list[int]:
        out = []
        for u in uids:
            if u not in self.hist:
                out.append(self.unseen)
                continue
            p = self.estimate(u)
            raw = sum(grid(e) <= p for e in self.edges)
            c = self.committed.get(u)
            if (
                c is None
                or (raw > c and p >= grid(self.full[c + 1] + self.delta))
                or (raw < c and p < grid(self.full[c] - self.delta))
            ):
                c = raw
            self.committed[u] = c
            out.append(c)
        return out


step_strategy = st.tuples(
    st.sampled_from(["observe", "bins", "bad"]),
    st.lists(st.integers(-3, 40), min_size=0, max_size=12),
    st.integers(0, 2**32 - 1),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(step_strategy, min_size=1, max_size=25),
    window=st.integers(1, 5),
    k=st.integers(1, 6),
    estimator=st.sampled_from(["pooled", "any_of_n"]),
    edges=st.sampled_from([None, [0.2, 0.3, 0.7], [0.5]]),
)
def test_matches_reference_model_and_survives_rejected_input(steps, window, k, estimator, edges) -> None:
    clf = OnlineDifficultyClassifier(
        bin_edges=edges, window=window, k=k, estimator=estimator, hysteresis=0.04
    )
    ref = ReferenceClassifier(list(clf.bin_edges), window, 0.04, k, estimator, 0)
    for kind, uids, seed in steps:
        rng = np.random.default_rng(seed)
        if kind == "bins":
            assert clf.bins(uids).tolist() == ref.bins(uids)
            continue
        uniq = list(dict.fromkeys(uids))
        trials = rng.integers(1, 9, len(uniq))
        succ = rng.integers(0, trials + 1)
        if kind == "bad":
            before = clf.state_dict()
            bad = int(rng.integers(0, 4))
            if bad == 0 and uniq:
                succ = succ.copy()
                succ[-1] = trials[-1] + 1
            elif bad == 1 and uniq:
                trials = trials.copy()
                trials[0] = 0
            elif bad == 2 and uniq:
                uniq = [*uniq, uniq[0]]
                succ, trials = np.append(succ, 0), np.append(trials, 1)
            else:
                succ = np.append(succ, 0)
            with pytest.raises(ValueError):
                clf.observe(uniq, succ, trials)
            assert_same_state(before, clf.state_dict())
        else:
            clf.observe(uniq, succ, trials)
            ref.observe(uniq, succ.tolist(), trials.tolist())
    probe = list(range(-3, 41))
    np.testing.assert_allclose(clf.pass_at_k(probe), [ref.estimate(u) for u in probe], atol=1e-12)
    assert clf.bins(probe).tolist() == ref.bins(probe)
    assert clf.num_seen == len(ref.hist)


def test_many_sparse_uids_across_growth_match_reference() -> None:
    """Sparse, negative and hash-unfriendly uids through several rounds of growth."""
    rng = np.random.default_rng(3)
    pool = np.unique(
        np.concatenate(
            [
                rng.integers(-(2**62), 2**62, 3000),
                np.arange(2000, dtype=np.int64) << 40,  # equal low bits: needs the hash mixing
                np.arange(-500, 500),
            ]
        )
    )
    clf = OnlineDifficultyClassifier(window=4, k=3)
    ref = ReferenceClassifier(list(clf.bin_edges), 4, 0.03, 3, "pooled", 0)
    for _ in range(40):
        uids = rng.choice(pool, int(rng.integers(1, 700)), replace=False)
        assert clf.bins(uids).tolist() == ref.bins(uids.tolist())
        trials = rng.integers(1, 13, uids.size)
        succ = rng.integers(0, trials + 1)
        clf.observe(uids, succ, trials)
        ref.observe(uids.tolist(), succ.tolist(), trials.tolist())
    np.testing.assert_allclose(clf.pass_at_k(pool), [ref.estimate(int(u)) for u in pool], atol=1e-12)
    assert clf.num_seen == len(ref.hist)


@pytest.mark.parametrize("rounds", [0, 1, 2])
def test_uid_index_scalar_fallback_paths(monkeypatch: pytest.MonkeyPatch, rounds: int) -> None:
    """Long probe runs finish in a scalar loop; force it to run for (almost) every key."""
    monkeypatch.setattr(classifier_module, "_VECTOR_ROUNDS", rounds)
    rng = np.random.default_rng(rounds)
    clf = OnlineDifficultyClassifier(window=3)
    visits: dict[int, int] = {}
    for step in range(12):
        if step < 6:
            uids = rng.choice(2**40, 1500, replace=False).astype(np.int64)
        else:
            uids = rng.choice(np.fromiter(visits, dtype=np.int64), 400, replace=False)
        clf.observe(uids, np.zeros(uids.size, dtype=np.int64), np.full(uids.size, 2))
        for u in uids.tolist():
            visits[u] = visits.get(u, 0) + 1
    keys = np.fromiter(visits, dtype=np.int64)
    restored = OnlineDifficultyClassifier(window=3)
    state = clf.state_dict()
    restored.load_state_dict(state)
    for c in (clf, restored):
        assert c.num_seen == keys.size
        got = c.state_dict()
        order = {u: i for i, u in enumerate(got["uids"].tolist())}
        assert [int(got["visits"][order[k]]) for k in keys.tolist()] == [visits[k] for k in keys.tolist()]
        assert np.isnan(c.pass_at_k([-5, 2**41])).all()  # absent keys stop at an empty cell
        np.testing.assert_array_equal(c.pass_at_k(keys), np.zeros(keys.size))
    bad = dict(state)
    bad["uids"] = state["uids"].copy()
    bad["uids"][7] = bad["uids"][1200]
    with pytest.raises(ValueError, match="duplicates"):
        restored.load_state_dict(bad)


def test_uid_index_probe_runs_wrap_around_the_table_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every uid hashed to the last cell: probe runs wrap to cell 0, in inserts, lookups, the
    sort-based bulk build of a load and the rehash on growth."""
    monkeypatch.setattr(
        classifier_module, "_hash_uids", lambda uids: np.full(np.size(uids), 2**64 - 1, dtype=np.uint64)
    )
    clf = OnlineDifficultyClassifier(window=2, k=1)
    uids = np.arange(700, dtype=np.int64) * 3 - 50
    for start in range(0, 700, 100):  # grows past the initial 1024-cell table (rehash via build)
        part = uids[start : start + 100]
        clf.observe(part, part % 5, np.full(part.size, 4))
    expected = (uids % 5) / 4
    np.testing.assert_array_equal(clf.pass_at_k(uids), expected)
    restored = OnlineDifficultyClassifier(window=2, k=1)
    restored.load_state_dict(clf.state_dict())
    np.testing.assert_array_equal(restored.pass_at_k(uids), expected)
    assert np.isnan(restored.pass_at_k([2, 10**6])).all()
    bad = clf.state_dict()
    bad["uids"][650] = bad["uids"][3]
    with pytest.raises(ValueError, match="duplicates"):
        restored.load_state_dict(bad)


# ---------------------------------------------------------------------------------------------
# State: save/load, resume, config mismatch, corrupted state, memory
# ---------------------------------------------------------------------------------------------


def simulate(clf: OnlineDifficultyClassifier, rng: np.random.Generator, steps: int, num_prompts: int = 400):
    """Steps of (classify, observe) on a toy task; returns each step's bins and estimates."""
    true_p = np.linspace(0.0, 1.0, num_prompts)
    out = []
    for _ in range(steps):
        uids = rng.choice(num_prompts, 64, replace=False).astype(np.int64) * 13 + 5
        bins = clf.bins(uids)
        est = clf.pass_at_k(uids)
        n = rng.integers(2, 13, uids.size)
        succ = rng.binomial(n, true_p[(uids - 5) // 13])
        clf.observe(uids, succ, n)
        out.append((bins, est))
    return out


@pytest.mark.parametrize("estimator", ["pooled", "any_of_n"])
@pytest.mark.parametrize("through_file", [False, True])
def test_resume_at_step_100_of_200_is_bit_identical(
    estimator: str, through_file: bool, tmp_path: Path
) -> None:
    kwargs = {"window": 16, "estimator": estimator, "bin_edges": [0.1, 0.3, 0.5, 0.8]}
    rng = np.random.default_rng(0)
    whole = simulate(OnlineDifficultyClassifier(**kwargs), rng, 200)

    rng = np.random.default_rng(0)
    first = OnlineDifficultyClassifier(**kwargs)
    head = simulate(first, rng, 100)
    state = first.state_dict()
    if through_file:
        np.savez(tmp_path / "clf.npz", **state)
        with np.load(tmp_path / "clf.npz") as f:
            state = dict(f)
    del first
    resumed = OnlineDifficultyClassifier(**kwargs)
    resumed.load_state_dict(state)
    tail = simulate(resumed, rng, 100)
    for (b1, e1), (b2, e2) in zip(whole, head + tail):
        assert np.array_equal(b1, b2)
        assert np.array_equal(e1, e2, equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 30), window=st.integers(1, 6))
def test_save_load_mid_stream_gives_identical_future(seed: int, cut: int, window: int) -> None:
    a = OnlineDifficultyClassifier(window=window, k=3)
    simulate(a, np.random.default_rng(seed), cut, num_prompts=80)
    b = OnlineDifficultyClassifier(window=window, k=3)
    b.load_state_dict(a.state_dict())
    assert_same_state(a.state_dict(), b.state_dict())
    fa = simulate(a, np.random.default_rng(seed + 1), 10, num_prompts=80)
    fb = simulate(b, np.random.default_rng(seed + 1), 10, num_prompts=80)
    for (b1, e1), (b2, e2) in zip(fa, fb):
        assert np.array_equal(b1, b2) and np.array_equal(e1, e2, equal_nan=True)


def test_state_dict_is_a_snapshot() -> None:
    clf = OnlineDifficultyClassifier(window=2)
    clf.observe([1], [1], [4])
    state = clf.state_dict()
    clf.observe([1, 2], [4, 0], [4, 4])
    restored = OnlineDifficultyClassifier(window=2)
    restored.load_state_dict(state)
    assert restored.num_seen == 1
    assert restored.pass_at_k([1])[0] == pytest.approx(1 - 0.75**8)


def test_state_is_flat_numpy_arrays() -> None:
    clf = OnlineDifficultyClassifier()
    clf.observe([1, 2], [1, 2], [4, 4])
    for key, value in clf.state_dict().items():
        assert isinstance(value, np.ndarray), key
        assert value.dtype != object, key


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 50}, r"window: saved 100, configured 50"),
        ({"k": 4}, "k: saved 8, configured 4"),
        ({"hysteresis": 0.02}, "hysteresis"),
        ({"estimator": "any_of_n"}, "estimator"),
        ({"unseen_bin": 2}, "unseen_bin"),
        ({"num_bins": 5}, "bin_edges"),
        ({"bin_edges": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.95]}, "bin_edges"),
    ],
)
def test_load_rejects_state_of_a_differently_configured_classifier(kwargs: dict, match: str) -> None:
    src = OnlineDifficultyClassifier()
    src.observe([1, 2], [1, 2], [4, 4])
    dst = OnlineDifficultyClassifier(**kwargs)
    dst.observe([9], [1], [4])
    before = dst.state_dict()
    with pytest.raises(ValueError, match="differently configured classifier") as err:
        dst.load_state_dict(src.state_dict())
    assert err.match(match)
    assert_same_state(before, dst.state_dict())


def _corrupt(state: dict, key: str, value) -> dict:
    bad = dict(state)
    bad[key] = value
    return bad


def test_load_rejects_malformed_state_and_keeps_its_own() -> None:
    src = OnlineDifficultyClassifier(window=3)
    src.observe([1, 2, 3], [1, 2, 0], [4, 4, 4])
    src.observe([1], [1], [2])
    src.bins([1, 2])
    good = src.state_dict()
    cases = [
        ({k: v for k, v in good.items() if k != "visits"}, "missing keys"),
        (_corrupt(good, "version", np.asarray(99)), "version"),
        (_corrupt(good, "uids", good["uids"].astype(np.int32)), "'uids' must be a 1-D int64"),
        (_corrupt(good, "visits", good["visits"][:2]), "'visits'"),
        (_corrupt(good, "committed_bin", good["committed_bin"].astype(np.int64)), "'committed_bin'"),
        (_corrupt(good, "successes", good["successes"].astype(np.uint16)), "'successes' must be a 1-D uint8"),
        (_corrupt(good, "trials", good["trials"][:-1]), r"'trials' must be .* 4 entries"),
        (_corrupt(good, "uids", np.array([1, 1, 3])), "duplicates"),
        (_corrupt(good, "visits", np.array([2, 0, 1])), "'visits' must be >= 1"),
        (_corrupt(good, "committed_bin", np.array([12, 0, -1], dtype=np.int8)), "committed_bin"),
        (_corrupt(good, "trials", np.array([4, 0, 4, 4], dtype=np.uint8)), "'trials' must be >= 1"),
        (_corrupt(good, "successes", np.array([1, 3, 2, 0], dtype=np.uint8)), "exceeds 'trials'"),
    ]
    dst = OnlineDifficultyClassifier(window=3)
    dst.observe([7], [1], [4])
    before = dst.state_dict()
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            dst.load_state_dict(bad)
        assert_same_state(before, dst.state_dict())
    dst.load_state_dict(good)
    assert_same_state(good, dst.state_dict())


def test_state_and_memory_are_bounded_by_window_per_prompt() -> None:
    window = 20
    clf = OnlineDifficultyClassifier(window=window)
    rng = np.random.default_rng(1)
    uids = rng.choice(10**9, 3000, replace=False).astype(np.int64)
    for _ in range(3 * window):  # every ring wraps around several times
        clf.observe(uids, rng.integers(0, 5, uids.size), np.full(uids.size, 4))
    state = clf.state_dict()
    state_bytes = sum(np.asarray(v).nbytes for v in state.values())
    # 2 bytes of history per visit kept + uid (8) + visits (8) + committed bin (1), plus config.
    assert state_bytes / clf.num_seen <= 2 * window + 17 + 1
    # Allocated memory: the same per prompt, at most doubled by growth, plus the hash table.
    assert clf.memory_bytes() / clf.num_seen <= 2 * (2 * window + 17) + 4 * 8


def test_history_memory_follows_visits_not_window() -> None:
    """Prompts seen once cost ~2 bytes of history, however large the window."""
    clf = OnlineDifficultyClassifier(window=100)
    uids = np.arange(5000, dtype=np.int64)
    clf.observe(uids, np.ones(uids.size, dtype=np.int64), np.full(uids.size, 4))
    state = clf.state_dict()
    assert state["successes"].size == uids.size
    assert clf.memory_bytes() / clf.num_seen < 100  # a dense [prompts, 100] x 2 ring would be 200+
    for _ in range(3):  # widening keeps the recorded visits in place
        clf.observe(uids[:10], np.zeros(10, dtype=np.int64), np.full(10, 4))
    assert clf.state_dict()["successes"].size == uids.size + 30
    np.testing.assert_allclose(
        clf.pass_at_k(uids[:2]), pooled_pass_at_k(np.array([1, 1]), np.array([16, 16]), 8)
    )


# ---------------------------------------------------------------------------------------------
# Layering
# ---------------------------------------------------------------------------------------------


def test_controller_modules_import_neither_verl_nor_torch() -> None:
    code = (
        "import sys\n"
        "import verl_gdro.classifier, verl_gdro.prompt_gdro, verl_gdro.rollout_gdro, verl_gdro.metrics\n"
        "import verl_gdro.presets\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'verl'))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_controllers_benchmark_quick_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "controllers.py"), "--quick"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "solve_exact_budget" in result.stdout
    assert "classifier" in result.stdout


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), cache_max=st.sampled_from([8, 64, 1 << 16]),
       dense_uids=st.sampled_from([1 << 22, 20, 0]), negative=st.booleans())
def test_slot_lookups_and_window_sums_follow_the_index_and_the_rings(
    seed: int, cache_max: int, dense_uids: int, negative: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct-address table (uids in [0, _DENSE_UIDS)) and, once a uid outside it is stored,
    the remembered slots give the hash index's slots, through new prompts, cache clears and a
    checkpoint load; the bins equal those of a classifier restored from the state alone."""
    monkeypatch.setattr(classifier_module, "_SLOT_CACHE_MAX", cache_max)
    monkeypatch.setattr(classifier_module, "_DENSE_UIDS", dense_uids)
    rng = np.random.default_rng(seed)
    clf = OnlineDifficultyClassifier(num_bins=5, window=4, hysteresis=0.0)
    for step in range(12):
        uids = rng.choice(30, size=int(rng.integers(1, 25)), replace=False)  # revisits: the rings wrap
        if negative and step == 8:
            uids[0] = -5  # a negative id also leaves direct addressing
        h = clf._history
        np.testing.assert_array_equal(h.slots(uids), h.index.lookup(uids, h.uids))
        fresh = OnlineDifficultyClassifier(num_bins=5, window=4, hysteresis=0.0)
        fresh.load_state_dict(clf.state_dict())
        np.testing.assert_array_equal(clf.bins(uids), fresh.bins(uids))
        trials = rng.integers(1, 5, size=uids.size)
        clf.observe(uids, rng.integers(0, trials + 1), trials)
        np.testing.assert_array_equal(h.slots(uids), h.index.lookup(uids, h.uids))
        assert len(h.slot_cache) <= max(cache_max, 25)
        n = clf.num_seen  # the window sums follow the rings through wrap-around (window 4, 12 steps)
        np.testing.assert_array_equal(h.succ_sum[:n], h.succ[:n].sum(axis=1))
        np.testing.assert_array_equal(h.trials_sum[:n], h.trials[:n].sum(axis=1))
        if step == 6:
            clf.load_state_dict(clf.state_dict())  # a resume empties the cache
            assert not clf._history.slot_cache
    stored = clf._history.uids[: clf.num_seen]
    assert (clf._history.dense is None) == bool(stored.min() < 0 or stored.max() >= dense_uids)


@given(st.floats(min_value=0.0, max_value=1.0, allow_nan=False))
@settings(max_examples=2000, deadline=None)
def test_snap_is_idempotent(p: float) -> None:
    """The classifier rounds its estimates once and compares them unrounded again (hysteresis_move
    with snapped=True): that is the same as rounding twice only because snap is idempotent on [0, 1]."""
    once = snap(np.array([p, 1.0 - p, p / 3.0]))
    assert once.tobytes() == snap(once).tobytes()


def test_decayed_counts_weight_each_visit_by_its_age():
    """decayed_counts: visit j of v (0-based) weighs decay ** (v - 1 - j); decay 1 is the window sum;
    a wrapped ring keeps only the window's visits; an unseen uid is (0, 0)."""
    c = OnlineDifficultyClassifier(window=3)
    visits = [(1, 4), (3, 4), (0, 4), (4, 4)]  # (successes, trials) of uid 7, oldest first
    for s, t in visits:
        c.observe([7], [s], [t])
    s_d, t_d = c.decayed_counts([7, 8], 0.5)
    # the window (3) holds the last three visits: (3, 4) age 2, (0, 4) age 1, (4, 4) age 0
    assert s_d[0] == pytest.approx(3 * 0.25 + 0 * 0.5 + 4)
    assert t_d[0] == pytest.approx(4 * 0.25 + 4 * 0.5 + 4)
    assert (s_d[1], t_d[1]) == (0.0, 0.0)
    s_w, t_w = c.window_counts([7])
    s_1, t_1 = c.decayed_counts([7], 1.0)
    assert (s_1[0], t_1[0]) == (s_w[0], t_w[0]) == (7, 12)
    # before the ring wraps (two visits of a window of 3)
    c2 = OnlineDifficultyClassifier(window=3)
    c2.observe([1], [2], [4])
    c2.observe([1], [0], [2])
    s2, t2 = c2.decayed_counts([1], 0.5)
    assert (s2[0], t2[0]) == (pytest.approx(1.0), pytest.approx(4.0))
    with pytest.raises(ValueError, match="decay"):
        c.decayed_counts([7], 0.0)
