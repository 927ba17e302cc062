"""DAPO's dynamic sampling in the CPU study (verl_gdro/demo/dynamic.py, MethodRun) and the
mini-batch order of its update (verl's actor.shuffle)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_gdro.demo.config import DemoConfig, DynamicSampling, method_gdro_group, method_study_keys
from verl_gdro.demo.dynamic import informative_groups, select_trained


def test_filter_drops_exactly_the_all_equal_groups():
    # groups: all correct, all wrong, mixed, a single response, mixed
    acc = np.array([1, 1, 1, 0, 0, 0, 1, 0, 1, 1, 0, 1])
    group = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 4, 4])
    assert informative_groups(acc, group, 5).tolist() == [False, False, True, True, True]


def test_the_trained_groups_are_the_first_informative_ones():
    inform = np.array([True, False, True, True, False, True])
    assert select_trained(inform, 2).tolist() == [True, False, True, False, False, False]
    assert select_trained(inform, 10).tolist() == inform.tolist()


def test_filter_settings_from_set_and_variant_keys():
    cfg = DemoConfig.quick(max_num_gen_batches=3)
    ds = DynamicSampling.from_settings(cfg.to_dict(), method_study_keys("dapo=grpo:dynamic_sampling=true"))
    assert (ds.enable, ds.max_num_gen_batches, ds.metric) == (True, 3, "acc")
    assert ds.call_size(12) == 12
    # the study keys do not reach the gdro group
    assert "dynamic_sampling" not in method_gdro_group("dapo=grpo:dynamic_sampling=true")
    with pytest.raises(ValueError, match="filter_metric"):
        DynamicSampling.from_settings({"filter_metric": "loss"})
    with pytest.raises(ValueError, match="max_num_gen_batches"):
        DynamicSampling.from_settings({"max_num_gen_batches": -1})


def test_refill_sizes_follow_verl():
    """verl 0.9.1's V1 buffer: two prompts of credit per dropped group, at most one batch in
    flight, the rest carried; the DAPO recipe (gen_batch_size > 0): whole calls."""
    v1 = DynamicSampling(enable=True)
    assert v1.refill_size(32, kept=20, filtered=12, credit=0) == (24, 0)
    assert v1.refill_size(32, kept=5, filtered=27, credit=0) == (32, 22)
    assert v1.refill_size(32, kept=30, filtered=0, credit=0) == (2, 0)  # never an empty call while short
    assert DynamicSampling(enable=True, gen_batch_size=8).refill_size(32, 20, 12, 0) == (8, 0)
    bound = DynamicSampling(enable=True, max_num_gen_batches=3)
    assert not bound.done(kept=5, calls=2, train_batch=32) and bound.done(kept=5, calls=3, train_batch=32)
    assert DynamicSampling(enable=True).done(kept=32, calls=1, train_batch=32)


def _scripted(monkeypatch):
    """A scorer by prompt: uid % 3 == 0 always right, 1 always wrong, 2 right on alternate calls
    (so a group of n >= 2 of those is mixed); returns the informative uids' test."""
    import itertools

    import verl_gdro.demo.train as demo_train

    flip = itertools.cycle([1.0, 0.0])

    def score(response, problem):
        a = {0: 1.0, 1: 0.0}.get(problem.uid % 3)
        a = next(flip) if a is None else a
        return 2 * a - 1, a

    monkeypatch.setattr(demo_train, "_score", score)
    return lambda uid: uid % 3 == 2


def _run(method: str, **over):
    from verl_gdro.demo.model import build_model
    from verl_gdro.demo.task import make_train_set
    from verl_gdro.demo.tokenizer import CharTokenizer
    from verl_gdro.demo.train import MethodRun

    torch.set_num_threads(1)
    tok = CharTokenizer()
    cfg = DemoConfig.quick(hidden=16, layers=1, batch_prompts=6, train_size=36, methods=(method,), **over)
    cfg.validate()
    train = make_train_set(cfg.train_size, seed=0, task=cfg.task)
    init = build_model(tok.vocab_size, cfg.hidden, cfg.layers, seed=3).state_dict()
    return MethodRun(method, 0, cfg, tok, train, init)


