"""``gdro_grpo`` through verl's own ``compute_advantage`` on real DataProtos, against verl's ``grpo``."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from verl_gdro.integration import estimator as est
from verl_gdro.prompt_gdro import PromptGDRO
from verl_gdro.step.context import RowPlan, gdro_step

SIZES = [2, 3, 5, 4, 12, 2, 7]  # Rollout-GDRO-like variable group sizes


def algo_cfg(estimator: str, norm: bool = True, **gdro: object) -> object:
    return OmegaConf.create({"adv_estimator": estimator, "norm_adv_by_std_in_grpo": norm, "gdro": gdro})


def advantages(data: object, estimator: str, norm: bool = True, **gdro: object) -> torch.Tensor:
    out = compute_advantage(
        copy.deepcopy(data),
        adv_estimator=estimator,
        norm_adv_by_std_in_grpo=norm,
        config=algo_cfg(estimator, norm, **gdro),
    )
    return out.batch["advantages"]


@pytest.fixture(autouse=True)
def fresh_standalone() -> None:
    est.reset_standalone()


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("rewards", ["binary", "continuous"])
def test_prompt_gdro_disabled_equals_grpo_bitwise(grpo_batch, norm: bool, rewards: str) -> None:
    data = grpo_batch(SIZES, seed=1, rewards=rewards)
    ref = advantages(data, "grpo", norm)
    got = advantages(data, "gdro_grpo", norm, prompt={"enable": False})
    assert torch.equal(got, ref)
    off = advantages(data, "gdro_grpo", norm, enable=False)
    assert torch.equal(off, ref)
    assert est.standalone_state()["steps"] == 0  # nothing ran standalone


def test_multipliers_one_equal_grpo_bitwise(grpo_batch) -> None:
    data = grpo_batch(SIZES, seed=2)
    ref = advantages(data, "grpo")
    uids = sorted(set(data.non_tensor_batch["uid"].tolist()))
    with gdro_step({u: 1.0 for u in uids}):
        got = advantages(data, "gdro_grpo")
    assert torch.equal(got, ref)


def test_known_multipliers_scale_each_group(grpo_batch) -> None:
    data = grpo_batch(SIZES, seed=3)
    ref = advantages(data, "grpo")
    uids = data.non_tensor_batch["uid"]
    table = {f"g{g}": 0.25 + 0.5 * g for g in range(len(SIZES))}
    with gdro_step(table):
        got = advantages(data, "gdro_grpo")
    per_row = torch.tensor([table[u] for u in uids], dtype=ref.dtype)[:, None]
    assert torch.equal(got, ref * per_row)
    # group-relative: within a group the multiplied advantages still sum to ~0 (binary rewards)
    scalar = (got * data.batch["response_mask"]).sum(-1) / data.batch["response_mask"].sum(-1)
    for g in range(len(SIZES)):
        rows = np.flatnonzero(uids == f"g{g}")
        assert abs(float(scalar[rows].sum())) < 1e-4


def test_advantage_clip_bounds_the_multiplied_advantages(grpo_batch) -> None:
    """gdro.advantage_clip (the paper's [-5, 5]) clips after the multipliers, and only there."""
    data = grpo_batch(SIZES, seed=4)
    ref = advantages(data, "grpo")
    uids = data.non_tensor_batch["uid"]
    table = {f"g{g}": 15.0 if g % 2 else 0.5 for g in range(len(SIZES))}  # capped weights of 15
    per_row = torch.tensor([table[u] for u in uids], dtype=ref.dtype)[:, None]
    with gdro_step(table):
        unclipped = advantages(data, "gdro_grpo")
    with gdro_step(table):
        clipped = advantages(data, "gdro_grpo", advantage_clip=5.0)
    assert float(unclipped.abs().max()) > 5.0  # the case is real: weight 15 pushes past 5
    assert torch.equal(clipped, (ref * per_row).clamp(-5.0, 5.0))
    assert torch.equal(clipped == 0, ref == 0)  # the mask and zero advantages survive the clip
    # a clip no advantage reaches changes nothing: verl's grpo bit for bit with the adversaries off
    assert torch.equal(advantages(data, "gdro_grpo", prompt={"enable": False}, advantage_clip=100.0), ref)


def test_standalone_bins_a_rate_on_an_edge_into_the_upper_bin(grpo_batch) -> None:
    """A group rate exactly on an inner edge lands in the bin above (the classifier's raw bin, on
    its 12-decimal grid), whatever the floating-point path that produced the edge."""
    data = grpo_batch([10], seed=23)
    rewards = data.batch["token_level_rewards"]
    rewards.zero_()
    last_token = data.batch["response_mask"].sum(-1).long() - 1
    rewards[torch.arange(7), last_token[:7]] = 1.0  # 7 of 10 correct: rate 0.7
    advantages(data, "gdro_grpo", classifier={"bin_edges": [0.1 * i for i in range(1, 10)], "num_bins": None})
    assert 0.1 * 7 != 0.7  # the edge as computed is 0.7000000000000001
    assert est.standalone_state()["last"]["group_bins"].tolist() == [7]


def test_singleton_groups_get_zero_advantage(grpo_batch) -> None:
    data = grpo_batch([1, 4, 1, 3], seed=4)
    ref = advantages(data, "grpo")
    got = advantages(data, "gdro_grpo", prompt={"enable": False})
    uids = data.non_tensor_batch["uid"]
    single = np.isin(uids, ["g0", "g2"])
    # verl's grpo gives a singleton its raw reward (mean 0, std 1): not group-relative
    assert torch.count_nonzero(ref[torch.as_tensor(single)]) > 0
    assert torch.count_nonzero(got[torch.as_tensor(single)]) == 0
    assert torch.equal(got[torch.as_tensor(~single)], ref[torch.as_tensor(~single)])


def test_padding_rows_get_multiplier_one_and_zero_advantage(grpo_batch) -> None:
    data = grpo_batch([3, 4], seed=5, pad_rows=3)
    with gdro_step({"g0": 2.0, "g1": 0.5}):  # the pad uid is not listed: it must not raise
        got = advantages(data, "gdro_grpo")
    assert torch.count_nonzero(got[-3:]) == 0


def test_unplanned_uid_inside_a_step_raises(grpo_batch) -> None:
    data = grpo_batch([3, 4], seed=6)
    with gdro_step({"g0": 2.0}), pytest.raises(KeyError, match="no Prompt-GDRO multiplier for uid 'g1'"):
        advantages(data, "gdro_grpo")


def test_v1_multi_trajectory_path_matches_grpo(grpo_batch) -> None:
    """The V1 trainer calls compute_advantage_for_multi_trajectories; single-output sessions agree."""
    data = grpo_batch(SIZES, seed=7)
    uids = data.non_tensor_batch["uid"].tolist()
    counters: dict[str, int] = {}
    keys = []
    for u in uids:
        keys.append(f"{u}_{counters.get(u, 0)}_0")
        counters[u] = counters.get(u, 0) + 1
    ref = compute_advantage_for_multi_trajectories(copy.deepcopy(data), keys, "grpo", config=algo_cfg("grpo"))
    got = compute_advantage_for_multi_trajectories(
        copy.deepcopy(data), keys, "gdro_grpo", config=algo_cfg("gdro_grpo", prompt={"enable": False})
    )
    assert torch.allclose(got.batch["advantages"], ref.batch["advantages"], atol=1e-6)


def test_multi_output_sessions_are_where_gdro_grpo_and_verls_grpo_part(grpo_batch) -> None:
    """issue 36 item 15: verl 0.9.1's V1 path gives only the grpo enum its multi-trajectory
    statistics (each session's final output, broadcast); gdro_grpo, like any other estimator, gets
    every row. Two outputs per session carrying the session's reward: the group's std differs, so
    "verl's grpo bit for bit" holds for one output per session only (docs/integration.md)."""
    data = grpo_batch([4, 4, 4], seed=3)
    rewards = data.batch["token_level_rewards"]
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0] * 3)  # rows 2k, 2k+1: one session, one reward
    scores[4:6] = 1.0  # a group with spread in every uid
    scores[10:12] = 1.0
    rewards.zero_()
    rewards[:, 0] = scores
    data.batch["response_mask"][:, 0] = 1
    keys = [f"{u}_{(i % 4) // 2}_{i % 2}" for i, u in enumerate(data.non_tensor_batch["uid"].tolist())]
    ref = compute_advantage_for_multi_trajectories(copy.deepcopy(data), keys, "grpo", config=algo_cfg("grpo"))
    got = compute_advantage_for_multi_trajectories(
        copy.deepcopy(data), keys, "gdro_grpo", config=algo_cfg("gdro_grpo", prompt={"enable": False})
    )
    assert not torch.allclose(got.batch["advantages"], ref.batch["advantages"], atol=1e-4)
    # the same rows as single-output sessions (every key its own session): the two agree
    single = [f"{u}_{i}_0" for i, u in enumerate(data.non_tensor_batch["uid"].tolist())]
    ref1 = compute_advantage_for_multi_trajectories(copy.deepcopy(data), single, "grpo", config=algo_cfg("grpo"))
    got1 = compute_advantage_for_multi_trajectories(
        copy.deepcopy(data), single, "gdro_grpo", config=algo_cfg("gdro_grpo", prompt={"enable": False})
    )
    assert torch.allclose(got1.batch["advantages"], ref1.batch["advantages"], atol=1e-6)


