"""Rollout-GDRO as the authors' runs ran it (``gdro.rollout.allocator=release_as_run``): the math.

The release (``kishanpb/verl-gdro``) never updates its arm scores, so its exact-budget DP returns
the lexicographically smallest arm tuple; it allocates a step from the previous step's classes,
read as ``class_ids[i * rollout.n]`` of the expanded batch and applied by position, with the extra
class ``excl`` for a window rate of exactly 0 or 1. Why and how it was checked: docs/algorithm.md,
"The release preset". The allocator is
:class:`verl_gdro.allocators.release_as_run.ReleaseAsRunAllocator`. numpy only.

Example (arms 2..12, hand-checked in tests/test_release_as_run.py): classes of 300 / 150 / 50 / 12
prompts at budget 2048 get n = 2 / 6 / 10 / 4.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["lexicographic_exact_arms", "release_classes", "release_read_classes"]

def lexicographic_exact_arms(counts: ArrayLike, arms: ArrayLike, budget: int) -> NDArray[np.int64]:
    """The lexicographically smallest arm tuple (one arm per class) with sum(arm_k * counts_k) == budget:
    what the release's DP returns when every arm ties (it keeps the first path reaching each sum).
    Greedy: each class takes its smallest arm from which the rest can still make up the budget
    exactly (a reachability table from the back). Raises ValueError when no tuple is exact (never
    under the controller: every class at the mean budget is exact).
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
        for step in (int(arm * c[j]) for arm in a):
            if step <= budget:
                reach[j][step:] |= reach[j + 1][: budget + 1 - step]
    if budget < 0 or not reach[0][budget]:
        raise ValueError(f"no arm tuple from {a.tolist()} gives classes {c.tolist()} exactly {budget} rollouts")
    out = np.zeros(k, dtype=np.int64)
    rest = budget
    for j in range(k):  # the smallest arm from which classes j+1.. can still make up the rest
        out[j] = next(arm for arm in a if int(arm * c[j]) <= rest and reach[j + 1][rest - int(arm * c[j])])
        rest -= int(out[j] * c[j])
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
    """The per-prompt classes the release kept for the next step: ``class_ids[i * rollout_n]`` of the
    expanded batch (each prompt's ``n`` responses together, plan order), for i < len // rollout_n.
    With unequal n a prompt given more rollouts is read more often (a resample of ``classes``); a
    response count that is not a multiple of ``rollout_n`` returns None (the release kept the
    classes recorded before). With every n equal to ``rollout_n`` this is ``classes`` itself.
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
