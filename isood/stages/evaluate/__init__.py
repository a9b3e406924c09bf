"""The stage of ``isood evaluate``: options and their checks, the job (load manifests and models -> score ->
assemble), and the writer of the ``evaluation`` manifest."""