def test_standalone_reweights_like_prompt_gdro_over_steps(grpo_batch, caplog) -> None:
    """Standalone: bins from each group's own correctness, Prompt-GDRO state kept across steps."""
    edges = np.arange(1, 10) / 10
    shadow = PromptGDRO(10, min_ess=0.8)  # the robust preset's ESS floor
    caplog.set_level(logging.WARNING, logger="verl_gdro.integration.estimator")
    for step in range(4):
        data = grpo_batch(SIZES, seed=10 + step)
        ref = advantages(data, "grpo")
        got = advantages(data, "gdro_grpo")
        uids = data.non_tensor_batch["uid"]
        scores = data.batch["token_level_rewards"].sum(-1).numpy()
        groups = [f"g{g}" for g in range(len(SIZES))]
        rate = np.array([(scores[uids == g] > 0).mean() for g in groups])
        bins = np.searchsorted(edges, rate, side="right")
        row_bins = bins[[groups.index(u) for u in uids]]
        expected = shadow.multipliers(row_bins)
        shadow.update(bins, 1.0 - rate)
        expected_adv = ref * torch.tensor(expected, dtype=ref.dtype)[:, None]
        assert torch.allclose(got, expected_adv, rtol=1e-6, atol=1e-7), step
        assert np.allclose(est.standalone_state()["prompt"]["scores"], shadow.scores)
        if step > 0:
            assert not np.allclose(expected, 1.0)  # the weights really move
    assert est.standalone_state()["steps"] == 4
    standalone_logs = [r for r in caplog.records if "STANDALONE" in r.getMessage()]
    assert len(standalone_logs) == 1


