"""The `isood evaluate` job: a classifier + OOD detectors scored per shift cell of a splits (and Syn-IS) manifest.

Steps:

1. Read and verify the grid manifests (``--splits``, kind ``splits``; ``--syn``, kind ``syn-is``); a manifest that
   fails verification is refused, naming its problems.
2. Data. ``--id-train`` / ``--id-test`` are image folders with one wnid sub-folder per class (or file lists,
   ``isood.features.list_images``), or precomputed outputs (below). The test images are the manifest's
   ``images.path`` rows, relative to ``--test-root`` (default: the ``test_root`` the manifest was built with);
   Syn-IS paths are relative to the Syn-IS manifest folder.
3. Class index of an ID image (what the model's logit ``k`` means), in this order:
   ``--classes FILE`` (the model's wnids in logit order, one per line); else the sorted wnids of ``--id-train``
   when the model has that many classes; else, for a 1000-class model whose ID wnids are all ImageNet-1K
   classes, the ImageNet-1K order (= sorted ImageNet-1K wnids, the order of every standard ImageNet model).
   Anything else is a class-count mismatch (an error naming both counts). A test image whose wnid is an ID
   class keeps its class index (the model may still classify a covariate-shifted image correctly); other
   test images are semantic OOD (label -1, never correct).
4. One forward pass per batch (``runner.run_detectors``; outputs cached on disk under ``--cache-dir``, keyed by
   model + data + preprocessing), detectors fitted on ``--id-train`` (which is also scored: DER's threshold).
5. Every metric per cell (``cells.evaluate_cells``; a cell is N/A when the manifest marks it or it has fewer
   than ``--na-threshold`` images), level curves, Table 1, per-detector means; heatmaps and level-curve PNGs
   (``plots``); ``report.html`` and ``summary.md`` (``report``).
6. ``--sanity-random-model``: the same detectors on a randomly initialised copy of the model
   (``randomized_copy``), AUROC (data view) next to AUROC_M (model view).
7. One ``evaluation`` manifest (``write_evaluation``): tables ``cell_metrics``, ``level_curves``, ``table1``,
   ``detector_means``, ``scores`` (one row per image and dataset, a column per detector), ``sanity`` and
   ``cell_metrics_random`` (with the sanity check); ``results/*.csv`` copies; ``plots/*.png``; ``report.html``;
   ``summary.md``; ``README.md`` card. ``manifest.json`` is written last, after everything was computed, so an
   interrupted run never looks complete.

Precomputed outputs (no forward pass): a folder with ``index.parquet`` (``path``; ``wnid`` or ``label``),
``logits.npy`` (N x C) and optionally ``features.npy`` (N x D), ``fc_weight.npy`` (C x D) and ``fc_bias.npy``
(C,) — see ``save_outputs``. Either all three sources (``--id-train``, ``--id-test``, ``--test-root``) are
precomputed or none; the test folder's index ``path`` values must cover the manifest's ``images.path``.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from isood.errors import IsoodError, ManifestError, MissingWeightsError

from .cells import NA_THRESHOLD, CellEvaluation, evaluate_cells

__all__ = [
    "EvaluateOptions",
    "EvaluateResult",
    "run_evaluate",
    "write_evaluation",
    "parse_detectors",
    "load_grid_manifest",
    "class_list",
    "randomized_copy",
    "sanity_table",
    "save_outputs",
    "load_outputs",
    "is_outputs_dir",
    "ImageList",
]

KIND = "evaluation"
GRID_KINDS = {"splits": "splits", "syn": "syn-is"}
DEFAULT_DETECTORS = "msp,maxlogit,energy,mds,knn"
ID_TRAIN, ID_TEST = "id_train", "id_test"


# ================================================================================================= options
@dataclass
class EvaluateOptions:
    """Everything `isood evaluate` takes (CLI flag = field name with - for _)."""

    splits: str | None = None
    out: str | None = None
    id_test: str | None = None
    id_train: str | None = None
    model: str | None = None
    detectors: str = DEFAULT_DETECTORS
    syn: str | None = None
    test_root: str | None = None
    checkpoint: str | None = None
    num_classes: int | None = None
    classes: str | None = None
    batch_size: int = 64
    device: str | None = None
    workers: int = 0
    cache_dir: str | None = None
    sanity_random_model: bool = False
    na_threshold: int = NA_THRESHOLD
    der: bool = True
    plot_metrics: str | None = None
    seed: int = 0
    progress: bool = True


@dataclass
class EvaluateResult:
    manifest: Any
    evaluation: CellEvaluation
    sanity: pd.DataFrame | None
    seconds: float
    notes: list[str] = field(default_factory=list)


# ================================================================================================ detectors
def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    return text


def parse_detectors(spec: str | Sequence[str]) -> dict[str, Any]:
    """``'msp,energy,knn:k=10,react:percentile=95'`` -> ``{'msp': MSP(), ..., 'knn': KNN(k=10), ...}``.

    Comma-separated registry names (``available_detectors()``); ``name:key=value`` passes a hyper-parameter and a
    following bare ``key=value`` adds another to the same detector (``ash:percentile=85,foo=1``)."""
    from .detectors import get_detector

    tokens = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t and t.strip()]
    if not tokens:
        raise IsoodError("--detectors is empty: pass names such as msp,energy,knn")
    order: list[tuple[str, dict]] = []
    for tok in tokens:
        if ":" in tok:
            name, kv = tok.split(":", 1)
            order.append((name.strip(), {}))
            tok = kv
        elif "=" not in tok:
            order.append((tok, {}))
            continue
        if not order:
            raise IsoodError(f"--detectors: {tok!r} has no detector before it: write name:key=value")
        key, sep, val = tok.partition("=")
        if not sep or not key.strip():
            raise IsoodError(f"--detectors: cannot read {tok!r}: write name:key=value")
        order[-1][1][key.strip()] = _value(val.strip())
    out = {}
    for name, kwargs in order:
        if name in out:
            raise IsoodError(f"--detectors names '{name}' twice: list each detector once")
        try:
            out[name] = get_detector(name, **kwargs)
        except TypeError as e:
            raise IsoodError(f"detector '{name}': bad parameter ({e}): see its documentation") from None
    return out


# ================================================================================================ manifests
def load_grid_manifest(path: str | os.PathLike, expected_kind: str, flag: str = "--splits"):
    """Read a grid manifest, refuse it when it fails verification or is of another kind."""
    import manifests

    p = Path(path)
    try:
        m = manifests.read(p)
    except ManifestError as e:
        raise IsoodError(f"{flag} {p}: {e}") from None
    report = manifests.verify(p)
    if not report.ok:
        problems = report.lines()
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ManifestError(f"{flag} {p} fails verification ({'; '.join(problems[:5])}{more}): "
                            "rebuild it or restore its files (`isood verify` lists them)")
    if m.kind != expected_kind:
        raise IsoodError(f"{flag} {p} is a '{m.kind}' manifest: pass a '{expected_kind}' manifest")
    for t in ("images", "cells"):
        if t not in m.tables:
            raise IsoodError(f"{flag} {p} has no '{t}' table: pass a manifest written by isood build-splits/generate-syn")
    return m


# ================================================================================================ classes
def _imagenet_1k() -> list[str]:
    from wordnet_tools.synsets import load_synset_list

    return list(load_synset_list("1k"))


def class_list(id_wnids: Sequence[str], n_model_classes: int | None, classes_file: str | None = None,
               model_name: str = "model") -> list[str]:
    """The model's class wnids in logit order (see the module docstring, step 3), or a one-line error."""
    wnids = sorted(set(w for w in id_wnids if w))
    if not wnids:
        raise IsoodError("--id-train has no class folders: pass a folder with one wnid sub-folder per class")
    if classes_file is not None:
        p = Path(classes_file)
        if not p.is_file():
            raise IsoodError(f"--classes {p}: file not found")
        listed = [ln.split()[0] for ln in p.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        if n_model_classes is not None and len(listed) != n_model_classes:
            raise IsoodError(f"class-count mismatch: --classes lists {len(listed)} classes but model '{model_name}' "
                             f"has {n_model_classes} outputs: list one wnid per model output")
        missing = sorted(set(wnids) - set(listed))
        if missing:
            raise IsoodError(f"--id-train classes {', '.join(missing[:5])} are not in --classes {p}: "
                             "use the model trained on the ID classes")
        return listed
    if n_model_classes is None or len(wnids) == n_model_classes:
        return wnids
    if n_model_classes == 1000:
        in1k = _imagenet_1k()
        if set(wnids) <= set(in1k):
            return in1k
    shown = ", ".join(wnids[:3]) + (", ..." if len(wnids) > 3 else "")
    raise IsoodError(f"class-count mismatch: model '{model_name}' has {n_model_classes} classes but --id-train has "
                     f"{len(wnids)} class folders ({shown}): pass the model trained on these classes, "
                     "--num-classes with --checkpoint, or --classes FILE listing the model's classes in order")


def _labels(wnids: Sequence[str], classes: Sequence[str], *, strict: bool, what: str) -> np.ndarray:
    index = {w: i for i, w in enumerate(classes)}
    if strict:
        missing = sorted(set(wnids) - set(index))
        if missing:
            raise IsoodError(f"{what}: classes {', '.join(missing[:5])} are not ID classes of the model "
                             "(not in --id-train / --classes): remove them or fix the class list")
    return np.array([index.get(w, -1) for w in wnids], dtype=np.int64)


# ================================================================================================ data
class ImageList:
    """A torch-style dataset of image files: ``(transform(RGB image), label)``; unreadable files -> IsoodError."""

    def __init__(self, files: Sequence[Path], labels: Sequence[int], transform: Callable) -> None:
        self.files = [Path(f) for f in files]
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(self.files[i]) as im:
                img = im.convert("RGB")
        except (OSError, UnidentifiedImageError) as e:
            raise IsoodError(f"cannot read image {self.files[i]}: {type(e).__name__}: remove or replace it") from None
        return self.transform(img), int(self.labels[i])


def _default_transform():
    from torchvision import transforms as T

    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                      T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])


