"""``isood.shift``: nearest-neighbour semantic and covariate shift to the ID set.

A public name kept stable for users; the code lives in :mod:`isood.science.shift` (the result type, row checks,
LAID halves) and :mod:`isood.features.shift` (the search and the streamed measurement), and the package's own
modules import it from there."""

from isood.features.shift import *  # noqa: F401,F403
from isood.features.shift import __all__ as _search_names
from isood.science.shift import *  # noqa: F401,F403
from isood.science.shift import __all__ as _row_names

__all__ = [*_row_names, *_search_names]
