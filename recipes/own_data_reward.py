"""Example reward for your own data: +1 for a correct final answer, -1 otherwise (the paper's reward).

verl loads it with ``reward.custom_reward_function.path=recipes/own_data_reward.py
reward.custom_reward_function.name=compute_score``. It returns a plain float: verl's reward
manager then records that float as the score and, under ``acc``, as the correctness, and
verl-gdro counts a response as correct when that value is above ``gdro.correct_threshold``
(0.0 by default: +1 correct, -1 wrong). A shaped score (e.g. with a length penalty) works the same
way; return a dict with a binary ``acc`` beside ``score`` to keep correctness apart from shaping.
See docs/integration.md, "Bring your own data and reward".
"""

from __future__ import annotations

import re
from typing import Any

_LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs: Any) -> float:
    """+1 when the last number in the response equals the ground truth, else -1."""
    found = _LAST_NUMBER.findall(solution_str or "")
    return 1.0 if found and found[-1] == str(ground_truth).strip() else -1.0
