"""The ``gdro_grpo`` advantage estimator: verl's GRPO per uid, times the Prompt-GDRO multipliers
(docs/integration.md, "What gdro_grpo computes, exactly"), from the open
:func:`~verl_gdro.step.context.gdro_step`, else **standalone** (docs/integration.md, "1. Estimator only").
"""

from __future__ import annotations

import logging
import time
from itertools import repeat
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from verl_gdro.classifier import raw_bin
from verl_gdro.integration.estimator_keys import estimator_path_settings, read_key
from verl_gdro.integration.glue import correctness
from verl_gdro.metrics import step_metrics
from verl_gdro.prompt_gdro import PromptGDRO
from verl_gdro.prompt_modes import get_prompt_mode
from verl_gdro.step.config import ESTIMATOR_NAME, GDROSettings, resolve_gdro
from verl_gdro.step.context import PADDING_UID_PREFIX, current_step, uid_keys

#: version of :func:`export_standalone`'s layout
STANDALONE_STATE_VERSION = 1

logger = logging.getLogger(__name__)


class _Standalone:
    """Prompt-GDRO state kept in the trainer process when no GDRO trainer drives the estimator."""

    def __init__(self) -> None:
        self.settings: GDROSettings | None = None
        self.prompt: PromptGDRO | None = None
        self.steps = 0
        self.logged = False
        self.last: dict[str, Any] = {}
        self.metrics: dict[str, float] = {}  # the last step's, until pop_standalone_metrics
        self.pending: dict[str, Any] | None = None  # import_standalone's, applied when the controller is built

    def controller(self, settings: GDROSettings) -> PromptGDRO:
        if self.prompt is None or self.settings != settings:
            if self.prompt is not None:
                logger.warning("gdro_grpo (standalone): gdro settings changed; Prompt-GDRO state restarts")
            self.settings = settings
            self.prompt = PromptGDRO(**settings.prompt.kwargs(settings.num_bins))
            self.steps = 0
            state, self.pending = self.pending, None
            if state is not None and state.get("settings") != settings.to_dict():
                logger.warning("gdro_grpo (standalone): the checkpoint's Prompt-GDRO state was saved under other "
                               "algorithm.gdro settings; it restarts from scratch")
            elif state is not None:
                prompt = dict(state["prompt"])
                prompt["scores"] = np.asarray(prompt["scores"], dtype=np.float64)
                prompt["observed"] = np.asarray(prompt["observed"], dtype=bool)
                self.prompt.load_state_dict(prompt)
                self.steps = int(state["steps"])
                logger.info("gdro_grpo (standalone): Prompt-GDRO state restored at its step %d", self.steps)
        return self.prompt


_STANDALONE = _Standalone()


def standalone_state() -> dict[str, Any]:
    """Standalone mode's Prompt-GDRO state, steps run and the last step's bins (introspection)."""
    prompt = None if _STANDALONE.prompt is None else _STANDALONE.prompt.state_dict()
    return {"steps": _STANDALONE.steps, "prompt": prompt, "last": dict(_STANDALONE.last)}


def export_standalone() -> dict[str, Any] | None:
    """The standalone state as plain JSON values (None before the first step), for the checkpoint callback."""
    if _STANDALONE.prompt is None or _STANDALONE.settings is None:
        return None
    prompt = _STANDALONE.prompt.state_dict()
    prompt["scores"] = prompt["scores"].tolist()
    prompt["observed"] = prompt["observed"].tolist()
    return {"version": STANDALONE_STATE_VERSION, "settings": _STANDALONE.settings.to_dict(), "prompt": prompt,
            "steps": _STANDALONE.steps}


def import_standalone(state: dict[str, Any]) -> None:
    """Restore :func:`export_standalone` output at the first step (state of other settings: a warning)."""
    if state.get("version") != STANDALONE_STATE_VERSION:
        raise ValueError(f"gdro_grpo standalone state version {state.get('version')!r} is not {STANDALONE_STATE_VERSION}")
    _STANDALONE.prompt = None
    _STANDALONE.settings = None
    _STANDALONE.pending = dict(state)


def pop_standalone_metrics() -> dict[str, float]:
    """The ``gdro/`` metrics of the standalone estimator's last step, once (then empty)."""
    out, _STANDALONE.metrics = _STANDALONE.metrics, {}
    return out


