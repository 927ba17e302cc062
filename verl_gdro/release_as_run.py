"""Rollout-GDRO as the authors' runs ran it (``gdro.rollout.allocator=release_as_run``).

The release (``kishanpb/verl-gdro``, ``verl/trainer/ppo/ray_trainer.py`` and
``verl/trainer/group_dro_grpo.py``, launch script ``run_rollout_groupdro.sh``) never updates its arm
scores: the step state that holds the chosen arms is overwritten before the update runs, so every
class's arm probabilities stay uniform, every cost of its exact-budget DP ties, and the DP returns
the first configuration it reaches. That is the **lexicographically smallest** tuple of arms (one
per class, classes in order of first appearance) whose rollouts sum to the budget exactly. It
allocates a step from the **previous** step's classes, applied to the new batch's prompts **by
position** (the new prompts are unrelated to the old ones), and it reads those classes as
``class_ids[i * rollout.n]`` of the previous step's expanded batch (:func:`release_read_classes`):
with unequal n per prompt that is not each prompt's class but a resample weighted by the n each
prompt was given. With
``passk_exclude_extremes`` (the 3-bin launch case) every prompt whose window rate is exactly 0 or 1
(every prompt on its first two visits, and every unseen one) carries the extra class ``excl``.

This module holds that allocation's math; the allocator itself (registered as ``release_as_run``)
is :class:`verl_gdro.allocators.release_as_run.ReleaseAsRunAllocator`, an explicit option for
reproducing the release's Rollout-GDRO rows, never the default (docs/algorithm.md, "The release
preset"). numpy only.

Example (arms 2..12, hand-checked in tests/test_release_as_run.py): classes of 300 / 150 / 50 / 12
prompts at budget 2048 get n = 2 / 6 / 10 / 4.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["lexicographic_exact_arms", "release_classes", "release_read_classes"]

def lexicographic_exact_arms(counts: ArrayLike, arms: ArrayLike, budget: int) -> NDArray[np.int64]:
    """The lexicographically smallest arm tuple (one arm per class) with sum(arm_k * counts_k) == budget.

    What the release's DP returns when every arm's probability is equal: it visits the classes in
    order, the partial sums in insertion order and the arms in increasing order, keeps the first
    path that reaches each sum (a tie never replaces it), and picks the exact budget. By induction
    the path kept for a sum is the lexicographically smallest tuple reaching it. Computed here
    greedily: each class takes its smallest arm from which the remaining classes can still make
    up the rest exactly (a reachability table from the back). Raises ValueError when no tuple is
    exact (the release then fell back to another allocator; with the mean budget among the arms,
    every class at the mean is exact, so this does not happen under the controller).
    """
    c = np.asarray(counts, dtype=np.int64)
    a = np.unique(np.asarray(arms, dtype=np.int64))
    budget = int(budget)
    if c.ndim != 1 or (c.size and c.min() < 1):
        raise ValueError(f"counts must be a 1-D array of positive class sizes, got {c!r}")
    if a.size == 0 or a.min() < 1:
        raise ValueError(f"arms must be positive integers, got {a!r}")
    k = c.size
    # reach[j][s]: classes j..k-1 can make up exactly s rollouts
    reach = [np.zeros(budget + 1, dtype=bool) for _ in range(k + 1)]
    reach[k][0] = True
    for j in range(k - 1, -1, -1):
        nxt = reach[j + 1]
        cur = reach[j]
        for arm in a:
            step = int(arm * c[j])
            if step <= budget:
                cur[step:] |= nxt[: budget + 1 - step]
    if budget < 0 or not reach[0][budget]:
        raise ValueError(f"no arm tuple from {a.tolist()} gives classes {c.tolist()} exactly {budget} rollouts")
    out = np.zeros(k, dtype=np.int64)
    rest = budget
    for j in range(k):
        for arm in a:
            step = int(arm * c[j])
            if step <= rest and reach[j + 1][rest - step]:
                out[j] = arm
                rest -= step
                break
    return out


def release_classes(bins: ArrayLike, rates: ArrayLike, num_bins: int) -> NDArray[np.int64]:
    """The release's class of each prompt: its bin, or ``num_bins`` (the ``excl`` class) when its
    window rate is exactly 0 or 1 or it was never observed (NaN): ``passk_exclude_extremes``."""
    b = np.asarray(bins, dtype=np.int64)
    p = np.asarray(rates, dtype=np.float64)
    if b.shape != p.shape:
        raise ValueError(f"bins and rates must have the same shape, got {b.shape} and {p.shape}")
    excl = ~np.isfinite(p) | (p <= 0.0) | (p >= 1.0)
    return np.where(excl, int(num_bins), b)


def release_read_classes(classes: ArrayLike, n: ArrayLike, rollout_n: int) -> NDArray[np.int64] | None:
    """The per-prompt classes the release kept for the next step: ``class_ids[i * rollout_n]``.

    The release (``ray_trainer.py``, after generation) classifies every response of the expanded
    batch and keeps ``[class_ids[i * n_rollouts] for i in range(len(class_ids) // n_rollouts)]``
    with ``n_rollouts`` the configured ``rollout.n``, recorded only when the batch holds exactly
    ``len // n_rollouts * n_rollouts`` responses. Its batch is the plan's prompts in order, each
    prompt's n_i responses together (``select_idxs`` of each index repeated n_i times; the launch
    scripts' single GPU leaves ``balance_batch``'s one partition in index order), so index
    ``i * rollout_n`` falls in whichever prompt's group covers it: with unequal n a prompt given
    more rollouts is read more often, and the next step's class counts are a resample of the
    true ones. The index never runs past the end (``i < len // rollout_n``); a response count
    that is not a multiple of ``rollout_n`` returns None, where the release kept the classes it
    had recorded before. With every n_i equal to ``rollout_n`` this is ``classes`` itself.

    Args:
        classes: each prompt's class (:func:`release_classes`), plan order.
        n: the responses each prompt had, plan order.
        rollout_n: the configured ``actor_rollout_ref.rollout.n``.
    """
    c = np.asarray(classes, dtype=np.int64)
    k = np.asarray(n, dtype=np.int64)
    if c.shape != k.shape or c.ndim != 1 or (k.size and k.min() < 0) or int(rollout_n) < 1:
        raise ValueError(f"classes and n must be 1-D of the same shape, n >= 0, rollout_n >= 1; got "
                         f"{c.shape}, {k.shape}, {rollout_n}")
    expanded = np.repeat(c, k)
    if expanded.size == 0 or expanded.size % int(rollout_n):
        return None
    return expanded[:: int(rollout_n)].copy()
