"""`isood build-splits`: ID + test features -> LAID -> (D_sem, D_cov) per test image -> n x n grid -> manifest.

Steps (IS-OOD): features of the ID set (e.g. ImageNet-1K train) and of the test images come from one CLIP
model (``--id`` / ``--test`` are image sources, extracted on the fly into ``OUT/features-id`` /
``OUT/features-test``, or precomputed feature sets); LAID is loaded (``--laid``) or trained on text triplets of
labels x open_clip's 80 ImageNet templates encoded by the same CLIP; each test image gets
D_sem = min_ID d(x_sem, id_sem) and D_cov likewise (``isood.shift``); both are binned into ``levels`` equal-width
levels (``isood.grid``), giving cells ``cov_{c}_sem_{s}``.

The output is a manifest of kind ``splits``::

    data/images.parquet    path, wnid, d_sem, d_cov, sem_level, cov_level, cell   (one row per test image)
    data/cells.parquet     cell, cov_level, sem_level, n, na
    data/edges.parquet     axis ('sem'|'cov'), level, lower, upper
    data/dropped.parquet   set ('id'|'test'), path, wnid, reason   (NaN rows, filtered classes, unreadable)
    laid.safetensors       W (+ loss history); laid.json its config (text-set hash, options)
    lists/cov_{c}_sem_{s}.txt  test image paths of each cell, one per line (relative to the test root)
    features-id/, features-test/   the extracted features, when --id / --test were image sources
    manifest.json          written last

Every option can come from a TOML file (``--config build.toml``; keys are the long option names, with - or _;
relative paths are relative to the TOML file); options given on the command line override it.
"""

from __future__ import annotations

import os
import tomllib
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from isood.errors import IsoodError

#: Default number of LAID training triplets sampled from labels x templates (3 texts each, encoded once).
DEFAULT_TRIPLETS = 10_000
_PATH_KEYS = ("id", "test", "laid", "class_filter", "out")


@dataclass
class BuildConfig:
    """Options of `isood build-splits` (CLI flag = field name with - for _)."""

    id: str | None = None
    test: str | None = None
    out: str | None = None
    clip: str | None = None
    laid: str | None = None
    labels: str = "21k"
    class_filter: str | None = None
    exclude_id_classes: bool = False
    levels: int = 8
    na_threshold: int = 10
    clip_quantile: tuple[float, float] = (0.01, 0.99)
    triplets: int = DEFAULT_TRIPLETS
    laid_steps: int | None = None
    seed: int = 0
    backend: str = "auto"
    batch_size: int = 64
    workers: int | None = None
    shard_size: int = 10_000
    device: str | None = None
    cache_dir: str | None = None
    progress: bool = True
    extra: dict = field(default_factory=dict, repr=False)


def _parse_quantile(value: Any) -> tuple[float, float]:
    """``0.01`` -> (0.01, 0.99); ``"0.01,0.99"`` or ``[0.01, 0.99]`` -> (0.01, 0.99)."""
    try:
        if isinstance(value, str):
            parts = [float(p) for p in value.replace(" ", "").split(",") if p]
        elif isinstance(value, (list, tuple)):
            parts = [float(p) for p in value]
        else:
            parts = [float(value)]
    except (TypeError, ValueError):
        parts = []
    if len(parts) == 1:
        parts = [parts[0], 1.0 - parts[0]]
    if len(parts) != 2 or not 0.0 <= parts[0] < parts[1] <= 1.0:
        raise IsoodError(f"--clip-quantile {value!r}: pass LO,HI quantiles with 0 <= LO < HI <= 1 (e.g. 0.01,0.99) or one LO")
    return (parts[0], parts[1])


