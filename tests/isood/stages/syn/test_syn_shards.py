"""`isood generate-syn --num-shards N --shard-index i` parts merged by isood.stages.syn.merge_parts (what
`isood merge` calls for kind syn-is) == one run (tiny SDXL)."""

from __future__ import annotations

import pytest

import manifests
from generation.pipeline import GeneratorSettings, load_pipeline
from generation.sdxl import SDXLGenerator
from isood.stages.syn import KIND, KIND_PART, SynOptions, merge_parts, run_generate_syn
from isood.core.errors import IsoodError
from manifests.parts import read_parts


def merge(dirs, out):
    """What `isood merge` does for Syn-IS parts: read and check them, then the stage's merge."""
    parts, kind, config = read_parts(dirs)
    assert kind == KIND
    return merge_parts(parts, out, config)


def options(syn_inputs, out, clip, pipeline, **kw):
    base = dict(out=out, styles="sdxl:photographic,anime,pixel-art", labels=str(syn_inputs["labels"]), clip=clip,
                laid=str(syn_inputs["laid"]), id_features=str(syn_inputs["id_features"]), per_cell=1,
                images_per_prompt=2, pipeline=pipeline, size=64, steps=1, batch_size=3, seed=0, device="cpu",
                levels=4, na_threshold=2, progress=False)
    base.update(kw)
    return SynOptions(**base)


class Counting:
    """SDXLGenerator wrapper counting pipeline calls and the images asked for."""

    def __init__(self, gen):
        self.gen, self.calls, self.images = gen, 0, 0
        self.fingerprint = gen.fingerprint

    def __call__(self, prompts, negative_prompts, seeds):
        self.calls += 1
        self.images += len(prompts)
        return self.gen(prompts, negative_prompts, seeds)


def odd_seed(image, item):
    """An image checker rejecting every image with an odd seed (about half of them)."""
    return "odd seed" if item["seed"] % 2 else None


@pytest.fixture(scope="module")
def sdxl(tiny_pipeline_spec):
    return SDXLGenerator(load_pipeline(tiny_pipeline_spec, device="cpu"),
                         GeneratorSettings(pipeline=tiny_pipeline_spec, size=64, steps=1, batch_size=3, device="cpu"))


def test_parts_merge_to_the_single_run(syn_inputs, tiny_clip_spec, tiny_pipeline_spec, sdxl, tmp_path):
    run_generate_syn(options(syn_inputs, tmp_path / "single", tiny_clip_spec, tiny_pipeline_spec), generator=sdxl,
                     image_checker=odd_seed)
    one = manifests.read(tmp_path / "single")
    n = one.meta["summary"]["images_planned"]
    n_rejected = int((one.frame("rejected")["stage"] == "image").sum())
    assert 0 < n_rejected < n and one.meta["summary"]["images"] == n - n_rejected
    parts, asked = [], []
    for i in range(2):
        gen = Counting(sdxl)
        res = run_generate_syn(options(syn_inputs, tmp_path / f"p{i}", tiny_clip_spec, tiny_pipeline_spec,
                                       num_shards=2, shard_index=i), generator=gen, image_checker=odd_seed)
        m = manifests.read(tmp_path / f"p{i}")
        assert m.kind == KIND_PART and manifests.verify(m.root).ok and res.cells is None
        batches = list(range(i, -(-n // 3), 2))  # plan slices b with b % 2 == i
        assert gen.calls == len(batches) and m.meta["summary"]["generated"] + m.meta["summary"]["rejected"] == gen.images
        assert len(m.frame("plan")) == n and set(m.frame("images")["path"]) <= set(m.frame("plan")["path"])
        asked.append(gen.images)
        parts.append(m.root)
    assert sum(asked) == n  # every planned image generated exactly once over the array

    merged = merge(parts[::-1], tmp_path / "merged")
    assert merged.kind == KIND and manifests.verify(tmp_path / "merged").ok
    assert merged.meta["content_sha256"] == one.meta["content_sha256"]
    assert {r["path"]: r["sha256"] for r in merged.meta["files"] if r["path"] != "README.md"} == \
           {r["path"]: r["sha256"] for r in one.meta["files"] if r["path"] != "README.md"}
    timing = {"seconds", "images_per_second", "laid_fit_seconds"}
    assert {k: v for k, v in merged.meta["summary"].items() if k not in timing} == \
           {k: v for k, v in one.meta["summary"].items() if k not in timing}
    assert merged.meta["command"]["config"] == one.meta["command"]["config"]
    assert merged.meta["summary"]["rejected"] == n_rejected

    # the merged directory resumes like a single run's: nothing is generated again
    gen = Counting(sdxl)
    res = run_generate_syn(options(syn_inputs, tmp_path / "merged", tiny_clip_spec, tiny_pipeline_spec), generator=gen,
                           image_checker=odd_seed)
    assert gen.calls == 0 and res.summary["skipped"] == n  # rejected ones too: their markers were merged
    assert manifests.read(tmp_path / "merged").meta["content_sha256"] == one.meta["content_sha256"]


def test_merge_refuses_a_part_as_out(syn_inputs, tiny_clip_spec, tiny_pipeline_spec, sdxl, tmp_path):
    for i in range(2):
        run_generate_syn(options(syn_inputs, tmp_path / f"p{i}", tiny_clip_spec, tiny_pipeline_spec, num_shards=2,
                                 shard_index=i, per_cell=1, images_per_prompt=1), generator=sdxl)
    with pytest.raises(IsoodError, match="is also an input of this command"):
        merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "p0")
    with pytest.raises(IsoodError, match="missing"):
        merge([tmp_path / "p0"], tmp_path / "m")


def test_prompts_only_is_not_split(syn_inputs, tiny_clip_spec, tmp_path):
    with pytest.raises(IsoodError, match="--prompts-only runs once"):
        run_generate_syn(options(syn_inputs, tmp_path / "o", tiny_clip_spec, "unused", prompts_only=True,
                                 num_shards=2, shard_index=0))


def test_cli_passes_the_array_options(syn_inputs, tiny_clip_spec, tmp_path):
    from typer.testing import CliRunner

    from isood.cli import app

    args = ["generate-syn", "--styles", "sdxl:anime", "--labels", str(syn_inputs["labels"]), "--clip", tiny_clip_spec,
            "--laid", str(syn_inputs["laid"]), "--id-features", str(syn_inputs["id_features"]), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(app, args + ["--prompts-only", "--num-shards", "2", "--shard-index", "1"])
    assert res.exit_code == 2 and "--prompts-only runs once" in res.output
    res = CliRunner().invoke(app, args + ["--num-shards", "2", "--shard-index", "2"])
    assert res.exit_code == 2 and "--shard-index must be in 0..1" in res.output
