"""The load steps of `isood build-splits`: check the destination, read the inputs (LAID, class filter, labels),
load precomputed feature sets or extract image sources, load the CLIP, train LAID when none was given."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import pandas as pd

import manifests
from isood.features.clip import ClipEncoder, load_clip, parse_clip_spec
from isood.core.errors import BadInputError
from isood.features.featurestore import extract_features, is_feature_dir
from isood.features.featurestore.loading import FeatureReader, open_features
from isood.features.listing import ImageSource, list_images
from isood.kinds import CLASS_FILTER, FEATURES, ClassFilterView, FeaturesView
from isood.features.labels import Labels, load_labels
from isood.science.laid import LAID
from isood.features.laid_training import train_laid_from_labels
from isood.core.engine import BatchEngine
from isood.core.files import TMP_PREFIX
from isood.stages.splits.options import SplitsOptions

__all__ = ["FeatureSet", "Inputs", "check_sources", "input_paths", "load_inputs", "load_precomputed",
           "check_feature_sets", "load_encoder", "extract_set", "extracted_files", "train_laid"]

Warn = Callable[[str], None]


@dataclass(eq=False)
class FeatureSet:
    """Features of one side (``name`` 'id' or 'test'), opened for reading (``reader``: the index in memory, the
    rows read on demand from the memory-mapped files), where they came from, the CLIP identity recorded with
    them, the folder the index paths are relative to, the folder they were extracted into in this run, the
    images the extraction rejected, and the manifest input record."""

    name: str
    reader: FeatureReader
    source: str
    identity: str | None
    root: str | None
    extracted_dir: str | None = None
    rejected: pd.DataFrame | None = None
    input: dict = field(default_factory=dict)

    @property
    def index(self) -> pd.DataFrame:
        return self.reader.index

    @property
    def dim(self) -> int:
        return int(self.reader.dim)

    def __len__(self) -> int:
        return len(self.reader)


@dataclass(frozen=True, eq=False)
class Inputs:
    """The small inputs, read before any feature: which sides are precomputed, whether a CLIP is needed, its
    identity, the LAID given, the class filter's kept wnids, the LAID labels, extra input records."""

    precomputed: Mapping[str, bool]
    need_clip: bool
    clip_identity: str | None
    laid: LAID | None
    kept_wnids: list[str] | None
    labels: Labels | None
    records: list[dict]


def check_sources(cfg: SplitsOptions) -> None:
    """Both sources exist, and ``--laid`` / ``--class-filter`` when given (``--out`` is checked by the writer,
    ``manifests.writing``)."""
    for name in ("id", "test"):
        if not Path(getattr(cfg, name)).exists():
            raise BadInputError(f"--{name} {getattr(cfg, name)} does not exist; pass an image folder, a file list or "
                                "a feature set")
    if cfg.laid and not Path(cfg.laid).is_file():
        raise BadInputError(f"--laid {cfg.laid}: file not found; pass a trained LAID W (.safetensors), or leave "
                            "--laid out to train it here (with --clip)")
    if cfg.class_filter and not Path(cfg.class_filter).is_dir():
        raise BadInputError(f"--class-filter {cfg.class_filter}: not a folder; pass a class-filter manifest "
                            "(isood wordnet filter --out DIR)")


def input_paths(cfg: SplitsOptions) -> list[str]:
    """The files and folders build-splits reads, which ``--out`` may not be (or be inside, or hold)."""
    return [str(p) for p in (cfg.id, cfg.test, cfg.laid, cfg.class_filter, cfg.labels) if p and Path(str(p)).exists()]


def load_inputs(cfg: SplitsOptions) -> Inputs:
    """Read --laid, --class-filter (verified) and (without --laid) --labels; decide whether a CLIP is needed."""
    precomputed = {name: is_feature_dir(getattr(cfg, name)) for name in ("id", "test")}
    need_clip = not (all(precomputed.values()) and cfg.laid)
    if need_clip and not cfg.clip:
        raise BadInputError("--clip is required to extract images or train LAID (e.g. --clip ViT-B-32:openai or "
                            "local-dir:PATH)")
    clip_identity = parse_clip_spec(cfg.clip).identity if cfg.clip else None
    laid = LAID.load(cfg.laid) if cfg.laid else None
    records, kept = [], None
    if cfg.laid:
        records.append(manifests.input_record("laid", cfg.laid))
    if cfg.class_filter:
        view = manifests.read(cfg.class_filter, kind=CLASS_FILTER, verify=cfg.verify)
        assert isinstance(view, ClassFilterView)  # read(kind=...) returns the kind's registered view
        kept = view.kept()[0]
        records.append(manifests.input_record("class_filter", cfg.class_filter, sha256=view.content_sha256))
    labels = None
    if laid is None:
        labels = load_labels(cfg.labels)
        if len(labels.texts) < 2:
            raise BadInputError(f"--labels {cfg.labels}: fewer than 2 labels with names; pass another label list")
    return Inputs(precomputed, need_clip, clip_identity, laid, kept, labels, records)


def load_precomputed(name: str, path: str, *, verify: str | None = None) -> FeatureSet:
    """A precomputed feature set, opened (nothing read but its index): an `isood extract` manifest (its files
    verified by ``verify``; with its CLIP identity, image root and rejected images) or a folder with
    features.npy + index.parquet."""
    reader = open_features(path, verify=verify)
    p = Path(path)
    identity = root = rejected = None
    if p.is_dir() and (p / manifests.MANIFEST_FILE).is_file():
        view = manifests.read(p, kind=FEATURES)
        assert isinstance(view, FeaturesView)  # read(kind=...) returns the kind's registered view
        identity, root, rejected = view.clip_identity, view.image_root, view.rejected
        record = manifests.input_record("features", p, sha256=view.content_sha256)
    else:
        record = manifests.input_record("features", p)
    record["name"] = f"{name}_features"
    return FeatureSet(name, reader, str(path), identity, root, rejected=rejected, input=record)


