"""Preprocessing on small fixture tables in each hub schema, and the template/scorer pairing."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from omegaconf import OmegaConf

from verl_gdro.data.prepare import VAL_INDEX_OFFSET, prepare_all
from verl_gdro.data.reward import compute_score_answer, compute_score_boxed, extract_letter
from verl_gdro.data.sources import (
    BENCHMARKS,
    GPQA_LETTERS,
    normalize_answer,
    prepare_benchmark,
    prepare_dapo,
    prepare_gpqa,
    shuffle_choices,
    validate_rl_frame,
)
from verl_gdro.data.templates import TEMPLATE_DIR, available_templates, load_template

# ---- fixture tables, one per hub schema (column names as on the hub) -------------------------


def dapo_table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "prompt": ["What is 3^3?", "Compute 2+2.", "How many primes are below 10?"],
            "solution": ["27", "4", "4"],
            "data_source": ["math_dapo"] * 3,
            "source_prompt": [[{"role": "user", "content": "Solve ... Answer: $Answer ..."}]] * 3,
            "ability": ["MATH"] * 3,
            "reward_model": [
                {"ground_truth": s, "style": "rule-lighteval/MATH_v2"} for s in ("27", "4", "4")
            ],
            "extra_info": [{"index": f"uuid-{i}"} for i in range(3)],
        }
    )


HUB_FIXTURES: dict[str, list[dict]] = {
    "math500": [
        {
            "problem": "Simplify 28/6.",
            "solution": "... $\\boxed{\\frac{14}{3}}$",
            "answer": "\\frac{14}{3}",
            "subject": "Algebra",
            "level": 2,
            "unique_id": "test/algebra/1.json",
        },
        {
            "problem": "What is 10-3?",
            "solution": "7",
            "answer": "7",
            "subject": "Prealgebra",
            "level": 1,
            "unique_id": "test/prealgebra/2.json",
        },
    ],
    "aime24": [
        {
            "id": 60,
            "problem": "Find the remainder ... 1000.",
            "solution": "... \\boxed{204}",
            "answer": "204",
            "url": "https://aops",
            "year": "2024",
        },
    ],
    "aime25": [{"problem": "Find the sum of all integer bases b > 9 ...", "answer": "70", "id": "0"}],
    "amc": [
        {"id": 0, "question": "How many miles from City A?", "answer": 27.0, "url": "u"},
        {"id": 1, "question": "What is the area?", "answer": 36.0, "url": "u"},
    ],
    "minerva": [{"question": "Compute the wavelength in nm.", "answer": "400"}],
    "olympiadbench": [
        {
            "id": 1606,
            "question": "Find the smallest n.",
            "final_answer": ["$12$"],
            "is_multiple_answer": False,
            "unit": None,
            "answer_type": "Numerical",
        },
    ],
    "gpqa_diamond": [
        {
            "Record ID": "rec1",
            "Question": "Which particle mediates the electromagnetic force?",
            "Correct Answer": "photon",
            "Incorrect Answer 1": "gluon",
            "Incorrect Answer 2": "W boson",
            "Incorrect Answer 3": "graviton",
        },
        {
            "Record ID": "rec2",
            "Question": "What is the charge of an electron?",
            "Correct Answer": "-e",
            "Incorrect Answer 1": "+e",
            "Incorrect Answer 2": "0",
            "Incorrect Answer 3": "+2e",
        },
    ],
}


def loader(name: str):
    return dapo_table() if name == "dapo" else pd.DataFrame(HUB_FIXTURES[name])


# ---- templates ------------------------------------------------------------------------------


def test_templates_are_config_group_files_pairing_text_and_scorer():
    assert available_templates() == ["answer", "boxed"]
    ans, box = load_template("answer"), load_template("boxed")
    assert ans.reward_function == "compute_score_answer" and ans.scorer == "math_dapo"
    assert box.reward_function == "compute_score_boxed" and box.scorer == "math_verify"
    rendered = ans.render("What is 1+1?")
    assert rendered.startswith("Solve the following math problem step by step.")
    assert "\n\nWhat is 1+1?\n\n" in rendered and rendered.endswith('after "Answer:".')
    assert box.render("What is 1+1?") == (
        "What is 1+1? Let's think step by step and output the final answer within \\boxed{}."
    )
    # The YAML the recipes select is the file preprocessing reads: same reward function.
    for name in available_templates():
        cfg = OmegaConf.load(TEMPLATE_DIR / f"{name}.yaml")
        assert cfg.reward.custom_reward_function.path == "pkg://verl_gdro.data.reward"
        assert cfg.reward.custom_reward_function.name == load_template(name).reward_function
    with pytest.raises(ValueError, match="template='latex' is unknown"):
        load_template("latex")


# ---- converters -----------------------------------------------------------------------------


def test_normalize_answer():
    assert normalize_answer(27.0) == "27"
    assert normalize_answer("27.0") == "27"
    assert normalize_answer("2.5") == "2.5"
    assert normalize_answer(["$12$"]) == "12"
    assert normalize_answer("The answer is \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert normalize_answer("$x^2+1$") == "x^2+1"
    with pytest.raises(ValueError, match="empty"):
        normalize_answer([])


def test_dapo_rows_have_verl_schema_and_stable_unique_index():
    df = prepare_dapo(dapo_table(), "answer")
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert list(df["data_source"]) == ["math_dapo"] * 3
    assert [e["index"] for e in df["extra_info"]] == [0, 1, 2]
    assert [e["source_id"] for e in df["extra_info"]] == ["uuid-0", "uuid-1", "uuid-2"]
    assert {e["template"] for e in df["extra_info"]} == {"answer"}
    assert df["reward_model"][0] == {"style": "rule", "ground_truth": "27"}
    msg = df["prompt"][0]
    assert msg[0]["role"] == "user" and "What is 3^3?" in msg[0]["content"] and "Answer:" in msg[0]["content"]
    again = prepare_dapo(dapo_table(), "answer")
    assert again.equals(df)  # deterministic: the index is the prompt id across restarts


def test_validate_rejects_duplicate_and_missing_index():
    df = prepare_dapo(dapo_table())
    dup = df.copy()
    dup.at[2, "extra_info"] = {**df["extra_info"][2], "index": 0}
    with pytest.raises(ValueError, match=r"extra_info.index=0 is duplicated \(rows 0 and 2\)"):
        validate_rl_frame(dup)
    missing = df.copy()
    missing.at[1, "extra_info"] = {"split": "train"}
    with pytest.raises(ValueError, match="extra_info.index is missing"):
        validate_rl_frame(missing)
    with pytest.raises(ValueError, match="lacks columns"):
        validate_rl_frame(df.drop(columns=["reward_model"]))


def test_benchmark_answers_are_normalised():
    amc = prepare_benchmark("amc", pd.DataFrame(HUB_FIXTURES["amc"]))
    assert [r["ground_truth"] for r in amc["reward_model"]] == ["27", "36"]
    ob = prepare_benchmark("olympiadbench", pd.DataFrame(HUB_FIXTURES["olympiadbench"]))
    assert ob["reward_model"][0]["ground_truth"] == "12"
    m5 = prepare_benchmark("math500", HUB_FIXTURES["math500"], "boxed")
    assert m5["reward_model"][0]["ground_truth"] == "\\frac{14}{3}"
    assert m5["prompt"][0][0]["content"].endswith("within \\boxed{}.")
    with pytest.raises(ValueError, match="no problem column"):
        prepare_benchmark("minerva", [{"text": "x", "answer": "1"}])


def test_gpqa_shuffle_is_seeded_by_question_and_letter_points_to_correct_answer():
    df = prepare_gpqa(pd.DataFrame(HUB_FIXTURES["gpqa_diamond"]), "answer", seed=0)
    for rec, prompt, rm in zip(HUB_FIXTURES["gpqa_diamond"], df["prompt"], df["reward_model"], strict=True):
        letter = rm["ground_truth"]
        assert letter in GPQA_LETTERS
        assert f"{letter}) {rec['Correct Answer']}\n" in prompt[0]["content"] + "\n"
    # Same order when the table is reversed (seeded by question, not by row position).
    rev = prepare_gpqa(pd.DataFrame(HUB_FIXTURES["gpqa_diamond"][::-1]), "answer", seed=0)
    assert [r["ground_truth"] for r in rev["reward_model"]] == [
        r["ground_truth"] for r in df["reward_model"]
    ][::-1]
    # Over many questions the correct letter is spread over A-D, and the seed changes the orders.
    letters0 = [shuffle_choices(f"q{i}", "c", ["x", "y", "z"], seed=0)[1] for i in range(200)]
    letters1 = [shuffle_choices(f"q{i}", "c", ["x", "y", "z"], seed=1)[1] for i in range(200)]
    assert set(letters0) == set(GPQA_LETTERS)
    assert min(letters0.count(x) for x in GPQA_LETTERS) > 25
    assert letters0 != letters1


def test_prepare_all_writes_parquet_with_unique_indices(tmp_path):
    manifest = prepare_all(tmp_path, template="answer", loader=loader)
    root = tmp_path / "answer"
    train = pd.read_parquet(root / "train.parquet")
    val = pd.read_parquet(root / "val.parquet")
    assert len(train) == 3 and [e["index"] for e in train["extra_info"]] == [0, 1, 2]
    n_val = sum(len(v) for v in HUB_FIXTURES.values())
    assert len(val) == n_val
    idx = [e["index"] for e in val["extra_info"]]
    assert idx == list(range(VAL_INDEX_OFFSET, VAL_INDEX_OFFSET + n_val))
    assert set(val["data_source"]) == set(BENCHMARKS)
    for name in BENCHMARKS:
        part = pd.read_parquet(root / "val" / f"{name}.parquet")
        assert set(part["data_source"]) == {name}
        assert manifest["files"][name]["rows"] == len(HUB_FIXTURES[name])
    validate_rl_frame(val)  # round trip through parquet keeps the schema
    on_disk = json.loads((root / "manifest.json").read_text())
    assert on_disk["template"] == "answer" and on_disk["scorer"] == "math_dapo"
    assert "warning" in on_disk["files"]["train"]  # 3 rows, not the paper's 14,116
    with pytest.raises(ValueError, match="benchmark='mmlu' is unknown"):
        prepare_all(tmp_path, loader=loader, benchmarks=["mmlu"])


# ---- reward functions: a correct response in each template scores correct, a wrong one not ----

WRONG = {"choice": None, "math": "999983"}


def _responses(template: str, kind: str, gt: str) -> tuple[str, str]:
    wrong = next(x for x in GPQA_LETTERS if x != gt) if kind == "choice" else WRONG["math"]
    if template == "answer":
        return (f"Let me work it out step by step.\nAnswer: {gt}", f"Let me work it out.\nAnswer: {wrong}")
    return (f"Step by step... so the result is \\boxed{{{gt}}}.", f"So the result is \\boxed{{{wrong}}}.")


def _score_all(template: str, fn) -> list[tuple[str, dict, dict]]:
    out = []
    for name, bench in BENCHMARKS.items():
        df = prepare_benchmark(name, HUB_FIXTURES[name], template)
        for rm, extra in zip(df["reward_model"], df["extra_info"], strict=True):
            gt = rm["ground_truth"]
            good, bad = _responses(template, bench.kind, gt)
            out.append((name, fn(name, good, gt, extra_info=extra), fn(name, bad, gt, extra_info=extra)))
    return out


def _load_configured_fn(template: str):
    """The reward function exactly as verl loads it from the template group's YAML."""
    from verl.utils.import_utils import load_extern_object

    cfg = OmegaConf.load(TEMPLATE_DIR / f"{template}.yaml").reward.custom_reward_function
    return load_extern_object(module_path=cfg.path, object_name=cfg.name)


