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

import copy
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import transfer_queue
from hydra import compose, initialize_config_module
from tensordict import NonTensorData, NonTensorStack, TensorDict
from transfer_queue import KVBatchMeta
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage

from verl_gdro.integration.controller import GDROController
from verl_gdro.integration.trainer import ROLLOUT_N_KEY, GDROTrainerSync


class FakeTQ:
    """In-memory stand-in for TransferQueue's ``kv_batch_get`` / ``kv_batch_put``.

    Same contract as the real client for what the trainer uses: per-token fields come back as
    jagged nested tensors, other values as a NonTensorStack; requested fields that no key has are
    left out, a field that only some keys have is an error ("not ready").
    """

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}
        self.tags: dict[tuple[str, str], dict] = {}

    def put(self, keys: list[str], partition_id: str, fields: TensorDict | None = None, tags: list | None = None,
            **_: Any) -> KVBatchMeta:
        for i, key in enumerate(keys):
            row = self.rows.setdefault((partition_id, key), {})
            if fields is not None:
                for name in fields.keys():
                    value = fields[name]
                    row[name] = value[i].clone() if isinstance(value, torch.Tensor) else list(value)[i]
            if tags is not None:
                self.tags[(partition_id, key)] = dict(tags[i])
        return KVBatchMeta(keys=list(keys), tags=[self.tags.get((partition_id, k), {}) for k in keys],
                           partition_id=partition_id)

    def get(self, keys: list[str], partition_id: str, select_fields: list[str] | None = None) -> TensorDict:
        rows = [self.rows[(partition_id, k)] for k in keys]
        names = select_fields if select_fields is not None else list(rows[0])
        out: dict[str, Any] = {}
        for name in names:
            have = [name in r for r in rows]
            if not any(have):
                continue
            if not all(have):
                raise ValueError("Some fields are not ready in all the requested keys!")
            values = [r[name] for r in rows]
            if all(isinstance(v, torch.Tensor) and v.dim() >= 1 for v in values):
                out[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            elif all(isinstance(v, torch.Tensor) for v in values):
                out[name] = torch.stack(values)
            else:
                out[name] = NonTensorStack.from_list([NonTensorData(v) for v in values])
        return TensorDict(out, batch_size=[len(keys)])


@pytest.fixture
def fake_tq(monkeypatch: pytest.MonkeyPatch) -> FakeTQ:
    store = FakeTQ()
    monkeypatch.setattr(transfer_queue, "kv_batch_get", store.get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", store.put)
    return store


def write_dataset(path: Path, num_rows: int, index: Any = "sparse") -> str:
    rows = []
    for i in range(num_rows):
        extra: dict[str, Any] = {"split": "train"}
        if index == "sparse":
            extra["index"] = 1000 + 7 * i  # stable ids need not be dense
        elif isinstance(index, list):
            if index[i] is not None:
                extra["index"] = index[i]
        rows.append({
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": extra,
        })
    file = path / "train.parquet"
    pd.DataFrame(rows).to_parquet(file)
    return str(file)


def make_trainer(tmp_path: Path, *overrides: str, num_rows: int = 24, index: Any = "sparse") -> GDROTrainerSync:
    data = write_dataset(tmp_path, num_rows, index)
    base = [
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=6",
        "data.filter_overlong_prompts=false",
        "data.seed=3",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=6",
    ]
    with initialize_config_module(config_module="verl_gdro.config", version_base=None):
        cfg = compose(config_name="gdro_trainer", overrides=base + list(overrides))
    trainer = GDROTrainerSync(cfg)
    trainer.tokenizer = None  # 0.9.1's dataset only tokenises for the length filter (off here)
    trainer.processor = None
    trainer.global_steps = 1
    trainer._init_dataloader()
    return trainer


def outcome(stable: int, step: int, session: int) -> int:
    """Deterministic correctness: prompt-dependent difficulty, reproducible across runs."""
    p = (stable % 5) / 5.0 + 0.1
    return int(np.random.default_rng([stable, step, session]).random() < p)


def agent_loop_rollout_n(batch: TensorDict, n_default: int) -> list[int]:
    """How verl's agent loop reads the per-prompt n (v1/agent_loop_tq.py: NonTensorStack -> v[i].data,
    then ``prompt.pop("__rollout_n__", config.n)``)."""
    out = []
    for i in range(len(batch)):
        prompt = {}
        for k, v in batch.items():
            if isinstance(v, NonTensorStack):
                prompt[k] = v[i].data
            elif isinstance(v, NonTensorData):
                prompt[k] = v.data
        out.append(int(prompt.pop(ROLLOUT_N_KEY, n_default)))
    return out


def simulate_rollout(store: FakeTQ, batch: TensorDict, step: int, uid_field: str, n_default: int,
                     pad: int = 0, drop: set[tuple[int, int]] | None = None) -> tuple[KVBatchMeta, dict]:
    """Write the step's trajectories like AgentLoopWorkerTQ does; return the batch meta and truth."""
    uids = list(batch["uid"])
    stable = [int(s) for s in batch[uid_field]]
    ns = agent_loop_rollout_n(batch, n_default)
    keys, tags, fields = [], [], []
    truth = {"uid": [], "stable": [], "acc": [], "mask": [], "old": [], "ref": []}
    for p, (uid, sid, n) in enumerate(zip(uids, stable, ns)):
        for s in range(n):
            if drop and (p, s) in drop:
                continue  # a failed session: the group arrives incomplete
            rng = np.random.default_rng([sid, step, s, 7])
            length = int(rng.integers(2, 9))
            acc = outcome(sid, step, s)
            scores = torch.zeros(length)
            scores[-1] = 1.0 if acc else -1.0
            old = torch.tensor(-rng.random(length), dtype=torch.float32)
            ref = old + torch.tensor(0.1 * rng.standard_normal(length), dtype=torch.float32)
            keys.append(f"{uid}_{s}_0")
            tags.append({"status": "success", "seq_len": 10 + length, "min_global_steps": step, "max_global_steps": step})
            fields.append({
                "uid": uid, uid_field: sid, "response_mask": torch.ones(length, dtype=torch.int64),
                "rm_scores": scores, "old_log_probs": old, "ref_log_prob": ref,
                "extra_fields": {"reward_extra_info": {"acc": float(acc), "score": float(scores[-1])}},
            })
            for name, value in (("uid", uid), ("stable", sid), ("acc", acc), ("mask", length), ("old", old),
                                ("ref", ref)):
                truth[name].append(value)
    pad_uid = f"pad{uuid.uuid4().hex}"
    for j in range(pad):  # verl's _balance_batch: template copied from the first sample, zero mask
        row = copy.deepcopy(fields[0])
        row.update(uid=pad_uid, response_mask=torch.zeros(1, dtype=torch.int64), rm_scores=torch.zeros(1),
                   old_log_probs=torch.zeros(1), ref_log_prob=torch.zeros(1))
        keys.append(f"{pad_uid}_{j}_0")
        tags.append({"status": "success", "is_padding": True, "seq_len": 128})
        fields.append(row)
    for key, tag, row in zip(keys, tags, fields):
        store.rows[("train", key)] = row
        store.tags[("train", key)] = tag
    return KVBatchMeta(keys=keys, tags=tags, partition_id="train"), truth


def run_step(trainer: GDROTrainerSync, store: FakeTQ, step: int, pad: int = 0) -> dict[str, Any]:
    batch = trainer._next_train_batch()
    meta, truth = simulate_rollout(store, batch, step, trainer._gdro_uid_field, 4, pad=pad)
    metrics: dict[str, Any] = {}
    trainer._compute_advantage(meta, metrics)
    return {"batch": batch, "meta": meta, "truth": truth, "metrics": metrics}


# ---------------------------------------------------------------------------------------------


def test_init_switches_to_sync_and_mirrors_the_gdro_group(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, "gdro.prompt.eta=0.5")
    assert trainer.trainer_mode == "sync" and trainer.config.trainer.v1.trainer_mode == "sync"
    assert trainer.config.algorithm.gdro.prompt.eta == 0.5
    assert trainer.gdro is not None and trainer.gdro.settings.prompt.eta == 0.5
    assert type(trainer.replay_buffer).__name__ == "ReplayBuffer"  # not the async one


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
    trainer = make_trainer(tmp_path, "gdro.rollout.enable=true")
    shadow = GDROController(trainer.gdro_settings, rollout_n=4)
    for step in range(1, 5):
        out = run_step(trainer, fake_tq, step, pad=3)
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
        assert set(expected_metrics) == {k for k in metrics if k.startswith("gdro/")}
        for key, value in expected_metrics.items():
            if key != "gdro/controller_time_s":
                assert metrics[key] == pytest.approx(value, abs=1e-12), key
        assert metrics["gdro/num_trajectories"] == len(truth["uid"])  # padding rows are not counted
        assert metrics["gdro/controller_time_s"] > 0

        # advantages written back = verl's grpo per uid x the prompt's multiplier; padding zero
        real_keys = [k for k, tag in zip(out["meta"].keys, out["meta"].tags) if not tag.get("is_padding")]
        stored = [fake_tq.rows[("train", k)]["advantages"] for k in real_keys]
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
        pads = [fake_tq.rows[("train", k)]["advantages"] for k, tag in zip(out["meta"].keys, out["meta"].tags)
                if tag.get("is_padding")]
        assert len(pads) == 3 and all(torch.count_nonzero(p) == 0 for p in pads)
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
