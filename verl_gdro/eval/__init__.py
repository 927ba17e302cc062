"""Evaluation: mean@k and unbiased pass@k per benchmark, pooled pass@k, Table 1 Markdown.

Public API: :func:`verl_gdro.eval.metrics.pass_at_k`, :func:`~verl_gdro.eval.metrics.score_run`,
:func:`verl_gdro.eval.generations.read_dump`, :func:`verl_gdro.eval.table.markdown_table`, the
``verl-gdro eval`` command (:mod:`verl_gdro.eval.cli`) and the standalone vLLM evaluator
(:mod:`verl_gdro.eval.vllm_eval`). numpy/pandas only at import time.
"""
