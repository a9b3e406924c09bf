"""L5: scale-out backends of the ``isood.batch_engine.BatchEngine`` protocol."""
