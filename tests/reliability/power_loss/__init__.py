"""The power-loss harness: record the engine's file operations, replay crash states.

- ``recorder``: wraps the ``os``-level calls the engine makes (and its mappings) while a
  workload runs in-process, and keeps the sequence of operations per file and directory.
- ``crash_states``: the states a POSIX file system may leave after a power cut at each
  point of that sequence, under two persistence models, sampled with a seeded bound.
- ``workloads``: what the engine is made to do, and the oracle of what it promised.
- ``checker``: opens each state with ``LogManager.open`` and checks the promises.
- ``explore``: cut points, states per cut and the CI and long budgets.
"""
