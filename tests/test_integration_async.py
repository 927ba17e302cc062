"""The async GDRO trainers (``gdro_colocate_async``, ``gdro_separate_async``) on verl's async machinery.

Built by their real ``__init__`` through verl's trainer registry (so verl's own async switches
apply: ``ReplayBufferAsync``, ``gen_batch_size=1``, warm-up batches), with verl's real
``ReplayBufferAsync.sample`` (DAPO, stale and failed evictions with exact-k refills). TransferQueue
is the in-memory store; the agent loop writes trajectories synchronously. No Ray, no GPU: what a
real separate_async run needs beyond this (standalone rollout pool, nccl/nixl checkpoint engine) is
not exercised here (docs/integration.md).

Semantics under staleness (docs/integration.md): a prompt's bin and rollout count are decided
with the controller state at its dispatch; updates apply in the order the trainer consumes
trajectories, each group once; warm-up batches and refills are generation calls with their own
exact budget; the dispatch ledger rides in the checkpoint with the controller.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from integration_harness import FakeAgentLoop, FakeTQ, make_trainer
from test_integration_trainer import _state_equal

from verl_gdro.integration.trainer import ROLLOUT_N_KEY
from verl_gdro.step.controller import GDROController

BATCH = 6
MODES = {
    "gdro_colocate_async": ("trainer.v1.trainer_mode=gdro_colocate_async",),
    "gdro_separate_async": (
        "trainer.v1.trainer_mode=gdro_separate_async",
        "trainer.v1.separate_async.parameter_sync_step=1",  # train_batch_size == ppo_mini_batch_size (6)
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",  # verl refuses naive here
    ),
}
DAPO = ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc")
STALE_DROP = ("trainer.v1.sampler.max_off_policy_threshold=1", "trainer.v1.sampler.max_off_policy_strategy=drop")


@pytest.fixture
def det_uuid(monkeypatch: pytest.MonkeyPatch) -> Any:
    """verl's per-dispatch uids (uuid4) made deterministic: verl picks among equally old groups in
    set order over those strings, so a resume comparison needs the same strings in both runs."""
    counter = {"next": itertools.count(1)}

    def fake_uuid4() -> uuid.UUID:
        return uuid.UUID(int=next(counter["next"]))

    monkeypatch.setattr(uuid, "uuid4", fake_uuid4)
    return counter


def make_async(tmp_path: Path, store: FakeTQ, mode: str, *overrides: str, num_rows: int = 60) -> tuple[Any, FakeAgentLoop]:
    trainer = make_trainer(tmp_path, *MODES[mode], "gdro.rollout.enable=true", *overrides, num_rows=num_rows)
    agent = FakeAgentLoop(store, trainer)
    trainer.agent_loop_manager = agent
    trainer.replay_buffer.poll_interval = 0.0
    return trainer, agent


def warm_up(trainer: Any) -> None:
    """What fit() does before step 1: global_steps = 1, then on_train_begin's warm-up batches."""
    trainer.global_steps = 1
    trainer._add_async_warmup_batches(1)


def async_step(trainer: Any, store: FakeTQ, step: int) -> dict[str, Any]:
    """One step as verl's step() runs it: dispatch the step's batch, sample (verl's async buffer:
    oldest groups first, evict and refill), the advantage stage, then clear the consumed keys."""
    trainer.global_steps = step
    trainer._add_batch_to_generate()  # PPOTrainer.prepare_step
    batch, rb = trainer.replay_buffer.sample(global_steps=step, partition_id="train", batch_size=BATCH)
    metrics: dict[str, Any] = {}
    trainer._compute_advantage(batch, metrics)
    store.clear(batch.keys, "train")
    return {"batch": batch, "metrics": metrics, "rb": rb}


def record_drops(trainer: Any) -> list[tuple[str, str]]:
    """Every group verl's buffer removes untrained, as reported to the trainer (uid, reason)."""
    drops: list[tuple[str, str]] = []
    inner = trainer.replay_buffer.gdro_observer

    def observer(partition_id: str, keys: dict[str, list[str]], reasons: dict[str, str]) -> None:
        drops.extend(sorted(reasons.items()))
        inner(partition_id, keys, reasons)

    trainer.replay_buffer.gdro_observer = observer
    return drops


