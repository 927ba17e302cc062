"""verl 0.9.1's V1 replay buffers, made to report every group they remove without training on it.

Filtered, surplus, stale and failed groups all leave through ``_clear_groups``; these subclasses hand
them to the trainer's observer first (docs/integration.md, "DAPO group filtering"). They add no state
in ``__init__``: the trainer swaps the class of the buffer verl built.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

#: (partition_id, {uid: trajectory keys}, {uid: reason}) -> None; called before the keys are cleared.
Observer = Callable[[str, dict[str, list[str]], dict[str, str]], None]


class GDROReplayBufferMixin:
    """Calls ``gdro_observer`` with every training group the buffer clears untrained, and why."""

    gdro_observer: Observer | None = None
    _gdro_reasons: dict[str, str] | None = None

    def _evict_terminal_groups(
        self, global_steps: int, partition_id: str, eviction_reasons: tuple[set[str], set[str], set[str], Counter]
    ) -> tuple[set[str], int, int, dict]:
        stale, dapo, failed, _counts = eviction_reasons
        # the sets may overlap (verl evicts their union once): filtered over stale over failed
        self._gdro_reasons = {**dict.fromkeys(failed, "failed"), **dict.fromkeys(stale, "stale"),
                              **dict.fromkeys(dapo, "filtered")}
        try:
            return super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)  # type: ignore[misc]
        finally:
            self._gdro_reasons = None

    def _clear_groups(self, partition_id: str, uids: set[str]) -> None:
        if uids and partition_id == "train" and self.gdro_observer is not None:
            keys: dict[str, list[str]] = {u: [] for u in uids}
            for key in self.partitions[partition_id]:  # type: ignore[attr-defined]
                uid = key.split("_")[0]
                if uid in keys:
                    keys[uid].append(key)
            # outside an eviction pass: the sync buffer's surplus (a failed group among it is named failed)
            failure = self.failure_keys[partition_id]  # type: ignore[attr-defined]
            reasons = {u: (self._gdro_reasons or {}).get(u, "failed" if u in failure else "surplus") for u in uids}
            self.gdro_observer(partition_id, keys, reasons)
        super()._clear_groups(partition_id, uids)  # type: ignore[misc]

    def _materialize_batch(self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict) -> Any:
        # without sync_refill_failed_groups a group whose every rollout failed is selected with no
        # rows: the advantage stage never sees it, so report it as failed instead of in flight for ever
        if partition_id == "train" and self.gdro_observer is not None and selected_prompt_uids:
            present = {key.split("_")[0] for key in partition_snapshot}
            empty = [u for u in selected_prompt_uids if u not in present]
            if empty:
                self.gdro_observer(partition_id, {u: [] for u in empty}, dict.fromkeys(empty, "failed"))
        return super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)  # type: ignore[misc]


class GDROReplayBuffer(GDROReplayBufferMixin, ReplayBuffer):
    """verl's sync ``ReplayBuffer`` (DAPO filtering, surplus discard) with the GDRO observer."""


class GDROReplayBufferAsync(GDROReplayBufferMixin, ReplayBufferAsync):
    """verl's ``ReplayBufferAsync`` (DAPO, stale and failed evictions) with the GDRO observer."""


def with_observer(buffer: ReplayBuffer, observer: Observer | None) -> ReplayBuffer:
    """Turn verl's built-in buffer into its GDRO subclass in place and attach the observer."""
    if type(buffer) is ReplayBuffer:
        buffer.__class__ = GDROReplayBuffer
    elif type(buffer) is ReplayBufferAsync:
        buffer.__class__ = GDROReplayBufferAsync
    elif not isinstance(buffer, GDROReplayBufferMixin):
        raise TypeError(f"verl-gdro: replay buffer {type(buffer).__name__} is not verl's built-in one; the GDRO "
                        "trainer cannot observe the groups it removes (remove trainer.v1.sampler.custom_sampler)")
    buffer.gdro_observer = observer  # type: ignore[attr-defined]
    return buffer
