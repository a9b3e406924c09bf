"""Manifests as image datasets: typed `features` in every card, no machine path in a card, and
``isood.load_dataset`` (an ``Image`` column resolved against the manifest's image folder) feeding a torch
DataLoader; offline (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import hashlib
import re

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from huggingface_hub import DatasetCard
from PIL import Image

import isood
from isood.stages.syn import write_syn_manifest
from isood.core.errors import BadInputError
from isood.science.grid import cell_name, cell_table, edges_table
from isood.stages.splits import write_splits

CELLS = {(0, 0): 3, (0, 1): 2, (1, 0): 0, (1, 1): 3}


def colour(c, s, i):
    return 40 + 100 * c, 40 + 100 * s, 200 - 30 * i


def _splits(tmp_path):
    root = tmp_path / "pictures"
    rows = []
    for (c, s), n in CELLS.items():
        for i in range(n):
            rel = f"{cell_name(c, s)}/{i}.png"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (20, 20), colour(c, s, i)).save(root / rel)
            rows.append({"path": rel, "wnid": "n0000000%d" % i, "d_sem": 0.5 * s + 0.1, "d_cov": 0.5 * c + 0.1,
                         "sem_level": s, "cov_level": c, "cell": cell_name(c, s)})
    images = pd.DataFrame(rows)
    venv = tmp_path / "venv" / "bin" / "isood"
    write_splits(tmp_path / "splits", images=images, cells=cell_table(images["cov_level"], images["sem_level"], 2, 2),
                 edges=edges_table([0.0, 0.5, 1.0], [0.0, 0.5, 1.0]),
                 config={"test_root": str(root), "id_root": str(tmp_path / "id"), "na_threshold": 2},
                 inputs=[{"name": "test", "source": str(root), "sha256": "0" * 64}],
                 argv=[str(venv), "build-splits", "--test", str(root), "--out", str(tmp_path / "splits")])
    return tmp_path / "splits", root, images


def test_card_has_typed_features_and_no_machine_path(tmp_path):
    splits, root, images = _splits(tmp_path)
    text = (splits / "README.md").read_text()
    assert str(tmp_path) not in text and "venv" not in text
    assert "- command: `isood build-splits --test <local>/pictures --out <local>/splits`" in text
    info = {d["config_name"]: d for d in DatasetCard.load(splits / "README.md").data.to_dict()["dataset_info"]}
    assert {"all", "cells", "edges", "cov_0_sem_0"} <= set(info)
    features = datasets.Features._from_yaml_list(info["all"]["features"])
    assert features["cell"] == datasets.ClassLabel(names=[cell_name(c, s) for c in range(2) for s in range(2)])
    assert features["d_sem"] == datasets.Value("float64") and features["sem_level"] == datasets.Value("int64")
    # datasets loads the declared types: the label is the cell of the Parquet row
    got = datasets.load_dataset(str(splits), "all", cache_dir=str(tmp_path / "hf"))["test"]
    names = got.features["cell"].names
    assert [names[i] for i in got["cell"]] == list(images["cell"])
    cells = datasets.load_dataset(str(splits), "cells", cache_dir=str(tmp_path / "hf"))["train"]
    assert cells.features["na"] == datasets.Value("bool")


def test_card_shows_a_mosaic_when_the_images_are_reachable(tmp_path):
    import manifests
    from manifests.card import CARD_FIGURE
    from manifests.card_stream import add_card

    splits, root, _ = _splits(tmp_path)
    assert f"![A sample of the images per cell]({CARD_FIGURE})" in (splits / "README.md").read_text()
    assert manifests.verify(splits).ok
    png = np.asarray(Image.open(splits / CARD_FIGURE).convert("RGB")).reshape(-1, 3)
    seen = {tuple(int(v) for v in px) for px in png}
    shown = {colour(c, s, i) for (c, s), n in CELLS.items() for i in range(n)} & seen
    assert {(c, s) for c, s, _ in ((k[0] // 100, k[1] // 100, 0) for k in shown)} == {(0, 0), (0, 1), (1, 1)}
    # a grid whose images are out of reach (an import records no image folder): no figure, no broken link
    images = pd.read_parquet(splits / "data" / "images.parquet")
    blind = write_splits(tmp_path / "blind", images=images, edges=edges_table([0.0, 0.5, 1.0], [0.0, 0.5, 1.0]),
                         cells=cell_table(images["cov_level"], images["sem_level"], 2, 2), config={"na_threshold": 2})
    assert CARD_FIGURE not in {r["path"] for r in blind.meta["files"]}
    assert "card.png" not in (blind.root / "README.md").read_text()


def _pixels(im):
    return tuple(int(v) for v in np.asarray(im.convert("RGB"))[5, 5])


def test_load_dataset_gives_images_for_a_dataloader(tmp_path):
    splits, root, images = _splits(tmp_path)
    ds = isood.load_dataset(splits, split="test", cache_dir=str(tmp_path / "hf"))
    assert isinstance(ds.features["image"], datasets.Image)
    for row, (_, want) in zip(ds, images.iterrows()):
        c, s, i = want["cov_level"], want["sem_level"], int(want["path"].split("/")[1][0])
        assert row["path"] == want["path"] and _pixels(row["image"]) == colour(c, s, i)
    cell = isood.load_dataset(splits, config="cov_1_sem_1", cache_dir=str(tmp_path / "hf"))["test"]
    assert cell.num_rows == 3

    def to_tensors(batch):
        return {"x": [torch.tensor(np.array(im.convert("RGB"))).permute(2, 0, 1) for im in batch["image"]],
                "cell": batch["cell"]}

    loader = torch.utils.data.DataLoader(ds.with_transform(to_tensors), batch_size=4)
    batches = list(loader)
    assert [b["x"].shape[0] for b in batches] == [4, 4]
    first = batches[0]["x"][0, :, 5, 5].tolist()
    assert tuple(first) == colour(0, 0, 0)

    # the images moved: image_root says where; a wrong folder is one line
    moved = tmp_path / "moved"
    root.rename(moved)
    with pytest.raises(BadInputError, match="image_root"):
        isood.load_dataset(splits, split="test", cache_dir=str(tmp_path / "hf"))
    again = isood.load_dataset(splits, image_root=moved, split="test", cache_dir=str(tmp_path / "hf"))
    assert _pixels(again[0]["image"]) == colour(0, 0, 0)


def syn_manifest(root):
    """A Syn-IS manifest (generate-syn's writer) whose images are solid colours, one per image."""
    images, prompts = [], []
    for s in (0, 1):
        for i in range(3):
            rel = f"images/art/p{s}{i}.png"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (16, 16), colour(1, s, i)).save(root / rel)
            common = {"prompt": f"art {s}{i}", "negative_prompt": "", "style": "art", "wnid": "n01", "label": "x",
                      "prompt_id": f"p{s}{i}", "d_sem": 0.1 + s, "d_cov": 1.1, "sem_level": s, "cov_level": 1,
                      "cell": cell_name(1, s)}
            images.append({"path": rel, "image_index": 0, "seed": i,
                           "sha256": hashlib.sha256((root / rel).read_bytes()).hexdigest(), **common})
            prompts.append({**common, "selected": True})
    rejected = pd.DataFrame({c: pd.Series(dtype=str) for c in
                             ("stage", "path", "prompt_id", "style", "wnid", "label", "prompt", "reason")})
    write_syn_manifest(root, images=pd.DataFrame(images), prompts=pd.DataFrame(prompts), rejected=rejected,
                       edges=edges_table([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]), argv=["isood", "generate-syn"],
                       config={"n_levels": 2, "na_threshold": 2, "laid": str(root.parent / "splits" / "laid")})
    return root


