"""Prompt-GDRO (docs/algorithm.md, section 2): hand-computed cases per equation, properties, resume."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from verl_gdro.prompt_gdro import (
    PromptGDRO,
    advantage_multipliers,
    bin_mean_losses,
    clipped_surrogate_response_loss,
    ema_scores,
    exp_weights,
    failure_rate_loss,
    group_mean,
    low_var_kl,
    mix_probs,
    share_normalize,
    surrogate_kl_loss,
    surrogate_loss,
)

# --------------------------------------------------------------------------------------------
# Eqs. 12-16, one hand-computed case each
# --------------------------------------------------------------------------------------------


def test_eq13_bin_mean_losses_hand_case() -> None:
    lbar, counts = bin_mean_losses(np.array([0, 0, 2]), np.array([1.0, 0.5, 0.3]), 3)
    np.testing.assert_allclose(lbar, [0.75, 0.0, 0.3])
    np.testing.assert_array_equal(counts, [2, 0, 1])


def test_eq13_share_normalisation_hand_case_and_floor() -> None:
    lbar, counts = np.array([0.75, 0.0, 0.3]), np.array([2, 0, 1])
    out, qhat = share_normalize(lbar, counts, share_floor=1 / 6)
    np.testing.assert_allclose(qhat, [2 / 3, 0.0, 1 / 3])
    np.testing.assert_allclose(out, [0.75 / (2 / 3), 0.0, 0.3 / (1 / 3)])
    # A floor above the share divides by the floor instead.
    out, _ = share_normalize(lbar, counts, share_floor=0.5)
    np.testing.assert_allclose(out, [0.75 / (2 / 3), 0.0, 0.3 / 0.5])


def test_eq12_ema_updates_present_bins_first_observation_sets_score() -> None:
    scores = np.array([0.5, 0.2, 0.0, 0.0])
    observed = np.array([True, True, False, False])
    lbar = np.array([1.0, 9.0, 0.4, 7.0])
    present = np.array([True, False, True, False])
    new, obs = ema_scores(scores, observed, lbar, present, beta=0.1)
    # bin 0: EMA; bin 1: absent, kept; bin 2: first observation sets S; bin 3: never seen, S = 0.
    np.testing.assert_allclose(new, [0.9 * 0.5 + 0.1 * 1.0, 0.2, 0.4, 0.0])
    np.testing.assert_array_equal(obs, [True, True, True, False])
    np.testing.assert_array_equal(scores, [0.5, 0.2, 0.0, 0.0])  # pure: inputs untouched


def test_eq14_exp_weights_with_clip() -> None:
    omega = exp_weights(np.array([0.0, 1.0, 20.0, -20.0]), eta=0.5, score_clip=10.0)
    np.testing.assert_allclose(omega, [1.0, math.exp(0.5), math.exp(5.0), math.exp(-5.0)])


def test_eq15_mix_probs_hand_case() -> None:
    np.testing.assert_allclose(mix_probs(np.array([1.0, 3.0]), gamma=0.1), [0.9 * 0.25 + 0.05, 0.9 * 0.75 + 0.05])


def test_eq16_mean_one_and_raw_hand_cases() -> None:
    q = np.array([0.2, 0.8])
    omega = np.array([1.0, 20.0])
    bins = np.array([0, 0, 1])  # mean q over the elements = (0.2 + 0.2 + 0.8) / 3 = 0.4
    np.testing.assert_allclose(advantage_multipliers(q, omega, bins, 15.0, "mean_one"), [0.5, 2.0])
    np.testing.assert_allclose(advantage_multipliers(q, omega, bins, 1.5, "mean_one"), [0.5, 1.5])
    np.testing.assert_allclose(advantage_multipliers(q, omega, bins, 15.0, "raw"), [1.0, 15.0])
    np.testing.assert_allclose(advantage_multipliers(q, omega, bins[:0], 15.0, "mean_one"), [1.0, 1.0])


def test_controller_composes_the_equations_hand_case() -> None:
    pg = PromptGDRO(2, eta=1.0, beta=0.5, gamma=0.0, normalize_by_share=False)
    np.testing.assert_allclose(pg.bin_probs(), [0.5, 0.5])  # never observed: S = 0
    pg.update([0, 0, 1], [1.0, 0.0, 0.5])  # lbar = [0.5, 0.5], first observation
    np.testing.assert_allclose(pg.scores, [0.5, 0.5])
    pg.update([0], [1.0])  # S0 = 0.5 * 0.5 + 0.5 * 1 = 0.75, S1 kept
    np.testing.assert_allclose(pg.scores, [0.75, 0.5])
    e0, e1 = math.exp(0.75), math.exp(0.5)
    np.testing.assert_allclose(pg.omega(), [e0, e1])
    np.testing.assert_allclose(pg.bin_probs(), [e0 / (e0 + e1), e1 / (e0 + e1)])
    q0, q1 = e0 / (e0 + e1), e1 / (e0 + e1)
    mean_q = (q0 + 3 * q1) / 4
    np.testing.assert_allclose(pg.multipliers([0, 1, 1, 1]), [q0 / mean_q, q1 / mean_q, q1 / mean_q, q1 / mean_q])


def test_share_normalisation_in_update_default_floor() -> None:
    pg = PromptGDRO(4, beta=1.0)  # share_floor = 1/8
    info = pg.update([0, 0, 0, 0, 0, 0, 0, 1, 2], [1.0] * 7 + [0.5, np.inf])
    # shares over the 8 finite entries: bin 0 7/8, bin 1 1/8 (= the floor)
    np.testing.assert_allclose(info["shares"], [7 / 8, 1 / 8, 0.0, 0.0])
    np.testing.assert_allclose(pg.scores, [1.0 / (7 / 8), 0.5 / (1 / 8), 0.0, 0.0])
    assert info["dropped_nonfinite"] == 1 and pg.dropped_nonfinite == 1
    np.testing.assert_array_equal(pg.observed, [True, True, False, False])
    np.testing.assert_allclose(info["mean_losses"], [1.0, 0.5, 0.0, 0.0])


def test_all_nonfinite_step_changes_nothing_but_the_counter() -> None:
    pg = PromptGDRO(3)
    pg.update([0, 1], [0.3, 0.6])
    before = pg.state_dict()
    info = pg.update([0, 1, 2], [np.nan, -np.inf, np.inf])
    assert info["dropped_nonfinite"] == 3
    np.testing.assert_array_equal(pg.scores, before["scores"])
    np.testing.assert_array_equal(pg.observed, before["observed"])
    assert pg.dropped_nonfinite == 3


# --------------------------------------------------------------------------------------------
# Loss signals
# --------------------------------------------------------------------------------------------


def test_failure_rate_loss_per_response_and_per_prompt() -> None:
    out = failure_rate_loss([1, 0, 1, 1, 0], group_index=[0, 0, 1, 1, 2])
    np.testing.assert_allclose(out, [0.5, 0.0, 1.0])
    np.testing.assert_allclose(failure_rate_loss([0.25, 1.0]), [0.75, 0.0])


def test_failure_rate_refuses_shaped_scores_and_propagates_nan() -> None:
    with pytest.raises(ValueError, match="acc"):
        failure_rate_loss([1.0, -1.0], group_index=[0, 0])
    with pytest.raises(ValueError, match="acc"):
        failure_rate_loss([2.0])
    out = failure_rate_loss([np.nan, 1.0, 0.0, 1.0], group_index=[0, 0, 1, 1])
    assert np.isnan(out[0]) and out[1] == 0.5


def test_overflowing_losses_are_refused_without_mutation() -> None:
    pg = PromptGDRO(2)
    pg.update([0, 1], [0.5, 0.5])
    before = pickle.dumps(pg.state_dict())
    with pytest.raises(ValueError, match="losses"):
        pg.update([0, 0], [1e308, 1e308])
    assert pickle.dumps(pg.state_dict()) == before


def test_group_mean_variable_groups_and_empty_group_is_nan() -> None:
    out = group_mean([1.0, 2.0, 3.0, 10.0], [2, 0, 2, 2], num_groups=4)
    np.testing.assert_allclose(out[[0, 2]], [2.0, 14.0 / 3.0])
    assert np.isnan(out[1]) and np.isnan(out[3])
    with pytest.raises(ValueError, match="group_index"):
        group_mean([1.0, 2.0], [0, 5], num_groups=3)
    with pytest.raises(ValueError, match="group_index"):
        group_mean([1.0, 2.0], [0])


def test_clipped_surrogate_hand_case_with_clip_and_dual_clip() -> None:
    mask = np.array([[1, 1, 0], [1, 1, 0]])
    logp = np.log(np.array([[1.5, 0.5, 9.0], [1.5, 4.0, 9.0]]))
    old = np.zeros_like(logp)
    adv = np.array([1.0, -1.0])  # per-response advantages broadcast over tokens
    out = clipped_surrogate_response_loss(logp, old, adv, mask, 0.2, 0.28, 3.0)
    # A = +1: ratio 1.5 -> max(-1.5, -1.28) = -1.28; ratio 0.5 -> max(-0.5, -0.8) = -0.5.
    # A = -1: ratio 1.5 -> max(1.5, 1.28) = 1.5; ratio 4 -> max(4, 1.28) = 4, dual clip -> 3.
    np.testing.assert_allclose(out, [(-1.28 - 0.5) / 2, (1.5 + 3.0) / 2])


def _reference_token_loss(logp, old, adv, low=0.2, high=0.28, c=3.0):
    """verl's compute_policy_loss_vanilla token loss, transcribed directly (float64)."""
    ratio = np.exp(np.clip(logp - old, -20.0, 20.0))
    clipped = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - low, 1 + high))
    return np.where(adv < 0, np.minimum(clipped, -adv * c), clipped)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("on_policy", [True, False])
