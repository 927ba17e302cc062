"""The per-step metrics of docs/algorithm.md section 4, with their names, as pure numpy functions.

One place defines every metric name (:data:`PER_BIN_METRICS`, :data:`SCALAR_METRICS`,
:func:`metric_keys`), so the verl trainer, the CPU demo, the plots and the tests cannot drift
apart. All keys live under ``gdro/``; per-bin metrics are flattened as ``gdro/<name>/bin_<b>``
(e.g. ``gdro/prompt_share/bin_3``), which every logger (console, wandb, tensorboard, verl's
``file`` JSONL) accepts as a scalar.

Every logged value is a finite float, always: loggers and the CPU end-to-end test check
finiteness. Decisions for bins absent from a step (documented in docs/algorithm.md):

- The per-step averages of a bin's prompts, :data:`PRESENT_ONLY_METRICS` (prompt_weight, loss,
  acc, rollout_n), are **not logged** for an absent bin: there is nothing to average, and a
  placeholder (the 0 or the unused multiplier logged before) made every mean over steps in
  wandb / TensorBoard wrong unless the reader masked it with ``gdro/count``. A missing key is
  what every logger skips; :func:`step_keys` lists the keys of one step.
- share, count and budget_share are 0 for an absent bin: true values, whose mean over steps is
  the bin's mean share.
- Prompt-GDRO's state (q, score, omega) is defined for every bin and logged as is.
- When an adversary is off, its inputs are omitted and the neutral values are logged: weight 1,
  q = 1/B, score 0, omega 1, loss 0, shadow price 0.

numpy only: no verl, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "METRIC_NAMES",
    "PER_BIN_METRICS",
    "PREFIX",
    "PRESENT_ONLY_METRICS",
    "SCALAR_METRICS",
    "bin_accuracy",
    "bin_key",
    "bin_rollouts",
    "bin_shares",
    "lead_lag",
    "mean_bin_index",
    "metric_keys",
    "per_bin_series",
    "step_keys",
    "step_metrics_prepared",
    "step_metrics",
    "weight_entropy",
    "weighted_shares",
    "wse_proxy",
    "wse_uniform",
]

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
    """(per-bin keys in :data:`PER_BIN_METRICS` x bin order, scalar keys), built once per B.

    step_metrics runs every training step; formatting ~100 f-strings each time was a measurable
    part of the fixed per-step cost (benchmarks/overhead.py).
    """
    per_bin = tuple(bin_key(name, b) for name in PER_BIN_METRICS for b in range(num_bins))
    return per_bin, tuple(PREFIX + name for name in SCALAR_METRICS)


def metric_keys(num_bins: int) -> list[str]:
    """Every key :func:`step_metrics` can return for ``num_bins`` bins, in a stable order.

    A step where every bin is present logs all of them; otherwise the
    :data:`PRESENT_ONLY_METRICS` of absent bins are left out (:func:`step_keys`).
    """
    per_bin, scalars = _key_table(int(num_bins))
    return [*per_bin, *scalars]


def step_keys(counts: ArrayLike) -> list[str]:
    """The keys :func:`step_metrics` returns for a step whose bins hold ``counts`` prompts
    (``gdro/count/bin_<b>``), in the order it returns them."""
    c = np.asarray(counts)
    present = c > 0
    per_bin, scalars = _key_table(int(c.shape[0]))
    mask = np.concatenate([present if name in PRESENT_ONLY_METRICS else np.ones_like(present) for name in PER_BIN_METRICS])
    return [k for k, keep in zip(per_bin, mask.tolist()) if keep] + list(scalars)


def per_bin_series(metrics: Mapping[str, float], name: str, num_bins: int) -> NDArray[np.float64]:
    """Read per-bin metric ``name`` back from a logged row as an array [B]; NaN where the key is
    missing (a :data:`PRESENT_ONLY_METRICS` entry of a bin absent from the step)."""
    return np.array([float(metrics.get(bin_key(name, b), np.nan)) for b in range(num_bins)])


# --------------------------------------------------------------------------------------------
# The quantities
# --------------------------------------------------------------------------------------------


def bin_shares(bins: NDArray[np.int64], num_bins: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """qhat(b) = prompts of bin b / prompts in the step, and the counts; all 0 for an empty step."""
    counts = np.bincount(bins, minlength=num_bins).astype(np.int64)
    total = counts.sum()
    shares = counts / total if total > 0 else np.zeros(num_bins)
    return shares, counts


def bin_accuracy(
    bins: NDArray[np.int64], successes: NDArray[np.float64], n: NDArray[np.float64], num_bins: int
) -> NDArray[np.float64]:
    """Mean correctness of each bin's rollouts: sum successes / sum trials over its prompts.

    Pooled over rollouts (not a mean of per-prompt rates) so that it is the p_b whose Bernoulli
    standard deviation Eq. 33 uses, whatever the per-prompt n. 0 for an absent bin.
    """
    s = np.bincount(bins, weights=successes, minlength=num_bins)
    t = np.bincount(bins, weights=n, minlength=num_bins)
    return np.divide(s, t, out=np.zeros(num_bins), where=t > 0)


def bin_rollouts(
    bins: NDArray[np.int64], n: NDArray[np.float64], num_bins: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(n_b, budget share): mean rollouts per prompt of each bin, and sum_{x in b} n_x / sum n.

    Under Rollout-GDRO every prompt of a bin has the same n, so the mean is that n. Both 0 for an
    absent bin.
    """
    counts = np.bincount(bins, minlength=num_bins)
    sums = np.bincount(bins, weights=n, minlength=num_bins)
    n_b = np.divide(sums, counts, out=np.zeros(num_bins), where=counts > 0)
    total = sums.sum()
    share = sums / total if total > 0 else np.zeros(num_bins)
    return n_b, share


