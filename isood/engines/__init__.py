"""L5: scale-out backends of the ``isood.runtime.BatchEngine`` protocol."""
