"""Dataset preparation (DAPO 14.1k, seven benchmarks: :mod:`~verl_gdro.data.prepare`) and the reward
functions per prompt template (:mod:`~verl_gdro.data.reward`); importing it imports no verl or torch.
"""
