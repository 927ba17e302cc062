"""Per-prompt allocation (``gdro.rollout.allocator=per_prompt``; docs/algorithm.md section 3): each
prompt its own n from its own (decayed) evidence, greedy marginal gains under the exact budget; nothing
is learnt between steps, ``mu`` is the last rollout's marginal gain. numpy only.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from verl_gdro.allocators.base import RolloutGDRO, StepStats
from verl_gdro.allocators.registry import register_allocator
from verl_gdro.evidence import arm_utility_values, per_prompt_utility
from verl_gdro.rollout_gdro import per_prompt_allocation

__all__ = ["PerPrompt"]


@register_allocator("per_prompt")
class PerPrompt(RolloutGDRO):
    """Each prompt its own n from its own evidence (the classifier's window, or a per-visit decay)."""

    reads: ClassVar[tuple[str, ...]] = ("rollout.n_min", "rollout.n_max", "rollout.arm_utility", "rollout.rate_decay")
    per_prompt_evidence: ClassVar[bool] = True
    prices_at_plan: ClassVar[bool] = True
    #: per-visit decay of the evidence (``gdro.rollout.rate_decay``); None: the classifier's window
    rate_decay: float | None = None

    @classmethod
    def from_settings(cls, rollout: Any, num_bins: int, n_mean: int) -> RolloutGDRO:
        alloc = cls(**rollout.kwargs(num_bins, n_mean))
        alloc.rate_decay = rollout.rate_decay
        return alloc

    @classmethod
    def describe(cls, rollout: Any) -> str:
        evidence = "window" if rollout.rate_decay is None else f"decay {rollout.rate_decay:g}"
        return f"per_prompt/{rollout.arm_utility} ({evidence})"

    def plan(self, uids: NDArray[np.int64], bins: NDArray[np.int64], classifier: Any) -> NDArray[np.int64]:
        if not uids.size:
            return np.zeros(0, dtype=np.int64)
        decay = self.rate_decay
        counts = classifier.window_counts(uids) if decay is None else classifier.decayed_counts(uids, decay)
        return np.asarray(self.allocate(bins, counts=counts), dtype=np.int64)

    def _allocate(self, b: np.ndarray, rates: Any, counts: Any) -> np.ndarray:
        """``counts`` = (successes, trials) per prompt (may be fractional, e.g. decayed), or a success
        rate per prompt in ``rates`` (not for ``hit``)."""
        n, self._mu = per_prompt_allocation(self._table(b, rates, counts), self.n_min, self.n_mean * int(b.size))
        return n

    def _table(self, b: np.ndarray, rates: Any, counts: Any) -> np.ndarray:
        """The [prompts, arms] utility table, inputs checked."""
        if counts is not None:
            s, t = (np.asarray(x, dtype=np.float64) for x in counts)
            if s.shape != b.shape or t.shape != b.shape or not np.all((s >= 0.0) & (s <= t)):
                raise ValueError(f"counts must hold (successes, trials) with 0 <= successes <= trials per prompt ({b.size})")
            return per_prompt_utility(self.arm_utility, s, t, self._arms)
        if rates is None or self.arm_utility == "hit":
            need = "counts (successes, trials)" if self.arm_utility == "hit" else "rates or counts"
            raise ValueError(f"allocator='per_prompt' with arm_utility={self.arm_utility!r} needs {need} per prompt")
        p = np.asarray(rates, dtype=np.float64)
        if p.shape != b.shape or not np.all((p >= 0.0) & (p <= 1.0)):
            raise ValueError(f"rates must hold one success rate in [0, 1] per prompt ({b.size})")
        return arm_utility_values(self.arm_utility, p, self._arms)

    def _learn(self, stats: StepStats, info: dict[str, Any]) -> None:
        self._steps += 1
        info.update(mu=self._mu)
