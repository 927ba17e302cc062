"""Rollout-GDRO as the authors' runs ran it (``gdro.rollout.allocator=release_as_run``).

The release (``kishanpb/verl-gdro``, ``verl/trainer/ppo/ray_trainer.py`` and
``verl/trainer/group_dro_grpo.py``, launch script ``run_rollout_groupdro.sh``) never updates its arm
scores: the step state that holds the chosen arms is overwritten before the update runs, so every
class's arm probabilities stay uniform, every cost of its exact-budget DP ties, and the DP returns
the first configuration it reaches. That is the **lexicographically smallest** tuple of arms (one
per class, classes in order of first appearance) whose rollouts sum to the budget exactly. It
allocates a step from the **previous** step's per-prompt classes, applied to the new batch's
prompts **by position** (the new prompts are unrelated to the old ones), and with
``passk_exclude_extremes`` (the 3-bin launch case) every prompt whose window rate is exactly 0 or 1
(every prompt on its first two visits, and every unseen one) carries the extra class ``excl``.

This module reproduces that allocation, so a user can reproduce the release's Rollout-GDRO rows;
it is an explicit option, never the default (docs/algorithm.md, "The release preset"). numpy only.

Example (arms 2..12, hand-checked in tests/test_release_as_run.py): classes of 300 / 150 / 50 / 12
prompts at budget 2048 get n = 2 / 6 / 10 / 4.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["ReleaseAsRunAllocator", "lexicographic_exact_arms", "release_classes"]

_STATE_VERSION = 1


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


class ReleaseAsRunAllocator:
    """Frozen uniform arms, the DP's lexicographic tie-break, the previous step's classes by position.

    Args:
        num_bins: the classifier's B (class ``B`` is ``excl``).
        n_min, n_max: the arms ``n_min..n_max`` (the release: 2..3 x n).
        n_mean: the mean budget (``actor_rollout_ref.rollout.n``).

    :meth:`allocate` gives a call's prompts their n from the classes :meth:`observe` recorded for
    the previous step, position by position, when that step had exactly as many prompts (else
    every prompt gets ``n_mean``, as the release's warm-up and fallback did). :meth:`observe` takes
    the step's per-prompt classes (:func:`release_classes`) in plan order. Nothing else is learnt:
    ``mu`` stays 0 (the release's dual step never ran) and :meth:`update` is a no-op.
    """

    allocator = "release_as_run"
    arm_utility = "none"

    def __init__(self, num_bins: int, n_min: int, n_max: int, n_mean: int) -> None:
        if not (1 <= int(n_min) <= int(n_mean) <= int(n_max)):
            raise ValueError(
                f"gdro.rollout.allocator=release_as_run needs n_min <= rollout.n <= n_max, got "
                f"{n_min} <= {n_mean} <= {n_max}"
            )
        self.num_bins = int(num_bins)
        self.n_min, self.n_max, self.n_mean = int(n_min), int(n_max), int(n_mean)
        self.arms = np.arange(self.n_min, self.n_max + 1, dtype=np.int64)
        self.mu = 0.0
        self._prev: NDArray[np.int64] | None = None
        self.last_class_arms: dict[int, int] = {}

    def allocate(self, num_prompts: int) -> NDArray[np.int64]:
        """Rollouts per prompt for a call of ``num_prompts`` prompts (sum == n_mean * num_prompts)."""
        num_prompts = int(num_prompts)
        prev = self._prev
        if prev is None or prev.size != num_prompts or num_prompts == 0:
            self.last_class_arms = {}
            return np.full(num_prompts, self.n_mean, dtype=np.int64)
        order, first, sizes = np.unique(prev, return_index=True, return_counts=True)
        by_appearance = np.argsort(first)  # first-appearance order (the release's Counter)
        classes, counts = order[by_appearance], sizes[by_appearance].astype(np.int64)
        arms = lexicographic_exact_arms(counts, self.arms, self.n_mean * num_prompts)
        self.last_class_arms = {int(c): int(a) for c, a in zip(classes, arms)}
        lookup = np.zeros(self.num_bins + 1, dtype=np.int64)
        lookup[classes] = arms
        return lookup[prev]

    def observe(self, classes: ArrayLike) -> None:
        """Record the step's per-prompt classes (plan order) for the next step's allocation."""
        c = np.asarray(classes, dtype=np.int64).copy()
        if c.ndim != 1 or (c.size and (c.min() < 0 or c.max() > self.num_bins)):
            raise ValueError(f"classes must be 1-D in [0, {self.num_bins}], got {c!r}")
        self._prev = c

    def update(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """No-op: the release's arm scores and dual price never moved (they are not learnt here either)."""
        return {}

    # -- checkpointing -------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        return {"num_bins": self.num_bins, "n_min": self.n_min, "n_max": self.n_max, "n_mean": self.n_mean}

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "allocator": self.allocator,
            "config": self._config(),
            "prev": None if self._prev is None else self._prev.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("allocator") != self.allocator or state.get("version") != _STATE_VERSION:
            raise ValueError("not a release_as_run allocator state (gdro.rollout.allocator differs from the saved run)")
        if state.get("config") != self._config():
            raise ValueError(f"release_as_run state saved with {state.get('config')}, this run has {self._config()}")
        prev = state.get("prev")
        self._prev = None if prev is None else np.asarray(prev, dtype=np.int64).copy()

    def snapshot(self) -> tuple[Any, ...]:
        return (None if self._prev is None else self._prev.copy(),)

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        (prev,) = snapshot
        self._prev = None if prev is None else prev.copy()
