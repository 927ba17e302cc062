"""Rollout-GDRO as the release's runs used it (gdro.rollout.allocator=release_as_run), and the
release's other measurement choices (update-time loss, present-bins mixture, no score clip).

The allocation tables are hand-computed from the release's DP (kishanpb/verl-gdro,
verl/trainer/group_dro_grpo.py ``rollout_choose_arms``): with uniform arm probabilities every path
to a partial sum costs the same, the first path kept for a sum is never replaced, and the exact
budget's path is the lexicographically smallest arm tuple in class first-appearance order.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_gdro.allocators import ReleaseAsRunAllocator
from verl_gdro.allocators.release_as_run import (
    lexicographic_exact_arms,
    release_classes,
    release_read_classes,
)
from verl_gdro.prompt_gdro import PromptGDRO
from verl_gdro.step.config import resolve_gdro
from verl_gdro.step.controller import GDROController

ARMS = list(range(2, 13))


def release_dp(counts, arms, budget):
    """A line-by-line model of the release's DP with uniform arm probabilities (its tie-break)."""
    logp = float(np.log((1.0 - 0.01) / len(arms) + 0.01 / len(arms)))
    dp = {0: (0.0, [])}
    for cnt in counts:
        new = {}
        for acc, (cost, choices) in dp.items():
            for a in arms:
                ns, nc = acc + a * cnt, cost - logp
                prev = new.get(ns)
                if prev is None or nc < prev[0]:
                    new[ns] = (nc, choices + [a])
        dp = new
    return dp[budget][1]


@pytest.mark.parametrize(
    ("counts", "budget", "expected"),
    [
        # 512 prompts x 4: 2*300 + 6*150 + 10*50 + 4*12 = 600 + 900 + 500 + 48 = 2048; with n1 = 2, no n2 in
        # 2..5 leaves a remainder that 50 n3 + 12 n4 (n3, n4 in 2..12) can make exactly
        ([300, 150, 50, 12], 2048, [2, 6, 10, 4]),
        # 256 x 4: 2*128 + 2*64 + 10*64 = 1024
        ([128, 64, 64], 1024, [2, 2, 10]),
        # 4 classes of 64: 2 + 2 + 2 + 10 = 16 rollouts per 64 prompts
        ([64, 64, 64, 64], 1024, [2, 2, 2, 10]),
        # one class (every prompt in excl on its first visits): only n = 4 is exact
        ([512], 2048, [4]),
    ],
)
def test_release_tie_break_tables_by_hand(counts, budget, expected):
    assert lexicographic_exact_arms(counts, ARMS, budget).tolist() == expected
    assert release_dp(counts, ARMS, budget) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=4), st.integers(2, 6))
def test_lexicographic_arms_match_the_release_dp_and_brute_force(counts, n_mean):
    arms = list(range(2, 3 * n_mean + 1))
    budget = n_mean * sum(counts)
    got = lexicographic_exact_arms(counts, arms, budget).tolist()
    assert got == release_dp(counts, arms, budget)
    exact = [t for t in itertools.product(arms, repeat=len(counts)) if sum(a * c for a, c in zip(t, counts)) == budget]
    assert got == list(min(exact))


def test_lexicographic_arms_refuse_an_impossible_budget():
    with pytest.raises(ValueError, match="exactly"):
        lexicographic_exact_arms([3], [2, 4], 7)


def test_release_classes_put_extreme_and_unseen_rates_in_excl():
    classes = release_classes([0, 1, 2, 2, 0], [0.5, 0.0, 1.0, float("nan"), 0.3], num_bins=3)
    assert classes.tolist() == [0, 3, 3, 3, 0]


