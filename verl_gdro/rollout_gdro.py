"""Rollout-GDRO: the compute adversary (docs/algorithm.md section 3; paper 3.3, 4.3, Eqs. 17-21, 28-31).

Every prompt of difficulty bin b gets n_b rollouts in {n_min, ..., n_max}, and the step spends exactly
``n_mean * len(bins)``. The allocators (:mod:`verl_gdro.allocators`) share this module's functions: the
exact-budget solver (a DP: one step of bin b costs count_b units, a multiple-choice knapsack with an
equality constraint, where greedy is not exact), the conditioned partition and one function per
equation. numpy only.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from verl_gdro.classifier import int_array

# re-exported from the math floor, where both adversaries read them
from verl_gdro.evidence import (
    FULL_INFORMATION_UTILITIES,
    PER_PROMPT_UTILITIES,
    arm_utility_values,
    expected_informative_utility,
    hit_utility,
    per_prompt_utility,
    smoothed_rate,
    variance_utility,
)

__all__ = [
    "ARM_UTILITIES", "SELECTIONS", "TIE_RTOL", "InfeasibleBudgetError", "argmax_toward", "dual_update",
    "exact_budget_marginals", "FULL_INFORMATION_UTILITIES", "PER_PROMPT_UTILITIES", "arm_utility_values",
    "expected_informative_utility", "hit_utility", "per_prompt_allocation", "per_prompt_utility", "smoothed_rate",
    "exp_weights_arm_log_probs", "exp_weights_arm_probs", "gain_with_shadow_price", "neyman_implied_price",
    "neyman_scores", "sample_exact_budget", "score_ema", "variance_utility", "solve_exact_budget"
]

ARM_UTILITIES = ("expected_informative", "failure_weighted", "knapsack", "variance", "hit", "informative", "loss")
SELECTIONS = ("auto", "map", "sample")

#: Relative tolerance (absolute below magnitude 1) under which two DP scores are equal optima: far above
#: the rounding of a sum of a few dozen terms, far below any difference a learner's scores express.
TIE_RTOL = 1e-12

#: Sampled draws kept for the importance weights between two updates (the call and its refills).
MAX_RECORDED_DRAWS = 16

_DEV_SENTINEL = np.iinfo(np.int64).max // 4


class InfeasibleBudgetError(ValueError):
    """No choice of one allowed arm per bin spends the budget exactly."""


# ---- exact-budget solver, sampler and marginals ----


@dataclass(frozen=True)
class _BudgetProblem:
    """A validated exact-budget problem: costs divided by their gcd g (``cost[b, a] = counts[b] * arms[a] / g``,
    ``target = budget / g``), and per bin the window ``lo[b]..hi[b]`` of suffix spends (bins b..B-1) that
    can still meet the target; tables are computed on these windows only."""

    log_probs: np.ndarray  # [B, A] float64, finite or -inf
    counts: np.ndarray  # [B] int64 > 0
    arms: np.ndarray  # [A] int64 strictly increasing >= 1
    budget: int
    cost: np.ndarray  # [B, A] int64, reduced
    target: int  # reduced budget
    lo: np.ndarray  # [B + 1] suffix-cost window, lower ends
    hi: np.ndarray  # [B + 1] suffix-cost window, upper ends
    pad: int  # largest reduced cost: tables carry this many fill columns in front


def _validate_problem(log_probs: Any, counts: Any, arms: Any, budget: Any) -> _BudgetProblem:
    counts_a = int_array("counts", counts, integral_floats=True)
    arms_a = int_array("arms", arms, integral_floats=True)
    lp = np.asarray(log_probs, dtype=np.float64)
    if lp.ndim != 2 or lp.shape != (counts_a.size, arms_a.size):
        raise ValueError(f"log_probs must have shape (len(counts), len(arms)) = ({counts_a.size}, {arms_a.size}),"
            f" got {lp.shape}")
    if arms_a.size == 0:
        raise ValueError("arms must hold at least one arm")
    if np.any(arms_a < 1) or np.any(np.diff(arms_a) <= 0):
        raise ValueError(f"arms must be strictly increasing integers >= 1, got {arms_a.tolist()}")
    if np.any(counts_a <= 0):
        raise ValueError(f"counts must be integers > 0, got {counts_a.tolist()}")
    if np.any(np.isnan(lp)) or np.any(lp == np.inf):
        raise ValueError("log_probs must be finite or -inf (forbidden arm); got NaN or +inf")
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise ValueError(f"budget must be an integer >= 0, got {budget!r}")
    budget_i = int(budget)
    if budget_i < 0:
        raise ValueError(f"budget must be an integer >= 0, got {budget_i}")

    num_bins = counts_a.size
    cost_full = counts_a[:, None] * arms_a[None, :]
    g = int(np.gcd.reduce(cost_full.ravel())) if num_bins else 1
    cost = cost_full // g
    target = budget_i // g
    allowed = np.isfinite(lp)
    feasible = budget_i % g == 0 and bool(allowed.any(axis=1).all())
    kmin = np.where(allowed, cost, np.iinfo(np.int64).max).min(axis=1) if num_bins else cost[:, 0]
    kmax = np.where(allowed, cost, -1).max(axis=1) if num_bins else cost[:, 0]
    suf_lo = np.concatenate([np.cumsum(kmin[::-1])[::-1], [0]]).astype(np.int64)
    suf_hi = np.concatenate([np.cumsum(kmax[::-1])[::-1], [0]]).astype(np.int64)
    if feasible:
        # prefix of bins 0..b-1 spends total - suffix; it lies in [suf_lo[0]-suf_lo[b], ...].
        lo = np.maximum(suf_lo, target - (suf_hi[0] - suf_hi))
        hi = np.minimum(suf_hi, target - (suf_lo[0] - suf_lo))
        feasible = bool(np.all(lo <= hi)) and lo[0] == target == hi[0]
    if not feasible:  # provably infeasible: divisibility, a bin without an allowed arm or an empty window
        raise _infeasible(counts_a, arms_a, budget_i)
    return _BudgetProblem(
        log_probs=lp, counts=counts_a, arms=arms_a, budget=budget_i, cost=cost, target=target, lo=lo, hi=hi,
        pad=int(cost.max()) if cost.size else 0
    )


def _infeasible(counts: np.ndarray, arms: np.ndarray, budget: int) -> InfeasibleBudgetError:
    lo, hi = int(np.sum(counts * arms[0])), int(np.sum(counts * arms[-1]))
    return InfeasibleBudgetError(
        f"budget={budget} cannot be met exactly with counts={counts.tolist()} and "
        f"arms={arms.tolist()} (one allowed arm per bin, -inf log_probs excluded; "
        f"the unconstrained range of totals is [{lo}, {hi}])")


class _Workspace(threading.local):
    """Per-thread scratch buffers for the DP, reused across calls: a fresh [arms, budget] temporary is
    over glibc's mmap threshold and would page-fault on every call."""

    shape = (-1, -1)  # nothing allocated yet

    def get(self, rows: int, cols: int) -> tuple[np.ndarray, ...]:
        """Float, int64 and bool buffers of shape (rows, cols) (views into persistent memory)."""
        if self.shape[0] < rows or self.shape[1] < cols:
            self.shape = (max(rows, self.shape[0]), max(cols, self.shape[1]))
            self.bufs = tuple(np.empty(self.shape, dtype=dtype) for dtype in (np.float64, np.int64, bool))
        return tuple(buf[:rows, :cols] for buf in self.bufs)


