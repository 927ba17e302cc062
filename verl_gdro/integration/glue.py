"""The GDRO trainer's per-step numpy glue between verl's fetched batch and the controller.

Everything here is pure Python and numpy (no verl, no torch), and it is all of the per-row work
the GDRO trainer adds to verl's advantage stage besides the controller itself:

- :func:`real_rows`: which fetched rows are real trajectories (not verl's padding);
- :func:`acc_from_extra_fields`: the per-trajectory correctness in the reward's extra info;
- :func:`consume`: the consumed groups plus the groups removed since the last update, re-adopted
  into one controller plan with their dispatch-time decisions (:class:`ConsumedBatch`);
- :func:`flow_metrics`: generated versus trained rollouts, per bin, next to GDRO's reallocation.

``benchmarks/overhead.py`` times the trainer's step through these same functions, so the benchmark
measures what the trainer runs, not a copy of it. Each one works in C-level passes (``map``,
``dict`` builds, numpy) rather than a Python loop per row: this runs on every step over every row
(1,024-2,048 at the paper's shapes), and such loops were most of GDRO's fixed per-step cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from verl_gdro.integration.ledger import DROP_REASONS, DispatchLedger, ObservedUpdate
from verl_gdro.metrics import PREFIX
from verl_gdro.step.context import PADDING_UID_PREFIX, RowPlan

if TYPE_CHECKING:
    from verl_gdro.step.controller import GDROController

__all__ = [
    "ConsumedBatch",
    "acc_from_extra_fields",
    "consume",
    "correctness",
    "first_measurements",
    "flow_metrics",
    "later_outputs",
    "observe_update",
    "real_rows",
]


def _is_padding_tag(tag: Mapping[str, Any] | None) -> bool:
    return bool(tag) and bool(tag.get("is_padding", False))  # type: ignore[union-attr]


def real_rows(
    uids: Sequence[str], tags: Sequence[Mapping[str, Any] | None] | None = None,
    distinct: Mapping[str, Any] | None = None,
) -> NDArray[np.int64]:
    """Indices of the rows that are real trajectories: neither tagged ``is_padding`` by verl's
    batch balancing (``tags``: one dict or None per row) nor carrying one of its padding uids.

    The usual batch has no padding at all: that is settled on the distinct uids (one per prompt
    group; ``distinct``, e.g. ``dict.fromkeys(uids)``, when the caller already has them) and one
    C-level ``any`` over the tags, without a pass per row.
    """
    count = len(uids)
    tagged = False
    if tags is not None:
        if len(tags) != count:
            raise ValueError(f"tags must hold one entry per row ({count}), got {len(tags)}")
        tagged = any(tags) and any(map(_is_padding_tag, tags))
    groups = dict.fromkeys(uids) if distinct is None else distinct
    if not tagged and not any(map(str.startswith, groups, repeat(PADDING_UID_PREFIX))):
        return np.arange(count, dtype=np.int64)
    pad = np.fromiter(map(str.startswith, uids, repeat(PADDING_UID_PREFIX)), dtype=bool, count=count)
    if tagged:
        pad |= np.fromiter(map(_is_padding_tag, tags), dtype=bool, count=count)  # type: ignore[arg-type]
    return np.flatnonzero(~pad)


_REWARD_EXTRA_INFO = itemgetter("reward_extra_info")


def correctness(values: NDArray[np.float64], threshold: float, source: str = "gdro.acc_key") -> NDArray[np.float64]:
    """Binary correctness (1.0 / 0.0) of the reward's values (``source`` names them in an error): correct when above
    ``gdro.correct_threshold``. verl's reward managers put a reward function's plain float score
    under ``acc``, so a +-1 or shaped score arrives here as well as a {0, 1} correctness; the
    standalone estimator applies the same threshold to its outcome reward. A non-finite value is
    refused (it would silently count as a failure)."""
    if values.size and not np.all(np.isfinite(values)):
        raise ValueError(f"{source}: the reward returned a non-finite value; correctness needs a finite number")
    return (values > threshold).astype(np.float64)


def acc_from_extra_fields(
    infos: Sequence[Any], rows: NDArray[np.int64], key: str
) -> tuple[NDArray[np.float64] | None, set[str]]:
    """The ``key`` value of each of ``rows`` from verl's per-row ``extra_fields`` (the streaming
    reward puts the reward function's extra dict under ``reward_extra_info``), as float64.
    ``rows``: increasing row indices (what :func:`real_rows` returns).

    Returns ``(values, set())``, or ``(None, keys seen)`` when a row lacks the key or its value is
    not a number (the caller then tries the top-level field and names what it saw in its error).
    """
    count = rows.size
    if count == len(infos) and (count == 0 or (rows[0] == 0 and rows[-1] == count - 1)):
        picked = infos  # increasing indices, as many as rows: every row in order (no padding), no copy
    else:
        picked = list(map(infos.__getitem__, rows.tolist()))
    try:  # the usual case, in one C-level pass: every row has the dict and a number under the key
        values = np.fromiter(map(itemgetter(key), map(_REWARD_EXTRA_INFO, picked)), dtype=np.float64,
                             count=len(picked))
    except (KeyError, TypeError, IndexError, ValueError):
        values = None
    if values is not None and np.isnan(values).any():
        # np.fromiter reads None as NaN: a row whose value is None lacks it, as before (a true NaN
        # stays, and the controller refuses it as non-finite correctness)
        if None in map(itemgetter(key), map(_REWARD_EXTRA_INFO, picked)):
            values = None
    if values is not None:
        return values, set()
    extra = [info.get("reward_extra_info", {}) if isinstance(info, dict) else {} for info in picked]
    return None, set().union(*(e for e in extra if isinstance(e, dict)))


@dataclass
class ConsumedBatch:
    """One controller update's groups and the plan positions of the trained rows.

    ``uids``: verl's uid of every fetched row; ``rows``: the real ones (:func:`real_rows`);
    ``update``: the ledger's groups (consumed and removed-untrained), in dispatch order;
    ``positions``: the plan position of each of ``update.uids``; ``kept_group``: for every trained
    row, its group's index in ``update.uids``; ``group_index``: for every trained row, its plan
    position (what :meth:`GDROController.advantage_multipliers` and ``after_advantage`` take).
    """

    uids: list[str]
    rows: NDArray[np.int64]
    update: ObservedUpdate
    positions: NDArray[np.int64]
    kept_group: NDArray[np.int64]
    group_index: NDArray[np.int64]

    def multiplier_table(self, multipliers: NDArray[np.float64]) -> dict[str, float]:
        """verl uid -> multiplier of each group, for :func:`gdro_step`, from the per-row
        ``multipliers`` of :meth:`GDROController.advantage_multipliers`.

        Every row of a group carries its prompt's bin weight, so one value per group says the same
        as one per row, and ``gdro_step`` skips its per-row consistency check. Groups without a
        trained row (removed untrained) get 1.0: the estimator never sees them.
        """
        per_group = np.ones(len(self.update.uids), dtype=np.float64)
        per_group[self.kept_group] = np.asarray(multipliers, dtype=np.float64)
        return dict(zip(self.update.uids, per_group.tolist()))

    def row_plan(self, multipliers: NDArray[np.float64]) -> RowPlan | None:
        """The estimator's per-row view of the fetched batch (:class:`RowPlan`), or None when the
        batch has padding rows (the estimator then groups the rows itself).

        ``multipliers``: per real row, as given to :meth:`multiplier_table`. A row is a singleton
        when its group has no other trained row, which is what the estimator computes from the uids.
        """
        if self.rows.size != len(self.uids):
            return None
        sizes = np.bincount(self.kept_group, minlength=len(self.update.uids))
        return RowPlan(uids=self.uids, multipliers=np.asarray(multipliers, dtype=np.float64),
                       singleton=sizes[self.kept_group] == 1)

    def estimator_inputs(self, multipliers: NDArray[np.float64]) -> tuple[dict[str, float] | None, RowPlan | None]:
        """What :func:`gdro_step` takes for the estimator: ``(table, rows)``.

        The row plan when the fetched batch has no padding rows, and then no table (``gdro_step``
        builds the row plan's own only if verl's batch differs from those rows); otherwise the
        per-group table and no row plan. ``multipliers``: per real row, as
        :meth:`GDROController.advantage_multipliers` returns them.
        """
        rows = self.row_plan(multipliers)
        return (None, rows) if rows is not None else (self.multiplier_table(multipliers), None)

    def dropped(self) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """(plan position, acc) of every trajectory of the groups removed untrained, in the order
        of ``update.dropped``: observed with this update, once."""
        dropped = self.update.dropped
        if not dropped:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        slot = self.update.slot
        index = [int(self.positions[slot[u]]) for u, (a, _r) in dropped.items() for _ in a]
        acc = [x for a, _r in dropped.values() for x in a]
        return np.array(index, dtype=np.int64), np.array(acc, dtype=np.float64)


def later_outputs(keys: Sequence[str]) -> NDArray[np.bool_] | None:
    """Rows that are a later output of a multi-output agent-loop session, or None when none is.

    verl's agent loop writes each session's outputs under ``{uid}_{session_id}_{index}``
    (``v1/agent_loop_tq.py``); a multi-output loop (a custom agent loop returning a list) gives
    one session several rows, every one carrying the session's final reward. The session is the
    trial (one of the prompt's ``n`` rollouts), so the controller observes its first row only:
    counting every row would make every group look incomplete and inflate the classifier's
    counts. The usual batch (one output per session: every key ends in ``_0``) costs one C-level
    pass. Keys of another shape (padding, other writers) are never later outputs.
    """
    if all(map(methodcaller("endswith", "_0"), keys)):
        return None
    out = np.zeros(len(keys), dtype=bool)
    for i, key in enumerate(keys):
        head, _, index = key.rpartition("_")
        if index.isdigit() and int(index) > 0 and head.rpartition("_")[2].isdigit():
            out[i] = True
    return out


def first_measurements(rows: NDArray[np.int64], losses: NDArray[np.float64],
                       positions: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """The update-time losses the actor reported (one per row and mini-batch pass, ``rows`` the
    step's row indices) as (plan position, loss) per trained row: each row's first measurement, its
    mini-batch's pass of the first PPO epoch, in report order; verl's padding rows (position -1)
    are left out. ``positions``: the plan position of every row of the step's batch."""
    if rows.size and (rows.min() < 0 or rows.max() >= positions.size):
        raise RuntimeError(f"verl-gdro: the actor reported rows outside the step's {positions.size} rows")
    _, first = np.unique(rows, return_index=True)
    first = np.sort(first)
    group_index, losses = positions[rows[first]], losses[first]
    keep = group_index >= 0
    return group_index[keep], losses[keep]


def consume(
    ledger: DispatchLedger, controller: GDROController, uids: list[str],
    tags: Sequence[Mapping[str, Any] | None] | None = None, keys: Sequence[str] | None = None,
) -> ConsumedBatch:
    """Begin the ledger update of a fetched batch and adopt its groups into the controller's plan
    with their dispatch-time decisions.

    ``uids``: verl's uid of every fetched row (repeats per group); ``tags``: verl's per-row tags,
    whose ``is_padding`` rows (and padding uids) are left out (:func:`real_rows`); ``keys``: the
    rows' TransferQueue keys, whose later outputs of a multi-output session are left out of the
    controller's statistics (:func:`later_outputs`; the estimator still scales them by their
    group's multiplier).
    """
    distinct = dict.fromkeys(uids)  # the groups, in order of first row: shared by both checks below
    rows = real_rows(uids, tags, distinct)
    later = None if keys is None else later_outputs(keys)
    if later is not None:
        rows = rows[~later[rows]]
    everything = rows.size == len(uids)
    trained = uids if everything else list(map(uids.__getitem__, rows.tolist()))
    update = ledger.begin_update(distinct if everything else trained)
    positions = controller.adopt(*update.plan_columns())
    slot = update.slot
    kept_group = np.fromiter(map(slot.__getitem__, trained), dtype=np.int64, count=len(trained))
    return ConsumedBatch(uids=uids, rows=rows, update=update, positions=positions, kept_group=kept_group,
                         group_index=positions[kept_group])


def observe_update(
    ledger: DispatchLedger, controller: GDROController, consumed: ConsumedBatch, acc: NDArray[np.float64],
    global_steps: int, *, extra_time_s: float = 0.0, **token_fields: NDArray[np.floating],
) -> dict[str, float]:
    """The controllers' update with a consumed batch, the ledger's bookkeeping and every gdro/
    metric of the step (:meth:`GDROController.after_advantage`, :meth:`DispatchLedger.finish_update`,
    :func:`flow_metrics`).

    ``acc``: the correctness of each trained row (``consumed.rows``); the groups removed untrained
    since the last update are observed here, once, with their own acc (:meth:`ConsumedBatch.dropped`).
    ``token_fields``: the [N, T] arrays the surrogate loss signals read (rows of removed groups
    appended zero-masked), none for the failure rate.
    """
    group_index = consumed.group_index
    if consumed.update.dropped:  # groups removed untrained since the last update: observed once, here
        dropped_index, dropped_acc = consumed.dropped()
        group_index, acc = np.concatenate([group_index, dropped_index]), np.concatenate([acc, dropped_acc])
    metrics = controller.after_advantage(group_index, acc, extra_time_s=extra_time_s, **token_fields)
    counters = ledger.finish_update(consumed.update)
    metrics.update(flow_metrics(controller.num_bins, consumed.update, consumed.kept_group, counters, global_steps,
                                len(ledger)))
    return metrics


def flow_metrics(num_bins: int, update: ObservedUpdate, kept_group: NDArray[np.int64], counters: dict[str, Any],
                 global_steps: int, inflight: int) -> dict[str, float]:
    """What generation produced versus what verl trained, next to what GDRO reallocated (all finite).

    Args:
        update: the groups of this controller update (consumed and removed-untrained ones).
        kept_group: for every trained (non-padding) trajectory, its group's index in ``update.uids``.
        counters: :meth:`DispatchLedger.finish_update`'s generation calls and lost groups.
        global_steps: verl's step counter now (staleness = steps since a group's dispatch).
        inflight: prompts dispatched and not yet observed after this update (async prefetch).
    """
    bins = update.bins
    kept = np.bincount(bins[kept_group], minlength=num_bins).astype(np.float64)
    generated = kept.copy()
    filtered = np.zeros(num_bins)
    by_reason = dict.fromkeys(DROP_REASONS, 0)
    discarded = 0
    slot = update.slot
    for uid, (acc, reason) in update.dropped.items():
        b = bins[slot[uid]]
        by_reason[reason] += 1
        generated[b] += len(acc)
        if reason == "filtered":
            filtered[b] += len(acc)
        else:
            discarded += len(acc)
    share = np.divide(filtered, generated, out=np.zeros(num_bins), where=generated > 0)
    for reason, count in counters.get("lost_by_reason", {}).items():  # removed with no trajectory at all
        by_reason[reason] += count
    calls = counters["calls"]
    prompts, rollouts = sum(p for p, _ in calls), sum(r for _, r in calls)
    staleness = global_steps - update.steps
    out = {
        PREFIX + "flow/generated_rollouts": float(generated.sum()),
        PREFIX + "flow/kept_rollouts": float(kept.sum()),
        PREFIX + "flow/filtered_rollouts": float(filtered.sum()),
        PREFIX + "flow/discarded_rollouts": float(discarded),
        PREFIX + "flow/lost_groups": float(counters["lost"]),
        PREFIX + "dispatch/calls": float(len(calls)),
        PREFIX + "dispatch/prompts": float(prompts),
        PREFIX + "dispatch/rollouts": float(rollouts),
        # the budget of the step's generation calls (each meets it exactly: rollout.n); gdro/mean_n
        # is the mean over the groups this update observes, which need not be whole calls
        PREFIX + "call_mean_n": rollouts / prompts if prompts else 0.0,
        PREFIX + "staleness/mean": float(staleness.sum() / staleness.size) if staleness.size else 0.0,
        PREFIX + "staleness/max": float(staleness.max()) if staleness.size else 0.0,
        PREFIX + "inflight_prompts": float(inflight),
    }
    reason_keys, share_keys = _flow_keys(num_bins)
    out.update(zip(reason_keys, map(float, by_reason.values())))
    out.update(zip(share_keys, share.tolist()))
    return out


@lru_cache(maxsize=8)
def _flow_keys(num_bins: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The per-reason and per-bin flow metric names, built once per B instead of every step."""
    return (tuple(PREFIX + f"flow/dropped_groups/{reason}" for reason in DROP_REASONS),
            tuple(PREFIX + f"flow/filtered_share/bin_{b}" for b in range(num_bins)))
