"""Online difficulty classifier (docs/algorithm.md section 1, paper section 3.1): per prompt (a stable
int64 uid) the last ``window`` visits' (successes, trials), a pass@k estimate and a difficulty bin with
hysteresis (bin 0 = hardest). Classify before step t, observe after it.

Why the storage looks like this (issue 2 / issue 6 scale targets): a step costs O(batch * window) however
many prompts were seen (uid -> dense slot through a numpy hash table, :class:`_UidIndex`, not a dict of
~100 bytes per entry); history is at most ``2 * window`` uint8 bytes per prompt in rings that grow with
the visits (:class:`_VisitHistory`); the state is a flat dict of numpy arrays, the hash table rebuilt on load.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from itertools import repeat
from operator import attrgetter
from typing import Any

import numpy as np

ESTIMATORS = ("pooled", "any_of_n")
MAX_TRIALS_PER_VISIT = 255  # one visit's trials are uint8: a prompt gets at most n_max (12) rollouts a step
MAX_NUM_BINS = 127  # committed bins are int8, _NO_BIN meaning "no bin committed yet"
_STATE_VERSION = 1
_NO_BIN = -1


# ---- The spec's rules, one function each ----


@lru_cache(maxsize=16)
def _factor_offsets(k: int, ndim: int) -> np.ndarray:
    """j = 0..k-1 shaped to broadcast over an ``ndim``-dimensional estimate (read-only, shared)."""
    j = np.arange(k, dtype=np.float64).reshape((-1,) + (1,) * ndim)
    j.flags.writeable = False
    return j


def pooled_pass_at_k(successes: np.ndarray, trials: np.ndarray, k: int) -> np.ndarray:
    """Pooled pass@k of docs/algorithm.md section 1, for T >= 1. The binomial ratio is
    ``prod_{j<k} (T-S-j) / (T-j)``: factors in [0, 1], so no overflow, and 0 exactly when T-S < k."""
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(trials, dtype=np.float64)
    if k == 1:
        # Both branches reduce to S/T; dividing once keeps pass@1 exact (1 - (T-S)/T is not:
        # 1 - 160/200 = 0.19999999999999996 would fall below an edge at 0.2).
        return s / t
    if s.shape != t.shape:
        s, t = np.broadcast_arrays(s, t)
    # All k factors at once [k, prompts], clamped at 0 (rows with T < k are handled below); one
    # reduction gives the running product's bits (test_pooled_factor_table_is_bit_identical_to_the_running_product).
    j = _factor_offsets(int(k), t.ndim)
    factors = np.maximum((t - s) - j, 0.0)
    factors /= np.maximum(t - j, 1.0)
    ratio = np.multiply.reduce(factors, axis=0)
    if t.size == 0 or t.min() >= k:  # one reduction, no mask (the usual case)
        return 1.0 - ratio
    with np.errstate(divide="ignore", invalid="ignore"):
        small = 1.0 - (1.0 - s / t) ** k
    return np.where(t >= k, 1.0 - ratio, small)


def any_of_n_rate(visit_successes: np.ndarray, num_visits: np.ndarray) -> np.ndarray:
    """``any_of_n`` of docs/algorithm.md section 1: the window's share of visits with a success.
    Unvisited cells of ``visit_successes`` [prompts, window] are 0 and ``num_visits`` excludes them."""
    hits = np.count_nonzero(np.asarray(visit_successes) >= 1, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return hits / np.asarray(num_visits, dtype=np.float64)


# Estimates, edges and hysteresis thresholds are compared after rounding to 12 decimals, so an
# estimate mathematically on an edge lands on it (docs/algorithm.md, "Classifier (section 1)").
COMPARE_DECIMALS = 12


def snap(x: Any) -> np.ndarray:
    """Round to :data:`COMPARE_DECIMALS` decimals (the grid every bin comparison happens on)."""
    return np.round(np.asarray(x, dtype=np.float64), COMPARE_DECIMALS)


def raw_bin(p: np.ndarray, inner_edges: np.ndarray) -> np.ndarray:
    """Raw bin of estimates in [0, 1] (docs/algorithm.md section 1): the number of inner edges <= p,
    on the :func:`snap` grid."""
    return np.searchsorted(snap(inner_edges), snap(p), side="right").astype(np.int64)


def hysteresis_thresholds(full_edges: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Per committed bin c: (the estimate that moves it up, a_{c+1} + delta; the one below which it
    moves down, a_c - delta), on the :func:`snap` grid. Fixed for a classifier's lifetime."""
    full_edges = np.asarray(full_edges, dtype=np.float64)
    return snap(full_edges[1:] + delta), snap(full_edges[:-1] - delta)