_WORKSPACE = _Workspace()


def _max_width(pb: _BudgetProblem) -> int:
    return int((pb.hi - pb.lo).max()) + 1


def _shift_into(out: np.ndarray, row: np.ndarray, starts: np.ndarray, add: np.ndarray) -> None:
    """out[a, j] = row[starts[a] + j] + add[a]: one bin's DP step for every arm (``row`` is padded in
    front, so spends below zero read fill values instead of wrapping around)."""
    width = out.shape[1]
    first = starts.tolist()
    if len(first) > 1 and row.flags.c_contiguous:
        step = first[1] - first[0]
        if step != 0 and first == list(range(first[0], first[0] + step * len(first), step)):
            # starts in arithmetic progression (consecutive arms): one strided view, the same sums
            size = row.itemsize
            view = np.ndarray((len(first), width), dtype=row.dtype, buffer=row, offset=first[0] * size,
                              strides=(step * size, size))
            np.add(view, add[:, None], out=out)
            return
    for a, k in enumerate(first):
        np.add(row[k : k + width], add[a], out=out[a])


def _starts(pb: _BudgetProblem, b: int, lo: int) -> np.ndarray:
    return pb.pad + lo - pb.cost[b]


def _tolerance(best: np.ndarray) -> np.ndarray:
    """Width of the 'equal optimum' band below ``best`` (see :data:`TIE_RTOL`)."""
    return TIE_RTOL * np.maximum(1.0, np.abs(np.where(np.isfinite(best), best, 0.0)))