def mean_bin_index(shares: NDArray[np.float64]) -> float:
    """sum_b b * share(b): the mean difficulty-bin index (bin 0 = hardest) under ``shares``."""
    return float(np.dot(_bin_indices(shares.shape[0]), shares))


@lru_cache(maxsize=8)
def _bin_indices(num_bins: int) -> NDArray[np.float64]:
    """0..B-1 as float64, built once per B (read-only): np.dot casts an integer index to float64
    before the same product, so the values are those of ``np.arange(B)``."""
    idx = np.arange(num_bins, dtype=np.float64)
    idx.flags.writeable = False
    return idx


def weighted_shares(shares: NDArray[np.float64], weights: NDArray[np.float64]) -> NDArray[np.float64]:
    """qhat_w(b) = qhat(b) w(b) / sum_b' qhat(b') w(b'): the step's data as the weighted loss sees it.

    With the advantage multipliers w, a bin's share of the gradient is its share of prompts times
    its multiplier; this is the distribution mu_weight of Eq. 32 averages over. All 0 for an empty
    step.
    """
    mass = shares * weights
    total = mass.sum()
    return mass / total if total > 0 else np.zeros(shares.shape[0])


def lead_lag(shares: NDArray[np.float64], weights: NDArray[np.float64]) -> tuple[float, float, float]:
    """Eq. 32: (mu_data, mu_weight, mu_weight - mu_data).

    Negative lead-lag means the weights pull the training signal toward harder (lower-index)
    bins than the data holds: the adversary "leads" the curriculum.
    """
    mu_data = mean_bin_index(shares)
    mu_weight = mean_bin_index(weighted_shares(shares, weights))
    return mu_data, mu_weight, mu_weight - mu_data


def weight_entropy(q: NDArray[np.float64]) -> float:
    """Shannon entropy (nats) of the Prompt-GDRO bin distribution q_t; log B when uniform."""
    p = q[q > 0]
    return float(-(p * np.log(p)).sum())


