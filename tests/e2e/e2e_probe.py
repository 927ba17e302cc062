"""An observer of the GDRO trainer inside a real main_ppo run (e2e tests only).

verl persists neither the per-prompt ``__rollout_n__`` the GDRO trainer writes nor the controller
state outside its binary checkpoint, yet the e2e tests must compare both with what verl actually
did. Loaded next to the CPU platform through ``VERL_USE_EXTERNAL_MODULES`` when
``E2E_PROBE_DIR`` is set, this module wraps two methods of ``GDROTrainerMixin`` (shared by every GDRO trainer mode) in
place (the trainer mode stays as configured; every call goes to the original and its result is returned
unchanged) and appends JSON lines to ``$E2E_PROBE_DIR``:

- ``plan.jsonl``: per generation call (one per step in plain sync mode; DAPO refills and async
  warm-up batches add calls), the step, verl uid, stable prompt id and ``__rollout_n__`` of every
  prompt, as returned by ``_next_train_batch`` (what verl's agent loop then reads);
- ``state.jsonl``: after each ``_compute_advantage`` (the controller update), the controller's
  ``state_dict()``, so a resumed run's state after step 3 can be compared with the uninterrupted
  run's.

The tests count trajectories per prompt from verl's own rollout dump (``trainer.rollout_data_dir``)
and check them against ``plan.jsonl``: the probe records decisions, verl's dump records outcomes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def _plain(x: Any) -> Any:
    """JSON-able copy of a (nested) controller state: arrays to lists, numpy scalars to Python."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and x != x:  # NaN: keep it comparable as a string
        return "nan"
    return x


def _append(name: str, record: dict[str, Any]) -> None:
    path = Path(os.environ["E2E_PROBE_DIR"]) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(_plain(record)) + "\n")


def install() -> bool:
    """Wrap the trainer's hooks once; returns False when the probe is off or the trainer is absent."""
    if not os.environ.get("E2E_PROBE_DIR"):
        return False
    from verl_gdro.integration import trainer as gdro_trainer

    # The mixin holds the hooks of every GDRO trainer mode (gdro_sync, gdro_colocate_async, ...).
    cls = gdro_trainer.GDROTrainerMixin
    if getattr(cls, "_e2e_probe_installed", False):
        return True
    original_next = cls._next_train_batch
    original_adv = cls._compute_advantage

    def _next_train_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = original_next(self, *args, **kwargs)
        if self.gdro is not None:
            uids = [str(u) for u in gdro_trainer._as_list(batch["uid"])]
            stable = [int(u) for u in gdro_trainer._as_list(batch[self._gdro_uid_field])]
            keys = set(batch.keys())
            n = (
                [int(x) for x in gdro_trainer._as_list(batch[gdro_trainer.ROLLOUT_N_KEY])]
                if gdro_trainer.ROLLOUT_N_KEY in keys
                else None
            )
            _append("plan.jsonl", {"step": int(self.global_steps), "uid": uids, "index": stable, "rollout_n": n})
        return batch

    def _compute_advantage(self: Any, batch: Any, metrics: dict) -> Any:
        out = original_adv(self, batch, metrics)
        if self.gdro is not None:
            _append("state.jsonl", {"step": int(self.global_steps), "state": self.gdro.state_dict()})
        return out

    cls._next_train_batch = _next_train_batch
    cls._compute_advantage = _compute_advantage
    cls._e2e_probe_installed = True
    return True


# verl imports this module (VERL_USE_EXTERNAL_MODULES) in every process; only runs with the probe
# directory set are observed. A missing or broken trainer is an ImportError here, loudly.
if os.environ.get("E2E_PROBE_DIR"):
    install()
