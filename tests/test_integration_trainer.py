"""The ``gdro_sync`` trainer's overridden methods on a real trainer object.

The trainer is built by its real ``__init__`` from the composed package config (that part of verl
needs no Ray), its real ``_init_dataloader`` reads a parquet file through verl's ``RLHFDataset``,
and ``_next_train_batch`` / ``_compute_advantage`` run verl's own code. Only TransferQueue (a Ray
service) is replaced by an in-memory store with the same two calls and return types, and the
rollout is simulated the way verl's agent loop writes trajectories (``{uid}_{session}_0`` keys,
prompt columns copied onto each trajectory, ``acc`` inside ``extra_fields.reward_extra_info``,
``pad...`` rows tagged ``is_padding`` as ``_balance_batch`` appends them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from integration_harness import (
    FakeTQ,
    agent_loop_rollout_n,
    make_trainer,
    run_step,
    simulate_rollout,
    start_real_tq,
    stored_field,
)
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage

from verl_gdro.integration.trainer import ROLLOUT_N_KEY
from verl_gdro.step.controller import GDROController

# ---------------------------------------------------------------------------------------------

#: the trainer's flow counters (verl_gdro.integration.glue.flow_metrics), 10 bins
FLOW_KEYS = {
    "gdro/flow/generated_rollouts", "gdro/flow/kept_rollouts", "gdro/flow/filtered_rollouts",
    "gdro/flow/discarded_rollouts", "gdro/flow/lost_groups", "gdro/dispatch/calls", "gdro/dispatch/prompts",
    "gdro/dispatch/rollouts", "gdro/call_mean_n", "gdro/staleness/mean", "gdro/staleness/max", "gdro/inflight_prompts",
    *(f"gdro/flow/dropped_groups/{r}" for r in ("filtered", "surplus", "stale", "failed")),
    *(f"gdro/flow/filtered_share/bin_{b}" for b in range(10)),
}


def test_init_switches_to_sync_and_mirrors_the_gdro_group(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, "gdro.prompt.eta=0.5")
    # verl runs its own sync mode; the config it logs (Tracking, built in fit) names the GDRO mode
    assert trainer.trainer_mode == "sync" and trainer.config.trainer.v1.trainer_mode == "gdro_sync"
    assert trainer.config.algorithm.gdro.prompt.eta == 0.5
    assert trainer.gdro is not None and trainer.gdro.settings.prompt.eta == 0.5
    # verl's sync buffer (not the async one), as its GDRO subclass that reports removed groups
    assert type(trainer.replay_buffer).__name__ == "GDROReplayBuffer"
    assert type(trainer.replay_buffer).__mro__[2].__name__ == "ReplayBuffer"
    assert trainer.replay_buffer.gdro_observer is not None


def test_logged_config_carries_every_resolved_gdro_key(tmp_path: Path) -> None:
    """issue 32: what verl hands its Tracking (wandb's run config) is the resolved group: the
    preset's values instead of nulls, and the group resolves to the very settings that run."""
    from omegaconf import OmegaConf

    from verl_gdro.step.config import resolve_gdro

    trainer = make_trainer(tmp_path, "gdro.preset=paper", "actor_rollout_ref.actor.use_kl_loss=true",
                           "gdro.rollout.enable=true")
    logged = OmegaConf.to_container(trainer.config, resolve=True)  # what fit() gives Tracking
    group = logged["gdro"]
    assert group == logged["algorithm"]["gdro"]
    assert (group["prompt"]["mode"], group["prompt"]["loss_signal"]) == ("reweight", "surrogate_kl")
    assert (group["rollout"]["allocator"], group["rollout"]["arm_utility"]) == ("bandit", "loss")
    assert (group["rollout"]["selection"], group["rollout"]["enable"]) == ("map", True)
    assert group["classifier"]["window"] == 100 and group["classifier"]["passk_estimator"] == "pooled"
    assert resolve_gdro(group) == trainer.gdro_settings
    assert logged["trainer"]["v1"]["trainer_mode"] == "gdro_sync"


def test_init_validates_the_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^actor_rollout_ref.rollout.n=1 is invalid"):
        make_trainer(tmp_path, "actor_rollout_ref.rollout.n=1")
    with pytest.raises(ValueError, match=r"^algorithm.adv_estimator='grpo' is invalid"):
        make_trainer(tmp_path, "algorithm.adv_estimator=grpo")


def test_init_fails_loudly_when_not_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.trainer.ppo import core_algos

    registry = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    registry.pop("gdro_grpo")
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", registry)
    with pytest.raises(RuntimeError, match="advantage estimator 'gdro_grpo'"):
        make_trainer(tmp_path)


def test_dataloader_uses_the_gdro_sampler(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    assert trainer.train_dataloader.sampler is trainer.gdro_sampler
    assert trainer.train_dataloader.num_workers == 0
    assert trainer.gdro_sampler.uids.tolist() == [1000 + 7 * i for i in range(24)]


def test_duplicate_and_missing_prompt_ids_are_startup_errors(tmp_path: Path) -> None:
    dup = list(range(24))
    dup[9] = 3
    with pytest.raises(ValueError, match=r"extra_info.index 3 appears in training rows \[3, 9\]"):
        make_trainer(tmp_path, index=dup)
    missing = list(range(24))
    missing[5] = None
    with pytest.raises(ValueError, match=r"^gdro.uid_key=index: 1 of 24 training rows have no extra_info.index"):
        make_trainer(tmp_path, index=missing)


def test_row_index_ids_through_the_gdro_dataset(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer = make_trainer(
        tmp_path, "gdro.uid_key=row_index", "data.custom_cls.path=pkg://verl_gdro.integration.dataset",
        "data.custom_cls.name=GDRODataset", index="none",
    )
    out = run_step(trainer, fake_tq, 1)
    ids = sorted(int(s) for s in out["batch"]["gdro_row_index"])
    assert all(0 <= i < 24 for i in ids) and len(set(ids)) == 6
    assert out["metrics"]["gdro/num_prompts"] == 6.0


def test_rollout_n_is_written_and_exact(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer = make_trainer(tmp_path, "gdro.rollout.enable=true")
    seen_non_uniform = False
    for step in range(1, 7):
        out = run_step(trainer, fake_tq, step)
        ns = agent_loop_rollout_n(out["batch"], 4)
        assert sum(ns) == 6 * 4  # train_batch_size * rollout.n, every step
        assert all(2 <= n <= 12 for n in ns)
        assert len(out["meta"]) == 24
        assert out["metrics"]["gdro/mean_n"] == 4.0
        seen_non_uniform |= len(set(ns)) > 1
    assert seen_non_uniform  # the allocator really moves rollouts between bins


def test_no_rollout_n_without_rollout_gdro(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer = make_trainer(tmp_path)
    batch = trainer._next_train_batch()
    assert ROLLOUT_N_KEY not in batch.keys()


def test_advantage_stage_matches_direct_controllers_and_skips_padding(tmp_path: Path, fake_tq: FakeTQ) -> None:
    check_advantage_stage(tmp_path, fake_tq, steps=4)


def test_without_padding_the_estimator_gets_the_trainers_rows(
    tmp_path: Path, fake_tq: FakeTQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No padding rows: the trainer hands verl's estimator its per-row view (RowPlan), which
    gives the same advantages without regrouping the rows by uid."""
    from verl_gdro.integration import estimator

    grouped = []
    real = estimator._group_ids
    monkeypatch.setattr(estimator, "_group_ids", lambda keys: grouped.append(len(keys)) or real(keys))
    check_advantage_stage(tmp_path, fake_tq, steps=3, pad=0)
    assert not grouped


@pytest.fixture(scope="module")
def real_tq() -> Iterator[Any]:
    yield from start_real_tq()


@pytest.mark.slow
def test_advantage_stage_on_real_transfer_queue(tmp_path: Path, real_tq: Any) -> None:
    """The same checks with TransferQueue itself (Ray with enough logical CPUs, one storage unit)."""
    check_advantage_stage(tmp_path, real_tq, steps=3)


@pytest.mark.slow
def test_missing_acc_on_real_transfer_queue(tmp_path: Path, real_tq: Any) -> None:
    """The fallback read of a top-level reward field must fail fast (not hang) on the real store."""
    trainer = make_trainer(tmp_path, "gdro.acc_key=correct")
    batch = trainer._next_train_batch()
    meta, _ = simulate_rollout(real_tq, batch, 1, "index", 4)
    with pytest.raises(ValueError, match=r"^gdro.acc_key='correct' is missing .* keys: \['acc', 'score'\]"):
        trainer._compute_advantage(meta, {})


def check_advantage_stage(tmp_path: Path, store: Any, steps: int, pad: int = 3) -> None:
    trainer = make_trainer(tmp_path, "gdro.rollout.enable=true")
    shadow = GDROController(trainer.gdro_settings, rollout_n=4)
    for step in range(1, steps + 1):
        out = run_step(trainer, store, step, pad=pad)
        truth = out["truth"]
        # the same decisions and updates, computed directly on the same data
        stable_batch = np.array([int(s) for s in out["batch"]["index"]])
        plan = shadow.before_generation(stable_batch)
        assert agent_loop_rollout_n(out["batch"], 4) == plan.rollout_n.tolist()
        verl_uids = list(out["batch"]["uid"])
        group_index = np.array([verl_uids.index(u) for u in truth["uid"]])
        mult = shadow.advantage_multipliers(group_index)
        expected_metrics = shadow.after_advantage(group_index, np.array(truth["acc"], dtype=float))

        metrics = out["metrics"]
        assert set(expected_metrics) | FLOW_KEYS == {k for k in metrics if k.startswith("gdro/")}
        for key, value in expected_metrics.items():
            if key != "gdro/controller_time_s":
                assert metrics[key] == pytest.approx(value, abs=1e-12), key
        assert metrics["gdro/num_trajectories"] == len(truth["uid"])  # padding rows are not counted
        assert metrics["gdro/controller_time_s"] > 0
        # no filtering here: one generation call, everything generated was kept
        assert metrics["gdro/dispatch/calls"] == 1 and metrics["gdro/dispatch/prompts"] == 6
        assert metrics["gdro/dispatch/rollouts"] == 24 == metrics["gdro/flow/generated_rollouts"]
        assert metrics["gdro/flow/kept_rollouts"] == 24 and metrics["gdro/flow/filtered_rollouts"] == 0
        assert metrics["gdro/inflight_prompts"] == 0 and metrics["gdro/staleness/max"] == 0

        # advantages written back = verl's grpo per uid x the prompt's multiplier; padding zero
        real_keys = [k for k, tag in zip(out["meta"].keys, out["meta"].tags) if not tag.get("is_padding")]
        stored = stored_field(store, real_keys, "advantages")
        lengths = truth["mask"]
        width = max(lengths)
        mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
        rewards = torch.zeros(len(lengths), width)
        for i, (n, a) in enumerate(zip(lengths, truth["acc"])):
            rewards[i, n - 1] = 1.0 if a else -1.0
        ref = compute_advantage(
            DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                                non_tensors={"uid": np.array(truth["uid"], dtype=object)}),
            adv_estimator="grpo",
        ).batch["advantages"]
        for i, adv in enumerate(stored):
            expected = ref[i, : lengths[i]] * torch.tensor(mult[i], dtype=torch.float32)
            assert torch.allclose(adv, expected, atol=1e-6), (step, i)
        pads = stored_field(store, [k for k, t in zip(out["meta"].keys, out["meta"].tags) if t.get("is_padding")],
                            "advantages")
        assert len(pads) == pad and all(torch.count_nonzero(p) == 0 for p in pads)
    assert _state_equal(trainer.gdro.state_dict(), shadow.state_dict())
    assert trainer.gdro.prompt is not None and np.any(trainer.gdro.prompt.scores != 0)


def test_paper_preset_reads_log_probs_for_the_surrogate_kl_signal(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer = make_trainer(tmp_path, "gdro.preset=paper", "actor_rollout_ref.actor.use_kl_loss=true")
    shadow = GDROController(trainer.gdro_settings, rollout_n=4)
    out = run_step(trainer, fake_tq, 1, pad=2)
    truth = out["truth"]
    shadow.before_generation(np.array([int(s) for s in out["batch"]["index"]]))
    verl_uids = list(out["batch"]["uid"])
    g = np.array([verl_uids.index(u) for u in truth["uid"]])
    shadow.advantage_multipliers(g)
    width = max(truth["mask"])

    # float32 like the trainer hands over (verl's log-probs are float32; the loss signals
    # accumulate in float64 themselves): the same bits in, so the same loss out
    def padded(rows: list[torch.Tensor]) -> np.ndarray:
        return np.array([np.pad(r.numpy().astype(np.float32), (0, width - r.numel())) for r in rows])

    real_keys = [k for k, tag in zip(out["meta"].keys, out["meta"].tags) if not tag.get("is_padding")]
    adv = padded([fake_tq.rows[("train", k)]["advantages"] for k in real_keys])
    mask = np.array([[1.0] * n + [0.0] * (width - n) for n in truth["mask"]], dtype=np.float32)
    expected = shadow.after_advantage(g, np.array(truth["acc"], dtype=float), response_mask=mask,
                                      old_log_probs=padded(truth["old"]), ref_log_probs=padded(truth["ref"]),
                                      advantages=adv)
    for b in range(10):
        key = f"gdro/loss/bin_{b}"
        assert (key in out["metrics"]) == (key in expected)  # logged for the step's bins only
        if key in expected:
            assert out["metrics"][key] == pytest.approx(expected[key], rel=1e-9, abs=1e-12)
    assert expected["gdro/loss/bin_0"] > 0  # beta_KL * KL > 0 with ref != old


def test_missing_acc_names_the_key(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer = make_trainer(tmp_path, "gdro.acc_key=correct")
    batch = trainer._next_train_batch()
    meta, _ = simulate_rollout(fake_tq, batch, 1, "index", 4)
    with pytest.raises(ValueError, match=r"^gdro.acc_key='correct' is missing from the reward output"):
        trainer._compute_advantage(meta, {})


def test_gdro_disabled_is_plain_verl(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer = make_trainer(tmp_path, "gdro.enable=false")
    assert trainer.gdro is None and trainer.gdro_sampler is None
    batch = trainer._next_train_batch()
    meta, _ = simulate_rollout(fake_tq, batch, 1, "index", 4)
    metrics: dict[str, Any] = {}
    trainer._compute_advantage(meta, metrics)
    assert not any(k.startswith("gdro/") for k in metrics)


def _state_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a):
        return np.isnan(b)
    return a == b


def test_trainer_prints_its_mode_once_at_start(tmp_path, capsys) -> None:
    """issue 13: rollout.enable=true alone is joint mode (Prompt-GDRO defaults on); the trainer
    says which adversaries run, with the preset and key settings, before any step."""
    trainer = make_trainer(tmp_path, "gdro.rollout.enable=true")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("verl-gdro mode:")]
    assert lines == [trainer.gdro_mode_line]
    assert lines[0].startswith("verl-gdro mode: joint") and "preset robust" in lines[0] and "mean n 4" in lines[0]


def test_the_mode_line_names_dapos_filter(tmp_path, capsys) -> None:
    """issue 38: under algorithm.filter_groups the mode line names the regime (the filter, its
    metric and its bound on generation calls) and where the with-or-without measurement is."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "dapo").mkdir()
    plain = make_trainer(tmp_path / "plain", "gdro.rollout.enable=true")
    assert "DAPO" not in plain.gdro_mode_line
    trainer = make_trainer(tmp_path / "dapo", "gdro.rollout.enable=true", "algorithm.filter_groups.enable=true",
                           "algorithm.filter_groups.metric=acc", "algorithm.filter_groups.max_num_gen_batches=3")
    assert trainer.gdro_mode_line.startswith(plain.gdro_mode_line)
    assert trainer.gdro_mode_line.endswith(
        " | DAPO filter on (acc, at most 3 generation calls per step): every generated rollout counts; with or "
        "without the filter: docs/benchmarks.md, 'GDRO with DAPO's dynamic sampling'")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("verl-gdro mode:")]
    assert lines[-1] == trainer.gdro_mode_line


@pytest.mark.parametrize(
    "values",
    [[3, 1, 2], ["12", " 7 ", "0"], [1.5, 2.0], [True, 2], [np.int64(3), 4], ["x"], [None], [2**70], ["1.5"], []],
)
def test_int_column_reads_object_arrays_like_int(values: list) -> None:
    """An object / int array column goes through numpy's astype, which must read every value as
    ``int(value)`` does (the list path): the same ids, and the same error type for bad ones."""
    from verl_gdro.integration.trainer import _int_column

    def read(column: Any) -> Any:
        try:
            return _int_column(column).tolist()
        except Exception as exc:  # noqa: BLE001 - the error type is what is compared
            return type(exc)

    as_list = read(list(values))
    assert read(np.array(values, dtype=object)) == as_list
    if as_list and all(type(v) is int and abs(v) < 2**31 for v in values):
        assert read(np.array(values, dtype=np.int32)) == as_list


def test_uid_keys_gives_a_fresh_list_of_exact_str() -> None:
    from verl_gdro.step.context import uid_keys

    uids = ["a", "b", "a"]
    keys = uid_keys(uids)
    assert keys == uids and keys is not uids
    mixed = uid_keys(np.array(["a", 7, np.str_("b")], dtype=object))
    assert mixed == ["a", "7", "b"] and all(type(k) is str for k in mixed)


def test_as_list_reads_every_column_form() -> None:
    """TransferQueue and TensorDict hand columns over as tensors, arrays, NonTensorStack /
    NonTensorData (``tolist``; a scalar's is not a list), objects holding ``.data``, or plain
    sequences: each becomes one flat Python list."""
    from types import SimpleNamespace

    from tensordict import NonTensorData, NonTensorStack

    from verl_gdro.integration.trainer import _as_list

    assert _as_list(torch.tensor([1, 2])) == [1, 2]
    assert _as_list(np.array(["a", "b"], dtype=object)) == ["a", "b"]
    assert _as_list(np.int64(5)) == [5]
    assert _as_list(NonTensorStack.from_list([NonTensorData(1), NonTensorData(2)])) == [1, 2]
    assert _as_list(SimpleNamespace(data=("x", "y"))) == ["x", "y"]
    assert _as_list(SimpleNamespace(data="z")) == ["z"]
    assert _as_list(iter((8, 9))) == [8, 9]


def test_padded_numpy_pads_jagged_fields_and_selects_rows() -> None:
    """The token fields come jagged from TransferQueue: zero-padded to the longest row, float32
    for the int64 mask, the tensor's own memory when every row is kept, a copy of the kept rows
    otherwise (padding rows dropped)."""
    from verl_gdro.integration.reads import padded_numpy as _padded_numpy

    jagged = torch.nested.as_nested_tensor([torch.tensor([1, 1, 1]), torch.tensor([1])], layout=torch.jagged)
    out = _padded_numpy(jagged, np.arange(2))
    assert out.dtype == np.float32 and out.tolist() == [[1, 1, 1], [1, 0, 0]]
    dense = torch.arange(6, dtype=torch.float64).reshape(3, 2)
    assert np.shares_memory(_padded_numpy(dense, np.arange(3)), dense.numpy())
    assert _padded_numpy(dense, np.array([0, 2])).tolist() == [[0.0, 1.0], [4.0, 5.0]]


def test_multi_output_agent_loop_counts_sessions_not_rows(tmp_path: Path, fake_tq: FakeTQ) -> None:
    """A multi-output agent loop writes every session's outputs as rows {uid}_{session}_{i}: the
    controller observes one trial per session (the rollouts Rollout-GDRO allocated), so no group
    looks incomplete, Rollout-GDRO learns every step, and the classifier's counts are sessions; the
    estimator still scales every row. Twin trainer with one output per session: the same state."""
    (tmp_path / "multi").mkdir()
    (tmp_path / "single").mkdir()
    multi = make_trainer(tmp_path / "multi", "gdro.rollout.enable=true")
    single = make_trainer(tmp_path / "single", "gdro.rollout.enable=true")
    for step in range(1, 5):
        metrics = {}
        for trainer, outputs in ((multi, 3), (single, 1)):
            batch = trainer._next_train_batch()
            meta, _truth = simulate_rollout(fake_tq, batch, step, trainer._gdro_uid_field, 4, outputs=outputs)
            assert len(meta) == 24 * outputs
            metrics[outputs] = {}
            trainer._compute_advantage(meta, metrics[outputs])
        m = metrics[3]
        assert m["gdro/incomplete_groups"] == 0 and m["gdro/rollout_update_skipped"] == 0
        assert m["gdro/num_trajectories"] == 24
        assert {k: v for k, v in m.items() if k != "gdro/controller_time_s"} == {
            k: v for k, v in metrics[1].items() if k != "gdro/controller_time_s"}
    assert _state_equal(multi.gdro.state_dict(), single.gdro.state_dict())


def test_a_plus_minus_one_reward_is_correctness_above_the_threshold(tmp_path: Path, fake_tq: FakeTQ) -> None:
    """issue 32: verl's reward managers put a plain float score under ``acc``; a +-1 reward read
    through ``gdro.acc_key`` is correctness above ``gdro.correct_threshold`` (0.0), the same key and
    rule as the standalone estimator, so it runs the very step a {0, 1} ``acc`` runs."""
    for name in "abc":
        (tmp_path / name).mkdir()
    binary = run_step(make_trainer(tmp_path / "a"), fake_tq, 1)["metrics"]
    signed = run_step(make_trainer(tmp_path / "b", "gdro.acc_key=score"), fake_tq, 1)["metrics"]
    acc_keys = [k for k in binary if k.startswith("gdro/acc/")]
    assert acc_keys and all(binary[k] == signed[k] for k in acc_keys)
    strict = run_step(make_trainer(tmp_path / "c", "gdro.acc_key=score", "gdro.correct_threshold=1.0"), fake_tq, 1)
    assert all(strict["metrics"][k] == 0.0 for k in acc_keys)  # nothing is above 1.0


def test_gdro_time_is_in_verl_timing_section(tmp_path: Path, fake_tq: FakeTQ) -> None:
    """issue 32: GDRO's time of the step goes into verl's ``timing_raw`` (logged as ``timing_s/gdro``)."""
    trainer = make_trainer(tmp_path)
    trainer.timing_raw = {}  # what verl's fit() sets before each step
    out = run_step(trainer, fake_tq, 1)
    assert trainer.timing_raw["gdro"] > 0
    assert trainer.timing_raw["gdro"] == pytest.approx(out["metrics"]["gdro/controller_time_s"])