def _wse_terms(shares: NDArray[np.float64], acc: NDArray[np.float64]) -> tuple[NDArray[np.bool_], NDArray[np.float64]]:
    """Eq. 33's numerators: (the present bins, qhat(b) sigma_b of each), sigma_b = sqrt(p_b (1 - p_b)).

    Shared by the proxy and its uniform baseline, which differ only in the n_b they divide by.
    """
    present = shares > 0
    # np.clip's lower bound as its ufunc, without np.clip's Python wrapper (acc lies in [0, 1], so
    # the product is >= +0.0 and the bound only guards rounding: the same values)
    sigma = np.sqrt(np.maximum(acc * (1.0 - acc), 0.0))
    return present, shares[present] * sigma[present]


def wse_proxy(shares: NDArray[np.float64], acc: NDArray[np.float64], n_b: NDArray[np.float64]) -> float:
    """Eq. 33: WSE(t) = sum_b qhat(b) sigma_b / sqrt(n_b), sigma_b = sqrt(p_b (1 - p_b)).

    p_b is the bin's mean correctness in the step. Absent bins (qhat = 0) contribute 0.
    """
    present, terms = _wse_terms(shares, acc)
    return float((terms / np.sqrt(n_b[present])).sum())


def wse_uniform(shares: NDArray[np.float64], acc: NDArray[np.float64], n_mean: float) -> float:
    """Eq. 33's compute-matched uniform baseline: the WSE proxy with n_b = nbar for every bin."""
    return float((_wse_terms(shares, acc)[1] / np.sqrt(float(n_mean))).sum())


# --------------------------------------------------------------------------------------------
# One step
# --------------------------------------------------------------------------------------------


def _NEUTRAL_PER_BIN(num_bins: int) -> tuple[float, ...]:  # noqa: N802 - a table, read as a constant
    """Logged value of (prompt_weights, q, scores, omega, bin_losses) when an adversary is off."""
    return (1.0, 1.0 / num_bins, 0.0, 1.0, 0.0)


def step_metrics(
    num_bins: int,
    bins: ArrayLike,
    successes: ArrayLike,
    n: ArrayLike,
    *,
    n_mean: float | None = None,
    prompt_weights: ArrayLike | None = None,
    q: ArrayLike | None = None,
    scores: ArrayLike | None = None,
    omega: ArrayLike | None = None,
    bin_losses: ArrayLike | None = None,
    shadow_price: float = 0.0,
    controller_time_s: float = 0.0,
    dropped_nonfinite: int = 0,
    dropped_nonfinite_total: int = 0,
) -> dict[str, float]:
    """Every metric of docs/algorithm.md section 4 for one step, keyed exactly as :func:`metric_keys`.

    Args:
        num_bins: B.
        bins: the bin of each prompt of the step (the bins used for the step's decisions).
        successes: correct rollouts of each prompt (from ``acc``, never the shaped score).
        n: rollouts of each prompt (>= 1).
        n_mean: nbar for the compute-matched baseline; ``None`` uses the realised mean n.
        prompt_weights: Prompt-GDRO's per-bin multiplier used this step
            (``PromptGDRO.bin_multipliers(response_bins)``); ``None``: all 1 (adversary off).
        q, scores, omega: Prompt-GDRO's ``bin_probs()``, ``scores``, ``omega()``; ``None``: the
            neutral values 1/B, 0, 1.
        bin_losses: mean loss signal per bin of the step (``update(...)["mean_losses"]``).
        shadow_price: Rollout-GDRO's ``mu`` (0 when off).
        controller_time_s: wall time the controllers took in the step.
        dropped_nonfinite, dropped_nonfinite_total: the step's / run's dropped non-finite losses.

    Raises ValueError naming the argument for malformed input (non-finite values included: the
    caller drops bad rewards before, and a metric must never be NaN).
    """
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"num_bins must be an integer >= 1, got {num_bins!r}")
    B = int(num_bins)
    b = _int_array("bins", bins)
    if b.size and (b.min() < 0 or b.max() >= B):
        raise ValueError(f"bins must lie in [0, num_bins={B}), got values in [{b.min()}, {b.max()}]")
    s = _finite_array("successes", successes, b.shape[0])
    nn = _finite_array("n", n, b.shape[0])
    if nn.size and nn.min() < 1:
        raise ValueError(f"n (rollouts per prompt) must be >= 1, got min {nn.min()}")
    if s.size and (s.min() < 0 or np.any(s > nn)):
        raise ValueError("successes must lie in [0, n] for every prompt")

    given = {"prompt_weights": prompt_weights, "q": q, "scores": scores, "omega": omega, "bin_losses": bin_losses}
    w, qq, sc, om, loss = per_bin_inputs = [
        _per_bin(name, given[name], B, default, check_finite=False)
        for name, default in zip(given, _NEUTRAL_PER_BIN(B), strict=True)
    ]
    if not np.isfinite(per_bin_inputs).all():  # one check for the five; the slow path names the argument
        for name in given:
            _per_bin(name, given[name], B, 0.0)
    for name, value in (("shadow_price", shadow_price), ("controller_time_s", controller_time_s)):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be finite, got {value!r}")

    return step_metrics_prepared(
        B, b, s, nn, n_mean=n_mean, per_bin=(w, qq, sc, om, loss), shadow_price=shadow_price,
        controller_time_s=controller_time_s, dropped_nonfinite=dropped_nonfinite,
        dropped_nonfinite_total=dropped_nonfinite_total,
    )


