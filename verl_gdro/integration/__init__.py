"""verl 0.9.1 glue: the ``gdro_grpo`` estimator, the trainer modes, sampler, dataset and plugin, on the
step API; ``glue``, ``ledger`` and ``registry`` stay verl-free at import, as does this package."""
