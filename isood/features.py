"""CLIP image and text features (open_clip), sharded resumable extraction, and loading of feature sets.

IS-OOD measures shift in CLIP space: image features x of test and ID images and text features of label x
template prompts (the LAID training texts) all come from one CLIP model, L2-normalised (cosine geometry).

Encoders are named like open_clip names them:

* ``MODEL:PRETRAINED`` -- a built-in architecture and a pretrained tag or checkpoint file
  (``ViT-B-32:openai``, ``ViT-L-14:laion2b_s32b_b82k``, ``ViT-B-32:/path/to/weights.pt``);
* ``local-dir:PATH`` -- a folder with ``open_clip_config.json`` and the weights (open_clip's own schema);
* ``hf-hub:ORG/REPO`` -- an open_clip model on the Hugging Face Hub.

An extraction directory (``isood extract``) is a manifest of kind ``features``::

    features-00000.npy             float32 (n_ok, D) L2-normalised image features of shard 0
    features-00000.rows.parquet    the shard's files: path, wnid, row (-1 when rejected), error
    ...
    data/index.parquet             path (relative to the source root), wnid, shard, row
    data/rejected.parquet          path, wnid, error (unreadable or corrupt images)
    manifest.json                  written last

Shard k holds files ``[k * shard_size, (k + 1) * shard_size)`` of the sorted file list; a shard's ``.npy`` is
renamed into place after its ``.rows.parquet`` (which carries a key of the model identity and the member files),
so a shard exists only when complete, and a rerun skips complete shards and redoes an interrupted one.

Scale-out: ``engine="ray"`` (``--engine ray``) computes the same shards on Ray Data actors
(:mod:`isood.distributed`); ``num_shards``/``shard_index`` make one task of a job array write a
``features-part`` directory (its shards only), and ``isood merge`` combines the parts (:mod:`isood.shards`).
Both write these files through the same code, so the shards, index and manifest match a single local run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from isood.errors import IsoodError, MissingWeightsError

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})
WNID_RE = re.compile(r"^n\d{8}$")
_WNID_PREFIX_RE = re.compile(r"^(n\d{8})_")
SHARD_NAME = "features-{:05d}.npy"
SHARD_ROWS_NAME = "features-{:05d}.rows.parquet"
_SHARD_RE = re.compile(r"^features-(\d{5})(\.npy|\.rows\.parquet)$")
DEFAULT_BATCH_SIZE = 64
DEFAULT_SHARD_SIZE = 10_000
_LOCAL_HINT = "pass --clip local-dir:PATH (a folder with open_clip_config.json and the weights)"


# ----------------------------------------------------------------------------------------------- encoders


@dataclass
class ClipEncoder:
    """A loaded open_clip model: ``model`` (eval mode, on ``device``), ``preprocess`` (PIL -> tensor),
    ``tokenizer`` (strings -> token ids), ``identity`` (stable string naming the weights; keys caches and shards),
    ``spec`` (what the user passed) and ``embed_dim``."""

    model: object
    preprocess: Callable
    tokenizer: Callable
    identity: str
    spec: str
    device: object
    embed_dim: int


def _one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def _quiet_libraries():
    """open_clip and huggingface_hub log errors/retries on the root logger before raising; the user sees our line."""
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _local_dir_identity(folder: Path) -> str:
    """local-dir identity: hash of the config and of every checkpoint file (content, not location)."""
    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        if p.name == "open_clip_config.json" or p.suffix in (".safetensors", ".bin", ".pth", ".pt"):
            h.update(p.name.encode() + b"\0" + _sha256_file(p).encode() + b"\n")
    return f"local-dir:sha256={h.hexdigest()[:32]}"


def _resolve_device(device: str | None):
    import torch

    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise IsoodError(f"unknown device {device!r}; pass cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise IsoodError(f"device {device!r} requested but CUDA is not available; pass --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise IsoodError(f"device {device!r}: only {torch.cuda.device_count()} GPU(s); pass --device cuda:0 or --device cpu")
    return dev


def parse_clip_spec(spec: str) -> tuple[str, str | None, str]:
    """Validate a ``--clip`` name without loading weights: ``(open_clip model name, pretrained, identity)``.

    ``identity`` names the weights stably (tag, or content hash of local files); it keys caches and shards.
    Raises ``IsoodError`` (unknown model, unknown tag, bad folder) or ``MissingWeightsError`` (folder without
    weights) with one line.
    """
    import open_clip

    spec = str(spec).strip()
    if spec.startswith("local-dir:"):
        folder = Path(spec[len("local-dir:"):]).expanduser()
        if not folder.is_dir():
            raise IsoodError(f"--clip {spec}: folder {folder} does not exist; {_LOCAL_HINT}")
        if not (folder / "open_clip_config.json").is_file():
            raise IsoodError(f"--clip {spec}: {folder} has no open_clip_config.json; {_LOCAL_HINT}")
        if not any(p.suffix in (".safetensors", ".bin", ".pth", ".pt") for p in folder.iterdir()):
            raise MissingWeightsError(f"--clip {spec}: {folder} holds no weights (*.safetensors, *.bin, *.pth)")
        return f"local-dir:{folder}", None, _local_dir_identity(folder)
    if spec.startswith("hf-hub:"):
        if not spec[len("hf-hub:"):]:
            raise IsoodError("--clip hf-hub: needs a repository, e.g. hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K")
        return spec, None, f"open_clip:{spec}"
    name, sep, pretrained = spec.partition(":")
    name = name.replace("/", "-")
    if name not in open_clip.list_models():
        raise IsoodError(
            f"unknown CLIP model {name!r}; list valid MODEL:PRETRAINED names with "
            "`python -c \"import open_clip; print(open_clip.list_pretrained())\"`, or pass --clip local-dir:PATH"
        )
    tags = open_clip.list_pretrained_tags_by_model(name)
    if not sep or not pretrained:
        raise IsoodError(
            f"--clip {spec!r} names no weights; pass MODEL:PRETRAINED, e.g. {name}:{tags[0] if tags else 'TAG'}"
        )
    if pretrained in tags:
        return name, pretrained, f"open_clip:{name}:{pretrained}"
    if Path(pretrained).expanduser().is_file():
        pretrained = str(Path(pretrained).expanduser())
        return name, pretrained, f"open_clip:{name}:sha256={_sha256_file(Path(pretrained))[:32]}"
    shown = ", ".join(tags[:8]) + (", ..." if len(tags) > 8 else "")
    raise IsoodError(
        f"unknown pretrained tag {pretrained!r} for {name} (known: {shown or 'none'}); "
        "pass a tag, a checkpoint file, or --clip local-dir:PATH"
    )


def load_clip(spec: str, device: str | None = None) -> ClipEncoder:
    """Load an open_clip encoder named ``MODEL:PRETRAINED``, ``local-dir:PATH`` or ``hf-hub:ORG/REPO``.

    Raises ``MissingWeightsError`` (one line, suggesting ``--clip local-dir:PATH``) when the weights cannot be had
    (offline, not cached, folder without a checkpoint) and ``IsoodError`` for an unknown model or tag.
    """
    import open_clip
    import torch

    spec = str(spec).strip()
    dev = _resolve_device(device)
    model_name, pretrained, identity = parse_clip_spec(spec)
    # Weights trained with QuickGELU (e.g. ViT-B-32:openai) need it in the architecture too, or every feature is
    # slightly off; open_clip only warns. Use the tag's setting, as ViT-B-32-quickgelu:openai would.
    tag_cfg = open_clip.get_pretrained_cfg(model_name, pretrained) if pretrained and not Path(pretrained).is_file() else {}
    model_cfg = open_clip.get_model_config(model_name) if not model_name.startswith(("local-dir:", "hf-hub:")) else {}
    quick_gelu = bool(tag_cfg.get("quick_gelu")) and not (model_cfg or {}).get("quick_gelu", False)
    try:
        with _quiet_libraries():
            model, _, preprocess = open_clip.create_model_and_transforms(
                model_name, pretrained=pretrained, device=dev, require_pretrained=True, force_quick_gelu=quick_gelu
            )
            tokenizer = open_clip.get_tokenizer(model_name)
    except (IsoodError, KeyboardInterrupt):
        raise
    except Exception as e:
        if spec.startswith("local-dir:"):
            raise IsoodError(f"--clip {spec}: could not load the model ({_one_line(e, 160)})") from None
        raise MissingWeightsError(
            f"CLIP weights for {spec} could not be loaded (offline or not in the cache); "
            f"download them where there is internet, or {_LOCAL_HINT}"
        ) from None
    model.eval()
    with torch.inference_mode():
        embed_dim = int(model.encode_text(tokenizer(["a photo."]).to(dev)).shape[-1])
    return ClipEncoder(model, preprocess, tokenizer, identity, spec, dev, embed_dim)


def _autocast(device):
    """AMP on CUDA only (fp16 autocast); CPU runs in float32."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _normalise(x) -> np.ndarray:
    import torch

    x = torch.nn.functional.normalize(x.float(), dim=-1)
    return x.cpu().numpy().astype(np.float32, copy=False)