def test_allocator_applies_the_previous_steps_classes_by_position():
    alloc = ReleaseAsRunAllocator(num_bins=3, n_min=2, n_max=12, n_mean=4)
    assert alloc.allocate(8).tolist() == [4] * 8  # no previous step: the warm-up
    alloc.observe_classes([3, 0, 3, 1, 1, 3, 0, 3])  # classes in first-appearance order: 3 (x4), 0 (x2), 1 (x2)
    n = alloc.allocate(8)
    # 4 n3 + 2 n0 + 2 n1 = 32, lexicographic over (3, 0, 1): n3 = 2 -> n0 = 2 -> n1 = 10
    assert alloc.last_class_arms == {3: 2, 0: 2, 1: 10}
    assert n.tolist() == [2, 2, 2, 10, 10, 2, 2, 2]
    refill = alloc.allocate(5)  # a refill continues the positions (8..12 -> 0..4), not n = 4 (issue 36)
    assert refill.sum() == 20 and alloc.last_class_arms
    state = alloc.state_dict()
    twin = ReleaseAsRunAllocator(num_bins=3, n_min=2, n_max=12, n_mean=4)
    twin.load_state_dict(state)
    assert twin.allocate(8).tolist() == n.tolist()
    with pytest.raises(ValueError, match="release_as_run"):
        ReleaseAsRunAllocator(num_bins=3, n_min=2, n_max=3, n_mean=4)


def _as_run_controller(**rollout):
    settings = resolve_gdro(
        {
            "preset": "release",
            "prompt": {"enable": False},
            "classifier": {"hysteresis": 0.0},
            "rollout": {"enable": True, "allocator": "release_as_run", **rollout},
        }
    )
    return GDROController(settings, rollout_n=4)


def test_controller_release_as_run_every_prompt_in_excl_until_two_visits():
    ctrl = _as_run_controller()
    uids = np.arange(8)
    for step in range(3):
        plan = ctrl.before_generation(uids)
        # steps 0 and 1: unseen / one visit -> every class excl -> the single class gets n = 4
        assert plan.rollout_n.tolist() == [4] * 8, step
        g = np.repeat(plan.positions, plan.rollout_n)
        # prompts 0-3 always solved once per visit (rate in (0, 1) after two visits), 4-7 never
        acc = np.array([1.0 if (i < 4 and k == 0 and step % 2 == 0) or (i < 4 and k == 1 and step % 2 == 1) else 0.0
                        for i, n in zip(range(8), plan.rollout_n) for k in range(n)])
        ctrl.after_advantage(g, acc)
    # after 3 visits, any-of-n rate of prompts 0-3 is 1.0 (every visit had a success) -> excl; 4-7: 0 -> excl
    assert ctrl.rollout.allocate(8).tolist() == [4] * 8


def test_controller_release_as_run_allocates_next_step_from_previous_classes():
    ctrl = _as_run_controller()
    uids = np.arange(8)
    # visit 1 and 2: prompts 0-3 succeed on visit 1 only (rate 0.5 -> bin 1), 4-7 never (rate 0 -> excl)
    for step in range(2):
        plan = ctrl.before_generation(uids)
        g = np.repeat(plan.positions, plan.rollout_n)
        acc = np.array([1.0 if i < 4 and step == 0 else 0.0 for i, n in zip(range(8), plan.rollout_n) for _ in range(n)])
        ctrl.after_advantage(g, acc)
    # step 2's classes (observed with two visits of history): [1, 1, 1, 1, excl x 4]
    plan = ctrl.before_generation(uids)
    assert plan.rollout_n.tolist() == [4] * 8  # step 2 uses step 1's classes: all excl then
    g = np.repeat(plan.positions, plan.rollout_n)
    m = ctrl.after_advantage(g, np.zeros(g.size))
    assert m["gdro/release_arm/excl"] == 4.0
    # step 3 uses step 2's classes by position: class 1 (4 prompts) first, excl (4) second:
    # 4 n1 + 4 n_excl = 32 -> n1 = 2, n_excl = 6
    plan = ctrl.before_generation(np.arange(100, 108))  # other prompts: the positions still decide
    assert plan.rollout_n.tolist() == [2, 2, 2, 2, 6, 6, 6, 6]
    assert int(plan.rollout_n.sum()) == 32


