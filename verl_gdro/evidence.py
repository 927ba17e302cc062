"""Per-prompt evidence and what both adversaries read from it (numpy only, no verl or torch).

Each prompt's recent successes and trials, decayed per visit, are the evidence two decisions share:
the ``per_prompt`` allocator's utility u_i(n) (:func:`per_prompt_utility`, docs/algorithm.md
"Rollout-GDRO") and the per-prompt sampling modes' draw priorities (``verl_gdro/prompt_modes.py``,
"Prompt sampling modes"). They live on the math floor so that neither adversary imports the other's module.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import numpy as np

#: Utilities computed for every arm from a success rate (full information).
FULL_INFORMATION_UTILITIES = ("expected_informative", "failure_weighted", "knapsack", "variance")
#: Utilities of the ``per_prompt`` allocator: the rate-based ones and HORA's ``hit`` (it needs the counts).
PER_PROMPT_UTILITIES = (*FULL_INFORMATION_UTILITIES, "hit")


def expected_informative_utility(p: np.ndarray, arms: np.ndarray) -> np.ndarray:
    """Spec 3: u_b(n) = 1 - p_b^n - (1 - p_b)^n per bin (rows) and arm (columns), the probability of a
    non-zero GRPO gradient: unlike a bin's loss it depends on n (docs/algorithm.md, section 3)."""
    p = np.asarray(p, dtype=np.float64)[:, None]
    n = np.asarray(arms, dtype=np.float64)[None, :]
    return 1.0 - p**n - (1.0 - p) ** n


def arm_utility_values(name: str, p: np.ndarray, arms: np.ndarray) -> np.ndarray:
    """A full-information utility u(p, n) per rate (rows) and arm (columns), each concave in n (so greedy
    allocation is exact for ``per_prompt``): ``failure_weighted`` weighs the hard tail, ``knapsack`` is
    Knapsack RL's, ``variance`` VIP's (docs/algorithm.md, section 3)."""
    if name == "variance":
        return variance_utility(p, arms)
    u = expected_informative_utility(p, arms)
    q = np.asarray(p, dtype=np.float64)[:, None]
    if name == "expected_informative":
        return u
    if name == "failure_weighted":
        return (1.0 - q) * u
    if name == "knapsack":
        return q * (1.0 - q) ** 2 * u
    raise ValueError(f"arm_utility={name!r} is not a full-information utility; allowed: {list(FULL_INFORMATION_UTILITIES)}")


def variance_utility(p: np.ndarray, arms: np.ndarray) -> np.ndarray:
    """VIP (Nguyen et al., arXiv 2602.01601): u(p, n) = -p (1 - p) / n, the summed gradient variance under
    the budget; p is the smoothed per-prompt rate (VIP fits a Gaussian process), so only the objective differs."""
    q = np.asarray(p, dtype=np.float64)[:, None]
    n = np.asarray(arms, dtype=np.float64)[None, :]
    return -(q * (1.0 - q)) / n


def hit_utility(successes: np.ndarray, trials: np.ndarray, arms: np.ndarray) -> np.ndarray:
    """HORA (Wang et al., arXiv 2605.07114): P(at least one of n rollouts correct) under the uniform-prior
    posterior Beta(S + 1, T - S + 1): u(n) = 1 - prod_{j<n} (b + j) / (a + b + j), concave in n, per
    prompt (rows) and arm (columns); counts may be fractional (decayed evidence)."""
    s = np.asarray(successes, dtype=np.float64)[:, None]
    t = np.asarray(trials, dtype=np.float64)[:, None]
    a, b = s + 1.0, t - s + 1.0
    n_max = int(np.max(arms))
    j = np.arange(n_max, dtype=np.float64)[None, :]
    miss = np.cumprod((b + j) / (a + b + j), axis=1)  # column m: P(no success in m + 1 rollouts)
    return 1.0 - miss[:, np.asarray(arms, dtype=np.int64) - 1]


