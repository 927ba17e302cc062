"""One GDRO step, shared by the verl trainer and the CPU demo: plan -> multipliers -> update -> metrics.

:class:`GDROController` holds the three controllers of docs/algorithm.md (classifier, Prompt-GDRO,
Rollout-GDRO) and turns one step's flat per-trajectory arrays into decisions, controller updates
and the ``gdro/`` metrics. The ``gdro_sync`` trainer and the CPU demo both call exactly this code,
so what the demo measures is what a GPU run does. numpy only at import (no verl, no torch).

A step, in the order of docs/algorithm.md ("Order in step t"):

1. ``plan = ctrl.before_generation(prompt_uids)``: classify the step's prompts with the history up
   to t-1 (``plan.bins``) and, with Rollout-GDRO on, allocate ``plan.rollout_n`` under the exact
   budget ``rollout_n * len(prompt_uids)``. Several calls before one update accumulate (verl may
   fetch a step's prompts in chunks); positions continue across calls (``plan.positions``).
2. ``mult = ctrl.advantage_multipliers(group_index)``: the Eq. 16 multiplier of every trajectory
   (``group_index`` = the plan position of its prompt), from S_{t-1}; exactly 1.0 when Prompt-GDRO
   is off or in a sampling mode (``resample``, ``failure_weighted``, ``greso``, ``band``). Hand them to the estimator with
   ``verl_gdro.step.context.gdro_step`` around verl's ``compute_advantage``.
3. ``metrics = ctrl.after_advantage(group_index, acc, ...)``: per-prompt loss signal
   (docs/algorithm.md section 2), classifier visit, Prompt-GDRO and Rollout-GDRO updates, the
   sampling modes' per-prompt evidence, and every metric of docs/algorithm.md section 4 (``verl_gdro.metrics.step_metrics``) plus a few integration counters. The
   ``failure_rate`` signal reads only ``acc``, so this may run as soon as step 2's multipliers
   are taken (the GDRO trainer does so, before verl's estimator); the surrogate signals read the
   advantages and run after it.
4. Only with the update-time signal (``update_surrogate``, :attr:`GDROController.wants_update_losses`):
   ``metrics = ctrl.after_update(group_index, losses)`` after the PPO update, with each measured
   response's loss; Prompt-GDRO (and a bandit fed the loss) learns from it for the next step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.classifier import MAX_TRIALS_PER_VISIT, OnlineDifficultyClassifier
from verl_gdro.evidence import PromptEvidence
from verl_gdro.metrics import PREFIX, step_metrics_prepared
from verl_gdro.presets import UPDATE_TIME_SIGNALS
from verl_gdro.prompt_gdro import (
    PromptGDRO,
    bin_mean_losses,
    failure_rate_loss,
    group_mean_from_sums,
    mix_probs,
    surrogate_kl_loss,
    surrogate_loss,
)
from verl_gdro.release_as_run import ReleaseAsRunAllocator, release_classes
from verl_gdro.rollout_gdro import RolloutGDRO
from verl_gdro.step.config import SAMPLING_MODES, GDROSettings, resolve_gdro

__all__ = ["EXTRA_METRICS", "ROLLOUT_METRICS", "ROLLOUT_SKIP_REASONS", "GDROController", "StepPlan", "describe_mode", "mode_name"]

logger = logging.getLogger(__name__)

_STATE_VERSION = 1
#: gdro.prompt keys added with the sampling modes (filled in when loading an older state)
_SAMPLING_KEYS = ("explore", "rate_decay", "revisit", "band_width")

#: Integration counters logged next to :data:`verl_gdro.metrics.METRIC_NAMES` (all under ``gdro/``).
EXTRA_METRICS: tuple[str, ...] = (
    "incomplete_groups",  # planned prompts whose trajectories did not all arrive (generation failures)
    "rollout_update_skipped",  # 1 when Rollout-GDRO skipped its update (any reason below)
    "num_trajectories",  # non-padding trajectories that entered the step's statistics
)

#: Why Rollout-GDRO skips a step's update, each logged as ``gdro/rollout_skip/<reason>`` (0 / 1)
#: when Rollout-GDRO is on: ``incomplete`` (planned prompts without all their trajectories),
#: ``mixed_arms`` (a played-arm utility saw one bin with several n), ``unknown_draw`` (under
#: ``selection=sample`` no bin's arm comes from exactly one recorded draw).
ROLLOUT_SKIP_REASONS: tuple[str, ...] = ("incomplete", "mixed_arms", "unknown_draw")
#: Logged beside :data:`EXTRA_METRICS` when Rollout-GDRO is on; ``rollout_unweighted_bins``: bins
#: left out of an update under ``selection=sample`` because their draw is unknown or ambiguous.
ROLLOUT_METRICS: tuple[str, ...] = tuple(f"rollout_skip/{r}" for r in ROLLOUT_SKIP_REASONS) + ("rollout_unweighted_bins",)


@dataclass(frozen=True)
class StepPlan:
    """Decisions for the prompts of one :meth:`GDROController.before_generation` call.

    ``positions`` are these prompts' indices in the step (the ``group_index`` values their
    trajectories must carry); ``bins`` their difficulty bins; ``rollout_n`` their rollout counts
    (``rollout_n`` of the controller for every prompt when Rollout-GDRO is off).
    """

    positions: NDArray[np.int64]
    uids: NDArray[np.int64]
    bins: NDArray[np.int64]
    rollout_n: NDArray[np.int64]


class GDROController:
    """The classifier, Prompt-GDRO and Rollout-GDRO of one run, driven one step at a time.

    Args:
        settings: the resolved ``gdro`` group (:func:`verl_gdro.step.config.resolve_gdro`).
        rollout_n: verl's ``actor_rollout_ref.rollout.n``, the mean rollout budget per prompt.

    With ``settings.enable`` false nothing is built: every prompt gets bin 0 and ``rollout_n``,
    multipliers are 1 and :meth:`after_advantage` returns no metrics. With only the adversaries
    off, the classifier still runs and the metrics are logged (GRPO with the curriculum plots).
    """

    def __init__(self, settings: GDROSettings, rollout_n: int) -> None:
        if isinstance(rollout_n, bool) or not isinstance(rollout_n, (int, np.integer)) or rollout_n < 1:
            raise ValueError(f"actor_rollout_ref.rollout.n={rollout_n!r} is invalid: must be an integer >= 1")
        self.settings = settings
        self.rollout_n = int(rollout_n)
        self.num_bins = settings.num_bins
        self.classifier: OnlineDifficultyClassifier | None = None
        self.prompt: PromptGDRO | None = None
        self.rollout: RolloutGDRO | ReleaseAsRunAllocator | None = None
        if settings.enable:
            self.classifier = OnlineDifficultyClassifier(**settings.classifier.kwargs())
            if settings.prompt.enable:
                self.prompt = PromptGDRO(**settings.prompt.kwargs(self.num_bins))
            if settings.rollout.enable and settings.rollout.allocator == "release_as_run":
                r = settings.rollout
                self.rollout = ReleaseAsRunAllocator(self.num_bins, r.n_min, r.n_max, self.rollout_n)
            elif settings.rollout.enable:
                self.rollout = RolloutGDRO(**settings.rollout.kwargs(self.num_bins, self.rollout_n))
        #: Per-prompt evidence of the training set for the sampling modes (:meth:`attach_prompts`).
        self.evidence: PromptEvidence | None = None
        self.num_steps = 0
        #: Increments after every update (saved with the state: a resumed run counts on).
        self.version = 0
        #: Increments at every :meth:`load_state_dict` (not saved): with :attr:`version` it tells a
        #: reader caching a function of the state (the sampler's draw probabilities) when to recompute.
        self.restores = 0
        #: the last observed step, waiting for its update-time losses (:meth:`after_update`)
        self._awaiting: dict[str, Any] | None = None
        self._reset_pending()

    @classmethod
    def from_config(cls, cfg: Any, rollout_n: int) -> GDROController:
        """Build from the ``gdro`` group (mapping, DictConfig, :class:`GDROSettings`, or None = defaults)."""
        return cls(resolve_gdro(cfg), rollout_n)

    # ------------------------------------------------------------------------------------------
    # properties
    # ------------------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.settings.enable

    @property
    def reweights(self) -> bool:
        """Prompt-GDRO scales advantages (on, ``mode=reweight``)."""
        return self.prompt is not None and self.settings.prompt.mode == "reweight"

    @property
    def resamples(self) -> bool:
        """Prompt-GDRO draws the prompts (on, ``mode`` one of the sampling modes: ``resample`` or a
        per-prompt priority); the multipliers are then exactly 1."""
        return self.prompt is not None and self.settings.prompt.mode in SAMPLING_MODES

    @property
    def wants_update_losses(self) -> bool:
        """Whether the loss signal is measured during the actor's PPO update (``update_surrogate``):
        the caller then hands each response's update-time loss to :meth:`after_update` after the
        update, and Prompt-GDRO (and a bandit fed the loss) learns from it for the next step."""
        if not self.enabled or self.settings.prompt.loss_signal not in UPDATE_TIME_SIGNALS:
            return False
        return self.prompt is not None or self._rollout_needs_loss

    @property
    def _rollout_needs_loss(self) -> bool:
        r = self.rollout
        return isinstance(r, RolloutGDRO) and r.allocator == "bandit" and r.arm_utility == "loss"

    @property
    def awaiting_update(self) -> bool:
        """A step was observed whose update-time losses :meth:`after_update` has not received yet."""
        return self._awaiting is not None

    @property
    def pending_prompts(self) -> int:
        """Prompts planned since the last update."""
        return int(self._uids.size)

    # ------------------------------------------------------------------------------------------
    # step API
    # ------------------------------------------------------------------------------------------

    def _reset_pending(self) -> None:
        self._uids = np.zeros(0, dtype=np.int64)
        self._bins = np.zeros(0, dtype=np.int64)
        self._n = np.zeros(0, dtype=np.int64)
        self._bin_weights: NDArray[np.float64] | None = None
        self._q_used: NDArray[np.float64] | None = None
        self._omega_used: NDArray[np.float64] | None = None
        self._time = 0.0

    def before_generation(self, prompt_uids: ArrayLike) -> StepPlan:
        """Classify the prompts (history up to t-1) and choose their rollouts. Accumulates until
        :meth:`after_advantage`. ``prompt_uids`` are stable int ids; repeats are allowed (a
        resampling sampler may draw a prompt twice: it is then two groups of the step)."""
        t0 = time.perf_counter()
        uids, bins, n = self._classify_and_allocate(prompt_uids)
        start = self._uids.size
        positions = np.arange(start, start + uids.size, dtype=np.int64)
        self._uids = np.concatenate([self._uids, uids])
        self._bins = np.concatenate([self._bins, bins])
        self._n = np.concatenate([self._n, n])
        self._bin_weights = None
        self._time += time.perf_counter() - t0
        return StepPlan(positions=positions, uids=uids.copy(), bins=bins.copy(), rollout_n=n.copy())

    def _classify_and_allocate(
        self, prompt_uids: ArrayLike
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """(uids, bins, rollout_n) of one call: the classifier commits the bins, Rollout-GDRO
        allocates the call's exact budget. The pending plan is not touched."""
        uids = _int_array("prompt_uids", prompt_uids)
        if self.classifier is None:
            bins = np.zeros(uids.size, dtype=np.int64)
        else:
            bins = self.classifier.bins(uids)
        if isinstance(self.rollout, ReleaseAsRunAllocator):
            # the release as run: the previous step's classes, by position (verl_gdro/release_as_run.py)
            n = self.rollout.allocate(uids.size)
        elif self.rollout is not None and uids.size:
            counts = None
            if self.rollout.allocator == "per_prompt":
                assert self.classifier is not None
                decay = self.settings.rollout.rate_decay
                counts = (
                    self.classifier.window_counts(uids)
                    if decay is None
                    else self.classifier.decayed_counts(uids, decay)
                )
            n = np.asarray(self.rollout.allocate(bins, counts=counts), dtype=np.int64)
            budget = self.rollout_n * int(uids.size)
            if int(n.sum()) != budget:
                raise AssertionError(
                    f"Rollout-GDRO allocated {int(n.sum())} rollouts for {uids.size} prompts, not the exact "
                    f"budget {budget} = rollout.n * prompts"
                )
        else:
            n = np.full(uids.size, self.rollout_n, dtype=np.int64)
        return uids, bins, n

    def _group_index(self, group_index: ArrayLike) -> NDArray[np.int64]:
        g = _int_array("group_index", group_index)
        if g.size and (g.min() < 0 or g.max() >= self._uids.size):
            raise ValueError(
                f"group_index must hold plan positions in [0, {self._uids.size}) (prompts planned since the "
                f"last update), got values in [{g.min()}, {g.max()}]"
            )
        return g

    def planned_uids(self, group_index: ArrayLike) -> NDArray[np.int64]:
        """Stable ids of the planned prompts at these positions (a consistency check for callers)."""
        return self._uids[self._group_index(group_index)]

    def advantage_multipliers(self, group_index: ArrayLike) -> NDArray[np.float64]:
        """Eq. 16 multiplier of each trajectory (its prompt's bin weight from S_{t-1}).

        ``mean_one`` normalises over exactly these trajectories, so pass every non-padding
        trajectory of the step once. Exactly 1.0 everywhere when Prompt-GDRO does not reweight,
        so the estimator then reproduces verl's ``grpo`` bit for bit.
        """
        t0 = time.perf_counter()
        g = self._group_index(group_index)
        if self.prompt is None:
            self._time += time.perf_counter() - t0
            return np.ones(g.size)
        response_bins = self._bins[g]
        self._omega_used = self.prompt.omega()
        self._q_used = mix_probs(self._omega_used, self.prompt.gamma)  # = bin_probs(), one exp fewer
        if not self.reweights:
            self._time += time.perf_counter() - t0
            return np.ones(g.size)
        weights = self.prompt.bin_multipliers(response_bins)
        self._bin_weights = weights
        self._time += time.perf_counter() - t0
        return weights[response_bins]

    def after_advantage(
        self,
        group_index: ArrayLike,
        acc: ArrayLike,
        *,
        response_mask: ArrayLike | None = None,
        old_log_probs: ArrayLike | None = None,
        ref_log_probs: ArrayLike | None = None,
        advantages: ArrayLike | None = None,
        log_probs: ArrayLike | None = None,
        extra_time_s: float = 0.0,
    ) -> dict[str, float]:
        """Update every controller with the step's trajectories and return the ``gdro/`` metrics.

        Args:
            group_index: plan position of each (non-padding) trajectory's prompt.
            acc: binary correctness of each trajectory (the reward's ``acc``; values >= 0.5 count
                as correct), never the shaped score.
            response_mask, old_log_probs, ref_log_probs, advantages: [N, T] arrays, needed by the
                ``surrogate`` / ``surrogate_kl`` loss signals (``log_probs`` defaults to
                ``old_log_probs``: the driver evaluates the surrogate at the on-policy point).
            extra_time_s: controller-side time spent by the caller (e.g. reading fields), added
                to ``gdro/controller_time_s``.

        Prompts planned but without any trajectory are left out of every update. Clears the plan.
        """
        t0 = time.perf_counter()
        if not self.enabled:
            self._reset_pending()
            return {}
        g = self._group_index(group_index)
        correct = _acc_array(acc, g.size)
        num_groups = int(self._uids.size)
        trials = np.bincount(g, minlength=num_groups).astype(np.int64, copy=False)
        correct_sums = np.bincount(g, weights=correct, minlength=num_groups)
        successes = correct_sums.astype(np.int64)
        present = trials > 0
        # planned n >= 1, so an absent prompt (0 trials) is also trials != n: one count for both
        incomplete = int(np.count_nonzero(trials != self._n))

        deferred = self.wants_update_losses
        if deferred and self._awaiting is not None:
            logger.warning(
                "verl-gdro: step %d's update-time losses never reached GDROController.after_update; Prompt-GDRO "
                "skips that step's update", self.num_steps - 1,
            )
            self._awaiting = None
        losses = self._losses(g, correct, num_groups, response_mask, old_log_probs, ref_log_probs, advantages,
                              log_probs, correct_sums, trials)
        if incomplete == 0:  # every planned prompt is present (the usual step): no selection to copy
            bins_p, trials_p, succ_p, loss_p = self._bins, trials, successes, losses
        else:
            bins_p, trials_p, succ_p = self._bins[present], trials[present], successes[present]
            loss_p = losses[present]

        # All or nothing: the adversaries update first from snapshots of their (small, O(B x arms))
        # states, and the classifier, whose observe() validates before it mutates, goes last. Any
        # refusal restores the adversaries, so a failed step never leaves the controllers out of
        # step with one another. The order changes no decision: every update reads this step's
        # plan (bins fixed before generation), not the classifier's new estimates.
        snapshots = [(c, c.snapshot()) for c in (self.prompt, self.rollout) if c is not None]
        try:
            prompt_info: dict[str, Any] = {}
            q_used = self._q_used
            omega_used = self._omega_used
            if self.prompt is not None:
                if q_used is None:
                    q_used, omega_used = self.prompt.bin_probs(), self.prompt.omega()
                if not deferred:
                    prompt_info = self.prompt.update(bins_p, loss_p)

            skip_reason: str | None = None
            rollout_info: dict[str, Any] = {}
            defer_rollout = False
            if isinstance(self.rollout, ReleaseAsRunAllocator):
                # the release classifies after generation, before the step's pass@k update: the
                # window as it is now (the classifier observes last), excl for a rate of 0 or 1
                uids_now = self._uids if incomplete == 0 else self._uids[present]
                assert self.classifier is not None
                self.rollout.observe(release_classes(bins_p, self.classifier.pass_at_k(uids_now), self.num_bins))
            elif self.rollout is not None:
                refusal = self.rollout.update_refusal(bins_p, self._n[present]) if bins_p.size else None
                defer_rollout = deferred and self._rollout_needs_loss
                if incomplete == 0 and bins_p.size and refusal is None and defer_rollout:
                    pass  # the bandit learns from the update-time loss in after_update
                elif incomplete == 0 and bins_p.size and refusal is None:
                    rollout_info = self.rollout.update(bins_p, self._n[present], succ_p, None if deferred else loss_p)
                elif refusal is not None:
                    skip_reason = refusal
                    logger.warning(
                        "verl-gdro: Rollout-GDRO skips this step's update (%s): %s", refusal,
                        "the step's prompts were planned in several calls that gave one bin different n, and the "
                        f"played-arm utility ({self.rollout.arm_utility}) needs one arm per bin"
                        if refusal == "mixed_arms" else
                        "no bin's arm comes from exactly one recorded draw, so no importance weight is known",
                    )
                else:
                    skip_reason = "incomplete"
                    logger.warning(
                        "verl-gdro: %d planned prompt(s) lack trajectories (generation failures); Rollout-GDRO "
                        "skips this step's update rather than learn from a partial budget",
                        incomplete,
                    )

            # classifier: one visit per distinct stable uid (a prompt drawn twice pools its groups),
            # in ascending uid order; distinct uids (the usual step) need no pooling, only the order
            uids_p = self._uids if incomplete == 0 else self._uids[present]
            order = np.argsort(uids_p)
            uniq = uids_p[order]
            if uniq.size < 2 or bool((uniq[1:] != uniq[:-1]).all()):
                visit_s, visit_t = succ_p[order], trials_p[order]
            else:
                uniq, inverse = np.unique(uids_p, return_inverse=True)
                visit_s = np.bincount(inverse, weights=succ_p, minlength=uniq.size).astype(np.int64)
                visit_t = np.bincount(inverse, weights=trials_p, minlength=uniq.size).astype(np.int64)
            assert self.classifier is not None
            if uniq.size:
                # distinct (checked above or pooled by np.unique), int64, trials in [1, 255] (present
                # prompts, capped by _fit_visit), successes in [0, trials] (bincounts of 0/1 acc)
                self.classifier.observe_prepared(uniq, *_fit_visit(visit_s, visit_t))
                if self.evidence is not None:
                    self.evidence.observe(uniq, visit_s, visit_t)
        except BaseException:
            for controller, state in snapshots:
                controller.restore(state)
            raise

        if deferred:
            self._awaiting = {
                "num_groups": num_groups,
                "present": present.copy(),
                "bins": bins_p.copy(),
                "n": self._n[present].copy(),
                "successes": succ_p.copy(),
                "rollout": bool(defer_rollout and incomplete == 0 and bins_p.size and skip_reason is None),
            }
        self.num_steps += 1
        self.version += 1
        elapsed = self._time + (time.perf_counter() - t0) + float(extra_time_s)
        # Prompt-GDRO's update already took this very mean (Eq. 13 over the finite losses)
        bin_losses = prompt_info["mean_losses"] if prompt_info else _bin_mean(bins_p, loss_p, self.num_bins)
        # every input built here in shape (bins validated at plan / adopt, counts from bincount,
        # controller state finite by its own checks): the metrics skip re-validating them
        metrics = step_metrics_prepared(
            self.num_bins,
            bins_p,
            succ_p.astype(np.float64),
            trials_p.astype(np.float64),
            n_mean=float(self.rollout_n),
            per_bin=(
                self._bin_weights if self.reweights else None,
                q_used,
                None if self.prompt is None else self.prompt.scores,
                omega_used,
                bin_losses,
            ),
            shadow_price=0.0 if self.rollout is None else float(self.rollout.mu),
            controller_time_s=elapsed,
            dropped_nonfinite=int(prompt_info.get("dropped_nonfinite", 0)),
            dropped_nonfinite_total=0 if self.prompt is None else int(self.prompt.dropped_nonfinite),
        )
        if isinstance(self.rollout, ReleaseAsRunAllocator):
            # the arm each class got this step (class num_bins = excl); absent when n = rollout.n for all
            for c, arm in self.rollout.last_class_arms.items():
                metrics[f"{PREFIX}release_arm/{'excl' if c == self.num_bins else f'bin_{c}'}"] = float(arm)
        metrics[PREFIX + "incomplete_groups"] = float(incomplete)
        metrics[PREFIX + "rollout_update_skipped"] = float(skip_reason is not None)
        if self.rollout is not None:
            for reason in ROLLOUT_SKIP_REASONS:
                metrics[f"{PREFIX}rollout_skip/{reason}"] = float(skip_reason == reason)
            metrics[PREFIX + "rollout_unweighted_bins"] = float(rollout_info.get("unweighted_bins", 0))
        metrics[PREFIX + "num_trajectories"] = float(g.size)
        self._reset_pending()
        return metrics

    def after_update(self, group_index: ArrayLike, losses: ArrayLike) -> dict[str, float]:
        """Feed the update-time loss of the step :meth:`after_advantage` last observed (``update_surrogate``).

        Args:
            group_index: plan position of each measured response's prompt in that step (the
                ``group_index`` :meth:`after_advantage` received; any subset, any order, repeats
                allowed: a response measured on several mini-batch passes is averaged).
            losses: each response's loss, measured during the actor's PPO update (the token-mean of
                the clipped surrogate on the raw advantages, :func:`verl_gdro.prompt_gdro.
                clipped_surrogate_response_loss` without the dual clip, on every mini-batch).

        Each prompt's loss is the mean over its measured responses (non-finite ones dropped);
        prompts with no measured response (groups removed untrained) are left out of the update;
        Prompt-GDRO's scores (and a bandit fed the loss) update from them, so the next step's
        multipliers use them: the release's order. Returns the ``gdro/`` metrics the update
        changes: per-bin ``loss`` (the bins measured) and ``score`` (S after the update), which
        replace the placeholders :meth:`after_advantage` logged, and ``update_loss_responses``.
        Refused (ValueError, nothing changed) without an observed step waiting, or with malformed
        input.
        """
        if not self.wants_update_losses:
            raise ValueError(
                f"after_update needs gdro.prompt.loss_signal in {list(UPDATE_TIME_SIGNALS)} (got "
                f"{self.settings.prompt.loss_signal!r}) with Prompt-GDRO or a loss-fed bandit on"
            )
        waiting = self._awaiting
        if waiting is None:
            raise ValueError("after_update: no observed step is waiting for its update-time losses (call after_advantage first)")
        g = _int_array("group_index", group_index)
        num_groups = int(waiting["num_groups"])
        if g.size and (g.min() < 0 or g.max() >= num_groups):
            raise ValueError(f"group_index must hold plan positions in [0, {num_groups}), got [{g.min()}, {g.max()}]")
        loss = np.asarray(losses, dtype=np.float64)
        if loss.ndim != 1 or loss.size != g.size:
            raise ValueError(f"losses must be 1-D with one value per group_index entry ({g.size}), got shape {loss.shape}")
        finite = np.isfinite(loss)
        sums = np.bincount(g[finite], weights=loss[finite], minlength=num_groups)
        counts = np.bincount(g[finite], minlength=num_groups)
        present = waiting["present"]
        # the prompts the update measured (a group removed untrained, e.g. DAPO-filtered, reached
        # no actor: it is left out of this update, not counted as a non-finite loss)
        measured = (counts > 0)[present]
        per_prompt = (sums[present] / np.maximum(counts[present], 1))[measured]
        bins = waiting["bins"][measured]
        snapshots = [(c, c.snapshot()) for c in (self.prompt, self.rollout) if c is not None]
        try:
            info: dict[str, Any] = {}
            if self.prompt is not None and bins.size:
                info = self.prompt.update(bins, per_prompt)
            refusal: str | None = None
            if waiting["rollout"] and isinstance(self.rollout, RolloutGDRO) and bins.size:
                # the measured subset: its bins' draws must still be known (section 3, `selection`)
                refusal = self.rollout.update_refusal(bins, waiting["n"][measured])
                if refusal is None:
                    self.rollout.update(bins, waiting["n"][measured], waiting["successes"][measured], per_prompt)
        except BaseException:
            for controller, state in snapshots:
                controller.restore(state)
            raise
        self._awaiting = None
        in_step = np.bincount(bins, minlength=self.num_bins) > 0
        mean = info["mean_losses"] if info else _bin_mean(bins, per_prompt, self.num_bins)
        out: dict[str, float] = {PREFIX + "update_loss_responses": float(np.count_nonzero(finite))}
        if refusal is not None:
            out[PREFIX + "rollout_update_skipped"] = 1.0
            out[f"{PREFIX}rollout_skip/{refusal}"] = 1.0
        for b in range(self.num_bins):
            if in_step[b]:
                out[f"{PREFIX}loss/bin_{b}"] = float(mean[b])
            if self.prompt is not None:
                out[f"{PREFIX}score/bin_{b}"] = float(self.prompt.scores[b])
        return out

    def _losses(
        self,
        g: NDArray[np.int64],
        correct: NDArray[np.float64],
        num_groups: int,
        response_mask: ArrayLike | None,
        old_log_probs: ArrayLike | None,
        ref_log_probs: ArrayLike | None,
        advantages: ArrayLike | None,
        log_probs: ArrayLike | None,
        correct_sums: NDArray[np.float64],
        trials: NDArray[np.int64],
    ) -> NDArray[np.float64]:
        """Per-prompt loss signal l(x) of docs/algorithm.md section 2 (NaN for prompts without trajectories).

        ``correct_sums`` / ``trials``: the per-prompt bincounts after_advantage already made; the
        failure rate takes its group means from them instead of counting the trajectories again.
        """
        p = self.settings.prompt
        signal = p.loss_signal
        if signal == "failure_rate" or (self.prompt is None and self.rollout is None):
            return failure_rate_loss(group_mean_from_sums(correct_sums, trials))
        if signal in UPDATE_TIME_SIGNALS or isinstance(self.rollout, ReleaseAsRunAllocator) and self.prompt is None:
            # measured during the actor's update (after_update); the frozen release arms read no loss
            return np.full(num_groups, np.nan)
        missing = [
            name
            for name, arr in (("response_mask", response_mask), ("old_log_probs", old_log_probs),
                              ("advantages", advantages))
            if arr is None
        ]
        if signal == "surrogate_kl" and ref_log_probs is None:
            missing.append("ref_log_probs")
        if missing:
            raise ValueError(
                f"gdro.prompt.loss_signal={signal} needs {missing} per trajectory (the reference policy's "
                "log-probs come from actor_rollout_ref.actor.use_kl_loss=true)"
            )
        current = old_log_probs if log_probs is None else log_probs
        common = {"clip_ratio_low": p.clip_ratio_low, "clip_ratio_high": p.clip_ratio_high,
                  "clip_ratio_c": p.clip_ratio_c}
        if signal == "surrogate":
            losses = surrogate_loss(current, old_log_probs, advantages, response_mask, g, num_groups, **common)
        else:
            losses = surrogate_kl_loss(
                current, old_log_probs, ref_log_probs, advantages, response_mask, g, num_groups, kl_coef=p.kl_coef,
                **common,
            )
        # A prompt none of whose responses has a measured token (a group removed before the
        # log-prob stage, handed over zero-masked) carries no loss: NaN, dropped and counted like a
        # prompt without trajectories (section 2), never a loss of exactly 0.
        mask = np.asarray(response_mask)
        # a real response's mask starts with a generated token, so only rows whose first entry is
        # 0 need the whole-row look (O(N) instead of another pass over [N, T])
        first_off = np.flatnonzero(mask[:, 0] == 0) if mask.ndim == 2 and mask.shape[1] else np.zeros(0, np.int64)
        if first_off.size:
            unmeasured = first_off[~mask[first_off].any(axis=1)]
            if unmeasured.size:
                measured = np.ones(mask.shape[0], dtype=bool)
                measured[unmeasured] = False
                has = np.bincount(g, weights=measured, minlength=num_groups) > 0
                losses = np.where(has, losses, np.nan)
        return losses

    # ------------------------------------------------------------------------------------------
    # staged decisions (DAPO refills, async trainers): decide at dispatch, adopt at observation
    # ------------------------------------------------------------------------------------------

    def decide(self, prompt_uids: ArrayLike) -> StepPlan:
        """Classify and allocate like :meth:`before_generation`, without touching the pending plan.

        For trainers whose prompts are observed later than they are dispatched: verl's async
        trainers consume a prompt's trajectories steps after its dispatch, and DAPO filtering drops
        groups before the advantage stage. The caller keeps the returned decisions (same exact
        budget per call as :meth:`before_generation`) and hands the observed ones back with
        :meth:`adopt`. ``positions`` are -1 (no plan position yet).
        """
        t0 = time.perf_counter()
        uids, bins, n = self._classify_and_allocate(prompt_uids)
        self._time += time.perf_counter() - t0
        none = np.full(uids.size, -1, dtype=np.int64)
        return StepPlan(positions=none, uids=uids.copy(), bins=bins.copy(), rollout_n=n.copy())

    def adopt(self, prompt_uids: ArrayLike, bins: ArrayLike, rollout_n: ArrayLike) -> NDArray[np.int64]:
        """Add prompts decided earlier by :meth:`decide` to the pending plan; return their positions.

        Their bins and rollout counts stay the dispatch-time decisions (the classifier may have
        moved since), so the update sees what generation actually used.
        """
        uids = _int_array("prompt_uids", prompt_uids)
        b = _int_array("bins", bins)
        n = _int_array("rollout_n", rollout_n)
        if b.size != uids.size or n.size != uids.size:
            raise ValueError(f"adopt needs one bin and one rollout_n per prompt ({uids.size}), got {b.size}, {n.size}")
        if b.size and (b.min() < 0 or b.max() >= self.num_bins):
            raise ValueError(f"bins must lie in [0, {self.num_bins}), got values in [{b.min()}, {b.max()}]")
        if n.size and n.min() < 1:
            raise ValueError(f"rollout_n must be >= 1, got {n.min()}")
        start = self._uids.size
        self._uids = np.concatenate([self._uids, uids])
        self._bins = np.concatenate([self._bins, b])
        self._n = np.concatenate([self._n, n])
        self._bin_weights = None
        return np.arange(start, start + uids.size, dtype=np.int64)

    # ------------------------------------------------------------------------------------------
    # sampler support
    # ------------------------------------------------------------------------------------------

    def bins_of(self, uids: ArrayLike) -> NDArray[np.int64]:
        """Current bins of ``uids`` (committing, like :meth:`before_generation`; idempotent without a
        new visit, so the sampler may call it for the whole dataset)."""
        u = _int_array("uids", uids)
        if self.classifier is None:
            return np.zeros(u.size, dtype=np.int64)
        return self.classifier.bins(u)

    def attach_prompts(self, uids: ArrayLike) -> PromptEvidence:
        """Register the training set (stable id per row) whose per-prompt evidence the sampling
        modes read; every later update feeds it. Idempotent for the same set; another set replaces
        it (a fresh run's sampler). Returns the evidence store."""
        u = _int_array("uids", uids)
        if self.evidence is None or not np.array_equal(self.evidence.uids, u):
            self.evidence = PromptEvidence(u, decay=self.settings.prompt.rate_decay)
        return self.evidence

    def bin_probs(self) -> NDArray[np.float64]:
        """Prompt-GDRO's q_t (uniform when Prompt-GDRO is off)."""
        if self.prompt is None:
            return np.full(self.num_bins, 1.0 / self.num_bins)
        return self.prompt.bin_probs()

    # ------------------------------------------------------------------------------------------
    # checkpointing
    # ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """All controller state (plain numpy/python values). A plan in progress is not saved:
        verl checkpoints after the step's update, when no plan is pending."""
        return {
            "version": _STATE_VERSION,
            "settings": self.settings.to_dict(),
            "rollout_n": self.rollout_n,
            "num_steps": self.num_steps,
            "controller_version": self.version,
            "classifier": None if self.classifier is None else self.classifier.state_dict(),
            "prompt": None if self.prompt is None else self.prompt.state_dict(),
            "rollout": None if self.rollout is None else self.rollout.state_dict(),
            "evidence": None if self.evidence is None else self.evidence.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; refuses state saved under different settings or budget."""
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a GDROController state of version {_STATE_VERSION}")
        saved = state.get("settings")
        if isinstance(saved, Mapping) and "advantage_clip" not in saved:
            # Saved before gdro.advantage_clip existed (verl-gdro 0.1.0 pre-release), which meant no clip.
            saved = {**saved, "advantage_clip": None}
        if isinstance(saved, Mapping) and isinstance(saved.get("prompt"), Mapping):
            # Saved before the sampling modes' keys existed: they only act in a sampling mode, which
            # such a run could not use, so the current values describe it.
            new_keys = {k: v for k, v in self.settings.to_dict()["prompt"].items() if k in _SAMPLING_KEYS}
            saved = {**saved, "prompt": {**new_keys, **saved["prompt"]}}
        if isinstance(saved, Mapping) and isinstance(saved.get("prompt"), Mapping) and "mix_support" not in saved["prompt"]:
            # saved before gdro.prompt.mix_support existed, which meant Eq. 15 over all bins
            saved = {**saved, "prompt": {**saved["prompt"], "mix_support": "all"}}
        mine = self.settings.to_dict()
        if saved != mine:
            diff = _dict_diff(saved or {}, mine)
            raise ValueError(
                f"GDROController state was saved under different gdro settings ({diff}); resume with the "
                "same gdro.* config"
            )
        if int(state["rollout_n"]) != self.rollout_n:
            raise ValueError(
                f"GDROController state was saved with actor_rollout_ref.rollout.n={state['rollout_n']}, "
                f"this run has {self.rollout_n}"
            )
        for name in ("classifier", "prompt", "rollout"):
            obj = getattr(self, name)
            if (obj is None) != (state.get(name) is None):
                raise ValueError(f"GDROController state: {name} presence differs from this configuration")
        if self.classifier is not None:
            self.classifier.load_state_dict(state["classifier"])
        if self.prompt is not None:
            self.prompt.load_state_dict(dict(state["prompt"]))
        if self.rollout is not None:
            self.rollout.load_state_dict(dict(state["rollout"]))
        evidence = state.get("evidence")
        if evidence is not None:
            if self.evidence is None:
                self.evidence = PromptEvidence(evidence["uids"], decay=self.settings.prompt.rate_decay)
            self.evidence.load_state_dict(dict(evidence))
        self.num_steps = int(state["num_steps"])
        self.version = int(state["controller_version"])
        self.restores += 1
        self._reset_pending()


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def mode_name(settings: GDROSettings) -> str:
    """Which adversaries run: ``GRPO``, ``Prompt-GDRO``, ``Rollout-GDRO`` or ``joint``."""
    prompt = settings.enable and settings.prompt.enable
    rollout = settings.enable and settings.rollout.enable
    if prompt and rollout:
        return "joint"
    return "Prompt-GDRO" if prompt else "Rollout-GDRO" if rollout else "GRPO"


def describe_mode(settings: GDROSettings, rollout_n: int | None = None) -> str:
    """One line naming the run's mode, preset and key settings, for the log at start.

    Both adversaries are on by default (joint mode, the measured best), so a user who sets only one
    switch still runs the other; the GDRO trainer (and the demo) print this line so the choice of
    adversaries is visible before the first step, and it says how to get the other modes.
    """
    mode = mode_name(settings)
    if not settings.enable:
        return "verl-gdro mode: GRPO (gdro.enable=false: no classifier, no adversaries, no gdro/ metrics)"
    c, p, r = settings.classifier, settings.prompt, settings.rollout
    parts = [f"verl-gdro mode: {mode}"]
    if mode == "joint":
        parts[0] += (
            " (Prompt-GDRO + Rollout-GDRO, the default: gdro.prompt.enable=false for Rollout-GDRO alone, "
            "gdro.rollout.enable=false for Prompt-GDRO alone)"
        )
    elif mode == "GRPO":
        parts[0] += " (both adversaries off: classifier and gdro/ metrics only)"
    parts.append(f"preset {settings.preset}")
    if p.enable and p.mode in ("reweight", "resample"):
        parts.append(f"prompt: {p.mode}, loss {p.loss_signal}, eta {p.eta:g}, max_weight {p.max_weight:g}")
    elif p.enable:  # a per-prompt sampling mode: its own knobs
        knob = f"revisit {p.revisit:g}" if p.mode == "greso" else f"decay {p.rate_decay:g}"
        if p.mode == "band":
            knob += f", width {p.band_width:g}"
        parts.append(f"prompt: {p.mode} sampling ({knob}, explore {p.explore:g})")
    if r.enable:
        budget = "" if rollout_n is None else f", mean n {int(rollout_n)}"
        if r.allocator == "release_as_run":
            parts.append(f"rollout: release_as_run (frozen uniform arms, lexicographic tie-break), n {r.n_min}..{r.n_max}{budget}")
        elif r.allocator == "per_prompt":
            evidence = "window" if r.rate_decay is None else f"decay {r.rate_decay:g}"
            parts.append(f"rollout: per_prompt/{r.arm_utility} ({evidence}), n {r.n_min}..{r.n_max}{budget}")
        else:
            parts.append(f"rollout: {r.allocator}/{r.arm_utility}/{r.selection}, n {r.n_min}..{r.n_max}{budget}")
    elif rollout_n is not None:
        parts.append(f"n {int(rollout_n)} per prompt")
    parts.append(f"classifier: {c.num_bins} bins, window {c.window}, pass@{c.k}")
    if settings.advantage_clip is not None:
        parts.append(f"advantage_clip {settings.advantage_clip:g}")
    return " | ".join(parts)


def _int_array(name: str, values: ArrayLike) -> NDArray[np.int64]:
    if type(values) is np.ndarray and values.dtype == np.int64 and values.ndim == 1:
        return values  # what the trainer path passes every step: nothing to check or convert
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D integer array, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or _integral(arr)):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)  # callers keep copies (concatenate) or only read


def _integral(arr: np.ndarray) -> bool:
    if arr.dtype == object:
        try:
            as_float = arr.astype(np.float64)
        except (TypeError, ValueError):
            return False
    elif np.issubdtype(arr.dtype, np.floating):
        as_float = arr
    else:
        return False
    return bool(np.all(np.isfinite(as_float)) and np.all(as_float == np.round(as_float)))


def _acc_array(acc: ArrayLike, size: int) -> NDArray[np.float64]:
    """Binary correctness per trajectory: >= 0.5 counts as correct (bools, 0/1, 0.0/1.0 all work)."""
    a = np.asarray(acc, dtype=np.float64)
    if a.ndim != 1 or a.size != size:
        raise ValueError(f"acc must be 1-D with one value per trajectory ({size}), got shape {a.shape}")
    if a.size and a.min() >= 0.0 and a.max() <= 1.0:  # the usual case in two reductions (a NaN fails min)
        return (a >= 0.5).astype(np.float64)
    if a.size and not np.all(np.isfinite(a)):
        raise ValueError("acc must be finite for every trajectory (the reward's correctness, 0 or 1)")
    if a.size and (a.min() < 0.0 or a.max() > 1.0):
        # a shaped score (e.g. -1 / +1) under the acc key is a configuration error, not correctness
        raise ValueError(
            f"acc must be the binary correctness in [0, 1] (the reward's acc, never the shaped score), "
            f"got values in [{a.min()}, {a.max()}]"
        )
    return (a >= 0.5).astype(np.float64)


def _fit_visit(successes: NDArray[np.int64], trials: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Scale a pooled visit down to the classifier's per-visit cap, keeping its success rate.

    Only reachable when a resampling sampler draws one prompt many times in a step (e.g. 22 draws
    x 12 rollouts > 255 trials); the window then records the rate, not every trial.
    """
    over = trials > MAX_TRIALS_PER_VISIT
    if not over.any():
        return successes, trials
    s, t = successes.copy(), trials.copy()
    s[over] = np.rint(s[over] * MAX_TRIALS_PER_VISIT / t[over]).astype(np.int64)
    t[over] = MAX_TRIALS_PER_VISIT
    return s, t


def _bin_mean(bins: NDArray[np.int64], values: NDArray[np.float64], num_bins: int) -> NDArray[np.float64]:
    """Eq. 13's bin means over the finite values (what Prompt-GDRO's update logs), 0 for an empty bin."""
    finite = np.isfinite(values)
    return bin_mean_losses(bins[finite], values[finite], num_bins)[0]


def _dict_diff(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "gdro") -> str:
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            sub = _dict_diff(va, vb, f"{prefix}.{key}")
            if sub:
                out.append(sub)
        elif va != vb:
            out.append(f"{prefix}.{key}: saved {va!r} vs configured {vb!r}")
    return ", ".join(out)