def test_release_preset_settings_reproduce_the_launch_choices():
    s = resolve_gdro({"preset": "release"})
    assert s.prompt.loss_signal == "update_surrogate"
    assert s.prompt.mix_support == "present" and np.isinf(s.prompt.score_clip)
    assert s.rollout.allocator == "bandit"  # the working bandit unless release_as_run is asked for
    assert resolve_gdro({"preset": "paper"}).prompt.score_clip == 10.0
    assert resolve_gdro({"preset": "robust"}).prompt.mix_support == "all"
    with pytest.raises(ValueError, match="gdro.prompt.mix_support"):
        resolve_gdro({"preset": "release", "prompt": {"mix_support": "some"}})
    with pytest.raises(ValueError, match="min_ess"):
        resolve_gdro({"preset": "release", "prompt": {"min_ess": 0.5}})
    with pytest.raises(ValueError, match="gdro.rollout.allocator"):
        resolve_gdro({"rollout": {"allocator": "as_run"}})


def test_present_mixture_is_the_releases_compute_weights_normalised_to_mean_one():
    pg = PromptGDRO(3, eta=0.65, gamma=0.01, score_clip=float("inf"), mix_support="present")
    pg.update(np.array([0, 1, 2]), np.array([2.0, 0.5, -1.0]))
    s = pg.scores
    bins = np.array([0, 0, 0, 1, 1])  # bin 2 absent from the step
    # the release: (1 - gamma) softmax over the classes present + gamma / (classes present), then the
    # per-response weights normalised to mean 1 and capped at 15
    e = np.exp(0.65 * s[:2])
    q = 0.99 * e / e.sum() + 0.01 / 2
    w = q[bins] / q[bins].mean()
    assert np.allclose(pg.multipliers(bins), np.minimum(w, 15.0))
    # no score clip: a score far beyond 10 still orders the weights and stays finite
    pg.update(np.array([0, 1]), np.array([5000.0, 0.0]))
    m = pg.multipliers(bins)
    assert np.all(np.isfinite(m)) and m[0] > m[3]


def test_update_time_losses_feed_prompt_gdro_for_the_next_step():
    settings = resolve_gdro({"preset": "release", "rollout": {"enable": False}, "classifier": {"unseen_bin": 0}})
    ctrl = GDROController(settings, rollout_n=4)
    assert ctrl.wants_update_losses
    uids = np.arange(6)
    plan = ctrl.before_generation(uids)
    g = np.repeat(plan.positions, 4)
    before = ctrl.prompt.scores
    m = ctrl.after_advantage(g, np.tile([1, 0, 0, 0], 6).astype(float))
    assert np.array_equal(ctrl.prompt.scores, before)  # deferred: nothing learnt before the update
    assert ctrl.awaiting_update
    losses = np.linspace(-0.01, 0.02, g.size)
    out = ctrl.after_update(g, losses)
    assert not ctrl.awaiting_update
    per_prompt = losses.reshape(6, 4).mean(1)
    assert out["gdro/loss/bin_0"] == pytest.approx(per_prompt.mean())
    # unseen_bin 0: one bin holding every prompt, share 1: the EMA's first value is the bin mean
    assert ctrl.prompt.scores[0] == pytest.approx(per_prompt.mean())
    assert "gdro/loss/bin_0" in m
    with pytest.raises(ValueError, match="no observed step"):
        ctrl.after_update(g, losses)
    # a step whose update never reported: the next after_advantage drops it with a warning
    plan = ctrl.before_generation(uids)
    ctrl.after_advantage(np.repeat(plan.positions, 4), np.zeros(24))
    plan = ctrl.before_generation(uids)
    ctrl.after_advantage(np.repeat(plan.positions, 4), np.zeros(24))
    assert ctrl.awaiting_update
    with pytest.raises(ValueError, match="one value per"):
        ctrl.after_update(np.repeat(plan.positions, 4), np.zeros(3))


def test_after_update_is_refused_for_a_driver_side_signal():
    ctrl = GDROController(resolve_gdro({"preset": "paper"}), rollout_n=4)
    with pytest.raises(ValueError, match="update_surrogate"):
        ctrl.after_update([0], [0.0])


