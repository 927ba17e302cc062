"""Rollout-GDRO: the compute adversary (docs/algorithm.md section 3; paper 3.3, 4.3, Eqs. 17-21, 28-31).

Every prompt of difficulty bin b gets n_b rollouts, n_b in the arm set {n_min, ..., n_max}, and the
step spends exactly ``n_mean * len(bins)`` rollouts: compute-neutral against GRPO at n = n_mean.

The allocators (one class each, registered by name in :mod:`verl_gdro.allocators`) share this
module's functions; the per-bin ones share one exact solver, :func:`solve_exact_budget`:

- ``bandit`` (default): one exponential-weights learner per bin over the arms (Eq. 17), gains with a
  shadow price (Eq. 18), an arm-score EMA (Eq. 19), a configuration chosen under the exact budget
  (Eq. 20: most probable, ``map``, or drawn from the conditioned product distribution, ``sample``)
  and a dual update of the shadow price from the unconstrained preference (Eq. 21).
- ``neyman`` (Thm 4.2): minimise sum_b count_b v_b / n_b (Eqs. 28-30) under the same budget, with
  the implied shadow price of the continuous solution (Eq. 31) reported as the allocator's ``mu``.

Why an exact dynamic program rather than greedy marginal allocation: one step of bin b costs
count_b budget units, so the problem is a multiple-choice knapsack with an equality constraint;
greedy is not exact there. The DP is O(bins * arms * budget) and vectorised over the budget axis.

Equation numbers: the spec cites Eqs. 17-21 and 28-31 for this section; the individual numbers
above follow the order in which the spec describes the steps (the paper text was not at hand to
check each one), so treat a single number as a pointer into that range.

numpy only: this module must never import verl or torch.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

# The per-prompt evidence and utilities serve both adversaries: they live on the math floor in
# verl_gdro.evidence and are re-exported here, where the allocators use them.
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

#: Relative tolerance under which two DP scores count as equal optima. Mathematically equal sums
#: can differ in the last bits once float addition is involved (0.1 + 0.2 != 0.3); 1e-12 relative
#: (absolute below magnitude 1) is ~4500 ulps, far above the rounding of a sum of a few dozen
#: terms and far below any difference a learner's scores can meaningfully express.
TIE_RTOL = 1e-12

#: Sampled draws kept for the importance weights between two updates: the step's call plus its
#: refills; an older draw's groups are weighed as unknown (skipped and counted), never wrongly.
MAX_RECORDED_DRAWS = 16

_DEV_SENTINEL = np.iinfo(np.int64).max // 4


class InfeasibleBudgetError(ValueError):
    """No choice of one allowed arm per bin spends the budget exactly."""


# --------------------------------------------------------------------------------------------
# Exact-budget solver, sampler and marginals
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _BudgetProblem:
    """A validated exact-budget problem, costs reduced by their common divisor, with windows.

    ``cost[b, a] = counts[b] * arms[a] / g`` and ``target = budget / g`` where g is the gcd of
    every cost: dividing by it shrinks the budget axis (e.g. when every bin holds an even number of
    prompts) without changing the feasible set.

    ``lo[b]..hi[b]`` is the window of suffix costs (spent by bins b..B-1) that can still be part of
    a configuration meeting the target: at least what the suffix must spend and what the prefix
    cannot cover, at most the converse. Tables are only computed on these windows; states outside
    them can never complete the budget, so leaving them at -inf changes nothing and roughly halves
    the work for realistic batches.
    """

    log_probs: np.ndarray  # [B, A] float64, finite or -inf
    counts: np.ndarray  # [B] int64 > 0
    arms: np.ndarray  # [A] int64 strictly increasing >= 1
    budget: int
    cost: np.ndarray  # [B, A] int64, reduced
    target: int  # reduced budget (meaningful only when feasible_range)
    lo: np.ndarray  # [B + 1] suffix-cost window, lower ends
    hi: np.ndarray  # [B + 1] suffix-cost window, upper ends
    pad: int  # largest reduced cost: tables carry this many fill columns in front
    feasible_range: bool  # False: provably infeasible (divisibility or empty window)


def _as_int_array(x: Any, name: str, ndim: int = 1) -> np.ndarray:
    """Convert to int64, rejecting non-integral values (a float count is a caller bug)."""
    arr = np.asarray(x)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D integer array, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype == bool:
        raise ValueError(f"{name} must hold integers, got booleans")
    if not np.issubdtype(arr.dtype, np.integer):
        if (
            not np.issubdtype(arr.dtype, np.floating)
            or not np.all(np.isfinite(arr))
            or np.any(arr != np.round(arr))
        ):
            raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _validate_problem(log_probs: Any, counts: Any, arms: Any, budget: Any) -> _BudgetProblem:
    counts_a = _as_int_array(counts, "counts")
    arms_a = _as_int_array(arms, "arms")
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
    else:
        lo, hi = suf_lo, suf_lo
    return _BudgetProblem(
        log_probs=lp, counts=counts_a, arms=arms_a, budget=budget_i, cost=cost, target=target, lo=lo, hi=hi,
        pad=int(cost.max()) if cost.size else 0, feasible_range=feasible
    )


def _infeasible(problem: _BudgetProblem) -> InfeasibleBudgetError:
    lo = int(np.sum(problem.counts * problem.arms[0]))
    hi = int(np.sum(problem.counts * problem.arms[-1]))
    return InfeasibleBudgetError(
        f"budget={problem.budget} cannot be met exactly with counts={problem.counts.tolist()} and "
        f"arms={problem.arms.tolist()} (one allowed arm per bin, -inf log_probs excluded; "
        f"the unconstrained range of totals is [{lo}, {hi}])")


class _Workspace(threading.local):
    """Per-thread scratch buffers for the DP, reused across calls.

    Why: a fresh [arms, budget] temporary is over glibc's mmap threshold (~128 KiB) for realistic
    budgets, so numpy would map and page-fault new memory for every intermediate result; on a
    sandboxed or busy host that cost dominated the solver (measured: ~0.5 ms per temporary).
    Writing into buffers that persist keeps the solver well under its 5 ms target.
    """

    def __init__(self) -> None:
        self.fbuf = np.empty((0, 0))
        self.ibuf = np.empty((0, 0), dtype=np.int64)
        self.mask = np.empty((0, 0), dtype=bool)

    def get(self, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Float, int64 and bool buffers of shape (rows, cols) (views into persistent memory)."""
        if self.fbuf.shape[0] < rows or self.fbuf.shape[1] < cols:
            shape = (max(rows, self.fbuf.shape[0]), max(cols, self.fbuf.shape[1]))
            self.fbuf = np.empty(shape)
            self.ibuf = np.empty(shape, dtype=np.int64)
            self.mask = np.empty(shape, dtype=bool)
        return self.fbuf[:rows, :cols], self.ibuf[:rows, :cols], self.mask[:rows, :cols]


