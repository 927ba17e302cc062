"""A lazy, stateful training sampler that carries all GDRO controller state in its ``state_dict``.

verl saves the ``StatefulDataLoader``'s state (its sampler's included) to ``data.pt``, so the controller
saved here resumes bit-identically without checkpoint code of ours. ``resample`` draws each generation
call as one block (:class:`~verl_gdro.step.sampler.PromptSampler`); ``shuffle`` and ``sequential`` keep
verl's epoch order, deferring held prompts (docs/integration.md, "One draw per generation call").
Workers would pre-draw with stale state: ``data.dataloader_num_workers=0`` is enforced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from copy import deepcopy
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from verl_gdro.step.controller import GDROController
from verl_gdro.step.sampler import PromptSampler

SAMPLER_MODES = ("sequential", "shuffle", "resample")
_STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)


class GDROSampler(Sampler[int]):
    """Index sampler over the training set (``uids``: stable id per row), saving the ``controller``;
    ``batch_size``: the block ``resample`` draws when no call was announced (:meth:`begin_call`)."""

    def __init__(self, uids: Any, controller: GDROController, mode: str = "shuffle", seed: int = 0,
                 batch_size: int = 1) -> None:
        super().__init__()
        if mode not in SAMPLER_MODES:
            raise ValueError(f"sampler mode {mode!r} is invalid: allowed values are {list(SAMPLER_MODES)}")
        if mode == "resample" and not controller.resamples:
            raise ValueError("sampler mode 'resample' needs Prompt-GDRO on with a sampling gdro.prompt.mode "
                             "(resample, failure_weighted, greso or band)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} is invalid: must be an integer >= 1")
        u = np.asarray(uids, dtype=np.int64)
        if u.ndim != 1 or u.size == 0:
            raise ValueError(f"uids must be a non-empty 1-D array (one stable id per dataset row), got {u.shape}")
        self.uids = u
        self.controller = controller
        self.mode = mode
        self.seed = int(seed)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._epoch = 0
        self._cursor = 0
        self._epoch_rng_state: dict[str, Any] | None = None
        self._perm: np.ndarray | None = None
        self._resume = False
        self.batch_size = int(batch_size)
        # resample: the step API's sampler, its block and the next position in it
        self._draws = PromptSampler(controller, u, seed=self.seed) if mode == "resample" else None
        self._block = np.zeros(0, dtype=np.int64)
        self._block_pos = 0
        # the announced call's size and held prompts: transient (verl saves when no call is in progress)
        self._call_size: int | None = None
        self._call_held: Callable[[], Any] | Any = ()
        # shuffle / sequential: the rows the call must not draw, and this epoch's deferring swaps (saved)
        self._held_rows: set[int] | None = None
        self._ordered_call = False  # a call was announced (the trainer announces every one)
        self._swaps: list[tuple[int, int]] = []
        self._uid_order = np.argsort(u, kind="stable")
        # other state saved with the controller (name -> state_dict / load_state_dict), e.g. the ledger
        self.companions: dict[str, Any] = {}

    def __len__(self) -> int:
        return int(self.uids.size)

    @property
    def epoch(self) -> int:
        """Epochs started (1 during the first)."""
        return self._epoch

    def __iter__(self) -> Iterator[int]:
        # the loader calls iter() at every epoch start and, before load_state_dict, on resume
        if self._resume:
            self._resume = False
        else:
            self._start_epoch()
        return iter(self._draw, None)  # _draw ends the epoch with StopIteration; all state lives here

    def _start_epoch(self) -> None:
        self._epoch += 1
        self._cursor = 0
        self._block = np.zeros(0, dtype=np.int64)
        self._block_pos = 0
        self._swaps = []
        self._perm = None
        if self.mode == "shuffle":
            self._epoch_rng_state = deepcopy(self._rng.bit_generator.state)
            self._perm = self._rng.permutation(self.uids.size)

    def begin_call(self, size: int, held: Callable[[], Any] | Any = ()) -> None:
        """Announce a generation call of ``size`` prompts and the stable ids it must not draw (``held``;
        a callable is read at the first draw, after a resumed state is restored)."""
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"a generation call of {size!r} prompts is invalid: must be an integer >= 1")
        if self.mode != "resample":
            self._call_held, self._held_rows, self._ordered_call = held, None, True
            return
        if self._block_pos < self._block.size:
            raise RuntimeError(f"verl-gdro: a generation call began with {self._block.size - self._block_pos} "
                               "prompt(s) of the previous call not yet fetched (the data loader must fetch each "
                               "call's prompts in full)")
        # a call larger than the training set (a warm-up over a tiny set): the whole set, then the loader's batches
        self._call_size = min(int(size), int(self.uids.size))
        self._call_held = held

    def _draw(self) -> int:
        if self._epoch == 0:
            self._start_epoch()
        if self._cursor >= self.uids.size and (self.mode != "resample" or self._block_pos >= self._block.size):
            raise StopIteration
        index = self._draw_resample() if self.mode == "resample" else self._draw_ordered()
        self._cursor += 1
        return index

    def _draw_ordered(self) -> int:
        """shuffle / sequential: the epoch's prompt at the cursor, a held one deferred (:meth:`begin_call`)."""
        pos = self._cursor
        index = pos if self._perm is None else int(self._perm[pos])
        if not self._ordered_call:  # the loader alone (no trainer): verl's epoch order as it is
            return index
        held = self._call_held_rows()
        if index in held:
            order = np.arange(self.uids.size) if self._perm is None else self._perm
            later = order[pos + 1 :]
            free = np.flatnonzero(~np.isin(later, np.fromiter(held, dtype=np.int64, count=len(held))))
            if free.size:  # else the rest of the epoch is held: draw it anyway
                self._swap(pos, pos + 1 + int(free[0]))
                index = int(self._perm[pos])  # type: ignore[index]
        held.add(index)
        return index

    def _swap(self, i: int, j: int) -> None:
        """Exchange positions i and j of the epoch's order (materialised on first use); saved."""
        if self._perm is None:
            self._perm = np.arange(self.uids.size)
        self._perm[[i, j]] = self._perm[[j, i]]
        self._swaps.append((i, j))

    def _call_held_rows(self) -> set[int]:
        """The rows of the announced call's held prompts (read once per call) plus those it drew."""
        if self._held_rows is None:
            stable = self._held_stable()
            self._held_rows = set(self._rows_of(stable).tolist()) if stable.size else set()
        return self._held_rows

    def _held_stable(self) -> np.ndarray:
        held = self._call_held() if callable(self._call_held) else self._call_held
        return np.asarray(held, dtype=np.int64).reshape(-1)

    def _rows_of(self, stable: np.ndarray) -> np.ndarray:
        """Training-set rows of the given stable ids (ids outside the set are left out)."""
        order = self._uid_order
        pos = np.minimum(np.searchsorted(self.uids[order], stable), order.size - 1)
        rows = order[pos]
        return rows[self.uids[rows] == stable]

    def _draw_resample(self) -> int:
        if self._block_pos >= self._block.size:
            # a new block: the announced call (held prompts excluded), else the loader's batch
            assert self._draws is not None
            size = self.batch_size if self._call_size is None else self._call_size
            rows = self._draws.evidence.rows(self._held_stable())
            self._block = self._draws.draw(size, exclude=rows[rows >= 0])
            self._block_pos = 0
            self._call_size, self._call_held = None, ()
        index = int(self._block[self._block_pos])
        self._block_pos += 1
        return index

    def state_dict(self) -> dict[str, Any]:
        """Cursor, generators and the whole controller state."""
        return {"version": _STATE_VERSION, "mode": self.mode, "seed": self.seed, "num_rows": int(self.uids.size),
                "uid_checksum": _checksum(self.uids), "epoch": self._epoch, "cursor": self._cursor,
                "rng": deepcopy(self._rng.bit_generator.state), "epoch_rng": deepcopy(self._epoch_rng_state),
                "draws": None if self._draws is None else self._draws.state_dict(), "block": self._block.copy(),
                "block_pos": self._block_pos, "swaps": [list(pair) for pair in self._swaps],
                "controller": self.controller.state_dict(),
                "companions": {name: obj.state_dict() for name, obj in self.companions.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; refuses state of another mode or another training set."""
        if not isinstance(state, dict) or state.get("version") not in _READABLE_VERSIONS:
            raise ValueError(f"not a GDROSampler state of a version in {list(_READABLE_VERSIONS)}")
        if state["mode"] != self.mode:
            raise ValueError(f"GDROSampler state was saved in mode {state['mode']!r}, this run samples {self.mode!r}")
        if state["num_rows"] != self.uids.size or state["uid_checksum"] != _checksum(self.uids):
            raise ValueError("GDROSampler state was saved for a different training set (row count or stable prompt "
                             "ids differ); resume with the same data files and gdro.uid_key")
        self.controller.load_state_dict(state["controller"])
        saved = state.get("companions", {})  # absent in checkpoints written before the ledger existed
        for name, obj in self.companions.items():
            if name in saved:
                obj.load_state_dict(saved[name])
        self._epoch = int(state["epoch"])
        self._cursor = int(state["cursor"])
        self._epoch_rng_state = deepcopy(state["epoch_rng"])
        if self.mode == "shuffle" and self._epoch_rng_state is not None:
            # regenerate the epoch's permutation from the generator state at the epoch's start
            self._rng.bit_generator.state = deepcopy(self._epoch_rng_state)
            self._perm = self._rng.permutation(self.uids.size)
        else:
            self._perm = None
        self._rng.bit_generator.state = deepcopy(state["rng"])
        self._swaps = []  # the epoch's deferrals (absent in states written before they existed)
        for i, j in state.get("swaps", ()):
            self._swap(int(i), int(j))
        self._held_rows = None
        if self._draws is not None:
            if state.get("draws") is not None:
                self._draws.load_state_dict(state["draws"])
            else:  # a version-1 state: the generator starts afresh, the controller was restored
                self._draws.controller_restored()
        # a version-1 state has no block in progress: the next index starts a new one
        self._block = np.asarray(state.get("block", ()), dtype=np.int64).copy()
        self._block_pos = int(state.get("block_pos", 0))
        self._resume = self._epoch > 0


def sampler_for(controller: GDROController, uids: Any, data_config: Any, batch_size: int) -> GDROSampler:
    """The GDRO trainer's sampler: ``resample`` in a sampling mode, else verl's epoch order, seeded by ``data.seed``."""
    if controller.resamples:
        mode = "resample"
    else:
        mode = "shuffle" if data_config.get("shuffle", True) else "sequential"
    seed = data_config.get("seed", None)
    return GDROSampler(uids, controller, mode=mode, seed=0 if seed is None else int(seed), batch_size=batch_size)


def step_draw_metrics(sampler: GDROSampler | None, batch_price: float | None) -> dict[str, float]:
    """A sampling mode's ``gdro/draw/*`` and ``gdro/shadow_price`` of the step's own batch (prices at plan)."""
    out: dict[str, float] = {}
    if sampler is not None and sampler._draws is not None:
        out.update(sampler._draws.draw_metrics())
    if batch_price is not None:
        out["gdro/shadow_price"] = batch_price
    return out


def _checksum(uids: np.ndarray) -> int:
    """Order-sensitive fingerprint of the id column (cheap; detects a changed training set)."""
    weights = np.arange(1, uids.size + 1, dtype=np.uint64)
    return int(np.bitwise_xor.reduce(uids.astype(np.uint64) * weights) ^ np.uint64(uids.size))
