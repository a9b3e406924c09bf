"""``isood.evaluation.metrics``: OOD metrics over (id_scores, ood_scores), a higher score meaning more in-distribution.

A public name kept stable for users; the code lives in :mod:`isood.science.metrics` (the registry, whose namespace holds
every metric name), :mod:`isood.science.ood_metrics` (the metric functions), :mod:`isood.science.level_stats` and
:mod:`isood.science.bootstrap`; the package's own modules import it from there."""

from isood.science.metrics import *  # noqa: F401,F403
from isood.science.metrics import __all__  # noqa: F401
