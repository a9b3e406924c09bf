"""Pure science, numpy in and numpy out (no torch or model library: an import-linter contract says so): LAID,
the shift grid, planted worlds, OOD metrics, per-cell evaluation, level curves, Table 1 conventions, per-set tables
and the detectors."""
