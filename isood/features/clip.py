"""CLIP encoders (open_clip): names, loading, text and image features, and the batch worker of extraction.

IS-OOD measures shift in CLIP space: image features of test and ID images and text features of label x template
prompts (the LAID training texts) all come from one CLIP model, L2-normalised (cosine geometry).

Encoders are named as open_clip names them:

* ``MODEL:PRETRAINED`` -- a built-in architecture and a pretrained tag or checkpoint file
  (``ViT-B-32:openai``, ``ViT-L-14:laion2b_s32b_b82k``, ``ViT-B-32:/path/to/weights.pt``);
* ``local-dir:PATH`` -- a folder with ``open_clip_config.json`` and the weights (open_clip's own schema);
* ``hf-hub:ORG/REPO`` -- an open_clip model on the Hugging Face Hub.

``ClipEncodeWorker`` is the worker class every ``isood.core.engine.BatchEngine`` runs for extraction (one model per
process or Ray actor): the local and the Ray engine decode, preprocess and encode a batch with the same code (the
local engine through ``ClipEncodeWorker.stream``: the images decoded by other processes, ahead of the model).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from isood.core.content import file_sha256, folder_fingerprint
from isood.core.errors import BadInputError, IsoodError, MissingWeightsError
from isood.features.decoding import REFERENCE_DECODE
from isood.features.batch_decode import PreparedImages, image_decoder, prepared_batches
from isood.core.devices import torch_device
from isood.core.errors import one_line
from isood.core.files import atomic_write_bytes
from isood.core.hub_access import TINY_HINT, hub_access, hub_guard
from isood.core.progress import progress_bar
from isood.core.workers import WorkerSpec

if TYPE_CHECKING:
    import torch

__all__ = [
    "ClipSpec", "ClipEncoder", "parse_clip_spec", "load_clip", "text_cache_key", "encode_texts",
    "encode_image_batch", "ClipEncodeWorker", "LOCAL_HINT",
]

LOCAL_HINT = "pass --clip local-dir:PATH (a folder with open_clip_config.json and the weights)"
_HUB_HINT = f"pass --clip local-dir:PATH (a folder with open_clip_config.json and the weights, {TINY_HINT})"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


class ClipSpec(NamedTuple):
    """A validated ``--clip`` name: the open_clip ``model`` name (``local-dir:PATH`` / ``hf-hub:...`` as is), the
    ``pretrained`` tag or checkpoint file (None for folders and the Hub), and ``identity``: a stable string naming
    the weights (tag, or content hash of local files) that keys caches and shards."""

    model: str
    pretrained: str | None
    identity: str


@dataclass
class ClipEncoder:
    """A loaded open_clip model: ``model`` (eval mode, on ``device``), ``preprocess`` (PIL -> tensor),
    ``tokenizer`` (strings -> token ids), ``identity`` (see ``ClipSpec``), ``spec`` (what the user passed) and
    ``embed_dim``."""

    # open_clip's CLIP, a torch.nn.Module; Any since torch's Module type knows no encode_image / encode_text
    model: Any
    preprocess: Callable
    tokenizer: Callable
    identity: str
    spec: str
    device: "torch.device"
    embed_dim: int


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


def _clip_file(p: Path) -> bool:
    return p.name == "open_clip_config.json" or p.suffix in _WEIGHT_SUFFIXES


def _local_dir_identity(folder: Path) -> str:
    """local-dir identity: ``isood.core.content.folder_fingerprint`` of the config and every checkpoint file (content,
    not location; hashed once, then read again only when a file's stat changes)."""
    return f"local-dir:sha256={folder_fingerprint(folder, _clip_file)[:32]}"


def _parse_local_dir(spec: str) -> ClipSpec:
    folder = Path(spec[len("local-dir:"):]).expanduser()
    if not folder.is_dir():
        raise BadInputError(f"--clip {spec}: folder {folder} does not exist; {LOCAL_HINT}")
    if not (folder / "open_clip_config.json").is_file():
        raise BadInputError(f"--clip {spec}: {folder} has no open_clip_config.json; {LOCAL_HINT}")
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in folder.iterdir()):
        raise MissingWeightsError(f"--clip {spec}: {folder} holds no weights (*.safetensors, *.bin, *.pth)")
    return ClipSpec(f"local-dir:{folder}", None, _local_dir_identity(folder))