@pytest.mark.slow  # imports verl (math_dapo and verl's loader): ~20 s on a loaded machine
def test_answer_template_scores_every_benchmark():
    fn = _load_configured_fn("answer")
    assert fn is compute_score_answer
    results = _score_all("answer", fn)
    assert {r[0] for r in results} == set(BENCHMARKS)
    for name, good, bad in results:
        assert good["acc"] == 1.0 and good["score"] == 1.0, (name, good)
        assert bad["acc"] == 0.0 and bad["score"] == -1.0, (name, bad)
        assert good["data_source"] == name
    train = prepare_dapo(dapo_table(), "answer")
    r = fn("math_dapo", "so\nAnswer: 27", "27", extra_info=train["extra_info"][0])
    assert r["acc"] == 1.0
    # verl 0.9.1's math_dapo falls back to the last \boxed{} when there is no "Answer:" line
    # (DATA.md says a boxed-only response scores -1; 0.9.1's code credits it). The "Answer:" line
    # wins when both are present, and a bare number is not an answer.
    info = {"template": "answer"}
    assert fn("math_dapo", "so \\boxed{27}", "27", extra_info=info)["acc"] == 1.0
    assert fn("math_dapo", "so \\boxed{27}\nAnswer: 26", "27", extra_info=info)["acc"] == 0.0
    assert fn("math_dapo", "so 27", "27", extra_info=info)["acc"] == 0.0


