"""The GDRO step API: one step of the three controllers, its configuration, and its hand-over.

Between the math floor and the verl glue (docs/development.md, layers); the ``gdro_sync`` trainer, the
CPU demo and anyone's own loop call exactly this code, so it imports neither verl nor torch:
:mod:`.controller` (:class:`GDROController`, :func:`describe_mode`), :mod:`.config` (:func:`resolve_gdro`,
:func:`validate_gdro_config`), :mod:`.context` (:func:`gdro_step`, the estimator's hand-over) and
:mod:`.sampler` (:class:`PromptSampler`, the sampling modes' draws). The package itself imports nothing.
"""