def hysteresis_move(
    committed: np.ndarray, p: np.ndarray, raw: np.ndarray, full_edges: np.ndarray, delta: float,
    thresholds: tuple[np.ndarray, np.ndarray] | None = None, snapped: bool = False,
) -> np.ndarray:
    """Hysteresis rule of docs/algorithm.md section 1 as stated there (the reference
    :func:`_hysteresis_keep` is tested against): the bin each prompt moves to from ``committed``
    (< 0: none yet, take the raw bin). ``full_edges`` are 0, the inner edges, 1; ``thresholds``
    their :func:`hysteresis_thresholds` when kept; ``snapped``: ``p`` is on the snap grid already."""
    committed = np.asarray(committed, dtype=np.int64)
    up_at, down_at = hysteresis_thresholds(full_edges, delta) if thresholds is None else thresholds
    p = p if snapped else snap(p)
    has_bin = committed >= 0
    c = np.where(has_bin, committed, 0)
    up = (raw > c) & (p >= up_at[c])
    down = (raw < c) & (p < down_at[c])
    return np.where(~has_bin | up | down, raw, c).astype(np.int64)


def _hysteresis_keep(
    committed: np.ndarray, p: np.ndarray, raw: np.ndarray, thresholds: tuple[np.ndarray, np.ndarray],
    has_bin: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`hysteresis_move` for raw bins computed from snapped ``p``, in half the numpy calls:
    keep c while a_c - delta <= p < a_{c+1} + delta, else take the raw bin (the same rule, since
    raw > c implies p >= a_{c+1}, raw < c implies p < a_c: test_hysteresis_keep_equals_hysteresis_move).
    ``has_bin``: ``committed >= 0``, or None when every prompt has a bin."""
    up_at, down_at = thresholds
    if has_bin is None:
        keep = (p >= down_at[committed]) & (p < up_at[committed])
    else:
        committed = np.maximum(committed, 0)  # any bin for the prompts without one: keep is False there
        keep = (p >= down_at[committed]) & (p < up_at[committed]) & has_bin
    return np.where(keep, committed, raw).astype(np.int64, copy=False)


# ---- uid -> dense slot index: open addressing in one numpy array, probed vectorised over a batch ----

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
# Vectorised probe rounds before the few keys still probing finish in a scalar loop: a batch's
# cost would otherwise be set by its longest probe sequence (~log n at 1e7 keys).
_VECTOR_ROUNDS = 6
_SLOT_CACHE_MAX = 1 << 16  # slots remembered from recent lookups (_VisitHistory.slots): a few MB at most
_DENSE_UIDS = 1 << 22  # uids below this are also addressed directly (4 bytes each up to the largest: 16 MB)
_INSERT_CHUNK = 1 << 20  # keys per chunk of a bulk build or insert, so temporaries stay a few MB
MAX_PROMPTS = 2**31 - 2  # slots are stored as int32 (slot + 1) in the hash table


def _hash_uids(uids: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (spreads consecutive indices over the table), in place on one copy."""
    x = np.array(uids, dtype=np.int64).view(np.uint64)
    t = np.empty_like(x)
    for shift, mult in ((30, _MIX1), (27, _MIX2)):
        np.right_shift(x, np.uint64(shift), out=t)
        x ^= t
        x *= mult
    np.right_shift(x, np.uint64(31), out=t)
    x ^= t
    return x


class _UidIndex:
    """int64 uids -> dense slots in first-seen order: linear probing at load <= 1/2 in one int32
    array of ``slot + 1`` (0 = empty), vectorised over the batch per probe round; no deletions."""

    def __init__(self, capacity: int = 1024) -> None:
        self.table = np.zeros(max(1024, 1 << (int(capacity) - 1).bit_length()), dtype=np.int32)  # a power of 2
        self.size = 0

    def _start(self, keys: np.ndarray) -> np.ndarray:
        return (_hash_uids(keys) & np.uint64(self.table.size - 1)).astype(np.int64)

    def lookup(self, keys: np.ndarray, slot_uids: np.ndarray) -> np.ndarray:
        """Slot of each key, -1 where the key is not stored."""
        out = np.full(keys.size, -1, dtype=np.int64)
        if keys.size == 0 or self.size == 0:
            return out
        mask, table = self.table.size - 1, self.table
        pos = self._start(keys)
        todo = np.arange(keys.size)
        for _ in range(_VECTOR_ROUNDS):
            s = table[pos].astype(np.int64) - 1
            empty = s < 0
            found = ~empty & (slot_uids[np.maximum(s, 0)] == keys[todo])
            out[todo[found]] = s[found]
            keep = ~(empty | found)
            todo, pos = todo[keep], (pos[keep] + 1) & mask
            if todo.size == 0:
                return out
        for i, p in zip(todo.tolist(), pos.tolist()):
            key = int(keys[i])
            while (s := int(table[p]) - 1) >= 0:
                if int(slot_uids[s]) == key:
                    out[i] = s
                    break
                p = (p + 1) & mask
        return out

    def insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Insert absent, distinct keys with their slots."""
        if 2 * (self.size + keys.size) > self.table.size:
            raise AssertionError("_UidIndex.insert needs reserve() first")
        mask, table = self.table.size - 1, self.table
        for start in range(0, keys.size, _INSERT_CHUNK):
            pos = self._start(keys[start : start + _INSERT_CHUNK])
            value = slots[start : start + _INSERT_CHUNK].astype(np.int32) + 1
            for _ in range(_VECTOR_ROUNDS):
                if pos.size == 0:
                    break
                free = table[pos] == 0
                # Keys racing for one free cell: write all, read back who won; a loser re-reads the
                # cell next round, one that met an occupied cell moves on.
                table[pos[free]] = value[free]
                lost = table[pos] != value
                step = np.where(free[lost], 0, 1)
                pos, value = (pos[lost] + step) & mask, value[lost]
            for p, v in zip(pos.tolist(), value.tolist()):
                while int(table[p]) != 0:
                    p = (p + 1) & mask
                table[p] = v
        self.size += keys.size

    @classmethod
    def build(cls, keys: np.ndarray, capacity: int, check_duplicates: bool = False) -> _UidIndex:
        """A fresh index of ``keys[i] -> i`` built by sorting, not probing (random probes into 1e7+
        cells miss cache): sorted by home cell, linear probing's placement is the running maximum
        pos_i = max(home_i, pos_{i-1} + 1); keys past the table's end take the probing insert."""
        index = cls(capacity)
        n = keys.size
        if check_duplicates and _has_duplicates(keys):
            raise ValueError("classifier state 'uids' holds duplicates")
        mask = index.table.size - 1
        packed = np.empty(n, dtype=np.uint64)
        for start in range(0, n, _INSERT_CHUNK):
            stop = min(n, start + _INSERT_CHUNK)
            home = _hash_uids(keys[start:stop]) & np.uint64(mask)
            np.left_shift(home, np.uint64(32), out=packed[start:stop])
            packed[start:stop] |= np.arange(start, stop, dtype=np.uint64)
        packed.sort()
        carry = np.iinfo(np.int64).min
        overflow: list[np.ndarray] = []
        for start in range(0, n, _INSERT_CHUNK):
            stop = min(n, start + _INSERT_CHUNK)
            chunk = packed[start:stop]
            rank = np.arange(start, stop, dtype=np.int64)
            run = (chunk >> np.uint64(32)).astype(np.int64) - rank
            run[0] = max(int(run[0]), carry)
            np.maximum.accumulate(run, out=run)
            carry = int(run[-1])
            pos = run + rank
            slot = (chunk & np.uint64(0xFFFFFFFF)).astype(np.int32)
            fits = pos <= mask
            index.table[pos[fits]] = slot[fits] + 1
            if not fits.all():
                overflow.append(slot[~fits].astype(np.int64))
        rest = np.concatenate([np.zeros(0, dtype=np.int64), *overflow])
        index.size = n - rest.size
        index.insert(keys[rest], rest)
        return index

    def reserve(self, n: int, slot_uids: np.ndarray) -> None:
        """Make room for ``n`` stored keys (load <= 1/2), rehashing ``slot_uids[:size]`` if needed."""
        if n > MAX_PROMPTS:
            raise ValueError(f"the classifier holds at most {MAX_PROMPTS} prompts, asked for {n}")
        if 2 * n > self.table.size:  # the next power of 2 >= 2n, larger than the table
            rebuilt = _UidIndex.build(slot_uids[: self.size], 2 * n)
            self.table, self.size = rebuilt.table, rebuilt.size


# ---- Argument checks (ValueErrors naming the argument and the allowed range) ----


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not integral or int(value) < low or (high is not None and int(value) > high):
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {rng}, got {int(value) if integral else repr(value)}")
    return int(value)


def int_array(name: str, values: Any, integral_floats: bool = False, num_bins: int | None = None) -> np.ndarray:
    """``values`` as a 1-D int64 array or a ValueError naming ``name``: the math floor's one check of
    id and bin arrays (``integral_floats``: 2.0 passes as 2; ``num_bins``: values in [0, num_bins))."""
    if type(values) is np.ndarray and values.dtype == np.int64 and values.ndim == 1:
        arr = values  # the controller's arrays, every step: nothing to convert
    else:
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise ValueError(f"{name} must be a 1-D integer array, got shape {arr.shape}")
        if arr.size and not (np.issubdtype(arr.dtype, np.integer) or (integral_floats and _integral(arr))):
            raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} must fit in int64")
        arr = arr.astype(np.int64, copy=False)
    if num_bins is not None and arr.size and (arr.min() < 0 or arr.max() >= num_bins):
        raise ValueError(f"{name} must lie in [0, num_bins={num_bins}), got values in [{arr.min()}, {arr.max()}]")
    return arr


