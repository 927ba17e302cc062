"""The per-step metrics of docs/algorithm.md section 4 and their names, in one place (numpy only).

Keys live under ``gdro/``, per-bin ones flattened as ``gdro/<name>/bin_<b>`` (a scalar to every
logger). Every value is a finite float; a bin absent from a step logs no
:data:`PRESENT_ONLY_METRICS`, and an adversary that is off logs neutral values (why:
docs/algorithm.md, "Metrics (section 4)").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.classifier import int_array

PREFIX = "gdro/"

PER_BIN_METRICS: tuple[str, ...] = (
    "prompt_share",  # qhat(b): the bin's share of the step's prompts
    "count",  # prompts of the bin in the step (0 = absent; lets plots mask absent bins)
    "prompt_weight",  # Prompt-GDRO advantage multiplier w(b) used this step (Eq. 16)
    "q",  # Prompt-GDRO bin distribution q_t(b) (Eq. 15)
    "score",  # Prompt-GDRO EMA score S(b) (Eq. 12)
    "omega",  # Prompt-GDRO exponential weight omega(b) (Eq. 14)
    "loss",  # mean loss signal l over the bin's prompts in the step (Eq. 13, before share norm.)
    "acc",  # mean correctness of the bin's rollouts (pooled successes / trials)
    "rollout_n",  # rollouts per prompt n_b
    "budget_share",  # sum_{x in b} n_x / sum_x n_x
    "zero_adv",  # share of the bin's groups that are all correct or all wrong (GRPO advantage 0)
)

SCALAR_METRICS: tuple[str, ...] = (
    "mu_data",  # mean bin index under the data: sum_b b qhat(b) (Eq. 32)
    "mu_weight",  # mean bin index under the weights: sum_b b qhat_w(b) (Eq. 32)
    "lead_lag",  # mu_weight - mu_data (Eq. 32)
    "weight_entropy",  # Shannon entropy (nats) of q_t
    "mean_n",  # mean rollouts per prompt of the step's groups (nbar when they are whole generation calls)
    "shadow_price",  # Rollout-GDRO's mu (Eq. 21 / Eq. 31)
    "wse",  # weighted-standard-error proxy sum_b qhat(b) sigma_b / sqrt(n_b) (Eq. 33)
    "wse_uniform",  # the same with n_b = nbar for every bin: the compute-matched baseline (Eq. 33)
    "zero_adv_share",  # share of the step's groups that are all correct or all wrong: what GRPO wastes
    "controller_time_s",  # the controllers' own wall time in the step
    "num_prompts",  # prompts in the step
    "num_rollouts",  # rollouts in the step (sum of n)
    "dropped_nonfinite",  # non-finite loss signals dropped by Prompt-GDRO in this step
    "dropped_nonfinite_total",  # ... since the start of the run
)

#: Every metric's short name; full keys come from :func:`metric_keys`.
METRIC_NAMES: tuple[str, ...] = PER_BIN_METRICS + SCALAR_METRICS

#: Per-bin metrics that average over the bin's prompts of the step: logged for present bins only.
PRESENT_ONLY_METRICS: tuple[str, ...] = ("prompt_weight", "loss", "acc", "rollout_n", "zero_adv")


def bin_key(name: str, b: int) -> str:
    """The logged key of per-bin metric ``name`` for bin ``b``: ``gdro/<name>/bin_<b>``."""
    return f"{PREFIX}{name}/bin_{int(b)}"


@lru_cache(maxsize=16)
def _key_table(num_bins: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(per-bin keys in :data:`PER_BIN_METRICS` x bin order, scalar keys), formatted once per B."""
    per_bin = tuple(bin_key(name, b) for name in PER_BIN_METRICS for b in range(num_bins))
    return per_bin, tuple(PREFIX + name for name in SCALAR_METRICS)


def metric_keys(num_bins: int) -> list[str]:
    """Every key :func:`step_metrics` can return for ``num_bins`` bins, in a stable order."""
    per_bin, scalars = _key_table(int(num_bins))
    return [*per_bin, *scalars]


def step_keys(counts: ArrayLike) -> list[str]:
    """The keys :func:`step_metrics` returns, in order, for a step whose bins hold ``counts`` prompts."""
    present = np.asarray(counts) > 0
    per_bin, scalars = _key_table(int(present.shape[0]))
    return [k for k, keep in zip(per_bin, _kept(present)) if keep] + list(scalars)


