"""The GDRO trainer's semantics in every verl trainer mode, driven through verl 0.9.1's own ``step()``
(issue 36, items 5, 6, 11 and 12).

Each trainer is built by its real ``__init__`` through verl's registry; each step is verl's own
``PPOTrainer.step`` (``prepare_step``, the replay buffer's sample loop with its refills and evictions,
the old/ref log-prob stages, the advantage stage, the actor update) with only the GPU calls stubbed
(``integration_harness.stub_gpu_calls``). Groups are still pending when a step samples (the async
prefetch, DAPO's and the failed-group refills) and when a checkpoint is taken.

- item 6: in ``reweight`` mode (verl's epoch order, the ``paper`` and ``release`` presets) a
  generation call never holds a prompt twice and never dispatches a prompt that is in flight or was
  dispatched since the last update, also where a call crosses an epoch boundary;
- item 12: a resume without TransferQueue's checkpoint (as ``gdro_sync``, or the folder absent)
  keeps only the ledger entries verl still holds;
- item 11: rollout skip is refused at start; ``gdro.enable=false`` keeps verl's own buffer, a
  custom sampler included;
- item 5: ``gdro/call_mean_n`` (the budget of the step's generation calls) equals ``rollout.n`` in
  every mode, apart from ``gdro/mean_n`` (the mean over the groups the update observes).
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from integration_harness import FakeAgentLoop, FakeTQ, make_trainer, stub_gpu_calls, verl_step
from test_integration_draws import COLOCATE, DAPO, SEPARATE, FailingAgentLoop

from verl_gdro.integration.ledger import DispatchLedger, ResumedLedger

N = 4
#: mode -> (overrides, share of groups whose every rollout fails)
MODES: dict[str, tuple[tuple[str, ...], float]] = {
    "sync": ((), 0.0),
    "sync_dapo": (DAPO, 0.0),
    "sync_refill_failed": (("trainer.v1.sampler.sync_refill_failed_groups=true",), 0.25),
    "colocate_async": (COLOCATE, 0.2),
    "colocate_async_dapo": (COLOCATE + DAPO, 0.0),
    "separate_async": (SEPARATE, 0.2),
}
#: the paper preset: Prompt-GDRO reweights (verl's epoch order draws), the per-bin bandit allocates
PAPER = ("gdro.preset=paper", "gdro.rollout.enable=true", "actor_rollout_ref.actor.use_kl_loss=true")


def make_run(tmp_path: Path, store: FakeTQ, mode: str, *extra: str, rows: int = 20,
             rate: float | None = None, pending: int = 2) -> tuple[Any, FailingAgentLoop, list]:
    """A trainer of ``mode`` with its GPU calls stubbed; ``events`` records, in order, every
    generation call, every group the replay buffer removes untrained, and every update. The first
    ``pending`` groups of every call are still generating when the step samples
    (``FakeAgentLoop.hold_pending``)."""
    overrides, mode_rate = MODES[mode]
    trainer = make_trainer(tmp_path, *overrides, *extra, num_rows=rows)
    events: list = []
    agent = FailingAgentLoop(store, trainer, mode_rate if rate is None else rate, events)
    agent.hold_pending(pending)
    trainer.agent_loop_manager = agent
    trainer.replay_buffer.poll_interval = 0.0
    if trainer.gdro is not None:
        inner = trainer.replay_buffer.gdro_observer

        def observer(partition_id: str, keys: dict[str, list[str]], reasons: dict[str, str]) -> None:
            events.extend(("drop", u) for u in sorted(keys))
            inner(partition_id, keys, reasons)

        trainer.replay_buffer.gdro_observer = observer
    stub_gpu_calls(trainer, store)
    return trainer, agent, events


def step(trainer: Any, store: FakeTQ, number: int, events: list) -> dict[str, Any]:
    batch, metrics = verl_step(trainer, store, number)
    events.append(("update", list(dict.fromkeys(k.rsplit("_", 2)[0] for k in batch.keys))))
    return metrics


def prompts_in_flight(store: FakeTQ) -> set[str]:
    """verl uids of the prompt groups verl holds (dispatched, not yet trained or removed)."""
    return {k for (part, k), tag in store.tags.items() if part == "train" and tag.get("is_prompt")}


def held_violations(agent: FailingAgentLoop, events: list) -> list[tuple[int, int, str]]:
    """Replay the recorded run: every prompt a generation call dispatched that the call held twice,
    that was in flight, or that was dispatched since the last update. (step, stable id, why)."""
    stable_of: dict[str, int] = {}
    in_flight: set[str] = set()
    since_update: set[int] = set()
    bad = []
    for kind, *rest in events:
        if kind == "call":
            call = agent.calls[rest[0]]
            flying = {stable_of[u] for u in in_flight}
            seen: set[int] = set()
            for uid, sid in zip(call["uid"], call["stable"]):
                why = ("twice in the call" if sid in seen else "in flight" if sid in flying
                       else "dispatched since the last update" if sid in since_update else None)
                if why:
                    bad.append((call["step"], sid, why))
                seen.add(sid)
                stable_of[uid] = sid
                in_flight.add(uid)
            since_update |= seen
        elif kind == "drop":
            in_flight.discard(rest[0])
        else:
            in_flight -= set(rest[0])
            since_update.clear()
    return bad


# ------------------------------------------------------------------------------------------------
# item 6: distinct, not-in-flight draws in reweight mode, across epoch boundaries
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_reweight_calls_hold_distinct_prompts_none_in_flight_across_epochs(tmp_path: Path, fake_tq: FakeTQ,
                                                                          mode: str) -> None:
    """The paper preset (reweight: the sampler keeps verl's epoch order) on a 20- or 40-prompt set, so that
    generation calls cross epoch boundaries while prompts are in flight (async prefetch) or were
    dispatched earlier in the step (DAPO and failed-group refills of gen_batch_size=1)."""
    # DAPO's refills hold many prompts between two updates: a larger set keeps a free one to draw
    # (the sampler draws a held prompt only when the rest of the epoch is all held)
    rows = 40 if mode.endswith("dapo") else 20
    trainer, agent, events = make_run(tmp_path, fake_tq, mode, *PAPER, rows=rows)
    assert trainer.gdro_sampler.mode == "shuffle"
    for number in range(1, 13):
        step(trainer, fake_tq, number, events)
    assert trainer.gdro_sampler.epoch >= 3, "no epoch boundary crossed"
    assert held_violations(agent, events) == []
    if trainer.config.data.gen_batch_size == 1:  # every draw dispatched (no partial batch dropped)
        # each epoch still hands out every prompt once (the deferrals only reorder it)
        drawn = [s for c in agent.calls for s in c["stable"]]
        for start in range(0, len(drawn) - rows + 1, rows):
            assert len(set(drawn[start:start + rows])) == rows, start


@pytest.fixture
def det_uuid(monkeypatch: pytest.MonkeyPatch) -> Any:
    """verl's per-dispatch uids (uuid4) made deterministic, so two runs see the same strings."""
    counter = {"next": itertools.count(1)}
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(counter["next"])))
    return counter