def _integral(arr: np.ndarray) -> bool:
    """Whether a float or object array holds finite integral values only (2.0, not 2.5, NaN, True or "2")."""
    if arr.dtype != object and not np.issubdtype(arr.dtype, np.floating):
        return False
    try:
        as_float = arr.astype(np.float64)
    except (TypeError, ValueError):
        return False
    return bool(np.all(np.isfinite(as_float)) and np.all(as_float == np.round(as_float)))


def _has_duplicates(values: np.ndarray) -> bool:
    """Sort-based duplicate check (np.unique hashes int64 and is ~50x slower at 1e6 entries)."""
    if bool((values[1:] > values[:-1]).all()):  # strictly increasing (a sorted step, or < 2 values): no sort needed
        return False
    ordered = np.sort(values)
    return bool(np.any(ordered[1:] == ordered[:-1]))


_CHUNK_ROWS = 1 << 16


def _ring_blocks(lengths: np.ndarray, width: int) -> Iterator[tuple[slice, np.ndarray | None, slice]]:
    """Cache-sized blocks of ring rows for packing row i's first ``lengths[i]`` cells into one flat
    array: (rows, the mask of those cells or None when all are full, their place in the flat array)."""
    cols = np.arange(width)
    pos = 0
    for start in range(0, lengths.size, _CHUNK_ROWS):
        m = lengths[start : start + _CHUNK_ROWS]
        count = int(m.sum())
        yield slice(start, start + m.size), None if m.min() == width else cols[None, :] < m[:, None], slice(pos, pos + count)
        pos += count