@pytest.mark.parametrize("per_token_adv", [True, False])
def test_surrogate_fast_paths_equal_the_direct_formula(dtype, on_policy: bool, per_token_adv: bool) -> None:
    rng = np.random.default_rng(5)
    mask = (rng.random((6, 9)) < 0.7).astype(np.float64)
    mask[0] = 0.0  # an empty response: token-mean 0
    logp = -rng.random((6, 9))
    old = logp.copy() if on_policy else logp + 0.5 * rng.standard_normal((6, 9))
    adv = np.array([1.5, -2.0, 0.0, 0.7, -0.3, 2.2])
    adv_tok = adv[:, None] * np.ones((6, 9))
    ref = _reference_token_loss(logp, old, adv_tok)
    expected = np.divide((ref * mask).sum(1), mask.sum(1), out=np.zeros(6), where=mask.sum(1) > 0)
    out = clipped_surrogate_response_loss(
        logp.astype(dtype), old.astype(dtype), (adv_tok if per_token_adv else adv).astype(dtype), mask
    )
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol)
    assert out.dtype == np.float64


def test_clip_arguments_are_validated() -> None:
    x = np.zeros((1, 2))
    for kwargs, name in [
        ({"clip_ratio_low": 1.0}, "clip_ratio_low"),
        ({"clip_ratio_high": -0.1}, "clip_ratio_high"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c"),
    ]:
        with pytest.raises(ValueError, match=name):
            clipped_surrogate_response_loss(x, x, x, x + 1, **kwargs)
    with pytest.raises(ValueError, match="advantages"):
        clipped_surrogate_response_loss(x, x, np.zeros(3), x + 1)
    with pytest.raises(ValueError, match="response_mask"):
        clipped_surrogate_response_loss(x, x, x, np.ones(2))


def test_low_var_kl_hand_case_and_clamp() -> None:
    np.testing.assert_allclose(low_var_kl(np.array([0.0]), np.array([math.log(2.0)])), [1.0 - math.log(2.0)])
    np.testing.assert_allclose(low_var_kl(np.array([0.0]), np.array([0.0])), [0.0])
    np.testing.assert_allclose(low_var_kl(np.array([0.0]), np.array([30.0])), [10.0])


def _grpo_batch(rng: np.random.Generator, sizes: list[int], max_len: int = 7):
    """Per-response GRPO advantages (verl's formula) with ragged response lengths."""
    group = np.repeat(np.arange(len(sizes)), sizes)
    rewards = rng.integers(0, 2, size=group.shape[0]).astype(np.float64)
    mean = np.bincount(group, weights=rewards) / np.bincount(group)
    adv = np.zeros_like(rewards)
    for g in range(len(sizes)):
        r = rewards[group == g]
        adv[group == g] = (r - mean[g]) / (r.std(ddof=1) + 1e-6) if r.size > 1 else 0.0
    lengths = rng.integers(1, max_len + 1, size=group.shape[0])
    mask = (np.arange(max_len)[None, :] < lengths[:, None]).astype(np.float64)
    logp = -rng.random((group.shape[0], max_len))
    return group, rewards, adv, mask, logp


def test_surrogate_is_zero_on_policy_for_variable_group_sizes() -> None:
    rng = np.random.default_rng(0)
    group, _, adv, mask, logp = _grpo_batch(rng, [2, 4, 7, 3, 12, 1])
    assert np.any(adv != 0)
    out = surrogate_loss(logp, logp, adv[:, None] * mask, mask, group)
    np.testing.assert_allclose(out, 0.0, atol=1e-12)
    # Off policy it is not zero: the test would catch a function that ignores the ratio.
    off = surrogate_loss(logp + 0.3 * rng.standard_normal(logp.shape), logp, adv, mask, group)
    assert np.max(np.abs(off)) > 1e-3


def test_surrogate_kl_on_policy_equals_kl_coef_times_mean_kl() -> None:
    rng = np.random.default_rng(1)
    group, _, adv, mask, logp = _grpo_batch(rng, [3, 5, 2])
    ref = logp + 0.5 * rng.standard_normal(logp.shape)
    out = surrogate_kl_loss(logp, logp, ref, adv, mask, group, kl_coef=0.1)
    k3 = np.exp(ref - logp) - (ref - logp) - 1.0
    per_response = (k3 * mask).sum(1) / mask.sum(1)
    expected = [0.1 * per_response[group == g].mean() for g in range(3)]
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.slow
def test_loss_signals_match_verl_token_losses() -> None:
    """Cross-check against verl's own vanilla policy loss and low_var_kl on single responses."""
    torch = pytest.importorskip("torch")
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config import ActorConfig

    rng = np.random.default_rng(2)
    group, _, adv, mask, logp = _grpo_batch(rng, [3, 4])
    old = logp + 0.4 * rng.standard_normal(logp.shape)
    ref = logp + 0.4 * rng.standard_normal(logp.shape)
    ours = clipped_surrogate_response_loss(logp, old, adv, mask, 0.2, 0.28, 3.0)
    cfg = ActorConfig(
        clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1
    )
    for i in range(mask.shape[0]):
        t = {k: torch.tensor(v[i : i + 1]) for k, v in {"logp": logp, "old": old, "ref": ref, "mask": mask}.items()}
        a = torch.full_like(t["logp"], adv[i])
        token = core_algos.kl_penalty(t["logp"], t["ref"], "low_var_kl")
        kl = float((token * t["mask"]).sum() / t["mask"].sum())
        np.testing.assert_allclose(
            (low_var_kl(logp[i], ref[i]) * mask[i]).sum() / mask[i].sum(), kl, rtol=1e-6
        )
        try:
            loss, _ = core_algos.compute_policy_loss_vanilla(t["old"], t["logp"], a, t["mask"], "token-mean", cfg)
        except Exception as exc:  # pragma: no cover - a verl API drift should fail loudly here
            pytest.fail(f"verl compute_policy_loss_vanilla could not be called: {exc}")
        np.testing.assert_allclose(ours[i], float(loss), rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------------------------------------
# Validation and errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_bins": 0}, "num_bins"),
        ({"num_bins": 2.5}, "num_bins"),
        ({"eta": 0.0}, "eta"),
        ({"eta": -1.0}, "eta"),
        ({"beta": 0.0}, "beta"),
        ({"beta": 1.5}, "beta"),
        ({"gamma": 1.0}, "gamma"),
        ({"gamma": -0.1}, "gamma"),
        ({"max_weight": 0.0}, "max_weight"),
        ({"score_clip": 0.0}, "score_clip"),
        ({"share_floor": 0.0}, "share_floor"),
        ({"share_floor": 1.5}, "share_floor"),
        ({"weight_normalization": "softmax"}, "weight_normalization"),
        ({"eta": 100.0, "score_clip": 10.0}, "score_clip"),
        ({"eta": float("nan")}, "eta"),
    ],
)
def test_constructor_rejects_bad_arguments_naming_them(kwargs: dict, name: str) -> None:
    args = {"num_bins": 4, **kwargs}
    with pytest.raises(ValueError, match=name):
        PromptGDRO(**args)