# ----------------------------------------------------------------------------------------------- text


def default_cache_dir() -> Path:
    """``$ISOOD_CACHE_DIR`` (default ``~/.cache/isood``), shared with wordnet_tools."""
    return Path(os.environ.get("ISOOD_CACHE_DIR") or Path.home() / ".cache" / "isood")


def text_cache_key(identity: str, texts: Sequence[str]) -> str:
    """Content hash of a text-feature request: model identity + the exact strings in order."""
    h = hashlib.sha256(identity.encode() + b"\0")
    h.update(json.dumps(list(texts), ensure_ascii=False).encode())
    return h.hexdigest()


def encode_texts(
    encoder: ClipEncoder,
    texts: Sequence[str],
    batch_size: int = 256,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
    description: str = "encoding texts",
) -> np.ndarray:
    """L2-normalised float32 text features (len(texts), D), in order.

    With ``cache_dir`` the result is stored as ``text-<sha256>.npy`` keyed by the model identity and the texts,
    and a later call with the same model and texts returns the stored array without running the model.
    """
    import torch

    texts = [str(t) for t in texts]
    cache_file = None
    if cache_dir is not None:
        cache_file = Path(cache_dir) / f"text-{text_cache_key(encoder.identity, texts)}.npy"
        if cache_file.is_file():
            try:
                cached = np.load(cache_file)
                if cached.shape == (len(texts), encoder.embed_dim) and cached.dtype == np.float32:
                    return cached
            except (OSError, ValueError):
                pass  # unreadable cache entry: recompute and overwrite
    out = np.empty((len(texts), encoder.embed_dim), dtype=np.float32)
    starts = range(0, len(texts), max(1, int(batch_size)))
    with _progress(progress) as bar, torch.inference_mode():
        task = bar.add_task(description, total=len(texts))
        for s in starts:
            tokens = encoder.tokenizer(texts[s : s + batch_size]).to(encoder.device)
            with _autocast(encoder.device):
                feats = encoder.model.encode_text(tokens)
            out[s : s + len(tokens)] = _normalise(feats)
            bar.advance(task, len(tokens))
    if cache_file is not None:
        from manifests import atomic_write_bytes

        buf = io.BytesIO()
        np.save(buf, out)
        atomic_write_bytes(cache_file, buf.getvalue())
    return out


