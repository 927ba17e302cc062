"""The CPU demo: a tiny Qwen3 trained with GRPO, Prompt-GDRO and Rollout-GDRO on a heavy-tailed
arithmetic task, in one process, through verl's own advantage, loss and scoring functions and the
same ``GDROController`` as the ``gdro_sync`` trainer. Entry point: ``verl-gdro demo``
(:mod:`verl_gdro.demo.run`)."""
