"""Helpers for the verl-integration tests: an in-memory TransferQueue, a tiny dataset, a real
GDROTrainerSync built from the package config, and a rollout simulated the way verl's agent loop
writes trajectories. Not a test module (imported by test_integration_trainer/sampler)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_module
from tensordict import NonTensorData, NonTensorStack, TensorDict
from transfer_queue import KVBatchMeta

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


    # -- the calls verl's replay buffer makes (kv_list / kv_clear) --------------------------------

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict]]:
        out: dict[str, dict[str, dict]] = {}
        for (part, key), tag in self.tags.items():
            if partition_id is None or part == partition_id:
                out.setdefault(part, {})[key] = dict(tag)
        return out

    def clear(self, keys: list[str], partition_id: str) -> None:
        for key in keys:
            self.rows.pop((partition_id, key), None)
            self.tags.pop((partition_id, key), None)

    def snapshot(self) -> FakeTQ:
        """A copy (what tq.save_checkpoint / load_checkpoint carry across a restart)."""
        other = FakeTQ()
        other.rows = copy.deepcopy(self.rows)
        other.tags = copy.deepcopy(self.tags)
        return other


class FakeAgentLoop:
    """verl's ``AgentLoopManagerTQ.generate_sequences`` done synchronously into a :class:`FakeTQ`.

    Every dispatched prompt gets ``__rollout_n__`` trajectories (as verl's agent loop reads it),
    written like :func:`simulate_rollout`, and its prompt tag becomes ``finished``. ``calls`` keeps
    what every generation call produced: the truth the DAPO/async tests check the trainer against.
    """

    def __init__(self, store: FakeTQ, trainer: GDROTrainerSync) -> None:
        self.store = store
        self.trainer = trainer
        self.calls: list[dict[str, Any]] = []
        self.pending = 0
        #: groups still generating: uid -> their trajectories (key, fields, tag), not yet in the store
        self.running: dict[str, list[tuple[tuple[str, str], dict, dict]]] = {}

    def hold_pending(self, count: int) -> None:
        """Leave the first ``count`` groups of every generation call running (prompt status
        ``running``, no trajectory in the store); each time verl's replay buffer waits for samples
        (``_wait_for_next_poll``) the oldest one finishes. Groups are then still pending when a step
        samples, and, where the buffer has enough without them (the async prefetch), when a
        checkpoint is taken."""
        self.pending = count
        buffer = self.trainer.replay_buffer
        wait = buffer._wait_for_next_poll

        def finish_then_wait(*args: Any, **kwargs: Any) -> Any:
            self.finish_running()
            return wait(*args, **kwargs)

        buffer._wait_for_next_poll = finish_then_wait

    def finish_running(self) -> None:
        """The oldest running group finishes: its trajectories land in the store (unless verl removed
        the group meanwhile). One per poll, so later calls' groups may still run at the step's end."""
        while self.running:
            uid = next(iter(self.running))
            rows = self.running.pop(uid)
            tag = self.store.tags.get(("train", uid))
            if tag is None or tag.get("status") != "running":
                continue
            for key, row, row_tag in rows:
                self.store.rows[key] = row
                self.store.tags[key] = row_tag
            tag["status"] = "finished"
            return

    def generate_sequences(self, batch: TensorDict) -> None:
        step = int(self.trainer.global_steps)
        _meta, truth = simulate_rollout(self.store, batch, step, self.trainer._gdro_uid_field, 4)
        uids = [str(u) for u in batch["uid"]]
        for uid in uids:
            self.store.tags[("train", uid)] = {"is_prompt": True, "status": "finished", "global_steps": step}
        for uid in uids[: self.pending]:
            keys = [k for k in self.store.rows if k[0] == "train" and k[1].startswith(f"{uid}_")]
            self.running[uid] = [(k, self.store.rows.pop(k), self.store.tags.pop(k)) for k in keys]
            self.store.tags[("train", uid)]["status"] = "running"
        acc: dict[str, list[float]] = {u: [] for u in uids}
        for u, a in zip(truth["uid"], truth["acc"]):
            acc[u].append(float(a))
        self.calls.append({
            "step": step, "uid": uids, "stable": [int(s) for s in batch[self.trainer._gdro_uid_field]],
            "rollout_n": agent_loop_rollout_n(batch, 4), "acc": acc,
        })


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
        # what these tests exercise unless an override says otherwise: Prompt-GDRO reweighting alone
        # (the package default, joint mode with a sampling mode, is tested where named)
        "gdro.prompt.mode=reweight",
        "gdro.rollout.enable=false",
    ]
    with initialize_config_module(config_module="verl_gdro.config", version_base=None):
        cfg = compose(config_name="gdro_trainer", overrides=base + list(overrides))
    from verl.trainer.ppo.v1.trainer_base import get_trainer_cls

    trainer = get_trainer_cls(cfg.trainer.v1.trainer_mode)(cfg)  # verl's registry: gdro_sync, gdro_*_async
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


def simulate_rollout(store: Any, batch: TensorDict, step: int, uid_field: str, n_default: int,
                     pad: int = 0, drop: set[tuple[int, int]] | None = None,
                     outputs: int = 1) -> tuple[KVBatchMeta, dict]:
    """Write the step's trajectories like AgentLoopWorkerTQ does; return the batch meta and truth.

    ``outputs``: rows per session (a multi-output agent loop writes ``{uid}_{session}_{i}`` for
    each, every one with the session's reward); ``truth`` holds the sessions' first rows only."""
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
            for i in range(outputs):
                keys.append(f"{uid}_{s}_{i}")
                tags.append({"status": "success", "seq_len": 10 + length, "min_global_steps": step,
                             "max_global_steps": step})
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
    if isinstance(store, FakeTQ):
        for key, tag, row in zip(keys, tags, fields):
            store.rows[("train", key)] = row
            store.tags[("train", key)] = tag
    else:  # the real TransferQueue client module: write as AgentLoopWorkerTQ does
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        real = len(keys) - pad
        store.kv_batch_put(keys=keys[:real], partition_id="train", fields=list_of_dict_to_tensordict(fields[:real]),
                           tags=tags[:real])
        if pad:
            store.kv_batch_put(keys=keys[real:], partition_id="train",
                               fields=list_of_dict_to_tensordict(fields[real:]), tags=tags[real:])
    return KVBatchMeta(keys=keys, tags=tags, partition_id="train"), truth


def run_step(trainer: GDROTrainerSync, store: Any, step: int, pad: int = 0) -> dict[str, Any]:
    batch = trainer._next_train_batch()
    meta, truth = simulate_rollout(store, batch, step, trainer._gdro_uid_field, 4, pad=pad)
    metrics: dict[str, Any] = {}
    trainer._compute_advantage(meta, metrics)
    return {"batch": batch, "meta": meta, "truth": truth, "metrics": metrics}


def stored_field(store: Any, keys: list[str], name: str) -> list[torch.Tensor]:
    """One per-token field of the given trajectories, from the fake or the real store."""
    if isinstance(store, FakeTQ):
        return [store.rows[("train", k)][name] for k in keys]
    data = store.kv_batch_get(keys=keys, partition_id="train", select_fields=[name])
    return list(data[name].unbind())


def start_real_tq() -> Iterator[Any]:
    """TransferQueue for real: Ray with 8 logical CPUs and one storage unit (on a 2-core machine
    tq.init() otherwise waits forever). ~30 s to start; module-scoped."""
    import tempfile

    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(num_cpus=8, include_dashboard=False, object_store_memory=200 * 1024**2,
             _temp_dir=tempfile.mkdtemp(prefix="gdro-ray-"))
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield tq
        tq.close()
    finally:
        ray.shutdown()


# -- verl's own step() with the GPU calls stubbed ---------------------------------------------------


class FakeWorkerGroup:
    """The actor / reference worker group's GPU calls, answered from the trajectories in the store.

    ``compute_log_prob`` / ``compute_ref_log_prob`` write what verl's engine workers write
    (``log_probs`` and ``entropy`` over prompt + response, which verl's ``response_from_nested``
    shifts back to the response) from the ``old_log_probs`` / ``ref_log_prob`` the agent loop
    simulated; ``update_actor`` returns the metrics dict verl reduces. One data-parallel rank.
    """

    def __init__(self, store: FakeTQ) -> None:
        self.store = store
        self._dispatch_info = {"actor": [0]}
        self.updates = 0

    def _write_log_probs(self, batch: KVBatchMeta, source: str) -> KVBatchMeta:
        for key in batch.keys:
            row = self.store.rows[(batch.partition_id, key)]
            values = row[source].float()
            row["log_probs"] = torch.cat([values, torch.zeros(1)])  # prompt + response, shifted by one
            row["entropy"] = torch.cat([torch.full_like(values, 0.5), torch.zeros(1)])
            # what the rollout recorded (actor_rollout_ref.rollout.calculate_log_probs)
            row.setdefault("rollout_log_probs", row["old_log_probs"].clone())
            row.setdefault("responses", torch.zeros(values.shape[0], dtype=torch.int64))
        return batch

    def compute_log_prob(self, batch: KVBatchMeta) -> KVBatchMeta:
        return self._write_log_probs(batch, "old_log_probs")

    def compute_ref_log_prob(self, batch: KVBatchMeta) -> KVBatchMeta:
        return self._write_log_probs(batch, "ref_log_prob")

    def update_actor(self, batch: KVBatchMeta) -> dict[str, Any]:
        self.updates += 1
        return {"metrics": {"mfu": 0.0, "pg_loss": 0.0}}

    def save_model_to_cpu(self, *_: Any) -> None:  # separate_async's decoupled PPO
        return None

    restore_model_from_cpu = clear_cpu_model = save_model_to_cpu


class _NoOpManager:
    """verl's checkpoint-engine manager: every call a no-op (weights live nowhere here)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def stub_gpu_calls(trainer: Any, store: FakeTQ) -> FakeWorkerGroup:
    """Give a trainer built by :func:`make_trainer` what verl's ``init()`` builds on GPUs, as stubs,
    so that verl 0.9.1's own ``PPOTrainer.step`` runs: the worker groups, the checkpoint engine,
    the reward loop (a streaming reward: the agent loop already scored every trajectory), the
    tokenizer's EOS id, and separate_async's engine mode."""
    from types import SimpleNamespace

    workers = FakeWorkerGroup(store)
    trainer.actor_rollout_wg = workers
    trainer.ref_policy_wg = workers
    trainer.ref_in_actor = False
    trainer.checkpoint_manager = _NoOpManager()
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[object()])
    trainer.tokenizer = SimpleNamespace(eos_token_id=0)
    trainer.curr_step_profile = False
    trainer.timing_raw = {}
    if trainer.trainer_mode == "separate_async":
        from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

        trainer.current_mode = HybridEngineMode.TRAINER
    return workers


def verl_step(trainer: Any, store: FakeTQ, step: int, begin: bool = True) -> tuple[KVBatchMeta, dict[str, Any]]:
    """One training step as verl 0.9.1's ``fit()`` runs it: ``global_steps`` set, the async warm-up
    before step 1 (``on_train_begin``; ``begin=False``: the caller ran it), ``on_step_begin``,
    verl's own ``step()`` (``prepare_step``, the replay buffer's sample loop with its refills and
    evictions, verl's batch balancing, the old/ref log-prob stages, the advantage stage, the actor
    update), then the step's keys cleared (``tq.kv_clear``)."""
    trainer.global_steps = step
    if begin and step == 1 and trainer.trainer_mode != "sync":
        trainer.on_train_begin()
    trainer.timing_raw = {}
    trainer.on_step_begin()
    metrics: dict[str, Any] = {}
    batch = trainer.step(metrics, trainer.timing_raw)
    store.clear(batch.keys, batch.partition_id)
    return batch, metrics