@pytest.mark.slow
def test_boxed_template_scores_every_benchmark():
    pytest.importorskip("math_verify")
    fn = _load_configured_fn("boxed")
    assert fn is compute_score_boxed
    for name, good, bad in _score_all("boxed", fn):
        assert good["acc"] == 1.0 and good["score"] == 1.0, (name, good)
        assert bad["acc"] == 0.0 and bad["score"] == -1.0, (name, bad)
    # Symbolic equivalence, and an "Answer:" line is not a boxed answer.
    assert (
        fn("math500", "\\boxed{\\dfrac{28}{6}}", "\\frac{14}{3}", extra_info={"template": "boxed"})["acc"]
        == 1.0
    )
    assert (
        fn("math500", "Answer: \\frac{14}{3}", "\\frac{14}{3}", extra_info={"template": "boxed"})["acc"]
        == 0.0
    )


def test_boxed_equivalence_in_process():
    """The math-verify check itself (no pool): symbolic equality, not string equality."""
    pytest.importorskip("math_verify")
    from verl_gdro.data.boxed_verify import verify_boxed

    assert verify_boxed("\\frac{14}{3}", "so \\boxed{\\dfrac{28}{6}}")
    assert verify_boxed("0.5", "hence \\boxed{\\frac{1}{2}}")
    assert verify_boxed("204", "\\boxed{204}")
    assert not verify_boxed("204", "\\boxed{205}")
    assert not verify_boxed("\\frac{14}{3}", "\\boxed{\\frac{3}{14}}")


def test_template_mismatch_is_refused_not_scored_minus_one():
    boxed_rows = prepare_benchmark("aime25", HUB_FIXTURES["aime25"], "boxed")
    with pytest.raises(ValueError, match="extra_info.template='boxed'.*template 'answer'"):
        compute_score_answer("aime25", "\\boxed{70}", "70", extra_info=boxed_rows["extra_info"][0])
    with pytest.raises(ValueError, match="data_source='mmlu' has no scorer"):
        compute_score_answer("mmlu", "Answer: 1", "1")


def test_gpqa_letter_extraction():
    assert extract_letter("C") == "C"
    assert extract_letter("(B) photon") == "B"
    assert extract_letter("\\text{D}") == "D"
    assert extract_letter("**A**") == "A"
    assert extract_letter("Photon") is None
    assert extract_letter("Because") is None
    assert compute_score_answer("gpqa_diamond", "Answer: Because of A", "A")["acc"] == 0.0
