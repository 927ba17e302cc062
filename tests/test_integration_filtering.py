"""DAPO group filtering (``algorithm.filter_groups``) with the GDRO trainer and verl's real replay buffer.

The trainer is the real ``GDROTrainerSync`` (real ``__init__``, data loader and sampler), the replay
buffer is verl 0.9.1's own ``ReplayBuffer.sample`` loop (eviction of all-same groups, refills of
2k prompts through the trainer's ``_add_prompts_to_generate``, draining, surplus discard), and the
advantage stage is verl's, inside verl's own ``PPOTrainer.step`` with the GPU calls stubbed
(``integration_harness.verl_step``). Only TransferQueue is the in-memory store and the agent loop
writes trajectories synchronously (``integration_harness.FakeAgentLoop``).

What must hold (issue 12): every group the policy generated, filtered or not, is observed exactly
once; a filtered prompt's history is updated; every generation call meets its own exact budget;
a resumed run makes the same decisions and reaches the same state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from integration_harness import FakeAgentLoop, FakeTQ, make_trainer, stub_gpu_calls, verl_step
from test_integration_trainer import _state_equal

from verl_gdro.step.controller import GDROController

DAPO = ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc")
BATCH = 6


def make_dapo(tmp_path: Path, store: FakeTQ, *overrides: str) -> tuple[Any, FakeAgentLoop]:
    trainer = make_trainer(tmp_path, *DAPO, "gdro.rollout.enable=true", *overrides, num_rows=60)
    agent = FakeAgentLoop(store, trainer)
    trainer.agent_loop_manager = agent
    trainer.replay_buffer.poll_interval = 0.0
    stub_gpu_calls(trainer, store)
    return trainer, agent


def dapo_step(trainer: Any, store: FakeTQ, step: int) -> dict[str, Any]:
    """One step the way verl's fit() drives it: verl 0.9.1's own ``step()`` (prepare_step, verl's
    DAPO sample loop with refills, batch balancing, log-prob, advantage and actor stages, GPU calls
    stubbed), then the step's keys cleared."""
    batch, metrics = verl_step(trainer, store, step)
    return {"batch": batch, "metrics": metrics}


def _step_calls(agent: FakeAgentLoop, step: int) -> list[dict[str, Any]]:
    return [c for c in agent.calls if c["step"] == step]


