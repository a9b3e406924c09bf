"""``isood.grid``: the 8 x 8 grid of shift levels: edges, levels, cell names.

A public name kept stable for users; the code lives in :mod:`isood.science.grid`, and the package's own modules import it
from there."""

from isood.science.grid import *  # noqa: F401,F403
from isood.science.grid import __all__  # noqa: F401
