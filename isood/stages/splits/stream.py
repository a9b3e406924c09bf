"""The test side of `isood build-splits`, streamed: the test features are never all in memory.

They are read block by block (``isood.features.featurestore.FeatureReader``: memory-mapped ``.npy`` files, unmapped
after each read) in passes: the check pass (:func:`check_test_rows`: NaN/inf and zero rows, norms: what the
clean step decides for the whole set), then the search pass (:meth:`StreamedTest.chunks`: each block cleaned the
same way and filtered), which ``isood.features.shift.ShiftStream`` reads once (twice with ``--ann-recall``: a first pass
gathers the tuning sample). What stays in memory per test image is its index row (path, wnid), two flags and
the two distances; per block, one block of features and its LAID halves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from isood.features.featurestore.loading import FeatureReader
from isood.science.shift import RowCheck, check_rows, normalise_rows

__all__ = ["StreamedTest", "check_test_rows", "streamed_test"]


def check_test_rows(reader: FeatureReader, *, on_rows: Callable[[int], None] | None = None) -> RowCheck:
    """The check pass: :class:`isood.science.shift.RowCheck` of every row of ``reader``, read a block at a time
    (``on_rows(n)`` hears of each block of ``n`` rows)."""

    def blocks() -> Iterator[np.ndarray]:
        for _, block in reader.blocks():
            yield block
            if on_rows is not None:
                on_rows(len(block))

    return check_rows(blocks())


@dataclass(frozen=True, eq=False)
class StreamedTest:
    """The test images to measure: ``index`` (path, wnid, ... of each, in order), ``use`` (per row of the
    feature set of ``reader``: measured or not), ``as_given`` (the set's rows are used as stored: clean float32
    unit rows; otherwise each is divided by its norm, as ``isood.science.shift.prepare_features`` does)."""

    reader: FeatureReader
    index: pd.DataFrame
    use: np.ndarray
    as_given: bool

    def __len__(self) -> int:
        return len(self.index)

    def chunks(self) -> Iterator[np.ndarray]:
        """The measured rows, clean, in order: one read block of the set at a time. (They are the rows the
        clean and filter steps keep of the set held in memory; ``shift_search`` would find them unit rows:
        a division by the norm leaves a norm within 2^-23 of 1.)"""
        for start, block in self.reader.blocks():
            rows = normalise_rows(block, as_given=self.as_given)
            use = self.use[start:start + len(block)]
            yield rows if use.all() else rows[use]


def streamed_test(reader: FeatureReader, check: RowCheck, index: pd.DataFrame, keep: np.ndarray) -> StreamedTest:
    """The rows to measure: those ``check`` did not drop and ``keep`` (a mask over the rows left, i.e. over
    ``index`` before the filter) kept; ``index`` is cut to them."""
    use = ~check.dropped
    use[np.flatnonzero(use)] = keep
    if not keep.all():
        index = index.loc[keep].reset_index(drop=True)
    return StreamedTest(reader, index, use, check.as_given)
