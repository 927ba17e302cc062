"""verl 0.9.1 glue: the ``gdro_grpo`` estimator, the ``gdro_sync`` trainer, sampler and dataset.

This is the only layer that imports verl, and only in the modules that need it (``estimator``,
``trainer``, ``sampler``, ``dataset``, ``plugin``, ``driver``). ``config``, ``context`` and ``controller``
stay verl-free at import so the CPU demo, recipes' dry runs and tests can use them cheaply;
importing this package imports nothing heavy.
"""
