"""The async GDRO trainers (``gdro_colocate_async``, ``gdro_separate_async``) on verl's async machinery.

Built by their real ``__init__`` through verl's trainer registry (so verl's own async switches
apply: ``ReplayBufferAsync``, ``gen_batch_size=1``, warm-up batches), with verl's real
``ReplayBufferAsync.sample`` (DAPO, stale and failed evictions with exact-k refills). TransferQueue
is the in-memory store; the agent loop writes trajectories synchronously; each step is verl's own
``PPOTrainer.step`` with the GPU calls stubbed (``integration_harness.verl_step``). No Ray, no GPU: what a
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
from integration_harness import FakeAgentLoop, FakeTQ, make_trainer, stub_gpu_calls, verl_step
from test_integration_trainer import _state_equal
from transfer_queue import KVBatchMeta

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
    stub_gpu_calls(trainer, store)
    return trainer, agent


def warm_up(trainer: Any) -> None:
    """What fit() does before step 1: global_steps = 1, then on_train_begin's warm-up batches."""
    trainer.global_steps = 1
    trainer._add_async_warmup_batches(1)


def async_step(trainer: Any, store: FakeTQ, step: int) -> dict[str, Any]:
    """One step as verl's fit() runs it after the warm-up (``warm_up``): verl 0.9.1's own
    ``step()`` (the step's batch, verl's async buffer: oldest groups first, evict and refill; batch
    balancing, log-prob, advantage and actor stages, GPU calls stubbed), then the consumed keys
    cleared. ``batch``: the trained rows, verl's padding rows (``_balance_batch``) aside."""
    batch, metrics = verl_step(trainer, store, step, begin=False)
    real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
    trained = KVBatchMeta(keys=[batch.keys[i] for i in real], tags=[batch.tags[i] for i in real],
                          partition_id=batch.partition_id)
    return {"batch": trained, "metrics": metrics}


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
    # verl runs its own mode; the config it logs names the GDRO mode that runs
    assert trainer.trainer_mode == base and trainer.config.trainer.v1.trainer_mode == mode
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