def test_boundary_values_are_accepted() -> None:
    pg = PromptGDRO(1, beta=1.0, gamma=0.0, share_floor=1.0, weight_normalization="raw")
    assert pg.share_floor == 1.0
    assert PromptGDRO(10).share_floor == pytest.approx(0.05)


def test_bad_update_raises_before_any_mutation() -> None:
    pg = PromptGDRO(3)
    pg.update([0, 1], [0.3, 0.6])
    before = pickle.dumps(pg.state_dict())
    for bins, losses, match in [
        ([0, 3], [0.1, 0.2], "bins"),
        ([-1, 0], [0.1, 0.2], "bins"),
        ([0, 1, 2], [0.1, 0.2], "losses"),
        ([0.5, 1], [0.1, 0.2], "bins"),
        ([[0, 1]], [0.1, 0.2], "bins"),
    ]:
        with pytest.raises(ValueError, match=match):
            pg.update(bins, losses)
        assert pickle.dumps(pg.state_dict()) == before
    with pytest.raises(ValueError, match="bins"):
        pg.multipliers([0, 7])


def test_load_state_rejects_other_configuration_by_name() -> None:
    state = PromptGDRO(4).state_dict()
    with pytest.raises(ValueError, match="eta"):
        PromptGDRO(4, eta=0.5).load_state_dict(state)
    with pytest.raises(ValueError, match="num_bins"):
        PromptGDRO(5).load_state_dict(state)
    with pytest.raises(ValueError, match="weight_normalization"):
        PromptGDRO(4, weight_normalization="raw").load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        PromptGDRO(4).load_state_dict({"config": state["config"]})
    with pytest.raises(ValueError, match="version"):
        PromptGDRO(4).load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match="shape"):
        PromptGDRO(4).load_state_dict({**state, "scores": np.zeros(3)})


