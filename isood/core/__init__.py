"""Foundations every layer may use: errors, defaults, files and atomic writes, text I/O, devices, progress,
content keys, job-array parts, input paths, the option descriptions (``optspec``) and the batch-engine protocol.
Imports nothing of isood above it."""