@pytest.mark.parametrize("mode", list(MODES))
def test_resume_with_in_flight_prompts_reproduces_decisions(tmp_path: Path, fake_tq: FakeTQ, det_uuid: Any,
                                                            monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Checkpoint after step 2 with prompts in flight (warm-up prefetch): data.pt (controller +
    ledger) and TransferQueue's checkpoint (the store) restore a run that decides, consumes and
    updates exactly like the uninterrupted one."""
    import transfer_queue

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, agent_a = make_async(tmp_path / "a", fake_tq, mode, *DAPO)
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
    b, agent_b = make_async(tmp_path / "b", tq_ckpt, mode, *DAPO)
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


@pytest.mark.parametrize("mode", list(MODES))
def test_gdro_disabled_async_is_plain_verl(tmp_path: Path, fake_tq: FakeTQ, mode: str) -> None:
    trainer, agent = make_async(tmp_path, fake_tq, mode, "gdro.enable=false")
    assert trainer.gdro is None
    assert type(trainer.replay_buffer).__name__ == "ReplayBufferAsync"  # verl's own buffer, untouched
    warm_up(trainer)
    out = async_step(trainer, fake_tq, 1)
    assert not any(k.startswith("gdro/") for k in out["metrics"])
    assert all(n == 4 for c in agent.calls for n in c["rollout_n"])


# ---------------------------------------------------------------------------------------------
# gdro_separate_async: the rest of the trainer's path in its own mode (issue 23). No checkpoint
# engine of verl 0.9.1 that this mode accepts runs on a CPU (docs/e2e.md), so these unit tests,
# with the ones parametrized over MODES above, are what runs its every line.
# ---------------------------------------------------------------------------------------------

SEPARATE = "gdro_separate_async"


def test_separate_async_paper_preset_appends_removed_groups_zero_masked(
    tmp_path: Path, fake_tq: FakeTQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preset paper (surrogate_kl): the token fields are read after verl's estimator, and the rows
    of groups the async buffer removed untrained (DAPO) are appended with a zero mask."""
    trainer, _agent = make_async(tmp_path, fake_tq, SEPARATE, "gdro.preset=paper",
                                 "actor_rollout_ref.actor.use_kl_loss=true", *DAPO, num_rows=12)
    drops = record_drops(trainer)
    seen: list[tuple[int, dict[str, np.ndarray]]] = []
    real = trainer.gdro.after_advantage

    def spy(group_index: np.ndarray, acc: np.ndarray, **fields: Any) -> dict[str, float]:
        seen.append((group_index.size, {k: v for k, v in fields.items() if isinstance(v, np.ndarray)}))
        return real(group_index, acc, **fields)

    monkeypatch.setattr(trainer.gdro, "after_advantage", spy)
    warm_up(trainer)
    with_removed = 0
    for step in range(1, 6):
        before = len(drops)
        out = async_step(trainer, fake_tq, step)
        trained = len(out["batch"].keys)
        rows, tokens = seen[-1]
        assert set(tokens) == {"response_mask", "old_log_probs", "advantages", "ref_log_probs"}
        assert all(v.shape[0] == rows for v in tokens.values())
        assert tokens["response_mask"][:trained].sum() > 0
        if len(drops) > before:
            with_removed += 1
            assert rows > trained  # the removed groups' rows ride along...
        assert tokens["response_mask"][trained:].sum() == 0  # ...with a zero mask
        assert all(np.isfinite(v) for k, v in out["metrics"].items() if k.startswith("gdro/"))
    assert with_removed > 0, "no update observed a removed group: the padding path was not exercised"


def test_separate_async_removed_groups_without_correctness_are_lost_once(
    tmp_path: Path, fake_tq: FakeTQ, caplog: pytest.LogCaptureFixture
) -> None:
    """A removed group whose reward has no acc yet (a colocated reward model scores after
    sampling) cannot be observed: it is counted lost, with one warning; a removed group this
    trainer never dispatched is reported and left alone."""
    import logging

    trainer, agent = make_async(tmp_path, fake_tq, SEPARATE)
    warm_up(trainer)
    uid, other = agent.calls[0]["uid"][:2]
    keys = {u: sorted(k for (part, k) in fake_tq.rows if part == "train" and k.startswith(f"{u}_"))
            for u in (uid, other)}
    for k in keys[uid] + keys[other]:
        fake_tq.rows[("train", k)]["extra_fields"] = {"reward_extra_info": {"score": -1.0}}
    import transfer_queue

    def strict_get(keys: list[str], partition_id: str, select_fields: list[str] | None = None) -> Any:
        if select_fields == ["acc"]:  # the real TransferQueue raises for a field no key has
            raise KeyError("acc")
        return fake_tq.get(keys, partition_id, select_fields)

    with caplog.at_level(logging.WARNING, logger="verl_gdro.integration.trainer"):
        trainer._gdro_observe_removed("train", {uid: keys[uid], "not-ours": ["not-ours_0_0"]},
                                      {uid: "stale", "not-ours": "stale"})
        with pytest.MonkeyPatch.context() as m:
            m.setattr(transfer_queue, "kv_batch_get", strict_get)
            trainer._gdro_observe_removed("train", {other: keys[other]}, {other: "failed"})
    assert "1 removed group(s) were not dispatched by this run's GDRO trainer" in caplog.text
    assert caplog.text.count("removed groups without correctness are not observed") == 1
    assert uid not in trainer.gdro_ledger.entries and other not in trainer.gdro_ledger.entries
    assert trainer.gdro_ledger.lost == 2 and not trainer.gdro_ledger.dropped


def test_separate_async_reads_acc_from_a_top_level_reward_field(tmp_path: Path, fake_tq: FakeTQ,
                                                                det_uuid: Any) -> None:
    """With acc outside ``extra_fields`` (a colocated reward model writes it as its own field) the
    trainer reads it from TransferQueue and the controllers end where the usual layout leaves them."""
    states = []
    for layout in ("extra_fields", "top_level"):
        det_uuid["next"] = itertools.count(1)  # the same verl uids in both runs (verl orders by them)
        fake_tq.rows.clear()
        fake_tq.tags.clear()
        (tmp_path / layout).mkdir()
        trainer, agent = make_async(tmp_path / layout, fake_tq, SEPARATE)
        if layout == "top_level":
            generate = agent.generate_sequences

            def moved(batch: Any, generate: Any = generate) -> None:
                generate(batch)
                for row in fake_tq.rows.values():
                    info = row.get("extra_fields", {}).get("reward_extra_info", {})
                    if "acc" in info:
                        row["acc"] = info.pop("acc")

            agent.generate_sequences = moved
        warm_up(trainer)
        for step in range(1, 4):
            async_step(trainer, fake_tq, step)
        states.append(trainer.gdro.state_dict())
    assert _state_equal(states[0], states[1])


def test_separate_async_refuses_a_broken_step(tmp_path: Path, fake_tq: FakeTQ,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt batch without the id column, an allocation off the exact budget, and trajectories
    carrying another prompt's stable id stop the step with an error naming the cause."""
    trainer, _agent = make_async(tmp_path, fake_tq, SEPARATE)
    warm_up(trainer)
    trainer.global_steps = 1
    with monkeypatch.context() as m:
        m.setattr(trainer, "_gdro_uid_field", "no_such_column")
        with pytest.raises(ValueError, match="the prompt batch has no 'no_such_column' column"):
            trainer._add_batch_to_generate()
    with monkeypatch.context() as m:
        decide = trainer.gdro.decide

        def over_budget(uids: Any) -> Any:
            plan = decide(uids)
            plan.rollout_n[0] += 1
            return plan

        m.setattr(trainer.gdro, "decide", over_budget)
        with pytest.raises(RuntimeError, match="not the exact budget"):
            trainer._add_batch_to_generate()
    batch, _rb = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
    row = fake_tq.rows[("train", batch.keys[0])]
    row[trainer._gdro_uid_field] = int(row[trainer._gdro_uid_field]) + 1
    with pytest.raises(RuntimeError, match="other stable prompt ids than their planned prompts"):
        trainer._compute_advantage(batch, {})


def test_separate_async_data_loader_modes(tmp_path: Path, fake_tq: FakeTQ) -> None:
    """Prompt-GDRO's resample mode draws through the GDRO sampler in this mode too; loader worker
    processes are refused (their draws would run batches ahead of the controller updates)."""
    (tmp_path / "resample").mkdir()
    trainer, agent = make_async(tmp_path / "resample", fake_tq, SEPARATE, "gdro.prompt.mode=resample")
    assert trainer.gdro_sampler is not None and trainer.gdro_sampler.mode == "resample"
    warm_up(trainer)
    async_step(trainer, fake_tq, 1)
    assert all(sum(c["rollout_n"]) == 4 * len(c["uid"]) for c in agent.calls)
    (tmp_path / "workers").mkdir()
    with pytest.raises(ValueError, match="data.dataloader_num_workers=2 is invalid"):
        make_async(tmp_path / "workers", fake_tq, SEPARATE, "data.dataloader_num_workers=2")


def test_a_custom_replay_buffer_is_refused() -> None:
    """verl's trainer.v1.sampler.custom_sampler replaces the buffer: the GDRO trainer could not
    observe the groups it removes, so it refuses at init rather than losing them silently."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    from verl_gdro.integration.replay_buffer import with_observer

    class CustomBuffer(ReplayBufferAsync):
        pass

    with pytest.raises(TypeError, match="CustomBuffer is not verl's built-in one"):
        with_observer(CustomBuffer.__new__(CustomBuffer), None)