@pytest.mark.parametrize("method", ["grpo", "joint"])
def test_dynamic_sampling_trains_a_full_batch_of_distinct_informative_prompts(monkeypatch, method):
    informative = _scripted(monkeypatch)
    run = _run(method, dynamic_sampling=True)
    seen = []
    original = run.ctrl.after_advantage

    def spy(g, acc, **kw):
        seen.append((run.ctrl.planned_uids(g).copy(), np.asarray(acc).copy()))
        return original(g, acc, **kw)

    run.ctrl.after_advantage = spy
    for _ in range(2):
        before_gen, before_trained = run.rollouts, run.trained_rollouts
        m = run.train_step()
        uids, acc = seen[-1]
        groups = list(dict.fromkeys(uids.tolist()))  # distinct prompts observed this step, plan order
        assert len(groups) == len(set(groups))  # refills excluded the step's prompts
        assert m["train/gen_calls"] >= 2  # the first call had all-equal groups: refilled
        trained = groups[: int(m["train/trained_groups"])]
        assert len(trained) == 6 and all(informative(u) for u in trained)
        # every observed group the filter dropped is all-equal, every trained one is not
        dropped = [u for u in groups[6:] if not informative(u)]
        assert m["train/filtered_share"] == pytest.approx(len(dropped) / len(groups))
        # every generated rollout is counted, trained or not
        assert run.rollouts - before_gen == m["train/generated_rollouts"] == uids.size == len(groups) * 4
        assert run.trained_rollouts - before_trained == sum(int((uids == u).sum()) for u in trained)
        assert m["train/short_batch"] == 0.0


def test_the_generation_calls_bound_is_honoured(monkeypatch):
    _scripted(monkeypatch)
    run = _run("grpo", dynamic_sampling=True, max_num_gen_batches=1)
    m = run.train_step()
    assert m["train/gen_calls"] == 1 and m["train/generated_rollouts"] == 6 * 4
    assert m["train/trained_groups"] < 6 and m["train/short_batch"] == 1.0  # trains on what it kept


def test_without_the_filter_a_step_is_one_call_of_the_batch(monkeypatch):
    _scripted(monkeypatch)
    run = _run("grpo")
    m = run.train_step()
    assert (m["train/gen_calls"], m["train/generated_rollouts"], m["train/trained_groups"]) == (1, 24, 6)
    assert run.rollouts == run.trained_rollouts == 24


@pytest.mark.parametrize("shuffle", [False, True])
def test_mini_batches_follow_the_batch_order_unless_shuffled(monkeypatch, shuffle):
    """verl's actor.shuffle=false (its default): the mini-batches are consecutive slices of the
    batch, so a prompt's responses share one; shuffle=true draws a permutation."""
    import verl_gdro.demo.train as demo_train

    _scripted(monkeypatch)
    run = _run("grpo", mini_batches=2, shuffle=shuffle)
    grad_calls, full = [], []
    real = demo_train.response_log_probs

    def spy(model, ids, mask, R):
        if model is run.model:
            (grad_calls if torch.is_grad_enabled() else full).append(ids.clone())
        return real(model, ids, mask, R)

    monkeypatch.setattr(demo_train, "response_log_probs", spy)
    run.train_step()
    assert len(grad_calls) == 2 and len(full) == 1  # the old log-probs on the whole batch, then 2 mini-batches
    in_order = torch.equal(torch.cat(grad_calls), full[0])
    assert in_order is not shuffle
    if shuffle:  # the same rows, permuted
        assert sorted(map(tuple, torch.cat(grad_calls).tolist())) == sorted(map(tuple, full[0].tolist()))


@pytest.mark.parametrize("method", ["grpo", "joint"])
def test_a_resumed_filter_run_makes_the_same_decisions(monkeypatch, method):
    """The cursor into the epoch order (refills move it) and the sampler ride in the checkpoint."""
    import copy

    _scripted(monkeypatch)
    run = _run(method, dynamic_sampling=True, gen_batch_size=4)
    run.train_step()
    state = copy.deepcopy(run.state_dict())
    _scripted(monkeypatch)  # the scripted scorer's alternation starts afresh for both
    want = run.train_step()
    again = _run(method, dynamic_sampling=True, gen_batch_size=4)
    again.load_state_dict(state)
    _scripted(monkeypatch)
    got = again.train_step()
    assert run.cursor == again.cursor and (method == "joint" or run.cursor > 2 * 6)
    keys = ("train/generated_rollouts", "train/gen_calls", "train/filtered_share", "actor/pg_loss")
    assert [got[k] for k in keys] == [want[k] for k in keys]


def test_value_at_generated_rollouts_interpolates_the_curve():
    from verl_gdro.demo.dapo import value_at_rollouts

    curve = [{"rollouts": 0, "mean@8": 0.2}, {"rollouts": 100, "mean@8": 0.4}, {"rollouts": 300, "mean@8": 0.8}]
    assert value_at_rollouts(curve, 50) == pytest.approx(0.3)
    assert value_at_rollouts(curve, 200) == pytest.approx(0.6)
    assert value_at_rollouts(curve, 300) == pytest.approx(0.8)
    assert value_at_rollouts(curve, 301) is None


