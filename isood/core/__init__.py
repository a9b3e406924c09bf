"""Foundations every layer may use: errors, defaults, files and atomic writes, text I/O, devices, progress,
content keys, job-array parts, input paths, the option descriptions (``optspec``, ``optconfig``, ``shared_options``),
the worker counts (``workers``) and the batch-engine protocol.
Imports nothing of isood above it."""
