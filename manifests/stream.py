"""Streaming writes of manifest files, for tables too large to hold in memory (millions of rows).

- ``StagedFile``: a file written under a temporary name (``.~<name>.<random>.tmp``, which ``isood verify`` ignores
  and ``isood.core.files.remove_temporaries`` deletes) and renamed onto its path by ``commit()``: a failed or killed
  write leaves the old file.
- ``ParquetStream``: a Parquet table written piece by piece with the manifests' Parquet options, in row groups of
  exactly ``row_group_rows`` rows (the last one shorter) whatever the sizes of the pieces, so identical rows give
  identical bytes; ``manifests.write_manifest(table_files=...)`` registers the file.
- ``key_counts`` / ``partition_parquet``: rows per distinct key of a Parquet file, and a copy of each row into the
  files named for its key, read one row group at a time (``manifests.card_stream`` builds the `datasets` configs of a
  streamed table with them).

This module knows no kind and no column: keys are whatever columns the caller names.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from isood.core.errors import ManifestError
from isood.core.files import TMP_PREFIX, naming
from manifests.store import PARQUET_OPTIONS

__all__ = ["ROW_GROUP_ROWS", "StagedFile", "ParquetStream", "key_counts", "partition_parquet", "string_keys"]

#: Rows per row group of a streamed table: small enough that a reader holding one row group stays small
#: (`datasets` reads a Parquet file one row group at a time), large enough for good compression.
ROW_GROUP_ROWS = 1 << 17


class StagedFile:
    """A binary file written under a temporary name beside ``path``; ``commit()`` renames it onto ``path``,
    ``abort()`` deletes it. As a context manager: committed when the block ends normally, aborted otherwise."""

    def __init__(self, path: str | os.PathLike, *, open_file: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f"{TMP_PREFIX}{self.path.name}.{secrets.token_hex(6)}.tmp")
        self.file = open(self.tmp, "xb") if open_file else None
        if not open_file:
            self.tmp.touch(exist_ok=False)
        self.done = False

    def write(self, data: bytes | memoryview | pa.Buffer) -> None:
        if self.file is None:
            raise ValueError(f"{self.path}: staged with open_file=False, so it is written by path: write to .tmp")
        with naming(self.path):
            self.file.write(data)

    def close(self) -> None:
        """Close the open file now, written in full (a writer holding many staged files keeps no descriptor per
        file); ``commit`` or ``abort`` still decides its fate."""
        if self.file is not None:
            with naming(self.path):
                self.file.close()

    def commit(self, path: str | os.PathLike | None = None) -> Path:
        """Rename the temporary onto the file's path (or onto ``path``, a destination decided later)."""
        self.close()
        if path is not None:
            self.path = Path(path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.tmp, self.path)
        self.done = True
        return self.path

    def abort(self) -> None:
        if self.file is not None and not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)
        self.done = True

    def __enter__(self) -> "StagedFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.done:
            self.abort() if exc_type is not None else self.commit()


class ParquetStream:
    """A Parquet file written in pieces (``write``), staged and renamed into place by ``commit()``.

    Row groups hold ``row_group_rows`` rows: pieces are buffered until a group is full (``buffered=False``:
    every piece is written as it comes, in groups of at most ``row_group_rows``). ``plain_columns``: columns
    written without dictionary encoding (mostly distinct values, e.g. paths: the dictionary would be dropped
    anyway, after costing time). Pieces are cast to ``schema``; one that cannot be is an error naming the file."""

    def __init__(self, path: str | os.PathLike, schema: pa.Schema, *, row_group_rows: int = ROW_GROUP_ROWS,
                 buffered: bool = True, plain_columns: Sequence[str] = ()) -> None:
        if row_group_rows < 1:
            raise ValueError(f"row_group_rows={row_group_rows}; pass a positive number")
        self.schema = schema
        self.row_group_rows, self.buffered = int(row_group_rows), buffered
        self.staged = StagedFile(path, open_file=False)
        options = dict(PARQUET_OPTIONS)
        if plain_columns:
            options["use_dictionary"] = [n for n in schema.names if n not in set(plain_columns)]
        with naming(self.staged.path):
            self.writer = pq.ParquetWriter(str(self.staged.tmp), schema, **options)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.rows = 0

    @property
    def path(self) -> Path:
        return self.staged.path

    def write(self, piece: pa.Table | pa.RecordBatch) -> None:
        table = piece if isinstance(piece, pa.Table) else pa.Table.from_batches([piece])
        if table.schema != self.schema:
            try:
                table = table.select(self.schema.names).cast(self.schema)
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
                raise ManifestError(f"{self.path}: a piece does not match the table's schema ({e})") from None
        self.rows += table.num_rows
        if not self.buffered:
            if table.num_rows:
                with naming(self.path):
                    self.writer.write_table(table, row_group_size=self.row_group_rows)
            return
        self.pending.append(table)
        self.pending_rows += table.num_rows
        if self.pending_rows >= self.row_group_rows:
            self._flush(final=False)

    def _flush(self, *, final: bool) -> None:
        if not self.pending_rows:
            return
        table = pa.concat_tables(self.pending)
        n, start = self.row_group_rows, 0
        while table.num_rows - start >= n or (final and start < table.num_rows):
            size = min(n, table.num_rows - start)
            with naming(self.path):
                self.writer.write_table(table.slice(start, size), row_group_size=size)
            start += size
        rest = table.slice(start)
        self.pending = [rest] if rest.num_rows else []
        self.pending_rows = rest.num_rows

    def commit(self, path: str | os.PathLike | None = None) -> int:
        """Write what is buffered, close and rename into place (onto ``path`` when given, else the path it was
        opened for); returns the rows written."""
        self._flush(final=True)
        with naming(self.path):
            self.writer.close()
        self.staged.commit(path)
        return self.rows

    def abort(self) -> None:
        try:
            self.writer.close()
        finally:
            self.staged.abort()

    def __enter__(self) -> "ParquetStream":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.staged.done:
            self.abort() if exc_type is not None else self.commit()


