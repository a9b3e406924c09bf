"""Syn-IS prompts: labels x styles -> prompts with stable ids, binned by their shift to the ID images.

IS-OOD's synthetic set puts covariate shifts ImageNet-21K lacks (styles) on its labels. A prompt is a style
template applied to a label; its shift is measured like an image's (IS-OOD, Sec. Syn-IS): the prompt's CLIP
text feature goes through LAID and D_sem / D_cov are the nearest cosine distances to the ID image features
(:func:`isood.shift.shift_distances`). Prompts are binned with the grid's levels (the image splits' edges
when given, so the synthetic cells line up with the real ones) and ``K`` prompts are sampled per cell.

Everything here is a pure function over tables except :func:`load_labels`, which reads label sources.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from generation.styles import Style
from isood.errors import IsoodError

PROMPT_COLUMNS = ["prompt_id", "style", "wnid", "label", "prompt", "negative_prompt"]
_WNID = re.compile(r"^n\d{8}$")


class LabelError(IsoodError):
    """A label source is empty or unreadable."""


# --------------------------------------------------------------------------------------------- labels
def _first_lemma(lemmas: str) -> str:
    return lemmas.split(",")[0].strip()


def _labels_frame(rows: Iterable[tuple[str, str]], source: str) -> pd.DataFrame:
    df = pd.DataFrame(list(rows), columns=["wnid", "label"])
    df["label"] = df["label"].astype(str).str.strip()
    df = df[df["label"] != ""]
    key = np.where(df["wnid"] != "", df["wnid"], "label:" + df["label"])
    df = df.loc[~pd.Series(key, index=df.index).duplicated()].reset_index(drop=True)
    if df.empty:
        raise LabelError(f"no labels in {source}; pass --labels 21k, a class-filter manifest, or a file of wnids/labels")
    return df


def _names() -> dict[str, str]:
    from wordnet_tools.synsets import imagenet_names

    return imagenet_names()


def labels_from_lines(lines: Iterable[str], source: str, names: dict[str, str] | None = None) -> pd.DataFrame:
    """Parse a label file: each line is a wnid (named from timm's lemma file), ``wnid<whitespace>label``, or a
    plain label (no wnid). Blank lines and ``#`` comments are skipped."""
    rows = []
    for line_no, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        first, _, rest = text.partition(" ") if "\t" not in text else text.partition("\t")
        first, rest = first.strip(), rest.strip()
        if _WNID.match(first):
            names = _names() if names is None else names
            label = names.get(first) or (_first_lemma(rest) if rest else "")
            if not label:
                raise LabelError(f"{source}:{line_no}: wnid {first} has no known name; write 'wnid<TAB>label' on that line")
            rows.append((first, label))
        else:
            rows.append(("", text))
    return _labels_frame(rows, source)


def labels_from_manifest(root: str | Path) -> pd.DataFrame:
    """Kept classes of a class-filter manifest (any table with ``wnid`` and ``decision`` columns; ``name`` labels)."""
    import manifests

    m = manifests.read(root)
    for name in m.tables:
        df = m.frame(name)
        if {"wnid", "decision"} <= set(df.columns):
            kept = df[df["decision"] == "keep"]
            names = _names()
            labels = kept["name"] if "name" in kept.columns else pd.Series([""] * len(kept), index=kept.index)
            rows = [(w, (lab if isinstance(lab, str) and lab else names.get(w, ""))) for w, lab in zip(kept["wnid"], labels)]
            missing = [w for w, lab in rows if not lab]
            if missing:
                raise LabelError(f"{root}: {len(missing)} kept classes have no name (e.g. {missing[0]}); pass a labels file instead")
            return _labels_frame(rows, f"{root} (kept rows of table {name!r})")
    raise LabelError(f"{root}: no table with 'wnid' and 'decision' columns; pass a class-filter manifest (isood wordnet filter)")


def load_labels(spec: str | Path | None = "21k") -> pd.DataFrame:
    """Labels as a table (wnid, label): a named ImageNet list (``21k`` default, ``1k``, ``21k-p``, ``21k-p-w21``,
    ``12k``, ``21k-goog``; names = first lemma from timm's lemma file), a class-filter manifest directory (its
    kept rows), a dataset root (wnid subfolders), or a file of wnids / ``wnid label`` lines / plain labels."""
    from wordnet_tools.synsets import NAMED_LISTS, load_synset_list

    spec = "21k" if spec is None or str(spec).strip() == "" else spec
    if isinstance(spec, str) and spec in NAMED_LISTS:
        names = _names()
        return _labels_frame(((w, names.get(w, "")) for w in load_synset_list(spec)), f"--labels {spec}")
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "manifest.json").is_file():
        return labels_from_manifest(path)
    if path.is_dir():
        names = _names()
        return _labels_frame(((w, names.get(w, "")) for w in load_synset_list(path)), str(path))
    if path.is_file():
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise LabelError(f"cannot read labels file {path} ({e})") from None
        return labels_from_lines(lines, str(path))
    raise LabelError(
        f"unknown --labels {str(spec)!r}: pass one of {', '.join(NAMED_LISTS)}, a class-filter manifest, "
        "or a file of wnids/labels"
    )


# --------------------------------------------------------------------------------------------- prompts
def prompt_id(style: str, wnid: str, label: str) -> str:
    """Stable 16-hex id of (style name, wnid or, without one, label)."""
    key = wnid if wnid else f"label:{label}"
    return hashlib.sha256(f"{style}\x1f{key}".encode()).hexdigest()[:16]