def _validate_edges(bin_edges: Any, num_bins: Any) -> np.ndarray:
    """The inner edges, checked; ``num_bins`` must agree with them or stay at its default 10."""
    num_bins = _check_int("num_bins", num_bins, 1, MAX_NUM_BINS)
    if bin_edges is None:
        return np.arange(1, num_bins, dtype=np.float64) / num_bins
    try:
        edges = np.asarray(bin_edges, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"bin_edges must be a sequence of floats, got {bin_edges!r}") from err
    if edges.ndim != 1:
        raise ValueError(f"bin_edges must be a 1-D sequence of inner edges, got shape {edges.shape}")
    if edges.size + 1 > MAX_NUM_BINS:
        raise ValueError(f"bin_edges defines {edges.size + 1} bins; at most {MAX_NUM_BINS} allowed")
    if edges.size and (not np.all(np.isfinite(edges)) or edges.min() <= 0.0 or edges.max() >= 1.0):
        raise ValueError(
            f"bin_edges must be inner edges strictly inside (0, 1) (leave out 0 and 1), got {edges.tolist()}"
        )
    if np.any(np.diff(edges) <= 0):
        raise ValueError(f"bin_edges must be strictly increasing, got {edges.tolist()}")
    implied = edges.size + 1
    if num_bins != implied and num_bins != 10:
        raise ValueError(
            f"num_bins={num_bins} disagrees with bin_edges: {edges.size} inner edges define "
            f"{implied} bins (pass num_bins={implied} or leave it at its default)"
        )
    return edges


#: the per-prompt arrays of :class:`_VisitHistory` beside the rings: (dtype, the value of an unused slot)
_COLUMNS = {"uids": (np.int64, 0), "visits": (np.int64, 0), "succ_sum": (np.int64, 0), "trials_sum": (np.int64, 0),
            "bin": (np.int8, _NO_BIN)}