def solve_exact_budget(log_probs: Any, counts: Any, arms: Any, budget: int) -> np.ndarray:
    """The arm value per bin (int64 [bins]) maximising sum_b log_probs[b, a_b] s.t. sum_b counts[b] * n_b
    == budget: Eq. 20's most probable configuration and the Neyman allocation (Eqs. 28-30); -inf forbids an arm.

    Ties (within :data:`TIE_RTOL`): the smallest sum_b |n_b - nbar| (exact, in integers), then the
    lexicographically smallest arms: closest to uniform GRPO, reproducible. A suffix DP over bins
    (V_b[c] = best score of bins b.. spending exactly c, vectorised over c) with a second table of the
    smallest deviation; reconstruction from bin 0 takes the smallest optimal arm. Raises
    :class:`InfeasibleBudgetError` (naming the budget) or ValueError for malformed inputs.
    """
    pb = _validate_problem(log_probs, counts, arms, budget)
    # Integer deviation of each arm scaled by sum(counts): |n * total - budget| is exact.
    dev = np.abs(pb.arms * int(pb.counts.sum()) - pb.budget).astype(np.int64)
    value, devs = _suffix_tables(pb, dev)
    return _reconstruct(pb, dev, value, devs)


def _suffix_tables(pb: _BudgetProblem, dev: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """V_b[c], the best score of bins b.. spending exactly c, and the smallest deviation among the
    (near-)optimal suffixes, on the windows of :class:`_BudgetProblem` (the DP of :func:`solve_exact_budget`)."""
    num_bins, pad, lp = pb.counts.size, pb.pad, pb.log_probs
    size = pad + pb.target + 1  # column pad + c holds suffix cost c
    value = [np.full(size, -np.inf) for _ in range(num_bins + 1)]
    devs = [np.full(size, _DEV_SENTINEL, dtype=np.int64) for _ in range(num_bins + 1)]
    value[num_bins][pad] = 0.0
    devs[num_bins][pad] = 0
    fbuf, ibuf, mask = _WORKSPACE.get(lp.shape[1], _max_width(pb))
    for b in range(num_bins - 1, -1, -1):
        lo, width = int(pb.lo[b]), int(pb.hi[b] - pb.lo[b] + 1)
        cand, dcand, near = fbuf[:, :width], ibuf[:, :width], mask[:, :width]
        starts = _starts(pb, b, lo)
        _shift_into(cand, value[b + 1], starts, lp[b])
        best = cand.max(axis=0)
        np.greater_equal(cand, best - _tolerance(best), out=near)
        _shift_into(dcand, devs[b + 1], starts, dev)
        np.logical_not(near, out=near)
        np.copyto(dcand, _DEV_SENTINEL, where=near)
        dmin = dcand.min(axis=0)
        dmin[~np.isfinite(best)] = _DEV_SENTINEL
        devs[b][pad + lo : pad + lo + width] = dmin
        value[b][pad + lo : pad + lo + width] = best
    return value, devs


def _reconstruct(pb: _BudgetProblem, dev: np.ndarray, value: list[np.ndarray], devs: list[np.ndarray]) -> np.ndarray:
    """Walk from bin 0 taking the smallest optimal arm (the lexicographic tie-break); arm values."""
    num_bins, pad, lp = pb.counts.size, pb.pad, pb.log_probs
    c = pb.target
    if not np.isfinite(value[0][pad + c]):
        raise _infeasible(pb.counts, pb.arms, pb.budget)
    chosen = np.empty(num_bins, dtype=np.int64)
    for b in range(num_bins):
        k = pb.cost[b]
        rest = pad + c - k  # >= 0 thanks to the pad; negative spends read fill entries
        cand_b = lp[b] + value[b + 1][rest]
        dcand_b = dev + devs[b + 1][rest]
        best_b = cand_b.max()
        near_b = (cand_b >= best_b - _tolerance(np.asarray(best_b))) & np.isfinite(cand_b)
        dmin_b = np.where(near_b, dcand_b, _DEV_SENTINEL).min()
        a = int(np.flatnonzero(near_b & (dcand_b == dmin_b))[0])
        chosen[b] = pb.arms[a]
        c -= int(k[a])
    assert c == 0
    return chosen


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x), axis=0)), overwriting ``x``; stays -inf for all -inf columns."""
    m = x.max(axis=0)
    safe = np.where(np.isfinite(m), m, 0.0)
    np.subtract(x, safe, out=x)
    np.exp(x, out=x)
    with np.errstate(divide="ignore"):
        return np.log(x.sum(axis=0)) + safe


class _Partition:
    """Log partition tables of prod_b p_b(n_b) under the exact budget, on the problem's windows:
    forward[b][pad + c] for bins 0..b-1 spending exactly c, backward[b][pad + c] for bins b..B-1."""

    def __init__(self, pb: _BudgetProblem) -> None:
        self.pb = pb
        num_bins, pad, lp = pb.counts.size, pb.pad, pb.log_probs
        size = pad + pb.target + 1
        fbuf, _, _ = _WORKSPACE.get(lp.shape[1], _max_width(pb))
        self.forward = [np.full(size, -np.inf) for _ in range(num_bins + 1)]
        self.forward[0][pad] = 0.0
        for b in range(num_bins):
            lo = int(pb.target - pb.hi[b + 1])  # prefix window of bins 0..b
            width = int(pb.hi[b + 1] - pb.lo[b + 1] + 1)
            cand = fbuf[:, :width]
            _shift_into(cand, self.forward[b], _starts(pb, b, lo), lp[b])
            self.forward[b + 1][pad + lo : pad + lo + width] = _logsumexp_rows(cand)
        self.backward = [np.full(size, -np.inf) for _ in range(num_bins + 1)]
        self.backward[num_bins][pad] = 0.0
        for b in range(num_bins - 1, -1, -1):
            lo, width = int(pb.lo[b]), int(pb.hi[b] - pb.lo[b] + 1)
            cand = fbuf[:, :width]
            _shift_into(cand, self.backward[b + 1], _starts(pb, b, lo), lp[b])
            self.backward[b][pad + lo : pad + lo + width] = _logsumexp_rows(cand)
        self.log_z = float(self.forward[num_bins][pad + pb.target])

    def marginals(self, arm_idx: np.ndarray | None = None) -> np.ndarray:
        """P(n_b = arms[a] | exact budget) by forward-backward: sum_c F_b[c] p_b(a) R_{b+1}[target - c -
        cost_b(a)] / Z; the full [B, A] matrix, or with ``arm_idx`` ([B]) one arm per bin."""
        pb = self.pb
        num_bins, pad = pb.counts.size, pb.pad
        fbuf, _, _ = _WORKSPACE.get(pb.log_probs.shape[1], _max_width(pb))
        out = np.zeros(pb.log_probs.shape if arm_idx is None else (num_bins,))
        for b in range(num_bins):
            arms_b = np.arange(pb.arms.size) if arm_idx is None else arm_idx[b : b + 1]
            plo = int(pb.target - pb.hi[b])  # prefix window of bins 0..b-1
            width = int(pb.hi[b] - pb.lo[b] + 1)
            fwd = self.forward[b][pad + plo : pad + plo + width]
            s = fbuf[: arms_b.size, :width]
            bwd = self.backward[b + 1]
            for row, a in enumerate(arms_b):
                # suffix spend of bins b+1.. for prefix spend plo + j: target - plo - j - k_a
                top = pad + pb.target - plo - int(pb.cost[b, a])
                rev = bwd[top - width + 1 : top + 1][::-1]
                np.add(fwd, rev, out=s[row])
            lse = _logsumexp_rows(s.T)
            with np.errstate(under="ignore"):
                vals = np.exp(lse + pb.log_probs[b, arms_b] - self.log_z)
            out[b] = vals if arm_idx is None else vals[0]
        return out

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """Arm indices drawn from the conditioned distribution, bins sampled last to first."""
        pb = self.pb
        num_bins, pad = pb.counts.size, pb.pad
        c = pb.target
        idx = np.empty(num_bins, dtype=np.int64)
        for b in range(num_bins - 1, -1, -1):
            k = pb.cost[b]
            logits = pb.log_probs[b] + self.forward[b][pad + c - k]
            w = np.exp(logits - logits.max())
            cdf = np.cumsum(w)
            # side="right" never lands on a zero-weight arm (its cdf equals its predecessor's).
            a = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), cdf.size - 1)
            assert logits[a] > -np.inf
            idx[b] = a
            c -= int(k[a])
        assert c == 0
        return idx


def _partition(log_probs: Any, counts: Any, arms: Any, budget: int) -> _Partition:
    pb = _validate_problem(log_probs, counts, arms, budget)
    part = _Partition(pb)
    if not np.isfinite(part.log_z):
        raise _infeasible(pb.counts, pb.arms, pb.budget)
    return part


def exact_budget_marginals(log_probs: Any, counts: Any, arms: Any, budget: int) -> np.ndarray:
    """[bins, arms] marginals P(n_b = arm | sum_b counts[b] n_b == budget) under prod_b p_b (unnormalised
    log-probabilities, -inf forbidden): the budget couples the bins, so EXP3 divides a played arm's gain
    by this marginal, not by p_b. Raises InfeasibleBudgetError when no configuration meets the budget."""
    return _partition(log_probs, counts, arms, budget).marginals()


def sample_exact_budget(log_probs: Any, counts: Any, arms: Any, budget: int, rng: np.random.Generator,
                        size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Draw configurations from prod_b p_b(n_b) conditioned on the exact budget (forward partition sums,
    backward sampling with the caller's seeded ``rng``): (arm values, each drawn arm's conditional
    marginal, EXP3's importance-weight denominator), shapes [bins], or [size, bins] for ``size`` draws.
    Raises InfeasibleBudgetError when no configuration meets the budget."""
    if size is not None and (isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0):
        raise ValueError(f"size must be None or an integer >= 0, got {size!r}")
    part = _partition(log_probs, counts, arms, budget)
    if size is None:
        idx = part.sample(rng)
        return part.pb.arms[idx].copy(), part.marginals(arm_idx=idx)
    full = part.marginals()
    idx = np.array([part.sample(rng) for _ in range(int(size))], dtype=np.int64).reshape(int(size), -1)
    rows = np.arange(idx.shape[1])[None, :]
    return part.pb.arms[idx], full[rows, idx]


