"""verl-gdro: Multi-Adversary Group DRO for LLM reasoning RL (arXiv 2601.19280) on verl 0.9.1.

The controllers (:mod:`verl_gdro.classifier`, :mod:`verl_gdro.prompt_gdro`,
:mod:`verl_gdro.rollout_gdro`, :mod:`verl_gdro.metrics`) are plain numpy and import neither verl
nor torch, so they can be read, tested and reused on their own. Everything that touches verl lives
in :mod:`verl_gdro.integration`.
"""

__version__ = "0.1.0"
