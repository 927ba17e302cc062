"""``trainer.v1.trainer_mode=gdro_sync``: verl's synchronous V1 trainer plus the GDRO controllers.

A subclass of ``PPOTrainerSync`` that overrides three narrow hooks of verl's step pipeline and
always calls ``super()`` (VERL.md); ``fit()`` and ``step()`` are verl's own:

- ``_init_dataloader``: validate the stable prompt ids, install :class:`GDROSampler` (all controller
  state rides in verl's ``data.pt`` checkpoint), with ``data.dataloader_num_workers=0``.
- ``_next_train_batch``: classify the step's prompts before generation and, with Rollout-GDRO on,
  write ``__rollout_n__`` per prompt (verl's agent loop reads it); the exact budget
  ``sum == prompts * rollout.n`` is asserted on every call.
- ``_compute_advantage``: open a :func:`gdro_step` with each uid's Prompt-GDRO multiplier and run
  verl's own advantage stage (which calls ``gdro_grpo``); then read per trajectory the prompt id,
  ``acc``, advantages, old/ref log-probs and response mask (padding rows skipped), update the
  controllers and add the ``gdro/`` metrics to the step's metrics. This runs before verl saves the
  step's checkpoint, so the saved controller state includes the step.

At init the whole config is validated (:func:`validate_gdro_config`) and the registrations are
checked (:func:`check_registered`), so a broken install or a bad key fails before Ray starts any
worker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf, open_dict
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn

from verl_gdro.integration.config import TRAINER_NAME, GDROSettings, to_plain, validate_gdro_config
from verl_gdro.integration.context import gdro_step, uid_keys
from verl_gdro.integration.controller import GDROController, describe_mode, group_multipliers, trajectory_rows
from verl_gdro.integration.dataset import stable_prompt_uids, uid_field
from verl_gdro.integration.sampler import GDROSampler

__all__ = ["GDROTrainerSync", "ROLLOUT_N_KEY"]

logger = logging.getLogger(__name__)

#: The per-prompt field verl's agent loop reads for the number of rollouts (v1/agent_loop_tq.py).
ROLLOUT_N_KEY = "__rollout_n__"


def _as_list(value: Any) -> list[Any]:
    """A TensorDict column (NonTensorStack / NonTensorData / tensor / array) as a Python list."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "tolist"):
        out = value.tolist()
        return out if isinstance(out, list) else [out]
    if hasattr(value, "data"):
        return list(value.data) if isinstance(value.data, (list, tuple)) else [value.data]
    return list(value)


def _int_column(value: Any) -> np.ndarray:
    """A column of integer ids (ints, numpy ints or numeric strings) as int64, in one C-level pass."""
    values = _as_list(value)
    return np.fromiter(map(int, values), dtype=np.int64, count=len(values))