# ----------------------------------------------------------------------------------------------- images


def _progress(enabled: bool = True, console=None):
    """A rich progress bar (on stderr); a no-op bar when disabled."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


class ImageFiles:
    """torch Dataset over image files: item i -> (i, preprocessed tensor or None, error message or '')."""

    def __init__(self, files: Sequence[Path], preprocess: Callable, names: Sequence[str] | None = None):
        self.files = [Path(f) for f in files]
        self.names = list(names) if names is not None else [str(f) for f in self.files]
        self.preprocess = preprocess

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from PIL import Image

        path = self.files[i]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(path) as im:
                    im.load()
                    rgb = im.convert("RGB")
            return i, self.preprocess(rgb), ""
        except Exception as e:  # unreadable, truncated, not an image: reported, never fatal
            msg = _one_line(e, 300).replace(str(path), self.names[i])
            return i, None, f"{type(e).__name__}: {msg}"


def collate_images(items):
    """Collate (i, tensor|None, error) items: (indices of readable, stacked tensors, [(i, error)] of unreadable)."""
    import torch

    ok = [(i, t) for i, t, _ in items if t is not None]
    bad = [(i, err) for i, t, err in items if t is None]
    batch = torch.stack([t for _, t in ok]) if ok else None
    return [i for i, _ in ok], batch, bad


def _loader(dataset, batches: list[list[int]], workers: int, device):
    import torch

    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batches,
        num_workers=max(0, int(workers)),
        collate_fn=collate_images,
        pin_memory=getattr(device, "type", "") == "cuda",
        persistent_workers=False,
    )


def encode_images(
    encoder: ClipEncoder,
    files: Sequence[str | os.PathLike],
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int = 0,
    progress: bool = False,
) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Encode image files: (features of the readable ones in order (n_ok, D), [(index, error)] of the others)."""
    feats, _ok, bad = _encode_batches(encoder, ImageFiles(files, encoder.preprocess), _batches(range(len(files)), batch_size), workers, progress)
    return feats, bad


def _batches(indices: Iterable[int], batch_size: int) -> list[list[int]]:
    idx = list(indices)
    b = max(1, int(batch_size))
    return [idx[s : s + b] for s in range(0, len(idx), b)]