def _kept(present: NDArray[np.bool_]) -> list[bool]:
    """Which per-bin keys (:func:`_key_table`'s order) a step logs: absent bins drop PRESENT_ONLY_METRICS."""
    return np.concatenate([present if name in PRESENT_ONLY_METRICS else np.ones_like(present)
                           for name in PER_BIN_METRICS]).tolist()


def per_bin_series(metrics: Mapping[str, float], name: str, num_bins: int) -> NDArray[np.float64]:
    """Per-bin metric ``name`` of a logged row as an array [B], NaN where missing (absent bins)."""
    return np.array([float(metrics.get(bin_key(name, b), np.nan)) for b in range(num_bins)])


# ---- the quantities ----------------------------------------------------------------------------


def _share(x: NDArray[np.float64] | NDArray[np.int64]) -> NDArray[np.float64]:
    """``x`` over its total (all 0 when the total is 0): every share of this module."""
    total = x.sum()
    return x / total if total > 0 else np.zeros(x.shape[0])


def _ratio(num: NDArray[np.float64], den: NDArray[np.float64] | NDArray[np.int64]) -> NDArray[np.float64]:
    """``num / den`` per bin, 0 where ``den`` is 0 (an absent bin): every per-bin mean of this module."""
    return np.divide(num, den, out=np.zeros(num.shape[0]), where=den > 0)


