"""What a GDRO step decides from the state before it: the plan, the multipliers, the draw's inputs.

:class:`StepPlanner` is the half of :class:`~verl_gdro.step.controller.GDROController` that acts
before the update: ``before_generation`` (plan now), or ``decide`` at dispatch and ``adopt`` when
the trajectories are observed (DAPO refills, verl's async trainers), accumulating the step's plan;
``advantage_multipliers`` (Eq. 16 from S_{t-1}); and what the sampler reads (``bins_of``,
``attach_prompts``, ``bin_probs``). numpy only (no verl, no torch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.evidence import PromptEvidence
from verl_gdro.prompt_gdro import mix_probs
from verl_gdro.step.observe import int_array

__all__ = ["StepPlan", "StepPlanner"]


@dataclass(frozen=True)
class StepPlan:
    """Decisions for the prompts of one :meth:`GDROController.before_generation` call.

    ``positions`` are these prompts' indices in the step (the ``group_index`` values their
    trajectories must carry); ``bins`` their difficulty bins; ``rollout_n`` their rollout counts
    (``rollout_n`` of the controller for every prompt when Rollout-GDRO is off).
    """

    positions: NDArray[np.int64]
    uids: NDArray[np.int64]
    bins: NDArray[np.int64]
    rollout_n: NDArray[np.int64]


class StepPlanner:
    """The pending plan of a step, the calls that fill it and the multipliers (the controller's
    first half). Reads the members the controller sets: ``classifier`` (None: every prompt in bin
    0), ``rollout`` (the allocator; None: every prompt gets ``rollout_n``), ``prompt``, ...
    """

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
        """Classify the prompts (history up to t-1) and choose their rollouts. Accumulates until
        :meth:`after_advantage`. ``prompt_uids`` are stable int ids; repeats are allowed (a
        resampling sampler may draw a prompt twice: it is then two groups of the step)."""
        t0 = time.perf_counter()
        uids, bins, n = self._classify_and_allocate(prompt_uids)
        positions = self._append(uids, bins, n)
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
        """(uids, bins, rollout_n) of one call: the classifier commits the bins, the allocator
        plans the call's exact budget. The pending plan is not touched."""
        uids = int_array("prompt_uids", prompt_uids)
        bins = np.zeros(uids.size, dtype=np.int64) if self.classifier is None else self.classifier.bins(uids)
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
        """Classify and allocate like :meth:`before_generation`, without touching the pending plan.

        For trainers whose prompts are observed later than they are dispatched (verl's async
        trainers, DAPO filtering): the caller keeps the returned decisions (same exact budget per
        call) and hands the observed ones back with :meth:`adopt`. ``positions`` are -1.
        """
        t0 = time.perf_counter()
        uids, bins, n = self._classify_and_allocate(prompt_uids)
        self._time += time.perf_counter() - t0
        none = np.full(uids.size, -1, dtype=np.int64)
        return StepPlan(positions=none, uids=uids.copy(), bins=bins.copy(), rollout_n=n.copy())

    def adopt(self, prompt_uids: ArrayLike, bins: ArrayLike, rollout_n: ArrayLike) -> NDArray[np.int64]:
        """Add prompts decided earlier by :meth:`decide` to the pending plan; return their positions.
        Their bins and rollout counts stay the dispatch-time decisions (what generation used)."""
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
        """Eq. 16 multiplier of each trajectory (its prompt's bin weight from S_{t-1}).

        ``mean_one`` normalises over exactly these trajectories, so pass every non-padding
        trajectory of the step once. Exactly 1.0 everywhere when Prompt-GDRO does not reweight,
        so the estimator then reproduces verl's ``grpo`` bit for bit.
        """
        t0 = time.perf_counter()
        g = self._group_index(group_index)
        if self.prompt is None:
            self._time += time.perf_counter() - t0
            return np.ones(g.size)
        response_bins = self._bins[g]
        self._omega_used = self.prompt.omega()
        self._q_used = mix_probs(self._omega_used, self.prompt.gamma)  # = bin_probs(), one exp fewer
        if not self.reweights:
            self._time += time.perf_counter() - t0
            return np.ones(g.size)
        weights = self.prompt.bin_multipliers(response_bins)
        self._bin_weights = weights
        self._time += time.perf_counter() - t0
        return weights[response_bins]

    def attach_prompts(self, uids: ArrayLike) -> PromptEvidence:
        """Register the training set (stable id per row) whose per-prompt evidence the sampling
        modes read; every later update feeds it. Idempotent for the same set; another set replaces it."""
        u = int_array("uids", uids)
        if self.evidence is None or not np.array_equal(self.evidence.uids, u):
            self.evidence = PromptEvidence(u, decay=self.settings.prompt.rate_decay)
        return self.evidence

    def bin_probs(self) -> NDArray[np.float64]:
        """Prompt-GDRO's q_t (uniform when Prompt-GDRO is off)."""
        return np.full(self.num_bins, 1.0 / self.num_bins) if self.prompt is None else self.prompt.bin_probs()