def _padded_numpy(value: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """A (possibly nested/jagged) per-token field as a zero-padded float array of the given rows.

    float32 / float64 stay as they are and other dtypes (the int64 mask, bf16) become float32:
    the loss signals accumulate their sums in float64 themselves. Without padding rows (the usual
    case under the exact budget) the tensor's memory is returned without a copy. Converting every
    [N, T] field to float64 and fancy-indexing it cost ~1 s per step at 512 x 4 x 4096, more than
    the whole GRPO advantage stage (benchmarks/overhead.py).
    """
    if getattr(value, "is_nested", False):
        value = value.to_padded_tensor(0.0)
    value = value.detach().cpu()
    if value.dtype not in (torch.float32, torch.float64):
        value = value.to(torch.float32)
    out = value.numpy()
    if rows.size == out.shape[0] and np.array_equal(rows, np.arange(out.shape[0])):
        return out
    return out[rows]


@register_trainer(TRAINER_NAME)
class GDROTrainerSync(PPOTrainerSync):
    """verl's sync trainer with the online difficulty classifier, Prompt-GDRO and Rollout-GDRO."""

    def __init__(self, config: DictConfig) -> None:
        from verl_gdro.integration.plugin import check_registered

        check_registered()
        settings = validate_gdro_config(config)
        with open_dict(config):
            # Any other mode switches on verl's async machinery (ReplayBufferAsync, gen_batch_size 1,
            # TransferQueue checkpoints): we are a sync trainer registered under our own name.
            config.trainer.v1.trainer_mode = "sync"
            # The estimator only sees the `algorithm` group: give it the same gdro settings.
            if config.get("gdro") is not None:
                config.algorithm.gdro = OmegaConf.create(to_plain(config.gdro))
        super().__init__(config)
        self.gdro_settings: GDROSettings = settings
        # one line at start naming the adversaries (gdro.prompt.enable defaults to true, so
        # rollout.enable=true alone is joint mode: say so before the first step)
        self.gdro_mode_line = describe_mode(settings, int(config.actor_rollout_ref.rollout.n))
        print(self.gdro_mode_line, flush=True)
        self.gdro: GDROController | None = None
        if settings.enable:
            self.gdro = GDROController(settings, rollout_n=int(config.actor_rollout_ref.rollout.n))
        self.gdro_sampler: GDROSampler | None = None
        self._gdro_uid_field = uid_field(settings.uid_key)
        self._gdro_positions: dict[str, int] = {}
        self._gdro_time = 0.0

    # ------------------------------------------------------------------------------------------
    # 1. data loader with the stateful sampler
    # ------------------------------------------------------------------------------------------

    def _init_dataloader(self) -> None:
        super()._init_dataloader()
        if self.gdro is None:
            return
        workers = self.config.data.get("dataloader_num_workers", 0)
        if workers != 0:
            raise ValueError(
                f"data.dataloader_num_workers={workers!r} is invalid with trainer.v1.trainer_mode={TRAINER_NAME}: "
                "must be 0, or the adaptive sampler's draws run batches ahead of the controller updates"
            )
        uids = stable_prompt_uids(self.train_dataset, self.gdro_settings.uid_key)
        if self.gdro.resamples:
            mode = "resample"
        else:
            mode = "shuffle" if self.config.data.get("shuffle", True) else "sequential"
        seed = self.config.data.get("seed", None)
        self.gdro_sampler = GDROSampler(uids, self.gdro, mode=mode, seed=0 if seed is None else int(seed))
        batch_size = self.train_dataloader.batch_size  # verl's choice (gen_batch_size or train_batch_size)
        self.train_dataloader = StatefulDataLoader(
            dataset=self.train_dataset,
            batch_size=batch_size,
            num_workers=0,
            drop_last=True,
            collate_fn=collate_fn,
            sampler=self.gdro_sampler,
        )
        self.train_dataloader_it = None
        logger.info("verl-gdro: GDROSampler installed (mode=%s, %d prompts)", mode, uids.size)

    # ------------------------------------------------------------------------------------------
    # 2. classification and rollout allocation before generation
    # ------------------------------------------------------------------------------------------

    def _next_train_batch(self, num_prompts: int | None = None) -> Any:
        batch = super()._next_train_batch(num_prompts)
        if self.gdro is None:
            return batch
        t0 = time.perf_counter()  # the controller times itself; this counts the reads around it
        if self._gdro_uid_field not in batch.keys():
            raise ValueError(
                f"gdro.uid_key={self.gdro_settings.uid_key}: the prompt batch has no '{self._gdro_uid_field}' column "
                f"(columns: {sorted(batch.keys())})"
            )
        stable = _int_column(batch[self._gdro_uid_field])
        verl_uids = uid_keys(_as_list(batch["uid"]))
        self._gdro_time += time.perf_counter() - t0
        plan = self.gdro.before_generation(stable)
        if len(verl_uids) != plan.positions.size:
            raise RuntimeError(f"verl-gdro: {len(verl_uids)} uids for {plan.positions.size} planned prompts")
        self._gdro_positions.update(zip(verl_uids, plan.positions.tolist()))
        if self.gdro.rollout is not None:
            n = plan.rollout_n
            budget = len(verl_uids) * int(self.config.actor_rollout_ref.rollout.n)
            if int(n.sum()) != budget:
                raise RuntimeError(
                    f"verl-gdro: __rollout_n__ sums to {int(n.sum())} for {len(verl_uids)} prompts, not the exact "
                    f"budget {budget} = prompts * actor_rollout_ref.rollout.n"
                )
            tu.assign_non_tensor_stack(batch, ROLLOUT_N_KEY, n.tolist())
        return batch

    # ------------------------------------------------------------------------------------------
    # 3. multipliers into verl's advantage stage, then controller updates and metrics
    # ------------------------------------------------------------------------------------------

    def _read_acc(self, data: Any, rows: np.ndarray, batch: Any) -> np.ndarray:
        """Per-trajectory correctness from the reward's extra info (streaming reward: inside
        ``extra_fields.reward_extra_info``; colocated reward model: a top-level field)."""
        key = self.gdro_settings.acc_key
        values: list[Any] | None = None
        available: set[str] = set()
        if "extra_fields" in data.keys():
            infos = _as_list(data["extra_fields"])
            extra = [
                info.get("reward_extra_info", {}) if isinstance(info, dict) else {} for info in map(infos.__getitem__, rows.tolist())
            ]
            picked = [info.get(key) for info in extra]
            if None not in picked:
                values = picked
            else:  # only for the error message
                available = set().union(*extra)
        if values is None:
            try:
                top = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[key])
                if key in top.keys():
                    col = _as_list(top[key])
                    values = [col[i] for i in rows.tolist()]
            except Exception:  # the field does not exist in the store
                values = None
        if values is None or any(v is None for v in values):
            raise ValueError(
                f"gdro.acc_key={key!r} is missing from the reward output (reward_extra_info keys: "
                f"{sorted(available)}): the reward function must return a dict with the binary correctness under "
                f"'{key}' (e.g. verl's math_dapo returns 'acc'), or set gdro.acc_key to the key it uses"
            )
        return np.fromiter(map(float, values), dtype=np.float64, count=len(values))

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        if self.gdro is None:
            return super()._compute_advantage(batch, metrics)
        t0 = time.perf_counter()
        fields = ["uid", self._gdro_uid_field, "extra_fields"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        uids = uid_keys(_as_list(data["uid"]))
        padding = None
        if batch.tags is not None:
            padding = [bool(tag and tag.get("is_padding", False)) for tag in batch.tags]
        rows, group_index = trajectory_rows(uids, self._gdro_positions, padding)
        if self._gdro_uid_field in data.keys():
            stable = _int_column(data[self._gdro_uid_field])[rows]
            planned = self.gdro.planned_uids(group_index)
            if not np.array_equal(stable, planned):
                raise RuntimeError("verl-gdro: trajectories carry other stable prompt ids than their planned prompts")
        acc = self._read_acc(data, rows, batch)
        self._gdro_time += time.perf_counter() - t0
        multipliers = self.gdro.advantage_multipliers(group_index)

        table = group_multipliers(self._gdro_positions, group_index, multipliers)
        with gdro_step(table, settings=self.gdro_settings):
            batch = super()._compute_advantage(batch, metrics)

        t1 = time.perf_counter()
        extra: dict[str, np.ndarray] = {}
        needs_log_probs = self.gdro_settings.prompt.loss_signal != "failure_rate" and (
            self.gdro.prompt is not None or self.gdro.rollout is not None
        )
        if needs_log_probs:
            wanted = ["response_mask", "old_log_probs", "advantages"]
            if self.gdro_settings.prompt.loss_signal == "surrogate_kl":
                wanted.append("ref_log_prob")
            td = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=wanted)
            names = {"ref_log_prob": "ref_log_probs"}
            for field in wanted:
                if field in td.keys():
                    extra[names.get(field, field)] = _padded_numpy(td[field], rows)
        self._gdro_time += time.perf_counter() - t1
        step_metrics = self.gdro.after_advantage(group_index, acc, extra_time_s=self._gdro_time, **extra)
        self._gdro_positions.clear()
        self._gdro_time = 0.0
        metrics.update(step_metrics)
        return batch
