"""The per-bin allocators' shared configuration, state and checks: :class:`RolloutGDRO` (docs/algorithm.md,
section 3). The bin bandit, Neyman and per-prompt share ``gdro.rollout.*``, one ``state_dict`` format
and :meth:`RolloutGDRO.observe`; each overrides ``_allocate`` and ``_learn``, and the math they share is
in :mod:`verl_gdro.rollout_gdro`. ``RolloutGDRO(num_bins, allocator=name, ...)`` builds the registered
class of that name. numpy only.
"""

from __future__ import annotations

import logging
import math
from copy import deepcopy
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from verl_gdro.allocators.protocol import Observation, ObservedStep
from verl_gdro.allocators.registry import ALLOCATOR_REGISTRY, get_allocator
from verl_gdro.classifier import int_array
from verl_gdro.evidence import FULL_INFORMATION_UTILITIES, PER_PROMPT_UTILITIES
from verl_gdro.rollout_gdro import (
    ARM_UTILITIES,
    MAX_RECORDED_DRAWS,
    SELECTIONS,
    exp_weights_arm_probs,
)

__all__ = ["RolloutGDRO", "StepStats"]

logger = logging.getLogger("verl_gdro.step.controller")

_STATE_VERSION = 1


def _check_range(name: str, ok: bool, allowed: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is out of range; allowed: {allowed}")


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _per_bin_names() -> list[str]:
    return [n for n, c in ALLOCATOR_REGISTRY.items() if isinstance(c, type) and issubclass(c, RolloutGDRO)]


def check_rollout_args(num_bins: Any, n_min: Any, n_max: Any, n_mean: Any, eta: Any, gamma: Any, score_ema: Any,
                       dual_lr: Any, allocator: str, arm_utility: str, selection: str, seed: Any) -> None:
    """The constructor's range checks (a ValueError naming the argument)."""
    _check_range("num_bins", _is_int(num_bins) and num_bins >= 1, "integer >= 1", num_bins)
    for name, val in (("n_min", n_min), ("n_max", n_max), ("n_mean", n_mean)):
        _check_range(name, _is_int(val), "an integer", val)
    _check_range("n_min", n_min >= 2, "integer >= 2 (a group of 1 has no GRPO gradient)", n_min)
    _check_range("n_min", n_min <= n_mean, f"n_min <= n_mean={n_mean}", n_min)
    _check_range("n_mean", n_mean <= n_max, f"n_mean <= n_max={n_max}", n_mean)
    _check_range("eta", _is_real(eta) and math.isfinite(eta) and eta > 0, "finite eta > 0", eta)
    _check_range("gamma", _is_real(gamma) and 0.0 <= gamma < 1.0, "[0, 1)", gamma)
    _check_range("score_ema", _is_real(score_ema) and 0.0 < score_ema <= 1.0, "(0, 1]", score_ema)
    _check_range("dual_lr", _is_real(dual_lr) and math.isfinite(dual_lr) and dual_lr >= 0, "finite dual_lr >= 0", dual_lr)
    names = _per_bin_names()
    _check_range("allocator", allocator in names, f"one of {names}", allocator)
    _check_range("arm_utility", arm_utility in ARM_UTILITIES, f"one of {list(ARM_UTILITIES)}", arm_utility)
    _check_range("selection", selection in SELECTIONS, f"one of {list(SELECTIONS)}", selection)
    per_prompt = get_allocator(allocator).per_prompt_evidence
    _check_range("arm_utility", not per_prompt or arm_utility in PER_PROMPT_UTILITIES,
                 f"one of {list(PER_PROMPT_UTILITIES)} with allocator='per_prompt' (it needs u(p, n) for every n)",
                 arm_utility)
    _check_range("arm_utility", arm_utility != "hit" or per_prompt,
                 "'hit' only with allocator='per_prompt' (it needs each prompt's own counts)", arm_utility)
    _check_range("seed", _is_int(seed) and seed >= 0, "integer >= 0", seed)


@dataclass(frozen=True)
class StepStats:
    """One update's validated per-prompt inputs and the step's per-bin problem."""

    bins: NDArray[np.int64]
    n: NDArray[np.int64]
    successes: NDArray[np.int64]
    losses: NDArray[np.float64] | None
    present: NDArray[np.int64]
    counts: NDArray[np.int64]
    inverse: NDArray[np.int64]
    budget: int
    rate: NDArray[np.float64]


class RolloutGDRO:
    """Rollout counts under an exact mean budget (docs/algorithm.md section 3), the per-bin family.

    Call :meth:`allocate` with the step's bins before generation and :meth:`update` with the
    step's results afterwards. All state is in :meth:`state_dict`, so a resumed run continues
    bit-identically. ``RolloutGDRO(..., allocator=name)`` returns the registered class ``name``.
    """

    name: ClassVar[str] = "bandit"
    reads: ClassVar[tuple[str, ...]] = ("rollout.n_min", "rollout.n_max")
    logs_loss_signal: ClassVar[bool] = True
    #: whether the allocation reads each prompt's own evidence (``counts``) instead of its bin
    per_prompt_evidence: ClassVar[bool] = False
    prices_at_plan: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> RolloutGDRO:
        if cls is RolloutGDRO:
            name = kwargs.get("allocator", args[8] if len(args) > 8 else "bandit")
            target = ALLOCATOR_REGISTRY.get(name) if isinstance(name, str) else None
            if isinstance(target, type) and issubclass(target, RolloutGDRO):
                cls = target
        return object.__new__(cls)

    def __init__(self, num_bins: int, n_min: int = 2, n_max: int = 12, n_mean: int = 4, eta: float = 0.65,
                 gamma: float = 0.01, score_ema: float = 0.4, dual_lr: float = 0.05, allocator: str = "bandit",
                 arm_utility: str = "expected_informative", selection: str = "auto", seed: int = 0) -> None:
        check_rollout_args(num_bins, n_min, n_max, n_mean, eta, gamma, score_ema, dual_lr, allocator, arm_utility,
                           selection, seed)
        self.num_bins = int(num_bins)
        self.n_min, self.n_max, self.n_mean = int(n_min), int(n_max), int(n_mean)
        self.eta, self.gamma = float(eta), float(gamma)
        self.score_ema, self.dual_lr = float(score_ema), float(dual_lr)
        self.allocator, self.arm_utility, self.selection = allocator, arm_utility, selection
        self.seed = int(seed)
        self._arms = np.arange(self.n_min, self.n_max + 1, dtype=np.int64)
        self._scores = np.zeros((self.num_bins, self._arms.size))
        self._mu = 0.0
        self._pass_rate = np.full(self.num_bins, np.nan)  # smoothed p_b (expected_informative)
        self._variance = np.full(self.num_bins, 0.25)  # v_b (neyman)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._steps = 0
        # The sampled draws since the last update (selection='sample'), oldest first: see the bin
        # bandit (verl_gdro/allocators/bandit.py). Saved with the state.
        self._draws: list[tuple[np.ndarray, np.ndarray]] = []

    # ---- construction from the gdro group ---------------------------------------------------

    @classmethod
    def from_settings(cls, rollout: Any, num_bins: int, n_mean: int) -> RolloutGDRO:
        """Build from the resolved ``gdro.rollout`` settings (``n_mean`` = verl's ``rollout.n``)."""
        return cls(**rollout.kwargs(num_bins, n_mean))

    @classmethod
    def describe(cls, rollout: Any) -> str:
        """The allocator's part of the mode line (``describe_mode``) and the dry run."""
        return f"{rollout.allocator}/{rollout.arm_utility}/{rollout.selection}"

    # ---- configuration ------------------------------------------------------------------

    @property
    def arms(self) -> np.ndarray:
        """The arm values n_min..n_max (a copy)."""
        return self._arms.copy()

    @property
    def effective_selection(self) -> str:
        """``auto`` resolved: ``map`` for the full-information utility, ``sample`` otherwise
        (played-arm utilities need exploration; EXP3 importance weights need a random draw)."""
        if self.selection != "auto":
            return self.selection
        return "map" if self.arm_utility in FULL_INFORMATION_UTILITIES else "sample"

    @property
    def mu(self) -> float:
        """Shadow price: the dual variable (bandit), the implied price of Eq. 31 (neyman), the last
        rollout's marginal gain (per_prompt)."""
        return self._mu

    @property
    def learns_from_update_loss(self) -> bool:
        """Whether the allocator learns from the loss measured during the update (``after_update``)."""
        return False

    def _config(self) -> dict[str, Any]:
        keys = ("num_bins", "n_min", "n_max", "n_mean", "eta", "gamma", "score_ema", "dual_lr", "allocator",
                "arm_utility", "selection", "seed")
        return {k: getattr(self, k) for k in keys}

    def arm_probs(self) -> np.ndarray:
        """[B, A] p_b(n) of Eq. 17 from the current arm scores."""
        return exp_weights_arm_probs(self._scores, self.eta, self.gamma)

    def _validate_bins(self, bins: Any) -> np.ndarray:
        return int_array("bins", bins, integral_floats=True, num_bins=self.num_bins)

    def _step_problem(self, bins: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Present bins, their counts, inverse index per prompt, and the exact budget."""
        present, inverse, counts = np.unique(bins, return_inverse=True, return_counts=True)
        return present, counts.astype(np.int64), inverse, self.n_mean * int(bins.size)

    # ---- allocation ---------------------------------------------------------------------

    def plan(self, uids: NDArray[np.int64], bins: NDArray[np.int64], classifier: Any) -> NDArray[np.int64]:
        """A generation call's rollouts per prompt (the controller's entry; exact budget)."""
        if not uids.size:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self.allocate(bins), dtype=np.int64)

    def allocate(self, bins: Any, rates: Any = None, counts: Any = None) -> np.ndarray:
        """Rollouts per prompt for the step's bins (ints in [n_min, n_max], sum == n_mean * len)."""
        b = self._validate_bins(bins)
        if b.size == 0:
            return np.zeros(0, dtype=np.int64)
        n, budget = self._allocate(b, rates, counts), self.n_mean * int(b.size)
        # The spec's invariant, checked even under python -O: compute neutrality is the contract.
        if int(n.sum()) != budget or n.min() < self.n_min or n.max() > self.n_max:
            raise AssertionError(f"allocation violates the exact budget {budget} or the arm range")
        return n

    def _allocate(self, b: np.ndarray, rates: Any, counts: Any) -> np.ndarray:
        """Rollouts per prompt of the (checked, non-empty) bins ``b``."""
        raise NotImplementedError

    # ---- update -------------------------------------------------------------------------

    def update(self, bins: Any, n: Any, successes: Any, losses: Any = None) -> dict[str, Any]:
        """Feed one step's per-prompt results; returns an info dict for metrics.

        ``n``: rollouts each prompt got, in [n_min, n_max]; ``successes``: correct rollouts, in [0,
        n]; ``losses``: per-prompt loss signal, required for ``arm_utility="loss"`` (non-finite
        entries are dropped and counted). A call that raises leaves the allocator unchanged.
        """
        stats = self._stats(bins, n, successes, losses)
        bin_rate = np.full(self.num_bins, np.nan)
        bin_rate[stats.present] = stats.rate
        info: dict[str, Any] = {"bin_success_rate": bin_rate, "realised_mean_n": float(stats.n.mean())}
        self._learn(stats, info)
        return info

    def _stats(self, bins: Any, n: Any, successes: Any, losses: Any) -> StepStats:
        b = self._validate_bins(bins)
        n_a = int_array("n", n, integral_floats=True)
        s_a = int_array("successes", successes, integral_floats=True)
        if b.size == 0:
            raise ValueError("bins must hold at least one prompt for update")
        if n_a.shape != b.shape or s_a.shape != b.shape:
            raise ValueError(f"bins, n and successes must have equal lengths, got {b.size}, {n_a.size}, {s_a.size}")
        if n_a.min() < self.n_min or n_a.max() > self.n_max:
            raise ValueError(
                f"n must lie in the arm range [{self.n_min}, {self.n_max}], got values in [{n_a.min()}, {n_a.max()}]")
        if s_a.min() < 0 or np.any(s_a > n_a):
            raise ValueError("successes must lie in [0, n] per prompt")
        loss_a = None if losses is None else np.asarray(losses, dtype=np.float64)
        if loss_a is not None and loss_a.shape != b.shape:
            raise ValueError(f"losses must have length {b.size}, got shape {loss_a.shape}")
        present, counts, inverse, budget = self._step_problem(b)
        succ_bin = np.bincount(inverse, weights=s_a, minlength=present.size)
        trials_bin = np.bincount(inverse, weights=n_a, minlength=present.size)
        return StepStats(b, n_a, s_a, loss_a, present, counts, inverse, budget, succ_bin / trials_bin)

    def _learn(self, stats: StepStats, info: dict[str, Any]) -> None:
        """Update the allocator's state from one step (state untouched when it raises, e.g. for missing losses)."""
        raise NotImplementedError

    def update_refusal(self, bins: Any, n: Any) -> str | None:
        """Why :meth:`update` would refuse this step's (bins, n) (a ``ROLLOUT_SKIP_REASONS`` entry), or None."""
        return None

    def observe(self, step: ObservedStep) -> Observation:
        """Take one step's outcome: update, skip (with its reason, logged) or wait for the update-time loss."""
        refusal = self.update_refusal(step.bins, step.n) if step.bins.size else None
        defer = step.deferred and self.learns_from_update_loss
        if step.incomplete == 0 and step.bins.size and refusal is None:
            if defer:  # learns from the update-time loss in observe_update_loss
                return Observation(awaits_update_loss=True)
            return Observation(info=self.update(step.bins, step.n, step.successes, None if step.deferred else step.losses))
        skip = "incomplete" if refusal is None else refusal
        _warn_skip(skip, self.arm_utility, step.incomplete)
        return Observation(skip=skip)

    def observe_update_loss(self, bins: Any, n: Any, successes: Any, losses: Any) -> str | None:
        """Learn from the update-time losses of the measured prompts; the skip reason, or None."""
        refusal = self.update_refusal(bins, n)
        if refusal is None:
            self.update(bins, n, successes, losses)
        return refusal

    def metrics(self, num_bins: int) -> dict[str, float]:
        """Allocator-specific ``gdro/`` metrics of the last step (none for the per-bin family)."""
        return {}

    # ---- checkpointing ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically, as plain numpy/python values."""
        return {
            "version": _STATE_VERSION, "config": self._config(), "scores": self._scores.copy(), "mu": self._mu,
            "pass_rate": self._pass_rate.copy(), "variance": self._variance.copy(),
            "rng": deepcopy(self._rng.bit_generator.state), "steps": self._steps,
            "draws": [(arm.copy(), prob.copy()) for arm, prob in self._draws],
        }

    def snapshot(self) -> tuple[Any, ...]:
        """The mutable part of :meth:`state_dict` (no config, no deep copies), for :meth:`restore`:
        what an all-or-nothing step keeps to roll back with (``GDROController.after_advantage``)."""
        return (self._scores.copy(), self._mu, self._pass_rate.copy(), self._variance.copy(),
                self._rng.bit_generator.state, self._steps, list(self._draws))

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Return to a :meth:`snapshot` of this controller (as ``load_state_dict`` of its state would)."""
        scores, mu, pass_rate, variance, rng_state, steps, draws = snapshot
        self._rng.bit_generator.state = rng_state  # first: a malformed saved state raises before any change
        self._scores, self._pass_rate, self._variance = scores.copy(), pass_rate.copy(), variance.copy()
        self._mu, self._steps, self._draws = mu, steps, list(draws)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; rejects state of a differently configured controller."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"state must be a RolloutGDRO state_dict of version {_STATE_VERSION}, got "
                f"{state.get('version') if isinstance(state, dict) else type(state).__name__}")
        mine, theirs = self._config(), state.get("config", {})
        diff = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: saved {s!r} vs this {c!r}" for k, (s, c) in diff.items())
            raise ValueError(f"RolloutGDRO state comes from a differently configured controller ({detail})")
        shape = (self.num_bins, self._arms.size)
        scores = np.array(state["scores"], dtype=np.float64)
        pass_rate = np.array(state["pass_rate"], dtype=np.float64)
        variance = np.array(state["variance"], dtype=np.float64)
        if scores.shape != shape or pass_rate.shape != (self.num_bins,) or variance.shape != (self.num_bins,):
            raise ValueError("RolloutGDRO state arrays do not match num_bins / arm range")
        draws = _load_draws(state.get("draws", ()), self.num_bins)
        self.restore((scores, float(state["mu"]), pass_rate, variance, state["rng"], int(state["steps"]), draws))


def _warn_skip(reason: str, arm_utility: str, incomplete: int) -> None:
    """Log why the allocator skips a step's update (the controller counts it as a metric)."""
    if reason == "incomplete":
        logger.warning("verl-gdro: %d planned prompt(s) lack trajectories (generation failures); Rollout-GDRO "
                       "skips this step's update rather than learn from a partial budget", incomplete)
        return
    logger.warning(
        "verl-gdro: Rollout-GDRO skips this step's update (%s): %s", reason,
        "the step's prompts were planned in several calls that gave one bin different n, and the "
        f"played-arm utility ({arm_utility}) needs one arm per bin"
        if reason == "mixed_arms" else
        "no bin's arm comes from exactly one recorded draw, so no importance weight is known",
    )


def _load_draws(saved: Any, num_bins: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The recorded draws of a saved state (absent in states saved before draws were recorded:
    the bandit's update then falls back to the step's own problem when it spends the exact budget)."""
    draws = []
    for arm, prob in saved:
        arm, prob = np.asarray(arm, dtype=np.int64).copy(), np.asarray(prob, dtype=np.float64).copy()
        if arm.shape != (num_bins,) or prob.shape != (num_bins,):
            raise ValueError("RolloutGDRO state draws do not match num_bins")
        draws.append((arm, prob))
    return draws[-MAX_RECORDED_DRAWS:]
