"""Dataset preparation (DAPO 14.1k, seven benchmarks) and the reward functions, per prompt template.

Public API: :func:`verl_gdro.data.templates.load_template`, the converters in
:mod:`verl_gdro.data.sources`, :func:`verl_gdro.data.prepare.prepare_all`, and the reward functions
``verl_gdro.data.reward.compute_score_answer`` / ``compute_score_boxed`` selected by the
``template`` config group. Importing this package does not import verl or torch.
"""
