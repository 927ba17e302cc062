"""Reward functions for ``reward.custom_reward_function``, one per prompt template (the template
group names it): verl 0.9.1's default router raises for AMC, Minerva, OlympiadBench and GPQA.

Both return ``score`` in {-1, +1}, ``acc`` in {0, 1} (what GDRO and pass@k read, never the score),
``pred`` and ``data_source`` (for :mod:`verl_gdro.eval`). A row of another template is refused
(the release's defect 5: a silent -1 everywhere looks like a hard task). verl is imported lazily.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from verl_gdro.data.sources import BENCHMARKS, TRAIN_SOURCE, last_boxed

# Sources graded as free-form math answers: ours plus the verl/DAPO names a user may keep.
MATH_SOURCES = frozenset(
    {TRAIN_SOURCE, "math", "dapo_math"} | {k for k, b in BENCHMARKS.items() if b.kind == "math"}
)
CHOICE_SOURCES = frozenset(k for k, b in BENCHMARKS.items() if b.kind == "choice")

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_LETTER = re.compile(r"^\s*(?:\\text\{|\\textbf\{|\\mathrm\{|\(|\[|\*\*|\$)*\s*([A-D])(?![A-Za-z])")


def _kind(data_source: str) -> str:
    if data_source in CHOICE_SOURCES:
        return "choice"
    if data_source in MATH_SOURCES or str(data_source).startswith("aime"):
        return "math"
    raise ValueError(
        f"data_source={data_source!r} has no scorer in verl_gdro.data.reward; "
        f"allowed: {sorted(MATH_SOURCES | CHOICE_SOURCES)} (or names starting with 'aime')"
    )


def _check_template(extra_info: Any, expected: str) -> None:
    got = extra_info.get("template") if isinstance(extra_info, Mapping) else None
    if got is not None and got != expected:
        raise ValueError(
            f"extra_info.template={got!r} but the reward function grades template {expected!r}: "
            f"select template={got} (the config group pairs each template with its scorer) "
            "or prepare the data with the template you train with"
        )


def extract_letter(text: str | None) -> str | None:
    """The option letter A-D at the start of an extracted answer ("C", "(C)", "\\text{C}) 42", ...)."""
    if text is None:
        return None
    m = _LETTER.match(text.strip())
    return m.group(1) if m else None


def answer_line(solution_str: str) -> str | None:
    """The text after the last "Answer:" in the last 300 characters (math_dapo's window)."""
    matches = _ANSWER_LINE.findall(solution_str[-300:])
    return matches[-1].strip() if matches else None


def _result(correct: bool, pred: Any, data_source: str) -> dict[str, Any]:
    return {
        "score": 1.0 if correct else -1.0,
        "acc": 1.0 if correct else 0.0,
        "pred": "" if pred is None else str(pred),
        "data_source": str(data_source),
    }


def compute_score_answer(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs: Any
) -> dict[str, Any]:
    """Score a response to the "Answer:" template (verl's math_dapo; GPQA by letter)."""
    _check_template(extra_info, "answer")
    if _kind(data_source) == "choice":
        pred = extract_letter(answer_line(solution_str))
        return _result(pred is not None and pred == str(ground_truth).strip().upper(), pred, data_source)
    from verl.utils.reward_score import math_dapo

    res = math_dapo.compute_score(solution_str, str(ground_truth))
    return _result(bool(res["acc"]), res.get("pred"), data_source)


def compute_score_boxed(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs: Any
) -> dict[str, Any]:
    """Score a response to the boxed template (math-verify on the last ``\\boxed{}``, in
    :mod:`verl_gdro.data.boxed_verify`'s pool; GPQA by boxed letter)."""
    _check_template(extra_info, "boxed")
    boxed = last_boxed(solution_str)
    if _kind(data_source) == "choice":
        pred = extract_letter(boxed)
        return _result(pred is not None and pred == str(ground_truth).strip().upper(), pred, data_source)
    try:
        import math_verify  # noqa: F401
    except ImportError as e:  # verl's wrapper would print and return 0 for every response
        raise ImportError(
            "template=boxed grades with math-verify: pip install math-verify==0.9.0 (or use template=answer)"
        ) from e
    from verl_gdro.data.boxed_verify import is_equivalent

    if boxed is None:  # the template asks for \boxed{}; math-verify alone would also accept bare text
        return _result(False, None, data_source)
    return _result(is_equivalent(str(ground_truth), solution_str), boxed, data_source)


# verl's default function name: the "answer" template is the default.
compute_score = compute_score_answer

SCORERS = {"answer": compute_score_answer, "boxed": compute_score_boxed}