class _VisitHistory:
    """Every seen prompt's last ``window`` visits by slot: uint8 rings ``[slots, width]`` (width and
    rows grow by doubling; unvisited cells are 0) with their window sums kept in step, the visit
    counter, the committed bin, and three uid -> slot maps: the hash index, a direct-address table
    while every uid is in [0, :data:`_DENSE_UIDS`), and a cache of recent lookups."""

    def __init__(self, window: int, capacity: int = 0, width: int = 1, index: _UidIndex | None = None) -> None:
        self.window, self.n, self.cap, self.width = window, 0, 0, width
        self.succ = self.trials = np.zeros((0, width), dtype=np.uint8)
        for name, (dtype, _) in _COLUMNS.items():
            setattr(self, name, np.zeros(0, dtype=dtype))
        self.resize(capacity, width)
        self.index = _UidIndex(2 * capacity) if index is None else index
        self.slot_cache: dict[int, int] = {}
        self.dense: np.ndarray | None = np.zeros(0, dtype=np.int32)  # slot + 1 by uid; None: a uid outside

    def resize(self, capacity: int, width: int) -> None:
        """Reallocate to ``capacity`` rows of ``width`` columns, keeping the contents (no ring has
        wrapped before it is ``window`` wide, so visit v stays in column v)."""
        n, w = self.n, self.width

        def moved(arr: np.ndarray, fill: int, shape: tuple[int, ...]) -> np.ndarray:
            # np.zeros where possible: the OS hands out zero pages lazily.
            out = np.zeros(shape, dtype=arr.dtype) if fill == 0 else np.full(shape, fill, dtype=arr.dtype)
            if arr.ndim == 1 or shape[1] == w:
                out[:n] = arr[:n]  # one contiguous block
            elif w <= 4:  # narrow rings: a strided copy per column beats numpy's per-row overhead (~6x)
                for j in range(w):
                    out[:n, j] = arr[:n, j]
            else:
                out[:n, :w] = arr[:n, :w]
            return out

        self.succ = moved(self.succ, 0, (capacity, width))
        self.trials = moved(self.trials, 0, (capacity, width))
        if capacity != self.cap:
            for name, (_, fill) in _COLUMNS.items():
                setattr(self, name, moved(getattr(self, name), fill, (capacity,)))
        self.cap, self.width = capacity, width

    def reserve(self, rows: int, width: int) -> None:
        """Make room for ``rows`` prompts and ``width`` ring columns (width <= window)."""
        cap = max(rows, 2 * self.cap, 64) if rows > self.cap else self.cap
        w = min(self.window, max(width, 2 * self.width)) if width > self.width else self.width
        if (cap, w) != (self.cap, self.width):
            self.resize(cap, w)
        self.index.reserve(rows, self.uids)

    def index_dense(self, uids: np.ndarray, slots: np.ndarray) -> None:
        """Add uids to the direct-address table, or drop it until the next load for one outside it."""
        dense = self.dense
        if dense is None or uids.size == 0:
            return
        low, high = int(uids.min()), int(uids.max())
        if low < 0 or high >= _DENSE_UIDS:
            self.dense = None
            return
        if high >= dense.size:
            grown = min(_DENSE_UIDS, max(high + 1, 2 * dense.size, 1024))
            self.dense = dense = np.concatenate([dense, np.zeros(grown - dense.size, dtype=np.int32)])
        dense[uids] = slots.astype(np.int32) + 1

    def slots(self, uids: np.ndarray) -> np.ndarray:
        """Slot of each uid (-1: never observed): one gather from the direct-address table, else
        the hash index with a cache of the slots found (a step looks its prompts up twice)."""
        dense = self.dense
        if dense is not None:
            if uids.size and uids.min() >= 0 and uids.max() < dense.size:  # two reductions, no mask
                return np.subtract(dense[uids], 1, dtype=np.int64)
            inside = (uids >= 0) & (uids < dense.size)
            slots = np.full(uids.size, -1, dtype=np.int64)
            slots[inside] = dense[uids[inside]].astype(np.int64) - 1
            return slots
        cache = self.slot_cache
        if not cache:
            slots = self.index.lookup(uids, self.uids)
        else:
            slots = np.fromiter(map(cache.get, uids.tolist(), repeat(-1)), dtype=np.int64, count=uids.size)
            miss = slots < 0
            if not miss.any():
                return slots
            slots[miss] = self.index.lookup(uids[miss], self.uids)
        found = slots >= 0
        if len(cache) + uids.size > _SLOT_CACHE_MAX:
            cache.clear()
        cache.update(zip(uids[found].tolist(), slots[found].tolist()))
        return slots

    def push(self, u: np.ndarray, s: np.ndarray, t: np.ndarray) -> None:
        """Write one visit per prompt (inputs as :meth:`OnlineDifficultyClassifier.observe_prepared` takes)."""
        slots = self.slots(u)
        new = slots < 0
        n_new = int(new.sum())
        old = slots[~new]
        need_width = min(self.window, int(self.visits[old].max()) + 1) if old.size else 1
        self.reserve(self.n + n_new, need_width)
        if n_new:
            new_slots = np.arange(self.n, self.n + n_new, dtype=np.int64)
            self.uids[new_slots] = u[new]
            self.index.insert(u[new], new_slots)
            self.index_dense(u[new], new_slots)
            slots[new] = new_slots
            self.n += n_new
        # the ring column of this visit (before the ring is window wide none has wrapped: v % window == v)
        col = self.visits[slots] % self.window
        # the cell this visit overwrites (0 until the ring wraps) leaves the window sums
        for ring, sums, x in ((self.succ, self.succ_sum, s), (self.trials, self.trials_sum, t)):
            sums[slots] += x - ring[slots, col]
            ring[slots, col] = x
        self.visits[slots] += 1

    def decayed(self, slots: np.ndarray, decay: float) -> tuple[np.ndarray, np.ndarray]:
        """(successes, trials) of each slot's window, visit of age a weighted by ``decay ** a``."""
        cols = np.arange(self.width, dtype=np.int64)[None, :]
        # column c of a prompt with v visits holds the visit of age (v - 1 - c) mod W; empty cells are 0
        w = decay ** ((self.visits[slots][:, None] - 1 - cols) % self.window)
        return (w * self.succ[slots]).sum(axis=1), (w * self.trials[slots]).sum(axis=1)

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-prompt part of the classifier's state (copies; the rings packed, see ``state_dict``)."""
        n = self.n
        lengths = np.minimum(self.visits[:n], self.window)
        succ, trials = np.empty(int(lengths.sum()), dtype=np.uint8), np.empty(int(lengths.sum()), dtype=np.uint8)
        for rows, mask, cells in _ring_blocks(lengths, self.width):
            for flat, ring in ((succ, self.succ), (trials, self.trials)):
                flat[cells] = ring[rows].ravel() if mask is None else ring[rows][mask]
        return {"uids": self.uids[:n].copy(), "visits": self.visits[:n].copy(), "committed_bin": self.bin[:n].copy(),
                "successes": succ, "trials": trials}

    @classmethod
    def restored(cls, window: int, arrays: Sequence[np.ndarray]) -> _VisitHistory:
        """A history holding checked checkpoint arrays, :func:`_checked_arrays` (the inverse of :meth:`arrays`)."""
        uids, visits, committed, succ, trials = arrays
        n = uids.shape[0]
        recorded = np.minimum(visits, window)
        # Building the index is the duplicate check, before anything of the classifier changes.
        index = _UidIndex.build(uids, 2 * n, check_duplicates=True)
        h = cls(window, n, max(1, int(recorded.max())) if n else 1, index)
        h.n = n
        h.uids[:], h.visits[:], h.bin[:] = uids, visits, committed
        h.index_dense(h.uids[:n], np.arange(n, dtype=np.int64))
        for rows, mask, cells in _ring_blocks(recorded, h.width):  # blocks keep the int64 temporaries small
            for flat, ring, sums in ((succ, h.succ, h.succ_sum), (trials, h.trials, h.trials_sum)):
                block = ring[rows]
                if mask is None:
                    block[...] = flat[cells].reshape(block.shape)
                else:
                    block[mask] = flat[cells]
                sums[rows] = block.sum(axis=1, dtype=np.int64)
        return h


