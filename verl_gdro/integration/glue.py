"""The GDRO trainer's per-row numpy glue between verl's fetched batch and the controller (timed by
``benchmarks/overhead.py``): C-level passes (``map``, ``dict`` builds, numpy), never a Python loop per row."""

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


def _is_padding_tag(tag: Mapping[str, Any] | None) -> bool:
    return bool(tag) and bool(tag.get("is_padding", False))  # type: ignore[union-attr]


def real_rows(uids: Sequence[str], tags: Sequence[Mapping[str, Any] | None] | None = None,
              distinct: Mapping[str, Any] | None = None) -> NDArray[np.int64]:
    """Indices of the real trajectories: rows neither tagged ``is_padding`` (``tags``: dict or None per row)
    nor of a padding uid; a batch without padding is settled on the ``distinct`` uids and one ``any``."""
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
    """Binary correctness (1.0 / 0.0) above ``gdro.correct_threshold``; non-finite refused, naming ``source``."""
    if values.size and not np.all(np.isfinite(values)):
        raise ValueError(f"{source}: the reward returned a non-finite value; correctness needs a finite number")
    return (values > threshold).astype(np.float64)


def acc_from_extra_fields(infos: Sequence[Any], rows: NDArray[np.int64],
                          key: str) -> tuple[NDArray[np.float64] | None, set[str]]:
    """``(values, set())``: each of ``rows``' (increasing) float ``key`` under verl's
    ``extra_fields["reward_extra_info"]``, or ``(None, keys seen)`` when a row lacks a number there."""
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
        # np.fromiter reads None as NaN: a None lacks the value (a true NaN stays, refused as non-finite)
        if None in map(itemgetter(key), map(_REWARD_EXTRA_INFO, picked)):
            values = None
    if values is not None:
        return values, set()
    extra = [info.get("reward_extra_info", {}) if isinstance(info, dict) else {} for info in picked]
    return None, set().union(*(e for e in extra if isinstance(e, dict)))


@dataclass
class ConsumedBatch:
    """One update's groups: ``uids`` of every fetched row, ``rows`` the real ones, ``update`` the ledger's
    groups, ``positions`` their plan positions; per trained row ``kept_group`` (index in ``update.uids``)
    and ``group_index`` (plan position, what the controller's methods take)."""

    uids: list[str]
    rows: NDArray[np.int64]
    update: ObservedUpdate
    positions: NDArray[np.int64]
    kept_group: NDArray[np.int64]
    group_index: NDArray[np.int64]

    def multiplier_table(self, multipliers: NDArray[np.float64]) -> dict[str, float]:
        """verl uid -> multiplier of each group from the per-row ``multipliers`` (removed groups: 1.0)."""
        per_group = np.ones(len(self.update.uids), dtype=np.float64)
        per_group[self.kept_group] = np.asarray(multipliers, dtype=np.float64)
        return dict(zip(self.update.uids, per_group.tolist()))

    def row_plan(self, multipliers: NDArray[np.float64]) -> RowPlan | None:
        """The estimator's :class:`RowPlan` of the fetched batch, or None when it has padding rows."""
        if self.rows.size != len(self.uids):
            return None
        sizes = np.bincount(self.kept_group, minlength=len(self.update.uids))
        return RowPlan(uids=self.uids, multipliers=np.asarray(multipliers, dtype=np.float64),
                       singleton=sizes[self.kept_group] == 1)

    def estimator_inputs(self, multipliers: NDArray[np.float64]) -> tuple[dict[str, float] | None, RowPlan | None]:
        """``(table, rows)`` for :func:`gdro_step`: the row plan alone, else (padding) the table alone."""
        rows = self.row_plan(multipliers)
        return (None, rows) if rows is not None else (self.multiplier_table(multipliers), None)

    def dropped(self) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """(plan position, acc) of every trajectory of the groups removed untrained (``update.dropped``)."""
        dropped, slot = self.update.dropped, self.update.slot
        index = [int(self.positions[slot[u]]) for u, (a, _r) in dropped.items() for _ in a]
        acc = [x for a, _r in dropped.values() for x in a]
        return np.array(index, dtype=np.int64), np.array(acc, dtype=np.float64)


def later_outputs(keys: Sequence[str]) -> NDArray[np.bool_] | None:
    """Rows that are a later output (``{uid}_{session}_{i}``, i > 0) of an agent-loop session, or None."""
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
    """(plan position, loss) of each trained row's first update-time measurement; padding rows (-1) out."""
    if rows.size and (rows.min() < 0 or rows.max() >= positions.size):
        raise RuntimeError(f"verl-gdro: the actor reported rows outside the step's {positions.size} rows")
    _, first = np.unique(rows, return_index=True)
    first = np.sort(first)
    group_index, losses = positions[rows[first]], losses[first]
    keep = group_index >= 0
    return group_index[keep], losses[keep]


def consume(ledger: DispatchLedger, controller: GDROController, uids: list[str],
            tags: Sequence[Mapping[str, Any] | None] | None = None, keys: Sequence[str] | None = None) -> ConsumedBatch:
    """Begin the ledger update of a fetched batch and adopt its groups into the plan (padding, later outputs out)."""
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


def observe_update(ledger: DispatchLedger, controller: GDROController, consumed: ConsumedBatch,
                   acc: NDArray[np.float64], global_steps: int, *, extra_time_s: float = 0.0,
                   **token_fields: NDArray[np.floating]) -> dict[str, float]:
    """The controllers' update with a consumed batch (removed groups observed here), the ledger's, the metrics."""
    group_index = consumed.group_index
    if consumed.update.dropped:
        dropped_index, dropped_acc = consumed.dropped()
        group_index, acc = np.concatenate([group_index, dropped_index]), np.concatenate([acc, dropped_acc])
    metrics = controller.after_advantage(group_index, acc, extra_time_s=extra_time_s, **token_fields)
    counters = ledger.finish_update(consumed.update)
    metrics.update(flow_metrics(controller.num_bins, consumed.update, consumed.kept_group, counters,
                                global_steps, len(ledger)))
    return metrics


def flow_metrics(num_bins: int, update: ObservedUpdate, kept_group: NDArray[np.int64], counters: dict[str, Any],
                 global_steps: int, inflight: int) -> dict[str, float]:
    """What generation produced versus what verl trained (all finite); ``counters``:
    :meth:`DispatchLedger.finish_update`'s; ``inflight``: prompts dispatched, not yet observed."""
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
        # the generation calls' budget (rollout.n); gdro/mean_n is the observed groups' mean
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


def filter_note(config: Any) -> str:
    """The mode line's part for DAPO's dynamic sampling (it changes what a rollout costs); empty when off."""
    fg = config.algorithm.get("filter_groups", None)
    if fg is None or not fg.get("enable", False):
        return ""
    cap = fg.get("max_num_gen_batches", 0)
    calls = f"at most {cap} generation calls per step" if cap and cap > 0 else "generation calls unbounded"
    return (f" | DAPO filter on ({fg.get('metric', 'acc')}, {calls}): every generated rollout counts; with or without "
            "the filter: docs/benchmarks.md, 'GDRO with DAPO's dynamic sampling'")