def _files_id(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        try:
            size = f.stat().st_size
        except OSError:
            size = -1
        h.update(f"{f}\t{size}\n".encode())
    return h.hexdigest()


def _check_files(files: Sequence[Path], what: str) -> None:
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise IsoodError(f"{what}: {len(missing)} of {len(files)} images are missing (first: {missing[0]}): "
                         "pass the folder they are relative to (--test-root)")


# ------------------------------------------------------------------------------------------- precomputed
def is_outputs_dir(path: str | os.PathLike | None) -> bool:
    """A precomputed-outputs folder: ``index.parquet`` + ``logits.npy``."""
    if path is None:
        return False
    p = Path(path)
    return p.is_dir() and (p / "index.parquet").is_file() and (p / "logits.npy").is_file()


def save_outputs(path: str | os.PathLike, index: pd.DataFrame, *, logits, features=None, fc_weight=None,
                 fc_bias=None) -> Path:
    """Write a precomputed-outputs folder (``index.parquet`` with ``path`` and ``wnid`` or ``label``; ``.npy``
    arrays with one row per index row) usable as ``--id-train`` / ``--id-test`` / ``--test-root``."""
    import manifests

    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    if "path" not in index.columns or not ({"wnid", "label"} & set(index.columns)):
        raise IsoodError("save_outputs: index needs a 'path' column and a 'wnid' or 'label' column")
    arrays = {"logits": logits, "features": features, "fc_weight": fc_weight, "fc_bias": fc_bias}
    for name, a in arrays.items():
        if a is None:
            continue
        a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
        if name in ("logits", "features") and a.shape[0] != len(index):
            raise IsoodError(f"save_outputs: {name} has {a.shape[0]} rows for {len(index)} index rows")
        import io

        buf = io.BytesIO()
        np.save(buf, a)
        manifests.atomic_write_bytes(p / f"{name}.npy", buf.getvalue())
    manifests.atomic_write_bytes(p / "index.parquet", manifests.parquet_bytes(index.reset_index(drop=True)))
    return p


def load_outputs(path: str | os.PathLike):
    """``(ForwardOutputs, index)`` of a precomputed-outputs folder."""
    from .detectors import ForwardOutputs

    p = Path(path)
    if not is_outputs_dir(p):
        raise IsoodError(f"{p} is not a precomputed-outputs folder (index.parquet + logits.npy)")
    index = pd.read_parquet(p / "index.parquet")
    if "path" not in index.columns:
        raise IsoodError(f"{p}/index.parquet has no 'path' column")
    load = {k: (np.load(p / f"{k}.npy") if (p / f"{k}.npy").is_file() else None)
            for k in ("logits", "features", "fc_weight", "fc_bias")}
    for k in ("logits", "features"):
        if load[k] is not None and load[k].shape[0] != len(index):
            raise IsoodError(f"{p}/{k}.npy has {load[k].shape[0]} rows but index.parquet {len(index)}")
    return ForwardOutputs(logits=load["logits"], features=load["features"], fc_weight=load["fc_weight"],
                          fc_bias=load["fc_bias"]), index


def _score_outputs(detectors: Mapping[str, Any], train, datasets: Mapping[str, Any], score_train: bool):
    """``runner.DetectorScores`` from precomputed ForwardOutputs (fit on ``train``, score everything)."""
    from .runner import DetectorScores

    for name, d in detectors.items():
        lack = set(d.requires) - set(train.available)
        if lack:
            raise IsoodError(f"detector '{name}' needs {', '.join(sorted(lack))}, which the precomputed outputs do "
                             f"not hold (they have {', '.join(sorted(train.available))}): add "
                             f"{'/'.join(sorted(lack))} to the outputs folders or pass image folders and --model")
    n_classes = train.logits.shape[1]
    if train.labels is not None and len(train.labels) and (train.labels.min() < 0 or train.labels.max() >= n_classes):
        raise IsoodError(f"ID training labels span [{train.labels.min()}, {train.labels.max()}] but the logits have "
                         f"{n_classes} classes")
    for d in detectors.values():
        if d.needs_fit:
            d.fit(train, train.labels)
    res = DetectorScores()
    all_sets = ({ID_TRAIN: train} if score_train else {}) | dict(datasets)
    for ds, outs in all_sets.items():
        res.predictions[ds] = outs.logits.argmax(axis=1)
        res.labels[ds] = outs.labels
        for name, d in detectors.items():
            res.scores.setdefault(name, {})[ds] = np.asarray(d.score(outs), dtype=np.float64)
    return res


# ================================================================================================ model
def _load_adapter(opts: EvaluateOptions, n_id_classes: int):
    from .runner import load_classifier, wrap_model

    name = opts.model
    if name is None:
        raise IsoodError("--model is required with image folders: pass a timm name (e.g. resnet50), "
                         "'torchvision/<name>' or py:MODULE:FUNCTION")
    if name.startswith("py:"):
        spec = name[3:]
        mod, _, attr = spec.partition(":")
        if not mod or not attr:
            raise IsoodError(f"--model {name}: write py:package.module:function (a function returning the model)")
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise IsoodError(f"--model {name}: cannot import ({type(e).__name__}: {e})") from None
        model = obj() if callable(obj) and not hasattr(obj, "forward") else obj
        adapter = wrap_model(model, name=spec)
        if adapter.transform is None and getattr(adapter.model, "pretrained_cfg", None):
            import timm.data  # a timm model built by the user's function: its own preprocessing

            adapter.transform = timm.data.create_transform(**timm.data.resolve_data_config(model=adapter.model))
        return adapter
    num_classes = opts.num_classes or (n_id_classes if opts.checkpoint else None)
    try:
        return load_classifier(name, checkpoint=opts.checkpoint, num_classes=num_classes)
    except MissingWeightsError:
        raise MissingWeightsError(f"no pretrained weights for '{name}' (offline or not in the local cache): pass "
                                  "--checkpoint PATH of a local weights file (or set HF_HUB_OFFLINE=1 to fail "
                                  "fast)") from None
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise IsoodError(f"cannot load model '{name}' from --checkpoint {opts.checkpoint}: {first}: pass "
                         "--num-classes N matching the checkpoint's classifier head") from None


def _model_classes(adapter) -> int | None:
    w, _ = adapter.fc_params()
    if w is not None:
        return int(w.shape[0])
    n = getattr(adapter.model, "num_classes", None)
    return int(n) if isinstance(n, int) else None


def randomized_copy(adapter, seed: int = 0):
    """A copy of the adapter's model with every parameter re-initialised (``reset_parameters`` of each module,
    under ``torch.manual_seed(seed)``), wrapped the same way: the --sanity-random-model baseline."""
    import torch
    from torch import nn

    from .runner import HookAdapter, ModuleAdapter, TimmAdapter

    def reset(model: nn.Module) -> nn.Module:
        torch.manual_seed(seed)
        for m in model.modules():
            if hasattr(m, "reset_parameters") and callable(m.reset_parameters):
                m.reset_parameters()
        return model.eval()

    kw = dict(name=f"{adapter.name} (random init)", input_std=adapter.input_std, transform=adapter.transform)
    if isinstance(adapter, TimmAdapter):
        return TimmAdapter(reset(copy.deepcopy(adapter.model)), **kw)
    if isinstance(adapter, HookAdapter):
        model = copy.deepcopy(adapter.model)
        for m in model.modules():  # drop the original adapter's capture hooks from the copy
            m._forward_pre_hooks.clear()
        names = {id(m): n for n, m in adapter.model.named_modules()}
        return HookAdapter(reset(model), fc=names[id(adapter._fc)], pool=names[id(adapter._pool)], **kw)
    if isinstance(adapter, ModuleAdapter):
        head = reset(copy.deepcopy(adapter.model))
        return ModuleAdapter(head.backbone, head.fc, head.pool, **kw)
    raise IsoodError(f"--sanity-random-model: cannot re-initialise a {type(adapter).__name__}: pass a timm, "
                     "torchvision-style or backbone+fc model")


# ================================================================================================ the job
@dataclass
class _Set:
    """One dataset to score: images (or precomputed rows) + labels + the rows of its grid table."""

    name: str
    files: list[Path] | None
    labels: np.ndarray
    data_id: str
    images: pd.DataFrame | None = None  # grid datasets: the manifest's images rows (aligned with files)
    cells: pd.DataFrame | None = None
    outputs: Any = None
    paths: list[str] | None = None  # shown in the scores table (relative to the source root)


def _grid_rows(m) -> tuple[pd.DataFrame, pd.DataFrame]:
    images = m.frame("images")
    cells = m.frame("cells")
    need = {"path", "cov_level", "sem_level"}
    if not need <= set(images.columns):
        raise IsoodError(f"{m.root}: images table lacks {', '.join(sorted(need - set(images.columns)))}")
    if "source" in images.columns and images["source"].fillna("").astype(str).nunique() > 1:
        raise IsoodError(f"{m.root} mixes several sources ({', '.join(images['source'].astype(str).unique())}): "
                         "evaluate one source at a time")
    lv = images[["cov_level", "sem_level"]]
    keep = lv.notna().all(axis=1) & (lv["cov_level"].fillna(-1) >= 0) & (lv["sem_level"].fillna(-1) >= 0)
    images = images[keep].reset_index(drop=True)
    if images.empty:
        raise IsoodError(f"{m.root}: no image has a grid cell: nothing to evaluate")
    return images, cells


def _wnids(df: pd.DataFrame) -> list[str]:
    if "wnid" in df.columns:
        return df["wnid"].fillna("").astype(str).tolist()
    from isood.features import wnid_of

    return [wnid_of(p) for p in df["path"].astype(str)]


def _outputs_labels(index: pd.DataFrame, classes: Sequence[str] | None, *, strict: bool, what: str) -> np.ndarray:
    if "label" in index.columns and ("wnid" not in index.columns or classes is None):
        return index["label"].fillna(-1).astype(np.int64).to_numpy()
    if classes is None:
        raise IsoodError(f"{what}: index.parquet needs a 'label' column (or wnids plus --classes)")
    return _labels(_wnids(index), classes, strict=strict, what=what)


def run_evaluate(opts: EvaluateOptions, *, adapter=None, console=None, argv: list[str] | None = None) -> EvaluateResult:
    """Run `isood evaluate` (module docstring). ``adapter``: a ``ModelAdapter`` / torch module to use instead of
    ``opts.model`` (Python API: your own classifier)."""
    t0 = time.perf_counter()
    notes: list[str] = []
    for flag, value in (("--splits", opts.splits), ("--out", opts.out), ("--id-test", opts.id_test),
                        ("--id-train", opts.id_train)):
        if value is None:
            raise IsoodError(f"{flag} is required")
    out = Path(opts.out)
    detectors = parse_detectors(opts.detectors)
    if opts.na_threshold < 1:
        raise IsoodError(f"--na-threshold must be >= 1, got {opts.na_threshold}")

    grids = {"splits": load_grid_manifest(opts.splits, "splits", "--splits")}
    if opts.syn:
        grids["syn-is"] = load_grid_manifest(opts.syn, "syn-is", "--syn")
    for g in grids.values():
        if out.resolve() == Path(g.root).resolve():
            raise IsoodError(f"--out {out} is the input manifest {g.root}: pass another folder")

    test_root = opts.test_root or grids["splits"].meta.get("command", {}).get("config", {}).get("test_root")
    precomputed = [is_outputs_dir(p) for p in (opts.id_train, opts.id_test, test_root)]
    if any(precomputed) and not all(precomputed):
        raise IsoodError("--id-train, --id-test and --test-root must all be image folders or all precomputed "
                         "outputs folders (index.parquet + logits.npy)")
    use_outputs = all(precomputed)
    if use_outputs and (opts.sanity_random_model or opts.syn):
        raise IsoodError("--sanity-random-model and --syn need a model and images: pass image folders and --model")

    sets: dict[str, _Set] = {}
    if use_outputs:
        tr_out, tr_idx = load_outputs(opts.id_train)
        n_model = tr_out.logits.shape[1]
        classes = (class_list(_wnids(tr_idx), n_model, opts.classes, "precomputed outputs")
                   if "wnid" in tr_idx.columns or opts.classes else None)
        tr_out.labels = _outputs_labels(tr_idx, classes, strict=True, what="--id-train")
        te_out, te_idx = load_outputs(opts.id_test)
        if te_out.logits.shape[1] != n_model:
            raise IsoodError(f"class-count mismatch: --id-test logits have {te_out.logits.shape[1]} classes, "
                             f"--id-train {n_model}")
        te_out.labels = _outputs_labels(te_idx, classes, strict=True, what="--id-test")
        sets[ID_TEST] = _Set(ID_TEST, None, te_out.labels, "", outputs=te_out,
                             paths=te_idx["path"].astype(str).tolist())
        t_out, t_idx = load_outputs(test_root)
        images, cells = _grid_rows(grids["splits"])
        pos = pd.Series(np.arange(len(t_idx)), index=t_idx["path"].astype(str))
        pos = pos[~pos.index.duplicated()]
        rows = pos.reindex(images["path"].astype(str))
        if rows.isna().any():
            miss = rows.index[rows.isna()]
            raise IsoodError(f"--test-root {test_root}: {len(miss)} manifest images have no precomputed outputs "
                             f"(first: {miss[0]}): compute outputs for every image of the manifest")
        sub = t_out.subset(rows.to_numpy(dtype=np.int64))
        sub.labels = (_labels(_wnids(images), classes, strict=False, what="test") if classes is not None
                      else np.full(len(images), -1, np.int64))
        sets["splits"] = _Set("splits", None, sub.labels, "", images, cells, sub)
        scores = _score_outputs(detectors, tr_out, {ID_TEST: te_out, "splits": sub}, score_train=opts.der)
        model_name = opts.model or "precomputed outputs"
        adapter_used = None
    else:
        from isood.features import list_images

        src_train = list_images(opts.id_train)
        src_test = list_images(opts.id_test)
        n_id_classes = len(set(src_train.table["wnid"]) - {""})
        if adapter is None:
            adapter_used = _load_adapter(opts, n_id_classes)
        else:
            from .runner import wrap_model

            adapter_used = wrap_model(adapter)
        model_name = adapter_used.name
        for name, d in detectors.items():  # fail before any forward pass
            lack = set(d.requires) - {"input"} - set(adapter_used.provides)
            if lack:
                raise IsoodError(f"detector '{name}' needs {', '.join(sorted(lack))}, which model '{model_name}' "
                                 f"does not expose (it provides {', '.join(sorted(adapter_used.provides))}): "
                                 "drop the detector or use a model that has them")
        n_model = _model_classes(adapter_used)
        classes = class_list(src_train.table["wnid"].tolist(), n_model, opts.classes, model_name)
        if n_model is None:
            n_model = len(classes)
        transform = adapter_used.transform or _default_transform()
        y_train = _labels(src_train.table["wnid"].tolist(), classes, strict=True, what="--id-train")
        y_test = _labels(src_test.table["wnid"].tolist(), classes, strict=True, what="--id-test")
        sets[ID_TRAIN] = _Set(ID_TRAIN, src_train.files, y_train, f"images:{src_train.listing_sha256}")
        sets[ID_TEST] = _Set(ID_TEST, src_test.files, y_test, f"images:{src_test.listing_sha256}",
                             paths=src_test.table["path"].tolist())
        for ds, m in grids.items():
            images, cells = _grid_rows(m)
            if ds == "splits":
                if test_root is None:
                    raise IsoodError(f"--splits {m.root} records no test_root: pass --test-root (the folder its "
                                     "image paths are relative to)")
                root = Path(test_root)
            else:
                root = Path(m.root)
            files = [root / p for p in images["path"].astype(str)]
            _check_files(files, f"{'--splits' if ds == 'splits' else '--syn'} {m.root}")
            labels = _labels(_wnids(images), classes, strict=False, what=ds)
            sets[ds] = _Set(ds, files, labels, f"manifest:{m.meta.get('content_sha256')}:{_files_id(files)}",
                            images, cells)
        scores = _score_with_model(adapter_used, detectors, sets, opts, transform)

    evaluation = _evaluate(scores, sets, detectors, opts)
    sanity = random_per_cell = None
    if opts.sanity_random_model:
        rand = randomized_copy(adapter_used, opts.seed)
        r_scores = _score_with_model(rand, parse_detectors(opts.detectors), sets, opts, transform)
        random_per_cell = _evaluate(r_scores, sets, detectors, opts).per_cell
        sanity = sanity_table(evaluation.per_cell, random_per_cell)

    config = {k: v for k, v in asdict(opts).items() if k != "progress"}
    config.update(test_root=str(test_root) if test_root else None, model_name=model_name,
                  n_classes=int(n_model) if n_model else None,
                  detector_params={n: d.params() for n, d in detectors.items()})
    import manifests

    inputs = [manifests.input_record(f"{ds}_manifest", g.root, sha256=g.meta.get("content_sha256"))
              for ds, g in grids.items()]
    for name, src in ((ID_TRAIN, opts.id_train), (ID_TEST, opts.id_test)):
        known = sets[name].data_id.split(":", 1)[-1] if name in sets and sets[name].data_id else None
        inputs.append(manifests.input_record(name, src, sha256=known))
    if opts.checkpoint:
        inputs.append(manifests.input_record("checkpoint", opts.checkpoint))
    meta = {"model": model_name, "detectors": ", ".join(detectors), "splits": opts.splits,
            **({"syn-is": opts.syn} if opts.syn else {}), "ID classes": len(classes) if classes is not None else n_model,
            "N/A threshold": opts.na_threshold}
    for ds in [ID_TEST] + list(grids):
        if ds in scores.labels and scores.labels[ds] is not None:
            acc = float(np.mean(scores.correct(ds)))
            meta[f"accuracy on {ds}"] = round(acc, 4)
    plot_metrics = [m.strip() for m in opts.plot_metrics.split(",") if m.strip()] if opts.plot_metrics else None
    manifest = write_evaluation(
        evaluation, out, config=config, inputs=inputs, scores=_scores_table(scores, sets),
        sanity=sanity, random_per_cell=random_per_cell, metrics=plot_metrics, meta=meta,
        title=f"isood evaluation: {model_name}", argv=argv,
        summary={"model": model_name, "detectors": list(detectors), "datasets": evaluation.datasets,
                 "seconds": round(time.perf_counter() - t0, 2), **{k: v for k, v in meta.items()
                                                                   if k.startswith("accuracy")}})
    return EvaluateResult(manifest, evaluation, sanity, time.perf_counter() - t0, notes)


def _score_with_model(adapter, detectors, sets: Mapping[str, _Set], opts: EvaluateOptions, transform):
    import torch

    from .runner import run_detectors

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    data = {name: ImageList(s.files, s.labels, transform) for name, s in sets.items()}
    from isood.features import default_cache_dir

    cache_dir = opts.cache_dir if opts.cache_dir is not None else str(default_cache_dir() / "outputs")
    eval_sets = {k: v for k, v in data.items() if k != ID_TRAIN}
    return run_detectors(
        adapter, detectors, eval_sets, id_train=data[ID_TRAIN], score_train=opts.der,
        batch_size=opts.batch_size, device=device, num_workers=opts.workers, progress=opts.progress,
        cache_dir=cache_dir, data_ids={k: s.data_id for k, s in sets.items()},
        preprocess_id=repr(transform))


def _evaluate(scores, sets: Mapping[str, _Set], detectors, opts: EvaluateOptions) -> CellEvaluation:
    parts = []
    id_correct = scores.correct(ID_TEST) if scores.labels.get(ID_TEST) is not None else None
    train_correct = (scores.correct(ID_TRAIN) if opts.der and scores.labels.get(ID_TRAIN) is not None else None)
    for ds, s in sets.items():
        if s.images is None:
            continue
        ood_correct = scores.predictions[ds] == s.labels if id_correct is not None else None
        for det in detectors:
            train = scores.scores[det].get(ID_TRAIN) if train_correct is not None else None
            try:
                parts.append(evaluate_cells(
                    scores.scores[det][ID_TEST], scores.scores[det][ds], s.images, detector=det, dataset=ds,
                    id_correct=id_correct, ood_correct=ood_correct, train_scores=train,
                    train_correct=train_correct if train is not None else None, na=s.cells,
                    na_threshold=opts.na_threshold))
            except ValueError as e:  # e.g. non-finite scores of a detector, a cells table of another manifest
                msg = str(e) if f"'{det}'" in str(e) else f"detector '{det}' on {ds}: {e}"
                raise IsoodError(msg) from None
    return CellEvaluation(pd.concat(parts, ignore_index=True))


def _scores_table(scores, sets: Mapping[str, _Set]) -> pd.DataFrame:
    """One row per scored image of the ID test set and the grid datasets, one column per detector."""
    frames = []
    for ds, s in sets.items():
        if ds == ID_TRAIN:
            continue
        if s.images is not None:
            base = pd.DataFrame({"dataset": ds, "path": s.images["path"].astype(str).to_numpy(),
                                 "cell": [f"cov_{int(c)}_sem_{int(v)}" for c, v in
                                          zip(s.images["cov_level"], s.images["sem_level"])]})
        else:
            base = pd.DataFrame({"dataset": ds, "path": s.paths, "cell": ""})
        labels = scores.labels.get(ds)
        base["label"] = labels if labels is not None else -1
        base["prediction"] = scores.predictions[ds]
        base["correct"] = base["label"].to_numpy() == base["prediction"].to_numpy()
        for det, per_ds in scores.scores.items():
            base[det] = per_ds[ds]
        frames.append(base)
    return pd.concat(frames, ignore_index=True)


def sanity_table(trained: pd.DataFrame, random: pd.DataFrame) -> pd.DataFrame:
    """Per detector and dataset: mean AUROC and AUROC_M over measured cells, trained vs random-init model."""
    rows = []
    for (det, ds), g in trained.groupby(["detector", "dataset"], sort=False):
        r = random[(random["detector"] == det) & (random["dataset"] == ds)]
        g, r = g[~g["na"]], r[~r["na"]]
        rows.append({
            "detector": det, "dataset": ds,
            "auroc": float(g["auroc"].mean()), "auroc_random": float(r["auroc"].mean()),
            "auroc_m": float(g["auroc_m"].mean()) if "auroc_m" in g else np.nan,
            "auroc_m_random": float(r["auroc_m"].mean()) if "auroc_m" in r else np.nan,
        })
    return pd.DataFrame(rows)


# ================================================================================================ writing
def write_evaluation(
    result: CellEvaluation,
    out: str | os.PathLike,
    *,
    config: Mapping[str, Any] | None = None,
    inputs: Sequence[dict] = (),
    scores: pd.DataFrame | None = None,
    sanity: pd.DataFrame | None = None,
    random_per_cell: pd.DataFrame | None = None,
    metrics: Sequence[str] | None = None,
    heatmap_metrics: Sequence[str] | None = None,
    meta: Mapping[str, Any] | None = None,
    title: str = "isood evaluation",
    summary: Mapping[str, Any] | None = None,
    argv: list[str] | None = None,
):
    """Write a ``CellEvaluation`` (plus optional per-image ``scores`` and the sanity tables) as an ``evaluation``
    manifest in ``out``: Parquet tables, ``results/*.csv``, ``plots/*.png``, ``report.html``, ``summary.md`` and a
    dataset card; ``manifest.json`` last. Returns the ``manifests.Manifest``."""
    import manifests

    from .plots import render_plots
    from .report import render_html, render_markdown, table1_frame

    for chosen in (metrics, heatmap_metrics):
        unknown = set(chosen or ()) - set(result.metrics)
        if unknown:
            raise IsoodError(f"--plot-metrics {', '.join(sorted(unknown))} were not computed: pass among "
                             f"{', '.join(result.metrics)}")
    images = render_plots(result, metrics=metrics, heatmap_metrics=heatmap_metrics)
    tables: dict[str, pd.DataFrame] = {
        "cell_metrics": result.per_cell, "level_curves": result.levels, "table1": result.summary,
        "detector_means": result.means,
    }
    if scores is not None:
        tables["scores"] = scores
    if sanity is not None:
        tables["sanity"] = sanity
    if random_per_cell is not None:
        tables["cell_metrics_random"] = random_per_cell
    files: dict[str, bytes | str] = dict(images)
    for name, t in tables.items():
        if name != "scores":
            files[f"results/{name}.csv"] = t.to_csv(index=False, float_format="%.6g")
    files["results/table1_wide.csv"] = table1_frame(result).to_csv(index=False, float_format="%.6g")
    files["report.html"] = render_html(result, images, title=title, meta=meta, sanity=sanity)
    files["summary.md"] = render_markdown(result, title=title, meta=meta, sanity=sanity)
    n_na = int(result.per_cell["na"].sum())
    summ = {"cells": int(len(result.per_cell)), "cells_na": n_na, "plots": len(images), **(summary or {})}
    return manifests.write_with_card(
        out, kind=KIND, tables=tables, config=dict(config or {}), inputs=list(inputs), files=files,
        summary=summ, note=f"{len(result.detectors)} detectors on {', '.join(result.datasets)}", argv=argv,
        title=title)


def summary_console_table(result: EvaluateResult):
    """A rich table for the terminal: per detector and dataset the mean AUROC / FPR@95 (and AUROC_M) over
    measured cells and the AUROC correlation with each axis' level (Table 1)."""
    from rich.table import Table

    ev = result.evaluation
    t = Table(title="isood evaluate: mean over measured cells; Table 1 correlation of AUROC with the level")
    cols = ["detector", "dataset", "AUROC", "FPR@95", "corr sem", "corr cov"]
    with_m = "auroc_m" in ev.means.columns
    if with_m:
        cols.insert(4, "AUROC_M")
    if result.sanity is not None:
        cols += ["AUROC random", "AUROC_M random"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("detector", "dataset") else "right")
    s = ev.summary[ev.summary["metric"] == "auroc"].set_index(["detector", "dataset", "axis"])["correlation"]
    san = result.sanity.set_index(["detector", "dataset"]) if result.sanity is not None else None
    for rec in ev.means.itertuples(index=False):
        row = [rec.detector, rec.dataset, f"{rec.auroc:.3f}", f"{rec.fpr95:.3f}"]
        if with_m:
            row.append(f"{rec.auroc_m:.3f}")
        row += [f"{s.get((rec.detector, rec.dataset, ax), float('nan')):+.2f}" for ax in ("sem", "cov")]
        if san is not None:
            r = san.loc[(rec.detector, rec.dataset)]
            row += [f"{r['auroc_random']:.3f}", f"{r['auroc_m_random']:.3f}"]
        t.add_row(*row)
    return t