def test_state_saved_before_mix_support_existed_still_loads():
    ctrl = GDROController(resolve_gdro({"preset": "paper"}), rollout_n=4)
    plan = ctrl.before_generation(np.arange(4))
    ctrl.after_advantage(np.repeat(plan.positions, 4), np.zeros(16),
                         response_mask=np.ones((16, 3)), old_log_probs=np.zeros((16, 3)),
                         ref_log_probs=np.zeros((16, 3)), advantages=np.zeros((16, 3)))
    state = ctrl.state_dict()
    del state["settings"]["prompt"]["mix_support"]
    del state["prompt"]["config"]["mix_support"]
    twin = GDROController(resolve_gdro({"preset": "paper"}), rollout_n=4)
    twin.load_state_dict(state)
    assert np.array_equal(twin.prompt.scores, ctrl.prompt.scores)
    other = GDROController(resolve_gdro({"preset": "paper", "prompt": {"mix_support": "present"}}), rollout_n=4)
    with pytest.raises(ValueError, match="mix_support"):
        other.load_state_dict(state)


def test_release_as_run_state_round_trips_through_the_controller():
    ctrl = _as_run_controller()
    for step in range(3):
        plan = ctrl.before_generation(np.arange(8))
        g = np.repeat(plan.positions, plan.rollout_n)
        ctrl.after_advantage(g, (np.arange(g.size) % 3 == step % 3).astype(float))
    twin = _as_run_controller()
    twin.load_state_dict(ctrl.state_dict())
    assert np.array_equal(twin.before_generation(np.arange(8)).rollout_n, ctrl.before_generation(np.arange(8)).rollout_n)


def test_release_bandit_learns_from_the_update_time_loss():
    """The release preset's own Rollout-GDRO (the per-bin bandit fed the bin loss) waits for the
    update-time losses too, and learns from them in after_update."""
    ctrl = GDROController(resolve_gdro({"preset": "release", "prompt": {"enable": False}}), rollout_n=4)
    assert ctrl.wants_update_losses and ctrl.prompt is None
    plan = ctrl.before_generation(np.arange(6))
    g = np.repeat(plan.positions, plan.rollout_n)
    before = ctrl.rollout.state_dict()["scores"].copy()
    ctrl.after_advantage(g, (np.arange(g.size) % 2).astype(float))
    assert np.array_equal(ctrl.rollout.state_dict()["scores"], before)  # nothing learnt yet
    ctrl.after_update(g, np.full(g.size, 0.05))
    assert not np.array_equal(ctrl.rollout.state_dict()["scores"], before)


def test_refills_and_partial_steps_keep_the_previous_classes_by_position() -> None:
    """Issue 36: a step that plans more (or fewer) prompts than the previous one observed still
    allocates from the previous classes by position (a refill continues the positions, which start
    over past the previous step's prompts) instead of falling back to n = rollout.n."""
    alloc = ReleaseAsRunAllocator(num_bins=3, n_min=2, n_max=12, n_mean=4)
    alloc.observe_classes([3, 0, 3, 1, 1, 3, 0, 3])
    first = alloc.allocate(8)
    assert first.sum() == 32 and len(set(first.tolist())) > 1
    refill = alloc.allocate(2)  # positions 8, 9 -> 0, 1 of the previous step
    assert refill.sum() == 8 and alloc.last_class_arms  # allocated by class, not the n = 4 fallback
    more = ReleaseAsRunAllocator(num_bins=3, n_min=2, n_max=12, n_mean=4)
    more.observe_classes([3, 0, 3, 1, 1, 3])  # 6 observed (two groups removed), 8 planned next
    n = more.allocate(8)
    assert n.sum() == 32 and more.last_class_arms
    np.testing.assert_array_equal(n[6:], n[:2])  # positions 6, 7 start over at the previous step's 0, 1


# -- the previous step's classes as the release read them (issue 36 item 3) ---------------------------


