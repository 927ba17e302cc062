"""The GDRO trainers: verl's V1 trainers (sync, colocate_async, separate_async) plus the GDRO controllers.

:class:`GDROTrainerMixin` on each of verl's V1 trainer classes overrides narrow hooks of verl's step
pipeline, always calling ``super()`` (``fit()`` and ``step()`` stay verl's; docs/integration.md, "2. The
GDRO trainer"), sequencing the reads (:mod:`.reads`), the numpy glue (:mod:`.glue`) and the ledger.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

import numpy as np
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf, open_dict
from torchdata.stateful_dataloader import StatefulDataLoader
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.dataset.rl_dataset import collate_fn

from verl_gdro.integration.dataset import stable_prompt_uids, uid_field
from verl_gdro.integration.glue import (
    ConsumedBatch,
    consume,
    filter_note,
    first_measurements,
    observe_update,
)
from verl_gdro.integration.ledger import DispatchLedger, ResumedLedger
from verl_gdro.integration.policy_loss import gdro_ppo_loss, pop_update_losses
from verl_gdro.integration.reads import as_list as _as_list
from verl_gdro.integration.reads import int_column as _int_column
from verl_gdro.integration.reads import (
    observe_removed,
    put_update_fields,
    read_acc,
    token_fields,
    tq_prompt_groups,
)
from verl_gdro.integration.registry import check_registered
from verl_gdro.integration.replay_buffer import with_observer
from verl_gdro.integration.sampler import GDROSampler, sampler_for, step_draw_metrics
from verl_gdro.step.config import TRAINER_MODES, TRAINER_NAME, GDROSettings, validate_gdro_config
from verl_gdro.step.context import gdro_step, uid_keys
from verl_gdro.step.controller import GDROController, describe_mode

logger = logging.getLogger(__name__)

#: The per-prompt field verl's agent loop reads for the number of rollouts (v1/agent_loop_tq.py).
ROLLOUT_N_KEY = "__rollout_n__"


class GDROTrainerMixin:
    """GDRO for a verl V1 trainer class (first in the bases); subclasses set :attr:`GDRO_MODE` and register."""

    GDRO_MODE: str = TRAINER_NAME

    def __init__(self, config: DictConfig) -> None:
        check_registered()
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.GDRO_MODE
        settings = validate_gdro_config(config)
        with open_dict(config):
            # verl switches its async machinery on trainer_mode != "sync" and reads trainer.v1.<mode>
            config.trainer.v1.trainer_mode = TRAINER_MODES[self.GDRO_MODE]
            # the resolved settings replace the group (logged) and go to algorithm.gdro (the estimator's)
            config.gdro = OmegaConf.create(settings.to_dict())
            config.algorithm.gdro = OmegaConf.create(settings.to_dict())
        self.gdro_settings: GDROSettings = settings  # read by _build_replay_buffer, inside verl's __init__
        super().__init__(config)  # type: ignore[call-arg]
        with open_dict(config):  # verl has read its mode: the config it logs names the GDRO mode
            config.trainer.v1.trainer_mode = self.GDRO_MODE
        # one line at start naming the adversaries (both are on by default)
        self.gdro_mode_line = describe_mode(settings, int(config.actor_rollout_ref.rollout.n)) + filter_note(config)
        print(self.gdro_mode_line, flush=True)
        self.gdro: GDROController | None = None
        if settings.enable:
            self.gdro = GDROController(settings, rollout_n=int(config.actor_rollout_ref.rollout.n))
        self.gdro_sampler: GDROSampler | None = None
        self.gdro_ledger = DispatchLedger()
        self._gdro_uid_field = uid_field(settings.uid_key)
        # what verl's _compute_advantage passes to grpo, handed to gdro_grpo through the step
        self._gdro_norm_by_std = bool(config.algorithm.get("norm_adv_by_std_in_grpo", True))
        self._gdro_time = 0.0
        self._gdro_warned_missing_acc = False
        self._gdro_batch_price: float | None = None  # per_prompt: the price of the step's batch allocation
        # update_surrogate: the plan position of each row of the step's batch (-1 = padding)
        self._gdro_row_positions = np.zeros(0, dtype=np.int64)
        if self.gdro is not None:
            self.replay_buffer.gdro_observer = self._gdro_observe_removed

    def _build_replay_buffer(self) -> Any:
        buffer = super()._build_replay_buffer()  # type: ignore[misc]
        if not self.gdro_settings.enable:
            return buffer  # GDRO off: verl's buffer (or the user's custom_sampler) as it is
        return with_observer(buffer, None)

    def _gdro_observe_removed(self, partition_id: str, keys: dict[str, list[str]], reasons: dict[str, str]) -> None:
        """Record the groups the replay buffer is about to delete (:func:`observe_removed`)."""
        t0 = time.perf_counter()
        self._gdro_warned_missing_acc = observe_removed(self.gdro_ledger, self.gdro_settings, partition_id, keys,
                                                        reasons, self._gdro_warned_missing_acc)
        self._gdro_time += time.perf_counter() - t0

    def _init_dataloader(self) -> None:
        super()._init_dataloader()  # type: ignore[misc]
        if self.gdro is None:
            return
        # data.dataloader_num_workers is 0: validate_gdro_config refused any other value at __init__
        uids = stable_prompt_uids(self.train_dataset, self.gdro_settings.uid_key)
        batch_size = self.train_dataloader.batch_size  # verl's choice (gen_batch_size or train_batch_size)
        self.gdro_sampler = sampler_for(self.gdro, uids, self.config.data, int(batch_size))
        # the dispatch ledger rides in data.pt and, on load, keeps only the groups verl holds
        self.gdro_sampler.companions["ledger"] = ResumedLedger(self.gdro_ledger, in_flight=tq_prompt_groups)
        self.train_dataloader = StatefulDataLoader(dataset=self.train_dataset, batch_size=batch_size, num_workers=0,
                                                   drop_last=True, collate_fn=collate_fn, sampler=self.gdro_sampler)
        self.train_dataloader_it = None
        logger.info("verl-gdro: GDROSampler installed (mode=%s, %d prompts)", self.gdro_sampler.mode, uids.size)

    def _next_train_batch(self, num_prompts: int | None = None) -> Any:
        if self.gdro_sampler is not None:
            # one draw per generation call, whatever verl's loader batch size (docs/integration.md)
            size = int(self.config.data.train_batch_size) if num_prompts is None else int(num_prompts)
            self.gdro_sampler.begin_call(size, self.gdro_ledger.held_stable_uids)
        batch = super()._next_train_batch(num_prompts)  # type: ignore[misc]
        if self.gdro is None:
            return batch
        t0 = time.perf_counter()  # the controller times itself; this counts the reads around it
        if self._gdro_uid_field not in batch.keys():
            raise ValueError(f"gdro.uid_key={self.gdro_settings.uid_key}: the prompt batch has no "
                             f"'{self._gdro_uid_field}' column (columns: {sorted(batch.keys())})")
        stable = _int_column(batch[self._gdro_uid_field])
        verl_uids = uid_keys(_as_list(batch["uid"]))
        self._gdro_time += time.perf_counter() - t0
        plan = self.gdro.decide(stable)
        n = plan.rollout_n
        budget = len(verl_uids) * int(self.config.actor_rollout_ref.rollout.n)
        if int(n.sum()) != budget:
            raise RuntimeError(f"verl-gdro: __rollout_n__ sums to {int(n.sum())} for {len(verl_uids)} prompts, not "
                               f"the exact budget {budget} = prompts * actor_rollout_ref.rollout.n")
        self.gdro_ledger.dispatch(verl_uids, plan.uids, plan.bins, n, step=int(self.global_steps))
        if num_prompts is None and self.gdro.rollout is not None and self.gdro.rollout.prices_at_plan:
            # the step's own batch (verl's prepare_step), not a refill: gdro/shadow_price reports it
            self._gdro_batch_price = float(self.gdro.rollout.mu)
        if self.gdro.rollout is not None:
            tu.assign_non_tensor_stack(batch, ROLLOUT_N_KEY, n.tolist())  # Python ints
        return batch

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if self.gdro is None:
            return super()._compute_advantage(batch, metrics)  # type: ignore[misc]
        t0 = time.perf_counter()
        fields = ["uid", self._gdro_uid_field, "extra_fields"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        uids = uid_keys(_as_list(data["uid"]))
        consumed = consume(self.gdro_ledger, self.gdro, uids, None if batch.tags is None else list(batch.tags),
                           keys=list(batch.keys))
        rows, group_index = consumed.rows, consumed.group_index
        if self._gdro_uid_field in data.keys():
            stable = _int_column(data[self._gdro_uid_field])[rows]
            if not np.array_equal(stable, self.gdro.planned_uids(group_index)):
                raise RuntimeError("verl-gdro: trajectories carry other stable prompt ids than their planned prompts")
        acc = read_acc(self.gdro_settings, data, rows, batch.keys, batch.partition_id)
        self._gdro_time += time.perf_counter() - t0
        multipliers = self.gdro.advantage_multipliers(group_index)
        # the per-row view of the batch; the per-group table only when the batch has padding rows
        table, row_plan = consumed.estimator_inputs(multipliers)
        needs_log_probs = bool(self.gdro.token_fields)
        if not needs_log_probs:
            # an outcome-only signal: update now (the same values as after verl's estimator), caches warm
            metrics.update(self._gdro_update(consumed, acc, {}))
        with gdro_step(table, settings=self.gdro_settings, rows=row_plan, norm_adv_by_std=self._gdro_norm_by_std):
            batch = super()._compute_advantage(batch, metrics)  # type: ignore[misc]
        if needs_log_probs:
            t1 = time.perf_counter()
            fields = token_fields(self.gdro.token_fields, batch, consumed)
            self._gdro_time += time.perf_counter() - t1
            metrics.update(self._gdro_update(consumed, acc, fields))
        if self.gdro.wants_update_losses:  # each row's raw GRPO advantage and plan position for the actor's loss
            t2 = time.perf_counter()
            reward_field = "token_level_rewards" if self.config.algorithm.get("use_kl_in_reward", False) else "rm_scores"
            batch, self._gdro_row_positions = put_update_fields(batch, consumed, reward_field, self._gdro_norm_by_std)
            self._gdro_time += time.perf_counter() - t2
        return batch

    def on_init_end(self) -> None:
        super().on_init_end()  # type: ignore[misc]
        if self.gdro is None or not self.gdro.wants_update_losses:
            return
        if self.config.get("distillation") is not None and self.config.distillation.get("enable", False):
            raise ValueError("gdro.prompt.loss_signal=update_surrogate is invalid with distillation: the actor's loss "
                             "is then verl's distillation loss, which verl-gdro does not wrap")
        # verl's own actor loss with the update-time losses in its metrics, set as verl sets the critic's
        actor_cfg = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(partial(gdro_ppo_loss, config=actor_cfg))
        logger.info("verl-gdro: the actor's loss reports the update-time loss signal (update_surrogate)")

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if self.gdro is None or not self.gdro.wants_update_losses:
            return super()._update_actor(batch, metrics)  # type: ignore[misc]
        wg = self.actor_rollout_wg
        update = wg.update_actor
        taken: list[tuple[np.ndarray, np.ndarray]] = []

        def update_and_take(data: Any, *args: Any, **kwargs: Any) -> Any:
            out = update(data, *args, **kwargs)
            got = pop_update_losses(out["metrics"])  # before verl averages the actor's metrics
            if got is not None:
                taken.append(got)
            return out

        wg.update_actor = update_and_take
        try:
            batch = super()._update_actor(batch, metrics)  # type: ignore[misc]
        finally:
            wg.update_actor = update
        if not taken:
            raise RuntimeError("verl-gdro: the actor reported no update-time losses "
                               "(gdro.prompt.loss_signal=update_surrogate); was its loss replaced after init?")
        group_index, losses = first_measurements(*taken[0], self._gdro_row_positions)
        metrics.update(self.gdro.after_update(group_index, losses))
        return batch

    def _gdro_update(self, consumed: ConsumedBatch, acc: np.ndarray, extra: dict[str, np.ndarray]) -> dict[str, float]:
        """:func:`observe_update` with the reads timed so far counted as controller time."""
        step_metrics = observe_update(self.gdro_ledger, self.gdro, consumed, acc, int(self.global_steps),
                                      extra_time_s=self._gdro_time, **extra)
        self._gdro_time = 0.0
        step_metrics.update(step_draw_metrics(self.gdro_sampler, self._gdro_batch_price))
        # verl's own timing section (timing_s/gdro): fit() hands self.timing_raw to the step
        timing = getattr(self, "timing_raw", None)
        if isinstance(timing, dict):
            timing["gdro"] = timing.get("gdro", 0.0) + float(step_metrics.get("gdro/controller_time_s", 0.0))
        return step_metrics


@register_trainer(TRAINER_NAME)
class GDROTrainerSync(GDROTrainerMixin, PPOTrainerSync):
    """verl's sync trainer with the online difficulty classifier, Prompt-GDRO and Rollout-GDRO."""

    GDRO_MODE = TRAINER_NAME


@register_trainer("gdro_colocate_async")
class GDROTrainerColocateAsync(GDROTrainerMixin, PPOTrainerColocateAsync):
    """verl's colocated async trainer (partial rollouts, warm-up batches) with GDRO."""

    GDRO_MODE = "gdro_colocate_async"


@register_trainer("gdro_separate_async")
class GDROTrainerSeparateAsync(GDROTrainerMixin, PPOTrainerSeparateAsync):
    """verl's separate async trainer (standalone rollout pool) with GDRO."""

    GDRO_MODE = "gdro_separate_async"
