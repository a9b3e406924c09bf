"""List files as Arrow arrays: read the lines of a list file, parse `path [label]` lines, look up the wnid of
every path and write lines back out, all vectorised (pyarrow), so that a release of millions of lines never
becomes millions of Python objects.

The parse is exact with respect to ``isood.stages.interop.imports.parse_lines`` (``labels="optional"``,
``verbatim=True``): ``parse_line_array`` handles plain ASCII lines (the releases' form) and raises ``OddLines``
on anything else (control or non-ASCII characters, a line that is not `path [integer]`, an absolute path or a
`..`), and the caller re-reads that one file with ``parse_lines``, which returns the exact entries or raises the
exact error naming file and line.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from isood.core.defaults import OOD_LABEL
from manifests.stream import StagedFile
from wordnet_tools.wnids import wnid_from_path

__all__ = ["OddLines", "LIST_SCHEMA", "read_lines", "string_bytes", "has_bytes", "has_odd_bytes", "parse_line_array",
           "entries_table", "WnidLookup", "path_hashes", "write_lines"]

#: A parsed list: the image paths (verbatim) and their labels.
LIST_SCHEMA = pa.schema([("path", pa.string()), ("label", pa.int64())])
_ODD_CHAR = r"[^\x20-\x7e\t]"  # anything but printable ASCII and tab: left to the exact Python parser
_LINE = r"^(?P<path>[^ \t]+)(?:[ \t]+(?P<label>[^ \t]+))?$"
_BAD_PATH = r"^[/\\]|^.:|(^|[/\\])\.\.([/\\]|$)"  # absolute (incl. C:) or a '..' component: check_relative's rule
# the directories of a path and the first 10 characters of its file name decide its wnid (wnid_from_path: a
# folder named like a wnid, a file named exactly like one, or a file name `nXXXXXXXX_...`): cut the rest
_WNID_KEY = (r"([^/\\]{10})[^/\\]*$", r"\1")
_HASH_SLICE = 1 << 16
_SCAN = 1 << 22


class OddLines(Exception):
    """Lines the vectorised parser leaves to the exact Python parser (never reaches a user)."""


def read_lines(path: str | os.PathLike) -> pa.Array:
    """The lines of a text file as one string array (UTF-8 checked, a leading byte-order mark skipped by pyarrow's
    reader as by ``isood.core.textio``; `\\n`, `\\r\\n` or `\\r` ends a line; empty lines dropped). Raises ``OddLines``
    where pyarrow's reader cannot take the file (empty, not UTF-8)."""
    try:
        table = pacsv.read_csv(
            str(path), read_options=pacsv.ReadOptions(column_names=["line"]),
            parse_options=pacsv.ParseOptions(delimiter="\x1f", quote_char=False, double_quote=False,
                                             escape_char=False, newlines_in_values=False, ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(column_types={"line": pa.string()}, strings_can_be_null=False,
                                                 quoted_strings_can_be_null=False))
    except pa.ArrowInvalid as e:
        raise OddLines(str(e)) from None
    return table.column("line").combine_chunks()


def string_bytes(arr: pa.Array) -> np.ndarray:
    """The UTF-8 bytes of all strings of a string array, concatenated (a view, no copy)."""
    if not len(arr):
        return np.zeros(0, np.uint8)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + len(arr) + 1]
    return np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]


def _scan(body: np.ndarray, test, overlap: int = 0) -> bool:
    """Whether ``test`` (bytes -> bool array) holds anywhere in ``body``, a few MB at a time (no temporary the
    size of a whole list); chunks overlap by ``overlap`` bytes for tests of byte pairs."""
    return any(bool(test(body[i:i + _SCAN + overlap]).any()) for i in range(0, len(body), _SCAN))


def has_bytes(body: np.ndarray, *chars: str) -> bool:
    """Whether any of the (ASCII) ``chars`` occurs in ``body``."""
    return any(_scan(body, lambda b, c=c: b == c) for c in "".join(chars).encode())


def has_odd_bytes(body: np.ndarray) -> bool:
    """Whether ``body`` holds a control character other than tab, or a non-ASCII byte."""
    return _scan(body, lambda b: ((b < 0x20) & (b != 0x09)) | (b > 0x7E))