def test_release_reads_every_nth_response_of_the_expanded_batch_by_hand() -> None:
    """The release keeps ``class_ids[i * rollout.n]`` of the expanded batch (each prompt's n_i
    responses together, plan order). With n = 2 x 6 then 10 x 2 the responses sit at
    p0 0-1, p1 2-3, p2 4-5, p3 6-7, p4 8-9, p5 10-11, p6 12-21, p7 22-31, so positions
    0, 4, ..., 28 fall in p0, p2, p4, p6, p6, p6, p7, p7."""
    classes = [0, 1, 2, 3, 0, 1, 2, 3]
    n = [2, 2, 2, 2, 2, 2, 10, 10]
    read = release_read_classes(classes, n, 4)
    assert read.tolist() == [0, 2, 0, 2, 2, 2, 3, 3]  # class 1 is never read, class 2 four times
    assert release_read_classes(classes, [4] * 8, 4).tolist() == classes  # equal n: the true classes
    # 11 responses, not a multiple of rollout.n: the release recorded nothing (kept its classes)
    assert release_read_classes([0, 1, 2], [4, 3, 4], 4) is None
    with pytest.raises(ValueError, match="same shape"):
        release_read_classes([0, 1], [4], 4)

    true = ReleaseAsRunAllocator(num_bins=3, n_min=2, n_max=12, n_mean=4)
    true._prev = np.asarray(classes)  # what the allocator recorded before (the true classes)
    # true counts 2/2/2/2 in order (0, 1, 2, 3): 2 + 2 + 2 -> n3 = (32 - 12) / 2 = 10
    assert true.allocate(8).tolist() == [2, 2, 2, 10, 2, 2, 2, 10]
    alloc = ReleaseAsRunAllocator(num_bins=3, n_min=2, n_max=12, n_mean=4)
    alloc.observe_classes(classes, n)
    # read counts 2/4/2 in order (0, 2, 3): n0 = 2, n2 = 2 -> n3 = (32 - 4 - 8) / 2 = 10
    assert alloc.allocate(8).tolist() == [2, 2, 2, 2, 2, 2, 10, 10]
    assert alloc.last_class_arms == {0: 2, 2: 2, 3: 10}
    assert alloc.metrics(3)["gdro/release_classes_kept"] == 0.0
    alloc.observe_classes([0, 1, 2], [4, 3, 4])  # 11 responses: the classes read before stay
    assert alloc.metrics(3)["gdro/release_classes_kept"] == 1.0
    assert alloc.allocate(8).tolist() == [2, 2, 2, 2, 2, 2, 10, 10]


def _by_position(classes: np.ndarray) -> tuple[np.ndarray, dict[int, int]]:
    """One call's n from recorded classes by position, and each class's arm."""
    alloc = ReleaseAsRunAllocator(num_bins=3, n_min=2, n_max=12, n_mean=4)
    alloc.observe_classes(classes)
    return alloc.allocate(classes.size), alloc.last_class_arms


def test_issue_36_figure_true_counts_129_49_27_51_read_as_the_release_read_them() -> None:
    """Issue 36's figure: 256 prompts at n = 4 whose true classes number 129 / 49 / 27 / 51 (bin 0,
    bin 1, bin 2, excl in order of appearance) get arms 2 / 4 / 6 / 8; read as the release read them
    they get 2 / 8 / 10 / 2.

    Step t-1's n came from step t-2's classes by position: excl x 127, bin 0 x 52, bin 1 x 77 ->
    lexicographic arms 3 / 2 / 7 (3*127 + 2*52 + 7*77 = 1024). Its expanded batch then holds
    prompts 0-126 at 3 responses (positions 0-380), 127-178 at 2 (381-484), 179-255 at 7 (485-1023).
    The true classes in plan order are bin 0 for prompts 0-128 (positions 0-384), bin 1 for 129-177
    (385-482), bin 2 for 178-204 (483-666), excl for 205-255 (667-1023); the multiples of 4 in those
    ranges number 97, 24, 46 and 89, and 2*97 + 8*24 + 10*46 + 2*89 = 1024 is the lexicographic
    tuple. The prompt-level reading gives 2*129 + 4*49 + 6*27 + 8*51 = 1024."""
    excl = 3
    before = np.repeat([excl, 0, 1], [127, 52, 77])
    n, arms = _by_position(before)
    assert arms == {excl: 3, 0: 2, 1: 7} and int(n.sum()) == 1024
    true = np.repeat([0, 1, 2, excl], [129, 49, 27, 51])
    assert _by_position(true)[1] == {0: 2, 1: 4, 2: 6, excl: 8}  # the classes as they were
    read = release_read_classes(true, n, 4)
    assert np.bincount(read, minlength=4).tolist() == [97, 24, 46, 89]
    alloc = ReleaseAsRunAllocator(num_bins=3, n_min=2, n_max=12, n_mean=4)
    alloc.observe_classes(true, n)
    nxt = alloc.allocate(256)
    assert alloc.last_class_arms == {0: 2, 1: 8, 2: 10, excl: 2}  # the release's allocation
    assert int(nxt.sum()) == 1024
    assert lexicographic_exact_arms([97, 24, 46, 89], ARMS, 1024).tolist() == release_dp([97, 24, 46, 89], ARMS, 1024)