def step_metrics_prepared(
    num_bins: int,
    bins: NDArray[np.int64],
    successes: NDArray[np.float64],
    n: NDArray[np.float64],
    *,
    n_mean: float | None,
    per_bin: tuple[NDArray[np.float64], ...],
    shadow_price: float = 0.0,
    controller_time_s: float = 0.0,
    dropped_nonfinite: int = 0,
    dropped_nonfinite_total: int = 0,
) -> dict[str, float]:
    """:func:`step_metrics` on inputs already in shape: ``bins`` int64 in [0, B), ``successes`` and
    ``n`` float64 with 0 <= s <= n and n >= 1, ``per_bin`` the five per-bin arrays
    (prompt_weights, q, scores, omega, bin_losses; [B] float64 each, or None for the neutral value).

    The controller builds exactly these every step, so it skips the argument checks (~20 small
    numpy calls, part of GDRO's per-step cost in benchmarks/overhead.py). The output keeps its
    guarantee that every value is finite: one check over all values at the end, which names
    the first non-finite metric.
    """
    B, b, s, nn = int(num_bins), bins, successes, n
    w, qq, sc, om, loss = (
        np.full(B, default) if values is None else values
        for values, default in zip(per_bin, _NEUTRAL_PER_BIN(B), strict=True)
    )
    # bin_shares, bin_accuracy and bin_rollouts with their three bincounts shared (same arithmetic)
    counts = np.bincount(b, minlength=B).astype(np.int64)
    total = counts.sum()
    shares = counts / total if total > 0 else np.zeros(B)
    trials_b = np.bincount(b, weights=nn, minlength=B)
    acc = np.divide(np.bincount(b, weights=s, minlength=B), trials_b, out=np.zeros(B), where=trials_b > 0)
    n_b = np.divide(trials_b, counts, out=np.zeros(B), where=counts > 0)
    total_n = trials_b.sum()
    budget_share = trials_b / total_n if total_n > 0 else np.zeros(B)
    mean_n = float(nn.sum() / nn.size) if nn.size else 0.0  # np.mean's own sum and division, without its wrapper
    nbar = mean_n if n_mean is None else float(n_mean)
    if not (np.isfinite(nbar) and (nbar > 0 or nn.size == 0)):
        raise ValueError(f"n_mean must be a positive finite number, got {n_mean!r}")
    mu_data, mu_weight, lag = lead_lag(shares, w)
    present_bins, wse_terms = _wse_terms(shares, acc)
    # a group whose rollouts all agree has GRPO advantage 0 for every rollout (no gradient)
    zero = ((s == 0) | (s == nn)).astype(np.float64)
    zero_b = np.divide(np.bincount(b, weights=zero, minlength=B), counts, out=np.zeros(B), where=counts > 0)

    per_bin = {
        "prompt_share": shares,
        "count": counts.astype(np.float64),
        "prompt_weight": w,
        "q": qq,
        "score": sc,
        "omega": om,
        "loss": np.where(counts > 0, loss, 0.0),
        "acc": acc,
        "rollout_n": n_b,
        "budget_share": budget_share,
        "zero_adv": zero_b,
    }
    scalars = {
        "mu_data": mu_data,
        "mu_weight": mu_weight,
        "lead_lag": lag,
        "weight_entropy": weight_entropy(qq),
        "mean_n": mean_n,
        "shadow_price": float(shadow_price),
        "wse": float((wse_terms / np.sqrt(n_b[present_bins])).sum()),  # wse_proxy, sharing its numerators
        "wse_uniform": float((wse_terms / np.sqrt(nbar)).sum()) if nn.size else 0.0,  # wse_uniform, likewise
        "zero_adv_share": float(zero.sum() / zero.size) if zero.size else 0.0,
        "controller_time_s": float(controller_time_s),
        "num_prompts": float(b.shape[0]),
        "num_rollouts": float(nn.sum()),
        "dropped_nonfinite": float(dropped_nonfinite),
        "dropped_nonfinite_total": float(dropped_nonfinite_total),
    }
    # One array and one tolist() for the B x |PER_BIN_METRICS| values, with the keys built once per
    # B: the same floats as converting each value on its own, without ~100 f-strings per step.
    per_bin_keys, scalar_keys = _key_table(B)
    stacked = np.concatenate([np.asarray(per_bin[name], dtype=np.float64) for name in PER_BIN_METRICS])
    scalar_values = [float(scalars[name]) for name in SCALAR_METRICS]
    if not (np.isfinite(stacked).all() and all(map(math.isfinite, scalar_values))):
        bad = next(k for k, v in zip((*per_bin_keys, *scalar_keys), (*stacked.tolist(), *scalar_values))
                   if not math.isfinite(v))
        raise ValueError(f"metric {bad} is not finite: an input of step_metrics is (drop non-finite values first)")
    values = stacked.tolist()
    present = counts > 0
    if present.all():
        out = dict(zip(per_bin_keys, values))
    else:
        keep = np.concatenate(
            [present if name in PRESENT_ONLY_METRICS else np.ones(B, dtype=bool) for name in PER_BIN_METRICS]
        ).tolist()
        out = {k: v for k, v, ok in zip(per_bin_keys, values, keep) if ok}
    out.update(zip(scalar_keys, scalar_values))
    return out


def _int_array(name: str, values: ArrayLike) -> NDArray[np.int64]:
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D integer array, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        if a.dtype == bool or not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError(f"{name} must hold integers, got dtype {a.dtype}")
    return a.astype(np.int64)


def _finite_array(name: str, values: ArrayLike, length: int) -> NDArray[np.float64]:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.shape[0] != length:
        raise ValueError(f"{name} must be 1-D with one entry per prompt ({length}), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite (drop non-finite rewards before computing metrics)")
    return a


def _per_bin(
    name: str, values: ArrayLike | None, num_bins: int, default: float, check_finite: bool = True
) -> NDArray[np.float64]:
    if values is None:
        return np.full(num_bins, default)
    a = np.asarray(values, dtype=np.float64)
    if a.shape != (num_bins,):
        raise ValueError(f"{name} must have shape ({num_bins},), got {a.shape}")
    if check_finite and not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    return a