#: each setting a state is saved under: (its type in the classifier, its dtype in the state; None: numpy's)
_CONFIG = {"bin_edges": (np.asarray, np.float64), "window": (int, np.int64), "hysteresis": (float, np.float64),
           "k": (int, np.int64), "estimator": (str, None), "unseen_bin": (int, np.int64)}
_ARRAY_KEYS = ("uids", "visits", "committed_bin", "successes", "trials")
_STATE_KEYS = ("version", *_CONFIG, *_ARRAY_KEYS)


def _check_saved_config(state: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """Refuse a state with missing keys, another version, or settings other than ``mine`` (each named)."""
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"classifier state is missing keys {missing}")
    version = int(np.asarray(state["version"]))
    if version != _STATE_VERSION:
        raise ValueError(f"classifier state has version {version}; this code reads version {_STATE_VERSION}")
    saved = {key: read(np.asarray(state[key], dtype=np.float64) if key == "bin_edges" else np.asarray(state[key]))
             for key, (read, _) in _CONFIG.items()}
    differ = []
    for key, value in saved.items():
        if not (np.array_equal(value, mine[key]) if key == "bin_edges" else value == mine[key]):
            shown, ours = (v.tolist() if isinstance(v, np.ndarray) else v for v in (value, mine[key]))
            differ.append(f"{key}: saved {shown!r}, configured {ours!r}")
    if differ:
        raise ValueError("classifier state comes from a differently configured classifier: " + "; ".join(differ))


def _checked_arrays(state: Mapping[str, Any], window: int, num_bins: int) -> tuple[np.ndarray, ...]:
    """(uids, visits, committed_bin, successes, trials) of a state, each checked for shape, dtype and range."""
    uids, visits, cbin, succ, trials = (np.asarray(state[key]) for key in _ARRAY_KEYS)
    n = uids.shape[0] if uids.ndim == 1 else -1
    for key, arr, dtype in (("uids", uids, np.int64), ("visits", visits, np.int64), ("committed_bin", cbin, np.int8)):
        if n < 0 or arr.shape != (n,) or arr.dtype != dtype:
            raise ValueError(
                f"classifier state {key!r} must be a 1-D {np.dtype(dtype).name} array with one entry "
                f"per prompt, got {arr.dtype} of shape {arr.shape}"
            )
    if n and visits.min() < 1:
        raise ValueError("classifier state 'visits' must be >= 1 for every stored prompt")
    total = int(np.minimum(visits, window).sum())
    for key, arr in (("successes", succ), ("trials", trials)):
        if arr.shape != (total,) or arr.dtype != np.uint8:
            raise ValueError(
                f"classifier state {key!r} must be a 1-D uint8 array of sum(min(visits, window)) = "
                f"{total} entries, got {arr.dtype} of shape {arr.shape}"
            )
    if n:
        if cbin.min() < _NO_BIN or cbin.max() >= num_bins:
            raise ValueError(f"classifier state 'committed_bin' must be in [-1, {num_bins - 1}]")
        if trials.min() < 1:
            raise ValueError("classifier state 'trials' must be >= 1 for every recorded visit")
        chunk = 1 << 22  # np.any(succ > trials) without a full-size boolean temporary
        if any(np.any(succ[i : i + chunk] > trials[i : i + chunk]) for i in range(0, succ.size, chunk)):
            raise ValueError("classifier state 'successes' exceeds 'trials'")
    if n > MAX_PROMPTS:
        raise ValueError(f"classifier state holds {n} prompts; at most {MAX_PROMPTS} allowed")
    return uids, visits, cbin, succ, trials


