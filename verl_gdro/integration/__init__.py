"""verl 0.9.1 glue: the ``gdro_grpo`` estimator, the trainer modes, sampler, dataset and plugin.

The floor that imports verl, only in the modules that need it, on the step API (:mod:`verl_gdro.step`).
``glue``, ``ledger`` and ``registry`` stay verl-free at import (benchmarks and tests drive them
without verl); importing this package imports nothing heavy.
"""
