"""Online difficulty classifier (docs/algorithm.md section 1, paper section 3.1).

Every prompt (a stable int64 uid: the dataset row index) keeps its last ``window`` visits, each
visit being (successes, trials) of that step's training rollouts. From them the classifier
estimates pass@k and sorts the prompt into one of ``num_bins`` difficulty bins (bin 0 = hardest),
with hysteresis so that a prompt near an edge does not flip back and forth every step.

Why the data structures look like this (issue 2 / issue 6 scale targets):

- Cost per step is O(batch * window) and independent of how many prompts were ever seen. uids are
  sparse, so they are mapped to dense *slots* by an open-addressing hash table held in one numpy
  array (:class:`_UidIndex`), probed vectorised over the batch; a Python dict of ten million
  entries would cost ~100 bytes per prompt and seconds to rebuild on every resume.
- Memory is at most ``2 * window`` bytes of history per seen prompt (uint8 successes and trials
  in a ring buffer ``[slots, width]``), plus an 8-byte uid, an 8-byte visit counter, a 1-byte
  committed bin and the hash table. Rows grow by amortised doubling, and so does the ring width,
  from 1 up to ``window`` as prompts accumulate visits: a million prompts seen once cost a few
  bytes of history each. Unvisited ring cells are zero, so sums over a row are window sums.
- ``state_dict`` is a flat dict of numpy arrays (``np.savez(path, **state)`` works as is); the
  hash table is not saved but rebuilt on load, so the saved state does not depend on it.

Order within step t (docs/algorithm.md section 1): ``bins(uids)`` with the history up to t-1, use those bins for
every decision of step t, then ``observe(...)`` step t's visit.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from itertools import repeat
from typing import Any

import numpy as np

__all__ = [
    "ESTIMATORS",
    "MAX_TRIALS_PER_VISIT",
    "OnlineDifficultyClassifier",
    "COMPARE_DECIMALS",
    "any_of_n_rate",
    "hysteresis_move",
    "hysteresis_thresholds",
    "pooled_pass_at_k",
    "raw_bin",
    "snap",
]

ESTIMATORS = ("pooled", "any_of_n")
# One visit's trials are stored as uint8: a prompt gets at most n_max (12) rollouts per step.
MAX_TRIALS_PER_VISIT = 255
# Committed bins are stored as int8 with -1 meaning "no bin committed yet".
MAX_NUM_BINS = 127
_STATE_VERSION = 1
_NO_BIN = -1


# ---------------------------------------------------------------------------------------------
# The spec's rules, one function each.
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=16)
def _factor_offsets(k: int, ndim: int) -> np.ndarray:
    """j = 0..k-1 shaped to broadcast over an ``ndim``-dimensional estimate (read-only, shared)."""
    j = np.arange(k, dtype=np.float64).reshape((-1,) + (1,) * ndim)
    j.flags.writeable = False
    return j


def pooled_pass_at_k(successes: np.ndarray, trials: np.ndarray, k: int) -> np.ndarray:
    """Pooled pass@k of docs/algorithm.md section 1 (``passk_estimator: pooled``): with S successes
    out of T trials summed over the window, ``1 - C(T-S, k) / C(T, k)`` when T >= k, else
    ``1 - (1 - S/T)^k``.

    The binomial ratio is evaluated as ``prod_{j<k} (T-S-j) / (T-j)``: every factor is in [0, 1],    so there is no overflow, and a zero factor appears exactly when T-S < k (estimate 1).
    T must be >= 1 (callers return NaN for prompts without a visit).
    """
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(trials, dtype=np.float64)
    if k == 1:
        # Both branches reduce to S/T; dividing once keeps pass@1 exact (1 - (T-S)/T is not:
        # 1 - 160/200 = 0.19999999999999996 would fall below an edge at 0.2).
        return s / t
    if s.shape != t.shape:
        s, t = np.broadcast_arrays(s, t)
    # All k factors at once, [k, prompts], clamped at 0 so factors past a zero stay 0 (rows with
    # T < k are handled below). A reduction over the leading axis multiplies whole rows in index
    # order: the running product's bits in one call instead of k - 1
    # (test_pooled_factor_table_is_bit_identical_to_the_running_product).
    j = _factor_offsets(int(k), t.ndim)
    factors = np.maximum((t - s) - j, 0.0)
    factors /= np.maximum(t - j, 1.0)
    ratio = np.multiply.reduce(factors, axis=0)
    if t.size == 0 or t.min() >= k:  # one reduction, no mask (the usual case)
        return 1.0 - ratio
    big = t >= k
    with np.errstate(divide="ignore", invalid="ignore"):
        small = 1.0 - (1.0 - s / t) ** k
    return np.where(big, 1.0 - ratio, small)


def any_of_n_rate(visit_successes: np.ndarray, num_visits: np.ndarray) -> np.ndarray:
    """``any_of_n`` estimate of docs/algorithm.md section 1 (the released patch's behaviour).

    The mean over the window of 1[the visit had at least one success]. ``visit_successes`` is
    ``[prompts, window]`` with unvisited cells equal to 0 (they count as no success, and are
    excluded by dividing by ``num_visits``, the number of visits inside the window).
    """
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
    """Raw bin of an estimate (docs/algorithm.md section 1): the number of inner edges <= p.

    Bin b holds estimates in [a_b, a_{b+1}); 1.0 falls in the last bin because it is >= every
    inner edge. Estimates must lie in [0, 1] (checked by the caller). Compared on the
    :func:`snap` grid.
    """
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
    """Hysteresis rule of docs/algorithm.md section 1: the bin a prompt moves to from its committed bin.

    From committed bin c (edges a_c, a_{c+1}) with raw bin r != c, the prompt moves only when the
    estimate passes the boundary by ``delta``: up needs p >= a_{c+1} + delta, down needs
    p < a_c - delta; a move goes straight to r. ``committed`` < 0 means no bin was committed yet
    (first classification after the first visit): the raw bin, without hysteresis. ``full_edges``
    are 0, the inner edges, 1. Compared on the :func:`snap` grid.

    ``thresholds``: :func:`hysteresis_thresholds` of ``full_edges`` and ``delta``, when the caller
    keeps them (the classifier computes them once, not per prompt per step). ``snapped``: ``p`` is
    on the :func:`snap` grid already (the classifier's estimates are), so it is not rounded again;
    :func:`snap` is idempotent on [0, 1] (``test_snap_is_idempotent``), so the bins are the same.

    The classifier applies the equivalent keep rule of :func:`_hysteresis_keep` (its raw bins
    come from ``p``); this is the rule as the spec states it, the reference that one is tested against.
    """
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
    """:func:`hysteresis_move` for raw bins computed from ``p`` on the snap grid (what the
    classifier holds), in about half the numpy calls. ``has_bin``: which prompts have a committed
    bin (``committed >= 0``), or None when all have one; a prompt without one takes its raw bin.

    A prompt keeps its bin c exactly while a_c - delta <= p < a_{c+1} + delta, and otherwise moves
    to its raw bin. That is hysteresis_move's rule: raw > c implies p >= a_{c+1} >= a_c - delta,
    so it moves iff p >= a_{c+1} + delta; raw < c implies p < a_c <= a_{c+1} + delta, so it moves
    iff p < a_c - delta; raw == c keeps c either way (snap is monotone, so the order of the
    thresholds and edges holds on the grid). ``test_hysteresis_keep_equals_hysteresis_move``.
    """
    up_at, down_at = thresholds
    if has_bin is None:
        keep = (p >= down_at[committed]) & (p < up_at[committed])
    else:
        committed = np.maximum(committed, 0)  # any bin for the prompts without one: keep is False there
        keep = (p >= down_at[committed]) & (p < up_at[committed]) & has_bin
    return np.where(keep, committed, raw).astype(np.int64, copy=False)


# ---------------------------------------------------------------------------------------------
# uid -> dense slot index: open addressing in one numpy array, probed vectorised over a batch.
# ---------------------------------------------------------------------------------------------

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
# Vectorised probe rounds before the few keys still probing finish in a scalar loop: a batch's
# cost would otherwise be set by its longest probe sequence (~log n at 1e7 keys).
_VECTOR_ROUNDS = 6
# Slots remembered from recent lookups (OnlineDifficultyClassifier._slots): a few MB at most.
_SLOT_CACHE_MAX = 1 << 16
# uids below this are also addressed directly (4 bytes per uid up to the largest stored: 16 MB at most)
_DENSE_UIDS = 1 << 22
# Bulk inserts (checkpoint load, rehash) go in chunks so temporaries stay a few MB.
_INSERT_CHUNK = 1 << 20
MAX_PROMPTS = 2**31 - 2  # slots are stored as int32 (slot + 1) in the hash table


def _hash_uids(uids: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads consecutive dataset indices over the whole table.

    In place on one copy (two temporaries in all), because at 1e6+ keys every fresh temporary
    costs page faults.
    """
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
    """Maps int64 uids to dense slots 0..n-1 (slot order = first-seen order).

    Linear probing with load factor <= 1/2 in one int32 array holding ``slot + 1`` (0 = empty,
    so a fresh table is ``np.zeros``); keys are compared through ``slot_uids``. Lookups and
    inserts are vectorised over the batch: each probe round touches only the keys still
    unresolved, and after a few rounds the rare long probes finish in a scalar loop, so a step
    costs O(batch) whatever the number of stored uids. Growing rehashes everything (amortised by
    doubling). There are no deletions, so a key's probe run never has holes.
    """

    def __init__(self, capacity: int = 1024) -> None:
        cap = 1024
        while cap < capacity:
            cap *= 2
        self.table = np.zeros(cap, dtype=np.int32)
        self.size = 0

    def _start(self, keys: np.ndarray) -> np.ndarray:
        return (_hash_uids(keys) & np.uint64(self.table.size - 1)).astype(np.int64)

    def lookup(self, keys: np.ndarray, slot_uids: np.ndarray) -> np.ndarray:
        """Slot of each key, -1 where the key is not stored."""
        out = np.full(keys.size, -1, dtype=np.int64)
        if keys.size == 0 or self.size == 0:
            return out
        mask = self.table.size - 1
        pos = self._start(keys)
        todo = np.arange(keys.size)
        for _ in range(_VECTOR_ROUNDS):
            s = self.table[pos].astype(np.int64) - 1
            empty = s < 0
            found = ~empty & (slot_uids[np.maximum(s, 0)] == keys[todo])
            out[todo[found]] = s[found]
            keep = ~(empty | found)
            todo, pos = todo[keep], (pos[keep] + 1) & mask
            if todo.size == 0:
                return out
        table = self.table
        for i, p in zip(todo.tolist(), pos.tolist()):
            key = int(keys[i])
            while (s := int(table[p]) - 1) >= 0:
                if int(slot_uids[s]) == key:
                    out[i] = s
                    break
                p = (p + 1) & mask
        return out

    def insert(self, keys: np.ndarray, slots: np.ndarray, slot_uids: np.ndarray | None = None) -> None:
        """Insert keys known to be absent, with their slots.

        With ``slot_uids`` (the uid of every slot, ``slot_uids[slots] == keys``), a key meeting
        an equal key on its probe run raises ValueError (a safety net for :meth:`build`).
        """
        if 2 * (self.size + keys.size) > self.table.size:
            raise AssertionError("_UidIndex.insert needs reserve() first")
        for start in range(0, keys.size, _INSERT_CHUNK):
            self._insert_chunk(
                keys[start : start + _INSERT_CHUNK], slots[start : start + _INSERT_CHUNK], slot_uids
            )
        self.size += keys.size

    def _insert_chunk(self, keys: np.ndarray, slots: np.ndarray, slot_uids: np.ndarray | None) -> None:
        mask = self.table.size - 1
        pos = self._start(keys)
        value = slots.astype(np.int32) + 1
        todo = np.arange(keys.size)
        for _ in range(_VECTOR_ROUNDS):
            if todo.size == 0:
                return
            cur = self.table[pos]
            free = cur == 0
            if slot_uids is not None and np.any(~free & (slot_uids[np.maximum(cur, 1) - 1] == keys[todo])):
                raise ValueError("classifier state 'uids' holds duplicates")
            # Keys racing for the same free cell: write all, read back to see who won (whichever
            # write numpy applied last); the losers see an occupied cell and move on.
            self.table[pos[free]] = value[free]
            lost = self.table[pos] != value
            # A key that lost a race re-reads the same cell next round (its winner may be its
            # duplicate); one that met an occupied cell moves on.
            step = np.where(free[lost], 0, 1)
            todo, pos, value = todo[lost], (pos[lost] + step) & mask, value[lost]
        table = self.table
        for i, p, v in zip(todo.tolist(), pos.tolist(), value.tolist()):
            while (cur := int(table[p])) != 0:
                if slot_uids is not None and int(slot_uids[cur - 1]) == int(keys[i]):
                    raise ValueError("classifier state 'uids' holds duplicates")
                p = (p + 1) & mask
            table[p] = v

    @classmethod
    def build(cls, keys: np.ndarray, capacity: int, check_duplicates: bool = False) -> _UidIndex:
        """A fresh index holding ``keys[i] -> i``, built by sorting instead of probing.

        Random probes into a table of 1e7+ cells miss cache and TLB on every access; here the
        keys are sorted by home cell (packed as ``cell << 32 | slot`` in one uint64 sort), and
        linear probing's placement is then a running maximum, pos_i = max(home_i, pos_{i-1} + 1),
        written with one monotone scatter. Keys pushed past the end of the table wrap around via
        the ordinary probing insert. With ``check_duplicates``, equal keys raise ValueError.
        """
        index = cls(capacity)
        n = keys.size
        if n == 0:
            return index
        if check_duplicates and _has_duplicates(keys):
            raise ValueError("classifier state 'uids' holds duplicates")
        if 2 * n > index.table.size:
            raise AssertionError("_UidIndex.build: capacity too small")
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
        index.size = n - sum(o.size for o in overflow)
        if overflow:
            rest = np.concatenate(overflow)
            index.insert(keys[rest], rest, slot_uids=keys if check_duplicates else None)
        return index

    def reserve(self, n: int, slot_uids: np.ndarray) -> None:
        """Make room for ``n`` stored keys (load <= 1/2), rehashing ``slot_uids[:size]`` if needed."""
        if n > MAX_PROMPTS:
            raise ValueError(f"the classifier holds at most {MAX_PROMPTS} prompts, asked for {n}")
        if 2 * n <= self.table.size:
            return
        cap = self.table.size
        while 2 * n > cap:
            cap *= 2
        rebuilt = _UidIndex.build(slot_uids[: self.size], cap)
        self.table, self.size = rebuilt.table, rebuilt.size


# ---------------------------------------------------------------------------------------------
# Argument checks (ValueErrors naming the argument and the allowed range).
# ---------------------------------------------------------------------------------------------


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {rng}, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {rng}, got {value}")
    return value


def _int_array(name: str, values: Any) -> np.ndarray:
    if type(values) is np.ndarray and values.dtype == np.int64 and values.ndim == 1:
        return values  # the controller's arrays, every step: nothing to check or convert
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D integer array, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit in int64")
    return arr.astype(np.int64, copy=False)


def _has_duplicates(values: np.ndarray) -> bool:
    """Sort-based duplicate check (np.unique hashes int64 and is ~50x slower at 1e6 entries)."""
    if values.size < 2:
        return False
    if bool((values[1:] > values[:-1]).all()):  # strictly increasing (a sorted step): no sort needed
        return False
    ordered = np.sort(values)
    return bool(np.any(ordered[1:] == ordered[:-1]))


_CHUNK_ROWS = 1 << 16


def _row_blocks(lengths: np.ndarray, width: int) -> Iterator[tuple[slice, np.ndarray | None, int]]:
    """Blocks of :data:`_CHUNK_ROWS` ring rows, each with the mask of its first ``lengths[i]``
    cells per row (None when every row is full: the block is contiguous) and its cell count.
    Blocks keep the boolean masks cache-sized even for 1e7 prompts."""
    cols = np.arange(width)
    for start in range(0, lengths.size, _CHUNK_ROWS):
        m = lengths[start : start + _CHUNK_ROWS]
        yield slice(start, start + m.size), None if m.min() == width else cols[None, :] < m[:, None], int(m.sum())


def _pack_rows(succ: np.ndarray, trials: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate the first ``lengths[i]`` cells of row i of both ring buffers."""
    total = int(lengths.sum())
    out = np.empty(total, dtype=np.uint8), np.empty(total, dtype=np.uint8)
    pos = 0
    for rows, mask, count in _row_blocks(lengths, succ.shape[1]):
        for flat, ring in zip(out, (succ, trials)):
            flat[pos : pos + count] = ring[rows].ravel() if mask is None else ring[rows][mask]
        pos += count
    return out


def _unpack_rows(
    flat_s: np.ndarray, flat_t: np.ndarray, lengths: np.ndarray, succ: np.ndarray, trials: np.ndarray
) -> None:
    """Inverse of :func:`_pack_rows`, writing into zero-filled ring buffers."""
    pos = 0
    for rows, mask, count in _row_blocks(lengths, succ.shape[1]):
        for flat, ring in ((flat_s, succ), (flat_t, trials)):
            block = ring[rows]
            if mask is None:
                block[...] = flat[pos : pos + count].reshape(block.shape)
            else:
                block[mask] = flat[pos : pos + count]
        pos += count


def _any_greater(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 22) -> bool:
    """``np.any(a > b)`` without a full-size boolean temporary."""
    return any(bool(np.any(a[i : i + chunk] > b[i : i + chunk])) for i in range(0, a.size, chunk))


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


def _check_hysteresis(hysteresis: Any, full_edges: np.ndarray) -> float:
    narrowest = float(np.diff(full_edges).min())
    if (
        isinstance(hysteresis, bool)
        or not isinstance(hysteresis, numbers.Real)
        or not np.isfinite(hysteresis)
        or not 0.0 <= float(hysteresis) < narrowest
    ):
        raise ValueError(
            f"hysteresis must be in [0, {narrowest:g}) (smaller than the narrowest bin), got {hysteresis!r}"
        )
    return float(hysteresis)


def _checked_visits(uids: Any, successes: Any, trials: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The arguments of :meth:`OnlineDifficultyClassifier.observe` as int64 arrays, checked."""
    u = _int_array("uids", uids)
    s = _int_array("successes", successes)
    t = _int_array("trials", trials)
    if not (u.size == s.size == t.size):
        raise ValueError(f"uids, successes and trials must have equal lengths, got {u.size}, {s.size}, {t.size}")
    if u.size == 0:
        return u, s, t
    if _has_duplicates(u):
        raise ValueError("uids must be distinct within one observe() call (one visit per prompt per step)")
    if t.min() < 1 or t.max() > MAX_TRIALS_PER_VISIT:
        raise ValueError(f"trials must be in [1, {MAX_TRIALS_PER_VISIT}] per visit, got range [{t.min()}, {t.max()}]")
    if s.min() < 0 or np.any(s > t):
        raise ValueError("successes must be in [0, trials] for every prompt")
    return u, s, t


class _VisitHistory:
    """The storage of the module docstring: every seen prompt's last ``window`` visits by dense slot.

    Ring buffers ``[slots, width]`` (uint8 successes and trials) with each row's window sums kept in
    step (an estimate reads two numbers per prompt instead of ``window`` cells), the visit counter,
    the committed bin, and three uid -> slot maps: the hash index, a direct-address table while
    every uid is in [0, :data:`_DENSE_UIDS`) (dataset row indices), and a cache of recent lookups.
    """

    def __init__(self, window: int, capacity: int = 0, width: int = 1, index: _UidIndex | None = None) -> None:
        self.window = window
        self.n, self.cap, self.width = 0, capacity, width
        self.uids = np.zeros(capacity, dtype=np.int64)
        self.succ = np.zeros((capacity, width), dtype=np.uint8)
        self.trials = np.zeros((capacity, width), dtype=np.uint8)
        self.succ_sum = np.zeros(capacity, dtype=np.int64)
        self.trials_sum = np.zeros(capacity, dtype=np.int64)
        self.visits = np.zeros(capacity, dtype=np.int64)
        self.bin = np.full(capacity, _NO_BIN, dtype=np.int8)
        self.index = _UidIndex(2 * capacity) if index is None else index
        self.slot_cache: dict[int, int] = {}
        self.dense: np.ndarray | None = np.zeros(0, dtype=np.int32)  # slot + 1 by uid; None: a uid outside

    def resize(self, capacity: int, width: int) -> None:
        """Reallocate to ``capacity`` rows of ``width`` ring columns, keeping the contents (both grow
        by doubling, see the module docstring). Until the ring is ``window`` wide no prompt has
        wrapped around, so visit v of a prompt is in column v both before and after widening."""
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
            self.uids = moved(self.uids, 0, (capacity,))
            self.visits = moved(self.visits, 0, (capacity,))
            self.succ_sum = moved(self.succ_sum, 0, (capacity,))
            self.trials_sum = moved(self.trials_sum, 0, (capacity,))
            self.bin = moved(self.bin, _NO_BIN, (capacity,))
        self.cap, self.width = capacity, width

    def reserve(self, rows: int, width: int) -> None:
        """Make room for ``rows`` prompts and ``width`` ring columns (width <= window)."""
        cap, w = self.cap, self.width
        if rows > cap:
            cap = max(rows, 2 * cap, 64)
        if width > w:
            w = min(self.window, max(width, 2 * w))
        if (cap, w) != (self.cap, self.width):
            self.resize(cap, w)
        self.index.reserve(rows, self.uids)

    def memory_bytes(self) -> int:
        arrays = [self.uids, self.succ, self.trials, self.visits, self.bin, self.succ_sum, self.trials_sum,
                  self.index.table]
        return int(sum(a.nbytes for a in arrays)) + (0 if self.dense is None else self.dense.nbytes)

    def index_dense(self, uids: np.ndarray, slots: np.ndarray) -> None:
        """Add stored uids to the direct-address table, or drop the table for good (until the
        next load) when one lies outside [0, _DENSE_UIDS)."""
        dense = self.dense
        if dense is None or uids.size == 0:
            return
        low, high = int(uids.min()), int(uids.max())
        if low < 0 or high >= _DENSE_UIDS:
            self.dense = None
            return
        if high >= dense.size:
            grown = np.zeros(min(_DENSE_UIDS, max(high + 1, 2 * dense.size, 1024)), dtype=np.int32)
            grown[: dense.size] = dense
            self.dense = dense = grown
        dense[uids] = slots.astype(np.int32) + 1

    def slots(self, uids: np.ndarray) -> np.ndarray:
        """Slot of each uid (-1: never observed).

        One gather from the direct-address table while it exists. Otherwise the hash index
        probes; a training step looks the same prompts up twice (classified before generation,
        visited after), so the slots found are remembered (at most :data:`_SLOT_CACHE_MAX`,
        emptied when full; a slot never changes once given) and the second lookup is one C-level pass.
        """
        dense = self.dense
        if dense is not None:
            if uids.size and uids.min() >= 0 and uids.max() < dense.size:  # two reductions, no mask
                return np.subtract(dense[uids], 1, dtype=np.int64)
            if uids.size == 0:
                return np.zeros(0, dtype=np.int64)
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
        self.succ_sum[slots] += s - self.succ[slots, col]
        self.trials_sum[slots] += t - self.trials[slots, col]
        self.succ[slots, col] = s
        self.trials[slots, col] = t
        self.visits[slots] += 1

    def decayed(self, slots: np.ndarray, decay: float) -> tuple[np.ndarray, np.ndarray]:
        """(successes, trials) of each slot's window, visit of age a weighted by ``decay ** a``."""
        cols = np.arange(self.width, dtype=np.int64)[None, :]
        # ring column c of a prompt with v visits holds visit v - 1 - age, age = (v - 1 - c) mod W;
        # unfilled cells hold zeros and add nothing
        w = decay ** ((self.visits[slots][:, None] - 1 - cols) % self.window)
        return (w * self.succ[slots]).sum(axis=1), (w * self.trials[slots]).sum(axis=1)

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-prompt part of the classifier's state (copies; the rings packed, see ``state_dict``)."""
        n = self.n
        succ, trials = _pack_rows(self.succ, self.trials, np.minimum(self.visits[:n], self.window))
        return {"uids": self.uids[:n].copy(), "visits": self.visits[:n].copy(), "committed_bin": self.bin[:n].copy(),
                "successes": succ, "trials": trials}

    @classmethod
    def restored(
        cls, window: int, uids: np.ndarray, visits: np.ndarray, committed: np.ndarray, succ: np.ndarray,
        trials: np.ndarray, index: _UidIndex,
    ) -> _VisitHistory:
        """A history holding checked checkpoint arrays (the inverse of :meth:`packed`)."""
        n = uids.shape[0]
        recorded = np.minimum(visits, window)
        h = cls(window, n, max(1, int(recorded.max())) if n else 1, index)
        h.n = n
        h.uids[:], h.visits[:], h.bin[:] = uids, visits, committed
        h.index_dense(h.uids[:n], np.arange(n, dtype=np.int64))
        _unpack_rows(succ, trials, recorded, h.succ, h.trials)
        for ring, sums in ((h.succ, h.succ_sum), (h.trials, h.trials_sum)):
            for start in range(0, n, _CHUNK_ROWS):  # chunks keep the int64 temporaries small
                stop = min(n, start + _CHUNK_ROWS)
                sums[start:stop] = ring[start:stop].sum(axis=1, dtype=np.int64)
        return h


_CONFIG_KEYS = ("bin_edges", "window", "hysteresis", "k", "estimator", "unseen_bin")
_STATE_KEYS = ("version", *_CONFIG_KEYS, "uids", "visits", "committed_bin", "successes", "trials")


def _saved_config(state: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a classifier state was saved under, after its keys and version are checked."""
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"classifier state is missing keys {missing}")
    version = int(np.asarray(state["version"]))
    if version != _STATE_VERSION:
        raise ValueError(f"classifier state has version {version}; this code reads version {_STATE_VERSION}")
    return {
        "bin_edges": np.asarray(state["bin_edges"], dtype=np.float64),
        "window": int(np.asarray(state["window"])),
        "hysteresis": float(np.asarray(state["hysteresis"])),
        "k": int(np.asarray(state["k"])),
        "estimator": str(np.asarray(state["estimator"])),
        "unseen_bin": int(np.asarray(state["unseen_bin"])),
    }


def _config_differences(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> list[str]:
    """One line per setting a state was saved under that differs from this classifier's."""
    differ = []
    for key, value in saved.items():
        ours = mine[key]
        if not (np.array_equal(value, ours) if key == "bin_edges" else value == ours):
            shown = value.tolist() if isinstance(value, np.ndarray) else value
            ours_shown = ours.tolist() if isinstance(ours, np.ndarray) else ours
            differ.append(f"{key}: saved {shown!r}, configured {ours_shown!r}")
    return differ


def _checked_arrays(state: Mapping[str, Any], window: int, num_bins: int) -> tuple[np.ndarray, ...]:
    """(uids, visits, committed_bin, successes, trials) of a state, each checked for shape, dtype and range."""
    uids, visits, cbin, succ, trials = (
        np.asarray(state[key]) for key in ("uids", "visits", "committed_bin", "successes", "trials")
    )
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
        if _any_greater(succ, trials):
            raise ValueError("classifier state 'successes' exceeds 'trials'")
    if n > MAX_PROMPTS:
        raise ValueError(f"classifier state holds {n} prompts; at most {MAX_PROMPTS} allowed")
    return uids, visits, cbin, succ, trials


class OnlineDifficultyClassifier:
    """Per-prompt sliding-window pass@k estimate and hysteresis bins (docs/algorithm.md section 1).

    Args:
        bin_edges: inner edges a_1 < ... < a_{B-1}, strictly inside (0, 1); they define B bins.
            ``None`` means B = ``num_bins`` equal bins (edges i / B).
        num_bins: B; must agree with ``bin_edges`` when both are given (or stay at its default),
            because the released patch turned "6 bins" of custom edges into 7 (docs/algorithm.md, "Defects of the released patch", 6).
        window: H, visits kept per prompt (default 100).
        hysteresis: delta, margin by which an estimate must pass an edge to move the prompt;
            0 <= delta < the narrowest bin's width.
        k: the k of pass@k (default 8).
        estimator: ``pooled`` (default) or ``any_of_n``.
        unseen_bin: bin reported for a prompt with no visit yet (not committed; default 0).
    """

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
        self._edges = edges
        self._num_bins = edges.size + 1
        self._full_edges = np.concatenate([[0.0], edges, [1.0]])
        self._window = _check_int("window", window, 1)
        self._k = _check_int("k", k, 1)
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {list(ESTIMATORS)}, got {estimator!r}")
        self._estimator = str(estimator)
        self._hysteresis = _check_hysteresis(hysteresis, self._full_edges)
        self._thresholds = hysteresis_thresholds(self._full_edges, self._hysteresis)
        self._snapped_edges = snap(edges)  # raw_bin's edges on the snap grid, fixed like the thresholds
        self._unseen_bin = _check_int("unseen_bin", unseen_bin, 0, self._num_bins - 1)
        self._history = _VisitHistory(self._window)

    # -- configuration ---------------------------------------------------------------------

    @property
    def num_bins(self) -> int:
        """B, the number of bins."""
        return self._num_bins

    @property
    def bin_edges(self) -> np.ndarray:
        """The B-1 inner edges (a copy)."""
        return self._edges.copy()

    @property
    def window(self) -> int:
        return self._window

    @property
    def k(self) -> int:
        return self._k

    @property
    def hysteresis(self) -> float:
        return self._hysteresis

    @property
    def estimator(self) -> str:
        return self._estimator

    @property
    def unseen_bin(self) -> int:
        return self._unseen_bin

    @property
    def num_seen(self) -> int:
        """Number of distinct prompts observed at least once."""
        return self._history.n

    def _config(self) -> dict[str, Any]:
        return {"bin_edges": self._edges, "window": self._window, "hysteresis": self._hysteresis, "k": self._k,
                "estimator": self._estimator, "unseen_bin": self._unseen_bin}

    def memory_bytes(self) -> int:
        """Bytes held by the arrays (allocated capacity, including the uid hash table)."""
        return self._history.memory_bytes()

    # -- the step API ----------------------------------------------------------------------

    def observe(self, uids: Any, successes: Any, trials: Any) -> None:
        """Push one visit per prompt: ``successes`` out of ``trials`` rollouts at this step.

        Everything is validated before anything is written, so a rejected call leaves the state
        unchanged. Raises ValueError for mismatched lengths, a uid repeated in one call,
        non-integer values, trials outside [1, 255] or successes outside [0, trials].
        """
        u, s, t = _checked_visits(uids, successes, trials)
        if u.size:
            self.observe_prepared(u, s, t)

    def observe_prepared(self, uids: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        """:meth:`observe` on inputs already in shape, without its checks: int64 1-D arrays of one
        length >= 1, distinct ``uids``, 1 <= trials <= 255 and 0 <= successes <= trials.

        ``GDROController.after_advantage`` builds exactly these every step, so it skips the ~7
        numpy calls of checking them again (benchmarks/overhead.py).
        """
        self._history.push(uids, successes, trials)

    def _seen(self, uids: Any) -> tuple[np.ndarray, np.ndarray]:
        """(the slots of the uids observed before, which uids those are)."""
        slots = self._history.slots(_int_array("uids", uids))
        seen = slots >= 0
        return slots[seen], seen

    def _estimate_slots(self, slots: np.ndarray) -> np.ndarray:
        """Estimate for existing slots (all with >= 1 visit), on the :func:`snap` grid."""
        h = self._history
        if self._estimator == "pooled":
            return snap(pooled_pass_at_k(h.succ_sum[slots], h.trials_sum[slots], self._k))
        return snap(any_of_n_rate(h.succ[slots], np.minimum(h.visits[slots], self._window)))

    def pass_at_k(self, uids: Any) -> np.ndarray:
        """The section-1 estimate per uid on the :func:`snap` grid (the values the bins come from); NaN
        for a uid never observed."""
        sl, seen = self._seen(uids)
        out = np.full(seen.size, np.nan, dtype=np.float64)
        if sl.size:
            out[seen] = self._estimate_slots(sl)
        return out

    def window_counts(self, uids: Any) -> tuple[np.ndarray, np.ndarray]:
        """(successes, trials) per uid pooled over its window; (0, 0) for a uid never observed.

        What a per-prompt allocator estimates each prompt's own success rate from
        (:func:`verl_gdro.rollout_gdro.smoothed_rate`), beside the binned estimate.
        """
        sl, seen = self._seen(uids)
        s_out = np.zeros(seen.size, dtype=np.int64)
        t_out = np.zeros(seen.size, dtype=np.int64)
        if sl.size:
            s_out[seen] = self._history.succ_sum[sl]
            t_out[seen] = self._history.trials_sum[sl]
        return s_out, t_out

    def decayed_counts(self, uids: Any, decay: float) -> tuple[np.ndarray, np.ndarray]:
        """(successes, trials) per uid with each visit weighted by ``decay ** age`` (age 0 for the
        latest visit), over the window's visits; (0, 0) for a uid never observed.

        The window pools most of a run's history, so a prompt the policy has just learned keeps
        its old failures for many visits; a per-visit decay follows the policy (``decay=1`` is
        :meth:`window_counts`). Read from the rings, so it adds no state and resumes exactly.
        """
        if not (isinstance(decay, (int, float, np.floating)) and 0.0 < float(decay) <= 1.0):
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        sl, seen = self._seen(uids)
        s_out = np.zeros(seen.size, dtype=np.float64)
        t_out = np.zeros(seen.size, dtype=np.float64)
        if sl.size:
            s_out[seen], t_out[seen] = self._history.decayed(sl, float(decay))
        return s_out, t_out

    def raw_bins(self, p: Any) -> np.ndarray:
        """Raw bin of each estimate in ``p`` (no hysteresis): the number of inner edges <= p."""
        arr = np.asarray(p, dtype=np.float64)
        if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0):
            raise ValueError("p must hold finite estimates in [0, 1]")
        return raw_bin(arr, self._edges)

    def bins(self, uids: Any) -> np.ndarray:
        """Current bin per uid, with hysteresis against each prompt's committed bin, committed.

        Calling it twice without a new visit returns the same bins. A uid never observed gets
        ``unseen_bin`` and nothing is committed for it, so its first bin after its first visit is
        its raw bin. A uid may appear several times (e.g. once per response).
        """
        u = _int_array("uids", uids)
        slots = self._history.slots(u)
        if u.size and slots.min() >= 0:  # every uid seen before (the usual step): no masks
            return self._classify_slots(slots)
        out = np.full(u.size, self._unseen_bin, dtype=np.int64)
        seen = slots >= 0
        if seen.any():
            out[seen] = self._classify_slots(slots[seen])
        return out

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
        sl, seen = self._seen(uids)
        out = np.full(seen.size, _NO_BIN, dtype=np.int64)
        out[seen] = self._history.bin[sl]
        return out

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """A snapshot as a flat dict of numpy arrays (copies), ready for ``np.savez(**state)``.

        Per prompt, in first-seen order: ``uids``, ``visits`` (visits ever pushed) and
        ``committed_bin`` (-1 = none yet). The history is packed: prompt i contributes its
        ``min(visits_i, window)`` recorded ring cells (columns ``0..m_i-1``; visit v lives in
        column ``v % window``) to the flat uint8 arrays ``successes`` and ``trials``, so the
        checkpoint grows with the visits recorded, not with ``prompts * window``.
        """
        return {
            "version": np.asarray(_STATE_VERSION, dtype=np.int64),
            "bin_edges": self._edges.copy(),
            "window": np.asarray(self._window, dtype=np.int64),
            "hysteresis": np.asarray(self._hysteresis, dtype=np.float64),
            "k": np.asarray(self._k, dtype=np.int64),
            "estimator": np.asarray(self._estimator),
            "unseen_bin": np.asarray(self._unseen_bin, dtype=np.int64),
            **self._history.arrays(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (also as loaded back by ``np.load``).

        Rejects state from a differently configured classifier (naming the differing settings)
        and state whose arrays have the wrong shapes, dtypes or inconsistent contents. Nothing is
        changed unless the whole state is valid.
        """
        differ = _config_differences(_saved_config(state), self._config())
        if differ:
            raise ValueError("classifier state comes from a differently configured classifier: " + "; ".join(differ))
        uids, visits, cbin, succ, trials = _checked_arrays(state, self._window, self._num_bins)
        # Building the index is the duplicate check; it mutates nothing of ours until it succeeds.
        index = _UidIndex.build(uids, 2 * uids.shape[0], check_duplicates=True)
        self._history = _VisitHistory.restored(self._window, uids, visits, cbin, succ, trials, index)

    def __repr__(self) -> str:
        return (
            f"OnlineDifficultyClassifier(num_bins={self._num_bins}, window={self._window}, "
            f"hysteresis={self._hysteresis}, k={self._k}, estimator={self._estimator!r}, "
            f"unseen_bin={self._unseen_bin}, num_seen={self.num_seen})"
        )
