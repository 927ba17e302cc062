"""The data adversary's prompt draws: each sampling mode's priority by hand, the exploration floor,
exact distinct batches, the per-prompt evidence, the step API's sampler and its state, and the
zero-advantage metric."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_gdro.classifier import OnlineDifficultyClassifier
from verl_gdro.evidence import (
    PromptEvidence,
    band_priority,
    draw_without_replacement,
    failure_weighted_priority,
    greso_keep_probability,
    mix_uniform,
    sampling_priority,
)
from verl_gdro.metrics import step_metrics
from verl_gdro.step.config import SAMPLING_MODES, resolve_gdro, validate_gdro_config
from verl_gdro.step.controller import GDROController
from verl_gdro.step.sampler import PromptSampler


def ctrl(mode: str = "failure_weighted", rollout: bool = False, **prompt: Any) -> GDROController:
    return GDROController(resolve_gdro({"prompt": {"mode": mode, **prompt}, "rollout": {"enable": rollout}}), rollout_n=4)


def step(c: GDROController, uids: np.ndarray, successes: np.ndarray, n: int = 4) -> dict[str, float]:
    """One step of ``uids`` with ``successes[i]`` correct rollouts of prompt i (of n)."""
    plan = c.before_generation(uids)
    g = np.repeat(plan.positions, plan.rollout_n)
    # within each group, the first s rollouts are correct
    rank = np.arange(g.size) - np.repeat(np.cumsum(plan.rollout_n) - plan.rollout_n, plan.rollout_n)
    acc = (rank < np.asarray(successes)[g]).astype(float)
    return c.after_advantage(g, acc)


# -- the priorities by hand -----------------------------------------------------------------------


def test_failure_weighted_priority_by_hand() -> None:
    # (1 - p)(1 - p^4 - (1 - p)^4)
    got = failure_weighted_priority(np.array([0.5, 0.1, 0.0, 1.0]), 4)
    assert got == pytest.approx([0.5 * (1 - 0.0625 - 0.0625), 0.9 * (1 - 0.0001 - 0.6561), 0.0, 0.0])


def test_greso_keep_probability_by_hand() -> None:
    assert greso_keep_probability(np.array([0, 1, 3]), 0.5) == pytest.approx([1.0, 0.5, 0.125])


def test_band_priority_by_hand() -> None:
    assert band_priority(np.array([0.5, 0.3, 0.9]), 0.2) == pytest.approx([1.0, math.exp(-0.5), math.exp(-2.0)])


def test_sampling_priority_reads_the_smoothed_rate_and_the_streak() -> None:
    s, t, z = np.array([0.0, 3.0]), np.array([0.0, 3.0]), np.array([0, 2])
    # unseen: p = 1/2; 3 of 3: p = 3.5 / 4
    assert sampling_priority("failure_weighted", s, t, z, n=4, revisit=0.5, width=0.2) == pytest.approx(
        failure_weighted_priority(np.array([0.5, 0.875]), 4)
    )
    assert sampling_priority("greso", s, t, z, n=4, revisit=0.5, width=0.2) == pytest.approx([1.0, 0.25])
    with pytest.raises(ValueError, match="not a per-prompt priority"):
        sampling_priority("resample", s, t, z, n=4, revisit=0.5, width=0.2)


def test_mix_uniform_by_hand() -> None:
    assert mix_uniform(np.array([1.0, 0.0, 0.0, 3.0]), 0.2) == pytest.approx([0.25, 0.05, 0.05, 0.65])
    assert mix_uniform(np.zeros(4), 0.2) == pytest.approx([0.25] * 4)  # nothing to prefer: uniform


# -- drawing ---------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 60), st.data())
def test_draws_are_distinct_and_exact(n: int, data: st.DataObject) -> None:
    size = data.draw(st.integers(0, n))
    p = mix_uniform(np.asarray(data.draw(st.lists(st.floats(0, 10), min_size=n, max_size=n))), 0.1)
    rows = draw_without_replacement(p, size, np.random.default_rng(data.draw(st.integers(0, 2**31))))
    assert rows.size == size and np.unique(rows).size == size and (rows >= 0).all() and (rows < n).all()


def test_the_first_draw_follows_the_probabilities() -> None:
    p = np.array([0.1, 0.2, 0.3, 0.4])
    rng = np.random.default_rng(0)
    first = np.array([draw_without_replacement(p, 2, rng)[0] for _ in range(20_000)])
    freq = np.bincount(first, minlength=4) / first.size
    assert freq == pytest.approx(p, abs=0.015)


def test_zero_probability_rows_are_never_drawn_while_others_remain() -> None:
    p = np.array([0.0, 0.5, 0.0, 0.5])
    for seed in range(20):
        assert sorted(draw_without_replacement(p, 2, np.random.default_rng(seed)).tolist()) == [1, 3]


def test_draw_size_is_checked() -> None:
    with pytest.raises(ValueError, match="cannot draw 5 distinct prompts from 4"):
        draw_without_replacement(np.full(4, 0.25), 5, np.random.default_rng(0))


# -- the evidence ----------------------------------------------------------------------------------


def test_evidence_decays_per_visit_by_hand() -> None:
    ev = PromptEvidence(np.array([10, 20, 30]), decay=0.5)
    ev.observe([20], [2], [4])
    ev.observe([20, 99], [4, 1], [4, 4])  # 99 is outside the set: ignored
    assert ev.successes.tolist() == [0.0, 0.5 * 2 + 4, 0.0]
    assert ev.trials.tolist() == [0.0, 0.5 * 4 + 4, 0.0]
    assert ev.visits.tolist() == [0, 2, 0]
    assert ev.streak.tolist() == [0, 1, 0]  # 2/4 carried signal, 4/4 did not
    ev.observe([20], [0], [4])
    assert ev.streak[1] == 2
    ev.observe([20], [1], [4])
    assert ev.streak[1] == 0
    assert ev.rates()[0] == 0.5  # unseen: the prior


def test_evidence_matches_the_classifiers_decayed_counts() -> None:
    rng = np.random.default_rng(3)
    uids = np.arange(100, 140)
    clf = OnlineDifficultyClassifier(num_bins=10, window=100)
    ev = PromptEvidence(uids, decay=0.7)
    for _ in range(30):
        u = np.sort(rng.choice(uids, size=12, replace=False))
        t = np.full(u.size, 4)
        s = rng.integers(0, 5, size=u.size)
        clf.observe(u, s, t)
        ev.observe(u, s, t)
    s_ref, t_ref = clf.decayed_counts(uids, 0.7)
    assert ev.successes == pytest.approx(s_ref) and ev.trials == pytest.approx(t_ref)


def test_evidence_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="distinct"):
        PromptEvidence(np.array([1, 1]), 0.5)
    with pytest.raises(ValueError, match="decay"):
        PromptEvidence(np.array([1, 2]), 0.0)
    ev = PromptEvidence(np.array([1, 2]), 0.5)
    with pytest.raises(ValueError, match="one visit per prompt"):
        ev.observe([1, 1], [1, 1], [4, 4])


# -- the step API's sampler -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", SAMPLING_MODES)
def test_sampler_draws_exact_distinct_batches_with_the_floor(mode: str) -> None:
    c = ctrl(mode)
    uids = np.arange(1000, 1064)
    sampler = PromptSampler(c, uids, seed=1)
    rng = np.random.default_rng(0)
    for _ in range(6):
        rows = sampler.draw(16)
        assert rows.size == 16 and np.unique(rows).size == 16
        step(c, uids[rows], rng.integers(0, 5, size=16))
        probs = sampler.probabilities()
        assert probs.sum() == pytest.approx(1.0)
        assert probs.min() >= 0.2 / uids.size - 1e-15  # the exploration floor (explore 0.2)


def test_unseen_prompts_read_the_prior_and_come_first() -> None:
    c = ctrl("failure_weighted")
    uids = np.arange(8)
    sampler = PromptSampler(c, uids, seed=0)
    assert sampler.probabilities() == pytest.approx(np.full(8, 1 / 8))  # all unseen: all equal
    step(c, uids[:4], np.array([4, 4, 4, 4]))  # four solved prompts
    p = sampler.probabilities()
    solved = failure_weighted_priority(np.array([4.5 / 5]), 4)[0]
    unseen = failure_weighted_priority(np.array([0.5]), 4)[0]
    w = np.array([solved] * 4 + [unseen] * 4)
    assert p == pytest.approx(0.8 * w / w.sum() + 0.2 / 8)
    assert p[4:].min() > p[:4].max()


def test_resample_spreads_q_over_each_bins_prompts() -> None:
    c = ctrl("resample", eta=3.0, normalize_by_share=False)
    uids = np.arange(40)
    sampler = PromptSampler(c, uids, seed=0)
    for _ in range(3):
        step(c, uids, np.where(uids < 10, 0, 4))  # 10 hard prompts (bin 0), 30 solved (bin 9)
    q = c.bin_probs()
    bins = c.bins_of(uids)
    assert set(bins.tolist()) == {0, 9}
    mass = np.where(bins == 0, q[0] / 10, q[9] / 30) / (q[0] + q[9])
    assert sampler.probabilities() == pytest.approx(0.8 * mass + 0.2 / 40)


def test_sampler_state_round_trip_gives_the_same_draws() -> None:
    def make() -> tuple[GDROController, PromptSampler]:
        c = ctrl("greso")
        return c, PromptSampler(c, np.arange(50), seed=4)

    c1, s1 = make()
    rng = np.random.default_rng(1)
    for _ in range(3):
        rows = s1.draw(10)
        step(c1, np.arange(50)[rows], rng.integers(0, 5, size=10))
    saved_ctrl, saved_sampler = c1.state_dict(), s1.state_dict()
    after = [s1.draw(10).tolist() for _ in range(3)]
    c2, s2 = make()
    c2.load_state_dict(saved_ctrl)
    s2.load_state_dict(saved_sampler)
    assert [s2.draw(10).tolist() for _ in range(3)] == after
    assert np.array_equal(c2.evidence.streak, c1.evidence.streak)


def test_sampler_refuses_a_reweighting_controller_and_bad_sizes() -> None:
    with pytest.raises(ValueError, match="does not draw prompts"):
        PromptSampler(ctrl("reweight"), np.arange(4))
    with pytest.raises(ValueError, match="batch size 5 is invalid"):
        PromptSampler(ctrl(), np.arange(4)).draw(5)


def test_sampling_modes_leave_the_advantages_alone() -> None:
    c = ctrl("band")
    PromptSampler(c, np.arange(6))
    plan = c.before_generation(np.arange(6))
    assert (c.advantage_multipliers(np.repeat(plan.positions, 4)) == 1.0).all()


# -- configuration ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("explore", 0.0, r"^gdro.prompt.explore=0.0 is invalid"),
        ("rate_decay", 1.5, r"^gdro.prompt.rate_decay=1.5 is invalid"),
        ("revisit", 0, r"^gdro.prompt.revisit=0 is invalid"),
        ("band_width", -1, r"^gdro.prompt.band_width=-1 is invalid"),
        ("mode", "skip", r"^gdro.prompt.mode='skip' is invalid: allowed values are \['reweight', 'resample'"),
    ],
)
def test_sampling_keys_are_checked(key: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_gdro({"prompt": {key: value}})


def test_a_sampling_mode_needs_the_gdro_trainer() -> None:
    cfg = {
        "trainer": {"v1": {"trainer_mode": "sync"}},
        "algorithm": {"adv_estimator": "gdro_grpo"},
        "actor_rollout_ref": {"rollout": {"n": 4}},
        "gdro": {"prompt": {"mode": "greso"}},
    }
    with pytest.raises(ValueError, match=r"^gdro.prompt.mode=greso is invalid with trainer.v1.trainer_mode='sync'"):
        validate_gdro_config(cfg)


def test_release_preset_sets_the_authors_launch_settings() -> None:
    s = resolve_gdro({"preset": "release"})
    assert (s.classifier.num_bins, s.classifier.bin_edges, s.classifier.window) == (3, (0.4, 0.75), 50)
    assert s.classifier.passk_estimator == "any_of_n" and s.classifier.hysteresis == 0.03
    assert (s.prompt.loss_signal, s.prompt.min_ess, s.prompt.beta, s.prompt.eta) == ("update_surrogate", 0.0, 0.12, 0.65)
    assert s.prompt.mix_support == "present" and s.prompt.score_clip == float("inf")
    assert s.prompt.max_weight == 15.0 and s.prompt.normalize_by_share
    assert (s.rollout.allocator, s.rollout.score_ema, s.rollout.dual_lr, s.rollout.n_max) == ("bandit", 0.4, 0.05, 12)
    # an explicit bin choice wins over the preset's geometry, as a whole
    assert resolve_gdro({"preset": "release", "classifier": {"num_bins": 6}}).classifier.bin_edges is None


# -- the waste, measured ----------------------------------------------------------------------------


def test_zero_advantage_share_by_hand() -> None:
    # bin 0: 0/4 (zero) and 2/4; bin 1: 4/4 (zero), 4/4 (zero), 1/4
    m = step_metrics(2, [0, 0, 1, 1, 1], [0, 2, 4, 4, 1], [4, 4, 4, 4, 4])
    assert m["gdro/zero_adv_share"] == pytest.approx(3 / 5)
    assert m["gdro/zero_adv/bin_0"] == pytest.approx(1 / 2)
    assert m["gdro/zero_adv/bin_1"] == pytest.approx(2 / 3)
    assert "gdro/zero_adv/bin_1" not in step_metrics(2, [0], [0], [4])  # absent bin: not logged


def test_the_documented_sampling_loop_runs() -> None:
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "integration.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python own-loop-sampler\n(.*?)```", doc, flags=re.S)
    scope: dict = {}
    exec(compile(block, "docs/integration.md", "exec"), scope)
    assert scope["ctrl"].num_steps == 20 and scope["metrics"]["gdro/num_rollouts"] == 128
    assert scope["state"]["controller"]["evidence"]["visits"].sum() == 20 * 32
    assert 0.0 <= scope["metrics"]["gdro/zero_adv_share"] <= 1.0


def test_resample_bins_refreshed_per_visit_equal_classifying_the_whole_set() -> None:
    c = ctrl("resample", eta=3.0)
    uids = np.arange(200, 260)
    sampler = PromptSampler(c, uids, seed=2)
    rng = np.random.default_rng(5)
    for _ in range(12):
        rows = sampler.draw(20)
        fresh = c.bins_of(uids)  # what classifying every prompt gives (idempotent without a visit)
        assert np.array_equal(sampler._current_bins(), fresh)
        step(c, uids[rows], rng.integers(0, 5, size=20))


def test_a_controller_state_saved_before_the_sampling_keys_loads() -> None:
    c = ctrl("reweight")
    step(c, np.arange(4), np.array([1, 2, 3, 4]))
    state = c.state_dict()
    for key in ("explore", "rate_decay", "revisit", "band_width"):
        del state["settings"]["prompt"][key]
    del state["evidence"]
    fresh = ctrl("reweight")
    fresh.load_state_dict(state)
    assert fresh.num_steps == 1 and fresh.evidence is None
