"""Unit tests of the CPU demo's parts: task, tokenizer, scorer, pass@k, config, sampling layout."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from verl_gdro.demo.config import DEFAULT_METHODS, METHODS, QUICK_METHODS, DemoConfig, method_gdro_group
from verl_gdro.demo.task import (
    LEVEL_WEIGHTS,
    TASKS,
    Problem,
    get_task,
    make_eval_set,
    make_train_set,
    pass_at_k,
    prompt_text,
    response_text,
)
from verl_gdro.demo.tokenizer import CharTokenizer

# ---------------------------------------------------------------------------------------------
# task
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", sorted(TASKS))
def test_train_set_is_deterministic_with_stable_row_ids(task):
    a = make_train_set(200, seed=0, task=task)
    b = make_train_set(200, seed=0, task=task)
    assert a == b
    assert [p.uid for p in a] == list(range(200))
    assert make_train_set(200, seed=1, task=task) != a


@pytest.mark.parametrize("task", sorted(TASKS))
def test_train_set_is_heavy_tailed_and_covers_every_level(task):
    t = get_task(task)
    train = make_train_set(4000, seed=0, task=task)
    counts = Counter(p.level for p in train)
    assert set(counts) == set(range(t.num_levels))
    shares = np.array([counts[lv] for lv in range(t.num_levels)]) / len(train)
    # most problems easy, a long tail of hard ones, close to the declared mix
    assert shares[0] > 0.35 and shares[-1] < 0.08
    assert np.all(np.diff(shares) < 0.02)
    np.testing.assert_allclose(shares, np.asarray(LEVEL_WEIGHTS) / sum(LEVEL_WEIGHTS), atol=0.03)
    # even a tiny train set holds every level (the hardest bin must be able to exist in --quick)
    assert {p.level for p in make_train_set(t.num_levels, seed=3, task=task)} == set(range(t.num_levels))


def test_addition_operands_match_their_level():
    levels = get_task("add").levels
    for p in make_train_set(500, seed=2, task="add"):
        ops = p.question.rstrip("=").split("+")
        assert len(ops) == len(levels[p.level])
        for x, d in zip(ops, levels[p.level]):
            assert len(x) == d
        assert int(p.answer) == sum(int(x) for x in ops)


def test_sort_answers_are_the_sorted_digits_of_their_level_length():
    levels = get_task("sort").levels
    for p in make_train_set(500, seed=2, task="sort"):
        digits = p.question.removeprefix("sort ")
        assert len(digits) == levels[p.level][0] and "0" not in digits
        assert p.answer == "".join(sorted(digits))


@pytest.mark.parametrize("task", sorted(TASKS))
def test_reference_responses_fit_the_task_length_limit(task):
    tok = CharTokenizer()
    t = get_task(task)
    longest = max(len(tok.encode(response_text(p))) + 1 for p in make_train_set(2000, seed=0, task=task))
    assert longest <= t.max_new_tokens


@pytest.mark.parametrize("task", sorted(TASKS))
def test_eval_set_is_stratified_held_out_and_has_distinct_ids(task):
    t = get_task(task)
    train = make_train_set(300, seed=0, task=task)
    ev = make_eval_set(20, seed=0, exclude=train, task=task)
    counts = Counter(p.level for p in ev)
    assert all(counts[lv] == 20 for lv in range(t.num_levels))
    train_q = {p.question for p in train}
    # the easiest levels have few distinct problems; the harder levels must not overlap the train set
    assert not any(p.question in train_q for p in ev if p.level > 1)
    assert len({p.uid for p in ev}) == len(ev)
    assert min(p.uid for p in ev) >= 1_000_000


def test_bad_sizes_and_tasks_are_value_errors():
    with pytest.raises(ValueError, match="train size"):
        make_train_set(2)
    with pytest.raises(ValueError, match="per_level"):
        make_eval_set(0)
    with pytest.raises(ValueError, match="--task 'nope'"):
        make_train_set(10, task="nope")


def test_the_two_tasks_are_different_families():
    """Confirmation must not be the development task with other numbers: no shared question form."""
    add, srt = make_train_set(50, task="add"), make_train_set(50, task="sort")
    assert all("+" in p.question for p in add) and not any("+" in p.question for p in srt)
    assert all(p.question.startswith("sort ") for p in srt)


# ---------------------------------------------------------------------------------------------
# pass@k
# ---------------------------------------------------------------------------------------------


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 10])
def test_pass_at_k_matches_brute_force(n):
    for k in range(1, n + 1):
        for c in range(n + 1):
            assert math.isclose(pass_at_k(n, c, k), _brute_pass_at_k(n, c, k), abs_tol=1e-12)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError):
        pass_at_k(8, 9, 8)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 8)


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------


def test_tokenizer_round_trip_and_chat_template(tmp_path):
    tok = CharTokenizer()
    p = Problem(uid=0, level=2, question="47+8=", answer="55")
    text = tok.apply_chat_template([{"role": "user", "content": prompt_text(p)}])
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    ids = tok.encode(text)
    # special markers are single tokens, characters one token each
    assert ids.count(tok.encode("<|im_start|>")[0]) == 2
    assert len(ids) == len(text) - 2 * (len("<|im_start|>") - 1) - (len("<|im_end|>") - 1)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(tok.encode(response_text(p)) + [tok.eos_token_id]) == "Answer: 55"
    tok.save(tmp_path / "tok.json")
    tok2 = CharTokenizer.load(tmp_path / "tok.json")
    assert tok2.encode(text) == ids and tok2.vocab_size == tok.vocab_size
    with pytest.raises(ValueError, match="vocabulary"):
        tok.encode("é")


# ---------------------------------------------------------------------------------------------
# scorer: the prompt template and verl's math_dapo scorer, tested together (spec defect 5)
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow  # imports verl
def test_reference_response_scores_correct_with_verls_math_dapo():
    from verl.utils.reward_score.math_dapo import compute_score

    from verl_gdro.demo.task import score_response

    for p in make_train_set(30, seed=5, task="add") + make_train_set(30, seed=5, task="sort"):
        assert prompt_text(p) == p.question  # the bare question: the warm start teaches the format
        out = compute_score(response_text(p), p.answer)
        assert out["acc"] is True and out["score"] == 1.0
        assert score_response(response_text(p), p)
        wrong = f"Answer: {int(p.answer) + 1}"
        assert not score_response(wrong, p)
        # the shaped score of a wrong answer is -1: reading `score` as correctness would be wrong
        assert compute_score(wrong, p.answer)["score"] == -1.0
    p = Problem(uid=0, level=0, question="3+5=", answer="8")
    assert not score_response("8", p)  # no Answer: line, no credit
    assert score_response("let me think\nAnswer: 8", p)


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------


def test_methods_map_to_gdro_groups():
    assert set(DEFAULT_METHODS) <= set(METHODS) and set(QUICK_METHODS) <= set(DEFAULT_METHODS)
    g = method_gdro_group("grpo")
    assert g["prompt"]["enable"] is False and g["rollout"]["enable"] is False and g["enable"] is True
    assert method_gdro_group("prompt_gdro")["prompt"]["enable"] is True
    assert method_gdro_group("rollout_gdro_paper")["preset"] == "paper"
    j = method_gdro_group("joint")
    assert j["prompt"]["enable"] and j["rollout"]["enable"]
    with pytest.raises(ValueError, match="--methods"):
        method_gdro_group("ppo")


def test_gdro_groups_resolve_in_the_integration_config():
    from verl_gdro.step.config import resolve_gdro

    for m in METHODS:
        s = resolve_gdro(method_gdro_group(m))
        assert s.rollout.n_min == 2 and s.rollout.n_max == 12
        assert s.prompt.enable == METHODS[m][1] and s.rollout.enable == METHODS[m][2]


def test_config_validation():
    DemoConfig().validate()
    DemoConfig.quick().validate()

    with pytest.raises(ValueError, match="n_mean"):
        replace(DemoConfig(), n_mean=13).validate()
    with pytest.raises(ValueError, match="batch_prompts"):
        replace(DemoConfig(), batch_prompts=10_000).validate()
    with pytest.raises(ValueError, match="--methods"):
        replace(DemoConfig(), methods=("grpo", "nope")).validate()


def test_a_family_sets_its_testbed_fields_and_the_command_line_wins():
    import argparse

    from verl_gdro.demo.run import _config_from_args, add_arguments

    fam = dict(TASKS["missing"].config)
    assert fam and set(fam) <= set(DemoConfig.__dataclass_fields__)
    full = DemoConfig.for_task("missing")
    assert (full.steps, full.sft_noise) == (fam["steps"], fam["sft_noise"]) != (DemoConfig().steps, DemoConfig().sft_noise)
    # the CI size keeps its own run length but takes the family's warm start noise
    quick = DemoConfig.for_task("missing", quick=True)
    assert quick.steps == DemoConfig.quick().steps and quick.sft_noise == fam["sft_noise"]
    # a family without settings is the plain size
    assert DemoConfig.for_task("sort") == replace(DemoConfig(), task="sort")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = _config_from_args(parser.parse_args(["--task", "missing", "--steps", "7", "--set", "sft_noise=0.2"]))
    assert (cfg.task, cfg.steps, cfg.sft_noise) == ("missing", 7, 0.2)


def test_gdro_overrides_reach_every_method_and_bad_ones_name_the_key():
    import argparse

    from verl_gdro.demo.run import _config_from_args, add_arguments
    from verl_gdro.step.config import resolve_gdro

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # keys every method's active strategies read (a key one of them does not read is refused:
    # docs/configuration.md, "Keys each strategy reads")
    cfg = _config_from_args(parser.parse_args(["--quick", "--gdro", "prompt.beta=0.3", "gdro.prompt.eta=0.3"]))
    assert cfg.gdro == (("prompt.beta", 0.3), ("prompt.eta", 0.3))
    for m in cfg.methods:
        s = resolve_gdro(method_gdro_group(m, 1, cfg.gdro))
        assert s.prompt.beta == 0.3 and s.prompt.eta == 0.3
        assert s.prompt.enable == METHODS[m][1] and s.rollout.seed == 1  # the method still decides these
    assert cfg.to_dict()["gdro"] == [["prompt.beta", 0.3], ["prompt.eta", 0.3]]
    with pytest.raises(ValueError, match=r"gdro\.prompt\.max_weight"):
        _config_from_args(parser.parse_args(["--quick", "--gdro", "prompt.max_weight=-1"]))
    with pytest.raises(ValueError, match=r"prompt\.enable: this key defines the method"):
        _config_from_args(parser.parse_args(["--quick", "--gdro", "prompt.enable=false"]))
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        _config_from_args(parser.parse_args(["--quick", "--gdro", "prompt.eta"]))
    # a key the demo has nothing to apply to is refused, never ignored; a variant too
    with pytest.raises(ValueError, match=r"^--gdro uid_key: the demo and the study cannot honour it"):
        _config_from_args(parser.parse_args(["--quick", "--gdro", "uid_key=row_index"]))
    with pytest.raises(ValueError, match=r"^--gdro acc_key: the demo and the study cannot honour it"):
        _config_from_args(parser.parse_args(["--quick", "--methods", "grpo", "x=prompt_gdro:acc_key=correct"]))
    with pytest.raises(ValueError, match=r"gdro\.prompt\.nonsense"):
        _config_from_args(parser.parse_args(["--quick", "--gdro", "prompt.nonsense=1"]))
