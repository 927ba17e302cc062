"""One step, one draw, in every trainer mode (issue 31): the data adversary's draws, the dispatch
ledger's bounds and the step's metrics, on verl's real trainers and replay buffers.

verl 0.9.1 fetches prompts one at a time (``data.gen_batch_size=1``) in its async modes, under
DAPO and with ``sync_refill_failed_groups``, and ``gen_batch_size`` at a time when the user sets
it. Whatever the loader's batch size, a sampling mode (here the robust default,
``failure_weighted``) must draw each generation call as one block of distinct prompts, none of
them still in flight, with one O(N) probability pass per controller update; and what the trainer
runs must be what the step API's own loop (the CPU study's) computes from the same outcomes.

The trainers are built by their real ``__init__`` through verl's registry; the replay buffers are
verl's own ``sample`` loops (DAPO evictions and 2k refills, failed-group refills, async evictions
and k refills, warm-up prefetch). TransferQueue is the in-memory store and the agent loop writes
trajectories synchronously (``integration_harness``). Each step is verl's own ``PPOTrainer.step``
with the GPU calls stubbed (``integration_harness.verl_step``).
"""

from __future__ import annotations

import io
import itertools
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from integration_harness import FakeAgentLoop, FakeTQ, make_trainer, stub_gpu_calls, verl_step
from test_integration_trainer import _state_equal

from verl_gdro.step.controller import GDROController
from verl_gdro.step.sampler import PromptSampler

BATCH = 6
ROWS = 60
SAMPLING = ("gdro.prompt.mode=failure_weighted", "gdro.rollout.enable=true", "gdro.rollout.allocator=per_prompt")
DAPO = ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc")
COLOCATE = ("trainer.v1.trainer_mode=gdro_colocate_async",)
SEPARATE = (
    "trainer.v1.trainer_mode=gdro_separate_async",
    "trainer.v1.separate_async.parameter_sync_step=1",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
)
#: mode -> (overrides, share of groups whose every rollout fails)
MODES: dict[str, tuple[tuple[str, ...], float]] = {
    "sync": ((), 0.0),
    "sync_gen_batch_2": (("data.gen_batch_size=2",), 0.0),
    "sync_dapo": (DAPO, 0.0),
    "sync_refill_failed": (("trainer.v1.sampler.sync_refill_failed_groups=true",), 0.25),
    "colocate_async": (COLOCATE, 0.2),
    "colocate_async_dapo": (COLOCATE + DAPO, 0.0),
    "separate_async": (SEPARATE, 0.2),
}
#: modes whose generation calls are all of one step's batch, observed at that step's update: the
#: CPU study's own loop (draw, before_generation, after_advantage) is theirs
PLAIN = {"sync", "sync_gen_batch_2"}


class FailingAgentLoop(FakeAgentLoop):
    """The harness's agent loop where a seeded share of groups fails outright: no trajectory, the
    prompt's status ``failure`` (what verl's agent loop leaves when every session errors)."""

    def __init__(self, store: FakeTQ, trainer: Any, rate: float, events: list) -> None:
        super().__init__(store, trainer)
        self.rate = rate
        self.events = events

    def generate_sequences(self, batch: Any) -> None:
        super().generate_sequences(batch)
        call = self.calls[-1]
        failed = [u for u, s in zip(call["uid"], call["stable"])
                  if np.random.default_rng([s, call["step"], 99]).random() < self.rate]
        for u in failed:
            for key in [k for (part, k) in self.store.rows if part == "train" and k.startswith(f"{u}_")]:
                self.store.clear([key], "train")
            self.store.tags[("train", u)] = {"is_prompt": True, "status": "failure", "global_steps": call["step"]}
            call["acc"][u] = []
        self.events.append(("call", len(self.calls) - 1))


