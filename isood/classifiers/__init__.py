"""Classifiers under evaluation: model adapters, loading by name, output capture and its cache, scoring,
preprocessing presets, class lists, CLIP zero-shot, ODIN's input perturbation and the pytorch-ood bridge."""
