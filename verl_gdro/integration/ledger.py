"""The dispatch ledger: GDRO decisions of every prompt dispatched and not yet observed, by verl ``uid``.

Under DAPO filtering and in the async trainers a prompt is observed after the step that dispatched it
(docs/integration.md, "Semantics under staleness"); each group is observed once, consumed or removed
untrained. It rides in ``data.pt`` as a ``GDROSampler`` companion. Pure Python and numpy.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

logger = logging.getLogger(__name__)

_STATE_VERSION = 1

#: Why the replay buffer removed a group without training on it (verl 0.9.1's V1 replay buffer).
DROP_REASONS: tuple[str, ...] = ("filtered", "surplus", "stale", "failed")


class Decision(NamedTuple):
    """What GDRO decided for one dispatched prompt group, and when (a row of the ledger's table)."""
    stable_uid: int
    bin: int
    rollout_n: int
    step: int  # verl's global_steps at dispatch
    seq: int  # dispatch order over the run (orders every update deterministically)


_WIDTH = len(Decision._fields)  # a decision table's columns, in Decision's field order
_STATE_COLUMNS = ("stable", "bins", "rollout_n", "step", "seq")  # their keys in a saved state


@dataclass
class ObservedUpdate:
    """One update's groups in dispatch order: ``uids``, their :class:`Decision` rows (``table``, int64),
    ``dropped``: uid -> (per-trajectory acc, reason)."""

    uids: list[str]
    table: NDArray[np.int64]
    dropped: dict[str, tuple[list[float], str]] = field(default_factory=dict)

    @property
    def decisions(self) -> list[Decision]:
        """The rows as :class:`Decision` tuples."""
        return list(map(Decision._make, self.table.tolist()))

    def plan_columns(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """(stable ids, bins, rollout_n) as views (:meth:`GDROController.adopt` copies them)."""
        table = self.table
        return table[:, 0], table[:, 1], table[:, 2]

    # copies of one column each; ``steps``: verl's ``global_steps`` at each group's dispatch
    stable_uids, bins, rollout_n, steps = (property(lambda self, j=j: self.table[:, j].copy()) for j in range(4))

    @cached_property
    def slot(self) -> dict[str, int]:
        """verl uid -> index in :attr:`uids`."""
        return dict(zip(self.uids, range(len(self.uids))))


class _Entries(Mapping[str, Decision]):
    """Read-only view of the outstanding decisions, verl uid -> :class:`Decision`, in dispatch order."""

    def __init__(self, ledger: DispatchLedger) -> None:
        self._ledger = ledger

    def __getitem__(self, uid: str) -> Decision:
        ledger = self._ledger
        return Decision._make(ledger._table[ledger._row_of[uid]].tolist())

    def __contains__(self, uid: object) -> bool:
        return uid in self._ledger._row_of

    def __iter__(self) -> Iterator[str]:
        return iter(self._ledger._row_of)

    def __len__(self) -> int:
        return len(self._ledger._row_of)


class DispatchLedger:
    """Decisions of dispatched prompts until their single observation; per-call dispatch counters. A
    column store (an int64 row per group, verl uid -> row), compacted when observed rows dominate."""

    def __init__(self) -> None:
        self._row_of: dict[str, int] = {}
        self._table = np.zeros((0, _WIDTH), dtype=np.int64)
        self.dropped: dict[str, tuple[list[float], str]] = {}
        self._seq = 0
        self.calls: list[tuple[int, int]] = []  # (prompts, rollouts) of each generation call since the last update
        self.lost = 0  # groups removed with no trajectory since the last update (failed generation)
        self.lost_by_reason: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)  # the same, by drop reason
        self._lost_stable: list[int] = []  # their prompts (held_stable_uids)

    def __len__(self) -> int:
        return len(self._row_of)

    def live_stable_uids(self) -> NDArray[np.int64]:
        """Stable prompt id of every outstanding group (dispatched, not yet observed)."""
        rows = np.fromiter(self._row_of.values(), dtype=np.int64, count=len(self._row_of))
        return self._table[rows, 0]

    def held_stable_uids(self) -> NDArray[np.int64]:
        """What a sampler excludes: outstanding and lost prompts (those dispatched between updates are distinct)."""
        return np.concatenate([self.live_stable_uids(), np.asarray(self._lost_stable, dtype=np.int64)])

    @property
    def entries(self) -> Mapping[str, Decision]:
        """The outstanding decisions (dispatched, not yet observed), verl uid -> :class:`Decision`."""
        return _Entries(self)

    def dispatch(self, uids: list[str], stable: NDArray[np.int64], bins: NDArray[np.int64],
                 rollout_n: NDArray[np.int64], step: int) -> None:
        """Record one generation call's decisions (one verl ``_next_train_batch`` call)."""
        if not (len(uids) == stable.size == bins.size == rollout_n.size):
            raise ValueError("dispatch needs one stable id, bin and rollout_n per verl uid")
        count = len(uids)
        rows = np.empty((count, _WIDTH), dtype=np.int64)  # built first: a bad column changes nothing
        rows[:, 0], rows[:, 1], rows[:, 2] = stable, bins, rollout_n
        rows[:, 3] = int(step)
        rows[:, 4] = np.arange(self._seq, self._seq + count)
        row_of = self._row_of
        if not row_of.keys().isdisjoint(uids):  # one lookup per uid, no table built
            self._refuse_repeat(uids)
        start, before = self._table.shape[0], len(row_of)
        row_of.update(zip(uids, range(start, start + count)))
        if len(row_of) != before + count:  # a uid twice in this call: only this call's keys were added
            for uid in uids:
                row_of.pop(uid, None)
            self._refuse_repeat(uids)
        self._table = np.concatenate([self._table, rows])
        self._seq += count
        self.calls.append((count, int(rollout_n.sum())))

    def _refuse_repeat(self, uids: list[str]) -> None:
        """Raise naming the first uid of ``uids`` already outstanding or repeated (error path only)."""
        seen: set[str] = set(self._row_of)
        repeated = next(uid for uid in uids if uid in seen or seen.add(uid))  # add() is None: falsy
        raise RuntimeError(f"verl-gdro: prompt uid {repeated!r} was dispatched twice")

    def drop(self, uid: str, acc: list[float], reason: str) -> bool:
        """A group removed untrained, observed at the next update; False for an unknown or dropped uid."""
        if reason not in DROP_REASONS:
            raise ValueError(f"unknown drop reason {reason!r}: allowed {list(DROP_REASONS)}")
        if uid not in self._row_of or uid in self.dropped:
            return False
        if not acc:  # nothing was generated: no observation, the decision is forgotten
            self._lost_stable.append(int(self._table[self._row_of.pop(uid), 0]))
            self.lost += 1
            self.lost_by_reason[reason] += 1
            if not self._row_of:
                self._table = self._table[:0]
            return True
        self.dropped[uid] = ([float(a) for a in acc], reason)
        return True

    def begin_update(self, consumed: Iterable[str]) -> ObservedUpdate:
        """The consumed uids plus every dropped group, in dispatch order; raises for a uid not dispatched."""
        # the caller's distinct uids (consume passes a dict) when nothing was dropped, else a copy
        unique = consumed if type(consumed) is dict and not self.dropped else dict.fromkeys(consumed)
        row_of = self._row_of
        if not row_of.keys() >= unique.keys():
            missing = next(u for u in unique if u not in row_of)
            raise RuntimeError(f"verl-gdro: trajectory of prompt uid {missing!r} was not planned by _next_train_batch")
        if not unique.keys().isdisjoint(self.dropped):
            both = next(u for u in unique if u in self.dropped)
            raise RuntimeError(f"verl-gdro: prompt uid {both!r} was both dropped and consumed")
        unique.update(dict.fromkeys(self.dropped))
        uids = list(unique)
        rows = np.fromiter(map(row_of.__getitem__, uids), dtype=np.int64, count=len(uids))
        table = self._table[rows]
        # dispatch order (seq, distinct); a synchronous step consumes its groups in that order already
        seq = table[:, 4]
        if seq.size > 1 and not bool((seq[1:] > seq[:-1]).all()):
            order = np.argsort(seq)
            uids = [uids[i] for i in order.tolist()]
            table = table[order]
        return ObservedUpdate(uids=uids, table=table, dropped=dict(self.dropped))

    def finish_update(self, update: ObservedUpdate) -> dict[str, Any]:
        """Forget the observed groups; return the dispatch counters since the last update, reset."""
        row_of, dropped = self._row_of, self.dropped
        deque(map(row_of.pop, update.uids, repeat(None)), maxlen=0)  # row_of.pop(uid, None) per uid, C-level
        if dropped:
            deque(map(dropped.pop, update.uids, repeat(None)), maxlen=0)
        self._compact()
        calls, lost, lost_by_reason = self.calls, self.lost, self.lost_by_reason
        self.calls, self.lost, self.lost_by_reason = [], 0, dict.fromkeys(DROP_REASONS, 0)
        self._lost_stable = []
        return {"calls": calls, "lost": lost, "lost_by_reason": lost_by_reason}

    def reconcile(self, in_flight: Iterable[str]) -> list[str]:
        """Forget (and return) the outstanding groups verl no longer holds (dropped groups stay: they are due)."""
        keep = set(in_flight)
        orphans = [uid for uid in self._row_of if uid not in keep and uid not in self.dropped]
        for uid in orphans:
            del self._row_of[uid]
        if orphans:
            self._compact()
        return orphans

    def _compact(self) -> None:
        """Drop the rows of observed groups once they are the majority (amortised O(1) per row)."""
        live = len(self._row_of)
        if live == 0:
            self._table = self._table[:0]
        elif self._table.shape[0] > 2 * live + 1024:
            keep = np.fromiter(self._row_of.values(), dtype=np.int64, count=live)
            self._table = self._table[keep]
            self._row_of = dict(zip(self._row_of, range(live)))

    def state_dict(self) -> dict[str, Any]:
        table = self._table[np.fromiter(self._row_of.values(), dtype=np.int64, count=len(self._row_of))]
        return {"version": _STATE_VERSION, "uids": list(self._row_of),
                **{key: table[:, j].copy() for j, key in enumerate(_STATE_COLUMNS)}, "next_seq": self._seq,
                "dropped": {u: (list(a), r) for u, (a, r) in self.dropped.items()}, "calls": list(self.calls),
                "lost": self.lost, "lost_by_reason": dict(self.lost_by_reason), "lost_stable": list(self._lost_stable)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a DispatchLedger state of version {_STATE_VERSION}")
        uids = list(state["uids"])
        columns = [np.asarray(state[key], dtype=np.int64).reshape(-1) for key in _STATE_COLUMNS]
        if any(c.size != len(uids) for c in columns) or len(set(uids)) != len(uids):
            raise ValueError("DispatchLedger state: uids and decision columns disagree")
        self._table = np.stack(columns, axis=1) if uids else np.zeros((0, _WIDTH), dtype=np.int64)
        self._row_of = dict(zip(uids, range(len(uids))))
        self.dropped = {u: (list(a), str(r)) for u, (a, r) in state["dropped"].items()}
        self._seq = int(state["next_seq"])
        self.calls = [(int(p), int(r)) for p, r in state["calls"]]
        self.lost = int(state["lost"])
        saved = state.get("lost_by_reason") or {}  # absent in states written before it existed
        self.lost_by_reason = {r: int(saved.get(r, 0)) for r in DROP_REASONS}
        self._lost_stable = [int(u) for u in state.get("lost_stable", ())]


class ResumedLedger:
    """The ledger as a ``GDROSampler`` companion: a loaded state is reconciled with ``in_flight()``."""

    def __init__(self, ledger: DispatchLedger, in_flight: Callable[[], Iterable[str]]) -> None:
        self.ledger = ledger
        self.in_flight = in_flight
        self.forgotten: list[str] = []  # uids forgotten by the last load (diagnostics)

    def state_dict(self) -> dict[str, Any]:
        return self.ledger.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ledger.load_state_dict(state)
        self.forgotten = self.ledger.reconcile(self.in_flight())
        if self.forgotten:
            logger.warning("verl-gdro: %d dispatched prompt group(s) of the checkpoint are not in flight after the "
                           "resume (resumed without TransferQueue's checkpoint): their dispatch decisions are "
                           "forgotten, their prompts drawable again", len(self.forgotten))
