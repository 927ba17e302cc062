"""mean@k / pass@k tables on synthetic generations in verl 0.9.1's validation dump layout."""

from __future__ import annotations

import argparse
import itertools
import json
import uuid
from math import comb

import numpy as np
import pandas as pd
import pytest

from verl_gdro.data.sources import prepare_benchmark
from verl_gdro.eval import cli
from verl_gdro.eval.generations import group_by_prompt, read_dump, resolve_dump_file, write_dump
from verl_gdro.eval.metrics import pass_at_k, score_run
from verl_gdro.eval.table import PAPER_TABLE1, markdown_table, row_values
from verl_gdro.eval.vllm_eval import Sampling, evaluate_files


def brute_pass_at_k(accs: list[int], k: int) -> float:
    """Fraction of k-subsets (without replacement) that contain a success."""
    subsets = list(itertools.combinations(range(len(accs)), k))
    return sum(any(accs[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_subset_enumeration_and_known_values():
    for n in range(1, 10):
        for c in range(n + 1):
            for k in range(1, n + 1):
                accs = [1] * c + [0] * (n - c)
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(accs, k))
    assert pass_at_k(8, 1, 8) == 1.0  # verl's best@8 bootstrap would say ~0.66
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(16, 1, 8) == pytest.approx(1 - comb(15, 8) / comb(16, 8)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="n >= k"):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match="c=9"):
        pass_at_k(8, 9, 8)


def _dump_records(per_bench: dict[str, list[list[int]]], with_source: bool = True, step: int = 1000):
    """Lines as verl's _write_generations writes them: uid = '<prompt uuid>_<session>_<turn>'."""
    recs = []
    for ds, prompts in per_bench.items():
        for p_i, accs in enumerate(prompts):
            uid = str(uuid.uuid4())
            for s, a in enumerate(accs):
                rec = {
                    "input": f"user\n{ds} problem {p_i}\nassistant\n",
                    "output": "...",
                    "gts": f"{p_i}",
                    "score": 1.0 if a else -1.0,
                    "step": step,
                    "reward": 1.0 if a else -1.0,
                    "acc": bool(a),
                    "pred": "x",
                    "uid": f"{uid}_{s}_0",
                }
                if with_source:
                    rec["data_source"] = ds
                recs.append(rec)
    return recs


# Known answers: per benchmark, per prompt, the 8 correctness values.
RUN_A = {
    "math500": [[1] * 8, [1, 0, 0, 0, 0, 0, 0, 0], [0] * 8, [1, 1, 1, 1, 0, 0, 0, 0]],
    "aime24": [[0] * 8, [1] + [0] * 7],
    "aime25": [[1, 1] + [0] * 6, [0] * 8],
    "amc": [[1] * 4 + [0] * 4],
    "minerva": [[0] * 8],
    "olympiadbench": [[1] * 8, [0] * 8],
    "gpqa_diamond": [[1, 0] * 4],
}


def test_score_run_known_values():
    res = score_run(RUN_A, k=8)
    m = res.benchmarks["math500"]
    assert m.prompts == 4 and m.samples == 32
    assert m.mean_at_k == pytest.approx((1 + 1 / 8 + 0 + 0.5) / 4)
    assert m.pass_at_k == pytest.approx(3 / 4)
    # AIME column: mean of the two years' mean@8.
    aime = (np.mean([0, 1 / 8]) + np.mean([2 / 8, 0])) / 2
    assert res.column(("aime24", "aime25")) == pytest.approx(aime)
    # Pooled pass@8: every prompt of every benchmark with equal weight.
    all_prompts = [p for ps in RUN_A.values() for p in ps]
    assert res.prompts == len(all_prompts) == 13
    assert res.pooled_pass_at_k == pytest.approx(np.mean([float(any(p)) for p in all_prompts]))
    assert res.pooled_pass_at_k == pytest.approx(8 / 13)


def test_missing_samples_are_padded_with_failures_like_verl():
    res = score_run({"amc": [[1, 1, 1, 1]]}, k=8)  # 4 of 8 sessions failed
    b = res.benchmarks["amc"]
    assert b.padded_prompts == 1 and b.samples == 8 and b.mean_at_k == pytest.approx(0.5)
    with pytest.raises(ValueError, match="0/1 correctness"):
        score_run({"amc": [[0.5] * 8]}, k=8)


def test_read_verl_dump_groups_by_prompt_uuid_and_data_source(tmp_path):
    d = tmp_path / "val_generations"
    write_dump(_dump_records(RUN_A, step=500), d / "500.jsonl")
    write_dump(_dump_records(RUN_A, step=1000), d / "1000.jsonl")
    assert resolve_dump_file(d).name == "1000.jsonl"
    assert resolve_dump_file(d, 500).name == "500.jsonl"
    with pytest.raises(ValueError, match="step=7 has no dump"):
        resolve_dump_file(d, 7)
    grouped = group_by_prompt(read_dump(d))
    assert sorted(grouped) == sorted(RUN_A)
    for ds, prompts in RUN_A.items():
        assert sorted(map(tuple, grouped[ds])) == sorted(tuple(map(float, p)) for p in prompts)


def test_multi_turn_sessions_count_once(tmp_path):
    uid = str(uuid.uuid4())
    recs = [
        {"uid": f"{uid}_{s}_{t}", "acc": s == 0, "data_source": "amc", "input": "q", "gts": "1"}
        for s in range(8)
        for t in range(3)
    ]
    write_dump(recs, tmp_path / "3.jsonl")
    assert group_by_prompt(read_dump(tmp_path)) == {"amc": [[1.0] + [0.0] * 7]}


def test_dump_without_acc_is_refused(tmp_path):
    write_dump([{"uid": "a_0_0", "score": 1.0, "data_source": "amc"}], tmp_path / "1.jsonl")
    with pytest.raises(ValueError, match="no 'acc' field"):
        read_dump(tmp_path)


def test_data_source_recovered_from_val_files(tmp_path):
    """Dumps from another reward function carry no data_source: map via the val parquet."""
    m5 = prepare_benchmark(
        "math500", [{"problem": "What is 2+5?", "answer": "7"}, {"problem": "2*2?", "answer": "4"}]
    )
    amc = prepare_benchmark("amc", [{"question": "What is 3+4?", "answer": 7.0}], index_offset=2)
    files = []
    for name, df in (("m5", m5), ("amc", amc)):
        files.append(tmp_path / f"{name}.parquet")
        df.to_parquet(files[-1])
    recs = []
    for df in (m5, amc):
        for prompt, rm in zip(df["prompt"], df["reward_model"], strict=True):
            uid = str(uuid.uuid4())
            for s in range(8):
                recs.append(
                    {
                        "input": f"<|user|>{prompt[0]['content']}<|assistant|>",
                        "gts": rm["ground_truth"],
                        "acc": s < 2,
                        "uid": f"{uid}_{s}_0",
                    }
                )
    write_dump(recs, tmp_path / "gen" / "10.jsonl")
    grouped = group_by_prompt(read_dump(tmp_path / "gen", val_files=files))
    assert {k: len(v) for k, v in grouped.items()} == {"math500": 2, "amc": 1}
    with pytest.raises(ValueError, match="no data_source field"):
        read_dump(tmp_path / "gen")


def test_markdown_table_layout_and_relative_gains():
    base = score_run(RUN_A, k=8)
    better = {k: [[1] * 8 for _ in v] for k, v in RUN_A.items()}
    runs = {"GRPO": base, "Prompt-GDRO": score_run(better, k=8)}
    md = markdown_table(runs, baseline="GRPO", k=8, paper_rows=PAPER_TABLE1["4B"])
    lines = md.strip().splitlines()
    assert lines[0] == "| run | MATH500 | AIME24+25 | AMC | Minerva | Olympiad | GPQA | pass@8 |"
    assert lines[2].startswith("| GRPO (paper) | 72.05 | 11.25 |")
    grpo_line = next(line for line in lines if line.startswith("| GRPO |"))
    assert "(" not in grpo_line  # the baseline has no gain against itself
    assert grpo_line.split(" | ")[1] == f"{100 * base.benchmarks['math500'].mean_at_k:.2f}"
    pg_line = next(line for line in lines if line.startswith("| Prompt-GDRO |"))
    gain = 100 * (100.0 - row_values(base)[0]) / row_values(base)[0]
    assert f"100.00 ({gain:+.1f}%)" in pg_line
    assert "pass@8" in lines[0] and "best@" not in md
    with pytest.raises(ValueError, match="baseline='PPO'"):
        markdown_table(runs, baseline="PPO")


def test_eval_cli_end_to_end(tmp_path, capsys):
    for name, data in (("grpo", RUN_A), ("pg", {k: [[1] * 8 for _ in v] for k, v in RUN_A.items()})):
        write_dump(_dump_records(data), tmp_path / name / "1000.jsonl")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out, js = tmp_path / "t.md", tmp_path / "t.json"
    args = parser.parse_args(
        [
            "--run",
            f"GRPO={tmp_path / 'grpo'}",
            "--run",
            f"Prompt-GDRO={tmp_path / 'pg'}",
            "--baseline",
            "GRPO",
            "--paper-model",
            "1.7B",
            "--details",
            "--out",
            str(out),
            "--json",
            str(js),
        ]
    )
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "| Prompt-GDRO (paper) | 63.20 |" in printed and out.read_text() == printed
    data = json.loads(js.read_text())
    assert data["Prompt-GDRO"]["pooled_pass_at_k"] == 1.0
    assert data["GRPO"]["pooled_pass_at_k"] == pytest.approx(8 / 13)
    with pytest.raises(SystemExit):
        parser.parse_args(["--run", "no-equals-sign"])


def test_vllm_eval_path_with_injected_generator(tmp_path):
    """The standalone evaluator's scoring and dump layout, with a fake generator instead of vLLM."""
    df = pd.concat(
        [
            prepare_benchmark("aime25", [{"problem": "Find b.", "answer": "70"}]),
            prepare_benchmark(
                "gpqa_diamond",
                [
                    {
                        "Question": "Q?",
                        "Correct Answer": "a",
                        "Incorrect Answer 1": "b",
                        "Incorrect Answer 2": "c",
                        "Incorrect Answer 3": "d",
                    }
                ],
                index_offset=1,
            ),
        ],
        ignore_index=True,
    )
    f = tmp_path / "val.parquet"
    df.to_parquet(f)
    gpqa_letter = df["reward_model"][1]["ground_truth"]

    def fake_generate(messages, s: Sampling):
        assert len(messages) == 2 and messages[0][0]["role"] == "user"
        return [
            ["Answer: 70"] * 3 + ["Answer: 71"] * (s.n - 3),
            [f"Answer: {gpqa_letter}"] + ["Answer: Z"] * (s.n - 1),
        ]

    recs = evaluate_files([f], "answer", fake_generate, Sampling(n=8))
    assert len(recs) == 16
    write_dump(recs, tmp_path / "gen" / "0.jsonl")
    res = score_run(group_by_prompt(read_dump(tmp_path / "gen")), k=8)
    assert res.benchmarks["aime25"].mean_at_k == pytest.approx(3 / 8)
    assert res.benchmarks["gpqa_diamond"].mean_at_k == pytest.approx(1 / 8)
    assert res.pooled_pass_at_k == 1.0
