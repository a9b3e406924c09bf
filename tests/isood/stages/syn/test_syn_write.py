"""The Syn-IS writer on its own (isood.stages.syn.write_syn_manifest): the recipe for a syn-is fixture without
generating anything, read back through its typed view."""

from __future__ import annotations

import pandas as pd
from PIL import Image

import manifests
from generation.outputs import png_bytes
from generation.prompts import build_prompts
from generation.styles import load_styles
from isood.stages.syn import IMAGE_COLUMNS, KIND, REJECTED_COLUMNS, write_syn_manifest
from isood.stages.syn.steps import plan_prompts
from isood.science.grid import edges_table
from isood.kinds import SynView


def write_tiny_syn(root):
    """A 2 x 2 grid Syn-IS manifest from frames: prompts binned on given edges, one image per prompt."""
    labels = pd.DataFrame({"wnid": ["n01440764", ""], "label": ["tench", "violin"]})
    prompts = build_prompts(labels, load_styles("sdxl:photographic,anime"))
    plan = plan_prompts(prompts, [0.1, 0.6, 0.1, 0.6], [0.2, 0.2, 0.7, 0.7], n_levels=2, sem_edges=[0, 0.5, 1],
                        cov_edges=[0, 0.5, 1], per_cell=1, images_per_prompt=1, seed=0)
    shas = []
    for j, rel in enumerate(plan.images["path"]):
        data = png_bytes(Image.new("RGB", (8, 8), (40 * j, 0, 0)))
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        shas.append(manifests.sha256_bytes(data))
    images = plan.images.assign(sha256=shas)[IMAGE_COLUMNS]
    return write_syn_manifest(root, images=images, prompts=plan.prompts,
                              edges=edges_table(plan.sem_edges, plan.cov_edges),
                              rejected=pd.DataFrame(columns=REJECTED_COLUMNS),
                              config={"n_levels": 2, "na_threshold": 1, "clip": "local-dir:/tiny"})


def test_writer_alone_gives_a_verified_syn_view(tmp_path):
    manifest, cells = write_tiny_syn(tmp_path)
    view = manifests.read(tmp_path, kind=KIND)
    assert isinstance(view, SynView) and manifests.verify(tmp_path).ok and manifest.kind == KIND
    assert view.n_levels == 2 and list(view.axis_edges("sem")) == [0, 0.5, 1] and view.clip == "local-dir:/tiny"
    assert sorted(view.images["cell"]) == ["cov_0_sem_0", "cov_0_sem_1", "cov_1_sem_0", "cov_1_sem_1"]
    assert (cells["n"] == 1).all() and not cells["na"].any() and (cells["prompts_sampled"] == 1).all()
    assert (tmp_path / "README.md").is_file() and (tmp_path / "lists" / "cov_1_sem_1.txt").read_text().count("\n") == 1