def reset_standalone() -> None:
    """Forget the standalone state (a new run in the same process; tests)."""
    global _STANDALONE
    _STANDALONE = _Standalone()


def _settings_from(config: Any, standalone: bool = False) -> GDROSettings:
    return estimator_path_settings(config) if standalone else resolve_gdro(read_key(config, "gdro"))


def _group_ids(keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(inverse group id per row, group sizes, is-padding and uid per group), in order of first appearance."""
    groups = list(dict.fromkeys(keys))
    table = dict(zip(groups, range(len(groups))))
    inverse = np.fromiter(map(table.__getitem__, keys), dtype=np.int64, count=len(keys))
    sizes = np.bincount(inverse, minlength=len(groups))
    padding = np.fromiter(map(str.startswith, groups, repeat(PADDING_UID_PREFIX)), dtype=bool, count=len(groups))
    return inverse, sizes, padding, groups


def _standalone_multipliers(scores: np.ndarray, inverse: np.ndarray, padding: np.ndarray,
                            settings: GDROSettings) -> np.ndarray:
    """Standalone: groups binned by their own correctness; multipliers from S_{t-1}, then S updated."""
    if not get_prompt_mode(settings.prompt.mode).scales_advantages:
        raise ValueError(f"algorithm.gdro.prompt.mode={settings.prompt.mode} is invalid for the standalone gdro_grpo "
                         "estimator: only the GDRO trainer's sampler can draw the prompts; use "
                         "trainer.v1.trainer_mode=gdro_sync or algorithm.gdro.prompt.mode=reweight")
    if settings.rollout.enable:
        raise ValueError("algorithm.gdro.rollout.enable=True is invalid for the standalone gdro_grpo estimator: "
                         "Rollout-GDRO chooses rollouts before generation; use trainer.v1.trainer_mode=gdro_sync")
    if not _STANDALONE.logged:
        logger.warning("gdro_grpo runs STANDALONE (no GDRO trainer step open): each prompt is binned by its own "
                       "group's correctness this step (outcome reward > algorithm.gdro.correct_threshold=%s), "
                       "Prompt-GDRO state is kept in this process, loss signal = failure rate (preset %s). Use "
                       "trainer.v1.trainer_mode=gdro_sync for the online classifier, the preset's loss signal and "
                       "Rollout-GDRO.", settings.correct_threshold, settings.preset)
        _STANDALONE.logged = True
    t0 = time.perf_counter()
    prompt = _STANDALONE.controller(settings)
    num_groups = padding.size
    valid_row = ~padding[inverse]
    correct = correctness(scores, settings.correct_threshold, "gdro_grpo outcome reward")
    sums = np.bincount(inverse[valid_row], weights=correct[valid_row], minlength=num_groups)
    counts = np.bincount(inverse[valid_row], minlength=num_groups)
    real = counts > 0
    rate = np.divide(sums, counts, out=np.zeros(num_groups), where=real)
    group_bins = raw_bin(rate, np.asarray(settings.classifier.inner_edges(), dtype=np.float64))

    mult = np.ones(scores.shape[0])
    row_bins = group_bins[inverse[valid_row]]
    mult[valid_row] = prompt.multipliers(row_bins)
    weights = prompt.bin_multipliers(row_bins) if row_bins.size else np.ones(settings.num_bins)
    update = prompt.update(group_bins[real], 1.0 - rate[real])
    _STANDALONE.steps += 1
    _STANDALONE.last = {"group_bins": group_bins[real].copy(), "group_success_rate": rate[real].copy()}
    if not real.any():
        return mult
    _STANDALONE.metrics = step_metrics(settings.num_bins, group_bins[real], sums[real], counts[real].astype(np.float64),
                                       prompt_weights=weights, q=prompt.bin_probs(), scores=prompt.scores,
                                       omega=prompt.omega(), bin_losses=update.get("mean_losses"),
                                       controller_time_s=time.perf_counter() - t0,
                                       dropped_nonfinite_total=int(prompt.dropped_nonfinite))
    _STANDALONE.metrics["gdro/standalone_steps"] = float(_STANDALONE.steps)
    return mult


def _planned_rows(rows: Any, token_level_rewards: torch.Tensor,
                  response_mask: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The row plan's singleton rows and multiplier column (or None), prepared while the caches are warm."""
    singleton_rows = torch.as_tensor(rows.singleton) if rows.any_singleton else None
    if rows.all_ones or not token_level_rewards.dtype.is_floating_point:
        return singleton_rows, None  # integer rewards: multiplied afterwards, as on the table path
    # the dtype of verl's last line: scores (the rewards' float dtype) times the mask column
    dtype = torch.promote_types(token_level_rewards.dtype, response_mask.dtype)
    if dtype == torch.float32 and response_mask.device.type == "cpu":  # prepared by the RowPlan
        return singleton_rows, torch.from_numpy(rows.multipliers_f32)[:, None]
    return singleton_rows, torch.as_tensor(rows.multipliers, dtype=dtype, device=response_mask.device)[:, None]


def _table_multipliers(advantages: torch.Tensor, index: np.ndarray, step: Any, settings: GDROSettings,
                       token_level_rewards: torch.Tensor) -> np.ndarray | None:
    """No row plan: group rows by uid, zero singletons in place; each row's multiplier, or None for ones."""
    keys = uid_keys(index)  # str per row, once
    inverse, sizes, padding, groups = _group_ids(keys)
    singleton = sizes[inverse] == 1
    if singleton.any():
        advantages[torch.as_tensor(singleton)] = 0.0
    if step is not None:
        # one lookup per group (every row of a group has its multiplier), spread to the rows
        return None if step.all_ones() else step.lookup(groups)[inverse]
    if settings.enable and settings.prompt.enable:
        scores = token_level_rewards.sum(dim=-1).detach().cpu().double().numpy()
        return _standalone_multipliers(scores, inverse, padding, settings)
    return None


@core_algos.register_adv_est(ESTIMATOR_NAME)
def compute_gdro_grpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                index: np.ndarray | None = None, config: Any = None, epsilon: float = 1e-6,
                                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage per uid (verl's function), singleton groups zeroed, times the
    Prompt-GDRO multiplier of each group. Returns ``(advantages, returns)``, both [bs, T], masked."""
    if index is None:
        raise ValueError("gdro_grpo needs the per-response uid (verl passes index=uid); got index=None")
    step = current_step()
    # inside a step the caller hands over its resolved settings (validated at init to equal algorithm.gdro)
    use_step = step is not None and step.settings is not None
    settings = step.settings if use_step else _settings_from(config, standalone=step is None)
    rows = step.rows if step is not None else None
    planned = rows is not None and rows.matches(index)
    reweighted = planned and not rows.all_ones
    singleton_rows, scale = _planned_rows(rows, token_level_rewards, response_mask) if planned else (None, None)
    # verl's GRPO uses the mask only in its last line: handed a [bs, 1] column it returns the advantages
    # times it, the same bits in one [bs, T] pass instead of two; the mask is applied once at the end
    column = scale if scale is not None else torch.ones((response_mask.shape[0], 1), dtype=response_mask.dtype,
                                                        device=response_mask.device)
    if step is not None and step.norm_adv_by_std is not None:
        norm_by_std = step.norm_adv_by_std
    else:
        norm_by_std = config is None or bool(read_key(config, "norm_adv_by_std_in_grpo", True))
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_level_rewards, response_mask=column, index=index, epsilon=epsilon,
        norm_adv_by_std_in_grpo=norm_by_std, config=config)
    mult: np.ndarray | None = None
    if planned:
        if singleton_rows is not None:
            advantages[singleton_rows] = 0.0
        if reweighted and scale is None:  # integer rewards: multiplied below, as on the table path
            mult = rows.multipliers
    else:
        mult = _table_multipliers(advantages, index, step, settings, token_level_rewards)
    if mult is not None and not np.all(mult == 1.0):
        advantages = advantages * torch.as_tensor(mult, dtype=advantages.dtype, device=advantages.device)[:, None]
    if settings.advantage_clip is not None:
        # the paper's clip (Appendix A), after the multipliers: it bounds a capped weight's effect on one response
        advantages = advantages.clamp(-settings.advantage_clip, settings.advantage_clip)
    advantages = advantages * response_mask
    return advantages, advantages
