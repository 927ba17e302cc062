"""The pieces of one observed step that :class:`~verl_gdro.step.controller.GDROController` composes
(``after_advantage``: count, measure, update all or nothing, metrics; ``after_update``): plain arrays."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from verl_gdro.allocators.protocol import Observation
from verl_gdro.classifier import MAX_TRIALS_PER_VISIT
from verl_gdro.classifier import int_array as checked_int_array
from verl_gdro.metrics import PREFIX, step_metrics_prepared
from verl_gdro.prompt_gdro import bin_mean_losses

#: Why Rollout-GDRO skips an update (``gdro/rollout_skip/<reason>``): ``incomplete`` trajectories,
#: ``mixed_arms`` (one bin with several n), ``unknown_draw`` (``selection=sample``: no bin's arm from one draw).
ROLLOUT_SKIP_REASONS: tuple[str, ...] = ("incomplete", "mixed_arms", "unknown_draw")


@dataclass(frozen=True)
class StepOutcome:
    """Per planned prompt: trajectories, correct ones; which are present; how many are incomplete."""

    num_groups: int
    trials: NDArray[np.int64]
    correct_sums: NDArray[np.float64]
    successes: NDArray[np.int64]
    present: NDArray[np.bool_]
    incomplete: int

    def keep(self, values: NDArray[Any]) -> NDArray[Any]:
        """``values`` (one per planned prompt) of the present prompts: no copy in the usual step."""
        return values if self.incomplete == 0 else values[self.present]


def count_outcomes(g: NDArray[np.int64], correct: NDArray[np.float64], planned_n: NDArray[np.int64]) -> StepOutcome:
    """Bincount the step's trajectories per plan position."""
    num_groups = int(planned_n.size)
    trials = np.bincount(g, minlength=num_groups).astype(np.int64, copy=False)
    correct_sums = np.bincount(g, weights=correct, minlength=num_groups)
    # planned n >= 1, so an absent prompt (0 trials) is also trials != n: one count for both
    incomplete = int(np.count_nonzero(trials != planned_n))
    return StepOutcome(num_groups, trials, correct_sums, correct_sums.astype(np.int64), trials > 0, incomplete)


def update_all_or_nothing(adversaries: list[Any], update: Callable[[], Any]) -> Any:
    """Run ``update`` with the adversaries' small states snapshotted; any refusal restores them. The
    classifier, which validates before it mutates, goes last: a failed step leaves them in step."""
    snapshots = [(c, c.snapshot()) for c in adversaries if c is not None]
    try:
        return update()
    except BaseException:
        for controller, state in snapshots:
            controller.restore(state)
        raise


def visit_classifier(classifier: Any, evidence: Any, uids_p: NDArray[np.int64], succ_p: NDArray[np.int64],
                     trials_p: NDArray[np.int64]) -> None:
    """One classifier visit per distinct stable uid (repeats pooled), in ascending uid order."""
    order = np.argsort(uids_p)
    uniq = uids_p[order]
    if uniq.size < 2 or bool((uniq[1:] != uniq[:-1]).all()):
        visit_s, visit_t = succ_p[order], trials_p[order]
    else:
        uniq, inverse = np.unique(uids_p, return_inverse=True)
        visit_s = np.bincount(inverse, weights=succ_p, minlength=uniq.size).astype(np.int64)
        visit_t = np.bincount(inverse, weights=trials_p, minlength=uniq.size).astype(np.int64)
    if uniq.size:
        # distinct, int64, trials in [1, 255] (present, capped by _fit_visit), successes in [0, trials]
        classifier.observe_prepared(uniq, *_fit_visit(visit_s, visit_t))
        if evidence is not None:
            evidence.observe(uniq, visit_s, visit_t)


def observation_metrics(ctrl: Any, out: StepOutcome, losses: NDArray[np.float64], prompt_info: dict[str, Any],
                        q_used: Any, omega_used: Any, elapsed: float) -> dict[str, float]:
    """docs/algorithm.md section 4's metrics of an observed step, and the allocator's own."""
    bins_p = out.keep(ctrl._bins)
    # Prompt-GDRO's update already took this very mean (Eq. 13 over the finite losses)
    bin_losses = prompt_info["mean_losses"] if prompt_info else bin_mean(bins_p, losses, ctrl.num_bins)
    prompt, rollout = ctrl.prompt, ctrl.rollout
    # every input built here in shape (bins validated at plan / adopt, state finite): no re-validation
    metrics = step_metrics_prepared(
        ctrl.num_bins, bins_p, out.keep(out.successes).astype(np.float64), out.keep(out.trials).astype(np.float64),
        n_mean=float(ctrl.rollout_n),
        per_bin=(ctrl._bin_weights if ctrl.reweights else None, q_used,
                 None if prompt is None else prompt.scores, omega_used, bin_losses),
        shadow_price=0.0 if rollout is None else float(rollout.mu), controller_time_s=elapsed,
        dropped_nonfinite=int(prompt_info.get("dropped_nonfinite", 0)),
        dropped_nonfinite_total=0 if prompt is None else int(prompt.dropped_nonfinite),
    )
    if rollout is not None:
        metrics.update(rollout.metrics(ctrl.num_bins))
    return metrics


