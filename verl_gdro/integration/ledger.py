"""The dispatch ledger: GDRO decisions of every prompt dispatched for generation and not yet observed.

verl's V1 trainers do not observe a prompt in the step that dispatched it in two configurations:

- DAPO group filtering (``algorithm.filter_groups``): the replay buffer drops the all-correct and
  all-wrong groups (and, in sync mode, discards surplus groups) before the advantage stage, and
  refills with prompts dispatched in further generation calls of the same step;
- the async trainers (``colocate_async``, ``separate_async``): a prompt dispatched at step t (or in
  a warm-up batch) may be trained at step t + k, and stale or failed groups are evicted.

So the GDRO trainers decide at dispatch (:meth:`GDROController.decide`, with the controller state
of that moment) and record the decision here, keyed by verl's per-dispatch ``uid``. A group is
observed exactly once: either when the advantage stage consumes its trajectories, or when the
replay buffer removes it untrained (:meth:`DispatchLedger.drop`, folded into the next update). The
ledger rides in verl's ``data.pt`` checkpoint with the controller (``GDROSampler`` companions), so a
resumed async run finds the decisions of the prompts that TransferQueue's checkpoint restores.

Pure Python and numpy: no verl, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

__all__ = ["DROP_REASONS", "Decision", "DispatchLedger", "ObservedUpdate", "decision_columns"]

_STATE_VERSION = 1
_SEQ = attrgetter("seq")

#: Why the replay buffer removed a group without training on it (verl 0.9.1's V1 replay buffer).
DROP_REASONS: tuple[str, ...] = ("filtered", "surplus", "stale", "failed")


class Decision(NamedTuple):
    """What GDRO decided for one dispatched prompt group, and when.

    A named tuple rather than a frozen dataclass: the trainer records one per dispatched prompt
    every generation call, and a tuple is built in C (a frozen dataclass's ``__init__`` goes
    through ``object.__setattr__`` per field, ~1 us a decision).
    """

    stable_uid: int
    bin: int
    rollout_n: int
    step: int  # verl's global_steps at dispatch
    seq: int  # dispatch order over the run (orders every update deterministically)


def decision_columns(decisions: list[Decision]) -> dict[str, NDArray[np.int64]]:
    """Each :class:`Decision` field as an int64 array over ``decisions``, built in one C-level pass."""
    width = len(Decision._fields)
    flat = np.fromiter(chain.from_iterable(decisions), dtype=np.int64, count=width * len(decisions))
    table = flat.reshape(len(decisions), width)
    return {name: table[:, j] for j, name in enumerate(Decision._fields)}


@dataclass
class ObservedUpdate:
    """The groups one controller update observes, in dispatch order.

    ``uids`` are verl uids; ``dropped`` maps the dropped ones to (per-trajectory acc, reason).
    """

    uids: list[str]
    decisions: list[Decision]
    dropped: dict[str, tuple[list[float], str]] = field(default_factory=dict)

    @cached_property
    def _columns(self) -> dict[str, NDArray[np.int64]]:
        return decision_columns(self.decisions)

    @property
    def stable_uids(self) -> NDArray[np.int64]:
        return self._columns["stable_uid"].copy()

    @property
    def bins(self) -> NDArray[np.int64]:
        return self._columns["bin"].copy()

    @property
    def rollout_n(self) -> NDArray[np.int64]:
        return self._columns["rollout_n"].copy()

    @property
    def steps(self) -> NDArray[np.int64]:
        """verl's ``global_steps`` at each group's dispatch."""
        return self._columns["step"].copy()

    @cached_property
    def slot(self) -> dict[str, int]:
        """verl uid -> index in :attr:`uids`."""
        return dict(zip(self.uids, range(len(self.uids))))


class DispatchLedger:
    """Decisions of dispatched prompts until their single observation; per-call dispatch counters."""

    def __init__(self) -> None:
        self.entries: dict[str, Decision] = {}
        self.dropped: dict[str, tuple[list[float], str]] = {}
        self._seq = 0
        #: (prompts, rollouts) of every generation call since the last update
        self.calls: list[tuple[int, int]] = []
        #: groups removed without any trajectory since the last update (failed generation)
        self.lost = 0

    def __len__(self) -> int:
        return len(self.entries)

    def dispatch(self, uids: list[str], stable: NDArray[np.int64], bins: NDArray[np.int64],
                 rollout_n: NDArray[np.int64], step: int) -> None:
        """Record one generation call's decisions (one verl ``_next_train_batch`` call)."""
        if not (len(uids) == stable.size == bins.size == rollout_n.size):
            raise ValueError("dispatch needs one stable id, bin and rollout_n per verl uid")
        count = len(uids)
        fresh = dict.fromkeys(uids)
        if len(fresh) != count or not self.entries.keys().isdisjoint(fresh):
            seen: set[str] = set(self.entries)
            for uid in uids:  # name the first repeat (error path only)
                if uid in seen:
                    raise RuntimeError(f"verl-gdro: prompt uid {uid!r} was dispatched twice")
                seen.add(uid)
        # tuple.__new__(Decision, fields) builds each named tuple in C (Decision._make is a Python call)
        decisions = map(
            tuple.__new__, repeat(Decision),
            zip(np.asarray(stable, dtype=np.int64).tolist(), np.asarray(bins, dtype=np.int64).tolist(),
                np.asarray(rollout_n, dtype=np.int64).tolist(), repeat(int(step)),
                range(self._seq, self._seq + count)),
        )
        self.entries.update(zip(uids, decisions))
        self._seq += count
        self.calls.append((count, int(rollout_n.sum())))

    def drop(self, uid: str, acc: list[float], reason: str) -> bool:
        """A group the replay buffer removes untrained; observed at the next update. False when the
        uid is unknown (dispatched outside this ledger) or already dropped."""
        if reason not in DROP_REASONS:
            raise ValueError(f"unknown drop reason {reason!r}: allowed {list(DROP_REASONS)}")
        if uid not in self.entries or uid in self.dropped:
            return False
        if not acc:  # nothing was generated: no observation, the decision is forgotten
            del self.entries[uid]
            self.lost += 1
            return True
        self.dropped[uid] = ([float(a) for a in acc], reason)
        return True

    def begin_update(self, consumed: Iterable[str]) -> ObservedUpdate:
        """The groups of one update: the consumed uids plus every dropped group, in dispatch order.

        ``consumed``: the uid of every trained row (repeats per group), or the distinct ones.
        Raises for a consumed uid without a decision (a prompt that no ``_next_train_batch`` of
        this run dispatched).
        """
        unique = dict.fromkeys(consumed)
        if not self.entries.keys() >= unique.keys():
            missing = next(u for u in unique if u not in self.entries)
            raise RuntimeError(
                f"verl-gdro: trajectory of prompt uid {missing!r} was not planned by _next_train_batch"
            )
        if not unique.keys().isdisjoint(self.dropped):
            both = next(u for u in unique if u in self.dropped)
            raise RuntimeError(f"verl-gdro: prompt uid {both!r} was both dropped and consumed")
        unique.update(dict.fromkeys(self.dropped))
        # dispatch order: sort the (seq, uid) pairs, seq first (distinct, so uids are never compared);
        # a synchronous step consumes its groups in dispatch order already, and then nothing moves
        decisions = list(map(self.entries.__getitem__, unique))
        uids = list(unique)
        seqs = list(map(_SEQ, decisions))
        if seqs != sorted(seqs):
            order = sorted(zip(seqs, range(len(decisions))))
            uids = [uids[i] for _s, i in order]
            decisions = [decisions[i] for _s, i in order]
        return ObservedUpdate(uids=uids, decisions=decisions, dropped=dict(self.dropped))

    def finish_update(self, update: ObservedUpdate) -> dict[str, Any]:
        """Forget the observed groups; return the dispatch counters since the last update, reset."""
        entries, dropped = self.entries, self.dropped
        for uid in update.uids:
            entries.pop(uid, None)
            dropped.pop(uid, None)
        calls, lost = self.calls, self.lost
        self.calls, self.lost = [], 0
        return {"calls": calls, "lost": lost}

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        cols = {k: v.copy() for k, v in decision_columns(list(self.entries.values())).items()}
        return {
            "version": _STATE_VERSION,
            "uids": list(self.entries),
            "stable": cols["stable_uid"],
            "bins": cols["bin"],
            "rollout_n": cols["rollout_n"],
            "step": cols["step"],
            "seq": cols["seq"],
            "next_seq": self._seq,
            "dropped": {u: (list(a), r) for u, (a, r) in self.dropped.items()},
            "calls": list(self.calls),
            "lost": self.lost,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a DispatchLedger state of version {_STATE_VERSION}")
        self.entries = {
            u: Decision(int(s), int(b), int(n), int(t), int(q))
            for u, s, b, n, t, q in zip(state["uids"], state["stable"].tolist(), state["bins"].tolist(),
                                        state["rollout_n"].tolist(), state["step"].tolist(),
                                        state["seq"].tolist(), strict=True)
        }
        self.dropped = {u: (list(a), str(r)) for u, (a, r) in state["dropped"].items()}
        self._seq = int(state["next_seq"])
        self.calls = [(int(p), int(r)) for p, r in state["calls"]]
        self.lost = int(state["lost"])