def encode_image_batch(encoder: ClipEncoder, batch) -> np.ndarray:
    """L2-normalised features (n, D) of one preprocessed image batch (a tensor, or None for an empty batch):
    the forward pass both extraction engines (local, Ray) run."""
    import torch

    if batch is None:
        return np.empty((0, encoder.embed_dim), np.float32)
    with torch.inference_mode(), _autocast(encoder.device):
        f = encoder.model.encode_image(batch.to(encoder.device, non_blocking=True))
    return _normalise(f)


def _encode_batches(encoder, dataset, batches, workers, progress, on_batch=None, description="encoding images"):
    import torch

    total = sum(len(b) for b in batches)
    feats, ok, bad = [], [], []
    with _progress(progress) as bar, torch.inference_mode():
        task = bar.add_task(description, total=total)
        for idx, batch, errors in _loader(dataset, batches, workers, encoder.device):
            f = encode_image_batch(encoder, batch)
            bar.advance(task, len(idx) + len(errors))
            if on_batch is None:
                feats.append(f)
                ok.extend(idx)
                bad.extend(errors)
            else:
                on_batch(idx, f, errors)
    if on_batch is not None:
        return None
    return (np.concatenate(feats) if feats else np.empty((0, encoder.embed_dim), np.float32)), ok, bad


# ----------------------------------------------------------------------------------------------- sources


@dataclass
class ImageSource:
    """Images to extract: ``root`` (paths are relative to it), ``table`` (path, wnid) sorted by path,
    ``files`` (absolute paths, same order), ``listing_sha256`` (hash of 'path<TAB>size' lines), ``kind``
    ('folder' or 'list')."""

    root: Path
    table: pd.DataFrame
    files: list[Path]
    sizes: list[int]
    listing_sha256: str
    kind: str
    source: Path


def wnid_of(rel_path: str) -> str:
    """The class of an image path relative to its root: the nearest wnid-named folder, else a ``<wnid>_``
    file-name prefix, else the first folder name, else ''."""
    parts = rel_path.split("/")
    for part in reversed(parts[:-1]):
        if WNID_RE.match(part):
            return part
    m = _WNID_PREFIX_RE.match(parts[-1])
    if m:
        return m.group(1)
    return parts[0] if len(parts) > 1 else ""


def list_images(src: str | os.PathLike) -> ImageSource:
    """A dataset root (image files under wnid subfolders, found recursively by extension) or a file list (one
    path per line, relative to the list's folder or absolute; blank lines and ``#`` comments skipped)."""
    src = Path(src).expanduser()
    if src.is_dir():
        root = src
        rels = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.suffix.lower() in IMAGE_EXTENSIONS and not any(s.startswith(".") for s in p.relative_to(root).parts)
            and p.is_file()
        )
        files = [root / r for r in rels]
        kind = "folder"
    elif src.is_file():
        root = src.parent
        seen: set[str] = set()
        rels, files = [], []
        for raw in src.read_text(encoding="utf-8").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            p = Path(line).expanduser()
            p = p if p.is_absolute() else root / p
            try:
                rel = p.relative_to(root).as_posix()
            except ValueError:
                rel = p.as_posix()
            if rel not in seen:
                seen.add(rel)
                rels.append(rel)
                files.append(p)
        order = sorted(range(len(rels)), key=rels.__getitem__)
        rels, files = [rels[i] for i in order], [files[i] for i in order]
        kind = "list"
    else:
        raise IsoodError(f"image source {src} does not exist; pass a dataset root with wnid subfolders or a file list")
    if not rels:
        raise IsoodError(f"image source {src} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    sizes = [f.stat().st_size if f.is_file() else -1 for f in files]
    listing = "\n".join(f"{r}\t{s}" for r, s in zip(rels, sizes))
    table = pd.DataFrame({"path": rels, "wnid": [wnid_of(r) for r in rels]})
    return ImageSource(root, table, files, sizes, hashlib.sha256(listing.encode()).hexdigest(), kind, src)


# ----------------------------------------------------------------------------------------------- extraction


def _shard_key(identity: str, rels: Sequence[str], sizes: Sequence[int]) -> str:
    h = hashlib.sha256(identity.encode() + b"\0")
    for r, s in zip(rels, sizes):
        h.update(f"{r}\t{s}\n".encode())
    return h.hexdigest()


def _npy_bytes(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(x, dtype=np.float32))
    return buf.getvalue()


def _read_shard_rows(path: Path) -> tuple[pd.DataFrame, str]:
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    key = (t.schema.metadata or {}).get(b"isood_shard_key", b"").decode()
    return t.to_pandas(), key


def _shard_complete(out: Path, k: int, key: str) -> pd.DataFrame | None:
    """The shard's rows if shard k is complete for this key, else None."""
    npy, rows_path = out / SHARD_NAME.format(k), out / SHARD_ROWS_NAME.format(k)
    if not (npy.is_file() and rows_path.is_file()):
        return None
    try:
        rows, stored = _read_shard_rows(rows_path)
        n = np.load(npy, mmap_mode="r").shape[0]
    except Exception:
        return None
    if stored != key or n != int((rows["row"] >= 0).sum()):
        return None
    return rows


def _write_shard(out: Path, k: int, key: str, rows: pd.DataFrame, feats: np.ndarray) -> None:
    import pyarrow as pa

    from manifests import atomic_write_bytes, parquet_bytes

    table = pa.Table.from_pandas(rows, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"isood_shard_key": key.encode()})
    atomic_write_bytes(out / SHARD_ROWS_NAME.format(k), parquet_bytes(table))
    atomic_write_bytes(out / SHARD_NAME.format(k), _npy_bytes(feats))  # last: the shard now exists