@pytest.mark.parametrize("mode", list(MODES))
def test_async_trainer_runs_on_verls_async_machinery(tmp_path: Path, fake_tq: FakeTQ, mode: str) -> None:
    trainer, agent = make_async(tmp_path, fake_tq, mode)
    base = mode.removeprefix("gdro_")
    assert type(trainer).__name__ == {"colocate_async": "GDROTrainerColocateAsync",
                                      "separate_async": "GDROTrainerSeparateAsync"}[base]
    assert trainer.trainer_mode == base == trainer.config.trainer.v1.trainer_mode
    assert type(trainer.replay_buffer).__name__ == "GDROReplayBufferAsync"
    assert trainer.config.data.gen_batch_size == 1
    warm_up(trainer)
    trainer._add_batch_to_generate()
    assert [len(c["uid"]) for c in agent.calls] == [BATCH, BATCH]  # warm-up batch, then the step's batch
    assert len(trainer.gdro_ledger) == 2 * BATCH
    # verl persists async prompts' fields for re-issue after a restart: __rollout_n__ rides along
    for call in agent.calls:
        for uid, n in zip(call["uid"], call["rollout_n"]):
            stored = fake_tq.rows[("train", uid)][ROLLOUT_N_KEY]
            assert int(getattr(stored, "data", stored)) == n


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("policy", [DAPO, STALE_DROP], ids=["dapo", "stale_drop"])
def test_decided_at_dispatch_updated_in_consumption_order(
    tmp_path: Path, fake_tq: FakeTQ, mode: str, policy: tuple[str, ...]
) -> None:
    """An independent replay of the semantics: a shadow controller decides every generation call
    with the state it has at that moment and, at each update, observes the consumed groups plus
    those removed since the last update, once each, with their dispatch-time bins and n."""
    # 12 prompts: a prompt in flight has usually been observed since its dispatch, so its bin at
    # dispatch and its bin at consumption differ, and only the dispatch-time one matches the shadow
    trainer, agent = make_async(tmp_path, fake_tq, mode, *policy, num_rows=12)
    drops = record_drops(trainer)
    shadow = GDROController(trainer.gdro_settings, rollout_n=4)
    decided: dict[str, tuple[int, int, int, int]] = {}  # uid -> (stable, bin, n, dispatch step)
    replayed = 0
    max_staleness = 0.0
    moved = 0  # observed groups whose prompt's bin changed between dispatch and consumption
    warm_up(trainer)
    for step in range(1, 7):
        seen_drops = len(drops)
        out = async_step(trainer, fake_tq, step)
        for call in agent.calls[replayed:]:
            plan = shadow.decide(np.array(call["stable"]))
            assert plan.rollout_n.tolist() == call["rollout_n"], (step, call)  # decided at dispatch
            assert sum(call["rollout_n"]) == 4 * len(call["uid"])  # exact budget per generation call
            for u, s, b, n in zip(call["uid"], call["stable"], plan.bins.tolist(), call["rollout_n"]):
                decided[u] = (s, b, n, call["step"])
        replayed = len(agent.calls)
        acc = {u: a for c in agent.calls for u, a in c["acc"].items()}
        trained = [k.rsplit("_", 2)[0] for k in out["batch"].keys]
        dropped = [u for u, _r in drops[seen_drops:]]
        group = sorted(set(trained) | set(dropped), key=list(decided).index)  # dispatch order
        positions = shadow.adopt(np.array([decided[u][0] for u in group]), np.array([decided[u][1] for u in group]),
                                 np.array([decided[u][2] for u in group]))
        pos = dict(zip(group, positions.tolist()))
        shadow.advantage_multipliers(np.array([pos[u] for u in trained]))
        g = [pos[u] for u in trained] + [pos[u] for u in dropped for _ in acc[u]]
        a = [acc[k.rsplit("_", 2)[0]][int(k.rsplit("_", 2)[1])] for k in out["batch"].keys] + [
            x for u in dropped for x in acc[u]]
        shadow.after_advantage(np.array(g), np.array(a))
        decided_now = {u: decided[u] for u in group}
        for u in group:
            del decided[u]
        assert _state_equal(trainer.gdro.state_dict(), shadow.state_dict()), f"step {step}"
        probe = copy.deepcopy(shadow)  # bins_of commits bins: ask a copy, never the shadow itself
        moved += int(np.sum(probe.bins_of(np.array([decided_now[u][0] for u in group]))
                            != np.array([decided_now[u][1] for u in group])))

        m = out["metrics"]
        assert m["gdro/inflight_prompts"] == len(decided) == len(trainer.gdro_ledger)
        assert m["gdro/num_prompts"] == len(group)
        assert m["gdro/staleness/max"] == max(step - s for u in group for s in [decided_step(u, agent)])
        max_staleness = max(max_staleness, m["gdro/staleness/max"])
        assert all(np.isfinite(v) for k, v in m.items() if k.startswith("gdro/"))
    assert max_staleness >= 1, "no group was consumed after its dispatch step: staleness not exercised"
    assert moved > 0, "no bin changed between dispatch and consumption: dispatch-time decisions not exercised"
    reasons = {r for _u, r in drops}
    assert reasons == ({"filtered"} if policy == DAPO else {"stale"}), reasons


