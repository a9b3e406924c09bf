"""The image files of a Syn-IS run (generation.outputs): content keys, the resume state, markers, preparation."""

from __future__ import annotations

import pandas as pd
from PIL import Image

from generation.outputs import (
    STATE_FILE,
    GenerationResult,
    content_key,
    png_bytes,
    prepare_outputs,
    read_state,
    reject_marker,
    write_image,
    write_state,
)


def rows(n=3):
    return pd.DataFrame({"path": [f"images/s/{i}.png" for i in range(n)], "prompt": [f"p{i}" for i in range(n)],
                         "negative_prompt": [""] * n, "seed": list(range(n))})


def test_content_key_changes_with_every_input():
    fp = {"steps": 1}
    base = content_key("a", "", 1, fp)
    assert len(base) == 24 and base == content_key("a", "", 1, {"steps": 1})
    assert len({base, content_key("b", "", 1, fp), content_key("a", "x", 1, fp), content_key("a", "", 2, fp),
                content_key("a", "", 1, {"steps": 2})}) == 5


def test_state_round_trip_and_unreadable_state(tmp_path):
    assert read_state(tmp_path) == {"fingerprint": None, "keys": {}}
    write_state(tmp_path, fingerprint={"x": 1}, keys={"a.png": "k"})
    assert read_state(tmp_path) == {"fingerprint": {"x": 1}, "keys": {"a.png": "k"}}
    (tmp_path / STATE_FILE).write_text("[1, 2")
    assert read_state(tmp_path)["keys"] == {}
    (tmp_path / STATE_FILE).write_text("[1, 2]")
    assert read_state(tmp_path)["keys"] == {}


def test_png_bytes_are_deterministic():
    img = Image.new("RGB", (8, 8), (10, 20, 30))
    assert png_bytes(img, {"seed": 1}) == png_bytes(img.copy(), {"seed": 1}) != png_bytes(img, {"seed": 2})


def test_prepare_keeps_valid_images_and_drops_changed_ones(tmp_path):
    plan = rows()
    prepare_outputs(plan, tmp_path, {"v": 1}, 8)
    img = Image.new("RGB", (8, 8))
    r = plan.to_dict("records")
    write_image(tmp_path, r[0], img, None)
    write_image(tmp_path, r[1], img, "nsfw")
    (tmp_path / r[2]["path"]).write_bytes(b"not a png")
    got_rows, done, result = prepare_outputs(plan, tmp_path, {"v": 1}, 8)
    assert done == {r[0]["path"], r[1]["path"]} and result.skipped == 2 and result.rejected == {r[1]["path"]: "nsfw"}
    assert got_rows == r
    changed = plan.assign(prompt=["p0", "other", "p2"])  # row 1's key changes: its marker goes
    _, done, result = prepare_outputs(changed, tmp_path, {"v": 1}, 8)
    assert done == {r[0]["path"]} and not reject_marker(tmp_path / r[1]["path"]).exists()
    _, done, _ = prepare_outputs(changed, tmp_path, {"v": 2}, 8)  # another generator: nothing is kept
    assert done == set() and not (tmp_path / r[0]["path"]).exists()


def test_generation_result_summary_counts():
    res = GenerationResult(generated=4, skipped=1, batches=2, seconds=2.0, sha256={"a": "x"}, rejected={"b": "r"})
    assert res.as_dict() == {"generated": 4, "skipped": 1, "batches": 2, "seconds": 2.0, "rejected": 1,
                             "images_per_second": 2.0}