def check_output_kind(out: Path, kind: str, option: str = "--out") -> None:
    """Refuse to write a ``kind`` manifest over a directory holding a manifest of another kind (its files would
    be replaced); an unreadable or unfinished one is left to the writer."""
    from manifests import existing_kind

    other = existing_kind(out)
    if other and other != kind:
        raise IsoodError(f"{option} {out} holds a {other!r} manifest, not {kind!r}; pass another directory")


@dataclass
class ExtractResult:
    """What an extraction did: the manifest, images encoded / rejected, shards written now / reused."""

    manifest: object
    n_images: int
    n_rejected: int
    shards_written: list[int]
    shards_reused: list[int]
    embed_dim: int


ENGINES = ("local", "ray")
PART_KIND = "features-part"


def _shard_files(shards: Iterable[int]) -> list[str]:
    shards = list(shards)
    return [SHARD_NAME.format(k) for k in shards] + [SHARD_ROWS_NAME.format(k) for k in shards]


def extract_features(
    images: str | os.PathLike,
    clip: str | ClipEncoder,
    out: str | os.PathLike,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    device: str | None = None,
    progress: bool = True,
    on_shard: Callable[[int], None] | None = None,
    argv: list[str] | None = None,
    engine: str = "local",
    ray=None,
    num_shards: int = 1,
    shard_index: int = 0,
) -> ExtractResult:
    """Extract L2-normalised CLIP image features of ``images`` (dataset root or file list) into ``out``.

    Resumable: complete shards (same model, same member files and sizes) are kept; others are (re)computed.
    ``on_shard(k)`` is called after shard k is written (tests use it to interrupt a run).

    ``engine``: ``"local"`` runs the model in this process (``workers`` DataLoader workers decode images);
    ``"ray"`` runs a Ray Data pipeline (:mod:`isood.distributed`; ``workers`` actors, each holding one copy of
    the model; ``ray`` an :class:`isood.distributed.RayOptions`); both write the same shards and manifest.
    ``num_shards``/``shard_index``: one task of a job array (:mod:`isood.shards`): only shards k with
    ``k % num_shards == shard_index``, into a ``features-part`` manifest for ``isood merge``.
    """
    import manifests
    from isood.shards import check_shard_args, part_info, selected_units

    if shard_size < 1 or batch_size < 1:
        raise IsoodError("--shard-size and --batch-size must be >= 1")
    check_shard_args(num_shards, shard_index)
    if engine not in ENGINES:
        raise IsoodError(f"unknown engine {engine!r}; pass --engine local or --engine ray")
    if engine == "ray":
        from isood.distributed import RayOptions, require_ray

        require_ray()
        ray = ray if ray is not None else RayOptions(workers=workers)
        ray.check_device(device)
    source = list_images(images)
    out = Path(out)
    kind = "features" if num_shards == 1 else PART_KIND
    check_output_kind(out, kind)
    if engine == "ray":  # the driver never loads the model: the actors do
        spec = clip.spec if isinstance(clip, ClipEncoder) else str(clip).strip()
        encoder, identity = None, parse_clip_spec(spec)[2]
        workers, device_name = ray.workers, ray.device_name(device)
    else:
        encoder = clip if isinstance(clip, ClipEncoder) else load_clip(clip, device)
        spec, identity = encoder.spec, encoder.identity
        workers = default_workers() if workers is None else int(workers)
        device_name = str(encoder.device)
    out.mkdir(parents=True, exist_ok=True)
    n = len(source.files)
    n_shards = (n + shard_size - 1) // shard_size
    rels = source.table["path"].tolist()
    wnids = source.table["wnid"].tolist()
    mine = selected_units(n_shards, num_shards, shard_index)

    def bounds(k: int) -> tuple[int, int]:
        return k * shard_size, min(n, (k + 1) * shard_size)

    keys, done, todo = {}, {}, []
    for k in mine:
        lo, hi = bounds(k)
        keys[k] = _shard_key(identity, rels[lo:hi], source.sizes[lo:hi])
        rows = _shard_complete(out, k, keys[k])
        if rows is None:
            todo.append(k)
        else:
            done[k] = rows
    if todo or not (out / "manifest.json").is_file():
        manifests.park(out)

    written: list[int] = []
    if todo:
        for k in todo:  # an old complete-looking shard must not survive beside a new rows file
            (out / SHARD_NAME.format(k)).unlink(missing_ok=True)
        pending: dict[int, dict] = {k: {"feats": [], "ok": [], "bad": [], "left": bounds(k)[1] - bounds(k)[0]} for k in todo}

        def on_batch(idx, feats, errors):
            """Results of some images (a batch; under Ray it may span shards): a shard is written when complete,
            its rows in file order whatever order its batches arrived in."""
            parts: dict[int, tuple[list, list, list]] = {}
            for r, i in enumerate(idx):
                part = parts.setdefault(i // shard_size, ([], [], []))
                part[0].append(i)
                part[1].append(r)
            for i, err in errors:
                parts.setdefault(i // shard_size, ([], [], []))[2].append((i, err))
            for k, (ok, rows_of_batch, bad) in parts.items():
                st = pending[k]
                st["feats"].append(feats if len(rows_of_batch) == len(feats) else feats[rows_of_batch])
                st["ok"].extend(ok)
                st["bad"].extend(bad)
                st["left"] -= len(ok) + len(bad)
                if st["left"] == 0:
                    shard_feats = np.concatenate(st["feats"])
                    if st["ok"] != sorted(st["ok"]):
                        order = np.argsort(st["ok"], kind="stable")
                        shard_feats, st["ok"] = shard_feats[order], [st["ok"][j] for j in order]
                    rows = _shard_rows(k, shard_size, n, rels, wnids, st)
                    _write_shard(out, k, keys[k], rows, shard_feats)
                    done[k] = rows
                    written.append(k)
                    del pending[k]
                    if on_shard is not None:
                        on_shard(k)

        description = f"extracting {source.source.name}"
        if engine == "ray":
            from isood.distributed import encode_images_ray

            encode_images_ray(source.files, rels, [bounds(k) for k in todo], spec, batch_size=batch_size, options=ray,
                              device=device, on_batch=on_batch, progress=progress, description=description)
        else:
            batches = []
            for k in todo:
                batches.extend(_batches(range(*bounds(k)), batch_size))
            dataset = ImageFiles(source.files, encoder.preprocess, names=rels)
            _encode_batches(encoder, dataset, batches, workers, progress, on_batch=on_batch, description=description)
        if pending:
            raise IsoodError(f"{out}: shard(s) {sorted(pending)} did not receive every image; rerun to resume")

    embed_dim = encoder.embed_dim if encoder is not None else _shards_dim(out, mine)
    _cleanup_stale_shards(out, set(mine))
    manifests.unpark(out)
    config = {
        "images": str(source.source), "source_kind": source.kind, "clip": spec, "clip_identity": identity,
        "embed_dim": embed_dim, "shard_size": shard_size, "batch_size": batch_size, "workers": workers,
        "device": device_name, "engine": engine,
    }
    if engine == "ray":
        config["ray"] = ray.as_config()
    inputs = [manifests.input_record("images", source.source, sha256=_source_sha(source))]
    if num_shards == 1:
        manifest = write_features_manifest(out, done, config, inputs, argv=argv)
    else:
        config["part"] = part_info(num_shards, shard_index, n_shards, "feature shard")
        shards = pd.DataFrame({
            "shard": np.array(mine, dtype=np.int32),
            "key": [keys[k] for k in mine],
            "images": np.array([int((done[k]["row"] >= 0).sum()) for k in mine], dtype=np.int64),
            "rejected": np.array([int((done[k]["row"] < 0).sum()) for k in mine], dtype=np.int64),
        })
        manifest = manifests.write_manifest(
            out, kind=PART_KIND, tables={"shards": shards}, config=config, inputs=inputs,
            existing_files=_shard_files(mine), argv=argv,
            summary={"images": int(shards["images"].sum()), "rejected": int(shards["rejected"].sum()),
                     "embed_dim": embed_dim, "shards": len(mine), "shards_total": n_shards},
            note=f"part {shard_index} of {num_shards}: {len(mine)} of {n_shards} feature shards",
        )
    n_ok = int(sum(int((done[k]["row"] >= 0).sum()) for k in mine))
    n_bad = int(sum(int((done[k]["row"] < 0).sum()) for k in mine))
    return ExtractResult(manifest, n_ok, n_bad, sorted(written), sorted(set(done) - set(written)), embed_dim)


def write_features_manifest(out: Path, shard_rows: dict[int, pd.DataFrame], config: dict, inputs: list,
                            argv: list[str] | None = None):
    """The ``features`` manifest of complete shards 0..n-1 in ``out`` (``shard_rows``: k -> its rows file's
    table): data/index.parquet, data/rejected.parquet, every shard registered. Shared by `isood extract` and
    `isood merge`, so a merged job array and a single run write the same bytes."""
    import manifests

    n_shards = len(shard_rows)
    if sorted(shard_rows) != list(range(n_shards)):
        raise IsoodError(f"{out}: shards {sorted(set(range(n_shards)) - set(shard_rows))} are missing")
    index_parts, rejected_parts = [], []
    for k in range(n_shards):
        rows = shard_rows[k]
        good = rows[rows["row"] >= 0]
        index_parts.append(pd.DataFrame({"path": good["path"], "wnid": good["wnid"], "shard": np.int32(k), "row": good["row"].astype(np.int64)}))
        rejected_parts.append(rows.loc[rows["row"] < 0, ["path", "wnid", "error"]])
    index = pd.concat(index_parts, ignore_index=True)
    rejected = pd.concat(rejected_parts, ignore_index=True)
    index["shard"] = index["shard"].astype(np.int32)
    embed_dim = config.get("embed_dim")
    return manifests.write_manifest(
        out,
        kind="features",
        tables={"index": index, "rejected": rejected},
        config=config,
        inputs=inputs,
        existing_files=_shard_files(range(n_shards)),
        summary={"images": int(len(index)), "rejected": int(len(rejected)), "embed_dim": embed_dim, "shards": n_shards},
        note=f"features of {len(index)} images",
        argv=argv,
    )


def merge_feature_parts(parts: list, out: Path, config: dict, argv: list[str] | None = None):
    """Combine ``features-part`` manifests (checked by :func:`isood.shards.merge_parts`) into one ``features``
    manifest in ``out``: shard files are hard-linked (copied across file systems), then the index is built as
    a single run builds it."""
    import manifests
    from isood.shards import link_or_copy

    n_shards = int(config["part"]["units"])
    config = {k: v for k, v in config.items() if k != "part"}
    dims = {int(m.meta["summary"]["embed_dim"]) for m in parts if m.meta["summary"].get("embed_dim") is not None}
    if len(dims) > 1:
        raise IsoodError(f"parts hold features of different dimensions {sorted(dims)}; merge parts of one run")
    config["embed_dim"] = dims.pop() if dims else config.get("embed_dim")
    rows: dict[int, pd.DataFrame] = {}
    for m in parts:
        table = m.frame("shards")
        for k, key in zip(table["shard"].astype(int), table["key"]):
            if k in rows:
                raise IsoodError(f"feature shard {k} is in two parts ({m.root} and another); merge parts of one run")
            for name in (SHARD_ROWS_NAME.format(k), SHARD_NAME.format(k)):
                link_or_copy(m.path(name), out / name)
            rows[k], stored = _read_shard_rows(out / SHARD_ROWS_NAME.format(k))
            if stored != key:
                raise IsoodError(f"{m.root}: shard {k} does not match its part manifest; rerun that part")
    missing = sorted(set(range(n_shards)) - set(rows))
    if missing:
        raise IsoodError(f"feature shards {missing[:10]} are in no part; run the missing array tasks first")
    _cleanup_stale_shards(out, set(range(n_shards)))
    manifests.unpark(out)
    return write_features_manifest(out, rows, config, parts[0].meta.get("inputs", []), argv=argv)


def _shards_dim(out: Path, shards: Sequence[int]) -> int | None:
    for k in shards:
        return int(np.load(out / SHARD_NAME.format(k), mmap_mode="r").shape[1])
    return None


def _source_sha(source: ImageSource) -> str:
    return source.listing_sha256


def _shard_rows(k, shard_size, n, rels, wnids, st) -> pd.DataFrame:
    lo, hi = k * shard_size, min(n, (k + 1) * shard_size)
    row_of = {i: r for r, i in enumerate(st["ok"])}
    err_of = dict(st["bad"])
    return pd.DataFrame({
        "path": rels[lo:hi],
        "wnid": wnids[lo:hi],
        "row": np.array([row_of.get(i, -1) for i in range(lo, hi)], dtype=np.int64),
        "error": [err_of.get(i, "") for i in range(lo, hi)],
    })


def _cleanup_stale_shards(out: Path, keep: set[int]) -> None:
    """Remove shard files not in ``keep`` (beyond the shard count, or another part's) and temp files left by a
    killed write."""
    for p in out.iterdir():
        m = _SHARD_RE.match(p.name)
        if m and int(m.group(1)) not in keep:
            p.unlink()
        elif p.name.startswith(".features-") and p.name.endswith(".tmp"):
            p.unlink()


def default_workers() -> int:
    """DataLoader workers: min(8, CPUs - 1), at least 0."""
    return max(0, min(8, (os.cpu_count() or 1) - 1))


# ----------------------------------------------------------------------------------------------- loading


def is_feature_dir(path: str | os.PathLike) -> bool:
    """True for a features manifest directory, a folder with features.npy + index.parquet, or such a .npy file."""
    p = Path(path)
    if p.is_file():
        return p.suffix == ".npy"
    if (p / "features.npy").is_file():
        return True
    mf = p / "manifest.json"
    if mf.is_file():
        try:
            return json.loads(mf.read_text()).get("kind") == "features"
        except (OSError, ValueError):
            return False
    return False


def load_features(path: str | os.PathLike) -> tuple[np.ndarray, pd.DataFrame]:
    """Features (N, D) float32 and their index (path, wnid, ...) from an extraction directory, a folder with
    ``features.npy`` + ``index.parquet``, or a ``features.npy`` path with ``index.parquet`` beside it.

    Validates: 2-D numeric features, one index row per feature row, one dimension across shards.
    """
    import manifests

    p = Path(path)
    if p.is_file() and p.suffix == ".npy":
        npy, idx = p, p.with_name("index.parquet")
    elif p.is_dir() and (p / "features.npy").is_file():
        npy, idx = p / "features.npy", p / "index.parquet"
    elif p.is_dir() and (p / "manifest.json").is_file():
        m = manifests.read(p)
        if m.kind != "features":
            raise IsoodError(f"{p}: a {m.kind!r} manifest, not features; pass an `isood extract` output directory")
        index = m.frame("index")
        if not len(index):
            return np.empty((0, int(m.meta["summary"].get("embed_dim", 0))), np.float32), _clean_index(index, p)
        shards = sorted(int(s) for s in index["shard"].unique())
        arrays = {}
        for s in shards:
            f = p / SHARD_NAME.format(s)
            if not f.is_file():
                raise IsoodError(f"{p}: shard {f.name} is missing; rerun `isood extract` into this directory")
            arrays[s] = _load_2d(f)
        dims = {a.shape[1] for a in arrays.values()}
        if len(dims) != 1:
            raise IsoodError(f"{p}: shards have different feature dimensions {sorted(dims)}")
        for s, a in arrays.items():
            rows = index.loc[index["shard"] == s, "row"].to_numpy()
            if len(rows) != a.shape[0] or rows.min() < 0 or rows.max() >= a.shape[0]:
                raise IsoodError(f"{p}: index lists {len(rows)} rows for shard {s} but it holds {a.shape[0]}")
        feats = np.empty((len(index), dims.pop()), np.float32)
        sh, rw = index["shard"].to_numpy(), index["row"].to_numpy()
        for s, a in arrays.items():
            sel = sh == s
            feats[sel] = a[rw[sel]]
        return feats, _clean_index(index, p)
    else:
        raise IsoodError(
            f"{p}: not a feature set; pass an `isood extract` output directory or a folder with features.npy + index.parquet"
        )
    if not idx.is_file():
        raise IsoodError(f"{npy}: no index.parquet beside it (one row per feature row, with a path column)")
    feats = _load_2d(npy)
    index = pd.read_parquet(idx)
    if len(index) != feats.shape[0]:
        raise IsoodError(f"{npy}: {feats.shape[0]} feature rows but {idx.name} has {len(index)} rows")
    return feats, _clean_index(index, npy.parent)


def _load_2d(f: Path) -> np.ndarray:
    try:
        a = np.load(f, allow_pickle=False)
    except Exception as e:
        raise IsoodError(f"{f}: not a readable .npy array ({_one_line(e, 120)})") from None
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.number):
        raise IsoodError(f"{f}: features must be a 2-D numeric array (rows x dimension), got shape {a.shape} {a.dtype}")
    return np.asarray(a, dtype=np.float32)


def _clean_index(index: pd.DataFrame, where: Path) -> pd.DataFrame:
    if "path" not in index.columns:
        raise IsoodError(f"{where}: the index has no 'path' column (columns: {', '.join(map(str, index.columns))})")
    index = index.reset_index(drop=True).copy()
    index["path"] = index["path"].astype(str)
    if "wnid" not in index.columns:
        index["wnid"] = [wnid_of(p) for p in index["path"]]
    index["wnid"] = index["wnid"].fillna("").astype(str)
    return index
