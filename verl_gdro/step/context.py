"""Process-local hand-over of the step's Prompt-GDRO multipliers to the ``gdro_grpo`` estimator.

verl calls an estimator with no prompt id, step or trainer, so the trainer (and the demo) open a
:func:`gdro_step` around ``compute_advantage`` with each group's multiplier by verl ``uid``; the
estimator runs in the calling thread, so a context variable suffices and a raising step leaves nothing.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

# verl's _balance_batch pads with zero-mask rows whose uid is f"pad{uuid4().hex}" (padding_utils.py).
PADDING_UID_PREFIX = "pad"


def uid_keys(index: Sequence[object]) -> list[str]:
    """verl's per-row ``uid`` values as a list of str, in one C-level pass (benchmarks/overhead.py)."""
    if isinstance(index, np.ndarray):
        index = index.tolist()
    if set(map(type, index)) == {str}:  # verl's uids are str already: one C-level type pass, no calls
        return list(index)
    return list(map(str, index))


def _check_range(multipliers: np.ndarray) -> tuple[int | None, bool]:
    """(index of the first multiplier that is not finite and >= 0, NaN included, or None; whether every
    multiplier is exactly 1) from the same two reductions."""
    if multipliers.size == 0:
        return None, True
    low, high = multipliers.min(), multipliers.max()
    if low >= 0.0 and math.isfinite(high):
        return None, bool(low == 1.0 and high == 1.0)  # no temporaries (the usual case); NaN fails min
    bad = np.flatnonzero(~(np.isfinite(multipliers) & (multipliers >= 0)))
    return (int(bad[0]) if bad.size else None), False


@dataclass(frozen=True)
class RowPlan:
    """The caller's per-row view of the batch (verl ``uids`` in row order, multipliers, whether a uid occurs
    once): when the estimator's ``index`` is exactly ``uids`` it skips grouping the rows (benchmarks/overhead.py)."""

    uids: list[str]
    multipliers: np.ndarray
    singleton: np.ndarray
    #: derived at construction, for the estimator (the float32 column has numpy's and torch's bits alike)
    all_ones: bool = field(init=False, repr=False, compare=False)
    any_singleton: bool = field(init=False, repr=False, compare=False)
    multipliers_f32: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m = np.asarray(self.multipliers, dtype=np.float64)
        s = np.asarray(self.singleton, dtype=bool)
        if m.shape != (len(self.uids),) or s.shape != (len(self.uids),):
            raise ValueError(
                f"RowPlan: multipliers {m.shape} and singleton {s.shape} need one entry per uid ({len(self.uids)})")
        bad, all_ones = _check_range(m)
        if bad is not None:
            raise ValueError(f"RowPlan: multipliers must be finite and >= 0; row {bad} has {m[bad]}")
        # the derived fields prepared here rather than in the estimator, where cold caches made them slow
        for name, value in (("multipliers", m), ("singleton", s), ("all_ones", all_ones),
                            ("any_singleton", bool(s.any())), ("multipliers_f32", m.astype(np.float32))):
            object.__setattr__(self, name, value)

    def matches(self, index: Sequence[object]) -> bool:
        """Whether verl's ``index`` (uid per row) is exactly these rows, in this order."""
        if len(index) != len(self.uids):
            return False
        rows = index.tolist() if isinstance(index, np.ndarray) else list(index)
        return rows == self.uids


@dataclass(frozen=True)
class GDROStep:
    """Every group's multiplier by verl ``uid``; ``settings``: the caller's, used instead of the estimator's."""

    multipliers: Mapping[str, float]
    settings: Any = None
    rows: RowPlan | None = None
    #: the algorithm group's ``norm_adv_by_std_in_grpo`` as the caller read it (None: the estimator reads it)
    norm_adv_by_std: bool | None = None

    def lookup(self, index: Sequence[object]) -> np.ndarray:
        """Per-row multipliers for verl's ``index``; a non-padding uid without one (never planned) raises."""
        keys = uid_keys(index)
        values = list(map(self.multipliers.get, keys))
        if None in values:
            for i, key in enumerate(keys):
                if values[i] is None:
                    if not key.startswith(PADDING_UID_PREFIX):  # verl's synthetic padding groups get 1
                        raise KeyError(f"gdro_grpo: no Prompt-GDRO multiplier for uid {key!r}; the open gdro_step() "
                            "does not cover this batch (was the batch planned by the GDRO trainer?)")
                    values[i] = 1.0
        return np.array(values, dtype=np.float64).reshape(len(keys))

    def all_ones(self) -> bool:
        """True when every multiplier is exactly 1 (then the estimator leaves GRPO's bits untouched)."""
        return all(v == 1.0 for v in self.multipliers.values())