def rollout_metrics(obs: Observation | None, incomplete: int, num_trajectories: int) -> dict[str, float]:
    """The integration counters (``EXTRA_METRICS``) and, with Rollout-GDRO on, its skip reasons."""
    skip = None if obs is None else obs.skip
    out = {PREFIX + "incomplete_groups": float(incomplete), PREFIX + "rollout_update_skipped": float(skip is not None)}
    if obs is not None:
        for reason in ROLLOUT_SKIP_REASONS:
            out[f"{PREFIX}rollout_skip/{reason}"] = float(skip == reason)
        out[PREFIX + "rollout_unweighted_bins"] = float(obs.info.get("unweighted_bins", 0))
    out[PREFIX + "num_trajectories"] = float(num_trajectories)
    return out


def update_time_metrics(num_bins: int, bins: NDArray[np.int64], mean: NDArray[np.float64], scores: Any,
                        refusal: str | None, finite: int) -> dict[str, float]:
    """What ``after_update`` logs: per-bin ``loss`` and ``score`` replacing the placeholders, responses measured."""
    in_step = np.bincount(bins, minlength=num_bins) > 0
    out: dict[str, float] = {PREFIX + "update_loss_responses": float(finite)}
    if refusal is not None:
        out[PREFIX + "rollout_update_skipped"] = 1.0
        out[f"{PREFIX}rollout_skip/{refusal}"] = 1.0
    for b in range(num_bins):
        if in_step[b]:
            out[f"{PREFIX}loss/bin_{b}"] = float(mean[b])
        if scores is not None:
            out[f"{PREFIX}score/bin_{b}"] = float(scores[b])
    return out


def update_time_losses(waiting: Mapping[str, Any], group_index: ArrayLike, losses: ArrayLike
                       ) -> tuple[NDArray[np.bool_], NDArray[np.float64], int]:
    """(measured present prompts, their mean update-time loss, finite losses) of a waiting step: passes
    averaged, non-finite losses dropped, groups removed untrained (no actor saw them) left out."""
    g = int_array("group_index", group_index)
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
    measured = (counts > 0)[present]
    per_prompt = (sums[present] / np.maximum(counts[present], 1))[measured]
    return measured, per_prompt, int(np.count_nonzero(finite))


def int_array(name: str, values: ArrayLike) -> NDArray[np.int64]:
    """A 1-D int64 array of ``values`` (integral floats accepted), or a ValueError naming ``name``."""
    return checked_int_array(name, values, integral_floats=True)


def acc_array(acc: ArrayLike, size: int) -> NDArray[np.float64]:
    """Binary correctness per trajectory: >= 0.5 counts as correct (bools, 0/1, 0.0/1.0 all work)."""
    a = np.asarray(acc, dtype=np.float64)
    if a.ndim != 1 or a.size != size:
        raise ValueError(f"acc must be 1-D with one value per trajectory ({size}), got shape {a.shape}")
    if a.size and not (a.min() >= 0.0 and a.max() <= 1.0):  # the usual case passes in two reductions (NaN fails)
        if not np.all(np.isfinite(a)):
            raise ValueError("acc must be finite for every trajectory (the reward's correctness, 0 or 1)")
        # a shaped score (e.g. -1 / +1) under the acc key is a configuration error, not correctness
        raise ValueError(f"acc must be the binary correctness in [0, 1] (the reward's acc, never the shaped score), "
            f"got values in [{a.min()}, {a.max()}]")
    return (a >= 0.5).astype(np.float64)


def _fit_visit(successes: NDArray[np.int64], trials: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Scale a pooled visit down to the classifier's per-visit cap (255 trials), keeping its success rate."""
    over = trials > MAX_TRIALS_PER_VISIT
    if not over.any():
        return successes, trials
    s, t = successes.copy(), trials.copy()
    s[over] = np.rint(s[over] * MAX_TRIALS_PER_VISIT / t[over]).astype(np.int64)
    t[over] = MAX_TRIALS_PER_VISIT
    return s, t


def bin_mean(bins: NDArray[np.int64], values: NDArray[np.float64], num_bins: int) -> NDArray[np.float64]:
    """Eq. 13's bin means over the finite values (what Prompt-GDRO's update logs), 0 for an empty bin."""
    finite = np.isfinite(values)
    return bin_mean_losses(bins[finite], values[finite], num_bins)[0]
