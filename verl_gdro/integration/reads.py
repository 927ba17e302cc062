"""What the GDRO trainer's hooks read from (and write to) TransferQueue around verl's stages; the
per-row numpy work on what they read is in :mod:`verl_gdro.integration.glue`."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from transfer_queue import KVBatchMeta

from verl_gdro.integration.glue import ConsumedBatch, acc_from_extra_fields, correctness, later_outputs
from verl_gdro.integration.ledger import DispatchLedger
from verl_gdro.integration.policy_loss import RAW_ADV_FIELD, ROW_FIELD, raw_grpo_advantages
from verl_gdro.step.config import GDROSettings
from verl_gdro.step.context import uid_keys

__all__ = ["as_list", "int_column", "observe_removed", "padded_numpy", "put_update_fields", "read_acc", "token_fields",
           "tq_prompt_groups"]

logger = logging.getLogger("verl_gdro.integration.trainer")  # the trainer's messages, under its name


def as_list(value: Any) -> list[Any]:
    """A TensorDict column (NonTensorStack / NonTensorData / tensor / array) as a Python list."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "tolist"):
        out = value.tolist()
        return out if isinstance(out, list) else [out]
    if hasattr(value, "data"):
        return list(value.data) if isinstance(value.data, (list, tuple)) else [value.data]
    return list(value)


def int_column(value: Any) -> np.ndarray:
    """A column of integer ids (ints, numpy ints or numeric strings) as int64, in one C-level pass (a 1-D
    object or integer array through ``astype``, which calls ``int`` per item)."""
    if isinstance(value, np.ndarray) and value.ndim == 1 and (value.dtype == object or value.dtype.kind == "i"):
        return value.astype(np.int64)
    values = as_list(value)
    return np.fromiter(map(int, values), dtype=np.int64, count=len(values))


def padded_numpy(value: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """A (possibly nested/jagged) per-token field as a zero-padded float array of the given rows: float32
    and float64 as they are, other dtypes as float32 (the loss signals sum in float64), and without a copy
    when ``rows`` are all rows (a float64 copy of every [N, T] field cost more than the whole GRPO stage)."""
    if getattr(value, "is_nested", False):
        value = value.to_padded_tensor(0.0)
    value = value.detach().cpu()
    if value.dtype not in (torch.float32, torch.float64):
        value = value.to(torch.float32)
    out = value.numpy()
    if rows.size == out.shape[0] and np.array_equal(rows, np.arange(out.shape[0])):
        return out
    return out[rows]


def tq_prompt_groups(partition_id: str = "train") -> list[str]:
    """verl uids of the prompt groups a TransferQueue partition holds in flight (as verl's
    ``_count_tq_prompt_groups`` counts them)."""
    data = tq.kv_list(partition_id)
    items = data.get(partition_id, {}) if data else {}
    return [key for key, tag in items.items() if tag.get("is_prompt", False)]


def read_acc(settings: GDROSettings, data: Any, rows: np.ndarray, keys: list[str], partition_id: str) -> np.ndarray:
    """Per-trajectory correctness from the reward's extra info (``extra_fields.reward_extra_info``, else a
    top-level field), thresholded at ``gdro.correct_threshold``."""
    key = settings.acc_key
    available: set[str] = set()
    if "extra_fields" in data.keys():
        found, available = acc_from_extra_fields(as_list(data["extra_fields"]), rows, key)
        if found is not None:
            return correctness(found, settings.correct_threshold, f"gdro.acc_key={key!r}")
    values: list[Any] | None = None
    try:
        top = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=[key])
        if key in top.keys():
            col = as_list(top[key])
            values = [col[i] for i in rows.tolist()]
    except Exception:  # the field does not exist in the store
        values = None
    if values is None or any(v is None for v in values):
        raise ValueError(f"gdro.acc_key={key!r} is missing from the reward output (reward_extra_info keys: "
                         f"{sorted(available)}): the reward function must return a dict with the binary correctness "
                         f"under '{key}' (e.g. verl's math_dapo returns 'acc'), or set gdro.acc_key to the key it uses")
    return correctness(np.asarray(values, dtype=np.float64), settings.correct_threshold, f"gdro.acc_key={key!r}")


