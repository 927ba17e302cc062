"""The GDRO step API: one step of the three controllers, its configuration, and its hand-over.

This floor sits between the math (:mod:`verl_gdro.classifier`, :mod:`verl_gdro.evidence`, :mod:`verl_gdro.prompt_gdro`,
:mod:`verl_gdro.rollout_gdro`, :mod:`verl_gdro.metrics`, :mod:`verl_gdro.presets`) and the verl
glue (:mod:`verl_gdro.integration`). The ``gdro_sync`` trainer, the CPU demo and anyone's own
training loop call exactly this code, so it imports neither verl nor torch (numpy, and omegaconf
only when handed an omegaconf container):

- :mod:`verl_gdro.step.controller`: :class:`GDROController` (plan -> multipliers -> update ->
  metrics) and :func:`describe_mode`;
- :mod:`verl_gdro.step.config`: the ``gdro`` group's resolution (:func:`resolve_gdro`), its
  settings dataclasses and every validation check (:func:`validate_gdro_config`);
- :mod:`verl_gdro.step.context`: :func:`gdro_step`, which hands a step's multipliers to the
  ``gdro_grpo`` estimator around verl's own ``compute_advantage``.
- :mod:`verl_gdro.step.sampler`: :class:`PromptSampler`, the data adversary's draws of a step's
  prompts in a sampling mode (the GDRO trainer's sampler and the CPU study call it).

The package itself imports nothing, so ``import verl_gdro.step.config`` stays as cheap as before.
"""
