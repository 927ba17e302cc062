"""verl 0.9.1 glue: the ``gdro_grpo`` estimator, the trainer modes, sampler, dataset and plugin.

This is the floor that imports verl, and only in the modules that need it (``estimator``,
``trainer``, ``sampler``, ``dataset``, ``plugin``, ``driver``, ``replay_buffer``, ``checkpoint``;
the plugin itself defers every heavy import until verl imports its registries). It sits on the
step API (:mod:`verl_gdro.step`: the controller, the ``gdro`` config and the estimator hand-over),
which every training loop shares. ``glue``, ``ledger`` and ``registry`` stay verl-free at import:
they are the trainer's per-step bookkeeping, kept importable so benchmarks and tests can drive it
without verl. Importing this package imports nothing heavy.
"""