def bin_shares(bins: NDArray[np.int64], num_bins: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """qhat(b) = prompts of bin b / prompts in the step, and the counts; all 0 for an empty step."""
    counts = np.bincount(bins, minlength=num_bins).astype(np.int64)
    return _share(counts), counts


def bin_accuracy(
    bins: NDArray[np.int64], successes: NDArray[np.float64], n: NDArray[np.float64], num_bins: int
) -> NDArray[np.float64]:
    """Each bin's pooled correctness sum successes / sum trials (Eq. 33's p_b), 0 for an absent bin."""
    return _ratio(np.bincount(bins, weights=successes, minlength=num_bins), np.bincount(bins, weights=n, minlength=num_bins))


def bin_rollouts(
    bins: NDArray[np.int64], n: NDArray[np.float64], num_bins: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(n_b, budget share): each bin's mean rollouts per prompt and sum_{x in b} n_x / sum n (0 if absent)."""
    sums = np.bincount(bins, weights=n, minlength=num_bins)
    return _ratio(sums, np.bincount(bins, minlength=num_bins)), _share(sums)


def mean_bin_index(shares: NDArray[np.float64]) -> float:
    """sum_b b * share(b): the mean difficulty-bin index (bin 0 = hardest) under ``shares``."""
    return float(np.dot(_bin_indices(shares.shape[0]), shares))


@lru_cache(maxsize=8)
def _bin_indices(num_bins: int) -> NDArray[np.float64]:
    """0..B-1 as float64 (what np.dot casts ``np.arange(B)`` to), built once per B, read-only."""
    idx = np.arange(num_bins, dtype=np.float64)
    idx.flags.writeable = False
    return idx


def weighted_shares(shares: NDArray[np.float64], weights: NDArray[np.float64]) -> NDArray[np.float64]:
    """qhat_w(b) = qhat(b) w(b) / sum_b' qhat(b') w(b'): the data as the weighted loss sees it (Eq. 32)."""
    return _share(shares * weights)


def lead_lag(shares: NDArray[np.float64], weights: NDArray[np.float64]) -> tuple[float, float, float]:
    """Eq. 32: (mu_data, mu_weight, mu_weight - mu_data); negative: the weights lead toward harder bins."""
    mu_data = mean_bin_index(shares)
    mu_weight = mean_bin_index(weighted_shares(shares, weights))
    return mu_data, mu_weight, mu_weight - mu_data


def weight_entropy(q: NDArray[np.float64]) -> float:
    """Shannon entropy (nats) of the Prompt-GDRO bin distribution q_t; log B when uniform."""
    p = q[q > 0]
    return float(-(p * np.log(p)).sum())


def _wse_terms(shares: NDArray[np.float64], acc: NDArray[np.float64]) -> tuple[NDArray[np.bool_], NDArray[np.float64]]:
    """Eq. 33's numerators: (the present bins, qhat(b) sigma_b of each), sigma_b = sqrt(p_b (1 - p_b))."""
    present = shares > 0
    # np.clip's lower bound as its ufunc, without its Python wrapper
    sigma = np.sqrt(np.maximum(acc * (1.0 - acc), 0.0))
    return present, shares[present] * sigma[present]


def wse_proxy(shares: NDArray[np.float64], acc: NDArray[np.float64], n_b: NDArray[np.float64]) -> float:
    """Eq. 33: WSE(t) = sum_b qhat(b) sigma_b / sqrt(n_b) over the present bins."""
    present, terms = _wse_terms(shares, acc)
    return float((terms / np.sqrt(n_b[present])).sum())


def wse_uniform(shares: NDArray[np.float64], acc: NDArray[np.float64], n_mean: float) -> float:
    """Eq. 33's compute-matched uniform baseline: the WSE proxy with n_b = nbar for every bin."""
    return float((_wse_terms(shares, acc)[1] / np.sqrt(float(n_mean))).sum())


# ---- one step ----------------------------------------------------------------------------------


def _NEUTRAL_PER_BIN(num_bins: int) -> tuple[float, ...]:  # noqa: N802 - a table, read as a constant
    """Logged value of (prompt_weights, q, scores, omega, bin_losses) when an adversary is off."""
    return (1.0, 1.0 / num_bins, 0.0, 1.0, 0.0)


def step_metrics(
    num_bins: int, bins: ArrayLike, successes: ArrayLike, n: ArrayLike, *, n_mean: float | None = None,
    prompt_weights: ArrayLike | None = None, q: ArrayLike | None = None, scores: ArrayLike | None = None,
    omega: ArrayLike | None = None, bin_losses: ArrayLike | None = None, shadow_price: float = 0.0,
    controller_time_s: float = 0.0, dropped_nonfinite: int = 0, dropped_nonfinite_total: int = 0,
) -> dict[str, float]:
    """Every metric of docs/algorithm.md section 4 for one step, keyed as :func:`metric_keys`, from
    each prompt's bin, successes (of ``acc``) and rollouts n; ``n_mean`` (None: the realised mean)
    for the uniform baseline; Prompt-GDRO's per-bin arrays (None: the neutral values of an
    adversary that is off). A ValueError names a malformed or non-finite argument."""
    B, b, s, nn = _checked_prompts(num_bins, bins, successes, n)
    given = {"prompt_weights": prompt_weights, "q": q, "scores": scores, "omega": omega, "bin_losses": bin_losses}
    per_bin_inputs = [_per_bin(name, given[name], B, default) for name, default in zip(given, _NEUTRAL_PER_BIN(B))]
    for name, value in (("shadow_price", shadow_price), ("controller_time_s", controller_time_s)):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be finite, got {value!r}")
    return step_metrics_prepared(
        B, b, s, nn, n_mean=n_mean, per_bin=tuple(per_bin_inputs), shadow_price=shadow_price,
        controller_time_s=controller_time_s, dropped_nonfinite=dropped_nonfinite,
        dropped_nonfinite_total=dropped_nonfinite_total,
    )


def step_metrics_prepared(
    num_bins: int, bins: NDArray[np.int64], successes: NDArray[np.float64], n: NDArray[np.float64], *,
    n_mean: float | None, per_bin: tuple[NDArray[np.float64], ...], shadow_price: float = 0.0,
    controller_time_s: float = 0.0, dropped_nonfinite: int = 0, dropped_nonfinite_total: int = 0,
) -> dict[str, float]:
    """:func:`step_metrics` without its argument checks, for the controller's valid inputs (int64
    bins in [0, B), float64 0 <= s <= n, n >= 1, ``per_bin`` the five [B] arrays or None); the
    output is still checked finite, naming the first bad metric."""
    B, b, s, nn = int(num_bins), bins, successes, n
    given = tuple(np.full(B, d) if v is None else v for v, d in zip(per_bin, _NEUTRAL_PER_BIN(B), strict=True))
    table, zero = _per_bin_metrics(B, b, s, nn, given)
    mean_n = float(nn.sum() / nn.size) if nn.size else 0.0  # np.mean's own sum and division, without its wrapper
    nbar = mean_n if n_mean is None else float(n_mean)
    if not (np.isfinite(nbar) and (nbar > 0 or nn.size == 0)):
        raise ValueError(f"n_mean must be a positive finite number, got {n_mean!r}")
    mu_data, mu_weight, lag = lead_lag(table["prompt_share"], table["prompt_weight"])
    scalars = {
        "mu_data": mu_data,
        "mu_weight": mu_weight,
        "lead_lag": lag,
        "weight_entropy": weight_entropy(table["q"]),
        "mean_n": mean_n,
        "shadow_price": float(shadow_price),
        "wse": wse_proxy(table["prompt_share"], table["acc"], table["rollout_n"]),
        "wse_uniform": wse_uniform(table["prompt_share"], table["acc"], nbar) if nn.size else 0.0,
        "zero_adv_share": float(zero.sum() / zero.size) if zero.size else 0.0,
        "controller_time_s": float(controller_time_s),
        "num_prompts": float(b.shape[0]),
        "num_rollouts": float(nn.sum()),
        "dropped_nonfinite": float(dropped_nonfinite),
        "dropped_nonfinite_total": float(dropped_nonfinite_total),
    }
    return _logged(B, table, scalars)


def _per_bin_metrics(
    B: int, b: NDArray[np.int64], s: NDArray[np.float64], nn: NDArray[np.float64],  # noqa: N803 - B as in the docs
    given: tuple[NDArray[np.float64], ...],
) -> tuple[dict[str, NDArray[np.float64]], NDArray[np.float64]]:
    """The :data:`PER_BIN_METRICS` of one step by name, and each prompt's zero-advantage flag."""
    w, qq, sc, om, loss = given
    counts = np.bincount(b, minlength=B).astype(np.int64)
    trials_b = np.bincount(b, weights=nn, minlength=B)
    # a group whose rollouts all agree has GRPO advantage 0 for every rollout (no gradient)
    zero = ((s == 0) | (s == nn)).astype(np.float64)
    table = {
        "prompt_share": _share(counts),
        "count": counts.astype(np.float64),
        "prompt_weight": w,
        "q": qq,
        "score": sc,
        "omega": om,
        "loss": np.where(counts > 0, loss, 0.0),
        "acc": _ratio(np.bincount(b, weights=s, minlength=B), trials_b),
        "rollout_n": _ratio(trials_b, counts),
        "budget_share": _share(trials_b),
        "zero_adv": _ratio(np.bincount(b, weights=zero, minlength=B), counts),
    }
    return table, zero


def _logged(B: int, per_bin: dict[str, NDArray[np.float64]], scalars: dict[str, float]) -> dict[str, float]:  # noqa: N803
    """The logged row (absent bins' PRESENT_ONLY_METRICS left out); a ValueError names a non-finite value."""
    per_bin_keys, scalar_keys = _key_table(B)
    stacked = np.concatenate([np.asarray(per_bin[name], dtype=np.float64) for name in PER_BIN_METRICS])
    scalar_values = [float(scalars[name]) for name in SCALAR_METRICS]
    if not (np.isfinite(stacked).all() and all(map(math.isfinite, scalar_values))):
        bad = next(k for k, v in zip((*per_bin_keys, *scalar_keys), (*stacked.tolist(), *scalar_values))
                   if not math.isfinite(v))
        raise ValueError(f"metric {bad} is not finite: an input of step_metrics is (drop non-finite values first)")
    values = stacked.tolist()
    present = per_bin["count"] > 0
    if present.all():
        out = dict(zip(per_bin_keys, values))
    else:
        out = {k: v for k, v, ok in zip(per_bin_keys, values, _kept(present)) if ok}
    out.update(zip(scalar_keys, scalar_values))
    return out


def _checked_prompts(
    num_bins: int, bins: ArrayLike, successes: ArrayLike, n: ArrayLike
) -> tuple[int, NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
    """(B, bins, successes, n) of :func:`step_metrics`, checked: a ValueError naming the argument."""
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"num_bins must be an integer >= 1, got {num_bins!r}")
    B = int(num_bins)
    b = int_array("bins", bins, integral_floats=True, num_bins=B)
    s = _finite_array("successes", successes, b.shape[0])
    nn = _finite_array("n", n, b.shape[0])
    if nn.size and nn.min() < 1:
        raise ValueError(f"n (rollouts per prompt) must be >= 1, got min {nn.min()}")
    if s.size and (s.min() < 0 or np.any(s > nn)):
        raise ValueError("successes must lie in [0, n] for every prompt")
    return B, b, s, nn


def _finite_array(name: str, values: ArrayLike, length: int) -> NDArray[np.float64]:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.shape[0] != length:
        raise ValueError(f"{name} must be 1-D with one entry per prompt ({length}), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite (drop non-finite rewards before computing metrics)")
    return a


def _per_bin(name: str, values: ArrayLike | None, num_bins: int, default: float) -> NDArray[np.float64]:
    if values is None:
        return np.full(num_bins, default)
    a = np.asarray(values, dtype=np.float64)
    if a.shape != (num_bins,):
        raise ValueError(f"{name} must have shape ({num_bins},), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    return a
