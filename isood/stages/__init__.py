"""L4: the stages, one per CLI command: load -> pure steps -> write."""
