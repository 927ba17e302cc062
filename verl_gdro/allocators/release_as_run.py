"""The release's Rollout-GDRO as its runs ran it (``gdro.rollout.allocator=release_as_run``); the math
it applies, and what of the release's code it reproduces: :mod:`verl_gdro.release_as_run`. numpy only.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.allocators.protocol import Observation, ObservedStep
from verl_gdro.allocators.registry import register_allocator
from verl_gdro.metrics import PREFIX
from verl_gdro.release_as_run import lexicographic_exact_arms, release_classes, release_read_classes

__all__ = ["ReleaseAsRunAllocator"]

_STATE_VERSION = 1


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