def make_run(tmp_path: Path, store: FakeTQ, mode: str, *extra: str, rate: float | None = None,
             sampling: tuple[str, ...] = SAMPLING) -> tuple[Any, FailingAgentLoop, list]:
    overrides, mode_rate = MODES[mode]
    rate = mode_rate if rate is None else rate
    trainer = make_trainer(tmp_path, *overrides, *sampling, *extra, num_rows=ROWS)
    events: list = []
    agent = FailingAgentLoop(store, trainer, rate, events)
    trainer.agent_loop_manager = agent
    trainer.replay_buffer.poll_interval = 0.0
    inner = trainer.replay_buffer.gdro_observer

    def observer(partition_id: str, keys: dict[str, list[str]], reasons: dict[str, str]) -> None:
        events.extend(("drop", u, reasons[u], len(keys[u])) for u in sorted(keys))
        inner(partition_id, keys, reasons)

    trainer.replay_buffer.gdro_observer = observer
    stub_gpu_calls(trainer, store)
    return trainer, agent, events


def is_async(trainer: Any) -> bool:
    return trainer.trainer_mode != "sync"


def run_step(trainer: Any, store: FakeTQ, step: int, events: list) -> dict[str, Any]:
    """One step as verl's fit() drives it (``integration_harness.verl_step``): the async warm-up
    prefetch before step 1, then verl 0.9.1's own ``step()`` (the step's batch, the replay
    buffer's sample loop with its refills, verl's batch balancing, log-prob, advantage and actor
    stages, GPU calls stubbed), then the consumed keys cleared."""
    batch, metrics = verl_step(trainer, store, step)
    # the groups trained, verl's padding rows (_balance_batch) aside
    consumed = [u for u in dict.fromkeys(k.rsplit("_", 2)[0] for k in batch.keys) if not u.startswith("pad")]
    events.append(("update", consumed))
    return {"batch": batch, "metrics": metrics, "consumed": consumed}


@pytest.mark.parametrize("mode", list(MODES))
def test_each_generation_call_is_one_draw_of_distinct_prompts_not_in_flight(
    tmp_path: Path, fake_tq: FakeTQ, mode: str
) -> None:
    assert_one_draw_per_call(*make_run(tmp_path, fake_tq, mode), fake_tq, mode)


def assert_one_draw_per_call(trainer: Any, agent: FailingAgentLoop, events: list, store: FakeTQ, mode: str) -> None:
    """Eight steps through verl's step(): each generation call one draw of distinct prompts, none in
    flight; one probability pass per update; the ledger exactly the groups in flight; the step's
    draw metrics; refill rounds exactly where the mode refills."""
    sampler = trainer.gdro_sampler._draws
    stable_of: dict[str, int] = {}
    inflight: set[str] = set()
    refill_rounds = 0
    for step in range(1, 9):
        calls_before, passes_before, draws_before = len(agent.calls), sampler.passes, sampler.draws
        held = {stable_of[u] for u in inflight}  # prompts in flight when the step starts
        seen_events = len(events)
        out = run_step(trainer, store, step, events)
        calls = agent.calls[calls_before:]
        for call in calls:
            stable_of.update(zip(call["uid"], call["stable"]))
            inflight.update(call["uid"])
        drawn = [s for c in calls for s in c["stable"]]
        # every prompt the step dispatched (its batch and every refill) is distinct, and none was
        # in flight from an earlier step
        assert len(set(drawn)) == len(drawn), (step, drawn)
        assert not held & set(drawn), (step, held & set(drawn))
        # one O(N) probability pass per controller update; one draw per generation call
        assert sampler.passes - passes_before == 1, step
        assert sampler.draws - draws_before == len(calls), step
        refill_rounds += len(calls) - (2 if step == 1 and is_async(trainer) else 1)
        # the groups the step trains on: distinct prompts, train_batch_size of them
        consumed = [stable_of[u] for u in out["consumed"]]
        assert len(set(consumed)) == len(consumed) == BATCH, (step, consumed)
        for kind, *rest in events[seen_events:]:
            if kind == "drop":
                inflight.discard(rest[0])
        inflight -= set(out["consumed"])
        # the ledger holds exactly the groups in flight, all distinct prompts
        live = trainer.gdro_ledger.live_stable_uids()
        assert len(live) == len(set(live.tolist())) == len(trainer.gdro_ledger)
        m = out["metrics"]
        assert m["gdro/draw/calls"] == len(calls) and m["gdro/draw/prompts"] == len(drawn)
        assert 0 < m["gdro/draw/ess_share"] <= 1 and 0 < m["gdro/draw/coverage"] <= 1
        assert 0 < m["gdro/draw/explore_share"] <= 1
    if mode not in PLAIN:
        assert refill_rounds > 0, "no refill round: the mode's refill path was not exercised"
    else:
        assert refill_rounds == 0


