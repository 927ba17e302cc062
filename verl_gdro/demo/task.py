"""The demo's verifiable arithmetic task: heavy-tailed difficulty, stable ids, verl's scorer.

Why this task: GDRO is about a *skewed* difficulty mix, where the average gradient is dominated by
the easy majority and the rare hard prompts are starved. Additions with more digits and more
operands are a ladder of difficulty that a tiny character-level model climbs in minutes, and whose
answers are checked exactly. Most training problems are easy (level 0), a long tail is hard.

Every problem has a stable integer id (its row index in the fixed train set), which is what the
online classifier keys on (spec section 1); the evaluation set is held out (different seed, no
overlap with the train set) and stratified: the same number of problems at every level, so the
worst level is measured as precisely as the easiest one.

Responses are scored by verl's own ``math_dapo.compute_score`` on an ``Answer: N`` line, reading
its ``acc`` (binary correctness), never the shaped +-1 score (spec notation; defect 5 of the
released patch was a prompt/scorer mismatch, so the prompt template lives here, next to the
scorer, and a test checks them together).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "LEVELS",
    "LEVEL_WEIGHTS",
    "Problem",
    "draw_operands",
    "make_eval_set",
    "make_train_set",
    "pass_at_k",
    "prompt_text",
    "response_text",
    "score_response",
]

# Level -> operand digit counts. Difficulty grows with operands (a longer sum to carry in one's
# head) and with digits (carries across columns, which a tiny model learns last).
LEVELS: tuple[tuple[int, ...], ...] = (
    (1, 1),  # 3+5
    (1, 1, 1),  # 3+5+2
    (2, 1),  # 47+8
    (1, 1, 1, 1, 1),  # 3+5+2+9+4
    (2, 2),  # 47+38
    (2, 2, 1),  # 47+38+6
)
# Heavy-tailed training mix: about half the problems are trivial, 1 in 20 is of the hardest kind.
LEVEL_WEIGHTS: tuple[float, ...] = (0.45, 0.22, 0.13, 0.09, 0.06, 0.05)

ANSWER_INSTRUCTION = "End with Answer: N"


@dataclass(frozen=True)
class Problem:
    """One arithmetic problem; ``uid`` is stable (train-set row index) and ``level`` its difficulty."""

    uid: int
    level: int
    operands: tuple[int, ...]

    @property
    def question(self) -> str:
        return "+".join(str(x) for x in self.operands)

    @property
    def answer(self) -> str:
        return str(sum(self.operands))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["operands"] = list(self.operands)
        return d


def draw_operands(rng: np.random.Generator, level: int) -> tuple[int, ...]:
    """Random operands of ``level`` (a d-digit operand has no leading zero)."""
    ops = []
    for digits in LEVELS[level]:
        lo = 0 if digits == 1 else 10 ** (digits - 1)
        ops.append(int(rng.integers(lo, 10**digits)))
    return tuple(ops)


def make_train_set(size: int, seed: int = 0) -> list[Problem]:
    """A fixed train set of ``size`` problems drawn from the heavy-tailed level mix.

    Deterministic in (size, seed); ``uid`` is the row index. Every level gets at least one
    problem so that the hardest bin can exist at all in small (``--quick``) runs.
    """
    if size < len(LEVELS):
        raise ValueError(f"train size={size} must be >= the number of levels ({len(LEVELS)})")
    rng = np.random.default_rng([seed, 11])
    levels = rng.choice(len(LEVELS), size=size, p=np.asarray(LEVEL_WEIGHTS) / sum(LEVEL_WEIGHTS))
    levels[: len(LEVELS)] = np.arange(len(LEVELS))  # at least one of each level
    levels = rng.permutation(levels)
    return [Problem(uid=i, level=int(lv), operands=draw_operands(rng, int(lv))) for i, lv in enumerate(levels)]


def make_eval_set(per_level: int, seed: int = 0, exclude: Sequence[Problem] = ()) -> list[Problem]:
    """A held-out evaluation set with ``per_level`` problems at every level (stratified).

    Problems whose question appears in ``exclude`` (the train set) are redrawn, so evaluation
    measures generalisation rather than memorisation. Eval uids start at 1_000_000 so they can
    never be confused with train ids.
    """
    if per_level < 1:
        raise ValueError(f"eval per_level={per_level} must be >= 1")
    rng = np.random.default_rng([seed, 23])
    seen = {p.question for p in exclude}
    out: list[Problem] = []
    for level in range(len(LEVELS)):
        count = 0
        attempts = 0
        while count < per_level:
            ops = draw_operands(rng, level)
            attempts += 1
            q = "+".join(str(x) for x in ops)
            # Level 0 has only 100 distinct problems; allow repeats there rather than loop forever.
            if q in seen and attempts < 50 * per_level:
                continue
            seen.add(q)
            out.append(Problem(uid=1_000_000 + len(out), level=level, operands=ops))
            count += 1
    return out


def prompt_text(problem: Problem) -> str:
    """The user message: the question and the instruction to answer on an ``Answer:`` line."""
    return f"{problem.question}=? {ANSWER_INSTRUCTION}"


def response_text(problem: Problem) -> str:
    """The reference response (for the warm start): exactly the line the scorer reads."""
    return f"Answer: {problem.answer}"


def score_response(response: str, problem: Problem) -> bool:
    """Binary correctness from verl's ``math_dapo.compute_score`` (its ``acc``, not the +-1 score)."""
    from verl.utils.reward_score.math_dapo import compute_score

    return bool(compute_score(response, problem.answer)["acc"])


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` correct out of ``n`` samples: 1 - C(n-c, k) / C(n, k).

    (Chen et al. 2021.) With n == k it is the plain "any of k correct" indicator.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c}, n={n}")
    if k < 1 or k > n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