_WORKSPACE = _Workspace()


def _max_width(pb: _BudgetProblem) -> int:
    return int((pb.hi - pb.lo).max()) + 1


def _shift_into(out: np.ndarray, row: np.ndarray, starts: np.ndarray, add: np.ndarray) -> None:
    """out[a, j] = row[starts[a] + j] + add[a]: one bin's DP step for every arm.

    ``row`` is a table padded with ``pad`` fill entries in front and ``starts[a] = pad + lo -
    cost[a]``, so spends below zero read fill values (-inf or the sentinel) instead of wrapping
    around. One contiguous copy-and-add per arm: measured faster than a single fancy-index gather
    (which needs an index array as large as the output) or a take over a strided window view.
    """
    width = out.shape[1]
    first = starts.tolist()
    if len(first) > 1 and row.flags.c_contiguous:
        step = first[1] - first[0]
        if step != 0 and first == list(range(first[0], first[0] + step * len(first), step)):
            # Starts in arithmetic progression (consecutive arms: cost_b(a) = count_b * a / g): the
            # shifted copies are one strided view of ``row``, added in one call. The same
            # element-wise sums as the per-arm loop below, ~3x fewer microseconds per DP stage.
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
    """The arm value per bin maximising sum_b log_probs[b, a_b] s.t. sum_b counts[b] * n_b == budget.

    Used for Eq. 20 (most probable configuration under the exact budget) and for the Neyman
    allocation (Eqs. 28-30, scores -count_b v_b / n): one exact solver for both allocators.

    Args:
        log_probs: [bins, arms] scores to maximise; -inf marks a forbidden arm.
        counts: prompts per bin, integers > 0.
        arms: the arm values, strictly increasing integers >= 1.
        budget: the exact total, an integer >= 0.

    Returns:
        int64 array [bins] of arm VALUES (not indices).

    Ties (total scores equal within :data:`TIE_RTOL`): the smallest sum_b |n_b - budget /
    sum(counts)| (computed exactly in integers, scaled by sum(counts)), then the lexicographically
    smallest arm vector (bin 0 first). Why: among equally good configurations the one closest to
    uniform GRPO changes the least, and a fixed order makes the result reproducible.

    Method: a suffix DP over bins, V_b[c] = best score of bins b.. spending exactly c, vectorised
    over the budget axis (per bin, a max over arms of shifted copies of V_{b+1}); a second integer
    table holds the smallest deviation among the (near-)optimal suffixes. Reconstruction walks
    from bin 0 and takes the smallest optimal arm, which gives the lexicographic tie-break.
    Tolerance ties are resolved stage by stage, so the result equals brute force whenever
    distinct optima differ by more than ~bins * TIE_RTOL and equal optima by rounding only.

    Raises:
        InfeasibleBudgetError: no configuration meets the budget (the message names the budget).
        ValueError: malformed inputs (shapes, counts <= 0, arms not increasing, budget < 0).
    """
    pb = _validate_problem(log_probs, counts, arms, budget)
    num_bins = pb.counts.size
    if num_bins == 0:
        if pb.budget == 0:
            return np.zeros(0, dtype=np.int64)
        raise _infeasible(pb)
    if not pb.feasible_range:
        raise _infeasible(pb)
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
        raise _infeasible(pb)
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
    """Log partition tables of prod_b p_b(n_b) restricted to the exact budget.

    forward[b][pad + c]: log total mass of configurations of bins 0..b-1 spending exactly c;
    backward[b][pad + c]: the same for bins b..B-1. Both only on the windows of
    :class:`_BudgetProblem` (prefix windows are target minus suffix windows).
    """

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

    def marginals(self, bins: np.ndarray | None = None, arm_idx: np.ndarray | None = None) -> np.ndarray:
        """Conditional probabilities P(n_b = arms[a] | exact budget) by forward-backward.

        P(a_b = a) = sum_c F_b[c] p_b(a) R_{b+1}[target - c - cost_b(a)] / Z over prefix spends
        c. Without arguments: the full [B, A] matrix; with ``arm_idx`` ([B]): one arm per bin.
        """
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
            if arm_idx is None:
                out[b] = vals
            else:
                out[b] = vals[0]
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
    if pb.counts.size == 0 and pb.budget != 0:
        raise _infeasible(pb)
    if not pb.feasible_range:
        raise _infeasible(pb)
    part = _Partition(pb)
    if not np.isfinite(part.log_z):
        raise _infeasible(pb)
    return part


