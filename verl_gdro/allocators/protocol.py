"""What the controller asks of a Rollout-GDRO allocator, and what it hands one after a step.

An allocator plans a generation call's rollouts per prompt under the exact budget (``rollout.n``
per prompt on average), observes the step's outcome, and keeps its state for checkpoints; the
controller (:class:`verl_gdro.step.controller.GDROController`) calls exactly these members and
never asks which allocator it holds (docs/algorithm.md, section 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

__all__ = ["Observation", "ObservedStep", "RolloutAllocator"]


@dataclass(frozen=True)
class ObservedStep:
    """One step's outcome, per planned prompt with trajectories (plan order).

    ``losses`` are the driver-side loss signal (NaN where it is measured during the update);
    ``incomplete`` counts planned prompts whose trajectories did not all arrive; ``deferred`` says
    the loss signal reaches the controller after the update (``after_update``); ``classifier`` is
    the run's classifier as it was before this step's visit (it observes last).
    """

    uids: NDArray[np.int64]
    bins: NDArray[np.int64]
    n: NDArray[np.int64]
    successes: NDArray[np.int64]
    losses: NDArray[np.float64]
    incomplete: int
    deferred: bool
    classifier: Any


@dataclass
class Observation:
    """What an allocator reports back: its update's info (metrics read ``unweighted_bins``), the
    reason it skipped the update (one of ``ROLLOUT_SKIP_REASONS``) and whether it waits for the
    step's update-time losses (``observe_update_loss``)."""

    info: dict[str, Any] = field(default_factory=dict)
    skip: str | None = None
    awaits_update_loss: bool = False


@runtime_checkable
class RolloutAllocator(Protocol):
    """The members the controller, the config resolver and the dry run use."""

    #: the ``gdro.rollout.allocator`` name (set by ``register_allocator``)
    name: ClassVar[str]
    #: the ``gdro`` keys (``rollout.eta``, ...) this allocator reads; a key set by the user that no
    #: active strategy reads is refused at resolution (verl_gdro/step/config.py)
    reads: ClassVar[tuple[str, ...]]
    #: with Prompt-GDRO off, whether the step still measures the driver-side loss signal for the
    #: gdro/loss metrics (the release's frozen arms read none)
    logs_loss_signal: ClassVar[bool]
    #: whether ``mu`` is the price of the latest planned call (set by ``plan``), not learnt by updates
    prices_at_plan: ClassVar[bool]

    @classmethod
    def from_settings(cls, rollout: Any, num_bins: int, n_mean: int) -> RolloutAllocator: ...

    @classmethod
    def describe(cls, rollout: Any) -> str: ...

    @property
    def mu(self) -> float: ...

    @property
    def learns_from_update_loss(self) -> bool: ...

    def plan(self, uids: NDArray[np.int64], bins: NDArray[np.int64], classifier: Any) -> NDArray[np.int64]: ...

    def observe(self, step: ObservedStep) -> Observation: ...

    def observe_update_loss(self, bins: Any, n: Any, successes: Any, losses: Any) -> str | None: ...

    def metrics(self, num_bins: int) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def snapshot(self) -> tuple[Any, ...]: ...

    def restore(self, snapshot: tuple[Any, ...]) -> None: ...