def test_standalone_threshold_is_configurable(grpo_batch) -> None:
    data = grpo_batch([4, 4, 4], seed=20, rewards="continuous")
    advantages(data, "gdro_grpo", correct_threshold=10.0)
    last = est.standalone_state()["last"]
    assert np.all(last["group_success_rate"] == 0.0)  # nothing beats 10: every group in bin 0
    assert np.all(last["group_bins"] == 0)


def test_standalone_refuses_trainer_only_features(grpo_batch) -> None:
    data = grpo_batch([3, 3], seed=21)
    with pytest.raises(ValueError, match=r"^algorithm\.gdro\.rollout\.enable=True is invalid for the standalone"):
        advantages(data, "gdro_grpo", rollout={"enable": True})
    with pytest.raises(ValueError, match=r"^algorithm\.gdro\.prompt\.mode=resample is invalid for the standalone"):
        advantages(data, "gdro_grpo", prompt={"mode": "resample"})


def test_bad_gdro_key_in_algorithm_group_is_refused(grpo_batch) -> None:
    data = grpo_batch([3, 3], seed=22)
    with pytest.raises(ValueError, match=r"^algorithm\.gdro\.prompt\.etaa is not a known key"):
        advantages(data, "gdro_grpo", prompt={"etaa": 1.0})


def test_open_step_settings_replace_the_config_group(grpo_batch) -> None:
    """issue 13: the GDRO trainer hands its resolved settings to the step, so the estimator does
    not resolve and validate algorithm.gdro again on every step; the step's settings then rule."""
    from verl_gdro.step.config import resolve_gdro

    data = grpo_batch(SIZES, seed=3)
    uids = sorted(set(data.non_tensor_batch["uid"].tolist()))
    ref = advantages(data, "gdro_grpo", advantage_clip=0.25)
    with gdro_step({u: 1.0 for u in uids}, settings=resolve_gdro({"advantage_clip": 0.25})):
        got = advantages(data, "gdro_grpo")  # the config group has no clip
    assert torch.equal(got, ref)
    assert float(got.abs().max()) == pytest.approx(0.25)


