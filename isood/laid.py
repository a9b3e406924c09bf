"""``isood.laid``: LAID: the orthogonal matrix that splits CLIP features into a semantic and a covariate half.

A public name kept stable for users; the code lives in :mod:`isood.science.laid`, and the package's own modules import it
from there."""

from isood.science.laid import *  # noqa: F401,F403
from isood.science.laid import __all__  # noqa: F401