@pytest.mark.parametrize("mode", ["sync_dapo", "colocate_async_dapo"])
def test_the_mode_built_for_dapos_filter_draws_distinct_blocks_too(tmp_path: Path, fake_tq: FakeTQ, mode: str) -> None:
    """``prompt.mode=expected_informative`` (the draw built for DAPO's filter) under the filter, through
    verl's own step(): the same invariants, since only the priority differs."""
    sampling = ("gdro.prompt.mode=expected_informative", *SAMPLING[1:])
    trainer, agent, events = make_run(tmp_path, fake_tq, mode, sampling=sampling)
    assert trainer.gdro_settings.prompt.mode == "expected_informative"
    assert_one_draw_per_call(trainer, agent, events, fake_tq, mode)


def replay_through_the_step_api(trainer: Any, agent: FailingAgentLoop, events: list, mode: str,
                                states: list[tuple[dict, dict]]) -> None:
    """The recorded run replayed through the step API's own loop: a fresh GDROController and
    PromptSampler draw every generation call themselves (excluding their own prompts in flight),
    decide it, and update with the recorded outcomes; after every update their state is the
    trainer's, and every draw is the prompts the trainer dispatched."""
    ctrl = GDROController(trainer.gdro_settings, rollout_n=4)
    uids = trainer.gdro_sampler.uids
    sampler = PromptSampler(ctrl, uids, seed=int(trainer.config.data.seed))
    decided: dict[str, tuple[int, int, int]] = {}  # verl uid -> (stable, bin, n), dispatch order
    dropped: dict[str, list[float]] = {}
    lost: list[int] = []  # prompts removed with no trajectory since the last update: still held
    acc = {u: a for c in agent.calls for u, a in c["acc"].items()}
    plain_plan = None
    update = 0
    for kind, *rest in events:
        if kind == "call":
            call = agent.calls[rest[0]]
            held = [s for s, _b, _n in decided.values()] + lost
            excluded = sampler.evidence.rows(np.array(held, dtype=np.int64))
            rows = sampler.draw(len(call["uid"]), exclude=excluded)
            assert uids[rows].tolist() == call["stable"], (update, call["step"])
            if mode in PLAIN:  # the study's loop: plan the step's batch, update with its trajectories
                plain_plan = ctrl.before_generation(uids[rows])
                plan = plain_plan
            else:
                plan = ctrl.decide(uids[rows])
            assert plan.rollout_n.tolist() == call["rollout_n"]
            for u, s, b, n in zip(call["uid"], call["stable"], plan.bins.tolist(), plan.rollout_n.tolist()):
                decided[u] = (s, b, n)
        elif kind == "drop":
            uid, _reason, nkeys = rest
            if nkeys == 0 or not acc[uid]:
                lost.append(decided.pop(uid)[0])  # nothing generated: forgotten
            else:
                dropped[uid] = acc[uid]
        else:
            consumed = rest[0]
            if mode in PLAIN:
                assert plain_plan is not None and consumed == [u for u in decided]
                positions = plain_plan.positions
            else:
                group = [u for u in decided if u in set(consumed) | set(dropped)]
                positions = ctrl.adopt(np.array([decided[u][0] for u in group], dtype=np.int64),
                                       np.array([decided[u][1] for u in group], dtype=np.int64),
                                       np.array([decided[u][2] for u in group], dtype=np.int64))
            pos = dict(zip([u for u in decided if mode in PLAIN or u in set(consumed) | set(dropped)],
                           positions.tolist()))
            g = [pos[u] for u in consumed for _ in acc[u]]
            ctrl.advantage_multipliers(np.array(g, dtype=np.int64))
            g += [pos[u] for u in dropped for _ in dropped[u]]
            a = [x for u in consumed for x in acc[u]] + [x for u in dropped for x in dropped[u]]
            ctrl.after_advantage(np.array(g, dtype=np.int64), np.array(a))
            for u in list(pos):
                decided.pop(u)
            dropped.clear()
            lost.clear()
            controller_state, sampler_state = states[update]
            assert _state_equal(ctrl.state_dict(), controller_state), f"controller differs after update {update + 1}"
            assert _state_equal(sampler.state_dict(), sampler_state), f"sampler differs after update {update + 1}"
            update += 1
    assert update == len(states)


