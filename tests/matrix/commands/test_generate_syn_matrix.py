"""The bad-input matrix, rows "options" of `isood generate-syn` (counts, styles, style files, labels): every row is
refused before a prompt is encoded or an image generated: exit 2, one line on stderr naming the option or value,
no traceback, no ``manifest.json`` in ``--out``. The inputs are valid otherwise (tiny open_clip, ID features, a
LAID file and labels made here), so a row passes only through its guard, named in its id (``module.function``).
The rows of ``levels`` / ``na_threshold`` / ``triplets`` go through the Python API (the same check as their flags).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from isood.core.errors import BadInputError


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, syn_inputs_factory, tiny_clip_spec):
    root = syn_inputs_factory(tmp_path_factory.mktemp("syn_matrix"))["root"]
    args = ["generate-syn", "--labels", root / "labels.txt", "--clip", tiny_clip_spec, "--laid",
            root / "laid.safetensors", "--id-features", root / "id", "--device", "cpu", "--styles", "sdxl:anime,clay",
            "--per-cell", "1", "--prompts-only"]
    return {"root": root, "args": args}


def test_the_base_arguments_work(inputs, cli, tmp_path):
    """Every row below differs from this run by its one bad value."""
    r = cli.invoke([*inputs["args"], "--out", tmp_path / "ok"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "ok" / "manifest.json").is_file()


def _style_file(name: str, content: str | bytes):
    def make(root: Path) -> list:
        path = root / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return ["--styles", path]
    return make


def _labels_file(name: str, text: str):
    def make(root: Path) -> list:
        (root / name).write_text(text)
        return ["--labels", root / name]
    return make


def _labels_root(root: Path) -> list:
    for w in ("n01440764", "n99999999"):
        (root / "label_root" / w).mkdir(parents=True, exist_ok=True)
    return ["--labels", root / "label_root"]


GOOD_STYLE = {"name": "ink", "prompt": "an ink drawing of {prompt}", "negative_prompt": "photo"}
ROWS = [  # (extra args or a function of the inputs folder returning them, substrings of the one line)
    pytest.param(["--per-cell", "0"], ["--per-cell", "0"], id="per_cell_0-syn.options.check_options"),
    pytest.param(["--per-cell", "-2"], ["--per-cell", "-2"], id="per_cell_neg-syn.options.check_options"),
    pytest.param(["--images-per-prompt", "0"], ["--images-per-prompt", "0"], id="images_per_prompt_0-check_options"),
    pytest.param(["--seed", "-1"], ["--seed", "-1"], id="seed_neg-optspec.seed_option"),
    pytest.param(["--batch-size", "0"], ["--batch-size", "0"], id="batch_size_0-pipeline.GeneratorSettings"),
    pytest.param(["--steps", "0"], ["--steps", "0"], id="steps_0-pipeline.GeneratorSettings"),
    pytest.param(["--size", "0"], ["--size", "0"], id="size_0-pipeline.GeneratorSettings"),
    pytest.param(["--size", "100"], ["--size", "100"], id="size_not_multiple_of_8-pipeline.GeneratorSettings"),
    pytest.param(["--num-shards", "0"], ["--num-shards", "0"], id="num_shards_0-optspec.check"),
    pytest.param(["--num-shards", "2", "--shard-index", "5"], ["--shard-index", "5"],
                 id="shard_index_out_of_range-parts.check_shard_args"),
    pytest.param(["--engine", "spark"], ["spark"], id="unknown_engine-optspec.check"),
    pytest.param(["--engine", "ray", "--ray-workers", "0"], ["--ray-workers must be an integer >= 1", "0"],
                 id="ray_workers_0-optspec.check"),
    pytest.param(["--styles", "sdxl:anim"], ["'anim'", "anime"], id="unknown_style-styles.select_styles"),
    pytest.param(["--styles", "watercolour"], ["watercolour", "--styles"], id="unknown_spec-styles.load_styles"),
    pytest.param(["--styles", "sdxl:"], ["sdxl:", "no style"], id="no_style_names-styles.load_styles"),
    pytest.param(_style_file("bad.json", '[{"name": "ink", "prompt": '), ["bad.json", "not valid JSON"],
                 id="styles_json_malformed-styles.parse_style_file"),
    pytest.param(_style_file("obj.json", json.dumps(GOOD_STYLE)), ["obj.json", "list"],
                 id="styles_json_not_a_list-styles.parse_style_file"),
    pytest.param(_style_file("none.json", "[]"), ["none.json", "non-empty"], id="styles_json_empty-parse_style_file"),
    pytest.param(_style_file("noprompt.json", '[{"name": "ink"}]'), ["noprompt.json", "entry 0"],
                 id="styles_json_entry_without_prompt-styles.parse_style_file"),
    pytest.param(_style_file("noslot.json", '[{"name": "ink", "prompt": "an ink drawing"}]'), ["'ink'", "{prompt}"],
                 id="styles_json_template_without_slot-styles.Style"),
    pytest.param(_style_file("twice.json", json.dumps([GOOD_STYLE, GOOD_STYLE])), ["'ink'", "twice"],
                 id="styles_json_duplicate_names-styles.parse_style_file"),
    pytest.param(_style_file("neg.json", json.dumps([{**GOOD_STYLE, "negative_prompt": 3}])),
                 ["'ink'", "negative_prompt"], id="styles_json_negative_not_a_string-styles.Style"),
    pytest.param(_style_file("latin.json", '[{"name": "caf\xe9"}]'.encode("latin-1")),
                 ["latin.json", "not UTF-8", "save it as UTF-8"], id="styles_json_not_utf8-textio.read_text"),
    pytest.param(lambda root: ["--styles", root / "absent.json"], ["absent.json", "does not exist"],
                 id="styles_json_missing-styles.parse_style_file"),
    pytest.param(lambda root: ["--styles", f"{_style_file('one.json', json.dumps([GOOD_STYLE]))(root)[1]}:inq"],
                 ["'inq'", "ink"], id="unknown_style_in_file-styles.select_styles"),
    pytest.param(_labels_file("unknown.txt", "red fox\nn99999999\n"), ["n99999999", "unknown.txt:2"],
                 id="labels_unknown_wnid-labels.labels_from_lines"),
    pytest.param(_labels_root, ["n99999999", "label_root"], id="labels_root_unknown_wnid-labels.load_labels"),
    pytest.param(_labels_file("nolabels.txt", "# nothing\n\n"), ["nolabels.txt", "no labels"],
                 id="labels_empty-labels._labels_frame"),
    pytest.param(lambda root: ["--labels", root / "absent.txt"], ["absent.txt", "--labels"],
                 id="labels_missing-labels.load_labels"),
    pytest.param(["--prompt-edges", "splits"], ["--prompt-edges splits", "--splits DIR"],
                 id="prompt_edges_splits_without_splits-syn.options.check_options"),
    pytest.param(["--prompt-edges", "calibrated"], ["--prompt-edges calibrated", "--splits DIR"],
                 id="prompt_edges_calibrated_without_splits-syn.options.check_options"),
    pytest.param(["--prompt-edges", "image"], ["--prompt-edges", "image", "prompts"],
                 id="prompt_edges_unknown-optspec.check"),
    pytest.param(["--na-threshold", "0"], ["--na-threshold", "0"], id="na_threshold_0-optspec.check"),
]


@pytest.mark.parametrize("extra, names", ROWS)
def test_bad_option_is_one_line_exit_2_and_nothing_complete(extra, names, inputs, cli, tmp_path):
    extra = extra(tmp_path) if callable(extra) else extra
    out = tmp_path / "out"
    line = cli.one_line_error(cli.invoke([*inputs["args"], *extra, "--out", out]))
    assert all(str(n) in line for n in names), line
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("field, value", [("levels", 0), ("levels", -1), ("na_threshold", 0),
                                          ("triplets", 0)], ids=lambda v: str(v))
def test_api_counts_are_checked_before_anything_runs(field, value, inputs, tiny_clip_spec, tmp_path,
                                                     monkeypatch):
    """Guard: isood.stages.syn.options.check_options (isood.core.optspec.check: the error names the field's flag).
    Refused before the inputs are loaded (later steps would fail too, but only after encoding every prompt)."""
    import isood.stages.syn.stage as stage
    from isood.stages.syn import SynOptions, run_generate_syn

    def loaded(*args, **kwargs):
        raise AssertionError("the inputs were loaded before the options were checked")

    monkeypatch.setattr(stage, "load_inputs", loaded)

    root = inputs["root"]
    opts = SynOptions(out=tmp_path / "out", styles="sdxl:anime", labels=str(root / "labels.txt"), clip=tiny_clip_spec,
                      laid=str(root / "laid.safetensors"), id_features=str(root / "id"), device="cpu",
                      prompts_only=True, progress=False, **{field: value})
    with pytest.raises(BadInputError) as e:
        run_generate_syn(opts)
    flag = {"levels": "--levels", "na_threshold": "--na-threshold", "triplets": "--triplets"}[field]
    assert f"{flag} must be" in str(e.value) and str(value) in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
