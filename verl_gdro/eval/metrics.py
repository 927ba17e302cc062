"""mean@k and unbiased pass@k (Chen et al. 2021), per benchmark and pooled: the paper's Table 1.

verl logs ``val-core/<source>/acc/best@N/mean``: a bootstrap over resamples with replacement,
which gives about 0.66 to a prompt with 1 correct of 8, where pass@8 is 1. It is not pass@N and
is never used here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import comb

import numpy as np

# Paper's Table 1 columns, in order: (column title, benchmarks averaged into it).
TABLE_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("MATH500", ("math500",)),
    ("AIME24+25", ("aime24", "aime25")),
    ("AMC", ("amc",)),
    ("Minerva", ("minerva",)),
    ("Olympiad", ("olympiadbench",)),
    ("GPQA", ("gpqa_diamond",)),
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``c`` correct of ``n`` samples: 1 - C(n-c, k) / C(n, k), 1[c >= 1]
    at n = k. Needs n >= k (fewer samples cannot estimate pass@k without bias)."""
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    if n < k:
        raise ValueError(f"pass@k needs n >= k samples per prompt; got n={n}, k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must be in [0, n={n}]")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class BenchmarkResult:
    """Per-benchmark scores: prompts, samples per prompt, mean@k and pass@k (fractions in [0, 1])."""

    name: str
    prompts: int
    samples: int
    mean_at_k: float
    pass_at_k: float
    padded_prompts: int = 0


@dataclass
class RunResult:
    """One run's scores: per benchmark, the pooled pass@k over all prompts, and k."""

    k: int
    benchmarks: dict[str, BenchmarkResult] = field(default_factory=dict)
    pooled_pass_at_k: float = float("nan")
    prompts: int = 0

    def column(self, members: Sequence[str]) -> float:
        """A table column: the mean of its benchmarks' mean@k (AIME = mean of 2024 and 2025)."""
        vals = [self.benchmarks[m].mean_at_k for m in members if m in self.benchmarks]
        return float(np.mean(vals)) if vals else float("nan")


def score_run(
    per_prompt: Mapping[str, Iterable[Sequence[float]]], k: int = 8, n_expected: int | None = None
) -> RunResult:
    """Scores from ``{benchmark: [acc values of one prompt, ...]}``: mean@k and pass@k per benchmark,
    pass@k pooled over all prompts (the paper's column). A prompt with fewer than ``n_expected``
    (default k) samples is padded with failures, as verl pads failed sessions, and counted."""
    n_exp = k if n_expected is None else n_expected
    result = RunResult(k=k)
    pooled: list[float] = []
    for name, prompts in per_prompt.items():
        means, passes, padded, total = [], [], 0, 0
        for accs in prompts:
            a = [float(x) for x in accs]
            if any(x not in (0.0, 1.0) for x in a):
                raise ValueError(f"{name}: acc values must be 0/1 correctness, got {sorted(set(a))[:5]}")
            if len(a) < n_exp:
                padded += 1
                a = a + [0.0] * (n_exp - len(a))
            n, c = len(a), int(sum(a))
            means.append(c / n)
            passes.append(pass_at_k(n, c, k))
            total += n
        if not means:
            continue
        result.benchmarks[name] = BenchmarkResult(name, len(means), total, float(np.mean(means)),
                                                  float(np.mean(passes)), padded_prompts=padded)
        pooled.extend(passes)
    result.prompts = len(pooled)
    result.pooled_pass_at_k = float(np.mean(pooled)) if pooled else float("nan")
    return result