def load_build_config(config_file: str | os.PathLike | None = None, **cli: Any) -> BuildConfig:
    """Merge defaults < TOML file < command-line values (``None`` = not given on the command line)."""
    known = {f.name for f in fields(BuildConfig)} - {"extra"}
    values: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise IsoodError(f"--config {path}: file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise IsoodError(f"--config {path}: invalid TOML ({' '.join(str(e).split())})") from None
        if set(data) in ({"build-splits"}, {"build_splits"}):
            data = next(iter(data.values()))
        for key, value in data.items():
            k = key.replace("-", "_")
            if k not in known:
                raise IsoodError(f"--config {path}: unknown key {key!r}; known: {', '.join(sorted(known))}")
            if k in _PATH_KEYS and isinstance(value, str):
                value = str((path.parent / Path(value).expanduser()))
            elif k == "clip" and isinstance(value, str) and value.startswith("local-dir:"):
                value = "local-dir:" + str(path.parent / Path(value[len("local-dir:"):]).expanduser())
            elif k == "labels" and isinstance(value, str) and (path.parent / value).exists():
                value = str(path.parent / value)
            values[k] = value
    for k, v in cli.items():
        if k not in known:
            raise TypeError(f"unknown build option {k}")
        if v is not None:
            values[k] = v
    cfg = BuildConfig(**values)
    cfg.clip_quantile = _parse_quantile(cfg.clip_quantile)
    for name in ("levels", "na_threshold", "triplets", "batch_size", "shard_size"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "na_threshold" else 1):
            raise IsoodError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
    for name in ("id", "test", "out"):
        if not getattr(cfg, name):
            raise IsoodError(f"--{name} is required (on the command line or in --config)")
    for name in _PATH_KEYS + ("cache_dir",):
        v = getattr(cfg, name)
        if v is not None:
            setattr(cfg, name, str(v))
    return cfg


# ----------------------------------------------------------------------------------------------- labels


def class_filter_kept(path: str | os.PathLike) -> tuple[list[str], dict[str, str]]:
    """Kept wnids (sorted) and their names from a class-filter manifest (`isood wordnet filter --out`)."""
    import manifests

    m = manifests.read(path)
    for name in ["classes"] + m.tables:
        if name not in m.tables:
            continue
        cols = m.meta["tables"][name].get("columns", [])
        if "wnid" in cols and ("decision" in cols or "keep" in cols):
            df = m.frame(name)
            keep = df["decision"].eq("keep") if "decision" in df.columns else df["keep"].astype(bool)
            kept = df.loc[keep]
            names = dict(zip(kept["wnid"], kept["name"])) if "name" in kept.columns else {}
            return sorted(kept["wnid"].astype(str)), {k: str(v) for k, v in names.items() if v}
    raise IsoodError(f"{path}: not a class-filter manifest (no table with wnid and decision columns); pass `isood wordnet filter --out DIR`")


def load_labels(spec: str | os.PathLike) -> tuple[list[str], str]:
    """LAID training labels and a description of where they came from.

    ``spec``: a named ImageNet list (``21k`` default, ``1k``, ``21k-p``, ``21k-p-w21``, ``12k``, ``21k-goog``;
    first lemma from timm's imagenet_synset_to_lemma.txt), a class-filter manifest directory (its kept
    classes), or a text file with one wnid (-> lemma) or one free-text label per line.
    """
    from wordnet_tools.synsets import NAMED_LISTS, imagenet_names, load_synset_list

    spec = str(spec)
    names = imagenet_names()
    if spec in NAMED_LISTS:
        wnids = load_synset_list(spec)
        labels = [names[w] for w in wnids if names.get(w)]
        return list(dict.fromkeys(labels)), f"{spec} ({len(wnids)} wnids, timm lemmas)"
    p = Path(spec).expanduser()
    if p.is_dir() and (p / "manifest.json").is_file():
        wnids, own = class_filter_kept(p)
        labels = [own.get(w) or names.get(w, "") for w in wnids]
        return list(dict.fromkeys(x for x in labels if x)), f"class filter {p} ({len(wnids)} kept classes)"
    if p.is_file():
        from isood.features import WNID_RE

        labels = []
        for raw in p.read_text(encoding="utf-8").splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            first = line.split()[0]
            labels.append(names.get(first, "") if WNID_RE.match(first) else line)
        labels = list(dict.fromkeys(x for x in labels if x))
        if len(labels) < 2:
            raise IsoodError(f"--labels {p}: needs at least 2 distinct labels (one wnid or label per line)")
        return labels, f"file {p} ({len(labels)} labels)"
    raise IsoodError(
        f"--labels {spec!r}: pass one of {', '.join(NAMED_LISTS)}, a class-filter manifest directory, or a file "
        "with one wnid or label per line"
    )


# ----------------------------------------------------------------------------------------------- features


@dataclass
class FeatureSet:
    """Features of one side (ID or test): rows, index (path, wnid), where they came from."""

    name: str
    features: np.ndarray
    index: pd.DataFrame
    source: str
    identity: str | None  # CLIP identity recorded with the features, when known
    root: str | None  # folder the index paths are relative to, when known
    extracted_dir: str | None = None  # OUT/features-<name> when extracted in this run
    rejected: pd.DataFrame | None = None
    input: dict = field(default_factory=dict)


def _feature_meta(path: Path) -> tuple[str | None, str | None, dict, pd.DataFrame | None]:
    """(clip identity, image root, input record, rejected table) of a precomputed feature set."""
    import manifests

    if path.is_dir() and (path / "manifest.json").is_file():
        m = manifests.read(path)
        cfg = m.meta.get("command", {}).get("config", {})
        images = cfg.get("images")
        root = str(Path(images).parent) if images and cfg.get("source_kind") == "list" else images
        rejected = m.frame("rejected") if "rejected" in m.tables else None
        return cfg.get("clip_identity"), root, manifests.input_record("features", path, sha256=m.meta["content_sha256"]), rejected
    return None, None, manifests.input_record("features", path), None


# ----------------------------------------------------------------------------------------------- job


@dataclass
class BuildResult:
    manifest: Any
    n_test: int
    n_id: int
    n_dropped: int
    cells: pd.DataFrame
    warnings: list[str]


def build_splits(cfg: BuildConfig, console=None, argv: list[str] | None = None) -> BuildResult:
    """Run `isood build-splits` with ``cfg``; returns the splits manifest and counts. See the module docstring."""
    import manifests
    from rich.console import Console

    from isood import features as F
    from isood.grid import assign_levels, cell_table
    from isood.laid import LAID
    from isood.shift import prepare_features, shift_distances

    console = console or Console(stderr=True)
    notes: list[str] = []

    def warn(msg: str) -> None:
        notes.append(msg)
        console.print(f"[yellow]warning:[/yellow] {msg}", highlight=False, soft_wrap=True)

    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise IsoodError(f"--out {out} is a file; pass a directory")
    F.check_output_kind(out, "splits")
    for name in ("id", "test"):
        F.check_output_kind(out / f"features-{name}", "features", option="--out")
    for name in ("id", "test"):
        if not Path(getattr(cfg, name)).exists():
            raise IsoodError(f"--{name} {getattr(cfg, name)} does not exist; pass an image folder, a file list or a feature set")
    id_is_feat, test_is_feat = F.is_feature_dir(cfg.id), F.is_feature_dir(cfg.test)
    need_clip = not (id_is_feat and test_is_feat and cfg.laid)
    if need_clip and not cfg.clip:
        raise IsoodError("--clip is required to extract images or train LAID (e.g. --clip ViT-B-32:openai or local-dir:PATH)")
    clip_identity = F.parse_clip_spec(cfg.clip)[2] if cfg.clip else None
    laid = LAID.load(cfg.laid) if cfg.laid else None
    kept_wnids = set(class_filter_kept(cfg.class_filter)[0]) if cfg.class_filter else None
    if laid is None:
        labels, labels_from = load_labels(cfg.labels)
        if len(labels) < 2:
            raise IsoodError(f"--labels {cfg.labels}: fewer than 2 labels with names; pass another label list")

    # Precomputed features first (cheap checks before anything is written).
    sets: dict[str, FeatureSet] = {}
    for name, is_feat in (("id", id_is_feat), ("test", test_is_feat)):
        if is_feat:
            src = Path(getattr(cfg, name))
            x, index = F.load_features(src)
            identity, root, rec, rejected = _feature_meta(src)
            rec["name"] = f"{name}_features"
            sets[name] = FeatureSet(name, x, index, str(src), identity, root, rejected=rejected, input=rec)
    for s in sets.values():
        if clip_identity and s.identity and s.identity != clip_identity:
            raise IsoodError(f"{s.source} was extracted with another CLIP ({s.identity}) than --clip {cfg.clip} ({clip_identity}); pass the same --clip")
    if len(sets) == 2 and sets["id"].identity and sets["test"].identity and sets["id"].identity != sets["test"].identity:
        raise IsoodError(f"--id and --test features come from different CLIP models ({sets['id'].identity} vs {sets['test'].identity})")
    if len(sets) == 2 and sets["id"].features.shape[1] != sets["test"].features.shape[1]:
        raise IsoodError(f"feature dimension mismatch: --id has {sets['id'].features.shape[1]}, --test has {sets['test'].features.shape[1]}; pass features from the same CLIP")
    for s in sets.values():
        if laid is not None and s.features.shape[1] != laid.dim:
            raise IsoodError(f"feature dimension mismatch: --{s.name} features have {s.features.shape[1]}, --laid W is {laid.dim}x{laid.dim}; pass the LAID fitted for this CLIP")
    if "id" in sets and len(sets["id"].features) == 0:
        raise IsoodError(f"--id {cfg.id}: the ID feature set is empty; pass at least one ID image")
    if laid is not None and clip_identity and laid.config.get("clip_identity") not in (None, clip_identity):
        warn(f"--laid was trained with {laid.config['clip_identity']}, not {clip_identity}")

    encoder = None
    if need_clip:
        encoder = F.load_clip(cfg.clip, cfg.device)
        if laid is not None and laid.dim != encoder.embed_dim:
            raise IsoodError(f"feature dimension mismatch: --clip {cfg.clip} gives {encoder.embed_dim}, --laid W is {laid.dim}x{laid.dim}")

    out.mkdir(parents=True, exist_ok=True)
    manifests.park(out)  # from here on the directory is unfinished until the new manifest.json lands
    for name, is_feat in (("id", id_is_feat), ("test", test_is_feat)):
        if is_feat:
            continue
        sub = out / f"features-{name}"
        res = F.extract_features(getattr(cfg, name), encoder, sub, batch_size=cfg.batch_size, workers=cfg.workers,
                                 shard_size=cfg.shard_size, progress=cfg.progress, argv=argv)
        x, index = F.load_features(sub)
        src = F.list_images(getattr(cfg, name))
        if res.n_rejected:
            warn(f"--{name}: {res.n_rejected} unreadable image(s) skipped (see data/dropped.parquet)")
        sets[name] = FeatureSet(name, x, index, str(getattr(cfg, name)), encoder.identity, str(src.root), str(sub),
                                rejected=res.manifest.frame("rejected"),
                                input=manifests.input_record(f"{name}_images", getattr(cfg, name), sha256=src.listing_sha256))
    ids, test = sets["id"], sets["test"]
    if ids.features.shape[1] != test.features.shape[1]:
        raise IsoodError(f"feature dimension mismatch: --id has {ids.features.shape[1]}, --test has {test.features.shape[1]}; pass features from the same CLIP")
    if encoder is not None and test.features.shape[1] != encoder.embed_dim:
        raise IsoodError(f"feature dimension mismatch: features have {test.features.shape[1]}, --clip {cfg.clip} gives {encoder.embed_dim}")

    # Clean rows: NaN/inf dropped and recorded, non-normalised rows normalised with a warning.
    dropped_parts = []
    clean: dict[str, tuple[np.ndarray, pd.DataFrame]] = {}
    for s in (ids, test):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x, mask = prepare_features(s.features, f"--{s.name} features")
        for w in caught:
            warn(str(w.message))
        if s.rejected is not None and len(s.rejected):
            dropped_parts.append(pd.DataFrame({"set": s.name, "path": s.rejected["path"].astype(str), "wnid": s.rejected["wnid"].astype(str),
                                               "reason": "unreadable: " + s.rejected["error"].astype(str)}))
        if mask.any():
            bad = s.index.loc[mask]
            dropped_parts.append(pd.DataFrame({"set": s.name, "path": bad["path"], "wnid": bad["wnid"], "reason": "non-finite or zero feature"}))
        clean[s.name] = (x[~mask], s.index.loc[~mask].reset_index(drop=True))
    x_id, idx_id = clean["id"]
    x_test, idx_test = clean["test"]
    if len(x_id) == 0:
        raise IsoodError(f"--id {cfg.id}: no usable ID features (empty set, or every row NaN/inf); pass at least one ID image")

    keep = np.ones(len(idx_test), dtype=bool)
    if kept_wnids is not None:
        out_filter = ~idx_test["wnid"].isin(kept_wnids).to_numpy()
        if out_filter.any():
            bad = idx_test.loc[out_filter]
            dropped_parts.append(pd.DataFrame({"set": "test", "path": bad["path"], "wnid": bad["wnid"], "reason": "class filter: not kept"}))
        keep &= ~out_filter
    if cfg.exclude_id_classes:
        id_wnids = set(idx_id["wnid"]) - {""}
        is_id = keep & idx_test["wnid"].isin(id_wnids).to_numpy()
        if is_id.any():
            bad = idx_test.loc[is_id]
            dropped_parts.append(pd.DataFrame({"set": "test", "path": bad["path"], "wnid": bad["wnid"], "reason": "ID class"}))
        keep &= ~is_id
    x_test, idx_test = x_test[keep], idx_test.loc[keep].reset_index(drop=True)
    if len(x_test) == 0:
        raise IsoodError("no test images left (empty --test set, or all removed by --class-filter / --exclude-id-classes)")

    # LAID: load or train on text triplets encoded by the same CLIP.
    fit_seconds = None
    if laid is None:
        laid, fit_seconds = train_laid_from_labels(
            encoder, labels, labels_from=labels_from, triplets=cfg.triplets, seed=cfg.seed, steps=cfg.laid_steps,
            cache_dir=cfg.cache_dir, progress=cfg.progress)
    if x_id.shape[1] != laid.dim:
        raise IsoodError(f"feature dimension mismatch: features have {x_id.shape[1]}, --laid W is {laid.dim}x{laid.dim}; pass the LAID fitted for this CLIP")

    with console.status(f"measuring shift of {len(x_test)} test images against {len(x_id)} ID images"):
        device = None if cfg.device in (None, "", "auto") else cfg.device
        d_sem, d_cov = shift_distances(x_test, x_id, laid, backend=cfg.backend, device=device)
    sem_levels, sem_edges = assign_levels(d_sem, cfg.levels, clip=cfg.clip_quantile)
    cov_levels, cov_edges = assign_levels(d_cov, cfg.levels, clip=cfg.clip_quantile)
    cells = cell_table(cov_levels, sem_levels, cfg.levels, cfg.na_threshold)
    from isood.grid import cell_name

    images = pd.DataFrame({
        "path": idx_test["path"].astype(str), "wnid": idx_test["wnid"].astype(str),
        "d_sem": d_sem.astype(np.float32), "d_cov": d_cov.astype(np.float32),
        "sem_level": sem_levels.astype(np.int64), "cov_level": cov_levels.astype(np.int64),
    })
    images["cell"] = [cell_name(c, s) for c, s in zip(images["cov_level"], images["sem_level"])]
    edges = pd.DataFrame({
        "axis": ["sem"] * cfg.levels + ["cov"] * cfg.levels,
        "level": np.concatenate([np.arange(cfg.levels)] * 2).astype(np.int64),
        "lower": np.concatenate([sem_edges[:-1], cov_edges[:-1]]),
        "upper": np.concatenate([sem_edges[1:], cov_edges[1:]]),
    })
    dropped = (pd.concat(dropped_parts, ignore_index=True) if dropped_parts
               else pd.DataFrame({"set": pd.Series(dtype=str), "path": pd.Series(dtype=str), "wnid": pd.Series(dtype=str), "reason": pd.Series(dtype=str)}))
    lists = {}
    by_cell = images.groupby("cell", sort=False)["path"].apply(list).to_dict()
    for cell in cells["cell"]:
        paths = by_cell.get(cell, [])
        lists[f"lists/{cell}.txt"] = "".join(p + "\n" for p in paths)
    files = {**lists, **laid_files(laid)}

    existing = []
    for s in (ids, test):
        if s.extracted_dir:
            sub = Path(s.extracted_dir)
            existing += [q.relative_to(out).as_posix() for q in sorted(sub.rglob("*"))
                         if q.is_file() and q.name != "manifest.json" and not q.name.startswith(".~")]
    config = {k: v for k, v in asdict(cfg).items() if k not in ("extra", "progress")}
    config.update(clip_identity=clip_identity or ids.identity, id_root=ids.root, test_root=test.root)
    inputs = [ids.input, test.input]
    if cfg.laid:
        inputs.append(manifests.input_record("laid", cfg.laid))
    if cfg.class_filter:
        m = manifests.read(cfg.class_filter)
        inputs.append(manifests.input_record("class_filter", cfg.class_filter, sha256=m.meta["content_sha256"]))
    n_na = int(cells["na"].sum())
    summary = {
        "test_images": int(len(images)), "id_images": int(len(x_id)), "dropped": int(len(dropped)),
        "cells": int(len(cells)), "cells_na": n_na, "laid_orthogonality_error": laid.orthogonality_error,
        "laid_fit_seconds": fit_seconds, "warnings": notes,
    }
    manifests.unpark(out)
    manifest = manifests.write_manifest(
        out, kind="splits", tables={"images": images, "cells": cells, "edges": edges, "dropped": dropped},
        config=config, inputs=inputs, files=files, existing_files=existing, summary=summary,
        note=f"{len(images)} test images in {cfg.levels}x{cfg.levels} cells", argv=argv,
    )
    return BuildResult(manifest, len(images), len(x_id), len(dropped), cells, notes)


def train_laid_from_labels(encoder, labels: list[str], *, labels_from: str, triplets: int = DEFAULT_TRIPLETS, seed: int = 0,
                           steps: int | None = None, cache_dir: str | os.PathLike | None = None, progress: bool = True):
    """The IS-OOD LAID recipe, shared by `build-splits` and `generate-syn`: text triplets of ``labels`` x
    open_clip's 80 ImageNet templates, encoded once by ``encoder`` (cached), fitted with ``fit_laid``.
    Returns (LAID, fit seconds); the same labels, triplets, seed and CLIP give the same W."""
    from isood import features as F
    from isood.laid import fit_laid, make_text_triplets, openai_imagenet_templates

    labels = list(dict.fromkeys(labels))
    if len(labels) < 2:
        raise IsoodError("training LAID needs at least 2 distinct labels; pass more --labels or a trained --laid")
    anchor, sem, cov = make_text_triplets(labels, openai_imagenet_templates(), triplets, seed=seed)
    texts = list(dict.fromkeys(anchor + sem + cov))
    cache = Path(cache_dir) if cache_dir else F.default_cache_dir() / "text-features"
    tf = F.encode_texts(encoder, texts, cache_dir=cache, progress=progress, description="encoding LAID texts")
    pos = {t: i for i, t in enumerate(texts)}
    A, S, C = (tf[[pos[t] for t in part]] for part in (anchor, sem, cov))
    options: dict[str, Any] = {"seed": seed}
    if steps:
        options["steps"] = steps
    laid = _fit_with_progress(fit_laid, A, S, C, anchor + sem + cov, options, progress)
    fit_seconds = laid.config.pop("fit_seconds", None)
    laid.config.update(clip_identity=encoder.identity, labels=labels_from, n_labels=len(labels),
                       templates="open_clip.OPENAI_IMAGENET_TEMPLATES (80)")
    return laid, fit_seconds


def laid_files(laid) -> dict[str, bytes]:
    """laid.safetensors + laid.json as bytes, as the splits and Syn-IS manifests store them."""
    return laid.files("laid.safetensors")


def _fit_with_progress(fit_laid: Callable, A, S, C, texts, options, progress: bool):
    from isood.features import _progress

    steps = options.get("steps")
    with _progress(progress) as bar:
        task = bar.add_task("training LAID", total=steps)

        def callback(step, total, losses):
            bar.update(task, total=total, completed=step + 1, description=f"training LAID (loss {losses['total']:.3f})")

        return fit_laid(A, S, C, texts=texts, callback=callback, **options)


def read_edges(edges: pd.DataFrame, axis: str) -> np.ndarray:
    """The n_levels + 1 edges of one axis ('sem' or 'cov') from a splits manifest's edges table."""
    part = edges[edges["axis"] == axis].sort_values("level")
    if part.empty:
        raise IsoodError(f"edges table has no rows for axis {axis!r}")
    return np.concatenate([part["lower"].to_numpy(), part["upper"].to_numpy()[-1:]]).astype(np.float64)