def test_state_round_trip_and_state_is_a_copy() -> None:
    pg = PromptGDRO(5)
    pg.update([0, 1, 1, 4], [0.9, 0.2, np.nan, 0.1])
    state = pg.state_dict()
    other = PromptGDRO(5)
    other.load_state_dict(pickle.loads(pickle.dumps(state)))
    np.testing.assert_array_equal(other.scores, pg.scores)
    np.testing.assert_array_equal(other.observed, pg.observed)
    assert other.dropped_nonfinite == 1 and other.num_updates == 1
    state["scores"][0] = 123.0  # mutating a saved state must not touch the controller
    assert pg.scores[0] != 123.0
    np.testing.assert_array_equal(other.bin_probs(), pg.bin_probs())


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------

_B = st.integers(min_value=1, max_value=12)


@st.composite
def _controller_and_bins(draw):
    B = draw(_B)
    pg = PromptGDRO(
        B,
        eta=draw(st.floats(0.05, 5.0)),
        gamma=draw(st.floats(0.0, 0.99)),
        max_weight=draw(st.floats(0.5, 30.0)),
        score_clip=draw(st.floats(0.1, 20.0)),
        weight_normalization=draw(st.sampled_from(["mean_one", "raw"])),
    )
    scores = draw(hnp.arrays(np.float64, B, elements=st.floats(-50.0, 50.0)))
    state = pg.state_dict()
    state["scores"] = scores
    state["observed"] = np.ones(B, dtype=bool)
    pg.load_state_dict(state)
    bins = draw(hnp.arrays(np.int64, st.integers(1, 64), elements=st.integers(0, B - 1)))
    return pg, bins