def test_filtering_engages_with_gdro(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer, agent = make_dapo(tmp_path, fake_tq)
    assert type(trainer.replay_buffer).__name__ == "GDROReplayBuffer"
    assert trainer.replay_buffer.filter_groups_metric == "acc"
    assert trainer.config.data.gen_batch_size == 1  # verl's exact-refill granularity


def test_every_generated_group_is_observed_once(tmp_path: Path, fake_tq: FakeTQ) -> None:
    """A shadow controller fed every generated group (filtered, surplus and trained) in dispatch
    order reaches exactly the trainer's state; filtered prompts' histories gain their visit."""
    trainer, agent = make_dapo(tmp_path, fake_tq)
    shadow = GDROController(trainer.gdro_settings, rollout_n=4)
    filtered_seen = 0
    for step in range(1, 5):
        before = trainer.gdro.classifier.state_dict()
        out = dapo_step(trainer, fake_tq, step)
        calls = _step_calls(agent, step)
        # the shadow decides call by call, exactly as the trainer did before generation
        for call in calls:
            plan = shadow.decide(np.array(call["stable"]))
            assert plan.rollout_n.tolist() == call["rollout_n"], (step, call)
        uids = [u for c in calls for u in c["uid"]]
        stable = [s for c in calls for s in c["stable"]]
        ns = [n for c in calls for n in c["rollout_n"]]
        bins = shadow.classifier.bins(np.array(stable))
        acc = {u: a for c in calls for u, a in c["acc"].items()}
        positions = shadow.adopt(np.array(stable), bins, np.array(ns))
        pos = dict(zip(uids, positions.tolist()))
        trained = [k.rsplit("_", 2)[0] for k, t in zip(out["batch"].keys, out["batch"].tags)
                   if not t.get("is_padding")]
        shadow.advantage_multipliers(np.array([pos[u] for u in trained]))
        g = np.array([pos[u] for u in uids for _ in acc[u]])
        shadow.after_advantage(g, np.array([a for u in uids for a in acc[u]]))
        assert _state_equal(trainer.gdro.state_dict(), shadow.state_dict()), f"step {step}"
        assert len(trainer.gdro_ledger) == 0 and not fake_tq.tags  # sync: nothing left in flight

        # the flow metrics against the truth of the generation calls
        m = out["metrics"]
        filtered = [u for u in uids if len(set(acc[u])) == 1]
        filtered_seen += len(filtered)
        assert m["gdro/dispatch/calls"] == len(calls)
        assert m["gdro/dispatch/prompts"] == len(uids) and m["gdro/dispatch/rollouts"] == sum(ns)
        assert m["gdro/flow/generated_rollouts"] == sum(len(acc[u]) for u in uids) == sum(ns)
        assert m["gdro/flow/kept_rollouts"] == len(trained) == m["gdro/num_trajectories"] - (
            m["gdro/flow/generated_rollouts"] - m["gdro/flow/kept_rollouts"])
        assert m["gdro/flow/filtered_rollouts"] == sum(len(acc[u]) for u in filtered)
        # verl's own counts of the same groups, in the step's metrics (its replay buffer's)
        assert m["gdro/flow/dropped_groups/filtered"] == len(filtered) == m.get(
            "training/filter_groups/evicted_samples", 0)
        assert m["gdro/flow/dropped_groups/surplus"] == m.get(
            "training/filter_groups/discarded_surplus_samples", 0)
        assert m["gdro/num_prompts"] == len(uids)  # the controllers saw every generated group
        for b in range(trainer.gdro.num_bins):
            gen = sum(len(acc[u]) for u, bb in zip(uids, bins) if bb == b)
            filt = sum(len(acc[u]) for u, bb in zip(uids, bins) if bb == b and u in filtered)
            assert m[f"gdro/flow/filtered_share/bin_{b}"] == pytest.approx(filt / gen if gen else 0.0)
        assert all(np.isfinite(v) for k, v in m.items() if k.startswith("gdro/"))

        # each filtered prompt's history got this visit (all-correct or all-wrong)
        after = trainer.gdro.classifier.state_dict()
        visits_before = dict(zip(before["uids"].tolist(), before["visits"].tolist()))
        visits_after = dict(zip(after["uids"].tolist(), after["visits"].tolist()))
        for u in filtered:
            s = stable[uids.index(u)]
            draws = stable.count(s)  # a prompt drawn twice in a step is one pooled visit
            assert draws >= 1 and visits_after[s] == visits_before.get(s, 0) + 1, (step, s)
    assert filtered_seen > 0, "the test data never triggered DAPO filtering"


def test_budget_is_exact_per_generation_call(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer, agent = make_dapo(tmp_path, fake_tq)
    for step in range(1, 9):
        dapo_step(trainer, fake_tq, step)
    multi_call_steps = {c["step"] for c in agent.calls if c["step"] and len(_step_calls(agent, c["step"])) > 1}
    assert multi_call_steps, "DAPO never refilled: the per-call budget was not exercised"
    for call in agent.calls:
        # what verl's agent loop generated for this call == prompts * rollout.n exactly
        assert sum(call["rollout_n"]) == 4 * len(call["uid"]), call
        assert all(2 <= n <= 12 for n in call["rollout_n"])
        assert sum(len(a) for a in call["acc"].values()) == sum(call["rollout_n"])
    assert any(len(set(c["rollout_n"])) > 1 for c in agent.calls), "Rollout-GDRO never moved rollouts"


def _decisions(agent: FakeAgentLoop, steps: range) -> list[tuple[int, list[int], list[int]]]:
    return [(c["step"], c["stable"], c["rollout_n"]) for c in agent.calls if c["step"] in steps]


@pytest.mark.parametrize("extra", [(), ("gdro.prompt.mode=resample",)], ids=["reweight", "resample"])
def test_resume_reproduces_decisions_and_state(tmp_path: Path, fake_tq: FakeTQ, extra: tuple[str, ...]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, agent_a = make_dapo(tmp_path / "a", fake_tq, *extra)
    for step in range(1, 3):
        dapo_step(a, fake_tq, step)
    data_pt = tmp_path / "data.pt"
    torch.save(a.train_dataloader.state_dict(), data_pt)  # as PPOTrainer._save_checkpoint does
    metrics_a = [dapo_step(a, fake_tq, step)["metrics"] for step in range(3, 6)]

    b, agent_b = make_dapo(tmp_path / "b", fake_tq, *extra)
    b.train_dataloader.load_state_dict(torch.load(data_pt, weights_only=False))  # as _load_checkpoint does
    metrics_b = [dapo_step(b, fake_tq, step)["metrics"] for step in range(3, 6)]
    assert _decisions(agent_b, range(3, 6)) == _decisions(agent_a, range(3, 6))
    assert _state_equal(a.gdro.state_dict(), b.gdro.state_dict())
    # Which of the step's equally old surviving groups verl trains and which it discards as surplus
    # follows set order over random uuid4 strings (ReplayBuffer._select_prompt_uids): both are
    # observed either way, so decisions and state match; only the kept/discarded split and the
    # mean-one weights over the trained rows may differ.
    # verl's step() averages each metric weighted by the trained rows (MetricsAggregator), so a
    # different split may move a value by an ulp; verl's own metrics describe the trained rows.
    def stable_metrics(m: dict[str, Any]) -> dict[str, Any]:
        arbitrary = ("gdro/controller_time_s", "gdro/flow/kept_rollouts", "gdro/flow/discarded_rollouts",
                     "gdro/mu_weight", "gdro/lead_lag", "gdro/weight_entropy")
        return {k: v for k, v in m.items() if k.startswith("gdro/") and k not in arbitrary
                and not k.startswith("gdro/prompt_weight")}

    for ma, mb in zip(metrics_a, metrics_b):
        assert stable_metrics(ma) == pytest.approx(stable_metrics(mb), rel=1e-12, abs=1e-15)


def test_paper_preset_leaves_removed_groups_unmeasured(tmp_path: Path, fake_tq: FakeTQ) -> None:
    """surrogate_kl reads log-probs of trained rows only; removed groups reach no log-prob stage and
    enter zero-masked, so they carry no measured loss: NaN, dropped and counted (section 2), never a
    loss of exactly 0. The classifier still observes them and every metric stays finite."""
    trainer, agent = make_dapo(tmp_path, fake_tq, "gdro.preset=paper", "actor_rollout_ref.actor.use_kl_loss=true")
    removed_total = 0
    for step in range(1, 3):
        m = dapo_step(trainer, fake_tq, step)["metrics"]
        assert m["gdro/num_prompts"] == sum(len(c["uid"]) for c in _step_calls(agent, step))
        removed = sum(v for k, v in m.items() if k.startswith("gdro/flow/dropped_groups/"))
        assert m["gdro/dropped_nonfinite"] == removed
        removed_total += removed
        assert all(np.isfinite(v) for k, v in m.items() if k.startswith("gdro/"))
    assert removed_total > 0  # the test exercises removed groups
