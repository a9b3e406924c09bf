"""The stages, one per CLI command: load -> pure steps -> write."""