def exact_budget_marginals(log_probs: Any, counts: Any, arms: Any, budget: int) -> np.ndarray:
    """[bins, arms] marginals P(n_b = arm | sum_b counts[b] n_b == budget) under prod_b p_b.

    ``log_probs`` are (possibly unnormalised) per-bin log-probabilities, -inf forbidden. The
    conditioning couples the bins, so a marginal can be far from p_b itself: EXP3 must divide a
    played arm's gain by this conditional marginal, not by p_b, to stay unbiased.
    Raises InfeasibleBudgetError when no configuration meets the budget.
    """
    return _partition(log_probs, counts, arms, budget).marginals()


def sample_exact_budget(
    log_probs: Any,
    counts: Any,
    arms: Any,
    budget: int,
    rng: np.random.Generator,
    size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw configurations from prod_b p_b(n_b) conditioned on the exact budget.

    Forward log partition sums over the bins, then backward sampling with ``rng`` (the caller's
    seeded generator, so the draw is reproducible and its state checkpointable).

    Args:
        size: None for one draw; an int for that many independent draws (the partition tables
            are computed once).

    Returns:
        (values, marginals): the arm value per bin, and each drawn arm's conditional marginal
        probability (forward-backward): the importance weight's denominator for EXP3. Shapes
        [bins], or [size, bins] when ``size`` is given.
    Raises InfeasibleBudgetError when no configuration meets the budget.
    """
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


# --------------------------------------------------------------------------------------------
# The paper's equations, one function each
# --------------------------------------------------------------------------------------------


def exp_weights_arm_log_probs(scores: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """log p_b(n) of Eq. 17, computed stably (never -inf for finite scores when gamma > 0).

    log((1 - gamma) softmax(eta * s) + gamma / A) = logaddexp(log(1-gamma) + log_softmax, log(gamma/A)).
    Log space matters: the exact-budget selection sums log-probabilities over bins.
    """
    s = eta * np.asarray(scores, dtype=np.float64)
    num_arms = s.shape[-1]
    m = s.max(axis=-1, keepdims=True)
    log_soft = s - m - np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
    if gamma == 0.0:
        return log_soft
    return np.logaddexp(math.log1p(-gamma) + log_soft, math.log(gamma / num_arms))


def exp_weights_arm_probs(scores: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """Eq. 17: p_b(n) = (1 - gamma) softmax(eta * score_b)(n) + gamma / A, per bin (last axis).

    The gamma / A floor keeps every arm explorable and every log-probability finite.
    """
    s = eta * np.asarray(scores, dtype=np.float64)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (1.0 - gamma) * e / e.sum(axis=-1, keepdims=True) + gamma / s.shape[-1]


def gain_with_shadow_price(utility: np.ndarray, arms: np.ndarray, mu: float, n_mean: float) -> np.ndarray:
    """Eq. 18: G_b(n) = u_b(n) - mu * (n - nbar).

    The shadow price mu charges each rollout above the mean budget (and credits each below), so
    the learner buys extra rollouts only where their utility beats the going price.
    """
    return np.asarray(utility, dtype=np.float64) - mu * (np.asarray(arms, dtype=np.float64) - n_mean)


def score_ema(score: np.ndarray, gain: np.ndarray, rate: float) -> np.ndarray:
    """Eq. 19: score_b(n) <- (1 - rate) score_b(n) + rate * G_b(n) (rate = score_ema = 0.4).

    An EMA rather than a cumulative sum because the utilities drift as the policy learns: the
    learner must track the current frontier, not the average over the whole run.
    """
    return (1.0 - rate) * score + rate * gain


def dual_update(mu: float, nhat: float, n_mean: float, dual_lr: float) -> float:
    """Eq. 21: mu <- max(0, mu + dual_lr * (nhat - nbar)), nhat the unconstrained preference.

    Why nhat and not the realised mean: the exact budget makes the realised mean equal nbar at
    every step, so the paper's literal update would never move mu. nhat = sum_b qhat(b) argmax_n
    p_b(n) measures how much the bins would spend if unconstrained; mu rises until that equals nbar.
    """
    return max(0.0, mu + dual_lr * (nhat - n_mean))


def neyman_scores(counts: np.ndarray, variances: np.ndarray, arms: np.ndarray) -> np.ndarray:
    """Eqs. 28-30 as DP scores: maximise -sum_b count_b v_b / n_b, i.e. minimise the variance proxy.

    The continuous optimum is the square-root rule n_b ∝ sqrt(v_b) (Thm 4.2); the exact-budget DP
    solves the integer version exactly.
    """
    c = np.asarray(counts, dtype=np.float64)[:, None]
    v = np.asarray(variances, dtype=np.float64)[:, None]
    return -c * v / np.asarray(arms, dtype=np.float64)[None, :]


def neyman_implied_price(counts: np.ndarray, variances: np.ndarray, budget: float) -> float:
    """Eq. 31: mu = (sum_b count_b sqrt(v_b) / budget)^2, the shadow price of the continuous solution.

    At the optimum of min sum count_b v_b / n_b s.t. sum count_b n_b = budget, the Lagrange
    multiplier equals v_b / n_b^2 for every bin, which with n_b = sqrt(v_b) budget / sum count sqrt(v)
    gives this value: the marginal variance reduction bought by one more rollout.
    """
    if budget <= 0:
        return 0.0
    s = float(np.sum(np.asarray(counts, dtype=np.float64) * np.sqrt(variances)))
    return (s / float(budget)) ** 2


def per_prompt_allocation(
    utility: np.ndarray, n_min: int, budget: int
) -> tuple[np.ndarray, float]:
    """Exact-budget allocation maximising sum_i u_i(n_i), per prompt, by greedy marginal gains.

    ``utility`` is [prompts, arms] (arms n_min..n_max in order), each row concave in n. Every prompt
    starts at n_min and the remaining ``budget - prompts * n_min`` rollouts go, one at a time, to the
    largest marginal gains. For separable concave utilities with unit costs this greedy is optimal
    (unlike the per-bin problem, where one step of a bin costs its count). Ties: the smaller
    increment index (spreading), then the earlier prompt, so the result is deterministic.

    Returns (n per prompt, the marginal gain of the last rollout placed: the budget's shadow price,
    Eq. 31's mu for this allocator; 0 when nothing beyond n_min was placed).
    """
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
    """Per row, the arm with the largest value; exact ties go to the arm closest to ``target``
    (then the smaller arm). Why toward nbar: with uniform probabilities (e.g. at the start) the
    unconstrained preference must be the GRPO budget, not an arbitrary end of the arm range."""
    values = np.asarray(values)
    arms_f = np.asarray(arms, dtype=np.float64)
    is_max = values == values.max(axis=-1, keepdims=True)
    # Rank arms by distance to target, then by value; pick the first maximal one in that order.
    order = np.lexsort((arms_f, np.abs(arms_f - target)))
    first = np.argmax(is_max[..., order], axis=-1)
    return np.asarray(arms)[order[first]]
