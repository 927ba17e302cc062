"""A lazy, stateful training sampler that carries all GDRO controller state in its ``state_dict``.

verl 0.9.1 saves ``StatefulDataLoader.state_dict()`` to ``global_step_N/data.pt`` and restores it
on resume; the loader's state embeds its sampler's ``state_dict()``. So the sampler saves the whole
:class:`~verl_gdro.step.controller.GDROController` (classifier history, Prompt-GDRO scores,
Rollout-GDRO arm scores, shadow price and generator) next to its own cursor and generator, and a
resumed run continues bit-identically without any checkpoint code of ours.

Draws are lazy, one index at a time: in ``resample`` mode (Prompt-GDRO ``mode=resample``) each
draw picks a bin with the current q_t (restricted to the bins that hold prompts) and then a prompt
of that bin uniformly, so a controller update takes effect at the next draw. That requires
``data.dataloader_num_workers=0`` (workers would pre-draw batches with stale weights); the trainer
enforces it. The other modes (``shuffle``, ``sequential``) reproduce verl's epoch semantics
(every prompt once per epoch) with a seeded numpy generator.

An epoch is ``len(dataset)`` draws in every mode, so verl's ``steps_per_epoch`` stays right.
"""

from __future__ import annotations

from collections.abc import Iterator
from copy import deepcopy
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from verl_gdro.step.controller import GDROController

__all__ = ["SAMPLER_MODES", "GDROSampler"]

SAMPLER_MODES = ("sequential", "shuffle", "resample")
_STATE_VERSION = 1


class _Draws(Iterator[int]):
    """The iterator the data loader pulls from; all state lives in the sampler (one place to save)."""

    def __init__(self, sampler: GDROSampler) -> None:
        self._sampler = sampler

    def __iter__(self) -> _Draws:
        return self

    def __next__(self) -> int:
        return self._sampler._draw()


class GDROSampler(Sampler[int]):
    """Index sampler over the training set.

    Args:
        uids: stable prompt id of every dataset row (position -> id), e.g. from
            :func:`verl_gdro.integration.dataset.stable_prompt_uids`.
        controller: the run's controller (shared with the trainer); saved and restored with the
            sampler.
        mode: ``sequential``, ``shuffle`` (a fresh permutation per epoch) or ``resample`` (draw
            with Prompt-GDRO's q_t).
        seed: seed of the sampler's own generator (``data.seed``).
    """

    def __init__(self, uids: Any, controller: GDROController, mode: str = "shuffle", seed: int = 0) -> None:
        super().__init__()
        if mode not in SAMPLER_MODES:
            raise ValueError(f"sampler mode {mode!r} is invalid: allowed values are {list(SAMPLER_MODES)}")
        if mode == "resample" and not controller.resamples:
            raise ValueError("sampler mode 'resample' needs Prompt-GDRO on with gdro.prompt.mode=resample")
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
        self._members: list[np.ndarray] | None = None
        self._members_version: int | None = None
        #: Other state checkpointed with the controller (name -> object with state_dict /
        #: load_state_dict), e.g. the async trainers' dispatch ledger.
        self.companions: dict[str, Any] = {}

    def __len__(self) -> int:
        return int(self.uids.size)

    @property
    def epoch(self) -> int:
        """Epochs started (1 during the first)."""
        return self._epoch

    def __iter__(self) -> Iterator[int]:
        # The data loader calls iter() at every epoch start, and also (before load_state_dict)
        # while it rebuilds its iterator on resume; after a load the epoch in progress continues.
        if self._resume:
            self._resume = False
        else:
            self._start_epoch()
        return _Draws(self)

    def _start_epoch(self) -> None:
        self._epoch += 1
        self._cursor = 0
        if self.mode == "shuffle":
            self._epoch_rng_state = deepcopy(self._rng.bit_generator.state)
            self._perm = self._rng.permutation(self.uids.size)

    def _draw(self) -> int:
        if self._epoch == 0:
            self._start_epoch()
        if self._cursor >= self.uids.size:
            raise StopIteration
        if self.mode == "sequential":
            index = self._cursor
        elif self.mode == "shuffle":
            assert self._perm is not None
            index = int(self._perm[self._cursor])
        else:
            index = self._draw_resample()
        self._cursor += 1
        return index

    def _refresh_members(self) -> None:
        """Bin membership of every dataset row under the current classifier (O(dataset), once per
        controller update; committing the bins is idempotent without a new visit)."""
        bins = self.controller.bins_of(self.uids)
        order = np.argsort(bins, kind="stable")
        bounds = np.searchsorted(bins[order], np.arange(self.controller.num_bins + 1))
        self._members = [order[bounds[b] : bounds[b + 1]] for b in range(self.controller.num_bins)]
        self._members_version = self.controller.version

    def _draw_resample(self) -> int:
        if self._members is None or self._members_version != self.controller.version:
            self._refresh_members()
        assert self._members is not None
        sizes = np.array([m.size for m in self._members], dtype=np.float64)
        q = self.controller.bin_probs() * (sizes > 0)
        q = q / q.sum()
        b = int(self._rng.choice(q.size, p=q))
        members = self._members[b]
        return int(members[self._rng.integers(members.size)])

    # -- checkpointing (embedded in StatefulDataLoader.state_dict) ---------------------------

    def state_dict(self) -> dict[str, Any]:
        """Cursor, generators and the whole controller state."""
        return {
            "version": _STATE_VERSION,
            "mode": self.mode,
            "seed": self.seed,
            "num_rows": int(self.uids.size),
            "uid_checksum": _checksum(self.uids),
            "epoch": self._epoch,
            "cursor": self._cursor,
            "rng": deepcopy(self._rng.bit_generator.state),
            "epoch_rng": deepcopy(self._epoch_rng_state),
            "controller": self.controller.state_dict(),
            "companions": {name: obj.state_dict() for name, obj in self.companions.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; refuses state of another mode or another training set."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a GDROSampler state of version {_STATE_VERSION}")
        if state["mode"] != self.mode:
            raise ValueError(f"GDROSampler state was saved in mode {state['mode']!r}, this run samples {self.mode!r}")
        if state["num_rows"] != self.uids.size or state["uid_checksum"] != _checksum(self.uids):
            raise ValueError(
                "GDROSampler state was saved for a different training set (row count or stable prompt ids "
                "differ); resume with the same data files and gdro.uid_key"
            )
        self.controller.load_state_dict(state["controller"])
        saved = state.get("companions", {})  # absent in checkpoints written before the ledger existed
        for name, obj in self.companions.items():
            if name in saved:
                obj.load_state_dict(saved[name])
        self._epoch = int(state["epoch"])
        self._cursor = int(state["cursor"])
        self._epoch_rng_state = deepcopy(state["epoch_rng"])
        if self.mode == "shuffle" and self._epoch_rng_state is not None:
            # Regenerate the epoch's permutation from the generator state at the epoch's start;
            # afterwards the generator is exactly where the uninterrupted run's was.
            self._rng.bit_generator.state = deepcopy(self._epoch_rng_state)
            self._perm = self._rng.permutation(self.uids.size)
        self._rng.bit_generator.state = deepcopy(state["rng"])
        self._members = None
        self._members_version = None
        self._resume = self._epoch > 0


def _checksum(uids: np.ndarray) -> int:
    """Order-sensitive fingerprint of the id column (cheap; detects a changed training set)."""
    weights = np.arange(1, uids.size + 1, dtype=np.uint64)
    return int(np.bitwise_xor.reduce(uids.astype(np.uint64) * weights) ^ np.uint64(uids.size))
