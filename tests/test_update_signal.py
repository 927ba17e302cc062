"""The update-time loss signal (``update_surrogate``) on the verl side, without Ray.

The e2e tier (tests/e2e/test_e2e_update_signal.py) runs it in verl's real ``main_ppo``; here the
pieces are checked by hand: the per-response quantity against the release's formula, the raw
advantages against verl's GRPO, and the GDRO trainer's two hooks (the fields it writes for the
actor, and how it takes the actor's per-response losses back) on a real trainer object with the
in-memory TransferQueue of the integration tests and a stub actor worker group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from integration_harness import FakeTQ, make_trainer, run_step

from verl_gdro.integration.policy_loss import (
    LOSS_METRIC,
    RAW_ADV_FIELD,
    ROW_FIELD,
    ROW_METRIC,
    pop_update_losses,
    raw_grpo_advantages,
    update_surrogate_per_response,
)


def test_per_response_loss_is_the_releases_clipped_surrogate_by_hand():
    # response 0: A = +1, ratios e^0.5 (clipped to 1.28: min(r, 1.28) -> loss -1.28) and e^-0.1
    # response 1: A = -2, ratio e^-0.5 = 0.607 (clip to 0.8: max(2 * 0.607, 2 * 0.8) = 1.6), one masked token
    lp = torch.tensor([[0.5, -0.1, 0.0], [-0.5, 0.3, 9.0]])
    old = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    got = update_surrogate_per_response(lp, old, adv, mask, 0.2, 0.28)
    r01 = np.exp(-0.1)
    r11 = np.exp(0.3)  # A < 0: max(-A r, -A clip(r)) = 2 * max(1.35, 1.28) = 2.70 (no dual clip)
    expected0 = (-min(np.exp(0.5), 1.28) - min(r01, max(r01, 0.8))) / 2
    expected1 = (2 * max(np.exp(-0.5), 0.8) + 2 * max(r11, 1.28)) / 2
    assert got == pytest.approx([expected0, expected1])
    # at ratio 1 (the driver's measurement point) a GRPO group's losses sum to zero
    adv = raw_grpo_advantages(torch.tensor([[1.0], [0.0], [0.0], [1.0]]), ["a", "a", "a", "a"])
    at_one = update_surrogate_per_response(old[:1].repeat(4, 1), old[:1].repeat(4, 1), adv, torch.ones(4, 3), 0.2, 0.28)
    assert abs(at_one.sum()) < 1e-6


def test_raw_advantages_are_verls_grpo_with_singletons_zero():
    from verl.trainer.ppo import core_algos

    rewards = torch.tensor([[1.0], [0.0], [1.0], [0.5], [1.0]])
    index = ["x", "x", "x", "y", "z"]
    got = raw_grpo_advantages(rewards, index)
    ref, _ = core_algos.compute_grpo_outcome_advantage(rewards, torch.ones(5, 1), np.array(index, dtype=object))
    assert torch.allclose(got[:3], ref[:3, 0])
    assert got[3] == 0.0 and got[4] == 0.0  # one response per uid: no baseline


def test_pop_update_losses_pairs_nested_lists_and_removes_them():
    metrics = {LOSS_METRIC: [[0.1, 0.2], [[0.3]]], ROW_METRIC: [[4.0, 2.0], [[0.0]]], "pg_loss": [1.0]}
    rows, losses = pop_update_losses(metrics)
    assert rows.tolist() == [4, 2, 0] and losses.tolist() == [0.1, 0.2, 0.3]
    assert set(metrics) == {"pg_loss"}
    assert pop_update_losses({"pg_loss": 1.0}) is None
    with pytest.raises(ValueError, match="rows"):
        pop_update_losses({LOSS_METRIC: [1.0], ROW_METRIC: []})


class _StubActor:
    """The actor worker group's ``update_actor`` as verl's driver sees it: a TensorDict-like with the
    gathered ``metrics``; the per-response lists as the worker nests them (per mini-batch)."""

    def __init__(self, chunks: list[tuple[list[int], list[float]]]) -> None:
        self.chunks = chunks
        self.calls = 0

    def update_actor(self, batch: Any) -> dict[str, Any]:
        self.calls += 1
        return {
            "metrics": {
                "mfu": 0.0,
                "pg_loss": [0.5, 0.25],
                LOSS_METRIC: [c[1] for c in self.chunks],
                ROW_METRIC: [[float(r) for r in c[0]] for c in self.chunks],
            }
        }


def test_trainer_writes_the_actor_fields_and_feeds_back_the_first_epoch(tmp_path: Path, fake_tq: FakeTQ) -> None:
    trainer = make_trainer(tmp_path, "gdro.preset=release", "gdro.rollout.enable=false")
    assert trainer.gdro is not None and trainer.gdro.wants_update_losses
    out = run_step(trainer, fake_tq, 1)
    meta = out["meta"]
    assert trainer.gdro.awaiting_update
    assert np.array_equal(trainer.gdro.prompt.scores, np.zeros(3))  # nothing learnt before the update
    raw = [fake_tq.rows[("train", k)][RAW_ADV_FIELD] for k in meta.keys]
    rows = [fake_tq.rows[("train", k)][ROW_FIELD] for k in meta.keys]
    assert [float(r) for r in rows] == list(range(len(meta.keys)))
    # step 1: every prompt unseen, one bin, multipliers 1: the raw advantage is verl's advantage
    adv = [fake_tq.rows[("train", k)]["advantages"] for k in meta.keys]
    for a, r in zip(adv, raw):
        assert torch.allclose(a, torch.full_like(a, float(r)), atol=1e-6)

    n = len(meta.keys)
    half = n // 2
    losses = np.linspace(-0.05, 0.05, n)
    first = (list(range(half)), losses[:half].tolist())
    second = (list(range(half, n)), losses[half:].tolist())
    again = (list(range(half)), [9.0] * half)  # a second PPO epoch: not used
    trainer.actor_rollout_wg = _StubActor([first, second, again])
    metrics: dict[str, Any] = {}
    trainer._update_actor(meta, metrics)
    assert trainer.actor_rollout_wg.calls == 1 and not trainer.gdro.awaiting_update
    assert not [k for k in metrics if "gdro_update" in k]  # taken out before verl's reduce
    assert metrics["gdro/update_loss_responses"] == n
    positions = trainer._gdro_row_positions
    per_prompt = np.bincount(positions, weights=losses) / np.bincount(positions)
    assert metrics["gdro/loss/bin_0"] == pytest.approx(per_prompt.mean())
    assert trainer.gdro.prompt.scores[0] == pytest.approx(per_prompt.mean())  # first EMA value, share 1


@pytest.mark.slow
def test_demo_measures_the_update_time_loss_on_every_mini_batch(monkeypatch):
    """The CPU study's update (verl_gdro/demo/train.py) measures each response once, on its own
    mini-batch, and hands every response's loss to the controller; with one mini-batch the loss is
    taken at ratio 1 and each bin's mean is zero (GRPO's advantages sum to zero per group)."""
    import itertools

    import verl_gdro.demo.train as demo_train
    from verl_gdro.demo.config import DemoConfig
    from verl_gdro.demo.model import build_model
    from verl_gdro.demo.task import make_train_set
    from verl_gdro.demo.tokenizer import CharTokenizer
    from verl_gdro.demo.train import MethodRun

    tok = CharTokenizer()
    losses = {}
    for mini_batches in (1, 3):
        # an untrained policy is always wrong: give the groups mixed outcomes (non-zero advantages)
        pattern = itertools.cycle([1.0, 0.0, 0.0, 1.0, 0.0])
        monkeypatch.setattr(demo_train, "_score", lambda response, problem, p=pattern: (lambda a: (2 * a - 1, a))(next(p)))
        cfg = DemoConfig.quick(hidden=16, layers=1, batch_prompts=6, train_size=12, mini_batches=mini_batches,
                               methods=("prompt_gdro_release",), temperature=1.5, lr=1e-2)
        train = make_train_set(cfg.train_size, seed=0, task=cfg.task)
        init = build_model(tok.vocab_size, cfg.hidden, cfg.layers, seed=3).state_dict()
        run = MethodRun("prompt_gdro_release", 0, cfg, tok, train, init)
        seen = []
        original = run.ctrl.after_update

        def spy(g, loss, original=original, seen=seen):
            seen.append((np.asarray(g).copy(), np.asarray(loss).copy()))
            return original(g, loss)

        run.ctrl.after_update = spy
        m = run.train_step()
        (g, loss), = seen
        assert g.size == cfg.batch_prompts * cfg.n_mean and np.all(np.isfinite(loss))
        assert m["gdro/update_loss_responses"] == g.size and not run.ctrl.awaiting_update
        losses[mini_batches] = loss
    # one mini-batch: ratio 1, each group's losses sum to zero (up to float32 rounding)
    g1 = np.repeat(np.arange(6), 4)
    assert np.abs(np.bincount(g1, weights=losses[1])).max() < 1e-5
    # three mini-batches: the later ones are scored after an optimizer step, so not all zero
    assert np.abs(losses[3]).max() > 1e-6
