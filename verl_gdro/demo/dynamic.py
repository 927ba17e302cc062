"""DAPO's dynamic sampling in the CPU study: verl's ``algorithm.filter_groups``, one step at a time.

What verl does (``algorithm.filter_groups.{enable, metric, max_num_gen_batches}``,
``data.gen_batch_size``): generate the step's prompts, drop every group whose filter metric is the
same for all its responses (no GRPO signal), and generate more until ``train_batch_size`` groups
are kept; the kept groups beyond ``train_batch_size`` are discarded. How much it refills:

- ``gen_batch_size=0`` (the study's default): verl 0.9.1's V1 sync replay buffer, which the
  ``gdro_*`` trainers extend: each dropped group earns a credit of two prompts, and a refill
  dispatches the credit up to one batch in flight (``max_inflight_gen_batches=1``), the rest
  carried (:meth:`DynamicSampling.refill_size`). verl dispatches as groups finish; the study
  models it in rounds (one generation call each: the wall-clock cost on GPUs);
- ``gen_batch_size>0``: the DAPO recipe, whole calls of ``gen_batch_size`` prompts.

``max_num_gen_batches`` bounds the calls per step (0: no limit; verl's V1 buffer ignores it, the
recipe raises at it). At the bound the study trains on the groups it kept (a short batch, logged as
``train/short_batch``) so a long run is not lost to one hard step. A step also stops when every
training prompt was drawn once in it (refills draw distinct prompts). Every generated rollout
costs a rollout, trained or not, so the study counts them all.

The refills go through the same path as the step's first batch: the prompts are drawn excluding
the step's earlier ones (the GDRO sampler under a sampling mode, the epoch order otherwise), and
each call is classified and allocated with :meth:`GDROController.decide` at the controller state
of that moment; the trained and the filtered groups are then adopted into one plan
(:meth:`GDROController.adopt`) and observed once, as the ``gdro_sync`` trainer does
(``verl_gdro/integration/trainer.py``).

numpy and the demo's torch model only; no verl.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .model import Rollouts
from .task import Problem

__all__ = [
    "GenCall",
    "cat_rollouts",
    "informative_groups",
    "select_trained",
    "take_rows",
]

@dataclass
class GenCall:
    """One generation call: its prompts, dispatch-time decisions and scored responses."""

    problems: list[Problem]
    bins: np.ndarray  # [G] the classifier's bins at dispatch (GDROController.decide)
    rollout_n: np.ndarray  # [G] responses per prompt
    rollouts: Rollouts  # [sum n] rows, group-major
    acc: np.ndarray  # [sum n] binary correctness
    reward: np.ndarray  # [sum n] verl's math_dapo score (+-1)

    @property
    def group_of_row(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.problems)), self.rollout_n)

    def informative(self, metric: str) -> np.ndarray:
        """[G] True where the group's filter metric is not the same for every response."""
        values = self.acc if metric == "acc" else self.reward
        return informative_groups(values, self.group_of_row, len(self.problems))


def informative_groups(values: np.ndarray, group_of_row: np.ndarray, num_groups: int) -> np.ndarray:
    """[G] verl's filter, negated: a group is dropped when it has more than one response and their
    metric values are all equal (``len(values) > 1 and np.std(values) == 0``); a group of one
    response is always kept."""
    v = np.asarray(values, dtype=np.float64)
    g = np.asarray(group_of_row, dtype=np.int64)
    size = np.bincount(g, minlength=num_groups)
    lo = np.full(num_groups, np.inf)
    hi = np.full(num_groups, -np.inf)
    np.minimum.at(lo, g, v)
    np.maximum.at(hi, g, v)
    return (size <= 1) | (hi > lo)


def select_trained(informative: np.ndarray, train_batch: int) -> np.ndarray:
    """[G] the trained groups: the first ``train_batch`` informative ones in generation order (the
    recipe keeps the batch's first rows); later informative groups are the discarded surplus."""
    inf = np.asarray(informative, dtype=bool)
    return inf & (np.cumsum(inf) <= train_batch)


def cat_rollouts(parts: Sequence[Rollouts], pad_id: int) -> Rollouts:
    """The calls' rows as one batch: prompts left-padded to the widest (position ids come from the
    mask, so padding changes no token's position); one call is returned as it is."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.prompts.shape[1] for p in parts)
    prompts, masks = [], []
    for p in parts:
        extra = width - p.prompts.shape[1]
        prompts.append(torch.nn.functional.pad(p.prompts, (extra, 0), value=pad_id))
        masks.append(torch.nn.functional.pad(p.prompt_mask, (extra, 0), value=0))
    return Rollouts(
        torch.cat(prompts), torch.cat(masks), torch.cat([p.responses for p in parts]),
        torch.cat([p.response_mask for p in parts]),
    )


def take_rows(ro: Rollouts, rows: np.ndarray) -> Rollouts:
    """The rows ``rows`` of ``ro`` (all of them, in order: ``ro`` itself)."""
    if rows.size == ro.responses.shape[0] and np.array_equal(rows, np.arange(rows.size)):
        return ro
    idx = torch.as_tensor(rows, dtype=torch.long)
    return Rollouts(ro.prompts[idx], ro.prompt_mask[idx], ro.responses[idx], ro.response_mask[idx])