_CURRENT: contextvars.ContextVar[GDROStep | None] = contextvars.ContextVar("verl_gdro_step", default=None)


def _per_uid_table(keys: list[str], vals: NDArray[np.float64]) -> dict[str, float]:
    """uid -> value from parallel per-group or per-row lists; repeated uids must carry one value."""
    row_values = vals.tolist()
    table: dict[str, float] = dict(zip(keys, row_values))
    if len(table) != len(keys):  # repeated uids (one value per row): they must agree
        back = np.fromiter(map(table.__getitem__, keys), dtype=np.float64, count=len(keys))
        differ = np.flatnonzero(back != vals)  # NaN != NaN: flagged too, as before
        if differ.size:
            key = keys[int(differ[0])]
            first = row_values[keys.index(key)]
            second = next(v for k, v in zip(keys, row_values) if k == key and not v == first)
            raise ValueError(f"gdro_step: uid {key!r} has two different multipliers ({first} and {second})")
    return table


class _RowTable(Mapping[str, float]):
    """A :class:`RowPlan`'s per-uid table, built on first use (when verl's balancing changed the batch)."""

    def __init__(self, rows: RowPlan) -> None:
        self._rows = rows
        self._table: dict[str, float] | None = None

    def _built(self) -> dict[str, float]:
        if self._table is None:
            self._table = _per_uid_table(self._rows.uids, self._rows.multipliers)
        return self._table

    def __getitem__(self, uid: str) -> float:
        return self._built()[uid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


@contextmanager
def gdro_step(multipliers: Mapping[str, float] | None = None, *, uids: Sequence[object] | None = None,
              values: Sequence[float] | np.ndarray | None = None, settings: Any = None,
              rows: RowPlan | None = None, norm_adv_by_std: bool | None = None) -> Iterator[GDROStep]:
    """Open a step (not nested): the estimator applies these multipliers instead of running standalone.

    ``multipliers`` (uid -> multiplier), parallel ``uids`` / ``values`` (repeated uids: one value), or
    only ``rows``; ``settings`` / ``norm_adv_by_std``: what the estimator would read from its config.
    """
    table: Mapping[str, float]
    if multipliers is None and uids is None and values is None and rows is not None:
        table = _RowTable(rows)  # checked by RowPlan (finite, >= 0); built only if the estimator needs it
    elif multipliers is None:
        if uids is None or values is None:
            raise ValueError("gdro_step needs multipliers, or uids and values, or rows")
        vals = np.asarray(values, dtype=np.float64)
        if vals.ndim != 1 or len(vals) != len(uids):
            raise ValueError(f"gdro_step: uids ({len(uids)}) and values ({vals.shape}) must be parallel 1-D arrays")
        table = _per_uid_table(uid_keys(uids), vals)
    elif type(multipliers) is dict and set(map(type, multipliers)) <= {str} and set(map(type, multipliers.values())) <= {float}:
        table = dict(multipliers)  # already str -> float (what ConsumedBatch.multiplier_table builds): a copy
    else:
        table = dict(zip(uid_keys(list(multipliers.keys())), map(float, multipliers.values())))
    if not isinstance(table, _RowTable):
        table_values = np.fromiter(table.values(), dtype=np.float64, count=len(table))
        bad = _check_range(table_values)[0]
        if bad is not None:
            key = list(table)[bad]
            raise ValueError(f"gdro_step: multipliers must be finite and >= 0; uid {key!r} has {table[key]}")
    if _CURRENT.get() is not None:
        raise RuntimeError("gdro_step: a step is already open (steps do not nest)")
    step = GDROStep(multipliers=table, settings=settings, rows=rows,
                    norm_adv_by_std=None if norm_adv_by_std is None else bool(norm_adv_by_std))
    token = _CURRENT.set(step)
    try:
        yield step
    finally:
        _CURRENT.reset(token)


def current_step() -> GDROStep | None:
    """The open step, or None (the estimator then runs standalone)."""
    return _CURRENT.get()
