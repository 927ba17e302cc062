"""Adding an allocator is one class and one registry line (docs/integration.md, "Add your own allocator").

The toy allocator below is the documented example, verbatim: it gives a call's prompts n_mean - 1
and n_mean + 1 in turn (n_mean for an odd last one), so every call spends the exact budget. Once
registered it runs, by name only, through the controller (plan -> update -> metrics -> state), the
GDRO trainer's unit harness (``gdro.rollout.allocator=toy_alternating`` reaches the agent loop's
``__rollout_n__``) and the CPU study (``verl-gdro study --quick``'s own function).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from verl_gdro.allocators import ALLOCATOR_REGISTRY, Observation, ObservedStep, register_allocator
from verl_gdro.step.config import keys_read, resolve_gdro
from verl_gdro.step.controller import GDROController, describe_mode

# --- docs/integration.md, "Add your own allocator" (begin) ---


@register_allocator("toy_alternating")
class ToyAlternating:
    """n_mean - 1 and n_mean + 1 in turn: the exact budget, no learning."""

    reads: ClassVar[tuple[str, ...]] = ("rollout.n_min", "rollout.n_max")  # the gdro keys it reads
    logs_loss_signal: ClassVar[bool] = False  # with Prompt-GDRO off, measure no loss signal for it
    prices_at_plan: ClassVar[bool] = False  # mu is not the price of the latest call
    learns_from_update_loss: ClassVar[bool] = False  # no update-time loss wanted

    def __init__(self, n_mean: int) -> None:
        self.n_mean, self.mu, self.calls = n_mean, 0.0, 0

    @classmethod
    def from_settings(cls, rollout: Any, num_bins: int, n_mean: int) -> ToyAlternating:
        return cls(n_mean)

    @classmethod
    def describe(cls, rollout: Any) -> str:
        return "toy_alternating (n_mean -/+ 1)"

    def plan(self, uids: np.ndarray, bins: np.ndarray, classifier: Any) -> np.ndarray:
        n = np.where(np.arange(uids.size) % 2 == 0, self.n_mean - 1, self.n_mean + 1)
        if uids.size % 2:
            n[-1] = self.n_mean  # an odd call: the last prompt keeps the mean
        self.calls += 1
        return n.astype(np.int64)

    def observe(self, step: ObservedStep) -> Observation:
        return Observation()  # nothing to learn; Observation(skip="incomplete") would skip and log it

    def observe_update_loss(self, bins: Any, n: Any, successes: Any, losses: Any) -> str | None:
        return None

    def metrics(self, num_bins: int) -> dict[str, float]:
        return {"gdro/toy/calls": float(self.calls)}

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = int(state["calls"])

    def snapshot(self) -> tuple[Any, ...]:
        return (self.calls,)

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        (self.calls,) = snapshot


# --- docs/integration.md, "Add your own allocator" (end) ---

# registered only while this module's tests run: the registry is global, and other modules list its names
ALLOCATOR_REGISTRY.pop("toy_alternating")


@pytest.fixture(autouse=True)
def _registered() -> Any:
    register_allocator("toy_alternating")(ToyAlternating)
    yield
    ALLOCATOR_REGISTRY.pop("toy_alternating", None)

GROUP = {"rollout": {"enable": True, "allocator": "toy_alternating"}}


def test_the_doc_shows_this_example_verbatim() -> None:
    text = Path(__file__).read_text(encoding="utf-8")
    example = text.split("(begin) ---\n\n\n")[1].split("\n\n\n# --- docs/integration.md")[0]
    assert example in (Path(__file__).resolve().parents[1] / "docs/integration.md").read_text(encoding="utf-8")


def test_a_registered_allocator_runs_through_the_controller() -> None:
    ctrl = GDROController.from_config(GROUP, rollout_n=4)
    assert isinstance(ctrl.rollout, ToyAlternating)
    assert "rollout: toy_alternating (n_mean -/+ 1), n 2..12, mean n 4" in describe_mode(ctrl.settings, 4)
    rng = np.random.default_rng(0)
    for step in range(1, 4):
        plan = ctrl.before_generation(np.arange(7) + 10 * step)
        assert plan.rollout_n.tolist() == [3, 5, 3, 5, 3, 5, 4]
        g = np.repeat(plan.positions, plan.rollout_n)
        ctrl.advantage_multipliers(g)
        metrics = ctrl.after_advantage(g, rng.random(g.size) < 0.5)
        assert metrics["gdro/toy/calls"] == step and metrics["gdro/rollout_update_skipped"] == 0.0
    state = ctrl.state_dict()
    again = GDROController.from_config(GROUP, rollout_n=4)
    again.load_state_dict(state)
    assert again.rollout.calls == 3


def test_its_declared_keys_are_what_the_config_reads() -> None:
    settings = resolve_gdro(GROUP)
    assert {"rollout.n_min", "rollout.n_max", "rollout.allocator"} <= keys_read(settings)
    with pytest.raises(ValueError, match=r"^gdro\.rollout\.eta=1\.0 is set but nothing reads it under "
                                         r"gdro\.rollout\.allocator=toy_alternating"):
        resolve_gdro({"rollout": {**GROUP["rollout"], "eta": 1.0}})


def test_a_registered_allocator_runs_through_the_gdro_trainer(tmp_path: Path, fake_tq: Any) -> None:
    from integration_harness import agent_loop_rollout_n, make_trainer, run_step

    trainer = make_trainer(tmp_path, "gdro.rollout.enable=true", "gdro.rollout.allocator=toy_alternating")
    for step in range(1, 4):
        out = run_step(trainer, fake_tq, step)
        assert agent_loop_rollout_n(out["batch"], 4) == [3, 5, 3, 5, 3, 5]  # train_batch_size 6
        assert out["metrics"]["gdro/toy/calls"] == step


@pytest.mark.slow
def test_a_registered_allocator_runs_through_the_quick_study(tmp_path: Path) -> None:
    from verl_gdro.demo.config import DemoConfig
    from verl_gdro.demo.run import run_demo

    cfg = DemoConfig.quick(methods=("toy=rollout_gdro:rollout.allocator=toy_alternating",), steps=2, eval_every=2)
    result = run_demo(cfg, tmp_path / "study", plots=False, progress=False)
    assert result, "the study returned no result"
    rows = [line for line in (tmp_path / "study").rglob("*.jsonl")]
    assert rows, "the study wrote no metrics"
    text = "".join(p.read_text() for p in rows)
    assert "gdro/toy/calls" in text
