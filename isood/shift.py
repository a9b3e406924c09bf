"""``isood.shift``: nearest-neighbour semantic and covariate shift to the ID set.

A public name kept stable for users; the code lives in :mod:`isood.features.shift`, and the package's own modules import it
from there."""

from isood.features.shift import *  # noqa: F401,F403
from isood.features.shift import __all__  # noqa: F401
