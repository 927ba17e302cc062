"""GDROSampler: epoch semantics, resampling with q_t, and the checkpoint round trip through
``StatefulDataLoader.state_dict()`` / ``load_state_dict()`` (what verl writes to ``data.pt``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from integration_harness import FakeTQ, agent_loop_rollout_n, make_trainer, run_step
from torchdata.stateful_dataloader import StatefulDataLoader

from verl_gdro.integration.sampler import GDROSampler
from verl_gdro.step.config import resolve_gdro
from verl_gdro.step.controller import GDROController


def loader(sampler: GDROSampler, batch_size: int = 4) -> StatefulDataLoader:
    return StatefulDataLoader(list(range(len(sampler))), batch_size=batch_size, sampler=sampler, num_workers=0,
                              drop_last=True, collate_fn=lambda xs: list(xs))


def controller(**prompt: Any) -> GDROController:
    return GDROController(resolve_gdro({"prompt": prompt}), rollout_n=4)


@pytest.mark.parametrize("mode", ["shuffle", "sequential"])
def test_every_prompt_once_per_epoch(mode: str) -> None:
    sampler = GDROSampler(np.arange(100, 120), controller(), mode=mode, seed=1)
    dl = loader(sampler)
    for _ in range(2):
        seen = [i for batch in dl for i in batch]
        assert sorted(seen) == list(range(20))
        if mode == "sequential":
            assert seen == list(range(20))
    assert sampler.epoch == 2


def test_shuffle_is_seeded() -> None:
    a = [i for b in loader(GDROSampler(np.arange(20), controller(), seed=5)) for i in b]
    b = [i for b in loader(GDROSampler(np.arange(20), controller(), seed=5)) for i in b]
    c = [i for b in loader(GDROSampler(np.arange(20), controller(), seed=6)) for i in b]
    assert a == b and a != c


@pytest.mark.parametrize("mode", ["shuffle", "sequential", "resample"])
def test_loader_state_round_trip_mid_epoch(mode: str) -> None:
    def make() -> tuple[GDROSampler, StatefulDataLoader]:
        ctrl = controller(mode="resample") if mode == "resample" else controller()
        s = GDROSampler(np.arange(50, 80), ctrl, mode=mode, seed=2)
        return s, loader(s, batch_size=4)

    _, dl = make()
    it = iter(dl)
    for _ in range(3):
        next(it)
    buf = io.BytesIO()
    torch.save(dl.state_dict(), buf)  # what verl writes to global_step_N/data.pt
    rest = [next(it) for _ in range(4)] + [b for b in iter(dl)][:3]  # crosses into the next epoch

    _, dl2 = make()
    buf.seek(0)
    dl2.load_state_dict(torch.load(buf, weights_only=False))
    it2 = iter(dl2)
    resumed = [next(it2) for _ in range(4)] + [b for b in iter(dl2)][:3]
    assert resumed == rest


def test_resample_draws_bins_with_q() -> None:
    ctrl = controller(mode="resample", eta=3.0, normalize_by_share=False, min_ess=0.0)
    uids = np.arange(400)
    # history: uids < 100 always fail (pass@k 0 -> bin 0), the rest always succeed (bin 9)
    plan = ctrl.before_generation(uids)
    g = np.repeat(plan.positions, 4)
    acc = (uids[g] >= 100).astype(float)
    for _ in range(3):
        ctrl.after_advantage(g, acc)
        ctrl.before_generation(uids)
    ctrl.after_advantage(g, acc)
    q = ctrl.bin_probs()
    # only bins 0 and 9 hold prompts; the exploration floor spreads 0.2 of the mass uniformly
    explore = ctrl.settings.prompt.explore
    expected = (1 - explore) * q[0] / (q[0] + q[9]) + explore * 100 / 400
    assert expected > 0.65
    sampler = GDROSampler(uids, ctrl, mode="resample", seed=0)
    draws = np.array([i for b in loader(sampler, batch_size=50) for i in b])
    frac = float(np.mean(draws < 100))
    assert abs(frac - expected) < 4 * np.sqrt(expected * (1 - expected) / draws.size)
    assert len(np.unique(draws)) < draws.size  # with replacement across batches: hard prompts repeat
    batched = GDROSampler(uids, ctrl, mode="resample", seed=0, batch_size=50)
    for batch in loader(batched, batch_size=50):
        assert len(set(batch)) == 50  # within a batch: distinct prompts


def test_state_of_another_training_set_is_refused() -> None:
    s = GDROSampler(np.arange(20), controller())
    state = s.state_dict()
    other = GDROSampler(np.arange(1, 21), controller())
    with pytest.raises(ValueError, match="different training set"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="saved under different gdro settings"):
        GDROSampler(np.arange(20), controller(eta=0.1)).load_state_dict(state)


def _record(out: dict[str, Any], store: FakeTQ) -> dict[str, Any]:
    adv = [store.rows[("train", k)]["advantages"].tolist() for k in out["meta"].keys]
    metrics = {k: v for k, v in out["metrics"].items() if k != "gdro/controller_time_s"}
    return {
        "prompts": [int(s) for s in out["batch"]["index"]],
        "rollout_n": agent_loop_rollout_n(out["batch"], 4),
        "advantages": adv,
        "metrics": metrics,
    }


@pytest.mark.parametrize("mode", ["reweight", "resample"])
def test_trainer_checkpoint_resume_gives_identical_decisions(tmp_path: Path, fake_tq: FakeTQ, mode: str) -> None:
    overrides = ("gdro.rollout.enable=true", f"gdro.prompt.mode={mode}")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_trainer(tmp_path / "a", *overrides)
    for step in range(1, 4):
        run_step(a, fake_tq, step)
    data_pt = tmp_path / "data.pt"
    torch.save(a.train_dataloader.state_dict(), data_pt)  # as PPOTrainer._save_checkpoint does
    uninterrupted = [_record(run_step(a, fake_tq, step), fake_tq) for step in range(4, 9)]  # crosses epochs

    b = make_trainer(tmp_path / "b", *overrides)
    b.train_dataloader.load_state_dict(torch.load(data_pt, weights_only=False))  # as _load_checkpoint does
    resumed = [_record(run_step(b, fake_tq, step), fake_tq) for step in range(4, 9)]
    assert resumed == uninterrupted
    assert any(len(set(r["rollout_n"])) > 1 for r in resumed)


def test_a_state_written_before_batched_draws_still_loads() -> None:
    s = GDROSampler(np.arange(30), controller(mode="resample"), mode="resample", seed=3, batch_size=5)
    it = iter(loader(s, batch_size=5))
    next(it)
    state = s.state_dict()
    old = {k: v for k, v in state.items() if k not in ("draws", "block", "block_pos")}
    old["version"] = 1  # what verl-gdro wrote into data.pt before the step API's sampler
    resumed = GDROSampler(np.arange(30), controller(mode="resample"), mode="resample", seed=3, batch_size=5)
    resumed.load_state_dict(old)
    batch = [next(iter(loader(resumed, batch_size=5))) for _ in range(1)][0]
    assert len(set(batch)) == 5  # a fresh batch of distinct prompts
    with pytest.raises(ValueError, match="not a GDROSampler state"):
        resumed.load_state_dict({**old, "version": 0})


def test_restoring_a_version_1_state_into_a_used_sampler_reclassifies_the_set() -> None:
    # two runs with the same visits per prompt and opposite outcomes: the visit counts cannot tell
    # their classifiers apart, so only forgetting the cache on restore gives the restored bins
    uids = np.arange(40)

    def run(hard_below: bool) -> GDROSampler:
        ctrl = controller(mode="resample", eta=3.0)
        sampler = GDROSampler(uids, ctrl, mode="resample", seed=1, batch_size=8)
        for _ in range(3):
            sampler._draws.draw(8)  # fills the bin cache under this run's classifier
            plan = ctrl.before_generation(uids)
            g = np.repeat(plan.positions, 4)
            ctrl.after_advantage(g, ((uids[g] < 20) != hard_below).astype(float))
        sampler._draws.draw(8)
        return sampler

    a, b = run(False), run(True)
    old = {k: v for k, v in b.state_dict().items() if k not in ("draws", "block", "block_pos")}
    old["version"] = 1
    a.load_state_dict(old)
    assert not np.array_equal(a.controller.bins_of(uids), run(False).controller.bins_of(uids))
    assert np.array_equal(a._draws._current_bins(), a.controller.bins_of(uids))


def _fetch(dl_it: Any, count: int) -> list[int]:
    return [i for _ in range(count) for i in next(dl_it)]


def test_announced_calls_are_one_block_whatever_the_loader_batch_size() -> None:
    """verl fetches one prompt at a time under async/DAPO (gen_batch_size=1): each announced
    generation call is still one draw of distinct prompts, none of the held ones, and the draws
    between two controller updates share one probability pass."""
    uids = np.arange(500, 540)
    s = GDROSampler(uids, controller(mode="failure_weighted"), mode="resample", seed=0)
    it = iter(loader(s, batch_size=1))
    s.begin_call(8, lambda: uids[[0, 1, 2]])  # three prompts in flight
    batch = _fetch(it, 8)
    assert len(set(batch)) == 8 and not {0, 1, 2} & set(batch)
    s.begin_call(4, lambda: np.concatenate([uids[[0, 1, 2]], uids[batch]]))  # a refill round
    refill = _fetch(it, 4)
    assert len(set(refill)) == 4 and not {0, 1, 2, *batch} & set(refill)
    assert (s._draws.passes, s._draws.draws) == (1, 2)
    with pytest.raises(RuntimeError, match="not yet fetched"):
        s.begin_call(2)
        next(it)
        s.begin_call(2)


def test_a_resample_epoch_ends_at_a_call_boundary() -> None:
    """An epoch of 10 prompts fetched in calls of 4: the third call crosses the 10th draw and
    stays whole (distinct); the epoch ends before the next call, which starts a new one."""
    s = GDROSampler(np.arange(10), controller(mode="failure_weighted"), mode="resample", seed=1)
    dl = loader(s, batch_size=2)
    it = iter(dl)
    for _ in range(3):
        s.begin_call(4)
        assert len(set(_fetch(it, 2))) == 4
    s.begin_call(4)
    with pytest.raises(StopIteration):
        next(it)
    it = iter(dl)  # what verl's _fetch_one_gen_batch does on StopIteration
    assert s.epoch == 2 and len(set(_fetch(it, 2))) == 4
