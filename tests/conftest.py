"""Shared fixtures (kept small). ``tests/`` is not a package: verl's wheel ships a ``tests`` package."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest


@pytest.fixture
def grpo_batch() -> Callable[..., object]:
    """Factory of a real verl ``DataProto`` with variable GRPO group sizes.

    ``grpo_batch(sizes, seed=0, rewards="binary", max_len=7, pad_rows=0)``: one uid per group
    (``g0``, ``g1``, ...), responses of random length, the outcome reward on the last valid token
    (as verl's reward managers write it); ``pad_rows`` zero-mask rows with a ``pad...`` uid like
    verl's ``_balance_batch`` appends. Imports verl lazily so verl-free tests stay fast.
    """

    def make(
        sizes: list[int],
        seed: int = 0,
        rewards: str = "binary",
        max_len: int = 7,
        pad_rows: int = 0,
    ) -> object:
        import torch
        from verl import DataProto

        rng = np.random.default_rng(seed)
        uids = [f"g{g}" for g, size in enumerate(sizes) for _ in range(size)]
        uids += ["pad0123456789abcdef"] * pad_rows
        n = len(uids)
        lengths = rng.integers(1, max_len + 1, size=n)
        lengths[len(uids) - pad_rows :] = 1
        mask = (np.arange(max_len)[None, :] < lengths[:, None]).astype(np.float32)
        mask[len(uids) - pad_rows :] = 0.0
        if rewards == "binary":
            outcome = rng.choice([-1.0, 1.0], size=n)
        else:
            outcome = rng.normal(size=n)
        outcome[len(uids) - pad_rows :] = 0.0
        token_rewards = np.zeros((n, max_len), dtype=np.float32)
        token_rewards[np.arange(n), lengths - 1] = outcome
        token_rewards *= mask
        return DataProto.from_dict(
            tensors={
                "token_level_rewards": torch.tensor(token_rewards),
                "response_mask": torch.tensor(mask),
            },
            non_tensors={"uid": np.array(uids, dtype=object)},
        )

    return make


@pytest.fixture
def fake_tq(monkeypatch: pytest.MonkeyPatch) -> object:
    """TransferQueue's kv_batch_get/kv_batch_put/kv_list/kv_clear replaced by an in-memory store (integration_harness)."""
    import transfer_queue
    from integration_harness import FakeTQ

    store = FakeTQ()
    monkeypatch.setattr(transfer_queue, "kv_batch_get", store.get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", store.put)
    # what verl's replay buffer calls (DAPO filtering, async trainers)
    monkeypatch.setattr(transfer_queue, "kv_list", store.kv_list)
    monkeypatch.setattr(transfer_queue, "kv_clear", store.clear)
    return store