def _patch_tq(monkeypatch: pytest.MonkeyPatch, store: FakeTQ) -> None:
    import transfer_queue

    for name, fn in (("kv_batch_get", store.get), ("kv_batch_put", store.put), ("kv_list", store.kv_list),
                     ("kv_clear", store.clear)):
        monkeypatch.setattr(transfer_queue, name, fn)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync_dapo", "colocate_async", "separate_async"])
def test_a_resume_with_deferred_prompts_continues_the_same_stream(tmp_path: Path, fake_tq: FakeTQ, det_uuid: Any,
                                                                   monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The epoch's deferrals ride in data.pt: a run checkpointed after an epoch boundary (groups in
    flight, TransferQueue's checkpoint restored) dispatches what the uninterrupted run dispatches."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # nothing generating at the checkpoint here: verl would re-issue it (a new generation, other
    # outcomes); test_groups_pending_at_a_checkpoint_are_reissued_and_observed_once covers that
    a, agent_a, events_a = make_run(tmp_path / "a", fake_tq, mode, *PAPER, rate=0.0, pending=0)
    for number in range(1, 5):
        step(a, fake_tq, number, events_a)
    assert a.gdro_sampler._swaps, "no prompt deferred before the checkpoint: the state's deferrals were not exercised"
    state = a.train_dataloader.state_dict()
    data_pt = tmp_path / "data.pt"
    torch.save(state, data_pt)  # PPOTrainer._save_checkpoint
    tq_ckpt = fake_tq.snapshot()  # tq.save_checkpoint
    det_uuid["next"], saved = itertools.tee(det_uuid["next"])
    metrics_a = [step(a, fake_tq, number, events_a) for number in range(5, 10)]

    _patch_tq(monkeypatch, tq_ckpt)
    b, agent_b, events_b = make_run(tmp_path / "b", tq_ckpt, mode, *PAPER, rate=0.0, pending=0)
    det_uuid["next"] = saved
    b.train_dataloader.load_state_dict(torch.load(data_pt, weights_only=False))  # PPOTrainer._load_checkpoint
    b._restored_tq_prompt_count = sum(1 for t in tq_ckpt.tags.values() if t.get("is_prompt"))
    b.global_steps = 5
    if b.trainer_mode != "sync":
        b.on_train_begin()  # the restored prompts fill the prefetch window: nothing added
    metrics_b = []
    for number in range(5, 10):
        b.global_steps = number
        b.timing_raw = {}
        b.on_step_begin()
        metrics: dict[str, Any] = {}
        batch = b.step(metrics, b.timing_raw)
        tq_ckpt.clear(batch.keys, "train")
        metrics_b.append(metrics)

    def stream(agent: FailingAgentLoop) -> list[tuple[int, list[int], list[int]]]:
        return [(c["step"], c["stable"], c["rollout_n"]) for c in agent.calls if c["step"] >= 5]

    assert stream(agent_b) == stream(agent_a)
    assert a.gdro_sampler.state_dict()["swaps"] == b.gdro_sampler.state_dict()["swaps"]
    for ma, mb in zip(metrics_a, metrics_b):
        keys = [k for k in ma if k.startswith("gdro/") and k != "gdro/controller_time_s"]
        assert {k: ma[k] for k in keys} == {k: mb[k] for k in keys}


def test_deferral_keeps_the_epoch_and_skips_held_prompts() -> None:
    """The sampler alone: a call announced with held prompts at an epoch boundary defers them to the
    first later free position of the epoch; the epoch still holds every prompt once."""
    from verl_gdro.integration.sampler import GDROSampler
    from verl_gdro.step.config import resolve_gdro
    from verl_gdro.step.controller import GDROController

    ctrl = GDROController(resolve_gdro({"prompt": {"mode": "reweight"}, "rollout": {"enable": False}}), rollout_n=4)
    uids = np.arange(100, 110)
    plain = GDROSampler(uids, ctrl, mode="shuffle", seed=1)
    order = list(iter(plain))[:10]  # epoch 1 as verl's loader sees it
    sampler = GDROSampler(uids, ctrl, mode="shuffle", seed=1)
    draws = iter(sampler)
    held = [int(uids[order[0]]), int(uids[order[1]])]
    sampler.begin_call(3, lambda: held)
    first = [next(draws) for _ in range(3)]
    assert not {order[0], order[1]} & set(first) and len(set(first)) == 3
    sampler.begin_call(7)
    rest = [next(draws) for _ in range(7)]
    assert sorted(first + rest) == list(range(10))
    restored = GDROSampler(uids, ctrl, mode="shuffle", seed=1)
    restored.load_state_dict(sampler.state_dict())
    assert restored._perm.tolist() == sampler._perm.tolist()


# ------------------------------------------------------------------------------------------------
# item 12: a resume without TransferQueue's state
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("resume_as", ["gdro_sync", "colocate_async_without_tq"])
def test_resume_without_the_transfer_queue_keeps_only_groups_in_flight(
    tmp_path: Path, fake_tq: FakeTQ, monkeypatch: pytest.MonkeyPatch, resume_as: str
) -> None:
    """An async checkpoint holds the warm-up prefetch's decisions. Resumed as gdro_sync, or with
    the transfer_queue folder absent, verl restores none of those groups: the ledger forgets them
    at the first fetch, so they are neither excluded from the draws nor counted in flight."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _agent_a, events_a = make_run(tmp_path / "a", fake_tq, "colocate_async", "gdro.rollout.enable=true", rate=0.0)
    for number in range(1, 3):
        step(a, fake_tq, number, events_a)
    orphans = set(a.gdro_ledger.entries)
    assert orphans, "the checkpoint holds no group in flight"
    data_pt = tmp_path / "data.pt"
    torch.save(a.train_dataloader.state_dict(), data_pt)

    fresh = FakeTQ()  # the TransferQueue of the new run: verl restores nothing into it
    _patch_tq(monkeypatch, fresh)
    mode = "sync" if resume_as == "gdro_sync" else "colocate_async"
    b, agent_b, events_b = make_run(tmp_path / "b", fresh, mode, "gdro.rollout.enable=true", rate=0.0)
    b.train_dataloader.load_state_dict(torch.load(data_pt, weights_only=False))
    orphan_prompts = {d.stable_uid for d in a.gdro_ledger.entries.values()}
    for number in range(3, 9):
        metrics = step(b, fresh, number, events_b)
        ledger = set(b.gdro_ledger.entries)
        assert not ledger & orphans, number
        assert ledger <= prompts_in_flight(fresh), number
        assert metrics["gdro/inflight_prompts"] == len(ledger)
        if mode == "sync":
            assert metrics["gdro/inflight_prompts"] == 0
    assert set(b.gdro_sampler.companions["ledger"].forgotten) == orphans
    # the forgotten prompts are drawable again
    drawn = {s for c in agent_b.calls for s in c["stable"]}
    assert drawn & orphan_prompts


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_groups_pending_at_a_checkpoint_are_reissued_and_observed_once(
    tmp_path: Path, fake_tq: FakeTQ, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A checkpoint taken while groups are still generating: verl's own ``_reissue_inflight_prompts``
    re-issues them from TransferQueue's checkpoint with their persisted ``__rollout_n__``; the
    resumed ledger keeps their dispatch-time decisions, and each is observed exactly once."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _agent_a, events_a = make_run(tmp_path / "a", fake_tq, mode, "gdro.rollout.enable=true", rate=0.0)
    for number in range(1, 4):
        step(a, fake_tq, number, events_a)
    running = {k for (part, k), tag in fake_tq.tags.items() if part == "train" and tag.get("status") == "running"}
    assert running, "no group was generating at the checkpoint"
    decided = {u: a.gdro_ledger.entries[u] for u in running}
    data_pt = tmp_path / "data.pt"
    torch.save(a.train_dataloader.state_dict(), data_pt)
    tq_ckpt = fake_tq.snapshot()

    _patch_tq(monkeypatch, tq_ckpt)
    b, agent_b, events_b = make_run(tmp_path / "b", tq_ckpt, mode, "gdro.rollout.enable=true", rate=0.0)
    b.train_dataloader.load_state_dict(torch.load(data_pt, weights_only=False))  # PPOTrainer._load_checkpoint
    b._restored_tq_prompt_count = sum(1 for t in tq_ckpt.tags.values() if t.get("is_prompt"))
    b.global_steps = 4
    assert b._reissue_inflight_prompts() == len(running)  # fit(), before on_train_begin
    reissued = agent_b.calls[0]
    assert set(reissued["uid"]) == running
    # the re-issued prompts carry their dispatch-time rollout counts
    assert {u: n for u, n in zip(reissued["uid"], reissued["rollout_n"])} == {u: d.rollout_n for u, d in decided.items()}
    b.on_train_begin()  # the restored prompts fill the prefetch window: no warm-up call
    assert len(agent_b.calls) == 1
    observed: list[str] = []
    for number in range(4, 9):
        before = len(events_b)
        metrics = step(b, tq_ckpt, number, events_b)
        observed += [u for u in events_b[-1][1] if not u.startswith("pad")]
        observed += [rest[0] for kind, *rest in events_b[before:] if kind == "drop"]
        assert set(b.gdro_ledger.entries) <= prompts_in_flight(tq_ckpt), number
        assert metrics["gdro/inflight_prompts"] == len(b.gdro_ledger)
    assert all(observed.count(u) == 1 for u in running), [observed.count(u) for u in running]
    assert len(observed) == len(set(observed))


def test_reconcile_forgets_what_is_not_in_flight_and_keeps_due_observations() -> None:
    ledger = DispatchLedger()
    ledger.dispatch(["a", "b", "c"], np.array([1, 2, 3]), np.array([0, 1, 2]), np.array([4, 4, 4]), step=1)
    assert ledger.drop("b", [1.0, 0.0], "filtered")
    loaded = DispatchLedger()
    resumed = ResumedLedger(loaded, in_flight=lambda: ["c"])
    resumed.load_state_dict(ledger.state_dict())
    assert resumed.forgotten == ["a"]
    assert set(loaded.entries) == {"b", "c"} and "b" in loaded.dropped  # b's observation is still due
    assert sorted(loaded.held_stable_uids().tolist()) == [2, 3]


# ------------------------------------------------------------------------------------------------
# item 11: rollout skip refused; GDRO off is verl as it is
# ------------------------------------------------------------------------------------------------

SKIP = "skip.rollout_tq.enable=true"
SKIP_ERROR = "skip.rollout_tq.enable=True is invalid with trainer.v1.trainer_mode=gdro_sync"


def test_rollout_skip_is_refused_at_init_and_by_the_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from test_dryrun_paths import BASE, GDRO_TRAINER

    from verl_gdro.dryrun import dry_run

    with pytest.raises(ValueError, match=SKIP_ERROR):
        make_trainer(tmp_path, SKIP)
    data = tmp_path / "train.parquet"
    argv = GDRO_TRAINER[:2] + [f"data.train_files={data}", f"data.val_files={data}", *BASE, SKIP]
    assert dry_run(argv, print_config=False) == 2
    err = capsys.readouterr().err
    assert err.startswith("DRY RUN FAILED: " + SKIP_ERROR) and err.count("\n") == 1, err
    assert dry_run([*argv, "gdro.enable=false"], print_config=False) == 0, capsys.readouterr().err


@pytest.mark.slow
def test_gdro_off_keeps_a_custom_sampler(tmp_path: Path, fake_tq: FakeTQ) -> None:
    """verl's trainer.v1.sampler.custom_sampler with gdro.enable=false: the buffer is the user's,
    untouched, and verl's step runs with it (GDRO on refuses it at start instead)."""
    module = tmp_path / "my_buffer.py"
    module.write_text(
        "from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer\n\n\n"
        "class MyBuffer(ReplayBuffer):\n    samples = 0\n\n"
        "    def sample(self, *args, **kwargs):\n        MyBuffer.samples += 1\n"
        "        return super().sample(*args, **kwargs)\n"
    )
    custom = (f"+trainer.v1.sampler.custom_sampler.path={module}", "+trainer.v1.sampler.custom_sampler.name=MyBuffer")
    with pytest.raises(ValueError, match=r"trainer.v1.sampler.custom_sampler.path=.* is invalid"):
        make_trainer(tmp_path, *custom)
    trainer = make_trainer(tmp_path, *custom, "gdro.enable=false")
    assert type(trainer.replay_buffer).__name__ == "MyBuffer" and trainer.gdro is None
    assert not hasattr(trainer.replay_buffer, "gdro_observer")
    trainer.agent_loop_manager = agent = FakeAgentLoop(fake_tq, trainer)
    stub_gpu_calls(trainer, fake_tq)
    for number in range(1, 3):
        _batch, metrics = verl_step(trainer, fake_tq, number)
        assert not any(k.startswith("gdro/") for k in metrics)
    assert type(trainer.replay_buffer).samples == 2
    assert all(n == N for c in agent.calls for n in c["rollout_n"])


# ------------------------------------------------------------------------------------------------
# item 5: the budget of the step's calls apart from the consumed mean
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_call_mean_n_is_the_budget_and_mean_n_the_observed_groups(tmp_path: Path, fake_tq: FakeTQ,
                                                                   mode: str) -> None:
    """Rollout-GDRO on: every generation call meets the exact budget, so gdro/call_mean_n equals
    rollout.n at every step; gdro/mean_n is the mean n over the groups the update observes, which
    differs where an update's groups are not whole calls (async partial consumption, DAPO's and the
    failed-group refills)."""
    trainer, agent, events = make_run(tmp_path, fake_tq, mode, "gdro.rollout.enable=true", rows=40)
    differs = 0
    for number in range(1, 9):
        before = len(events)
        metrics = step(trainer, fake_tq, number, events)
        assert metrics["gdro/call_mean_n"] == N, number
        assert metrics["gdro/call_mean_n"] == metrics["gdro/dispatch/rollouts"] / metrics["gdro/dispatch/prompts"]
        # the groups the update observed: the consumed ones and those removed with trajectories
        n_of = {u: n for c in agent.calls for u, n in zip(c["uid"], c["rollout_n"])}
        acc = {u: a for c in agent.calls for u, a in c["acc"].items()}
        removed = [rest[0] for kind, *rest in events[before:] if kind == "drop" and acc[rest[0]]]
        observed = [u for u in events[-1][1] if u in n_of] + removed  # verl's padding rows aside
        assert metrics["gdro/mean_n"] == pytest.approx(np.mean([n_of[u] for u in observed])), number
        differs += metrics["gdro/mean_n"] != N
    if mode == "sync":
        assert differs == 0  # the update's groups are the step's one call
    elif mode != "sync_dapo":
        assert differs > 0, "every update observed whole calls: the partial case was not exercised"
