"""Rollout-GDRO as the authors' runs ran it (``gdro.rollout.allocator=release_as_run``): the math and the allocator.

The release (``kishanpb/verl-gdro``) never updates its arm scores, so its exact-budget DP returns
the lexicographically smallest arm tuple; it allocates a step from the previous step's classes,
read as ``class_ids[i * rollout.n]`` of the expanded batch and applied by position, with the extra
class ``excl`` for a window rate of exactly 0 or 1. Why and how it was checked: docs/algorithm.md,
"The release preset". numpy only.

Example (arms 2..12, hand-checked in tests/test_release_as_run.py): classes of 300 / 150 / 50 / 12
prompts at budget 2048 get n = 2 / 6 / 10 / 4.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.allocators.protocol import Observation, ObservedStep
from verl_gdro.allocators.registry import register_allocator
from verl_gdro.metrics import PREFIX

_STATE_VERSION = 1


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


@register_allocator("release_as_run")
class ReleaseAsRunAllocator:
    """Frozen uniform arms, the DP's lexicographic tie-break, the previous step's classes as the release read them.

    ``num_bins`` is the classifier's B (class ``B`` is ``excl``), ``n_min..n_max`` the arms and
    ``n_mean`` the mean budget (``rollout.n``). Nothing is learnt: ``mu`` stays 0 (the release's
    dual step never ran) and :meth:`update` is a no-op (docs/algorithm.md, "The release preset").
    """

    allocator = "release_as_run"
    arm_utility = "none"
    reads: ClassVar[tuple[str, ...]] = ("rollout.n_min", "rollout.n_max")
    #: the frozen arms read no loss (with Prompt-GDRO off no loss signal is measured for them)
    logs_loss_signal: ClassVar[bool] = False
    learns_from_update_loss = False
    prices_at_plan: ClassVar[bool] = False

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
        #: positions of the previous step's classes already given to this step's calls (not saved:
        #: verl checkpoints after the update, which resets it)
        self._offset = 0
        self.last_class_arms: dict[int, int] = {}
        #: whether the last observed step left the recorded classes as they were (its responses were
        #: not a multiple of n_mean: the release then kept its previous classes)
        self.kept_classes = False

    @classmethod
    def from_settings(cls, rollout: Any, num_bins: int, n_mean: int) -> ReleaseAsRunAllocator:
        return cls(num_bins, rollout.n_min, rollout.n_max, n_mean)

    @classmethod
    def describe(cls, rollout: Any) -> str:
        return "release_as_run (frozen uniform arms, lexicographic tie-break)"

    def plan(self, uids: NDArray[np.int64], bins: NDArray[np.int64], classifier: Any) -> NDArray[np.int64]:
        """The call's n from the previous step's classes, by position (the bins are not read)."""
        return self.allocate(uids.size)

    def allocate(self, num_prompts: int) -> NDArray[np.int64]:
        """Rollouts per prompt for a call of ``num_prompts`` prompts (sum == n_mean * num_prompts); before
        any step, ``n_mean`` each (the release's warm-up)."""
        num_prompts = int(num_prompts)
        if self._prev is None or self._prev.size == 0 or num_prompts == 0:
            self.last_class_arms = {}  # the release's warm-up: rollout.n for every prompt
            return np.full(num_prompts, self.n_mean, dtype=np.int64)
        # the previous step's classes by position; a step's later calls (refills) continue the
        # positions, and positions past the previous step's prompts start over (issue 36)
        prev = self._prev[(self._offset + np.arange(num_prompts)) % self._prev.size]
        self._offset += num_prompts
        order, first, sizes = np.unique(prev, return_index=True, return_counts=True)
        by_appearance = np.argsort(first)  # first-appearance order (the release's Counter)
        classes, counts = order[by_appearance], sizes[by_appearance].astype(np.int64)
        arms = lexicographic_exact_arms(counts, self.arms, self.n_mean * num_prompts)
        self.last_class_arms = {int(c): int(a) for c, a in zip(classes, arms)}
        lookup = np.zeros(self.num_bins + 1, dtype=np.int64)
        lookup[classes] = arms
        return lookup[prev]

    def observe_classes(self, classes: ArrayLike, n: ArrayLike | None = None) -> None:
        """Record what the next step reads from this step's per-prompt classes and n (plan order; ``n``
        None: ``rollout.n`` each), as the release read them (:func:`release_read_classes`)."""
        c = np.asarray(classes, dtype=np.int64).copy()
        if c.ndim != 1 or (c.size and (c.min() < 0 or c.max() > self.num_bins)):
            raise ValueError(f"classes must be 1-D in [0, {self.num_bins}], got {c!r}")
        read = release_read_classes(c, np.full(c.size, self.n_mean) if n is None else n, self.n_mean)
        if read is not None:
            self._prev = read
        self.kept_classes = read is None
        self._offset = 0

    def observe(self, step: ObservedStep) -> Observation:
        """The release classifies after generation, before the step's pass@k update: the window as
        it is now (the classifier observes last), ``excl`` for a rate of 0 or 1; each prompt's
        planned n lays out the expanded batch the release read its classes from."""
        classes = release_classes(step.bins, step.classifier.pass_at_k(step.uids), self.num_bins)
        self.observe_classes(classes, step.n)
        return Observation()

    def observe_update_loss(self, bins: Any, n: Any, successes: Any, losses: Any) -> str | None:
        return None

    def metrics(self, num_bins: int) -> dict[str, float]:
        """The arm each class got this step (class ``num_bins`` is ``excl``; none when every prompt
        got rollout.n) and ``release_classes_kept``: 1 when the step's responses were not a multiple
        of rollout.n, so the next step reads the classes recorded before (as the release did)."""
        out = {f"{PREFIX}release_arm/{'excl' if c == num_bins else f'bin_{c}'}": float(arm)
               for c, arm in self.last_class_arms.items()}
        out[f"{PREFIX}release_classes_kept"] = float(self.kept_classes)
        return out

    def update(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """No-op: the release's arm scores and dual price never moved (they are not learnt here either)."""
        return {}

    # -- checkpointing -------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        return {"num_bins": self.num_bins, "n_min": self.n_min, "n_max": self.n_max, "n_mean": self.n_mean}

    def state_dict(self) -> dict[str, Any]:
        """``prev``: the classes the next step reads by position (a state saved before the release's
        reading was reproduced holds the true per-prompt classes there and loads unchanged)."""
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
        self._offset = 0

    def snapshot(self) -> tuple[Any, ...]:
        return (None if self._prev is None else self._prev.copy(), self._offset, self.kept_classes)

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        prev, self._offset, self.kept_classes = snapshot
        self._prev = None if prev is None else prev.copy()
