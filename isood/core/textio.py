"""The one home for reading a user's text file (image and class lists, labels, block lists, candidates, style
JSON, TOML configs): UTF-8, with or without a byte-order mark (``utf-8-sig``: a BOM never ends up in the first
line). Text in another encoding is a one-line error naming the file, the line and byte offset of the first bad
byte, and "save it as UTF-8" (a UTF-16 file, e.g. Windows "Unicode", is named as such). A file that cannot be
read is a one-line error too. Callers pass their own error class (a subclass of ``IsoodError``) and what the
file is (``--classes``, ``style file``, ...) so that the message names the option the user gave.
"""

from __future__ import annotations

import codecs
import os
import re
from pathlib import Path

from isood.core.errors import BadInputError, IsoodError

__all__ = ["TextFileError", "decode_text", "read_text", "read_lines"]

_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
_LINE_END = re.compile(r"\r\n|\r|\n")  # what bytes.splitlines and pyarrow's CSV reader split at, nothing else
_LINE_END_BYTES = re.compile(rb"\r\n|\r|\n")


class TextFileError(BadInputError):
    """A user's text file cannot be read or is not UTF-8 text (the message names the file and where)."""


def _label(name: str | os.PathLike, what: str) -> str:
    return f"{what} {name}" if what else str(name)


def decode_text(data: bytes, name: str | os.PathLike, *, what: str = "", line: int | None = None,
                error: type[IsoodError] = TextFileError) -> str:
    """``data`` (a whole file, or its line number ``line``) decoded as UTF-8 (a leading byte-order mark dropped),
    or ``error`` in one line naming ``what name``, the line and the byte offset (in the file, or in the line) of
    the first byte that is not UTF-8, and what to do."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        label = _label(name, what)
        if line is None and data.startswith(_UTF16_BOMS):
            raise error(f"{label} is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8") from None
        where = "file" if line is None else "line"
        line = line or len(_LINE_END_BYTES.findall(data, 0, e.start)) + 1
        raise error(f"{label}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at byte offset {e.start} of the "
                    f"{where}); save it as UTF-8") from None


def read_text(path: str | os.PathLike, *, what: str = "", name: str | None = None,
              error: type[IsoodError] = TextFileError) -> str:
    """The text of the user's file ``path`` (:func:`decode_text`; messages name it ``name``, default the path); a
    file that cannot be read (absent, a folder, no permission) is ``error`` in one line naming ``what name``."""
    p = Path(path)
    name = name or str(p)
    try:
        data = p.read_bytes()
    except OSError as e:
        reason = "no such file" if isinstance(e, FileNotFoundError) else (e.strerror or type(e).__name__)
        raise error(f"cannot read {_label(name, what)} ({reason}); pass a UTF-8 text file") from None
    return decode_text(data, name, what=what, error=error)


def read_lines(path: str | os.PathLike, *, what: str = "", name: str | None = None,
               error: type[IsoodError] = TextFileError) -> list[str]:
    """The lines of the user's text file ``path`` (:func:`read_text`): ``\\n``, ``\\r\\n`` or ``\\r`` ends a
    line and is not kept (as ``bytes.splitlines``; ``str.splitlines`` would also split at form feeds, ``\\x1c`` or
    ``\\u2028``, which may be part of a file name)."""
    lines = _LINE_END.split(read_text(path, what=what, name=name, error=error))
    if lines[-1] == "":
        lines.pop()
    return lines
