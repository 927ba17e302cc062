"""The trainer's per-step glue (verl_gdro.integration.glue) and the dispatch ledger it reads.

The vectorised helpers are checked against the per-row loops the trainer used before (written out
here as references), on random batches with padding rows, dropped groups and several generation
calls, so a faster helper can never drift from what the trainer meant.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_gdro.integration.glue import ConsumedBatch, acc_from_extra_fields, consume, flow_metrics, real_rows
from verl_gdro.integration.ledger import DROP_REASONS, Decision, DispatchLedger
from verl_gdro.metrics import PREFIX
from verl_gdro.step.context import gdro_step
from verl_gdro.step.controller import GDROController


def _ctrl(**group: object) -> GDROController:
    return GDROController.from_config({"prompt": {"enable": True}, "rollout": {"enable": True}, **group}, rollout_n=4)


# ---------------------------------------------------------------------------------------------
# real_rows, acc_from_extra_fields
# ---------------------------------------------------------------------------------------------


def test_real_rows_matches_the_per_row_reference() -> None:
    rng = np.random.default_rng(0)
    for _ in range(30):
        uids = [f"u{int(i)}" for i in rng.integers(0, 20, size=int(rng.integers(0, 60)))]
        uids += [f"pad{i}" for i in range(int(rng.integers(0, 4)))]
        rng.shuffle(uids)
        tags = [None if rng.random() < 0.2 else {"is_padding": bool(rng.random() < 0.1)} for _ in uids]
        reference = [
            i for i, (u, tag) in enumerate(zip(uids, tags, strict=True))
            if not (tag or {}).get("is_padding", False) and not u.startswith("pad")
        ]
        assert real_rows(uids, tags).tolist() == reference
        assert real_rows(uids).tolist() == [i for i, u in enumerate(uids) if not u.startswith("pad")]
    with pytest.raises(ValueError, match="one entry per row"):
        real_rows(["a", "b"], [{}])


def test_acc_from_extra_fields_reads_the_rows_or_names_the_keys_seen() -> None:
    infos = [{"reward_extra_info": {"acc": float(i % 2), "score": 1.0}} for i in range(5)]
    values, seen = acc_from_extra_fields(infos, np.array([4, 1, 2]), "acc")
    assert values.dtype == np.float64 and values.tolist() == [0.0, 1.0, 0.0] and seen == set()
    infos[1] = {"reward_extra_info": {"score": 1.0, "pred": "x"}}
    values, seen = acc_from_extra_fields(infos, np.array([0, 1]), "acc")
    assert values is None and seen == {"acc", "score", "pred"}
    values, seen = acc_from_extra_fields([None, "x"], np.array([0, 1]), "acc")  # no dict at all
    assert values is None and seen == set()
    for bad in (None, "n/a", [1.0]):  # present but not a number: the caller's error names the keys seen
        infos = [{"reward_extra_info": {"acc": 1.0}}, {"reward_extra_info": {"acc": bad}}]
        values, seen = acc_from_extra_fields(infos, np.array([0, 1]), "acc")
        assert values is None and seen == {"acc"}
    values, _ = acc_from_extra_fields([{"reward_extra_info": {"acc": v}} for v in (True, 0, np.float32(1.0))],
                                      np.array([0, 1, 2]), "acc")
    assert values.tolist() == [1.0, 0.0, 1.0]
    values, _ = acc_from_extra_fields([{"reward_extra_info": {"acc": math.nan}}], np.array([0]), "acc")
    assert math.isnan(values[0])  # a true NaN is kept: the controller refuses non-finite correctness


# ---------------------------------------------------------------------------------------------
# the ledger
# ---------------------------------------------------------------------------------------------


def _dispatch(ledger: DispatchLedger, uids: list[str], step: int, first_stable: int = 0) -> None:
    k = len(uids)
    ledger.dispatch(uids, np.arange(first_stable, first_stable + k), np.arange(k) % 10, np.full(k, 4), step=step)


def test_dispatch_records_one_decision_per_uid_in_order() -> None:
    ledger = DispatchLedger()
    _dispatch(ledger, ["a", "b"], step=3, first_stable=7)
    _dispatch(ledger, ["c"], step=4, first_stable=9)
    assert ledger.entries == {
        "a": Decision(7, 0, 4, 3, 0), "b": Decision(8, 1, 4, 3, 1), "c": Decision(9, 0, 4, 4, 2),
    }
    assert ledger.entries["b"].stable_uid == 8 and ledger.entries["c"].seq == 2
    assert ledger.calls == [(2, 8), (1, 4)]


@pytest.mark.parametrize("second", [["x", "y", "x"], ["z", "a"]])
def test_dispatching_a_uid_twice_names_it_and_records_nothing(second: list[str]) -> None:
    ledger = DispatchLedger()
    _dispatch(ledger, ["a", "b"], step=1)
    before = dict(ledger.entries)
    twice = "x" if second[0] == "x" else "a"
    with pytest.raises(RuntimeError, match=f"'{twice}' was dispatched twice"):
        _dispatch(ledger, second, step=2)
    assert ledger.entries == before and ledger.calls == [(2, 8)]
    _dispatch(ledger, ["x", "y"], step=3)  # the refused call left no row behind: the next one lines up
    assert [ledger.entries[u].step for u in ("a", "b", "x", "y")] == [1, 1, 3, 3]
    assert ledger.entries["y"].seq == ledger.entries["x"].seq + 1


def test_begin_update_orders_consumed_and_dropped_groups_by_dispatch() -> None:
    ledger = DispatchLedger()
    _dispatch(ledger, ["a", "b", "c"], step=1)
    _dispatch(ledger, ["d", "e"], step=2, first_stable=3)
    assert ledger.drop("b", [1.0, 1.0], "filtered") and ledger.drop("e", [0.0], "stale")
    assert not ledger.drop("b", [1.0], "filtered") and not ledger.drop("zz", [1.0], "filtered")
    update = ledger.begin_update(["d", "d", "a", "c", "a"])
    assert update.uids == ["a", "b", "c", "d", "e"]
    assert update.stable_uids.tolist() == [0, 1, 2, 3, 4]
    assert update.steps.tolist() == [1, 1, 1, 2, 2]
    assert update.slot == {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}
    assert [d.seq for d in update.decisions] == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="'zz' was not planned"):
        ledger.begin_update(["a", "zz"])
    with pytest.raises(RuntimeError, match="'b' was both dropped and consumed"):
        ledger.begin_update(["a", "b"])
    ledger.finish_update(update)
    assert len(ledger) == 0 and not ledger.dropped


def test_empty_update_has_empty_columns() -> None:
    update = DispatchLedger().begin_update([])
    assert update.uids == [] and update.bins.shape == (0,) and update.bins.dtype == np.int64


def test_ledger_state_round_trips() -> None:
    ledger = DispatchLedger()
    _dispatch(ledger, ["a", "b", "c"], step=5)
    ledger.drop("b", [1.0, 0.0], "surplus")
    ledger.drop("c", [], "failed")  # nothing generated: forgotten, counted lost
    other = DispatchLedger()
    other.load_state_dict(ledger.state_dict())
    assert other.entries == ledger.entries and other.dropped == ledger.dropped
    assert other.calls == ledger.calls and other.lost == ledger.lost == 1
    _dispatch(other, ["d"], step=6)
    assert other.entries["d"].seq == 3  # the sequence continues after a resume


def test_ledger_refuses_malformed_input_and_state() -> None:
    """Each refusal names what is wrong and changes nothing (the ledger is checkpointed with the
    controller, so a bad call or a foreign state must not leave it half-updated)."""
    ledger = DispatchLedger()
    _dispatch(ledger, ["a", "b"], step=1)
    assert len(ledger.entries) == 2 and list(ledger.entries) == ["a", "b"]
    with pytest.raises(ValueError, match="one stable id, bin and rollout_n per verl uid"):
        ledger.dispatch(["c"], np.array([1, 2]), np.array([0]), np.array([4]), step=2)
    with pytest.raises(ValueError, match="unknown drop reason 'evicted'"):
        ledger.drop("a", [1.0], "evicted")
    state = ledger.state_dict()
    with pytest.raises(ValueError, match="not a DispatchLedger state"):
        ledger.load_state_dict({**state, "version": -1})
    with pytest.raises(ValueError, match="uids and decision columns disagree"):
        ledger.load_state_dict({**state, "uids": ["a", "a"]})
    assert ledger.state_dict()["uids"] == ["a", "b"] and not ledger.dropped


# ---------------------------------------------------------------------------------------------
# consume: the trainer's update, against its former per-row code
# ---------------------------------------------------------------------------------------------


def _reference(ledger_uids: list[str], update_dropped: dict, positions: np.ndarray, trained: list[str],
               multipliers: np.ndarray) -> tuple[list[int], dict[str, float], list[int], list[float]]:
    slot = {u: i for i, u in enumerate(ledger_uids)}
    kept_group = [slot[u] for u in trained]
    g = positions[kept_group]
    per_position = np.ones(int(positions.max()) + 1 if positions.size else 0)
    per_position[g] = multipliers
    table = dict(zip(ledger_uids, per_position[positions].tolist(), strict=True))
    dropped_index = [int(positions[slot[u]]) for u, (a, _r) in update_dropped.items() for _ in a]
    dropped_acc = [x for a, _r in update_dropped.values() for x in a]
    return kept_group, table, dropped_index, dropped_acc


@settings(max_examples=40, deadline=None)
@given(
    calls=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_consume_matches_the_per_row_reference(calls: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    ctrl = _ctrl()
    ledger = DispatchLedger()
    dispatched: list[str] = []
    for step, k in enumerate(calls):
        stable = rng.integers(0, 50, size=k)
        plan = ctrl.decide(stable)
        uids = [f"u{len(dispatched) + i}" for i in range(k)]
        ledger.dispatch(uids, plan.uids, plan.bins, plan.rollout_n, step=step)
        dispatched += uids
    drop = [u for u in dispatched if rng.random() < 0.3]
    for u in drop:
        ledger.drop(u, rng.integers(0, 2, size=int(rng.integers(0, 4))).astype(float).tolist(),
                    str(rng.choice(DROP_REASONS)))
    keep = [u for u in dispatched if u not in ledger.dropped and u in ledger.entries]
    trained = [u for u in keep for _ in range(ledger.entries[u].rollout_n) if rng.random() < 0.9]
    rng.shuffle(trained)

    consumed = consume(ledger, ctrl, trained)
    assert consumed.rows.tolist() == list(range(len(trained))) and consumed.uids is trained
    assert isinstance(consumed, ConsumedBatch)
    update = consumed.update
    mult = ctrl.advantage_multipliers(consumed.group_index)
    kept_group, table, dropped_index, dropped_acc = _reference(update.uids, update.dropped, consumed.positions,
                                                               trained, mult)
    assert consumed.kept_group.tolist() == kept_group
    assert consumed.group_index.tolist() == consumed.positions[kept_group].tolist()
    assert consumed.multiplier_table(mult) == table
    with gdro_step(consumed.multiplier_table(mult)) as step:  # what the estimator reads back per row
        np.testing.assert_array_equal(step.lookup(trained), mult)
    plan = consumed.row_plan(mult)  # no padding: the estimator gets the rows themselves
    assert plan is not None and plan.uids is trained
    np.testing.assert_array_equal(plan.multipliers, mult)
    assert plan.singleton.tolist() == [trained.count(u) == 1 for u in trained]
    table_in, rows_in = consumed.estimator_inputs(mult)  # no padding: the row plan and no table
    assert table_in is None and rows_in is not None and rows_in.uids is trained
    np.testing.assert_array_equal(rows_in.multipliers, mult)

    got_index, got_acc = consumed.dropped()
    assert got_index.tolist() == dropped_index and got_acc.tolist() == dropped_acc
    # the controller's plan holds the dispatch-time decisions of every group of the update
    assert ctrl.planned_uids(consumed.positions).tolist() == update.stable_uids.tolist()
    stable, bins, n = update.plan_columns()  # views of the table: the copying properties' values
    assert stable.tolist() == update.stable_uids.tolist() and bins.tolist() == update.bins.tolist()
    assert n.tolist() == update.rollout_n.tolist()
    assert stable.size == 0 or (np.shares_memory(stable, update.table) and not np.shares_memory(update.bins, update.table))


def test_consume_leaves_padding_rows_out_and_then_hands_no_row_plan() -> None:
    ctrl, ledger = _ctrl(), DispatchLedger()
    plan = ctrl.decide(np.array([3, 4]))
    ledger.dispatch(["a", "b"], plan.uids, plan.bins, plan.rollout_n, step=1)
    uids = ["a", "pad0", "b", "a", "x"]
    tags = [{}, {}, None, {}, {"is_padding": True}]
    consumed = consume(ledger, ctrl, uids, tags)
    assert consumed.rows.tolist() == [0, 2, 3] and consumed.uids is uids
    assert ctrl.planned_uids(consumed.group_index).tolist() == [3, 4, 3]
    mult = ctrl.advantage_multipliers(consumed.group_index)
    assert consumed.row_plan(mult) is None
    assert consumed.estimator_inputs(mult) == (consumed.multiplier_table(mult), None)  # the table path


def test_flow_metrics_count_kept_filtered_and_discarded_rollouts() -> None:
    ledger = DispatchLedger()
    ledger.dispatch(["a", "b", "c", "d"], np.arange(4), np.array([0, 1, 1, 2]), np.array([4, 4, 2, 6]), step=3)
    ledger.drop("b", [1.0, 1.0, 1.0, 1.0], "filtered")
    ledger.drop("d", [0.0] * 6, "stale")
    update = ledger.begin_update(["a"] * 4 + ["c"] * 2)
    counters = ledger.finish_update(update)
    kept_group = np.array([update.slot[u] for u in ["a"] * 4 + ["c"] * 2])
    m = flow_metrics(3, update, kept_group, counters, global_steps=5, inflight=7)
    assert m[PREFIX + "flow/generated_rollouts"] == 16 and m[PREFIX + "flow/kept_rollouts"] == 6
    assert m[PREFIX + "flow/filtered_rollouts"] == 4 and m[PREFIX + "flow/discarded_rollouts"] == 6
    assert m[PREFIX + "flow/dropped_groups/filtered"] == 1 and m[PREFIX + "flow/dropped_groups/stale"] == 1
    assert m[PREFIX + "flow/filtered_share/bin_1"] == pytest.approx(4 / 6)
    assert m[PREFIX + "flow/filtered_share/bin_2"] == 0.0
    assert m[PREFIX + "staleness/mean"] == 2.0 and m[PREFIX + "inflight_prompts"] == 7
    assert m[PREFIX + "dispatch/calls"] == 1 and m[PREFIX + "dispatch/rollouts"] == 16


def test_ledger_table_stays_proportional_to_the_groups_in_flight() -> None:
    """Observed groups' rows are compacted away even while one old group never comes back, and the
    decisions of the outstanding groups survive every compaction and a checkpoint round trip."""
    ledger = DispatchLedger()
    _dispatch(ledger, ["old"], step=0, first_stable=10_000)
    for step in range(1, 41):
        uids = [f"s{step}-{i}" for i in range(100)]
        _dispatch(ledger, uids, step=step, first_stable=step * 100)
        update = ledger.begin_update(uids[:90])  # 10 groups stay in flight for a step
        ledger.finish_update(update)
        assert ledger._table.shape[0] <= 2 * len(ledger) + 1024 + 100
    assert len(ledger) == 1 + 40 * 10
    assert ledger.entries["old"] == Decision(10_000, 0, 4, 0, 0)
    assert ledger.entries["s40-95"] == Decision(4095, 5, 4, 40, 1 + 39 * 100 + 95)
    other = DispatchLedger()
    other.load_state_dict(ledger.state_dict())
    assert dict(other.entries) == dict(ledger.entries)
    late = ledger.begin_update(["s3-91", "old", "s40-99"])
    assert late.uids == ["old", "s3-91", "s40-99"]  # dispatch order, whatever the consumed order
    assert late.stable_uids.tolist() == [10_000, 391, 4099]


def test_lost_groups_are_counted_by_reason_and_held_until_the_update() -> None:
    """A group removed with no trajectory leaves the ledger at once (nothing to observe), counts
    under its reason and as lost, and its prompt stays held (excluded from the next draws) until
    the update, so every prompt dispatched between two updates is distinct."""
    ledger = DispatchLedger()
    ledger.dispatch(["a", "b", "c"], np.array([10, 11, 12]), np.array([0, 1, 2]), np.array([4, 4, 4]), step=1)
    assert ledger.drop("b", [], "failed") and ledger.drop("c", [], "surplus")
    assert list(ledger.entries) == ["a"] and ledger.live_stable_uids().tolist() == [10]
    assert sorted(ledger.held_stable_uids().tolist()) == [10, 11, 12]
    state = ledger.state_dict()
    other = DispatchLedger()
    other.load_state_dict(state)
    assert sorted(other.held_stable_uids().tolist()) == [10, 11, 12]
    update = ledger.begin_update(["a"] * 4)
    counters = ledger.finish_update(update)
    m = flow_metrics(3, update, np.zeros(4, dtype=np.int64), counters, global_steps=1, inflight=0)
    assert m[PREFIX + "flow/lost_groups"] == 2
    assert m[PREFIX + "flow/dropped_groups/failed"] == 1 and m[PREFIX + "flow/dropped_groups/surplus"] == 1
    assert m[PREFIX + "flow/discarded_rollouts"] == 0  # nothing was generated
    assert ledger.held_stable_uids().size == 0 and len(ledger) == 0
    old = {k: v for k, v in state.items() if k not in ("lost_by_reason", "lost_stable")}  # an older checkpoint
    other.load_state_dict(old)
    assert other.lost == 2 and other.held_stable_uids().tolist() == [10]