def decided_step(uid: str, agent: FakeAgentLoop) -> int:
    return next(c["step"] for c in agent.calls if uid in c["uid"])


def test_resume_with_in_flight_prompts_reproduces_decisions(tmp_path: Path, fake_tq: FakeTQ, det_uuid: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoint after step 2 with prompts in flight (warm-up prefetch): data.pt (controller +
    ledger) and TransferQueue's checkpoint (the store) restore a run that decides, consumes and
    updates exactly like the uninterrupted one."""
    import transfer_queue

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, agent_a = make_async(tmp_path / "a", fake_tq, "gdro_colocate_async", *DAPO)
    warm_up(a)
    for step in range(1, 3):
        async_step(a, fake_tq, step)
    assert len(a.gdro_ledger) > 0  # the checkpoint happens with decisions in flight
    data_pt = tmp_path / "data.pt"
    torch.save(a.train_dataloader.state_dict(), data_pt)  # PPOTrainer._save_checkpoint
    tq_ckpt = fake_tq.snapshot()  # tq.save_checkpoint (async modes)
    uid_counter = det_uuid["next"]
    det_uuid["next"], saved_counter = itertools.tee(uid_counter)
    metrics_a = [async_step(a, fake_tq, step)["metrics"] for step in range(3, 6)]

    for name, fn in (("kv_batch_get", tq_ckpt.get), ("kv_batch_put", tq_ckpt.put), ("kv_list", tq_ckpt.kv_list),
                     ("kv_clear", tq_ckpt.clear)):
        monkeypatch.setattr(transfer_queue, name, fn)
    det_uuid["next"] = saved_counter
    b, agent_b = make_async(tmp_path / "b", tq_ckpt, "gdro_colocate_async", *DAPO)
    b.train_dataloader.load_state_dict(torch.load(data_pt, weights_only=False))  # PPOTrainer._load_checkpoint
    b.global_steps = 3
    b._restored_tq_prompt_count = sum(1 for t in tq_ckpt.tags.values() if t.get("is_prompt"))
    b._add_async_warmup_batches(1)  # on_train_begin: the restored prompts already fill the window
    assert agent_b.calls == []
    metrics_b = [async_step(b, tq_ckpt, step)["metrics"] for step in range(3, 6)]

    def decisions(agent: FakeAgentLoop) -> list[tuple[int, list[int], list[int]]]:
        return [(c["step"], c["stable"], c["rollout_n"]) for c in agent.calls if c["step"] >= 3]

    assert decisions(agent_b) == decisions(agent_a)
    assert _state_equal(a.gdro.state_dict(), b.gdro.state_dict())
    # the in-flight decisions match too (verl's uid strings aside: building a trainer draws uuids)
    ledger_a, ledger_b = a.gdro_ledger.state_dict(), b.gdro_ledger.state_dict()
    ledger_a.pop("uids"), ledger_b.pop("uids")
    assert _state_equal(ledger_a, ledger_b)
    for ma, mb in zip(metrics_a, metrics_b):
        assert {k: v for k, v in ma.items() if k != "gdro/controller_time_s"} == {
            k: v for k, v in mb.items() if k != "gdro/controller_time_s"}


def test_gdro_disabled_async_is_plain_verl(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer, agent = make_async(tmp_path, fake_tq, "gdro_colocate_async", "gdro.enable=false")
    assert trainer.gdro is None and trainer.replay_buffer.gdro_observer is None
    warm_up(trainer)
    out = async_step(trainer, fake_tq, 1)
    assert not any(k.startswith("gdro/") for k in out["metrics"])
    assert all(n == 4 for c in agent.calls for n in c["rollout_n"])