def observe_removed(ledger: DispatchLedger, settings: GDROSettings, partition_id: str, keys: dict[str, list[str]],
                    reasons: dict[str, str], warned: bool) -> bool:
    """Record the correctness of groups the replay buffer is about to delete; returns whether the
    missing-correctness warning has been given."""
    known = [u for u in keys if u in ledger.entries]
    unknown = len(keys) - len(known)
    if unknown:
        logger.warning("verl-gdro: %d removed group(s) were not dispatched by this run's GDRO trainer", unknown)
    keys = dict(keys)  # later outputs left out (later_outputs); the buffer's own lists stay as they are
    for u in known:
        later = later_outputs(keys[u])
        if later is not None:
            keys[u] = [k for k, extra in zip(keys[u], later.tolist(), strict=True) if not extra]
    flat = [k for u in known for k in keys[u]]
    acc: np.ndarray | None = None
    if flat:
        data = tq.kv_batch_get(keys=flat, partition_id=partition_id, select_fields=["extra_fields"])
        try:
            acc = read_acc(settings, data, np.arange(len(flat)), flat, partition_id)
        except ValueError as e:  # e.g. a colocated reward model has not scored evicted groups: lost
            if not warned:
                logger.warning("verl-gdro: removed groups without correctness are not observed: %s", e)
                warned = True
    pos = 0
    for uid in known:
        count = len(keys[uid])
        values = [] if acc is None else acc[pos : pos + count].tolist()
        pos += count
        ledger.drop(uid, values, reasons[uid])
    return warned


def token_fields(needed: tuple[str, ...], batch: KVBatchMeta, consumed: ConsumedBatch) -> dict[str, np.ndarray]:
    """The [N, T] fields the surrogate loss signals read (``needed``: the controller's ``token_fields``)
    for the trained rows and, zero-masked, the rows of groups removed untrained."""
    dropped_rows = consumed.dropped()[0].size
    extra: dict[str, np.ndarray] = {}
    wanted = ["response_mask", "old_log_probs", "advantages"]
    if "ref_log_probs" in needed:
        wanted.append("ref_log_prob")
    td = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=wanted)
    names = {"ref_log_prob": "ref_log_probs"}
    for field in wanted:
        if field in td.keys():
            arr = padded_numpy(td[field], consumed.rows)
            if dropped_rows:  # removed groups reached no log-prob stage: a zero mask zeroes their terms
                arr = np.concatenate([arr, np.zeros((dropped_rows, arr.shape[1]), dtype=arr.dtype)])
            extra[names.get(field, field)] = arr
    return extra


def put_update_fields(batch: KVBatchMeta, consumed: ConsumedBatch, reward_field: str,
                      norm_by_std: bool) -> tuple[KVBatchMeta, np.ndarray]:
    """Write each row's raw GRPO advantage and row index for the actor's loss
    (:func:`~verl_gdro.integration.policy_loss.gdro_ppo_loss`); return the batch and each row's plan
    position (-1: padding), which the trainer reads back after the update."""
    from tensordict import TensorDict

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", reward_field])
    rewards = data[reward_field]
    if getattr(rewards, "is_nested", False):
        rewards = rewards.to_padded_tensor(0.0)
    scores = rewards.float().reshape(rewards.shape[0], -1).sum(-1, keepdim=True)
    raw = raw_grpo_advantages(scores, uid_keys(as_list(data["uid"])), norm_by_std)
    positions = np.full(len(batch), -1, dtype=np.int64)
    positions[consumed.rows] = consumed.group_index
    rows = torch.arange(len(batch), dtype=torch.float64)
    fields = TensorDict({RAW_ADV_FIELD: raw.to(torch.float32), ROW_FIELD: rows}, batch_size=len(batch))
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields), positions
