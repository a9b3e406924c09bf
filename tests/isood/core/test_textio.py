"""L0 isood.core.textio: the one reader of a user's text file (UTF-8 with or without a BOM; other encodings refused
in one line naming the file, the line and the byte offset)."""

import pytest

from isood.core.errors import BadInputError, IsoodError
from isood.core.textio import TextFileError, decode_text, read_lines, read_text


class OwnError(IsoodError):
    pass


def test_a_bom_is_dropped_and_lines_end_only_at_newlines(tmp_path):
    p = tmp_path / "l.txt"
    p.write_bytes(b"\xef\xbb\xbfa\r\nb\x0cc\rd\n\ne\xe2\x80\xa8f\n")  # form feed and U+2028 are not line ends
    assert read_lines(p) == ["a", "b\x0cc", "d", "", "e\u2028f"]
    assert read_lines(p) == [ln.decode("utf-8-sig") for ln in p.read_bytes().splitlines()]  # as bytes split
    assert read_text(p).startswith("a\r\n")
    p.write_bytes(b"")
    assert read_lines(p) == []


@pytest.mark.parametrize("data, line, offset", [(b"ok\nn0 caf\xe9\n", 2, 9), (b"a\rb\r\nc\xff", 3, 6),
                                                (b"\xe9", 1, 0)])
def test_another_encoding_names_file_line_and_byte_offset(tmp_path, data, line, offset):
    p = tmp_path / "list.txt"
    p.write_bytes(data)
    with pytest.raises(TextFileError) as e:
        read_lines(p, what="--classes")
    msg = str(e.value)
    assert msg.startswith(f"--classes {p}:{line}: not UTF-8 text") and f"at byte offset {offset} of the file" in msg
    assert f"byte 0x{data[offset]:02x}" in msg and msg.endswith("save it as UTF-8") and "\n" not in msg
    assert isinstance(e.value, BadInputError)


def test_utf16_and_unreadable_files_and_the_callers_error_class(tmp_path):
    p = tmp_path / "u.txt"
    p.write_bytes("wnid\n".encode("utf-16"))
    with pytest.raises(OwnError, match=r"u.txt is UTF-16 text .* save it as UTF-8"):
        read_text(p, error=OwnError)
    with pytest.raises(TextFileError, match=r"cannot read labels file .*absent.txt \(no such file\)"):
        read_text(tmp_path / "absent.txt", what="labels file")
    with pytest.raises(TextFileError, match=r"^cannot read .* \(Is a directory\); pass a UTF-8 text file$"):
        read_text(tmp_path)  # a folder
    with pytest.raises(OwnError, match=r"^l:4: not UTF-8 text \(byte 0xff at byte offset 1 of the line\)"):
        decode_text(b"a\xff", "l", line=4, error=OwnError)
    assert decode_text(b"\xef\xbb\xbfx", "l") == "x"