def build_prompts(labels: pd.DataFrame, styles: Sequence[Style]) -> pd.DataFrame:
    """Every style x label: PROMPT_COLUMNS, ordered style-major (styles in order, then labels in order)."""
    if labels is None or len(labels) == 0:
        raise LabelError("the label set is empty; pass --labels 21k, a class-filter manifest, or a file of wnids/labels")
    if not styles:
        raise IsoodError("no styles; pass --styles sdxl or a style file")
    rows = []
    for st in styles:
        for wnid, label in zip(labels["wnid"], labels["label"]):
            p, neg = st.apply(label)
            rows.append((prompt_id(st.name, wnid, label), st.name, wnid, label, p, neg))
    df = pd.DataFrame.from_records(rows, columns=PROMPT_COLUMNS)
    return df.drop_duplicates("prompt_id").reset_index(drop=True)


def apply_blocklist(prompts: pd.DataFrame, blocklist) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split prompts into (kept, rejected); rejected rows get ``reason`` = 'blocklist: <term>'."""
    hits = [blocklist.match(p) for p in prompts["prompt"]]
    mask = np.array([h is not None for h in hits], dtype=bool)
    rejected = prompts.loc[mask].copy()
    rejected["reason"] = [f"blocklist: {h}" for h in hits if h is not None]
    return prompts.loc[~mask].reset_index(drop=True), rejected.reset_index(drop=True)


# --------------------------------------------------------------------------------------------- binning
def bin_prompts(
    prompts: pd.DataFrame,
    d_sem: np.ndarray,
    d_cov: np.ndarray,
    *,
    n_levels: int = 8,
    sem_edges: np.ndarray | None = None,
    cov_edges: np.ndarray | None = None,
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Attach d_sem, d_cov, sem_level, cov_level and cell to the prompts (isood.grid's level logic).

    With edges (from the image splits) the prompts are binned into the same intervals; without, the edges are
    equal-width over the prompts' own range. Returns (table, sem_edges, cov_edges).
    """
    from isood.grid import assign_levels, cell_name

    d_sem = np.asarray(d_sem, dtype=np.float64)
    d_cov = np.asarray(d_cov, dtype=np.float64)
    if not (len(d_sem) == len(d_cov) == len(prompts)):
        raise IsoodError(f"bin_prompts: {len(prompts)} prompts but {len(d_sem)}/{len(d_cov)} distances")
    sem_levels, sem_edges = assign_levels(d_sem, n_levels=n_levels, edges=sem_edges)
    cov_levels, cov_edges = assign_levels(d_cov, n_levels=n_levels, edges=cov_edges)
    out = prompts.copy()
    out["d_sem"] = d_sem
    out["d_cov"] = d_cov
    out["sem_level"] = np.asarray(sem_levels, dtype=np.int64)
    out["cov_level"] = np.asarray(cov_levels, dtype=np.int64)
    out["cell"] = [cell_name(int(c), int(s)) for c, s in zip(out["cov_level"], out["sem_level"])]
    return out, np.asarray(sem_edges, dtype=np.float64), np.asarray(cov_edges, dtype=np.float64)


def sample_per_cell(binned: pd.DataFrame, k: int, seed: int = 0) -> pd.DataFrame:
    """Up to ``k`` prompts per cell, drawn without replacement by a generator seeded from (seed, cell).

    Independent of the input row order (rows are sorted by prompt id first) and of the other cells' contents.
    Returned sorted by (cov_level, sem_level, prompt_id).
    """
    if k < 1:
        raise IsoodError(f"--per-cell must be >= 1, got {k}")
    ordered = binned.sort_values("prompt_id", kind="stable")
    picks = []
    for (c, s), group in ordered.groupby(["cov_level", "sem_level"], sort=True):
        if len(group) <= k:
            picks.append(group)
            continue
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(c), int(s)]))
        idx = np.sort(rng.choice(len(group), size=k, replace=False))
        picks.append(group.iloc[idx])
    if not picks:
        return binned.iloc[0:0].copy()
    out = pd.concat(picks)
    return out.sort_values(["cov_level", "sem_level", "prompt_id"], kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------------------------- images
def image_seed(global_seed: int, pid: str, index: int) -> int:
    """Seed of one image: 63 bits of SHA-256 over (global seed, prompt id, image index)."""
    digest = hashlib.sha256(f"{int(global_seed)}\x1f{pid}\x1f{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def style_slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "style"


def expand_images(prompts: pd.DataFrame, images_per_prompt: int, global_seed: int) -> pd.DataFrame:
    """One row per image to generate: the prompt's columns + image_index, seed, path (images/<style>/<id>_<i>.png)."""
    if images_per_prompt < 1:
        raise IsoodError(f"--images-per-prompt must be >= 1, got {images_per_prompt}")
    reps = prompts.loc[prompts.index.repeat(images_per_prompt)].reset_index(drop=True)
    reps["image_index"] = np.tile(np.arange(images_per_prompt, dtype=np.int64), len(prompts))
    reps["seed"] = [image_seed(global_seed, p, i) for p, i in zip(reps["prompt_id"], reps["image_index"])]
    reps["seed"] = reps["seed"].astype(np.int64)
    reps["path"] = [
        f"images/{style_slug(st)}/{p}_{i}.png" for st, p, i in zip(reps["style"], reps["prompt_id"], reps["image_index"])
    ]
    return reps
