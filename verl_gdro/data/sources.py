"""DAPO training set and the seven validation benchmarks, converted to verl's RL parquet rows.

Each converter takes a table in its hub schema (anything :func:`to_records` reads) and returns
verl 0.9.1's RL rows (``data_source``, ``prompt`` messages, ``ability``, ``reward_model``,
``extra_info``). ``extra_info.index``, the row's position in its split, is the stable prompt id
the classifier keys on (docs/algorithm.md, section 1), checked unique; ``extra_info.template``
lets the reward function refuse a mismatch. No network here: :mod:`verl_gdro.data.prepare` loads.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from verl_gdro.data.templates import PromptTemplate, load_template

TRAIN_SOURCE = "math_dapo"
GPQA_LETTERS = ("A", "B", "C", "D")
GPQA_INSTRUCTION = "Answer with the letter (A, B, C or D) of the correct option."
DEFAULT_GPQA_SEED = 0


@dataclass(frozen=True)
class Benchmark:
    """A validation benchmark: its ``data_source`` name, hub location and answer kind."""

    name: str
    hub_id: str
    hub_config: str | None
    split: str
    kind: str  # "math" (free-form answer) | "choice" (GPQA letter)


# data_source names are ours (short, stable, used as column keys by the eval tables); the custom
# reward function routes every one of them, so verl's default router is never consulted.
BENCHMARKS: dict[str, Benchmark] = {
    "math500": Benchmark("math500", "HuggingFaceH4/MATH-500", None, "test", "math"),
    "aime24": Benchmark("aime24", "HuggingFaceH4/aime_2024", None, "train", "math"),
    "aime25": Benchmark("aime25", "math-ai/aime25", None, "test", "math"),
    "amc": Benchmark("amc", "math-ai/amc23", None, "test", "math"),
    "minerva": Benchmark("minerva", "math-ai/minervamath", None, "test", "math"),
    "olympiadbench": Benchmark("olympiadbench", "math-ai/olympiadbench", None, "test", "math"),
    "gpqa_diamond": Benchmark("gpqa_diamond", "Idavidrein/gpqa", "gpqa_diamond", "train", "choice"),
}
DAPO_HUB_ID = "open-r1/DAPO-Math-17k-Processed"
DAPO_HUB_CONFIG = "en"
DAPO_EXPECTED_ROWS = 14116

# Column names seen across the hub variants of each benchmark, first match wins.
PROBLEM_KEYS = ("problem", "question", "Problem", "Question", "prompt")
ANSWER_KEYS = ("answer", "final_answer", "Answer", "solution")


def to_records(table: Any) -> list[dict[str, Any]]:
    """Rows of ``table`` as dicts: datasets.Dataset, pandas DataFrame or an iterable of mappings."""
    if isinstance(table, pd.DataFrame):
        return table.to_dict(orient="records")
    if hasattr(table, "to_pandas"):
        return table.to_pandas().to_dict(orient="records")
    if isinstance(table, Iterable):
        rows = list(table)
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise ValueError(f"table row {i} is a {type(row).__name__}, expected a mapping")
        return [dict(r) for r in rows]
    raise ValueError(f"table must be a DataFrame, a datasets.Dataset or rows of dicts, got {type(table).__name__}")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    body, depth = start + len("\\boxed{"), 1
    for i, ch in enumerate(text[body:], body):
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return text[body:i]
    return None


_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def normalize_answer(value: Any) -> str:
    """A ground truth as the string the scorers compare: a list's first element, a solution's
    boxed content, without enclosing ``$``, integral floats as integers (math_dapo compares
    strings, so AMC's "27.0" would never match "27")."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("answer list is empty")
        value = value[0]
    if isinstance(value, bool) or value is None:
        raise ValueError(f"answer must be a string or a number, got {value!r}")
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    text = str(value).strip()
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed.strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    if _FLOAT_RE.match(text.replace(",", "")) and "," not in text:
        number = float(text)
        if number.is_integer() and abs(number) < 1e15:
            text = str(int(number))
    if not text:
        raise ValueError(f"answer {value!r} is empty after normalisation")
    return text


def _pick(row: Mapping[str, Any], keys: Sequence[str], what: str, source: str) -> Any:
    for key in keys:
        if key in row and row[key] is not None and not (isinstance(row[key], float) and pd.isna(row[key])):
            return row[key]
    raise ValueError(f"{source}: row has no {what} column; looked for {list(keys)}, found {sorted(row)}")


def _row(data_source: str, content: str, ground_truth: str, index: int, template: PromptTemplate, split: str,
         source_id: str, ability: str = "math") -> dict[str, Any]:
    return {"data_source": data_source, "prompt": [{"role": "user", "content": content}], "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"index": int(index), "split": split, "template": template.name, "source_id": str(source_id)}}


def _rl_frame(table: Any, template: PromptTemplate | str,
              convert: Callable[[int, dict[str, Any], PromptTemplate], dict[str, Any]]) -> pd.DataFrame:
    """``convert(position, record, template)`` of every row of ``table``, checked by :func:`validate_rl_frame`."""
    tpl = load_template(template) if isinstance(template, str) else template
    return validate_rl_frame(pd.DataFrame([convert(i, rec, tpl) for i, rec in enumerate(to_records(table))]))


def prepare_dapo(table: Any, template: PromptTemplate | str = "answer", index_offset: int = 0) -> pd.DataFrame:
    """DAPO-Math-17k-Processed (``en``: bare ``prompt``, integer ``solution``; the DAPO-templated
    ``source_prompt`` is ignored) to RL rows; ``extra_info.index`` = row position + offset."""
    def convert(i: int, rec: dict[str, Any], tpl: PromptTemplate) -> dict[str, Any]:
        problem = _pick(rec, ("prompt", "problem"), "problem", "dapo")
        if not isinstance(problem, str):
            raise ValueError(f"dapo row {i}: column 'prompt' must be the bare problem string, got "
                             f"{type(problem).__name__}")
        answer = _pick(rec, ("solution", "answer"), "answer", "dapo")
        if isinstance(answer, Mapping):  # defensive: some mirrors nest it under reward_model
            answer = answer.get("ground_truth")
        src_extra = rec.get("extra_info")
        source_id = src_extra.get("index", i) if isinstance(src_extra, Mapping) else i
        return _row(TRAIN_SOURCE, tpl.render(problem), normalize_answer(answer), index_offset + i, tpl, "train",
                    str(source_id))
    return _rl_frame(table, template, convert)


def prepare_math_benchmark(name: str, table: Any, template: PromptTemplate | str = "answer",
                           index_offset: int = 0) -> pd.DataFrame:
    """A free-form-answer benchmark (MATH-500, AIME 24/25, AMC, Minerva, OlympiadBench) to RL rows."""
    if name not in BENCHMARKS or BENCHMARKS[name].kind != "math":
        allowed = [k for k, b in BENCHMARKS.items() if b.kind == "math"]
        raise ValueError(f"benchmark={name!r} is not a math benchmark; allowed: {allowed}")
    def convert(i: int, rec: dict[str, Any], tpl: PromptTemplate) -> dict[str, Any]:
        problem = _pick(rec, PROBLEM_KEYS, "problem", name)
        answer = _pick(rec, ANSWER_KEYS, "answer", name)
        source_id = rec.get("id", rec.get("unique_id", i))
        return _row(name, tpl.render(str(problem)), normalize_answer(answer), index_offset + i, tpl, "test",
                    str(source_id))
    return _rl_frame(table, template, convert)


def shuffle_choices(question: str, correct: str, incorrect: Sequence[str], seed: int) -> tuple[list[str], str]:
    """Options in an order set by (seed, question) only, not the row's position, and the correct letter."""
    options = [str(correct).strip()] + [str(x).strip() for x in incorrect]
    if len(options) != len(GPQA_LETTERS):
        raise ValueError(f"GPQA needs 1 correct and 3 incorrect answers, got {len(options)} options")
    digest = hashlib.sha256(f"{seed}\n{question}".encode()).hexdigest()
    order = list(range(len(options)))
    random.Random(int(digest[:16], 16)).shuffle(order)
    shuffled = [options[j] for j in order]
    return shuffled, GPQA_LETTERS[order.index(0)]


def prepare_gpqa(table: Any, template: PromptTemplate | str = "answer", seed: int = DEFAULT_GPQA_SEED,
                 index_offset: int = 0) -> pd.DataFrame:
    """GPQA-Diamond (``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``) to 4-way choice rows."""
    def convert(i: int, rec: dict[str, Any], tpl: PromptTemplate) -> dict[str, Any]:
        question = str(_pick(rec, ("Question", "question"), "question", "gpqa_diamond"))
        correct = _pick(rec, ("Correct Answer",), "correct answer", "gpqa_diamond")
        incorrect = [_pick(rec, (f"Incorrect Answer {j}",), f"incorrect answer {j}", "gpqa_diamond") for j in (1, 2, 3)]
        options, letter = shuffle_choices(question, correct, incorrect, seed)
        lettered = "\n".join(f"{x}) {opt}" for x, opt in zip(GPQA_LETTERS, options, strict=True))
        problem = f"{question.strip()}\n\n{lettered}\n\n{GPQA_INSTRUCTION}"  # the template's {problem}
        source_id = rec.get("Record ID", rec.get("id", i))
        return _row("gpqa_diamond", tpl.render(problem), letter, index_offset + i, tpl, "test", str(source_id),
                    ability="science")
    return _rl_frame(table, template, convert)


def prepare_benchmark(name: str, table: Any, template: PromptTemplate | str = "answer", index_offset: int = 0,
                      gpqa_seed: int = DEFAULT_GPQA_SEED) -> pd.DataFrame:
    """Dispatch to the converter of benchmark ``name``."""
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark={name!r} is unknown; allowed: {sorted(BENCHMARKS)}")
    if BENCHMARKS[name].kind == "choice":
        return prepare_gpqa(table, template, seed=gpqa_seed, index_offset=index_offset)
    return prepare_math_benchmark(name, table, template, index_offset=index_offset)


REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def validate_rl_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` unchanged after checking verl's RL schema and a unique integer ``extra_info.index`` (a
    duplicate would silently merge two prompts' histories); a ValueError names column and row."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"RL table lacks columns {missing}; required: {list(REQUIRED_COLUMNS)}")
    seen: dict[int, int] = {}
    templates = set()
    for pos, (prompt, rm, extra) in enumerate(zip(df["prompt"], df["reward_model"], df["extra_info"], strict=True)):
        msgs = list(prompt) if prompt is not None else []
        if not msgs or not all(isinstance(m, Mapping) and m.get("role") and m.get("content") for m in msgs):
            raise ValueError(f"row {pos}: prompt must be a non-empty list of {{role, content}} messages")
        if not isinstance(rm, Mapping) or not str(rm.get("ground_truth") or "").strip():
            raise ValueError(f"row {pos}: reward_model.ground_truth is missing or empty")
        if not isinstance(extra, Mapping) or "index" not in extra:
            raise ValueError(f"row {pos}: extra_info.index is missing (the stable prompt id)")
        idx = extra["index"]
        if isinstance(idx, bool) or not float(idx).is_integer():
            raise ValueError(f"row {pos}: extra_info.index={idx!r} must be an integer")
        idx = int(idx)
        if idx in seen:
            raise ValueError(f"extra_info.index={idx} is duplicated (rows {seen[idx]} and {pos}); prompt ids must be "
                             "unique")
        seen[idx] = pos
        templates.add(extra.get("template"))
    if len(templates) > 1:
        raise ValueError(f"extra_info.template mixes templates {sorted(map(str, templates))}; one table, one template")
    return df


def concat_frames(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate RL tables and re-check index uniqueness across them."""
    return validate_rl_frame(pd.concat(list(frames), ignore_index=True))
