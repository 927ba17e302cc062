"""What a GDRO step decides from the state before it: the plan, the multipliers, the draw's inputs
(:class:`StepPlanner`, the half of :class:`~verl_gdro.step.controller.GDROController` before the update)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.evidence import PromptEvidence
from verl_gdro.prompt_gdro import mix_probs
from verl_gdro.step.observe import int_array


@dataclass(frozen=True)
class StepPlan:
    """Decisions for the prompts of one call: ``positions`` in the step (the ``group_index`` their
    trajectories carry), stable ``uids``, difficulty ``bins`` and ``rollout_n`` per prompt."""

    positions: NDArray[np.int64]
    uids: NDArray[np.int64]
    bins: NDArray[np.int64]
    rollout_n: NDArray[np.int64]


class StepPlanner:
    """The pending plan of a step, the calls that fill it and the multipliers; reads the members the
    controller sets (``classifier`` None: bin 0; ``rollout`` None: ``rollout_n`` for every prompt)."""

    classifier: Any
    rollout: Any
    prompt: Any
    evidence: Any
    settings: Any
    rollout_n: int
    num_bins: int
    reweights: bool

    @property
    def pending_prompts(self) -> int:
        """Prompts planned since the last update."""
        return int(self._uids.size)

    def _reset_pending(self) -> None:
        self._uids = np.zeros(0, dtype=np.int64)
        self._bins = np.zeros(0, dtype=np.int64)
        self._n = np.zeros(0, dtype=np.int64)
        self._bin_weights: NDArray[np.float64] | None = None
        self._q_used: NDArray[np.float64] | None = None
        self._omega_used: NDArray[np.float64] | None = None
        self._time = 0.0

    def before_generation(self, prompt_uids: ArrayLike) -> StepPlan:
        """Classify the prompts (history up to t-1), choose their rollouts; a repeated id is two groups."""
        return self._plan(prompt_uids, pending=True)

    def _plan(self, prompt_uids: ArrayLike, pending: bool) -> StepPlan:
        """One call's decisions, timed; appended to the pending plan (``pending``) or positioned -1."""
        t0 = time.perf_counter()
        uids, bins, n = self._classify_and_allocate(prompt_uids)
        positions = self._append(uids, bins, n) if pending else np.full(uids.size, -1, dtype=np.int64)
        self._time += time.perf_counter() - t0
        return StepPlan(positions=positions, uids=uids.copy(), bins=bins.copy(), rollout_n=n.copy())

    def _append(self, uids: NDArray[np.int64], bins: NDArray[np.int64], n: NDArray[np.int64]) -> NDArray[np.int64]:
        start = self._uids.size
        self._uids = np.concatenate([self._uids, uids])
        self._bins = np.concatenate([self._bins, bins])
        self._n = np.concatenate([self._n, n])
        self._bin_weights = None
        return np.arange(start, start + uids.size, dtype=np.int64)

    def _classify_and_allocate(self, prompt_uids: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """(uids, bins, rollout_n) of one call: committed bins, the call's exact budget."""
        uids = int_array("prompt_uids", prompt_uids)
        bins = self.bins_of(uids)
        if self.rollout is None:
            return uids, bins, np.full(uids.size, self.rollout_n, dtype=np.int64)
        n = self.rollout.plan(uids, bins, self.classifier)
        budget = self.rollout_n * int(uids.size)
        if int(n.sum()) != budget:
            raise AssertionError(f"Rollout-GDRO allocated {int(n.sum())} rollouts for {uids.size} prompts, not the "
                f"exact budget {budget} = rollout.n * prompts")
        return uids, bins, n

    def _group_index(self, group_index: ArrayLike) -> NDArray[np.int64]:
        g = int_array("group_index", group_index)
        if g.size and (g.min() < 0 or g.max() >= self._uids.size):
            raise ValueError(f"group_index must hold plan positions in [0, {self._uids.size}) (prompts planned since "
                f"the last update), got values in [{g.min()}, {g.max()}]")
        return g

    def planned_uids(self, group_index: ArrayLike) -> NDArray[np.int64]:
        """Stable ids of the planned prompts at these positions (a consistency check for callers)."""
        return self._uids[self._group_index(group_index)]

    def bins_of(self, uids: ArrayLike) -> NDArray[np.int64]:
        """Current bins of ``uids`` (committing, like :meth:`before_generation`; idempotent without a new visit)."""
        u = int_array("uids", uids)
        return np.zeros(u.size, dtype=np.int64) if self.classifier is None else self.classifier.bins(u)

    def decide(self, prompt_uids: ArrayLike) -> StepPlan:
        """:meth:`before_generation` outside the pending plan (``positions`` -1), for prompts observed
        later than dispatched (async trainers, DAPO): the caller hands them back with :meth:`adopt`."""
        return self._plan(prompt_uids, pending=False)

    def adopt(self, prompt_uids: ArrayLike, bins: ArrayLike, rollout_n: ArrayLike) -> NDArray[np.int64]:
        """Add prompts decided by :meth:`decide` to the pending plan as decided; return their positions."""
        uids = int_array("prompt_uids", prompt_uids)
        b = int_array("bins", bins)
        n = int_array("rollout_n", rollout_n)
        if b.size != uids.size or n.size != uids.size:
            raise ValueError(f"adopt needs one bin and one rollout_n per prompt ({uids.size}), got {b.size}, {n.size}")
        if b.size and (b.min() < 0 or b.max() >= self.num_bins):
            raise ValueError(f"bins must lie in [0, {self.num_bins}), got values in [{b.min()}, {b.max()}]")
        if n.size and n.min() < 1:
            raise ValueError(f"rollout_n must be >= 1, got {n.min()}")
        return self._append(uids, b, n)

    def advantage_multipliers(self, group_index: ArrayLike) -> NDArray[np.float64]:
        """Eq. 16 multiplier of each trajectory from S_{t-1}: pass every non-padding trajectory once
        (``mean_one`` normalises over them); exactly 1.0 without reweighting (verl's ``grpo`` bit for bit)."""
        t0 = time.perf_counter()
        try:
            g = self._group_index(group_index)
            if self.prompt is None:
                return np.ones(g.size)
            response_bins = self._bins[g]
            self._omega_used = self.prompt.omega()
            self._q_used = mix_probs(self._omega_used, self.prompt.gamma)  # = bin_probs(), one exp fewer
            if not self.reweights:
                return np.ones(g.size)
            self._bin_weights = self.prompt.bin_multipliers(response_bins)
            return self._bin_weights[response_bins]
        finally:
            self._time += time.perf_counter() - t0

    def attach_prompts(self, uids: ArrayLike) -> PromptEvidence:
        """Register the training set whose evidence the sampling modes read and every update feeds (idempotent)."""
        u = int_array("uids", uids)
        if self.evidence is None or not np.array_equal(self.evidence.uids, u):
            self.evidence = PromptEvidence(u, decay=self.settings.prompt.rate_decay)
        return self.evidence

    def bin_probs(self) -> NDArray[np.float64]:
        """Prompt-GDRO's q_t (uniform when Prompt-GDRO is off)."""
        return np.full(self.num_bins, 1.0 / self.num_bins) if self.prompt is None else self.prompt.bin_probs()