# ---- the paper's equations, one function each ----


def exp_weights_arm_log_probs(scores: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """log p_b(n) of Eq. 17 as logaddexp(log(1 - gamma) + log_softmax, log(gamma / A)): stable, finite for
    gamma > 0 (the exact-budget selection sums log-probabilities over bins)."""
    s = eta * np.asarray(scores, dtype=np.float64)
    num_arms = s.shape[-1]
    m = s.max(axis=-1, keepdims=True)
    log_soft = s - m - np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
    if gamma == 0.0:
        return log_soft
    return np.logaddexp(math.log1p(-gamma) + log_soft, math.log(gamma / num_arms))


def exp_weights_arm_probs(scores: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """Eq. 17: p_b(n) = (1 - gamma) softmax(eta * score_b)(n) + gamma / A, per bin (last axis)."""
    s = eta * np.asarray(scores, dtype=np.float64)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (1.0 - gamma) * e / e.sum(axis=-1, keepdims=True) + gamma / s.shape[-1]


def gain_with_shadow_price(utility: np.ndarray, arms: np.ndarray, mu: float, n_mean: float) -> np.ndarray:
    """Eq. 18: G_b(n) = u_b(n) - mu * (n - nbar): extra rollouts only where their utility beats the price."""
    return np.asarray(utility, dtype=np.float64) - mu * (np.asarray(arms, dtype=np.float64) - n_mean)


def score_ema(score: np.ndarray, gain: np.ndarray, rate: float) -> np.ndarray:
    """Eq. 19: score_b(n) <- (1 - rate) score_b(n) + rate * G_b(n); an EMA, as the utilities drift."""
    return (1.0 - rate) * score + rate * gain


def dual_update(mu: float, nhat: float, n_mean: float, dual_lr: float) -> float:
    """Eq. 21: mu <- max(0, mu + dual_lr * (nhat - nbar)), nhat = sum_b qhat(b) argmax_n p_b(n), the
    unconstrained preference (the realised mean is nbar at every step: it would never move mu)."""
    return max(0.0, mu + dual_lr * (nhat - n_mean))


def neyman_scores(counts: np.ndarray, variances: np.ndarray, arms: np.ndarray) -> np.ndarray:
    """Eqs. 28-30 as DP scores -count_b v_b / n_b (Thm 4.2's n_b ∝ sqrt(v_b), solved in integers)."""
    c = np.asarray(counts, dtype=np.float64)[:, None]
    v = np.asarray(variances, dtype=np.float64)[:, None]
    return -c * v / np.asarray(arms, dtype=np.float64)[None, :]


def neyman_implied_price(counts: np.ndarray, variances: np.ndarray, budget: float) -> float:
    """Eq. 31: mu = (sum_b count_b sqrt(v_b) / budget)^2, the continuous solution's Lagrange multiplier
    v_b / n_b^2: the variance reduction one more rollout buys."""
    if budget <= 0:
        return 0.0
    s = float(np.sum(np.asarray(counts, dtype=np.float64) * np.sqrt(variances)))
    return (s / float(budget)) ** 2


def per_prompt_allocation(utility: np.ndarray, n_min: int, budget: int) -> tuple[np.ndarray, float]:
    """Exact-budget allocation maximising sum_i u_i(n_i) (``utility`` [prompts, arms], rows concave in n):
    from n_min, each further rollout to the largest marginal gain, optimal for separable concave
    utilities with unit costs. Ties: the smaller increment, then the earlier prompt. Returns (n per
    prompt, the last placed rollout's gain: this allocator's mu; 0 when none was placed)."""
    u = np.asarray(utility, dtype=np.float64)
    rows, num_arms = u.shape
    extra = int(budget) - rows * int(n_min)
    if extra < 0 or extra > rows * (num_arms - 1):
        raise InfeasibleBudgetError(f"budget {budget} is infeasible for {rows} prompts with {num_arms} arms from n_min={n_min}")
    n = np.full(rows, int(n_min), dtype=np.int64)
    if extra == 0 or rows == 0:
        return n, 0.0
    delta = np.diff(u, axis=1)  # [rows, arms - 1]: gain of the (n_min + k + 1)-th rollout
    r_idx, k_idx = np.indices(delta.shape)
    order = np.lexsort((r_idx.ravel(), k_idx.ravel(), -delta.ravel()))[:extra]
    n += np.bincount(r_idx.ravel()[order], minlength=rows)
    return n, float(delta.ravel()[order[-1]])


def argmax_toward(values: np.ndarray, arms: np.ndarray, target: float) -> np.ndarray:
    """Per row, the arm with the largest value; exact ties go to the arm closest to ``target``, then the
    smaller (uniform probabilities must prefer the GRPO budget, not an end of the arm range)."""
    values = np.asarray(values)
    arms_f = np.asarray(arms, dtype=np.float64)
    is_max = values == values.max(axis=-1, keepdims=True)
    # Rank arms by distance to target, then by value; pick the first maximal one in that order.
    order = np.lexsort((arms_f, np.abs(arms_f - target)))
    first = np.argmax(is_max[..., order], axis=-1)
    return np.asarray(arms)[order[first]]
