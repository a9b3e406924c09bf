"""The demo and what tests and examples build: ``isood demo``, tiny offline models from the real library classes,
and the planted evaluation world."""
