"""The bin bandit (``gdro.rollout.allocator=bandit``, docs/algorithm.md section 3; Eqs. 17-21): per-bin
exponential weights over the arms, a configuration under the exact budget (``map`` or ``sample``) and a
dual shadow price. Played-arm utilities (``informative``, ``loss``) score the arm played, weighted under
``sample`` by the marginal of the draw that chose it (EXP3). numpy only.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any, ClassVar

import numpy as np

from verl_gdro.allocators.base import RolloutGDRO, StepStats
from verl_gdro.allocators.registry import register_allocator
from verl_gdro.classifier import int_array
from verl_gdro.evidence import FULL_INFORMATION_UTILITIES
from verl_gdro.rollout_gdro import (
    MAX_RECORDED_DRAWS,
    _partition,
    argmax_toward,
    arm_utility_values,
    dual_update,
    exp_weights_arm_log_probs,
    exp_weights_arm_probs,
    gain_with_shadow_price,
    sample_exact_budget,
    score_ema,
    solve_exact_budget,
)

__all__ = ["BinBandit"]


@register_allocator("bandit")
class BinBandit(RolloutGDRO):
    """Per-bin exponential weights over the arms, a configuration under the exact budget, a dual price."""

    reads: ClassVar[tuple[str, ...]] = (
        "rollout.n_min", "rollout.n_max", "rollout.eta", "rollout.gamma", "rollout.score_ema", "rollout.dual_lr",
        "rollout.arm_utility", "rollout.selection", "rollout.seed",
    )

    @property
    def learns_from_update_loss(self) -> bool:
        return self.arm_utility == "loss"

    def _allocate(self, b: np.ndarray, rates: Any, counts: Any) -> np.ndarray:
        """Every prompt of a bin gets its bin's n; ``sample`` advances the allocator's own generator."""
        present, counts_b, inverse, budget = self._step_problem(b)
        logp = exp_weights_arm_log_probs(self._scores[present], self.eta, self.gamma)
        if self.effective_selection == "map":
            per_bin = solve_exact_budget(logp, counts_b, self._arms, budget)
        else:
            rng = deepcopy(self._rng)  # draw on a copy so that a failure leaves the generator untouched
            per_bin, marg = sample_exact_budget(logp, counts_b, self._arms, budget, rng)
            self._rng = rng
            self._record_draw(present, per_bin, marg)
        return per_bin[inverse]

    # ---- the draws behind the importance weights ------------------------------------------------

    def _record_draw(self, present: np.ndarray, per_bin: np.ndarray, marg: np.ndarray) -> None:
        """Keep a sampled draw (the arm of every bin, -1 where absent, and its marginal): the
        played-arm update weights a bin's gain by the marginal of the draw that chose its arm, so a
        step that trains a subset of a call, or several calls, still learns correctly."""
        arm = np.full(self.num_bins, -1, dtype=np.int64)
        prob = np.zeros(self.num_bins, dtype=np.float64)
        arm[present], prob[present] = per_bin, marg
        self._draws.append((arm, prob))
        del self._draws[:-MAX_RECORDED_DRAWS]

    def _drawn_marginals(self, present: np.ndarray, played: np.ndarray) -> np.ndarray:
        """Per present bin, the marginal of its played arm in the one recorded draw that gave the
        bin that arm (NaN where no recorded draw did, or several did: that draw is unknown)."""
        out = np.full(present.size, np.nan)
        hits = np.zeros(present.size, dtype=np.int64)
        for arm, prob in self._draws:
            match = arm[present] == played
            hits += match
            out = np.where(match, prob[present], out)
        out[hits != 1] = np.nan
        return out

    def _played_marginals(self, b: np.ndarray, present: np.ndarray, played: np.ndarray) -> np.ndarray:
        """The importance-weight denominators of the present bins' played arms (NaN: unknown)."""
        if self._draws:
            return self._drawn_marginals(present, played)
        # No draw recorded since the last update or restore (a state saved before draws were
        # recorded): the step's own problem is the draw's when it spends the exact budget, as a
        # whole generation call does; recompute its marginals from the unchanged scores.
        _present, counts, _inverse, budget = self._step_problem(b)
        if int((counts * played).sum()) != budget:
            return np.full(present.size, np.nan)
        logp = exp_weights_arm_log_probs(self._scores[present], self.eta, self.gamma)
        return _partition(logp, counts, self._arms, budget).marginals(arm_idx=played - self.n_min)

    def update_refusal(self, bins: Any, n: Any) -> str | None:
        """``"mixed_arms"``: a played-arm utility needs one arm per bin, and these prompts were
        allocated in several calls that gave one bin different n. ``"unknown_draw"``: under
        ``selection='sample'`` no bin's played arm comes from exactly one recorded draw, so no
        importance weight is known. The controller skips the update and counts it."""
        if self.arm_utility in FULL_INFORMATION_UTILITIES:
            return None
        b = self._validate_bins(bins)
        n_a = int_array("n", n, integral_floats=True)
        if b.size == 0 or n_a.shape != b.shape:
            return None  # update() names the problem
        lo = np.full(self.num_bins, np.iinfo(np.int64).max)
        hi = np.full(self.num_bins, -1)
        np.minimum.at(lo, b, n_a)
        np.maximum.at(hi, b, n_a)
        if np.any(lo[b] != hi[b]):
            return "mixed_arms"
        if self.effective_selection == "sample":
            present = np.unique(b)
            if not np.isfinite(self._played_marginals(b, present, hi[present])).any():
                return "unknown_draw"
        return None

    # ---- update -------------------------------------------------------------------------

    def _learn(self, stats: StepStats, info: dict[str, Any]) -> None:
        """Utilities -> gains with the current mu -> arm-score EMA -> nhat -> mu (spec, "Order inside one update")."""
        if self.arm_utility == "loss" and stats.losses is None:
            raise ValueError("losses are required for arm_utility='loss'")
        utility = np.full((self.num_bins, self._arms.size), np.nan)
        gain = np.full((self.num_bins, self._arms.size), np.nan)
        scores = self._scores.copy()
        pass_rate = self._pass_rate.copy()
        dropped = 0
        if self.arm_utility in FULL_INFORMATION_UTILITIES:
            self._full_information(stats, utility, gain, scores, pass_rate)
        else:
            dropped = self._played_arm(stats, utility, gain, scores, info)
        if not np.all(np.isfinite(scores)):
            # Finite losses so large that a gain (or its importance weight) overflows float64:
            # refuse the step, state untouched, rather than store an infinite arm score.
            raise ValueError("losses overflow float64 in the arm gains; loss signals must be of moderate magnitude")
        present, counts = stats.present, stats.counts
        probs = exp_weights_arm_probs(scores, self.eta, self.gamma)
        preferred = argmax_toward(probs[present], self._arms, self.n_mean)
        qhat = counts / counts.sum()
        nhat = float(np.sum(qhat * preferred))
        mu = dual_update(self._mu, nhat, self.n_mean, self.dual_lr)
        self._scores, self._pass_rate, self._mu = scores, pass_rate, mu
        self._steps += 1
        self._draws = []  # the scores changed: later draws are new rounds
        info.update(utility=utility, gain=gain, nhat=nhat, mu=mu, dropped_losses=dropped,
                    preferred_n=dict(zip(present.tolist(), preferred.tolist(), strict=True)))

    def _full_information(self, stats: StepStats, utility: np.ndarray, gain: np.ndarray, scores: np.ndarray,
                          pass_rate: np.ndarray) -> None:
        """Every arm of a present bin scored from the bin's smoothed pass rate (in place)."""
        present, rate = stats.present, stats.rate
        old = pass_rate[present]
        smoothed = np.where(np.isnan(old), rate, (1.0 - self.score_ema) * old + self.score_ema * rate)
        pass_rate[present] = smoothed
        u = arm_utility_values(self.arm_utility, smoothed, self._arms)
        g = gain_with_shadow_price(u, self._arms[None, :], self._mu, self.n_mean)
        utility[present], gain[present] = u, g
        scores[present] = score_ema(scores[present], g, self.score_ema)

    def _played_arm(self, stats: StepStats, utility: np.ndarray, gain: np.ndarray, scores: np.ndarray,
                    info: dict[str, Any]) -> int:
        """The played arm of each present bin scored (in place); returns the dropped non-finite losses."""
        b, n_a, inverse, present = stats.bins, stats.n, stats.inverse, stats.present
        num_present = present.size
        played = np.zeros(num_present, dtype=np.int64)
        np.maximum.at(played, inverse, n_a)
        if np.any(n_a != played[inverse]):
            raise ValueError(f"n must be the same for every prompt of a bin under arm_utility={self.arm_utility!r} "
                "(one played arm per bin)")
        dropped = 0
        if self.arm_utility == "informative":
            informative = ((stats.successes > 0) & (stats.successes < n_a)).astype(np.float64)
            u_played = np.bincount(inverse, weights=informative, minlength=num_present) / stats.counts
            has = np.ones(num_present, dtype=bool)
        else:
            loss_a = stats.losses
            assert loss_a is not None
            finite = np.isfinite(loss_a)
            dropped = int((~finite).sum())
            lsum = np.bincount(inverse[finite], weights=loss_a[finite], minlength=num_present)
            lcnt = np.bincount(inverse[finite], minlength=num_present)
            has = lcnt > 0
            u_played = np.where(has, lsum / np.maximum(lcnt, 1), np.nan)
        g_played = gain_with_shadow_price(u_played, played, self._mu, self.n_mean)
        if self.effective_selection == "sample":
            has, g_played = self._importance_weighted(b, present, played, has, g_played, info)
        rows, cols = present[has], (played - self.n_min)[has]
        utility[rows, cols] = u_played[has]
        gain[rows, cols] = g_played[has]
        scores[rows, cols] = score_ema(scores[rows, cols], g_played[has], self.score_ema)
        return dropped

    def _importance_weighted(self, b: np.ndarray, present: np.ndarray, played: np.ndarray,
                             has: np.ndarray, g_played: np.ndarray, info: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """EXP3: each bin's gain over the marginal of the draw that chose its arm; a bin whose draw is
        unknown (or ambiguous) is left out of this update and counted (``unweighted_bins``)."""
        marg_played = self._played_marginals(b, present, played)
        known = np.isfinite(marg_played)
        if not known.any():
            raise ValueError("n matches no recorded draw under selection='sample' (the importance weight is the "
                "marginal of the draw that chose each bin's arm): see update_refusal")
        info["unweighted_bins"] = int((has & ~known).sum())
        g_played = np.where(known, g_played / np.where(known, marg_played, 1.0), np.nan)
        info["played_marginal"] = dict(zip(present[known].tolist(), marg_played[known].tolist(), strict=True))
        return has & known, g_played