def _parse_builtin(spec: str) -> ClipSpec:
    import open_clip

    name, sep, pretrained = spec.partition(":")
    name = name.replace("/", "-")
    if name not in open_clip.list_models():
        raise BadInputError(
            f"unknown CLIP model {name!r}; list valid MODEL:PRETRAINED names with "
            "`python -c \"import open_clip; print(open_clip.list_pretrained())\"`, or pass --clip local-dir:PATH")
    tags = open_clip.list_pretrained_tags_by_model(name)
    if not sep or not pretrained:
        raise BadInputError(f"--clip {spec!r} names no weights; pass MODEL:PRETRAINED, e.g. "
                            f"{name}:{tags[0] if tags else 'TAG'}")
    if pretrained in tags:
        return ClipSpec(name, pretrained, f"open_clip:{name}:{pretrained}")
    if Path(pretrained).expanduser().is_file():
        pretrained = str(Path(pretrained).expanduser())
        return ClipSpec(name, pretrained, f"open_clip:{name}:sha256={file_sha256(pretrained)[:32]}")
    shown = ", ".join(tags[:8]) + (", ..." if len(tags) > 8 else "")
    raise BadInputError(f"unknown pretrained tag {pretrained!r} for {name} (known: {shown or 'none'}); "
                        "pass a tag, a checkpoint file, or --clip local-dir:PATH")


def parse_clip_spec(spec: str) -> ClipSpec:
    """Validate a ``--clip`` name without loading weights.

    Raises ``BadInputError`` (unknown model, unknown tag, bad folder) or ``MissingWeightsError`` (folder without
    weights) with one line.
    """
    spec = str(spec).strip()
    if spec.startswith("local-dir:"):
        return _parse_local_dir(spec)
    if spec.startswith("hf-hub:"):
        if not spec[len("hf-hub:"):]:
            raise BadInputError("--clip hf-hub: needs a repository, e.g. hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K")
        return ClipSpec(spec, None, f"open_clip:{spec}")
    return _parse_builtin(spec)


def _quick_gelu(parsed: ClipSpec) -> bool:
    """Weights trained with QuickGELU (e.g. ViT-B-32:openai) need it in the architecture too, or every feature is
    slightly off (open_clip only warns): use the tag's setting, as ``ViT-B-32-quickgelu:openai`` would."""
    import open_clip

    if parsed.model.startswith(("local-dir:", "hf-hub:")):
        return False
    tag_cfg = open_clip.get_pretrained_cfg(parsed.model, parsed.pretrained) \
        if parsed.pretrained and not Path(parsed.pretrained).is_file() else {}
    model_cfg = open_clip.get_model_config(parsed.model) or {}
    return bool(tag_cfg.get("quick_gelu")) and not model_cfg.get("quick_gelu", False)


def load_clip(spec: str, device: str | None = None) -> ClipEncoder:
    """Load an open_clip encoder named ``MODEL:PRETRAINED``, ``local-dir:PATH`` or ``hf-hub:ORG/REPO``.

    Raises ``MissingWeightsError`` (one line, suggesting ``--clip local-dir:PATH``) when the weights cannot be had
    (offline, not cached, folder without a checkpoint) and ``IsoodError`` for an unknown model, tag or device. A Hub
    name fails in about a second when the Hub is out of reach, naming ``HF_HUB_OFFLINE`` (``isood.core.hub_access``).
    """
    import open_clip
    import torch

    spec = str(spec).strip()
    dev = torch_device(device)
    parsed = parse_clip_spec(spec)
    local = spec.startswith("local-dir:") or (parsed.pretrained is not None and Path(parsed.pretrained).is_file())
    access = None if local else hub_access()  # a Hub name: fail in a second when the Hub is out of reach
    try:
        with _quiet_libraries(), (contextlib.nullcontext() if access is None else hub_guard(access)):
            model, _, preprocess = open_clip.create_model_and_transforms(
                parsed.model, pretrained=parsed.pretrained, device=dev, require_pretrained=True,
                force_quick_gelu=_quick_gelu(parsed))
            tokenizer = open_clip.get_tokenizer(parsed.model)
    except (IsoodError, KeyboardInterrupt):
        raise
    except Exception as e:
        if access is None:
            raise IsoodError(f"--clip {spec}: could not load the model ({one_line(e, 160)})") from None
        raise MissingWeightsError(access.missing(f"--clip {spec}", _HUB_HINT, e)) from None
    model.eval()
    with torch.inference_mode():
        embed_dim = int(model.encode_text(tokenizer(["a photo."]).to(dev)).shape[-1])
    return ClipEncoder(model, preprocess, tokenizer, parsed.identity, spec, dev, embed_dim)