@settings(max_examples=150, deadline=None)
@given(_controller_and_bins())
def test_multipliers_within_cap_and_mean_one_when_cap_does_not_bind(case) -> None:
    pg, bins = case
    w = pg.multipliers(bins)
    assert np.all(w >= 0.0) and np.all(w <= pg.max_weight)
    q = pg.bin_probs()
    if pg.weight_normalization == "mean_one" and np.max(q[bins] / q[bins].mean()) <= pg.max_weight:
        assert w.mean() == pytest.approx(1.0, rel=1e-12)


@settings(max_examples=150, deadline=None)
@given(_controller_and_bins())
def test_q_is_a_distribution_with_the_gamma_floor(case) -> None:
    pg, _ = case
    q = pg.bin_probs()
    assert q.sum() == pytest.approx(1.0, rel=1e-12)
    assert np.all(q >= pg.gamma / pg.num_bins * (1 - 1e-12))


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 8).flatmap(
        lambda B: st.tuples(
            st.just(B),
            hnp.arrays(np.int64, st.integers(0, 40), elements=st.integers(0, B - 1)).flatmap(
                lambda bins: st.tuples(
                    st.just(bins),
                    hnp.arrays(
                        np.float64,
                        bins.shape[0],
                        elements=st.one_of(
                            st.floats(-3.0, 3.0), st.sampled_from([np.nan, np.inf, -np.inf])
                        ),
                    ),
                )
            ),
        )
    ),
    st.booleans(),
)
def test_nonfinite_losses_are_dropped_counted_and_change_nothing_else(case, normalize: bool) -> None:
    B, (bins, losses) = case
    a, b = PromptGDRO(B, normalize_by_share=normalize), PromptGDRO(B, normalize_by_share=normalize)
    warm_bins = np.arange(B)
    a.update(warm_bins, np.linspace(0.0, 1.0, B))
    b.update(warm_bins, np.linspace(0.0, 1.0, B))
    warm = a.scores
    finite = np.isfinite(losses)
    info = a.update(bins, losses)
    b.update(bins[finite], losses[finite])
    # Same scores, bit for bit, as if the non-finite entries had never been there.
    np.testing.assert_array_equal(a.scores, b.scores)
    assert np.all(np.isfinite(a.scores))
    assert info["dropped_nonfinite"] == int((~finite).sum()) == a.dropped_nonfinite
    # A bin whose only entries are non-finite keeps its previous score.
    only_bad = np.setdiff1d(np.unique(bins[~finite]), bins[finite])
    np.testing.assert_array_equal(a.scores[only_bad], warm[only_bad])


