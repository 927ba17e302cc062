"""One GDRO step, shared by the verl trainer and the CPU demo: plan -> multipliers -> update -> metrics.

:class:`GDROController` holds the classifier, Prompt-GDRO and Rollout-GDRO and runs them in the order
of docs/algorithm.md ("Order in step t"): ``before_generation`` (calls before one update accumulate),
``advantage_multipliers`` (Eq. 16), ``after_advantage`` and, with the update-time signal, ``after_update``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.allocators import ObservedStep, RolloutAllocator, get_allocator
from verl_gdro.allocators.protocol import Observation
from verl_gdro.classifier import OnlineDifficultyClassifier
from verl_gdro.evidence import PromptEvidence
from verl_gdro.prompt_gdro import PromptGDRO, failure_rate_loss, group_mean_from_sums
from verl_gdro.prompt_modes import get_prompt_mode
from verl_gdro.signals import get_loss_signal, update_time_signals
from verl_gdro.step.config import GDROSettings, resolve_gdro
from verl_gdro.step.describe import STATE_VERSION, check_saved_state, describe_mode, mode_name
from verl_gdro.step.observe import (
    ROLLOUT_SKIP_REASONS,
    StepOutcome,
    acc_array,
    bin_mean,
    count_outcomes,
    observation_metrics,
    rollout_metrics,
    update_all_or_nothing,
    update_time_losses,
    update_time_metrics,
    visit_classifier,
)
from verl_gdro.step.plan import StepPlan, StepPlanner

__all__ = ["EXTRA_METRICS", "ROLLOUT_METRICS", "ROLLOUT_SKIP_REASONS", "GDROController", "StepPlan", "describe_mode", "mode_name"]

logger = logging.getLogger(__name__)

#: Integration counters logged next to :data:`verl_gdro.metrics.METRIC_NAMES` (all under ``gdro/``).
EXTRA_METRICS: tuple[str, ...] = (
    "incomplete_groups",  # planned prompts whose trajectories did not all arrive (generation failures)
    "rollout_update_skipped",  # 1 when Rollout-GDRO skipped its update (any of ROLLOUT_SKIP_REASONS)
    "num_trajectories",  # non-padding trajectories that entered the step's statistics
)
#: Logged beside :data:`EXTRA_METRICS` when Rollout-GDRO is on; ``rollout_unweighted_bins``: bins
#: left out of an update under ``selection=sample`` because their draw is unknown or ambiguous.
ROLLOUT_METRICS: tuple[str, ...] = tuple(f"rollout_skip/{r}" for r in ROLLOUT_SKIP_REASONS) + ("rollout_unweighted_bins",)


class GDROController(StepPlanner):
    """The classifier, Prompt-GDRO and Rollout-GDRO of one run (``settings``: the resolved ``gdro``
    group; ``rollout_n``: verl's ``actor_rollout_ref.rollout.n``, the mean budget per prompt).

    With ``settings.enable`` false nothing is built (bin 0, ``rollout_n``, multipliers 1, no metrics);
    with only the adversaries off the classifier still runs and the metrics are logged. The strategies
    come from their registries; the controller asks only what they declare.
    """

    def __init__(self, settings: GDROSettings, rollout_n: int) -> None:
        if isinstance(rollout_n, bool) or not isinstance(rollout_n, (int, np.integer)) or rollout_n < 1:
            raise ValueError(f"actor_rollout_ref.rollout.n={rollout_n!r} is invalid: must be an integer >= 1")
        self.settings = settings
        self.rollout_n = int(rollout_n)
        self.num_bins = settings.num_bins
        self._mode = get_prompt_mode(settings.prompt.mode)
        self._signal = get_loss_signal(settings.prompt.loss_signal)
        self.classifier: OnlineDifficultyClassifier | None = None
        self.prompt: PromptGDRO | None = None
        self.rollout: RolloutAllocator | None = None
        if settings.enable:
            self.classifier = OnlineDifficultyClassifier(**settings.classifier.kwargs())
            if settings.prompt.enable:
                self.prompt = PromptGDRO(**settings.prompt.kwargs(self.num_bins))
            if settings.rollout.enable:
                r = settings.rollout
                self.rollout = get_allocator(r.allocator).from_settings(r, self.num_bins, self.rollout_n)
        #: Per-prompt evidence of the training set for the sampling modes (:meth:`attach_prompts`).
        self.evidence: PromptEvidence | None = None
        self.num_steps = 0
        #: Increments after every update (saved with the state: a resumed run counts on).
        self.version = 0
        #: Increments at every :meth:`load_state_dict` (not saved): with :attr:`version`, when a cache recomputes.
        self.restores = 0
        #: the last observed step, waiting for its update-time losses (:meth:`after_update`)
        self._awaiting: dict[str, Any] | None = None
        self._reset_pending()

    @classmethod
    def from_config(cls, cfg: Any, rollout_n: int) -> GDROController:
        """Build from the ``gdro`` group (mapping, DictConfig, :class:`GDROSettings`, or None = defaults)."""
        return cls(resolve_gdro(cfg), rollout_n)

    @property
    def reweights(self) -> bool:
        """Prompt-GDRO scales advantages (on, in a mode that does: ``reweight``)."""
        return self.prompt is not None and self._mode.scales_advantages

    @property
    def resamples(self) -> bool:
        """Prompt-GDRO draws the prompts (on, in a sampling mode); the multipliers are then exactly 1."""
        return self.prompt is not None and self._mode.draws_prompts

    @property
    def wants_update_losses(self) -> bool:
        """Whether the loss signal is measured in the actor's PPO update (then fed to :meth:`after_update`)."""
        if not self.settings.enable or not self._signal.measured_during_update:
            return False
        return self.prompt is not None or (self.rollout is not None and self.rollout.learns_from_update_loss)

    @property
    def token_fields(self) -> tuple[str, ...]:
        """The [N, T] arrays :meth:`after_advantage` needs for a driver-side loss signal; empty when
        it reads only outcomes or is measured in the update (the step may then be observed before verl's estimator)."""
        return () if self.prompt is None and self.rollout is None else self._signal.needs

    @property
    def awaiting_update(self) -> bool:
        """A step was observed whose update-time losses :meth:`after_update` has not received yet."""
        return self._awaiting is not None

    # ---- update -> metrics ----------------------------------------------------------------------

    def after_advantage(self, group_index: ArrayLike, acc: ArrayLike, *, response_mask: ArrayLike | None = None,
                        old_log_probs: ArrayLike | None = None, ref_log_probs: ArrayLike | None = None,
                        advantages: ArrayLike | None = None, log_probs: ArrayLike | None = None,
                        extra_time_s: float = 0.0) -> dict[str, float]:
        """Update every controller with the step's trajectories; return the ``gdro/`` metrics; clear the plan.

        ``group_index``: plan position of each non-padding trajectory; ``acc``: its binary correctness
        (>= 0.5), never the shaped score; the [N, T] arrays: what driver-side loss signals read
        (``log_probs`` defaults to ``old_log_probs``); ``extra_time_s``: the caller's controller-side time.
        """
        t0 = time.perf_counter()
        if not self.settings.enable:
            self._reset_pending()
            return {}
        g = self._group_index(group_index)
        out = count_outcomes(g, acc_array(acc, g.size), self._n)
        deferred = self.wants_update_losses
        if deferred and self._awaiting is not None:
            logger.warning(
                "verl-gdro: step %d's update-time losses never reached GDROController.after_update; Prompt-GDRO "
                "skips that step's update", self.num_steps - 1,
            )
            self._awaiting = None
        arrays = {"response_mask": response_mask, "old_log_probs": old_log_probs, "ref_log_probs": ref_log_probs,
                  "advantages": advantages, "log_probs": log_probs}
        losses = out.keep(self._losses(g, out, arrays))
        prompt_info, q_used, omega_used, obs = update_all_or_nothing(
            [self.prompt, self.rollout], lambda: self._update(out, losses, deferred))
        bins_p = out.keep(self._bins)
        if deferred:
            self._awaiting = {"num_groups": out.num_groups, "present": out.present.copy(), "bins": bins_p.copy(),
                              "n": self._n[out.present].copy(), "successes": out.keep(out.successes).copy(),
                              "rollout": obs is not None and obs.awaits_update_loss}
        self.num_steps += 1
        self.version += 1
        elapsed = self._time + (time.perf_counter() - t0) + float(extra_time_s)
        metrics = observation_metrics(self, out, losses, prompt_info, q_used, omega_used, elapsed)
        metrics.update(rollout_metrics(obs, out.incomplete, g.size))
        self._reset_pending()
        return metrics

    def _update(self, out: StepOutcome, losses: NDArray[np.float64], deferred: bool) -> tuple[Any, ...]:
        """Prompt-GDRO, the allocator, then the classifier (inside :func:`update_all_or_nothing`); the order
        changes no decision: every update reads this step's plan, not the classifier's new estimates."""
        bins_p, succ_p, uids_p = out.keep(self._bins), out.keep(out.successes), out.keep(self._uids)
        prompt_info: dict[str, Any] = {}
        q_used, omega_used = self._q_used, self._omega_used
        if self.prompt is not None:
            if q_used is None:
                q_used, omega_used = self.prompt.bin_probs(), self.prompt.omega()
            if not deferred:
                prompt_info = self.prompt.update(bins_p, losses)
        obs: Observation | None = None
        if self.rollout is not None:
            obs = self.rollout.observe(ObservedStep(uids_p, bins_p, self._n[out.present], succ_p, losses,
                                                    out.incomplete, deferred, self.classifier))
        assert self.classifier is not None
        visit_classifier(self.classifier, self.evidence, uids_p, succ_p, out.keep(out.trials))
        return prompt_info, q_used, omega_used, obs

    def after_update(self, group_index: ArrayLike, losses: ArrayLike) -> dict[str, float]:
        """Feed the update-time loss of the step :meth:`after_advantage` last observed (``update_surrogate``).

        ``group_index``: plan position of each measured response (any subset; repeated passes are
        averaged); ``losses``: each one's loss from the actor's update. Prompt-GDRO (and a loss-fed
        allocator) update for the next step, the release's order; returns the per-bin ``loss`` and
        ``score`` metrics replacing :meth:`after_advantage`'s placeholders. A ValueError changes nothing.
        """
        if not self.wants_update_losses:
            raise ValueError(f"after_update needs gdro.prompt.loss_signal in {list(update_time_signals())} (got "
                f"{self.settings.prompt.loss_signal!r}) with Prompt-GDRO or a loss-fed bandit on")
        waiting = self._awaiting
        if waiting is None:
            raise ValueError("after_update: no observed step is waiting for its update-time losses (call after_advantage first)")
        measured, per_prompt, finite = update_time_losses(waiting, group_index, losses)
        bins = waiting["bins"][measured]

        def update() -> tuple[dict[str, Any], str | None]:
            info = self.prompt.update(bins, per_prompt) if self.prompt is not None and bins.size else {}
            refusal = None
            if waiting["rollout"] and self.rollout is not None and bins.size:
                # the measured subset: its bins' draws must still be known (section 3, `selection`)
                refusal = self.rollout.observe_update_loss(bins, waiting["n"][measured],
                                                           waiting["successes"][measured], per_prompt)
            return info, refusal

        info, refusal = update_all_or_nothing([self.prompt, self.rollout], update)
        self._awaiting = None
        scores = None if self.prompt is None else self.prompt.scores
        mean = info["mean_losses"] if info else bin_mean(bins, per_prompt, self.num_bins)
        return update_time_metrics(self.num_bins, bins, mean, scores, refusal, finite)

    def _losses(self, g: NDArray[np.int64], out: StepOutcome, arrays: dict[str, Any]) -> NDArray[np.float64]:
        """Per-prompt loss signal l(x), docs/algorithm.md section 2 (NaN where absent or not measured here)."""
        if self.prompt is None and self.rollout is None:  # the metrics' loss: the failure rate
            return failure_rate_loss(group_mean_from_sums(out.correct_sums, out.trials))
        if not self._signal.from_outcomes and self.prompt is None and not self.rollout.logs_loss_signal:
            return np.full(out.num_groups, np.nan)
        return self._signal.driver_losses(self.settings.prompt, g, out.num_groups, out.correct_sums, out.trials, arrays)

    # ---- checkpointing --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """All controller state (plain values). No plan is pending when verl checkpoints."""
        parts = {name: None if getattr(self, name) is None else getattr(self, name).state_dict()
                 for name in ("classifier", "prompt", "rollout", "evidence")}
        return {"version": STATE_VERSION, "settings": self.settings.to_dict(), "rollout_n": self.rollout_n,
                "num_steps": self.num_steps, "controller_version": self.version, **parts}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; refuses state saved under different settings or budget."""
        check_saved_state(state, self.settings.to_dict(), self.rollout_n,
                          {name: getattr(self, name) is not None for name in ("classifier", "prompt", "rollout")})
        for name in ("classifier", "prompt", "rollout"):
            if getattr(self, name) is not None:
                getattr(self, name).load_state_dict(state[name] if name == "classifier" else dict(state[name]))
        evidence = state.get("evidence")
        if evidence is not None:
            if self.evidence is None:
                self.evidence = PromptEvidence(evidence["uids"], decay=self.settings.prompt.rate_decay)
            self.evidence.load_state_dict(dict(evidence))
        self.num_steps = int(state["num_steps"])
        self.version = int(state["controller_version"])
        self.restores += 1
        self._reset_pending()