def _autocast(device):
    """AMP on CUDA only (fp16 autocast); CPU runs in float32."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _normalise(x: "torch.Tensor") -> np.ndarray:
    import torch

    x = torch.nn.functional.normalize(x.float(), dim=-1)
    return x.cpu().numpy().astype(np.float32, copy=False)


# ----------------------------------------------------------------------------------------------- text
def text_cache_key(identity: str, texts: Sequence[str]) -> str:
    """Content hash of a text-feature request: model identity + the exact strings in order."""
    h = hashlib.sha256(identity.encode() + b"\0")
    h.update(json.dumps(list(texts), ensure_ascii=False).encode())
    return h.hexdigest()


def _cached(cache_file: Path, shape: tuple[int, int]) -> np.ndarray | None:
    if not cache_file.is_file():
        return None
    try:
        cached = np.load(cache_file)
    except (OSError, ValueError):
        return None  # unreadable cache entry: recompute and overwrite
    return cached if cached.shape == shape and cached.dtype == np.float32 else None


def encode_texts(encoder: ClipEncoder, texts: Sequence[str], *, batch_size: int = 256,
                 cache_dir: str | os.PathLike | None = None, progress: bool = False,
                 description: str = "encoding texts") -> np.ndarray:
    """L2-normalised float32 text features (len(texts), D), in order.

    With ``cache_dir`` the result is stored as ``text-<sha256>.npy`` keyed by the model identity and the texts,
    and a later call with the same model and texts returns the stored array without running the model. Without
    it nothing is cached (callers pass ``isood.core.defaults.cache_dir("text-features")`` for the shared cache).
    """
    import torch

    texts = [str(t) for t in texts]
    cache_file = None
    if cache_dir is not None:
        cache_file = Path(cache_dir) / f"text-{text_cache_key(encoder.identity, texts)}.npy"
        hit = _cached(cache_file, (len(texts), encoder.embed_dim))
        if hit is not None:
            return hit
    out = np.empty((len(texts), encoder.embed_dim), dtype=np.float32)
    step = max(1, int(batch_size))
    with progress_bar(progress) as bar, torch.inference_mode():
        task = bar.add_task(description, total=len(texts))
        for s in range(0, len(texts), step):
            tokens = encoder.tokenizer(texts[s: s + step]).to(encoder.device)
            with _autocast(encoder.device):
                feats = encoder.model.encode_text(tokens)
            out[s: s + len(tokens)] = _normalise(feats)
            bar.advance(task, len(tokens))
    if cache_file is not None:
        buf = io.BytesIO()
        np.save(buf, out)
        atomic_write_bytes(cache_file, buf.getvalue())
    return out


# ----------------------------------------------------------------------------------------------- images
def encode_image_batch(encoder: ClipEncoder, batch: "torch.Tensor | None") -> np.ndarray:
    """L2-normalised features (n, D) of one preprocessed image batch (a tensor, or None for an empty batch)."""
    import torch

    if batch is None:
        return np.empty((0, encoder.embed_dim), np.float32)
    with torch.inference_mode(), _autocast(encoder.device):
        f = encoder.model.encode_image(batch.to(encoder.device, non_blocking=True))
    return _normalise(f)


class ClipEncodeWorker:
    """The extraction worker of a ``BatchEngine``: one CLIP encoder per process or actor.

    ``ClipEncodeWorker(clip, device, workers, decode)``: ``clip`` a ``--clip`` name (loaded here, on ``device``)
    or an already loaded ``ClipEncoder`` (used as is); ``decode`` the decoding mode
    (``isood.features.decoding.DECODE_MODES``, see ``isood.features.batch_decode.image_decoder``); ``workers`` the
    run's ``isood.core.workers.WorkerSpec``, whose ``decode_processes`` are the image-decoding processes of
    ``stream`` (the local engine; 0: decode in this process) and the decoding threads of a call (a Ray actor). A call takes a batch ``{'path': files, 'name': relative paths (for error messages), 'i': row
    ids (echoed)}`` (and optionally ``'refused'``: per file '' or why the listing refused it; such a file is not
    opened) and returns ``{'i', 'feature' (n, D) float32, zeros where unreadable, 'ok' (n,) bool, 'error' (n,)
    str ('' when ok), 'sha256' (n,) str (the content hash of the bytes decoded, '' when none were read: what
    shard keys use)}``: the readable images encoded in ONE forward pass (so the batch composition fixes the
    numerics). ``stream(batches)`` gives the same results for a sequence of batches, in order.
    """

    def __init__(self, clip: str | ClipEncoder, device: str | None = None, workers: WorkerSpec = WorkerSpec(0),
                 decode: str = REFERENCE_DECODE):
        self.encoder = clip if isinstance(clip, ClipEncoder) else load_clip(clip, device)
        self.decoder = image_decoder(self.encoder.preprocess, decode)
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None

    @property
    def pool(self) -> ThreadPoolExecutor | None:
        """The decoding threads of a call (made on first use; None for one thread)."""
        if self._pool is None and self.workers.decode_processes > 1:
            self._pool = ThreadPoolExecutor(self.workers.decode_processes, thread_name_prefix="isood-decode")
        return self._pool

    @staticmethod
    def _files(batch: Mapping[str, Any]) -> tuple[list[str], list[str], list[str], list[int]]:
        """(paths, names, why each is refused ('' when read), positions of the files to read) of a batch."""
        paths = [str(p) for p in batch["path"]]
        names = [str(x) for x in batch["name"]] if "name" in batch else paths
        refused = [str(r) for r in batch.get("refused", ())] or [""] * len(paths)
        return paths, names, refused, [j for j in range(len(paths)) if not refused[j]]

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        paths, names, _, read = self._files(batch)
        part = self.decoder.prepare([paths[j] for j in read], [names[j] for j in read], self.pool)
        return self._encode(batch, [part])

    def stream(self, batches: Sequence[Mapping[str, Any]]) -> Iterator[dict[str, np.ndarray]]:
        """The result of each batch, in order (what ``isood.core.engine.LocalEngine`` runs): the CPU part of
        decoding done by ``decode_processes`` processes, ahead of the model (``isood.features.batch_decode.prepared_batches``),
        each batch encoded in one forward pass here; the same numbers as calling the worker on each batch."""
        files = []
        for batch in batches:
            paths, names, _, read = self._files(batch)
            files.append(([paths[j] for j in read], [names[j] for j in read]))
        for batch, parts in zip(batches, prepared_batches(self.decoder, files, self.workers.decode_processes)):
            yield self._encode(batch, parts)

    def _encode(self, batch: Mapping[str, Any], parts: Sequence[PreparedImages]) -> dict[str, np.ndarray]:
        """The result of ``batch`` from its prepared files (in order: the files it does not refuse)."""
        paths, names, refused, read = self._files(batch)
        n = len(paths)
        got = self.decoder.finish(parts, [names[j] for j in read], self.encoder.device)
        feats = np.zeros((n, self.encoder.embed_dim), np.float32)
        ok = np.zeros(n, dtype=bool)
        errors = np.array(refused, dtype=object) if n else np.array([], dtype=object)
        hashes = np.array([""] * n, dtype=object)
        for local, j in enumerate(read):
            errors[j], hashes[j] = got.errors[local], got.hashes[local]
        if got.ok:
            at = [read[p] for p in got.ok]
            feats[at] = encode_image_batch(self.encoder, got.tensor)
            ok[at] = True
        ids = np.asarray(batch["i"], dtype=np.int64) if "i" in batch else np.arange(n, dtype=np.int64)
        return {"i": ids, "feature": feats, "ok": ok, "error": errors, "sha256": hashes}
