"""The shared vocabulary of cpubench: the names orchestrator/ and worker/ (and the training children)
agree on, in one home that imports neither of them.

- variables.py: the variable catalogue (names = SQL columns, types, values, defaults, where each is
  applied, what follows what, per-framework rules) and the resolution of a config into a job.
- metrics.py: the metric columns of a run (which the trainer measures, which the worker adds) and
  what a disturbed timed window is.
- datasets.py: the dataset names a job may ask for.
- errors.py: the one error family library code raises (only bench.py prints it and exits).

Imports run one way: bench.py -> worker/ -> orchestrator/ -> common/ (tests/test_layers.py).
"""
