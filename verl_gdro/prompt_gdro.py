"""Prompt-GDRO: the data adversary (docs/algorithm.md section 2; paper 3.2, Eqs. 6-7 and 12-16).

Top to bottom, the equations in order: the loss signal l(x) (Eqs. 6-7), the bin mean loss over
its batch share (Eq. 13, App. A), the EMA score S (Eq. 12), omega (Eq. 14), q (Eq. 15) and the
advantage multipliers (Eq. 16), one pure function each; :class:`PromptGDRO` holds the state and
composes them (multipliers of step t from S_{t-1}, then step t's losses update S). numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import itemgetter, mul
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.classifier import int_array

__all__ = [
    "WEIGHT_NORMALIZATIONS", "PromptGDRO", "advantage_multipliers", "bin_mean_losses", "cap_bin_masses",
    "clipped_surrogate_response_loss", "ema_scores", "exp_weights", "failure_rate_loss", "group_mean",
    "group_mean_from_sums", "low_var_kl", "masked_token_mean", "mix_probs", "mix_probs_present",
    "resample_bin_masses", "share_normalize", "surrogate_kl_loss", "surrogate_loss"
]

WEIGHT_NORMALIZATIONS = ("mean_one", "raw")

# float64 exp overflows just above 709; the constructor keeps eta * score_clip below this so that
# omega (Eq. 14) is always finite and q (Eq. 15) never divides inf by inf.
_MAX_EXPONENT = 600.0

_STATE_VERSION = 1
#: PromptGDRO's constructor arguments in order: what config() returns and a saved state's "config" holds
_CONFIG_NAMES = ("num_bins", "eta", "beta", "gamma", "max_weight", "score_clip", "normalize_by_share", "share_floor",
                 "weight_normalization", "min_ess", "mix_support")

# Same clamps as verl's kl_penalty("low_var_kl") and compute_policy_loss_vanilla, so the driver-side
# loss signal measures the same quantity the actor optimises.
_LOG_RATIO_CLAMP = 20.0
_LOW_VAR_KL_CLAMP = 10.0


# ---- Loss signals l(x) (docs/algorithm.md section 2, `loss_signal`) ----


def _group_index(group_index: ArrayLike, num_responses: int, num_groups: int | None) -> tuple[NDArray[np.int64], int]:
    """The checked prompt index of every response, and the number of prompts (default max + 1)."""
    idx = np.asarray(group_index)
    if idx.ndim != 1 or idx.shape[0] != num_responses:
        raise ValueError(
            f"group_index must be a 1-D array with one prompt index per response "
            f"({num_responses} responses), got shape {idx.shape}"
        )
    idx = int_array("group_index", idx, integral_floats=True)
    inferred = int(idx.max()) + 1 if idx.size else 0
    groups = inferred if num_groups is None else int(num_groups)
    if groups < 0:
        raise ValueError(f"num_groups must be >= 0, got {num_groups}")
    if idx.size and (idx.min() < 0 or idx.max() >= groups):
        raise ValueError(f"group_index values must lie in [0, num_groups={groups}), got [{idx.min()}, {idx.max()}]")
    return idx, groups


def group_mean(values: ArrayLike, group_index: ArrayLike, num_groups: int | None = None) -> NDArray[np.float64]:
    """Mean of per-response ``values`` over each prompt's responses (variable group sizes); NaN for
    a prompt without one, never 0, which would be a real (and wrong) loss."""
    vals = np.asarray(values, dtype=np.float64)
    if vals.ndim != 1:
        raise ValueError(f"values must be 1-D (one value per response), got shape {vals.shape}")
    idx, groups = _group_index(group_index, vals.shape[0], num_groups)
    return group_mean_from_sums(np.bincount(idx, weights=vals, minlength=groups), np.bincount(idx, minlength=groups))


def group_mean_from_sums(sums: NDArray[np.float64], counts: NDArray[np.int64]) -> NDArray[np.float64]:
    """:func:`group_mean` from each prompt's sum and count (NaN where the count is 0), for a caller
    that has them already (the controller counts every prompt's trajectories once per step)."""
    if counts.size and counts.min() > 0:  # every prompt has trajectories (the usual step): one division
        return sums / counts
    out = np.full(sums.shape[0], np.nan)
    has = counts > 0
    out[has] = sums[has] / counts[has]
    return out


def failure_rate_loss(
    acc: ArrayLike, group_index: ArrayLike | None = None, num_groups: int | None = None
) -> NDArray[np.float64]:
    """Failure rate ``l(x) = 1 - mean_j r_ij`` (loss signal ``failure_rate``) from each response's
    ``acc`` with its prompt's ``group_index``, or each prompt's mean ``acc`` when that is None.
    Values outside [0, 1] raise: a shaped -1/+1 score would silently invert difficulty."""
    a = np.asarray(acc, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"acc must be 1-D, got shape {a.shape}")
    if not (a.size and a.min() >= 0.0 and a.max() <= 1.0):  # the usual case passes in two reductions (NaN fails min)
        finite = a[np.isfinite(a)]
        if finite.size and (finite.min() < 0.0 or finite.max() > 1.0):
            raise ValueError(
                f"acc must be correctness in [0, 1] (the reward's `acc`, never the shaped score), "
                f"got values in [{finite.min()}, {finite.max()}]"
            )
    if group_index is None:
        return 1.0 - a
    return 1.0 - group_mean(a, group_index, num_groups)


def masked_token_mean(values: NDArray[np.floating], mask: NDArray[np.floating]) -> NDArray[np.float64]:
    """Token-mean of each row of ``values`` ([N, T] or [N, 1]) over its mask, summed in float64; 0
    for a response without tokens (verl's ``masked_mean``)."""
    count = mask.sum(axis=1, dtype=np.float64)
    if values.shape[1] == 1:
        total = values[:, 0].astype(np.float64) * count
    else:
        total = np.multiply(values, mask, dtype=values.dtype).sum(axis=1, dtype=np.float64)
    return np.divide(total, count, out=np.zeros_like(total), where=count > 0)


# Rows per block for chains of [N, T] token operations: the temporaries stay in cache (1 MiB),
# bit-identical (elementwise or per-row steps) and ~1.8x faster (benchmarks/overhead.py).
_BLOCK_ROWS = 64


def _per_row_blocks(fn: Callable[..., NDArray[np.float64]], *arrays: NDArray[np.floating]) -> NDArray[np.float64]:
    """``fn(*arrays)`` (a per-row result) evaluated on blocks of ``_BLOCK_ROWS`` rows."""
    rows = arrays[0].shape[0]
    out = np.empty(rows)
    for start in range(0, rows, _BLOCK_ROWS):
        block = slice(start, start + _BLOCK_ROWS)
        out[block] = fn(*(a[block] for a in arrays))
    return out


def _float(x: ArrayLike) -> NDArray[np.floating]:
    """float32 stays float32 (half the memory traffic on [N, 4096] arrays); anything else -> float64."""
    a = np.asarray(x)
    return a if a.dtype in (np.float32, np.float64) else a.astype(np.float64)


def _token_arrays(
    response_mask: ArrayLike, **arrays: ArrayLike
) -> tuple[NDArray[np.floating], dict[str, NDArray[np.floating]]]:
    """Validate per-token arrays [responses, tokens]; per-response vectors [N] become [N, 1]."""
    mask = np.asarray(response_mask)
    if mask.ndim != 2:
        raise ValueError(f"response_mask must be 2-D [responses, tokens], got shape {mask.shape}")
    out: dict[str, NDArray[np.floating]] = {}
    for name, arr in arrays.items():
        a = _float(arr)
        if a.ndim == 1 and a.shape[0] == mask.shape[0]:
            a = a[:, None]
        if a.ndim != 2 or a.shape[0] != mask.shape[0] or a.shape[1] not in (1, mask.shape[1]):
            raise ValueError(f"{name} must have shape {mask.shape} (or [{mask.shape[0]}]), got {a.shape}")
        out[name] = a
    dtype = np.result_type(*out.values()) if out else np.float64
    return mask.astype(dtype, copy=False), out


def clipped_surrogate_response_loss(
    log_prob: ArrayLike, old_log_prob: ArrayLike, advantages: ArrayLike, response_mask: ArrayLike,
    clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.28, clip_ratio_c: float = 3.0,
) -> NDArray[np.float64]:
    """Per-response token-mean of ``-J^CLIP`` (Eq. 7), verl's ``compute_policy_loss_vanilla``
    (clamped log-ratio, clip, dual clip for A < 0). Per-response ``advantages`` [N] (GRPO's) save
    two [N, T] products: the token loss is -A_i h(ratio) with h the clipped ratio's min/max."""
    _check_range("clip_ratio_low", clip_ratio_low, "[0.0, 1.0)")
    _check_range("clip_ratio_high", clip_ratio_high, ">= 0.0")
    _check_range("clip_ratio_c", clip_ratio_c, "> 1.0")
    mask, arr = _token_arrays(response_mask, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages)
    adv = arr["advantages"]
    if arr["log_prob"] is arr["old_log_prob"] or np.array_equal(arr["log_prob"], arr["old_log_prob"]):
        # On-policy (the driver): ratio 1 is inside every clip, so the token loss is exactly -A.
        if adv.shape[1] == 1:
            return -adv[:, 0].astype(np.float64) * (mask.sum(axis=1) > 0)
        return _per_row_blocks(lambda a, m: masked_token_mean(-a, m), adv, mask)
    ratio = np.subtract(arr["log_prob"], arr["old_log_prob"])
    np.clip(ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP, out=ratio)
    np.exp(ratio, out=ratio)
    clipped_ratio = np.clip(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    if adv.shape[1] == 1:
        a = adv[:, 0].astype(np.float64)
        h = np.where((a > 0)[:, None], np.minimum(ratio, clipped_ratio), np.maximum(ratio, clipped_ratio))
        neg = a < 0
        if np.any(neg):
            h[neg] = np.minimum(h[neg], clip_ratio_c)
        return -a * masked_token_mean(h, mask)
    loss1 = -adv * ratio
    loss2 = -adv * clipped_ratio
    np.maximum(loss1, loss2, out=loss1)
    token_loss = np.where(adv < 0, np.minimum(loss1, -adv * clip_ratio_c), loss1)
    return masked_token_mean(token_loss, mask)


def low_var_kl(log_prob: ArrayLike, ref_log_prob: ArrayLike) -> NDArray[np.floating]:
    """Per-token k3 = exp(ref - logp) - (ref - logp) - 1 in [-10, 10]: verl's ``low_var_kl``, so
    ``beta_KL * KL`` here is the KL term the actor minimises (App. A)."""
    diff = np.subtract(_float(ref_log_prob), _float(log_prob))
    np.clip(diff, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP, out=diff)
    kl = np.exp(diff)
    kl -= diff
    kl -= 1.0
    return np.clip(kl, -_LOW_VAR_KL_CLAMP, _LOW_VAR_KL_CLAMP, out=kl)


def surrogate_loss(
    log_prob: ArrayLike, old_log_prob: ArrayLike, advantages: ArrayLike, response_mask: ArrayLike,
    group_index: ArrayLike, num_groups: int | None = None,
    clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.28, clip_ratio_c: float = 3.0,
) -> NDArray[np.float64]:
    """Loss signal ``surrogate`` (the released patch): each prompt's mean -J^CLIP_ij; zero on-policy,
    where the driver evaluates it (docs/algorithm.md section 2)."""
    per_response = clipped_surrogate_response_loss(
        log_prob, old_log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    return group_mean(per_response, group_index, num_groups)


def surrogate_kl_loss(
    log_prob: ArrayLike, old_log_prob: ArrayLike, ref_log_prob: ArrayLike, advantages: ArrayLike,
    response_mask: ArrayLike, group_index: ArrayLike, num_groups: int | None = None, kl_coef: float = 0.001,
    clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.28, clip_ratio_c: float = 3.0,
) -> NDArray[np.float64]:
    """Loss signal ``surrogate_kl`` (Eqs. 6-7): each prompt's mean of -J^CLIP_ij + beta_KL KL_ij, KL
    the token-mean :func:`low_var_kl`; on-policy it is ``kl_coef * mean_j KL_ij`` (section 2)."""
    mask, arr = _token_arrays(response_mask, log_prob=log_prob, ref_log_prob=ref_log_prob)
    lp, ref = arr["log_prob"], arr["ref_log_prob"]
    if lp.shape[1] == 1 and ref.shape[1] == 1:
        kl = masked_token_mean(np.broadcast_to(low_var_kl(lp, ref), mask.shape), mask)
    else:
        kl = _per_row_blocks(lambda a, b, m: masked_token_mean(low_var_kl(a, b), m),
                             np.broadcast_to(lp, mask.shape), np.broadcast_to(ref, mask.shape), mask)
    surrogate = clipped_surrogate_response_loss(
        log_prob, old_log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    return group_mean(surrogate + kl_coef * kl, group_index, num_groups)


# ---- Eqs. 12-16 ----


def bin_mean_losses(
    bins: NDArray[np.int64], losses: NDArray[np.float64], num_bins: int
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Eq. 13: (lbar_t(b), prompts per bin): the mean finite l(x) of bin b's prompts, 0 if absent."""
    counts = np.bincount(bins, minlength=num_bins).astype(np.int64)
    sums = np.bincount(bins, weights=losses, minlength=num_bins)
    lbar = np.divide(sums, counts, out=np.zeros(num_bins), where=counts > 0)
    return lbar, counts


def share_normalize(
    lbar: NDArray[np.float64], counts: NDArray[np.int64], share_floor: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """App. A (with Eq. 13): (each present bin's lbar / max(qhat_t(b), share_floor), qhat_t), the
    debiasing of the EMA scorer; the floor keeps a one-prompt bin from blowing its score up."""
    total = counts.sum()
    qhat = counts / total if total > 0 else np.zeros(counts.shape[0])
    out = np.where(counts > 0, lbar / np.maximum(qhat, share_floor), 0.0)
    return out, qhat


def ema_scores(
    scores: NDArray[np.float64], observed: NDArray[np.bool_], bin_losses: NDArray[np.float64],
    present: NDArray[np.bool_], beta: float,
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Eq. 12 for the bins present in the step: absent bins keep S, a first observation sets it
    (docs/algorithm.md, "Prompt-GDRO (section 2)"). Returns new arrays."""
    first = present & ~observed
    again = present & observed
    new = scores.copy()
    new[first] = bin_losses[first]
    new[again] = (1.0 - beta) * scores[again] + beta * bin_losses[again]
    return new, observed | present


def exp_weights(scores: NDArray[np.float64], eta: float, score_clip: float) -> NDArray[np.float64]:
    """Eq. 14: omega_t(b) = exp(eta * clip(S_t(b), -C, C)). With C = inf (the release), omega up to
    the factor exp(-eta max S), which cancels in q and the mean_one multipliers."""
    if math.isinf(score_clip):
        return np.exp(eta * (scores - scores.max())) if scores.size else np.exp(scores)
    # np.clip's values as its two ufuncs, without its Python wrapper
    return np.exp(eta * np.minimum(np.maximum(scores, -score_clip), score_clip))


def mix_probs(omega: NDArray[np.float64], gamma: float) -> NDArray[np.float64]:
    """Eq. 15: q_t(b) = (1 - gamma) omega(b) / sum omega + gamma / B over all B bins."""
    return (1.0 - gamma) * omega / omega.sum() + gamma / omega.shape[0]


def mix_probs_present(omega: NDArray[np.float64], gamma: float, present: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Eq. 15 over the bins ``present`` in the step only (the release's ``compute_weights``):
    q(b) = (1 - gamma) omega(b) / sum_present omega + gamma / |present| for present b, 0 elsewhere."""
    q = np.zeros(omega.shape[0])
    k = int(np.count_nonzero(present))
    if k:
        w = omega[present]
        q[present] = (1.0 - gamma) * w / w.sum() + gamma / k
    return q


def advantage_multipliers(
    q: NDArray[np.float64], omega: NDArray[np.float64], bins: NDArray[np.int64], max_weight: float,
    weight_normalization: str = "mean_one",
) -> NDArray[np.float64]:
    """Eq. 16: the multiplier w(b) of every bin [B], capped at ``max_weight``: ``mean_one`` q(b) over
    the mean q of the given elements' bins (GRPO's step size; 1 for none), ``raw`` omega(b)."""
    if weight_normalization == "raw":
        return np.minimum(omega, max_weight)
    if weight_normalization != "mean_one":
        raise ValueError(f"weight_normalization={weight_normalization!r}; allowed: {WEIGHT_NORMALIZATIONS}")
    if bins.size == 0:
        return np.ones_like(q)
    return np.minimum(q / q[bins].mean(), max_weight)


def effective_sample_size(weights: NDArray[np.float64]) -> float:
    """Kish's effective sample size as a share of N: (sum w)^2 / (N sum w^2), in (0, 1]."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0:
        return 1.0
    sq = float(np.sum(w * w))
    return 1.0 if sq == 0.0 else float(np.sum(w)) ** 2 / (w.size * sq)


def ess_floor_multipliers(
    scores: NDArray[np.float64], bins: NDArray[np.int64], eta: float, score_clip: float, gamma: float,
    max_weight: float, min_ess: float, iterations: int = 40,
) -> tuple[NDArray[np.float64], float]:
    """(Eq. 16 ``mean_one`` multiplier of every bin, s): at the largest step ``s * eta``, s in
    [0, 1], whose per-element Kish ESS share is >= ``min_ess``, by bisection (the share falls in s).
    Beyond the paper; why: docs/algorithm.md, "Prompt-GDRO's effective-sample-size floor"."""

    def weights_at(scale: float) -> NDArray[np.float64]:
        q = mix_probs(exp_weights(scores, scale * eta, score_clip), gamma)
        return advantage_multipliers(q, q, bins, max_weight, "mean_one")

    if bins.size == 0:
        return weights_at(1.0), 1.0
    share_by_bin = _ess_share_by_bin(scores, bins, eta, score_clip, gamma, max_weight)

    def meets_floor(scale: float) -> bool:
        # the per-bin share decides unless it lies within _ESS_MARGIN of the floor
        fast = share_by_bin(scale)
        if abs(fast - min_ess) > _ESS_MARGIN * min_ess:
            return fast >= min_ess
        return effective_sample_size(weights_at(scale)[bins]) >= min_ess

    return _at_largest_scale(weights_at, meets_floor, iterations)


def _at_largest_scale(
    at: Callable[[float], NDArray[np.float64]], holds: Callable[[float], bool], iterations: int
) -> tuple[NDArray[np.float64], float]:
    """(at(s), s) for the largest s in [0, 1] where the monotone ``holds`` is true, by bisection (1.0
    if it holds there)."""
    if holds(1.0):
        return at(1.0), 1.0
    lo, hi = 0.0, 1.0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return at(lo), lo


#: Relative distance from the ESS floor beyond which the per-bin share decides a bisection step: it
#: equals the per-element share up to rounding, < _ESS_MARGIN / 20
#: (test_ess_share_by_bin_matches_the_per_element_share), so every decision is the same.
_ESS_MARGIN = 1e-13


def _ess_share_by_bin(
    scores: NDArray[np.float64], bins: NDArray[np.int64], eta: float, score_clip: float, gamma: float,
    max_weight: float,
) -> Callable[[float], float]:
    """:func:`ess_floor_multipliers`' per-element ESS share at ``scale``, over the B bins weighted by
    their counts c, in plain floats (a few us per bisection step instead of ~30). Scale-invariant,
    so below the cap it is (sum c q)^2 / (n sum c q^2), expanded in the sums of c omega, c omega^2."""
    clipped = np.minimum(np.maximum(scores, -score_clip), score_clip).tolist()  # Eq. 14's clip
    counts = np.bincount(bins, minlength=len(clipped)).tolist()
    present = [b for b, c in enumerate(counts) if c > 0]
    pick = itemgetter(*present) if len(present) > 1 else (lambda xs: (xs[present[0]],))
    weights = [float(counts[b]) for b in present]
    n = float(bins.size)
    floor = gamma / len(clipped)
    keep = 1.0 - gamma
    exp = math.exp
    floor_n, floor_sq_n = floor * n, floor * floor * n

    def share(scale: float) -> float:
        step = scale * eta
        omega = [exp(step * x) for x in clipped]  # Eq. 14
        norm = keep / sum(omega)
        mine = pick(omega)  # the present bins; Eq. 15: q = omega * norm + floor
        c_omega = list(map(mul, weights, mine))
        sum_c_omega = sum(c_omega)
        # sum c q and sum c q^2 expanded in the per-bin sums of omega: every term is positive
        s1 = norm * sum_c_omega + floor_n
        if not s1 > 0.0:  # every present q underflowed (gamma 0): let the per-element share decide
            return math.nan
        if (max(mine) * norm + floor) * n < max_weight * s1:  # Eq. 16 mean_one: no q n / s1 reaches the cap
            s2 = norm * norm * sum(map(mul, c_omega, mine)) + 2.0 * norm * floor * sum_c_omega + floor_sq_n
            return s1 * s1 / (n * s2)
        q = [x * norm + floor for x in mine]
        w = [x * n / s1 for x in q]
        w = [x if x < max_weight else max_weight for x in w]
        total = sum(map(mul, weights, w))
        square = sum(c * x * x for c, x in zip(weights, w))
        return 1.0 if square == 0.0 else total * total / (n * square)

    return share


def cap_bin_masses(mass: NDArray[np.float64], sizes: NDArray[np.int64], max_weight: float) -> NDArray[np.float64]:
    """``mass`` with each prompt's draw ratio to uniform, N m(b) / |b| (the resampling Eq. 16
    multiplier), capped at ``max_weight``: the excess water-fills the uncapped bins by mass."""
    m = np.asarray(mass, dtype=np.float64).copy()
    limit = max_weight * sizes / float(sizes.sum())
    capped = np.zeros(m.size, dtype=bool)
    for _ in range(m.size):
        over = ~capped & (m > limit)
        if not over.any():
            break
        capped |= over
        m[capped] = limit[capped]
        free = ~capped & (m > 0)
        rest = 1.0 - m[capped].sum()
        if not free.any() or m[free].sum() <= 0.0:
            break
        m[free] *= rest / m[free].sum()
    return m


def resample_bin_masses(
    scores: NDArray[np.float64], sizes: NDArray[np.int64], eta: float, score_clip: float, gamma: float,
    max_weight: float, min_ess: float, iterations: int = 40,
) -> tuple[NDArray[np.float64], float]:
    """(m over the B bins, s): the ``resample`` mode's draw, m = (1 - s) |b| / N + s q_t over the
    bins holding prompts (``sizes``), s the largest keeping the draw's Kish ESS share
    1 / (N sum_b m^2 / |b|) >= ``min_ess``, then :func:`cap_bin_masses`. Why: docs/algorithm.md,
    "Bin-level ``resample``"."""
    size = np.asarray(sizes, dtype=np.int64)
    held = size > 0
    n = float(size.sum())
    q = mix_probs(exp_weights(scores, eta, score_clip), gamma) * held
    q = q / q.sum()
    uniform = size / n

    def masses_at(s: float) -> NDArray[np.float64]:
        return cap_bin_masses((1.0 - s) * uniform + s * q, size, max_weight)

    def meets_floor(s: float) -> bool:  # the draw's ESS share, 1 / (N sum_b m^2 / |b|)
        return min_ess <= 0.0 or 1.0 / (n * float(np.sum(masses_at(s)[held] ** 2 / size[held]))) >= min_ess

    return _at_largest_scale(masses_at, meets_floor, iterations)


# ---- The controller ----


def _checked_settings(
    num_bins: Any, eta: float, beta: float, gamma: float, max_weight: float, score_clip: float,
    share_floor: float | None, weight_normalization: str, min_ess: float, mix_support: str,
) -> float:
    """Check :class:`PromptGDRO`'s arguments (a ValueError naming the first bad one); the share floor."""
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"num_bins must be an integer >= 1, got {num_bins!r}")
    if share_floor is None:
        share_floor = 1.0 / (2 * int(num_bins))
    for name, value, allowed in (("eta", eta, "> 0.0"), ("beta", beta, "(0.0, 1.0]"), ("gamma", gamma, "[0.0, 1.0)"),
                                 ("max_weight", max_weight, "> 0.0"), ("share_floor", share_floor, "(0.0, 1.0]"),
                                 ("min_ess", min_ess, "[0.0, 1.0)")):
        _check_range(name, value, allowed)
    if not (isinstance(score_clip, (int, float)) and math.isinf(score_clip) and score_clip > 0):
        _check_range("score_clip", score_clip, "> 0.0")
    if math.isfinite(score_clip) and eta * score_clip > _MAX_EXPONENT:
        raise ValueError(
            f"eta * score_clip must be <= {_MAX_EXPONENT} so that exp(eta * S) is finite, "
            f"got eta={eta} * score_clip={score_clip} = {eta * score_clip}"
        )
    if weight_normalization not in WEIGHT_NORMALIZATIONS:
        raise ValueError(
            f"weight_normalization={weight_normalization!r} is unknown; allowed: {list(WEIGHT_NORMALIZATIONS)}"
        )
    if min_ess > 0 and str(weight_normalization) != "mean_one":
        raise ValueError("min_ess needs weight_normalization='mean_one' (the floor is on normalised multipliers)")
    if mix_support not in ("all", "present"):
        raise ValueError(f"mix_support={mix_support!r} is unknown; allowed: ['all', 'present']")
    if (math.isinf(float(score_clip)) or mix_support == "present") and (
        float(min_ess) > 0 or str(weight_normalization) != "mean_one"
    ):
        raise ValueError(
            "score_clip=inf and mix_support='present' need weight_normalization='mean_one' and min_ess=0 "
            "(the release's multipliers)"
        )
    return share_floor


class PromptGDRO:
    """The data adversary: EMA-debiased exponential weights over difficulty bins (Eqs. 12-16).

    State: S per bin, which bins were ever observed, counters; omega, q and the multipliers are
    derived. Arguments: B, eta (Eq. 14), beta (Eq. 12), gamma (Eq. 15), ``max_weight`` (Eq. 16),
    ``score_clip`` C (Eq. 14, eta * C <= 600), ``normalize_by_share`` and ``share_floor`` (App. A;
    None: 1 / (2B)), ``weight_normalization`` (:func:`advantage_multipliers`), ``min_ess``
    (:func:`ess_floor_multipliers`, 0 = off), ``mix_support`` (``all`` or ``present``:
    :func:`mix_probs_present`). docs/configuration.md gives each key's range.
    """

    def __init__(
        self, num_bins: int, eta: float = 0.65, beta: float = 0.12, gamma: float = 0.01, max_weight: float = 15.0,
        score_clip: float = 10.0, normalize_by_share: bool = True, share_floor: float | None = None,
        weight_normalization: str = "mean_one", min_ess: float = 0.0, mix_support: str = "all",
    ) -> None:
        share_floor = _checked_settings(
            num_bins, eta, beta, gamma, max_weight, score_clip, share_floor, weight_normalization, min_ess, mix_support
        )
        self.num_bins = int(num_bins)
        self.eta, self.beta, self.gamma = float(eta), float(beta), float(gamma)
        self.max_weight, self.score_clip = float(max_weight), float(score_clip)
        self.normalize_by_share = bool(normalize_by_share)
        self.share_floor = float(share_floor)
        self.weight_normalization = str(weight_normalization)
        self.min_ess = float(min_ess)
        self.mix_support = str(mix_support)
        #: step-size scale the last bin_multipliers() call used (1.0 unless min_ess lowered it)
        self.last_eta_scale = 1.0

        self._scores = np.zeros(self.num_bins)
        self._observed = np.zeros(self.num_bins, dtype=bool)
        self.num_updates = 0
        self.dropped_nonfinite = 0  # total non-finite losses dropped by update(), over the run

    # -- read-only views of the state ---------------------------------------------------------

    @property
    def scores(self) -> NDArray[np.float64]:
        """S_t(b) of Eq. 12 (a copy); 0 for bins never observed."""
        return self._scores.copy()

    @property
    def observed(self) -> NDArray[np.bool_]:
        """Which bins have had at least one finite loss (a copy)."""
        return self._observed.copy()

    # -- Eqs. 14-16 ---------------------------------------------------------------------------

    def omega(self) -> NDArray[np.float64]:
        """omega_t(b) of Eq. 14."""
        return exp_weights(self._scores, self.eta, self.score_clip)

    def bin_probs(self) -> NDArray[np.float64]:
        """q_t(b) of Eq. 15 over all B bins (the sampler's bin distribution in ``resample`` mode)."""
        return mix_probs(self.omega(), self.gamma)

    def bin_multipliers(self, bins: ArrayLike) -> NDArray[np.float64]:
        """Eq. 16 multiplier of every bin [B] normalised over the given elements' bins (logged as
        ``prompt_weight``)."""
        b = int_array("bins", bins, integral_floats=True, num_bins=self.num_bins)
        if self.min_ess > 0:
            w, self.last_eta_scale = ess_floor_multipliers(
                self._scores, b, self.eta, self.score_clip, self.gamma, self.max_weight, self.min_ess
            )
            return w
        omega = self.omega()
        if self.mix_support == "present":
            q = mix_probs_present(omega, self.gamma, np.bincount(b, minlength=self.num_bins) > 0)
        else:
            q = mix_probs(omega, self.gamma)
        return advantage_multipliers(q, omega, b, self.max_weight, self.weight_normalization)

    def multipliers(self, bins: ArrayLike) -> NDArray[np.float64]:
        """Eq. 16 multiplier of each given element (pass every response's bin for ``mean_one``)."""
        b = int_array("bins", bins, integral_floats=True, num_bins=self.num_bins)
        return self.bin_multipliers(b)[b]

    # -- Eqs. 12-13 ---------------------------------------------------------------------------

    def update(self, bins: ArrayLike, losses: ArrayLike) -> dict[str, Any]:
        """One step's per-prompt losses -> S (Eqs. 12-13). Non-finite losses are dropped and counted
        (shares count the finite ones); bad input raises before any change. Returns for logging
        ``dropped_nonfinite``, ``counts``, ``shares`` (qhat_t), ``mean_losses`` (lbar_t) and
        ``normalized_losses`` (what entered the EMA)."""
        b = int_array("bins", bins, integral_floats=True, num_bins=self.num_bins)
        loss = np.asarray(losses, dtype=np.float64)
        if loss.ndim != 1 or loss.shape[0] != b.shape[0]:
            raise ValueError(f"losses must be 1-D with one entry per prompt (len(bins) = {b.shape[0]}), got shape {loss.shape}")
        finite = np.isfinite(loss)
        dropped = loss.size - int(np.count_nonzero(finite))
        if dropped:
            b, loss = b[finite], loss[finite]

        with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected below
            lbar, counts = bin_mean_losses(b, loss, self.num_bins)
            normalized, shares = share_normalize(lbar, counts, self.share_floor)
            if not self.normalize_by_share:
                normalized = lbar
            scores, observed = ema_scores(self._scores, self._observed, normalized, counts > 0, self.beta)
        if not np.all(np.isfinite(scores)):
            # a bin mean or the share division overflowed: refuse rather than store an infinite score
            raise ValueError(
                f"losses overflow float64 in the bin means (max |loss| {np.abs(loss).max():.3g}); "
                f"loss signals must be of moderate magnitude"
            )
        self._scores, self._observed = scores, observed
        self.num_updates += 1
        self.dropped_nonfinite += dropped
        return {"dropped_nonfinite": dropped, "counts": counts, "shares": shares, "mean_losses": lbar,
                "normalized_losses": normalized}

    # -- checkpointing ------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """The constructor arguments (state from a differently configured controller is refused)."""
        return {name: getattr(self, name) for name in _CONFIG_NAMES}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: config, S, observed mask, counters."""
        return {
            "version": _STATE_VERSION,
            "config": self.config(),
            "scores": self._scores.copy(),
            "observed": self._observed.copy(),
            "num_updates": int(self.num_updates),
            "dropped_nonfinite": int(self.dropped_nonfinite),
        }

    def snapshot(self) -> tuple[Any, ...]:
        """The mutable state, for :meth:`restore`: the controller's per-step rollback, cheaper than
        :meth:`state_dict`."""
        return self._scores.copy(), self._observed.copy(), self.num_updates, self.dropped_nonfinite

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Return to a :meth:`snapshot` of this controller (as ``load_state_dict`` of its state would)."""
        scores, observed, self.num_updates, self.dropped_nonfinite = snapshot
        self._scores, self._observed = scores.copy(), observed.copy()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; refuse state saved under a different configuration."""
        missing = {"config", "scores", "observed", "num_updates", "dropped_nonfinite"} - set(state)
        if missing:
            raise ValueError(f"PromptGDRO state is missing keys {sorted(missing)}")
        if state.get("version", _STATE_VERSION) != _STATE_VERSION:
            raise ValueError(f"PromptGDRO state version {state.get('version')!r} is not {_STATE_VERSION}")
        # a state saved before the ESS floor and mix_support existed meant none and all bins
        saved, mine = {"min_ess": 0.0, "mix_support": "all", **state["config"]}, self.config()
        diff = [k for k in mine if saved.get(k) != mine[k]]
        if diff:
            details = ", ".join(f"{k}: saved {saved.get(k)!r} vs configured {mine[k]!r}" for k in diff)
            raise ValueError(f"PromptGDRO state was saved by a differently configured controller ({details})")
        scores = np.array(state["scores"], dtype=np.float64)
        observed = np.array(state["observed"], dtype=bool)
        if scores.shape != (self.num_bins,) or observed.shape != (self.num_bins,):
            raise ValueError(
                f"PromptGDRO state arrays must have shape ({self.num_bins},), "
                f"got scores {scores.shape} and observed {observed.shape}"
            )
        if not np.all(np.isfinite(scores)):
            raise ValueError("PromptGDRO state holds non-finite scores")
        self.restore((scores, observed, int(state["num_updates"]), int(state["dropped_nonfinite"])))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"PromptGDRO({args})"


def _check_range(name: str, value: Any, allowed: str) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is a finite number in ``allowed``, an
    interval ("(0.0, 1.0]") or a bound ("> 0.0", ">= 0.0") as the message states it."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in {allowed}, got {value!r}") from None
    if allowed[0] in "([":
        low, high = (float(x) for x in allowed[1:-1].split(", "))
        ok = (v > low if allowed[0] == "(" else v >= low) and (v < high if allowed[-1] == ")" else v <= high)
    else:
        op, low = allowed.split()
        ok = v > float(low) if op == ">" else v >= float(low)
    if not (math.isfinite(v) and ok):
        raise ValueError(f"{name} must be in {allowed}, got {value!r}")
