"""The update-time loss signal (``gdro.prompt.loss_signal=update_surrogate``, the ``release`` preset)
in verl 0.9.1's real ``main_ppo`` on CPU: measured inside the actor's PPO update, on two
mini-batches per step, carried back through the actor's metrics and fed to Prompt-GDRO.

Three runs (sync, sync with DAPO filtering, colocate_async), each with the release's Rollout-GDRO
as run (``gdro.rollout.allocator=release_as_run``) so that the allocation option runs in verl too.
Must stay importable in the main environment (no verl/vLLM at import time).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_harness import ROLLOUT_N, TRAIN_BATCH_SIZE, RunResult, cpu_overrides, finite, run_main_ppo  # noqa: E402

pytestmark = pytest.mark.e2e

GDRO_CONFIG = ("pkg://verl_gdro.config", "gdro_trainer")
STEPS = 3
MINI_BATCH_PROMPTS = TRAIN_BATCH_SIZE // 2  # two optimizer steps per training step
MODES = {
    "sync": [],
    "dapo": ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"],
    "colocate_async": ["trainer.v1.trainer_mode=gdro_colocate_async"],
}




def _overrides(assets: dict[str, str], out: Path, extra: list[str]) -> list[str]:
    base = [
        o for o in cpu_overrides(assets, out, STEPS)
        if not o.startswith(("actor_rollout_ref.actor.ppo_mini_batch_size=", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="))
    ]
    return base + [
        "gdro.preset=release",
        "gdro.prompt.enable=true",
        "gdro.rollout.enable=true",
        "gdro.rollout.allocator=release_as_run",
        "gdro.classifier.hysteresis=0",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH_PROMPTS}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={ROLLOUT_N}",
        "trainer.save_freq=-1",
        *extra,
    ]



@pytest.fixture(scope="module", params=sorted(MODES))
def update_run(request: pytest.FixtureRequest, e2e_root: Path, assets: dict[str, str]) -> tuple[str, RunResult]:
    mode = request.param
    out = e2e_root / f"update_signal_{mode}"
    return mode, run_main_ppo(out, _overrides(assets, out, MODES[mode]), config=GDRO_CONFIG)


def test_update_time_losses_reach_prompt_gdro_from_every_mini_batch(update_run: tuple[str, RunResult]) -> None:
    mode, run = update_run
    assert run.returncode == 0, f"{mode}: main_ppo exited {run.returncode} after {run.seconds:.0f}s:\n{run.tail(80)}"
    records = run.train_records()
    assert sorted(records) == list(range(1, STEPS + 1)), f"{mode}: steps with gdro metrics {sorted(records)}"
    scores_moved = False
    for step, data in records.items():
        # the actor reported a loss for every trained response (two mini-batches of the step)
        assert data["gdro/update_loss_responses"] >= 2, (mode, step, data.get("gdro/update_loss_responses"))
        if mode != "dapo":
            assert data["gdro/update_loss_responses"] == data["gdro/num_trajectories"], (mode, step)
        losses = {k: v for k, v in data.items() if k.startswith("gdro/loss/bin_")}
        assert losses and all(finite(v) for v in losses.values()), (mode, step, losses)
        scores = [data[k] for k in data if k.startswith("gdro/score/bin_")]
        scores_moved |= any(v != 0.0 for v in scores)
        # the per-response lists were taken out before verl averaged the actor's metrics
        assert not [k for k in data if "gdro_update" in k], (mode, step)
    # the second mini-batch is scored after one optimizer step: the signal is not identically zero
    nonzero = [v for d in records.values() for k, v in d.items() if k.startswith("gdro/loss/bin_") and v != 0.0]
    assert nonzero, f"{mode}: every per-bin update-time loss was exactly 0"
    assert scores_moved, f"{mode}: Prompt-GDRO's scores never left 0"
    assert "verl-gdro mode: joint" in run.log and "release_as_run" in run.log