def per_prompt_utility(name: str, successes: np.ndarray, trials: np.ndarray, arms: np.ndarray) -> np.ndarray:
    """u_i(n) of the ``per_prompt`` allocator from each prompt's (successes, trials): ``hit`` reads the
    counts, every other utility the smoothed rate (:func:`smoothed_rate`)."""
    if name == "hit":
        return hit_utility(successes, trials, arms)
    if name not in FULL_INFORMATION_UTILITIES:
        raise ValueError(f"arm_utility={name!r} is not a per-prompt utility; allowed: {list(PER_PROMPT_UTILITIES)}")
    return arm_utility_values(name, smoothed_rate(successes, trials), arms)


def smoothed_rate(successes: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """A prompt's success rate with Jeffreys' prior: (S + 1/2) / (T + 1). A raw 0/4 would make every utility
    0; the prior keeps a hard prompt's rate small but positive and an unseen prompt at 1/2."""
    return (np.asarray(successes, dtype=np.float64) + 0.5) / (np.asarray(trials, dtype=np.float64) + 1.0)


# ---- draw priorities of the per-prompt sampling modes (docs/algorithm.md, "Prompt sampling modes") ----


def failure_weighted_priority(p: np.ndarray, n: int) -> np.ndarray:
    """Ours: the ``failure_weighted`` utility (1 - p)(1 - p^n - (1 - p)^n) at the mean budget n, read as a
    draw weight: likely to carry a gradient, more so the more it fails."""
    return arm_utility_values("failure_weighted", np.asarray(p, dtype=np.float64), np.array([n]))[:, 0]


def greso_keep_probability(streak: np.ndarray, revisit: float) -> np.ndarray:
    """GRESO (Zheng et al., arXiv 2506.02177): a prompt whose last z visits all gave zero-variance groups is
    kept with probability revisit^z (``revisit`` fixed here; GRESO adapts it)."""
    return float(revisit) ** np.asarray(streak, dtype=np.float64)


def band_priority(p: np.ndarray, width: float, center: float = 0.5) -> np.ndarray:
    """A band around p = 1/2: exp(-(p - center)^2 / (2 width^2)), the smooth form of DAPO's dynamic
    sampling and FG-ExPO's Gaussian weight, on the decayed per-prompt rate."""
    q = np.asarray(p, dtype=np.float64)
    return np.exp(-((q - float(center)) ** 2) / (2.0 * float(width) ** 2))


def mix_uniform(priority: np.ndarray, explore: float) -> np.ndarray:
    """Draw probabilities (1 - explore) * w / sum(w) + explore / N: the exploration floor that keeps
    every prompt's probability at least explore / N, so none is left unvisited for ever. All-zero
    priorities give the uniform distribution."""
    w = np.asarray(priority, dtype=np.float64)
    total = float(w.sum())
    uniform = 1.0 / w.size
    if not total > 0.0:
        return np.full(w.size, uniform)
    return (1.0 - explore) * (w / total) + explore * uniform


def draw_without_replacement(probs: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` distinct indices drawn one after another in proportion to ``probs`` (successive
    sampling without replacement), in O(N): Efraimidis and Spirakis' exponential race, keys
    E_i / p_i with E_i ~ Exp(1), the ``size`` smallest in key order. Zero-probability indices come
    last (never drawn while enough positive ones remain)."""
    p = np.asarray(probs, dtype=np.float64)
    if not 0 <= size <= p.size:
        raise ValueError(f"cannot draw {size} distinct prompts from {p.size}")
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    with np.errstate(divide="ignore"):
        keys = rng.standard_exponential(p.size) / p
    head = np.argpartition(keys, size - 1)[:size] if size < p.size else np.arange(p.size)
    return head[np.argsort(keys[head], kind="stable")].astype(np.int64)


# ---- the evidence store ----

_EVIDENCE_VERSION = 1


class PromptEvidence:
    """Decayed per-prompt evidence over a fixed prompt set (``uids``, distinct), in dense arrays: after a
    visit with s successes in t trials, S <- decay S + s, T <- decay T + t, and the zero-variance streak
    z <- z + 1 if s in {0, t} else 0. Equals the classifier's ``decayed_counts`` up to the visits out of
    its window, at O(visited prompts) per update; prompts outside the set are ignored."""

    def __init__(self, uids: Any, decay: float) -> None:
        u = np.asarray(uids)
        if u.ndim != 1 or u.size == 0 or not np.issubdtype(u.dtype, np.integer):
            raise ValueError(f"uids must be a non-empty 1-D integer array, got shape {u.shape} and dtype {u.dtype}")
        if not (isinstance(decay, (int, float, np.floating)) and 0.0 < float(decay) <= 1.0):
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.uids = u.astype(np.int64)
        self.decay = float(decay)
        self._order = np.argsort(self.uids, kind="stable")
        self._sorted = self.uids[self._order]
        if self._sorted.size > 1 and bool((self._sorted[1:] == self._sorted[:-1]).any()):
            raise ValueError("uids must be distinct (one stable id per prompt)")
        self.successes = np.zeros(u.size, dtype=np.float64)
        self.trials = np.zeros(u.size, dtype=np.float64)
        self.streak = np.zeros(u.size, dtype=np.int64)
        self.visits = np.zeros(u.size, dtype=np.int64)
        #: prompts visited at least once (kept with each visit: O(visited), not a pass over N)
        self.num_visited = 0

    def __len__(self) -> int:
        return int(self.uids.size)

    def rows(self, uids: Any) -> np.ndarray:
        """Row of each uid in the set; -1 for a uid outside it."""
        u = np.asarray(uids, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._sorted, u), self._sorted.size - 1)
        return np.where(self._sorted[pos] == u, self._order[pos], -1)

    def observe(self, uids: Any, successes: Any, trials: Any) -> None:
        """One visit per (distinct) uid: decay its evidence and add the visit's counts."""
        r = self.rows(uids)
        s = np.asarray(successes, dtype=np.float64)
        t = np.asarray(trials, dtype=np.float64)
        keep = r >= 0
        r, s, t = r[keep], s[keep], t[keep]
        if r.size == 0:
            return
        if np.unique(r).size != r.size:
            raise ValueError("PromptEvidence.observe takes one visit per prompt: pool a prompt's groups first")
        self.successes[r] = self.decay * self.successes[r] + s
        self.trials[r] = self.decay * self.trials[r] + t
        zero_variance = (s == 0) | (s == t)
        self.streak[r] = np.where(zero_variance, self.streak[r] + 1, 0)
        self.num_visited += int(np.count_nonzero(self.visits[r] == 0))
        self.visits[r] += 1

    def rates(self) -> np.ndarray:
        """The smoothed decayed rate of every row (1/2 for an unseen prompt)."""
        return smoothed_rate(self.successes, self.trials)

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _EVIDENCE_VERSION, "decay": self.decay, "uids": self.uids.copy(),
            "successes": self.successes.copy(), "trials": self.trials.copy(), "streak": self.streak.copy(),
            "visits": self.visits.copy()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; refuses the evidence of another prompt set or decay."""
        if not isinstance(state, dict) or state.get("version") != _EVIDENCE_VERSION:
            raise ValueError(f"not a PromptEvidence state of version {_EVIDENCE_VERSION}")
        if not np.array_equal(np.asarray(state["uids"]), self.uids):
            raise ValueError("PromptEvidence state was saved for a different prompt set")
        if float(state["decay"]) != self.decay:
            raise ValueError(f"PromptEvidence state was saved with decay {state['decay']}, this run uses {self.decay}")
        for name in ("successes", "trials", "streak", "visits"):
            arr = np.asarray(deepcopy(state[name]))
            if arr.shape != self.uids.shape:
                raise ValueError(f"PromptEvidence state field {name} has shape {arr.shape}, expected {self.uids.shape}")
            setattr(self, name, arr.astype(getattr(self, name).dtype))
        self.num_visited = int(np.count_nonzero(self.visits))
