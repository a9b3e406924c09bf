"""Scale-out backends of the ``isood.core.engine.BatchEngine`` protocol."""