def test_syn_is_loads_its_own_images(tmp_path):
    syn = syn_manifest(tmp_path / "syn")
    assert not re.search(re.escape(str(tmp_path)), (syn / "README.md").read_text())
    ds = isood.load_dataset(syn, config="cov_1_sem_1", split="test", cache_dir=str(tmp_path / "hf"))
    assert sorted(_pixels(r["image"]) for r in ds) == sorted(colour(1, 1, i) for i in range(3))


class RecordingApi:
    """The HfApi methods publish calls; upload_folder records exactly what huggingface_hub would upload."""

    def __init__(self):
        self.uploaded, self.folders = None, []

    def create_repo(self, *args, **kwargs):
        return "https://hub.example/datasets/" + args[0]

    def upload_folder(self, *, folder_path, allow_patterns, **kwargs):
        from pathlib import Path

        from huggingface_hub.utils import filter_repo_objects

        present = sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())
        self.uploaded = {p: Path(folder_path, p).read_bytes() for p in filter_repo_objects(present,
                                                                                         allow_patterns=allow_patterns)}
        self.folders.append(folder_path)
        return None

    def create_tag(self, *args, **kwargs):
        return None


def test_publishing_syn_is_uploads_its_images_other_grids_only_lists(tmp_path):
    from typer.testing import CliRunner

    import manifests
    from isood.cli import app
    from manifests import hub

    syn = syn_manifest(tmp_path / "syn")
    up = tmp_path / "upload"
    r = CliRunner().invoke(app, ["publish", str(syn), "--repo-id", "alice/syn", "--dry-run", "--out", str(up)])
    assert r.exit_code == 0, r.output
    assert "images embedded" in r.output
    assert manifests.verify(up).ok and manifests.verify(syn).ok  # the manifest itself is left as it was
    assert manifests.read(up).meta["content_sha256"] == manifests.read(syn).meta["content_sha256"]
    text = (up / "README.md").read_text()
    assert str(tmp_path) not in text
    info = {d["config_name"]: d for d in DatasetCard.load(up / "README.md").data.to_dict()["dataset_info"]}
    assert datasets.Features._from_yaml_list(info["all"]["features"])["image"] == datasets.Image()
    loaded = datasets.load_dataset(str(up), cache_dir=str(tmp_path / "hf"))["test"]
    assert loaded.num_rows == 6 and isinstance(loaded.features["image"], datasets.Image)
    for row in loaded:  # the image is the file's own bytes, decoded
        assert _pixels(row["image"]) == colour(1, int(row["path"][-6]), int(row["path"][-5]))
    raw = loaded.cast_column("image", datasets.Image(decode=False))
    assert all(r["image"]["bytes"] == (syn / r["path"]).read_bytes() for r in raw)
    cell = datasets.load_dataset(str(up), "cov_1_sem_0", cache_dir=str(tmp_path / "hf"))["test"]
    assert sorted(_pixels(r["image"]) for r in cell) == sorted(colour(1, 0, i) for i in range(3))

    # the real upload sends exactly the dry run's folder, and removes the folder it built
    api = RecordingApi()
    hub.publish(syn, "alice/syn", api=api, echo=lambda s: None)
    staged = sorted(q.relative_to(up).as_posix() for q in up.rglob("*") if q.is_file())
    assert sorted(api.uploaded) == staged
    assert all(api.uploaded[p] == (up / p).read_bytes() for p in staged if p != "README.md")
    assert not any(q.name.startswith(".~") for q in tmp_path.iterdir()) and api.folders[0] != str(syn)

    # a splits manifest (images outside it) uploads its lists only
    splits, _, images = _splits(tmp_path / "s")
    api = RecordingApi()
    hub.publish(splits, "alice/splits", api=api, echo=lambda s: None)
    assert api.folders == [str(splits)] and not set(images["path"]) & set(api.uploaded)
    assert not any(p.startswith("data/configs/images/") for p in api.uploaded)
