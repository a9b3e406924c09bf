"""``isood.evaluation.metrics``: OOD metrics over (id_scores, ood_scores), a higher score meaning more in-distribution.

A public name kept stable for users; the code lives in :mod:`isood.science.metrics`, and the package's own modules import it
from there."""

from isood.science.metrics import *  # noqa: F401,F403
from isood.science.metrics import __all__  # noqa: F401