# --------------------------------------------------------------------------------------------
# Save at step 100 of 200, resume: bit-identical
# --------------------------------------------------------------------------------------------


def _simulate(pg: PromptGDRO, steps: range, seed: int = 0) -> list[bytes]:
    """Weights before, update after: the spec's order. Per-step data depends on the step only."""
    out = []
    B = pg.num_bins
    for t in steps:
        rng = np.random.default_rng([seed, t])
        prompts = int(rng.integers(1, 40))
        bins = rng.integers(0, B, size=prompts)
        n = rng.integers(2, 9, size=prompts)
        response_bins = np.repeat(bins, n)
        w = pg.multipliers(response_bins)
        losses = 1.0 - (bins + rng.random(prompts)) / B
        losses[rng.random(prompts) < 0.05] = np.nan
        info = pg.update(bins, losses)
        out.append(w.tobytes() + pg.bin_probs().tobytes() + pg.scores.tobytes() + bytes([info["dropped_nonfinite"]]))
    return out


@pytest.mark.parametrize("normalization", ["mean_one", "raw"])
def test_resume_at_step_100_of_200_is_bit_identical(normalization: str) -> None:
    make = lambda: PromptGDRO(10, weight_normalization=normalization)  # noqa: E731
    full = _simulate(make(), range(200))
    first = make()
    head = _simulate(first, range(100))
    blob = pickle.dumps(first.state_dict())
    resumed = make()
    resumed.load_state_dict(pickle.loads(blob))
    tail = _simulate(resumed, range(100, 200))
    assert head + tail == full
    assert resumed.dropped_nonfinite == sum(r[-1] for r in full) > 0