# ------------------------------------------------------------------------------------------ keyed copies
def string_keys(table: pa.Table, columns: Sequence[str | None]) -> tuple[np.ndarray, dict[int, tuple[str, ...]]]:
    """Each row's key as a code (int64 numpy array) and the key of every code that occurs (pure): the key of a
    row is the tuple of its values in ``columns`` as strings (missing values and a ``None`` column give '')."""
    codes = np.zeros(table.num_rows, dtype=np.int64)
    parts: list[list[str]] = []
    for col in columns:
        values, idx = [""], np.zeros(table.num_rows, dtype=np.int64)
        if col is not None and table.num_rows:
            arr = pc.fill_null(pc.cast(table.column(col), pa.string()), "")
            enc = pc.dictionary_encode(arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr)
            values = enc.dictionary.to_pylist()
            idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        codes = codes * len(values) + idx
        parts.append(values)
    keys: dict[int, tuple[str, ...]] = {}
    for code in np.unique(codes).tolist():
        key, rest = [], code
        for values in reversed(parts):
            rest, i = divmod(rest, len(values))
            key.append(values[i])
        keys[code] = tuple(reversed(key))
    return codes, keys


def _row_groups(path: Path, columns: Sequence[str] | None = None):
    pf = pq.ParquetFile(path)
    for i in range(pf.num_row_groups):
        yield pf.read_row_group(i, columns=list(columns) if columns is not None else None)


def key_counts(path: str | os.PathLike, columns: Sequence[str | None]) -> dict[tuple[str, ...], int]:
    """Rows per key (``string_keys`` of ``columns``) of a Parquet file, reading only those columns."""
    out: dict[tuple[str, ...], int] = {}
    for table in _row_groups(Path(path), [c for c in columns if c is not None]):
        codes, keys = string_keys(table, columns)
        for code, n in zip(*np.unique(codes, return_counts=True)):
            out[keys[code]] = out.get(keys[code], 0) + int(n)
    return out


def partition_parquet(path: str | os.PathLike, columns: Sequence[str | None],
                      routes: Mapping[tuple[str, ...], Sequence[str | os.PathLike]]) -> dict[Path, int]:
    """Copy every row of a Parquet file into each file ``routes`` names for its key (``string_keys`` of
    ``columns``), in row order, one row group of the source at a time. All files are staged and committed
    together at the end (none on an error); returns the rows written per file."""
    src = Path(path)
    schema = pq.read_schema(src)
    streams: dict[Path, ParquetStream] = {}
    try:
        for table in _row_groups(src):
            codes, keys = string_keys(table, columns)
            order = np.argsort(codes, kind="stable")
            sorted_codes = codes[order]
            bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
            rows_of: dict[Path, list[np.ndarray]] = {}
            for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(order)]):
                for dest in (routes.get(keys[int(sorted_codes[lo])]) or []) if hi > lo else []:
                    rows_of.setdefault(Path(dest), []).append(order[lo:hi])
            for dest, parts in rows_of.items():  # a file gathering several keys keeps the source's row order
                idx = parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))
                if dest not in streams:
                    streams[dest] = ParquetStream(dest, schema, buffered=False)
                streams[dest].write(table.take(pa.array(idx)))
        return {dest: s.commit() for dest, s in streams.items()}
    except BaseException:
        for s in streams.values():
            if not s.staged.done:
                s.abort()
        raise
