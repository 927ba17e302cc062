"""The update-time loss signal (``gdro.prompt.loss_signal=update_surrogate``), measured in the actor.

Per response, the token-mean clipped surrogate on the raw advantages inside the PPO update (at the
driver, ratio 1, it is zero: docs/algorithm.md section 2). :func:`gdro_ppo_loss` wraps verl's
``ppo_loss`` and adds the per-response losses and rows to the loss metrics, which verl gathers over
every rank (not rank 0's share, the release's defect); :func:`pop_update_losses` takes them out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: per-response raw GRPO advantage written next to verl's ``advantages`` for the actor
RAW_ADV_FIELD = "gdro_raw_advantages"
#: per-response row of the step's batch (the trainer maps it to the plan position), float64
ROW_FIELD = "gdro_row"
#: the loss metrics' keys (popped by the trainer before verl reduces the actor metrics)
LOSS_METRIC = "gdro_update/loss"
ROW_METRIC = "gdro_update/row"

_LOG_RATIO_CLAMP = 20.0  # verl's (and the release's) clamp of log(ratio)


@torch.no_grad()
def update_surrogate_per_response(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> np.ndarray:
    """Each response's token-mean of ``max(-A r, -A clip(r, 1 - low, 1 + high))`` on the raw advantages
    ([bs, T] or [bs]), no dual clip, KL or entropy: the release's ``per_sample_lb`` (0 for an empty mask)."""
    mask = response_mask.to(torch.float64)
    adv = advantages.to(torch.float64)
    if adv.dim() == 1:
        adv = adv[:, None]
    ratio = torch.exp((log_prob.double() - old_log_prob.double()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high))
    per = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per.cpu().numpy()


def raw_grpo_advantages(
    token_level_rewards: torch.Tensor, index: Any, norm_adv_by_std_in_grpo: bool = True
) -> torch.Tensor:
    """Per-response GRPO advantage [bs] (singletons 0), without the multiplier or clip (not divisible out)."""
    from verl.trainer.ppo import core_algos

    column = torch.ones((token_level_rewards.shape[0], 1), dtype=torch.float32)
    adv, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_level_rewards.float(),
        response_mask=column,
        index=np.asarray(index, dtype=object),
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    )
    keys = [str(u) for u in np.asarray(index, dtype=object).tolist()]
    _, inverse, sizes = np.unique(np.array(keys, dtype=object), return_inverse=True, return_counts=True)
    out = adv[:, 0].clone()
    out[torch.as_tensor(sizes[inverse] == 1)] = 0.0
    return out


def gdro_ppo_loss(config: Any, model_output: Any, data: Any, dp_group: Any = None) -> tuple[Any, dict[str, Any]]:
    """verl's ``ppo_loss``; a micro-batch with :data:`RAW_ADV_FIELD` and :data:`ROW_FIELD` adds its
    per-response losses and rows as lists, which verl's worker concatenates."""
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    if RAW_ADV_FIELD not in data.keys() or ROW_FIELD not in data.keys():
        return loss, metrics
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    sel = data.select("response_mask", "old_log_probs").to_padded_tensor()
    mask = sel["response_mask"].to(log_prob.dtype)
    raw = data[RAW_ADV_FIELD].reshape(-1)
    rows = data[ROW_FIELD].reshape(-1)
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    per = update_surrogate_per_response(log_prob.detach(), sel["old_log_probs"], raw, mask, float(low), float(high))
    metrics[LOSS_METRIC] = per.tolist()
    metrics[ROW_METRIC] = rows.detach().cpu().double().numpy().tolist()
    return loss, metrics


def _flatten(values: Any) -> list[float]:
    if isinstance(values, (np.ndarray, torch.Tensor)):
        values = values.reshape(-1).tolist() if isinstance(values, torch.Tensor) else values.tolist()
    if isinstance(values, (list, tuple)):
        return [x for v in values for x in _flatten(v)]
    return [float(values)]


def pop_update_losses(metrics: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """Take (rows, losses) out of the actor's metrics, None when verl's own loss ran."""
    if LOSS_METRIC not in metrics and ROW_METRIC not in metrics:
        return None
    losses = _flatten(metrics.pop(LOSS_METRIC, []))
    rows = _flatten(metrics.pop(ROW_METRIC, []))
    if len(losses) != len(rows):
        raise ValueError(f"the actor reported {len(losses)} update-time losses for {len(rows)} rows")
    return np.asarray(rows, dtype=np.float64).astype(np.int64), np.asarray(losses, dtype=np.float64)