def test_gdro_step_per_row_values_must_agree_within_a_uid() -> None:
    with gdro_step(uids=["a", "b", "a", "b"], values=[2.0, 0.5, 2.0, 0.5]) as step:
        assert dict(step.multipliers) == {"a": 2.0, "b": 0.5}
        np.testing.assert_array_equal(step.lookup(np.array(["b", "a", "pad1"], dtype=object)), [0.5, 2.0, 1.0])
    with pytest.raises(ValueError, match=r"uid 'b' has two different multipliers \(0.5 and 0.25\)"), \
            gdro_step(uids=["a", "b", "a", "b"], values=[2.0, 0.5, 2.0, 0.25]):
        pass
    with pytest.raises(ValueError, match="finite and >= 0; uid 'b'"), gdro_step(uids=["a", "b"], values=[1.0, -1.0]):
        pass
    with pytest.raises(ValueError, match="finite and >= 0; uid 'x'"), gdro_step({"w": 1.0, "x": float("nan")}):
        pass


def test_gdro_step_keeps_its_own_copy_of_the_table_and_keys_it_by_str() -> None:
    """A str -> float dict (what the trainer builds) is copied as is; any other mapping is keyed by
    str(uid) with float values; either way the step does not see later edits of the caller's dict."""
    given = {"a": 2.0, "b": 0.5}
    with gdro_step(given) as step:
        given["a"] = 9.0
        assert dict(step.multipliers) == {"a": 2.0, "b": 0.5}
    with gdro_step({7: 2, np.str_("b"): np.float32(0.5)}) as step:
        assert dict(step.multipliers) == {"7": 2.0, "b": 0.5}
        assert all(type(k) is str and type(v) is float for k, v in step.multipliers.items())
    with pytest.raises(ValueError, match="finite and >= 0; uid 'x'"), gdro_step({"w": 1.0, "x": -0.0 - 1.0}):
        pass


def _row_plan(uids: list[str], table: dict[str, float]) -> RowPlan:
    counts = {u: uids.count(u) for u in set(uids)}
    return RowPlan(uids=list(uids), multipliers=np.array([table[u] for u in uids]),
                   singleton=np.array([counts[u] == 1 for u in uids]))


def _table_case(grpo_batch, sizes: list[int], seed: int) -> tuple[object, list[str], dict[str, float], torch.Tensor]:
    """(batch, its uid per row, a per-group multiplier table, the table path's advantages)."""
    data = grpo_batch(sizes, seed=seed)
    uids = data.non_tensor_batch["uid"].tolist()
    table = {f"g{g}": 0.25 + 0.5 * g for g in range(len(sizes))}
    with gdro_step(table):
        ref = advantages(data, "gdro_grpo")
    return data, uids, table, ref


def _count_calls(monkeypatch, module: object, name: str) -> list[int]:
    """Wrap ``module.name`` so that each call appends to the returned list."""
    calls: list[int] = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("sizes", [SIZES, [3, 1, 4, 1, 2]])  # with singleton groups too
def test_row_plan_gives_the_tables_bits_and_skips_the_grouping(grpo_batch, monkeypatch, sizes) -> None:
    data, uids, table, ref = _table_case(grpo_batch, sizes, seed=31)
    grouped = _count_calls(monkeypatch, est, "_group_ids")
    with gdro_step(table, rows=_row_plan(uids, table)):
        got = advantages(data, "gdro_grpo")
    assert torch.equal(got, ref) and not grouped  # same bits, and the rows were not regrouped
    # rows in another order than the batch: the estimator groups the rows itself, same bits
    with gdro_step(table, rows=_row_plan(uids[::-1], table)):
        got = advantages(data, "gdro_grpo")
    assert torch.equal(got, ref) and grouped


@pytest.mark.parametrize("sizes", [SIZES, [3, 1, 4, 1, 2]])
def test_a_step_given_only_rows_builds_no_table_unless_the_batch_differs(grpo_batch, monkeypatch, sizes) -> None:
    """gdro_step(rows=...) alone (the trainer's usual step): the table's bits, no per-uid table
    built while the batch is exactly the plan's rows; when verl's batch differs (here reversed,
    as batch balancing may reorder it), the row plan's table is built on demand, same bits."""
    import verl_gdro.step.context as ctx

    data, uids, table, ref = _table_case(grpo_batch, sizes, seed=37)
    built = _count_calls(monkeypatch, ctx, "_per_uid_table")
    with gdro_step(rows=_row_plan(uids, table)) as step:
        got = advantages(data, "gdro_grpo")
    assert torch.equal(got, ref) and not built
    assert dict(step.multipliers) == table and built  # read on demand: the row plan's own table
    built.clear()
    with gdro_step(rows=_row_plan(uids[::-1], table)):
        got = advantages(data, "gdro_grpo")
    assert torch.equal(got, ref) and built