def test_the_dapo_table_reads_generated_rollouts(tmp_path):
    """Against DAPO: an arm that reaches DAPO's final at half its generated rollouts reads 0.5."""
    import json

    from verl_gdro.demo.dapo import dapo_markdown, dapo_summary

    (tmp_path / "done").mkdir()
    (tmp_path / "metrics").mkdir()
    lv = {"0": 0.9, "1": 0.5}
    for seed in range(3):
        for method, total, final, calls in (("dapo", 400, 0.6, 2.0), ("other", 200, 0.6 + 0.01 * seed, 1.0)):
            curve = [{"rollouts": 0, "mean@8": 0.2, "level_acc": lv}, {"rollouts": total // 2, "mean@8": 0.6,
                     "level_acc": lv}, {"rollouts": total, "mean@8": final, "level_acc": lv}]
            rec = {"method": method, "seed": seed, "rollouts": total, "trained_rollouts": 200, "curve": curve,
                   "dynamic_sampling": method == "dapo", "mean@8": final, "level_acc": lv}
            (tmp_path / "done" / f"{method}_seed{seed}.json").write_text(json.dumps(rec))
            rows = [{"train/generated_rollouts": total / 2, "train/trained_groups": 8, "train/gen_calls": calls,
                     "train/filtered_share": 0.5 if calls > 1 else 0.2}] * 2
            (tmp_path / "metrics" / f"{method}_seed{seed}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = dapo_summary(tmp_path, ["dapo", "other"], "dapo", budget=200)
    other = s["arms"]["other"]
    assert other["to_dapo_final"]["mean@8"]["median"] == pytest.approx(0.25)  # 100 of DAPO's 400
    assert other["to_dapo_final"]["mean@8"]["rank_value"] == pytest.approx(0.25)  # what `decide --baseline dapo` ranks
    assert other["paired"]["mean@8"]["mean"] == pytest.approx(0.01)
    assert other["paired"]["mean@8"]["ci95"][0] is not None  # 3 seeds: an interval
    # at 200 generated rollouts DAPO is at 0.6 (its middle point), the other arm at its final
    assert other["paired"]["mean@8_at_budget"]["mean"] == pytest.approx(0.01)
    assert s["arms"]["dapo"]["gen_calls"] == 2.0 and s["arms"]["dapo"]["generated_per_step"] == 200
    table = dapo_markdown(s, batch_rollouts=100)
    assert "| dapo | on | 400 | 0.600 |" in table and "| 2.00 | 2.00 (2.00) | 0.500 |" in table


def test_an_arm_may_run_longer_than_the_study():
    """``joint_long=joint:steps=112``: a no-filter arm run on to a filter arm's generated rollouts."""
    from verl_gdro.demo.config import method_steps

    assert method_steps("joint_long=joint:steps=112", 80) == 112 and method_steps("joint", 80) == 80
    assert "steps" not in method_gdro_group("joint_long=joint:steps=112")
    with pytest.raises(ValueError, match="steps=0"):
        DemoConfig.quick(methods=("grpo", "bad=grpo:steps=0")).validate()


def test_a_shorter_arm_is_read_from_a_finished_longer_one(tmp_path):
    """``joint`` (80 steps) is the first 80 steps of ``joint_long=joint:steps=112``: its record,
    rows and curve come from the longer run; another signature or an unfinished longer run does not."""
    import json

    from verl_gdro.demo.run import _from_longer

    (tmp_path / "done").mkdir()
    (tmp_path / "metrics").mkdir()
    cfg = DemoConfig.quick(steps=4, eval_every=2, methods=("grpo", "jl=joint:steps=6", "joint"))
    ev = {"pass@8": 1.0, "mean@8": 0.5, "level_acc": {"0": 0.5}, "level_pass@8": {"0": 1.0},
          "worst_level_acc": 0.5, "worst_level": 0}
    curve = [{"step": s, "rollouts": s * 48, **ev, "mean@8": 0.1 * s} for s in (0, 2, 4, 6)]
    rec = {"method": "jl", "spec": "jl=joint:steps=6", "seed": 0, "steps": 6, "rollouts": 288, "curve": curve,
           "wall_s": 60.0, "eval_s": 6.0, **ev}
    assert _from_longer(cfg, tmp_path, "joint", 0) is None  # not finished yet
    (tmp_path / "done" / "jl_seed0.json").write_text(json.dumps(rec))
    rows = [{"method": "jl", "seed": 0, "step": s, "train/rollouts_total": 48.0 * (s + 1)} for s in range(6)]
    (tmp_path / "metrics" / "jl_seed0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = _from_longer(cfg, tmp_path, "joint", 0)
    assert (got["steps"], got["rollouts"], got["mean@8"], got["derived_from"]) == (4, 192, 0.4, "jl")
    assert [p["step"] for p in got["curve"]] == [0, 2, 4] and got["wall_s"] == pytest.approx(40.0)
    kept = [json.loads(line) for line in (tmp_path / "metrics" / "joint_seed0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in kept] == [0, 1, 2, 3] and {r["method"] for r in kept} == {"joint"}
    assert _from_longer(cfg, tmp_path, "grpo", 0) is None  # another method
