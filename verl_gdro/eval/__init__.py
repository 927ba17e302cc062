"""Evaluation: mean@k and unbiased pass@k per benchmark, pooled pass@k, Table 1 Markdown
(``verl-gdro eval``, :mod:`~verl_gdro.eval.cli`; vLLM generation, :mod:`~verl_gdro.eval.vllm_eval`).
"""