class OnlineDifficultyClassifier:
    """Per-prompt sliding-window pass@k estimate and hysteresis bins (docs/algorithm.md section 1).
    ``bin_edges``: inner edges strictly inside (0, 1), or None for ``num_bins`` equal bins (with edges,
    ``num_bins`` must agree or stay at its default: defect 6 of docs/algorithm.md); ``hysteresis`` must be
    below the narrowest bin; ``unseen_bin`` is reported, not committed, for a prompt never observed."""

    def __init__(
        self,
        bin_edges: Sequence[float] | np.ndarray | None = None,
        num_bins: int = 10,
        window: int = 100,
        hysteresis: float = 0.03,
        k: int = 8,
        estimator: str = "pooled",
        unseen_bin: int = 0,
    ) -> None:
        edges = _validate_edges(bin_edges, num_bins)
        self._bin_edges = edges
        self._num_bins = edges.size + 1
        self._full_edges = np.concatenate([[0.0], edges, [1.0]])
        self._window = _check_int("window", window, 1)
        self._k = _check_int("k", k, 1)
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {list(ESTIMATORS)}, got {estimator!r}")
        self._estimator = str(estimator)
        narrowest = float(np.diff(self._full_edges).min())
        if (isinstance(hysteresis, bool) or not isinstance(hysteresis, numbers.Real) or not np.isfinite(hysteresis)
                or not 0.0 <= float(hysteresis) < narrowest):
            raise ValueError(
                f"hysteresis must be in [0, {narrowest:g}) (smaller than the narrowest bin), got {hysteresis!r}"
            )
        self._hysteresis = float(hysteresis)
        self._thresholds = hysteresis_thresholds(self._full_edges, self._hysteresis)
        self._snapped_edges = snap(edges)  # raw_bin's edges on the snap grid, fixed like the thresholds
        self._unseen_bin = _check_int("unseen_bin", unseen_bin, 0, self._num_bins - 1)
        self._history = _VisitHistory(self._window)

    # -- configuration: read-only views of the settings ---------------------------------------

    num_bins = property(attrgetter("_num_bins"), doc="B, the number of bins.")
    window = property(attrgetter("_window"), doc="H, the visits kept per prompt.")
    k = property(attrgetter("_k"), doc="k of pass@k.")
    hysteresis = property(attrgetter("_hysteresis"), doc="delta, the hysteresis margin.")
    estimator = property(attrgetter("_estimator"), doc="One of :data:`ESTIMATORS`.")
    unseen_bin = property(attrgetter("_unseen_bin"), doc="The bin reported for a prompt never observed.")
    num_seen = property(attrgetter("_history.n"), doc="Number of distinct prompts observed at least once.")
    bin_edges = property(lambda self: self._bin_edges.copy(), doc="The B-1 inner edges (a copy).")
    _config = property(lambda self: {key: getattr(self, f"_{key}") for key in _CONFIG}, doc="The saved settings.")

    def memory_bytes(self) -> int:
        """Bytes held by the arrays (allocated capacity, including the uid hash table)."""
        h = self._history
        arrays = [h.succ, h.trials, h.index.table, *(getattr(h, name) for name in _COLUMNS)]
        return int(sum(a.nbytes for a in arrays)) + (0 if h.dense is None else h.dense.nbytes)

    # -- the step API ----------------------------------------------------------------------

    def observe(self, uids: Any, successes: Any, trials: Any) -> None:
        """Push one visit per distinct prompt (``successes`` of ``trials`` <= 255 rollouts); all is
        checked before anything is written, so a rejected call changes nothing."""
        u, s, t = (int_array(name, v) for name, v in (("uids", uids), ("successes", successes), ("trials", trials)))
        if not (u.size == s.size == t.size):
            raise ValueError(f"uids, successes and trials must have equal lengths, got {u.size}, {s.size}, {t.size}")
        if u.size == 0:
            return
        if _has_duplicates(u):
            raise ValueError("uids must be distinct within one observe() call (one visit per prompt per step)")
        if t.min() < 1 or t.max() > MAX_TRIALS_PER_VISIT:
            raise ValueError(f"trials must be in [1, {MAX_TRIALS_PER_VISIT}] per visit, got range [{t.min()}, {t.max()}]")
        if s.min() < 0 or np.any(s > t):
            raise ValueError("successes must be in [0, trials] for every prompt")
        self.observe_prepared(u, s, t)

    def observe_prepared(self, uids: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        """:meth:`observe` without its checks, for inputs the controller builds valid every step:
        int64 1-D arrays of one length >= 1, distinct ``uids``, 1 <= trials <= 255, 0 <= s <= t."""
        self._history.push(uids, successes, trials)

    def _per_uid(
        self, uids: Any, fill: float, dtype: type, read: Callable[[np.ndarray], Sequence[np.ndarray]], count: int = 1
    ) -> tuple[np.ndarray, ...]:
        """``count`` arrays of ``dtype`` per uid: ``read(slots)`` where observed before, else ``fill``."""
        slots = self._history.slots(int_array("uids", uids))
        if slots.size and slots.min() >= 0:  # every uid seen before (the usual step): no masks
            return tuple(np.asarray(values, dtype=dtype) for values in read(slots))
        seen = slots >= 0
        outs = tuple(np.full(seen.size, fill, dtype=dtype) for _ in range(count))
        if seen.any():
            for out, values in zip(outs, read(slots[seen])):
                out[seen] = values
        return outs

    def _estimate_slots(self, slots: np.ndarray) -> np.ndarray:
        """Estimate for existing slots (all with >= 1 visit), on the :func:`snap` grid."""
        h = self._history
        if self._estimator == "pooled":
            return snap(pooled_pass_at_k(h.succ_sum[slots], h.trials_sum[slots], self._k))
        return snap(any_of_n_rate(h.succ[slots], np.minimum(h.visits[slots], self._window)))

    def pass_at_k(self, uids: Any) -> np.ndarray:
        """The section-1 estimate per uid on the :func:`snap` grid (the values the bins come from); NaN
        for a uid never observed."""
        return self._per_uid(uids, np.nan, np.float64, lambda sl: (self._estimate_slots(sl),))[0]

    def window_counts(self, uids: Any) -> tuple[np.ndarray, ...]:
        """(successes, trials) per uid pooled over its window, (0, 0) if never observed: what a
        per-prompt allocator reads (:func:`verl_gdro.rollout_gdro.smoothed_rate`)."""
        return self._per_uid(uids, 0, np.int64, lambda sl: (self._history.succ_sum[sl], self._history.trials_sum[sl]), 2)

    def decayed_counts(self, uids: Any, decay: float) -> tuple[np.ndarray, ...]:
        """:meth:`window_counts` with the visit of age a weighted by ``decay ** a``, to follow a
        policy that has just learned a prompt; read from the rings, so it adds no state."""
        if not (isinstance(decay, (int, float, np.floating)) and 0.0 < float(decay) <= 1.0):
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        return self._per_uid(uids, 0.0, np.float64, lambda sl: self._history.decayed(sl, float(decay)), 2)

    def raw_bins(self, p: Any) -> np.ndarray:
        """Raw bin of each estimate in ``p`` (no hysteresis): the number of inner edges <= p."""
        arr = np.asarray(p, dtype=np.float64)
        if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0):
            raise ValueError("p must hold finite estimates in [0, 1]")
        return raw_bin(arr, self._bin_edges)

    def bins(self, uids: Any) -> np.ndarray:
        """Current bin per uid (repeats allowed), with hysteresis against the committed bin, committed;
        ``unseen_bin``, not committed, for a uid never observed. Idempotent without a new visit."""
        return self._per_uid(uids, self._unseen_bin, np.int64, lambda sl: (self._classify_slots(sl),))[0]

    def _classify_slots(self, sl: np.ndarray) -> np.ndarray:
        """Bins of existing slots with hysteresis against their committed bins, committed."""
        p = self._estimate_slots(sl)  # on the snap grid: raw_bin(p, edges) without rounding p and the edges again
        raw = np.searchsorted(self._snapped_edges, p, side="right").astype(np.int64, copy=False)
        committed = self._history.bin[sl]
        # every prompt has a bin (late in training), or some are classified for the first time
        has_bin = None if committed.size == 0 or committed.min() >= 0 else committed >= 0
        moved = _hysteresis_keep(committed, p, raw, self._thresholds, has_bin)
        self._history.bin[sl] = moved
        return moved

    def committed_bins(self, uids: Any) -> np.ndarray:
        """The last committed bin per uid without classifying (-1 = none yet / never seen)."""
        return self._per_uid(uids, _NO_BIN, np.int64, lambda sl: (self._history.bin[sl],))[0]

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """A snapshot as a flat dict of numpy array copies (``np.savez(**state)`` works): per prompt in
        first-seen order ``uids``, ``visits`` and ``committed_bin`` (-1 = none), and the rings packed:
        prompt i's first ``min(visits_i, window)`` ring columns in flat uint8 ``successes``/``trials``."""
        return {
            "version": np.asarray(_STATE_VERSION, dtype=np.int64),
            **{key: np.array(value, dtype=_CONFIG[key][1]) for key, value in self._config.items()},
            **self._history.arrays(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (also via ``np.load``), all or nothing; a state saved under
        other settings (named) or with malformed arrays is refused."""
        _check_saved_config(state, self._config)
        self._history = _VisitHistory.restored(self._window, _checked_arrays(state, self._window, self._num_bins))

    def __repr__(self) -> str:
        shown = ("num_bins", "window", "hysteresis", "k", "estimator", "unseen_bin", "num_seen")
        return f"OnlineDifficultyClassifier({', '.join(f'{key}={getattr(self, key)!r}' for key in shown)})"