def parse_line_array(lines: pa.Array) -> pa.Table:
    """Paths (verbatim) and labels (``OOD_LABEL`` where a line has none) of list lines (pure); blank lines and
    `#` comments skipped. ``OddLines`` for anything but plain ASCII `path [integer]` lines with relative paths.
    Byte scans decide which regular expressions are needed (lines without a label need none)."""
    body = string_bytes(lines)
    if has_odd_bytes(body):
        raise OddLines("control or non-ASCII characters")
    spaced = has_bytes(body, " ", "\t")
    text = pc.ascii_trim_whitespace(lines) if spaced else lines
    if spaced or pc.any(pc.starts_with(text, "#")).as_py() or pc.any(pc.equal(text, "")).as_py():
        text = pc.filter(text, pc.and_(pc.not_equal(text, ""), pc.invert(pc.starts_with(text, "#"))))
    if not len(text):
        return LIST_SCHEMA.empty_table()
    path, labels = text, pa.array(np.full(len(text), OOD_LABEL, np.int64))
    if spaced and has_bytes(string_bytes(text), " ", "\t"):
        try:
            fields = pc.extract_regex(text, _LINE)  # a line that does not match is null
            if fields.null_count:
                raise OddLines("a line is not `path [label]`")
            path, label = fields.field("path"), fields.field("label")
            labels = pc.cast(pc.if_else(pc.equal(label, ""), str(OOD_LABEL), label), pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise OddLines(str(e)) from None
    raw = string_bytes(path)  # _BAD_PATH needs a leading separator, a ':' or a '..': scan for those first
    maybe_bad = (has_bytes(raw, ":") or _scan(raw, lambda b: (b[:-1] == 0x2E) & (b[1:] == 0x2E), overlap=1)
                 or pc.any(pc.starts_with(path, "/")).as_py() or pc.any(pc.starts_with(path, "\\")).as_py())
    if maybe_bad and pc.any(pc.match_substring_regex(path, _BAD_PATH)).as_py():
        raise OddLines("absolute path or '..'")
    return pa.table({"path": path, "label": labels}, schema=LIST_SCHEMA)


def entries_table(entries) -> pa.Table:
    """A parsed list from ``ListEntry`` tuples (the fallback parser's output)."""
    return pa.table({"path": pa.array([e.path for e in entries], pa.string()),
                     "label": pa.array([e.label for e in entries], pa.int64())}, schema=LIST_SCHEMA)


class WnidLookup:
    """``wordnet_tools.wnids.wnid_from_path`` of every path of an array, called once per distinct (directories,
    first 10 characters of the file name) over the lookup's life; the answers are kept as Arrow arrays."""

    def __init__(self) -> None:
        self.keys = pa.array([], pa.string())
        self.wnids = pa.array([], pa.string())

    def __call__(self, paths: pa.Array) -> pa.Array:
        if not len(paths):
            return pa.array([], pa.string())
        keys = pc.dictionary_encode(pc.replace_substring_regex(paths, *_WNID_KEY))
        where = pc.index_in(keys.dictionary, value_set=self.keys)
        new = pc.filter(keys.dictionary, pc.is_null(where))
        if len(new):
            found = [wnid_from_path(k) for k in new.to_pylist()]
            self.keys = pa.concat_arrays([self.keys, new])
            self.wnids = pa.concat_arrays([self.wnids, pa.array(found, pa.string())])
            where = pc.index_in(keys.dictionary, value_set=self.keys)
        return pc.take(pc.take(self.wnids, where), keys.indices)


def path_hashes(paths: pa.Array) -> np.ndarray:
    """A 64-bit hash of every path with any leading `./` removed (equal paths, equal hashes; the hash is
    Python's, so it holds within one process). Duplicate candidates are confirmed on the strings."""
    out = np.empty(len(paths), np.int64)
    for lo in range(0, len(paths), _HASH_SLICE):  # a slice of Python strings at a time
        part = paths.slice(lo, _HASH_SLICE)
        if pc.all(pc.starts_with(part, "./")).as_py():  # the release's form: cheaper than the expression
            part = pc.utf8_slice_codeunits(part, 2)
        if pc.any(pc.starts_with(part, "./")).as_py():
            part = pc.replace_substring_regex(part, r"^(\./)+", "")
        out[lo:lo + len(part)] = np.fromiter(map(hash, part.to_pylist()), dtype=np.int64, count=len(part))
    return out


def write_lines(out: StagedFile, lines: pa.Array) -> None:
    """Write string array items each followed by a newline, straight from the Arrow buffer."""
    if not len(lines):
        return
    joined = pc.binary_join_element_wise(lines, "", "\n")
    if isinstance(joined, pa.ChunkedArray):
        joined = joined.combine_chunks()
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)[joined.offset:joined.offset + len(joined) + 1]
    out.write(memoryview(joined.buffers()[2])[offsets[0]:offsets[-1]])