def check_feature_sets(sets: Mapping[str, FeatureSet], *, clip: str | None = None, clip_identity: str | None = None,
                       clip_dim: int | None = None, laid_dim: int | None = None) -> None:
    """One-line errors for feature sets that cannot be measured together: another CLIP than ``--clip``, two
    CLIPs, two dimensions, a dimension other than LAID's or the CLIP's, an empty ID set."""
    for s in sets.values():
        if clip_identity and s.identity and s.identity != clip_identity:
            raise BadInputError(f"{s.source} was extracted with another CLIP ({s.identity}) than --clip {clip} "
                                f"({clip_identity}); pass the same --clip")
    if len(sets) == 2:
        a, b = sets["id"], sets["test"]
        if a.identity and b.identity and a.identity != b.identity:
            raise BadInputError(f"--id and --test features come from different CLIP models ({a.identity} vs "
                                f"{b.identity})")
        if a.dim != b.dim:
            raise BadInputError(f"feature dimension mismatch: --id has {a.dim}, --test has {b.dim}; pass features "
                                "from the same CLIP")
    for s in sets.values():
        if laid_dim is not None and s.dim != laid_dim:
            raise BadInputError(f"feature dimension mismatch: --{s.name} features have {s.dim}, --laid W is "
                                f"{laid_dim}x{laid_dim}; pass the LAID fitted for this CLIP")
    if "id" in sets and len(sets["id"]) == 0:
        raise BadInputError(f"--id {sets['id'].source}: the ID feature set is empty; pass at least one ID image")
    for s in sets.values():
        if clip_dim is not None and s.dim != clip_dim:
            raise BadInputError(f"feature dimension mismatch: features have {s.dim}, --clip {clip} gives {clip_dim}")


def load_encoder(cfg: SplitsOptions, inputs: Inputs) -> ClipEncoder | None:
    """The CLIP, when images are to be extracted or LAID trained (its dimension checked against --laid)."""
    if not inputs.need_clip:
        return None
    assert cfg.clip, "load_inputs refuses a build that needs a CLIP without --clip"
    encoder = load_clip(cfg.clip, cfg.device)
    if inputs.laid is not None and inputs.laid.dim != encoder.embed_dim:
        d = inputs.laid.dim
        raise BadInputError(f"feature dimension mismatch: --clip {cfg.clip} gives {encoder.embed_dim}, --laid W is "
                            f"{d}x{d}")
    return encoder


def extract_set(name: str, source: str, encoder: ClipEncoder, sub: Path, cfg: SplitsOptions, *, note: Warn,
                argv: list[str] | None, engine: BatchEngine | None, images: ImageSource | None = None) -> FeatureSet:
    """Extract an image source into ``sub`` (resumable; ``isood.features.featurestore``) and open it for reading;
    ``images``: the source already listed (``list_images``), else listed here."""
    images = images if images is not None else list_images(source)
    result = extract_features(images, encoder, sub, batch_size=cfg.batch_size, decode_processes=cfg.decode_processes,
                              shard_size=cfg.shard_size, progress=cfg.progress, argv=argv, engine=engine,
                              card=False)  # nested: the splits manifest hashes its files, and a card is not content
    reader = open_features(sub)
    if result.n_rejected:
        note(f"--{name}: {result.n_rejected} unreadable image(s) skipped (see data/dropped.parquet)")
    view = manifests.read(sub, kind=FEATURES)
    assert isinstance(view, FeaturesView)  # read(kind=...) returns the kind's registered view
    record = manifests.input_record(f"{name}_images", source, sha256=images.listing_sha256)
    return FeatureSet(name, reader, str(source), encoder.identity, str(images.root), str(sub),
                      rejected=view.rejected, input=record)


def extracted_files(out: Path, sets: Iterable[FeatureSet]) -> list[str]:
    """The files of the feature sets extracted into ``out`` in this run, relative to ``out`` (to register)."""
    files = []
    for s in sets:
        if s.extracted_dir:
            files += [q.relative_to(out).as_posix() for q in sorted(Path(s.extracted_dir).rglob("*"))
                      if q.is_file() and q.name != manifests.MANIFEST_FILE and not q.name.startswith(TMP_PREFIX)]
    return files


def train_laid(cfg: SplitsOptions, inputs: Inputs, encoder: ClipEncoder | None, *,
               dim: int) -> tuple[LAID, float | None]:
    """The given LAID, or one trained on ``inputs.labels`` with ``encoder``; its dimension must be ``dim``."""
    laid, fit_seconds = inputs.laid, None
    if laid is None:
        # without --laid, load_inputs loaded the labels and asked for a CLIP (load_encoder)
        assert encoder is not None and inputs.labels is not None
        laid, fit_seconds = train_laid_from_labels(
            encoder, inputs.labels.texts, labels_from=inputs.labels.description, triplets=cfg.triplets,
            seed=cfg.seed, steps=cfg.laid_steps, cache_dir=cfg.cache_dir, progress=cfg.progress)
    if dim != laid.dim:
        raise BadInputError(f"feature dimension mismatch: features have {dim}, --laid W is {laid.dim}x{laid.dim}; "
                            "pass the LAID fitted for this CLIP")
    return laid, fit_seconds
