"""Neyman allocation (``gdro.rollout.allocator=neyman``; Thm 4.2, Eqs. 28-31).

Minimise sum_b count_b v_b / n_b under the exact budget (the integer version of the square-root
rule n_b ∝ sqrt(v_b), solved exactly by the shared DP), with v_b an EMA of each bin's p (1 - p);
the implied shadow price of the continuous solution (Eq. 31) is reported as ``mu``. numpy only.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from verl_gdro.allocators.base import RolloutGDRO, StepStats
from verl_gdro.allocators.registry import register_allocator
from verl_gdro.rollout_gdro import neyman_implied_price, neyman_scores, solve_exact_budget

__all__ = ["Neyman"]


@register_allocator("neyman")
class Neyman(RolloutGDRO):
    """Per-bin variance-minimising counts under the exact budget."""

    reads: ClassVar[tuple[str, ...]] = ("rollout.n_min", "rollout.n_max", "rollout.score_ema")

    @classmethod
    def describe(cls, rollout: Any) -> str:
        return "neyman (variance EMA)"

    def _allocate(self, b: np.ndarray, rates: Any, counts: Any) -> np.ndarray:
        present, counts_b, inverse, budget = self._step_problem(b)
        scores = neyman_scores(counts_b, self._variance[present], self._arms)
        return solve_exact_budget(scores, counts_b, self._arms, budget)[inverse]

    def _learn(self, stats: StepStats, info: dict[str, Any]) -> None:
        present, rate = stats.present, stats.rate
        var = self._variance.copy()
        var[present] = np.maximum((1.0 - self.score_ema) * var[present] + self.score_ema * rate * (1.0 - rate), 0.01)
        mu = neyman_implied_price(stats.counts, var[present], stats.budget)
        self._variance, self._mu = var, mu
        self._steps += 1
        info.update(variance=var.copy(), mu=mu)
