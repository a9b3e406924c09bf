"""The stage of ``isood evaluate``: options and their checks (``options``), the inputs it reads (``inputs``), the
datasets it scores (``datasets``), the model and its passes (``model``), what is assembled from the scores
(``assemble``), what the run records (``record``), the job (``job``: load -> score -> assemble -> write), the
writer of the ``evaluation`` manifest (``write``) and the Python API (``api``: ``isood.evaluate``)."""
