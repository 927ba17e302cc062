"""``verl-gdro study``: the powered comparison, 5 paired seeds by default (:mod:`verl_gdro.demo.run`).

The same engine as ``verl-gdro demo`` with study defaults: 5 seeds, two worker processes, a run
directory per task that a rerun resumes (``--fresh`` starts over), and paired differences to GRPO
with 95 % bootstrap intervals per level in ``results.md``.
"""

from __future__ import annotations

from .run import add_study_arguments as add_arguments
from .run import main_study as main

__all__ = ["add_arguments", "main"]