@pytest.mark.parametrize("mode", list(MODES))
def test_the_trainer_runs_what_the_step_api_loop_computes(tmp_path: Path, fake_tq: FakeTQ, mode: str) -> None:
    """Issue 31, item 9: the same recorded outcomes through the trainer and through the step API's
    loop (GDROController + PromptSampler, as the CPU study drives them) give the same controller
    and sampler state after every step, and the same prompts at every draw."""
    trainer, agent, events = make_run(tmp_path, fake_tq, mode)
    states = []
    for step in range(1, 9):
        run_step(trainer, fake_tq, step, events)
        states.append((trainer.gdro.state_dict(), trainer.gdro_sampler._draws.state_dict()))
    replay_through_the_step_api(trainer, agent, events, mode, states)


@pytest.fixture
def det_uuid(monkeypatch: pytest.MonkeyPatch) -> Any:
    """verl's per-dispatch uids (uuid4) made deterministic, so two runs see the same strings."""
    counter = {"next": itertools.count(1)}
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(counter["next"])))
    return counter


@pytest.mark.parametrize("mode", ["sync_gen_batch_2", "sync_dapo", "colocate_async", "separate_async"])
def test_a_resumed_run_continues_the_same_prompt_stream(tmp_path: Path, fake_tq: FakeTQ, det_uuid: Any,
                                                        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    import transfer_queue

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, agent_a, events_a = make_run(tmp_path / "a", fake_tq, mode)
    for step in range(1, 3):
        run_step(a, fake_tq, step, events_a)
    data_pt = tmp_path / "data.pt"
    torch.save(a.train_dataloader.state_dict(), data_pt)  # PPOTrainer._save_checkpoint
    tq_ckpt = fake_tq.snapshot()  # tq.save_checkpoint (async modes; the sync store holds nothing in flight)
    det_uuid["next"], saved_counter = itertools.tee(det_uuid["next"])
    metrics_a = [run_step(a, fake_tq, step, events_a)["metrics"] for step in range(3, 7)]

    for name, fn in (("kv_batch_get", tq_ckpt.get), ("kv_batch_put", tq_ckpt.put), ("kv_list", tq_ckpt.kv_list),
                     ("kv_clear", tq_ckpt.clear)):
        monkeypatch.setattr(transfer_queue, name, fn)
    b, agent_b, events_b = make_run(tmp_path / "b", tq_ckpt, mode)
    det_uuid["next"] = saved_counter  # after building b (which draws uuids): the same verl uids as a's
    b.train_dataloader.load_state_dict(torch.load(data_pt, weights_only=False))  # PPOTrainer._load_checkpoint
    b._restored_tq_prompt_count = sum(1 for t in tq_ckpt.tags.values() if t.get("is_prompt"))
    metrics_b = [run_step(b, tq_ckpt, step, events_b)["metrics"] for step in range(3, 7)]

    def stream(agent: FailingAgentLoop) -> list[tuple[int, list[int], list[int]]]:
        return [(c["step"], c["stable"], c["rollout_n"]) for c in agent.calls if c["step"] >= 3]

    assert stream(agent_b) == stream(agent_a)
    assert _state_equal(a.gdro.state_dict(), b.gdro.state_dict())
    assert _state_equal(a.gdro_sampler.state_dict()["draws"], b.gdro_sampler.state_dict()["draws"])
    for ma, mb in zip(metrics_a, metrics_b):
        assert {k: v for k, v in ma.items() if k != "gdro/controller_time_s"} == {
            k: v for k, v in mb.items() if k != "gdro/controller_time_s"}


@pytest.mark.parametrize("mode", list(MODES))
def test_failed_groups_leave_the_ledger_and_are_counted(tmp_path: Path, fake_tq: FakeTQ, mode: str) -> None:
    """Issue 31, item 4: with a quarter of the groups failing outright, in every mode, the ledger
    holds only groups verl still has in flight (none in sync), every failed group leaves it once,
    counted under ``gdro/flow/dropped_groups/failed`` (and ``lost_groups``), and the checkpoint stays
    bounded over many steps."""
    trainer, agent, events = make_run(tmp_path, fake_tq, mode, rate=0.25)
    failed_counted = lost_counted = 0
    sizes = []
    for step in range(1, 25):
        m = run_step(trainer, fake_tq, step, events)["metrics"]
        failed_counted += m["gdro/flow/dropped_groups/failed"]
        lost_counted += m["gdro/flow/lost_groups"]
        in_flight = {k for (part, k), tag in fake_tq.tags.items() if part == "train" and tag.get("is_prompt")}
        ledger = set(trainer.gdro_ledger.entries)
        assert ledger <= in_flight, ledger - in_flight  # nothing outlives its group in verl's buffer
        if not is_async(trainer):
            assert not ledger and m["gdro/inflight_prompts"] == 0
        assert m["gdro/inflight_prompts"] == len(ledger) <= 2 * BATCH
        state = trainer.gdro_ledger.state_dict()
        assert len(state["uids"]) == len(ledger)
        buf = io.BytesIO()
        torch.save(trainer.train_dataloader.state_dict(), buf)
        sizes.append(buf.tell())
    failed = [u for c in agent.calls for u, a in c["acc"].items() if not a]
    gone = [u for u in failed if u not in trainer.gdro_ledger.entries]
    assert len(failed) > 10 and len(gone) >= len(failed) - 2 * BATCH
    assert failed_counted == lost_counted == len(gone)
    # the checkpoint: fixed-size arrays over the training set plus the groups in flight
    assert max(sizes[8:]) <= 1.1 * sizes[8], sizes


@pytest.mark.parametrize("mode", ["sync_dapo", "sync_refill_failed", "colocate_async"])
def test_shadow_price_is_the_step_batch_allocations(tmp_path: Path, fake_tq: FakeTQ, mode: str) -> None:
    """Issue 31, item 6: under ``per_prompt``, ``gdro/shadow_price`` is the price of the step's own
    batch allocation (verl's prepare_step call), not of the latest refill of a prompt or two."""
    trainer, agent, events = make_run(tmp_path, fake_tq, mode)
    prices: list[tuple[int, int, float]] = []  # (step, prompts, mu after the call's allocation)
    decide = trainer.gdro.decide

    def spy(uids: Any) -> Any:
        plan = decide(uids)
        prices.append((int(trainer.global_steps), len(plan.uids), float(trainer.gdro.rollout.mu)))
        return plan

    trainer.gdro.decide = spy
    differs = 0
    for step in range(1, 9):
        before = len(prices)
        m = run_step(trainer, fake_tq, step, events)["metrics"]
        calls = prices[before:]
        batch = calls[1] if step == 1 and is_async(trainer) else calls[0]  # after the warm-up call
        assert batch[1] == BATCH
        # verl's step() averages each metric over its local updates (MetricsAggregator): an ulp apart
        assert m["gdro/shadow_price"] == pytest.approx(batch[2], rel=1e-12, abs=1e-15), (step, calls)
        differs += abs(calls[-1][2] - batch[2]) > 1e-9
    assert differs > 0, "no step ended on a refill priced differently: the metric was not exercised"