def test_controller_reads_the_previous_classes_through_the_planned_n() -> None:
    """The controller hands the allocator each present prompt's planned n (ObservedStep.n): a step
    allocated unequally is read as the release read it, and a step whose responses are not a
    multiple of rollout.n keeps the classes recorded before (gdro/release_classes_kept)."""
    ctrl = _as_run_controller()
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    record_classes = ctrl.rollout.observe_classes

    def spy(classes, n=None):
        seen.append((np.asarray(classes).copy(), np.asarray(n).copy()))
        record_classes(classes, n)

    ctrl.rollout.observe_classes = spy
    uids = np.arange(8)
    period = [3, 2, 5, 4, 2, 2, 3, 5]
    resampled = 0
    for step in range(8):
        plan = ctrl.before_generation(uids)
        g = np.repeat(plan.positions, plan.rollout_n)
        # prompt i is solved (by its first response) every period[i]-th visit: rates 1/2 .. 1/5
        acc = np.array([float(k == 0 and step % period[i] == 0) for i, n in enumerate(plan.rollout_n) for k in range(n)])
        m = ctrl.after_advantage(g, acc)
        classes, n = seen[-1]
        np.testing.assert_array_equal(n, plan.rollout_n)
        assert m["gdro/release_classes_kept"] == 0.0
        np.testing.assert_array_equal(ctrl.rollout.state_dict()["prev"], release_read_classes(classes, n, 4))
        resampled += not np.array_equal(release_read_classes(classes, n, 4), classes)
    assert resampled  # on some step the unequal n made the release's reading differ from the classes
    plan = ctrl.before_generation(uids)
    odd = int(np.flatnonzero(plan.rollout_n % 4)[0])  # a group whose n is not a multiple of 4
    prev = ctrl.rollout.state_dict()["prev"].copy()
    rows = plan.rollout_n.copy()
    rows[odd] = 0  # that group lost whole: the step's responses are no multiple of rollout.n
    m = ctrl.after_advantage(np.repeat(plan.positions, rows), np.zeros(int(rows.sum())))
    assert m["gdro/release_classes_kept"] == 1.0
    np.testing.assert_array_equal(ctrl.rollout.state_dict()["prev"], prev)


def test_release_as_run_state_saved_before_the_release_reading_loads_and_allocates_from_it() -> None:
    """A state saved on e627010 (true per-prompt classes in ``prev``) still loads: the first step
    after resume is allocated from the classes it saved, as that run would have been (the
    golden trace's step 17 then), and later steps read the classes as the release did."""
    import pickle
    import sys
    from pathlib import Path

    golden = Path(__file__).resolve().parent / "golden"
    sys.path.insert(0, str(golden))
    import record  # noqa: E402

    with open(golden / "state_release_as_run_e627010.pkl", "rb") as f:
        saved = pickle.load(f)
    run = record.Run("release_as_run")
    run.load(saved)
    rec = run.step(record.CHECKPOINT_STEP + 1)
    assert rec["n"].tolist() == [2, 2, 2, 2, 2, 2, 6, 2, 2, 2, 12, 12]  # e627010's step 17
