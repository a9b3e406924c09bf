"""Style sets: the built-in sdxl set, SDXL style files, selection by name, and one-line errors."""

from __future__ import annotations

import json

import pytest

from generation.styles import SDXL_STYLES, Style, StyleError, load_styles

WANTED = ["photographic", "hdr-photo", "analog-film", "cinematic", "long-exposure", "digital-art", "anime", "manga",
          "comic-book", "line-art", "pixel-art", "low-poly", "isometric", "3d-model", "clay", "origami", "papercut",
          "stained-glass", "watercolor", "ukiyo-e", "constructivist", "cubist", "pop-art", "neon-punk"]


def test_builtin_set_spans_photographic_to_abstract():
    styles = load_styles("sdxl")
    names = [s.name for s in styles]
    assert len(names) == len(set(names)) >= 25
    assert set(WANTED) <= set(names)
    assert names[0] == "photographic"
    for s in styles:
        prompt, negative = s.apply("red fox")
        assert "red fox" in prompt and "{prompt}" not in prompt
        assert negative and negative == s.negative_prompt
    assert len({s.prompt for s in SDXL_STYLES}) == len(SDXL_STYLES)  # no two styles share a template


def test_select_by_name_keeps_the_given_order():
    styles = load_styles("sdxl:papercut, anime,papercut")
    assert [s.name for s in styles] == ["papercut", "anime"]


def test_unknown_style_lists_close_matches():
    with pytest.raises(StyleError) as e:
        load_styles("sdxl:anmie")
    msg = str(e.value)
    assert "'anmie'" in msg and "anime" in msg and "\n" not in msg


def test_apply_keeps_other_braces():
    s = Style("json-ish", "{prompt} in {curly} braces {}", "")
    assert s.apply("cat")[0] == "cat in {curly} braces {}"


def test_style_file_standard_format_and_selection(tmp_path):
    f = tmp_path / "styles.json"
    f.write_text(json.dumps([
        {"name": "sai-origami", "prompt": "origami style {prompt} . paper art", "negative_prompt": "noisy"},
        {"name": "base", "prompt": "{prompt}", "negative_prompt": ""},
        {"name": "no-negative", "prompt": "a {prompt}"},
    ]))
    styles = load_styles(str(f))
    assert [s.name for s in styles] == ["sai-origami", "base", "no-negative"]
    assert styles[0].apply("crane") == ("origami style crane . paper art", "noisy")
    assert styles[2].negative_prompt == ""
    picked = load_styles(f"{f}:base")
    assert [s.name for s in picked] == ["base"]
    with pytest.raises(StyleError, match="unknown style 'orgami'.*sai-origami"):
        load_styles(f"{f}:orgami")


def test_template_without_slot_is_refused(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps([{"name": "flat", "prompt": "a flat picture", "negative_prompt": ""}]))
    with pytest.raises(StyleError) as e:
        load_styles(str(f))
    assert "flat" in str(e.value) and "{prompt}" in str(e.value) and str(f) in str(e.value)


def test_malformed_json_names_file_and_reason(tmp_path):
    f = tmp_path / "broken.json"
    f.write_text('[{"name": "a", "prompt": "{prompt}",,}]')
    with pytest.raises(StyleError) as e:
        load_styles(str(f))
    msg = str(e.value)
    assert str(f) in msg and "not valid JSON" in msg and "line 1" in msg and "\n" not in msg


@pytest.mark.parametrize("content, fragment", [
    ('{"name": "a", "prompt": "{prompt}"}', "non-empty JSON list"),
    ("[]", "non-empty JSON list"),
    ('[{"prompt": "{prompt}"}]', "entry 0"),
    ('[{"name": "a", "prompt": "{prompt}"}, {"name": "a", "prompt": "x {prompt}"}]', "appears twice"),
])
def test_bad_style_files(tmp_path, content, fragment):
    f = tmp_path / "s.json"
    f.write_text(content)
    with pytest.raises(StyleError, match=fragment):
        load_styles(str(f))


def test_missing_file_and_unknown_spec(tmp_path):
    with pytest.raises(StyleError, match="does not exist"):
        load_styles(str(tmp_path / "nope.json"))
    with pytest.raises(StyleError, match="neither"):
        load_styles("midjourney")
    with pytest.raises(StyleError, match="no styles"):
        load_styles("")
