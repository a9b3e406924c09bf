"""Shared by the guard families of tests/matrix/ (commands, integrity, faults, usability): run the real CLI in-process and read
the error contract off the result (exit status 2, one line on stderr, no traceback)."""

from __future__ import annotations

import io
import types
import zlib

import numpy as np
import pytest


def invoke(args):
    """``isood ARGS`` through typer's CliRunner (stderr kept apart), on one torch thread (tiny models)."""
    import torch
    from typer.testing import CliRunner

    from isood.cli import app

    torch.set_num_threads(1)
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result) -> str:
    """The single stderr line of a run refused as a user error: exit status 2, no Python exception escaped the
    CLI, no traceback anywhere, exactly one non-empty stderr line (returned, whitespace collapsed) besides the
    progress lines of the work done before the refusal (``isood.core.progress.is_progress_line``)."""
    from isood.core.progress import is_progress_line

    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and "Traceback" not in result.stderr, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and not is_progress_line(ln)]
    assert len(lines) == 1, result.stderr
    return " ".join(lines[0].split())


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def bilevel_png(width: int, height: int) -> bytes:
    """A valid all-black 1-bit PNG of any size, written by hand (a few KB: rows of zeros compress ~1000:1), so a
    decompression bomb costs nothing to make."""
    z = zlib.compressobj(9)
    row = b"\x00" * (1 + (width + 7) // 8)
    body = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", body) + _png_chunk(b"IEND", b"")


def jpeg_claiming(width: int, height: int) -> bytes:
    """A 16 x 16 JPEG whose frame header (SOF0) claims ``width`` x ``height``."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(9).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    i = data.find(b"\xff\xc0")
    data[i + 5:i + 7], data[i + 7:i + 9] = height.to_bytes(2, "big"), width.to_bytes(2, "big")
    return bytes(data)


def noisy_image(path, colour, rng, shift: float = 0.0) -> None:
    """A 20 x 20 PNG of ``colour`` (+ ``shift``) with Gaussian noise (sd 25) from ``rng``, folders made."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.clip(colour + shift + rng.normal(0, 25, (20, 20, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path)


def grid_splits(root, test_root, rng, colour, *, id_wnids, ood_wnids, per_cell: int, cov_shift: float = 0.0):
    """A 2 x 2 splits manifest at ``root`` written by the splits stage's writer (N/A threshold 2), its images
    under ``test_root``: ``per_cell`` images per cell, ID wnids at semantic level 0 and OOD ones at level 1, each
    image ``noisy_image`` of its class colour shifted by ``cov_shift`` per covariate level. Returns its rows."""
    import pandas as pd

    from isood.science.grid import cell_name, cell_table, edges_table
    from isood.stages.splits import write_splits

    rows = []
    for c in range(2):
        for s in range(2):
            for i in range(per_cell):
                wnids = id_wnids if s == 0 else ood_wnids
                w = wnids[i % len(wnids)]
                path = f"{w}/{w}_c{c}s{s}_{i}.png"
                noisy_image(test_root / path, colour[w], rng, shift=cov_shift * c)
                rows.append({"path": path, "wnid": w, "d_sem": 0.1 + s, "d_cov": 0.1 + c, "sem_level": s,
                             "cov_level": c, "cell": cell_name(c, s)})
    images = pd.DataFrame(rows)
    write_splits(root, images=images, cells=cell_table(images["cov_level"], images["sem_level"], 2, 2),
                 edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["test"],
                 config={"test_root": str(test_root), "n_levels": 2, "na_threshold": 2})
    return rows


@pytest.fixture(scope="session")
def tiny_eval():
    """``tiny_eval.image(path, colour, rng, shift=0)`` and ``tiny_eval.grid_splits(...)``: the images and the 2 x 2
    splits manifest of the small evaluation worlds (module functions of this conftest)."""
    return types.SimpleNamespace(image=noisy_image, grid_splits=grid_splits)


@pytest.fixture(scope="session")
def cli():
    """``cli.invoke(args)`` and ``cli.one_line_error(result)`` (module functions of this conftest)."""
    return types.SimpleNamespace(invoke=invoke, one_line_error=one_line_error)


@pytest.fixture(scope="session")
def bad_images():
    """``bad_images.bilevel_png(w, h)`` and ``bad_images.jpeg_claiming(w, h)``: decompression bombs as bytes."""
    return types.SimpleNamespace(bilevel_png=bilevel_png, jpeg_claiming=jpeg_claiming)
