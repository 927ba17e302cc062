"""The data adversary's prompt draws, verl-free (the verl trainer, the CPU study, anyone's own loop).

:class:`PromptSampler` draws a step's distinct prompts under ``gdro.prompt.mode`` (docs/algorithm.md,
"Prompt sampling modes") with the exploration floor, without replacement; probabilities once per
update; excluded rows are drawn like the tail of one longer draw, so refills draw the batch as one.
Usage: docs/integration.md, "GDRO outside verl: your own RL loop".
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.evidence import draw_without_replacement, mix_uniform
from verl_gdro.prompt_gdro import effective_sample_size, resample_bin_masses
from verl_gdro.prompt_modes import get_prompt_mode
from verl_gdro.step.controller import GDROController

_STATE_VERSION = 1

#: The draw's own metrics (all under ``gdro/draw/``), :meth:`PromptSampler.draw_metrics`.
DRAW_METRICS: tuple[str, ...] = (
    "coverage",  # share of the training set visited at least once (observed by an update) so far
    "ess_share",  # Kish effective sample size of the draw probabilities over N: 1 / (N sum_i pi_i^2)
    "explore_share",  # expected share of the drawn prompts that the exploration floor drew
    "prompts",  # prompts drawn since the last update (the step's batch plus its refills)
    "calls",  # draws since the last update (1 + refill rounds)
    "excluded",  # rows excluded from those draws (in flight or already drawn), summed over the draws
)


class PromptSampler:
    """Draws batches of distinct training-set rows (``uids``: their distinct stable ids) with the
    ``controller``'s sampling mode, registering the set with it (:meth:`GDROController.attach_prompts`)."""

    def __init__(self, controller: GDROController, uids: ArrayLike, seed: int = 0) -> None:
        if not controller.resamples:
            raise ValueError(f"gdro.prompt.mode={controller.settings.prompt.mode!r} does not draw prompts: a "
                "PromptSampler needs Prompt-GDRO on with a sampling mode (resample, failure_weighted, greso or band)")
        self.controller = controller
        self.evidence = controller.attach_prompts(uids)
        self.uids = self.evidence.uids
        self.seed = int(seed)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        # resample: every row's committed bin, refreshed only where a visit happened since: O(batch) per step
        self._bins: NDArray[np.int64] | None = None
        self._bins_visits: NDArray[np.int64] | None = None
        #: resample: the share of the last draw directed by q_t (below 1 where the ESS floor bound)
        self.adversary_share = 1.0
        # the draw probabilities (read-only), the controller's (version, restores) they are of, their ESS share
        self._probs: NDArray[np.float64] | None = None
        self._probs_key: tuple[int, int] | None = None
        self._ess_share = 0.0
        #: O(N) probability passes and draws made so far (diagnostics, not state)
        self.passes = 0
        self.draws = 0
        self._reset_draw_stats()

    def __len__(self) -> int:
        return int(self.uids.size)

    def probabilities(self) -> NDArray[np.float64]:
        """Each row's draw probability for the next draw (sums to 1), exploration floor included."""
        settings = self.controller.settings.prompt
        mode = get_prompt_mode(settings.mode)
        if mode.draws_by_bin:
            bins = self._current_bins()
            sizes = np.bincount(bins, minlength=self.controller.num_bins)
            prompt = self.controller.prompt
            assert prompt is not None  # resamples implies Prompt-GDRO on
            # q_t over the bins that hold prompts, under the reweighting's ESS floor and weight cap
            mass, self.adversary_share = resample_bin_masses(prompt.scores, sizes, prompt.eta, prompt.score_clip,
                                                             prompt.gamma, prompt.max_weight, prompt.min_ess)
            priority = mass[bins] / sizes[bins]
        else:
            ev = self.evidence
            priority = mode.priority(settings, ev.successes, ev.trials, ev.streak, self.controller.rollout_n)
        return mix_uniform(priority, settings.explore)

    def _current_bins(self) -> NDArray[np.int64]:
        visits = self.evidence.visits
        if self._bins is None or self._bins_visits is None:
            self._bins = self.controller.bins_of(self.uids)
        else:
            moved = np.flatnonzero(visits != self._bins_visits)
            if moved.size:
                self._bins[moved] = self.controller.bins_of(self.uids[moved])
        self._bins_visits = visits.copy()
        return self._bins

    def current_probabilities(self) -> NDArray[np.float64]:
        """:meth:`probabilities` once per controller state (read-only): draws between updates share one pass."""
        key = (self.controller.version, self.controller.restores)
        if self._probs is None or self._probs_key != key:
            p = np.asarray(self.probabilities(), dtype=np.float64)
            p.setflags(write=False)
            self._probs, self._probs_key = p, key
            self._ess_share = min(1.0, effective_sample_size(p))  # Kish's share; 1 when uniform
            self.passes += 1
        return self._probs

    def draw(self, size: int, exclude: ArrayLike | None = None) -> NDArray[np.int64]:
        """``size`` distinct rows (positions into ``uids``) in draw order; ``exclude``d rows (in flight,
        drawn earlier) only when the others cannot fill the batch (repeats, rows outside ignored)."""
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 0 <= size <= self.uids.size:
            raise ValueError(f"batch size {size!r} is invalid: must be an integer in [0, {self.uids.size}] (the training set)")
        p = self.current_probabilities()
        excluded = 0
        if exclude is not None:
            rows = np.asarray(exclude, dtype=np.int64).reshape(-1)
            rows = np.unique(rows[(rows >= 0) & (rows < p.size)])
            if rows.size:
                p = p.copy()
                p[rows] = 0.0
                excluded = int(rows.size)
        drawn = draw_without_replacement(p, int(size), self._rng)
        self.draws += 1
        self._stats["calls"] += 1
        self._stats["prompts"] += drawn.size
        self._stats["excluded"] += excluded
        if drawn.size:
            # the chance that the floor, not the priority, drew each prompt: (e / N) / pi_i
            floor = self.controller.settings.prompt.explore / self.uids.size
            base = self._probs
            assert base is not None
            self._explore_sum += float(np.sum(np.minimum(1.0, floor / base[drawn])))
        return drawn

    def draw_metrics(self) -> dict[str, float]:
        """The ``gdro/draw/*`` metrics since the last call, then reset (call it after the update)."""
        stats, prompts = self._stats, self._stats["prompts"]
        values = (self.evidence.num_visited / self.uids.size, self._ess_share,
                  self._explore_sum / prompts if prompts else 0.0, prompts, stats["calls"], stats["excluded"])
        out = {f"gdro/draw/{name}": float(value) for name, value in zip(DRAW_METRICS, values)}
        self._reset_draw_stats()
        return out

    def _reset_draw_stats(self) -> None:
        self._stats = {"calls": 0, "prompts": 0, "excluded": 0}
        self._explore_sum = 0.0

    def state_dict(self) -> dict[str, Any]:
        """The generator (the evidence is saved with the controller)."""
        return {"version": _STATE_VERSION, "seed": self.seed, "rng": deepcopy(self._rng.bit_generator.state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a PromptSampler state of version {_STATE_VERSION}")
        self._rng.bit_generator.state = deepcopy(state["rng"])
        self.controller_restored()

    def controller_restored(self) -> None:
        """Forget the caches after the controller's state was replaced (call it if restoring the controller alone)."""
        self._bins = None
        self._bins_visits = None
        self._probs = None
        self._probs_key = None