def test_a_row_plan_with_two_values_for_one_uid_is_refused_when_its_table_is_read() -> None:
    plan = RowPlan(uids=["a", "a", "b"], multipliers=np.array([1.0, 2.0, 1.0]), singleton=np.zeros(3, dtype=bool))
    with gdro_step(rows=plan) as step, pytest.raises(ValueError, match="uid 'a' has two different multipliers"):
        step.lookup(["b", "a"])
    with pytest.raises(ValueError, match="or rows"), gdro_step():
        pass


def test_row_plan_prepares_what_the_estimator_reads() -> None:
    """all_ones, any_singleton and the float32 column come from the same values: the column has
    torch's own float64 -> float32 bits."""
    m = np.random.default_rng(3).uniform(0.1, 3.0, 64)
    m[5] = 1.0 + 2.0**-30  # rounds to 1.0 in float32, still not all ones
    plan = RowPlan(uids=[f"u{i}" for i in range(64)], multipliers=m, singleton=np.arange(64) == 9)
    assert not plan.all_ones and plan.any_singleton
    column = torch.from_numpy(plan.multipliers_f32)
    assert torch.equal(column, torch.as_tensor(m, dtype=torch.float32))
    ones = RowPlan(uids=["a", "a"], multipliers=np.ones(2), singleton=np.zeros(2, dtype=bool))
    assert ones.all_ones and not ones.any_singleton
    almost = RowPlan(uids=["a", "a"], multipliers=np.array([1.0, np.nextafter(1.0, 2.0)]), singleton=np.zeros(2, bool))
    assert not almost.all_ones


@pytest.mark.parametrize("norm", [True, False])
def test_the_steps_norm_setting_is_the_one_verl_passes_to_grpo(grpo_batch, norm) -> None:
    """gdro_step(norm_adv_by_std=...) (the trainer's copy of algorithm.norm_adv_by_std_in_grpo) is
    what the estimator uses; without it the estimator reads its config, as before."""
    data = grpo_batch(SIZES, seed=41)
    uids = data.non_tensor_batch["uid"].tolist()
    table = {f"g{g}": 1.0 for g in range(len(SIZES))}
    ref = advantages(data, "grpo", norm=norm)
    with gdro_step(rows=_row_plan(uids, table), norm_adv_by_std=norm):
        got = advantages(data, "gdro_grpo", norm=not norm)  # the config says the opposite: the step wins
    assert torch.equal(got, ref)
    with gdro_step(rows=_row_plan(uids, table)):
        assert torch.equal(advantages(data, "gdro_grpo", norm=norm), ref)


def test_row_plan_refuses_bad_rows() -> None:
    with pytest.raises(ValueError, match="one entry per uid"):
        RowPlan(uids=["a", "b"], multipliers=np.ones(3), singleton=np.zeros(2, dtype=bool))
    with pytest.raises(ValueError, match="finite and >= 0; row 1"):
        RowPlan(uids=["a", "b"], multipliers=np.array([1.0, np.nan]), singleton=np.zeros(2, dtype=bool))
    plan = RowPlan(uids=["a", "b"], multipliers=np.ones(2), singleton=np.zeros(2, dtype=bool))
    assert plan.matches(np.array(["a", "b"], dtype=object)) and plan.matches(["a", "b"])
    assert not plan.matches(["b", "a"]) and not plan.matches(["a"])


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.int64, torch.float64, torch.bool])
def test_row_plan_path_keeps_the_tables_bits_for_every_mask_dtype(grpo_batch, mask_dtype) -> None:
    """The row plan's zeroing and multipliers are prepared before verl's loop, as a column of the
    dtype the advantages will have; whatever the mask's dtype the result is the table path's, bit
    for bit (signed zeros included), and of the same dtype."""
    data = grpo_batch([3, 1, 4, 1, 2], seed=7, rewards="normal")
    data.batch["response_mask"] = data.batch["response_mask"].to(mask_dtype)
    uids = data.non_tensor_batch["uid"].tolist()
    table = {f"g{g}": 0.1 + 0.7 * g for g in range(5)}
    with gdro_step(table):
        ref = advantages(data, "gdro_grpo")
    with gdro_step(table, rows=_row_plan(uids, table)):
        got = advantages(data, "gdro_grpo")
    assert got.dtype == ref.dtype
    assert got.numpy().tobytes() == ref.numpy().tobytes()
