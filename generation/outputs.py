"""The image files of a Syn-IS run: PNG bytes, content keys, the resume state, rejection markers, pruning.

Resumability: every file is written through ``isood.core.files.atomic_write_bytes`` (a temporary ``.~<name>.<random>
.tmp`` renamed into place), so no partial image survives a kill. An image is kept by a rerun when it decodes at
the planned size and its content key (prompt, negative prompt, seed and the generator fingerprint, which holds the
content hash of a local pipeline's weights: ``generation.fingerprint.pipeline_weights``), recorded in
``<out>/.~syn-state.json``, is unchanged; otherwise it is deleted and regenerated. A rejected image (pipeline or
image safety checker) is not written; a marker ``.~<name>.rejected`` holding the reason stands in for it, so a
rerun does not regenerate it either.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from isood.core.errors import BadInputError, IsoodError
from isood.core.errors import one_line
from isood.core.files import TMP_PREFIX, atomic_write_bytes, remove_temporaries, sha256_bytes, sha256_file

__all__ = [
    "STATE_FILE", "STATE_FORMAT", "REJECT_SUFFIX", "png_bytes", "is_valid_image", "reject_marker", "content_key",
    "read_state", "write_state", "GenerationResult", "prepare_outputs", "write_image", "finish_hashes",
    "prune_images",
]

#: The content keys of the images of an output folder (a bookkeeping file, ignored by ``isood verify``).
STATE_FILE = f"{TMP_PREFIX}syn-state.json"
STATE_FORMAT = "isood.syn-state/1"
REJECT_SUFFIX = ".rejected"


def png_bytes(image, text: Mapping[str, Any] | None = None) -> bytes:
    """Deterministic PNG encoding (same pixels + text -> same bytes); ``text`` goes into tEXt chunks."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for k, v in (text or {}).items():
        info.add_text(k, str(v))
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def is_valid_image(path: str | Path, size: int | None = None) -> bool:
    """True when ``path`` decodes as an image (of ``size`` x ``size`` when given)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            return size is None or im.size == (size, size)
    except Exception:
        return False


def reject_marker(path: str | Path) -> Path:
    """The marker file that records the rejection of the image ``path``: ``.~<name>.rejected`` beside it."""
    path = Path(path)
    return path.with_name(f"{TMP_PREFIX}{path.name}{REJECT_SUFFIX}")


def content_key(prompt: str, negative_prompt: str, seed: int, fingerprint: Mapping[str, Any]) -> str:
    """What determines an image: 24 hex digits of SHA-256 over prompt, negative prompt, seed and fingerprint."""
    blob = json.dumps([prompt, negative_prompt, int(seed), dict(fingerprint)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def read_state(root: str | Path) -> dict[str, Any]:
    """The resume state of an output folder: ``{"fingerprint": ..., "keys": {path: content key}}`` (empty keys
    when there is none or it is unreadable)."""
    state_path = Path(root) / STATE_FILE
    try:
        data = json.loads(state_path.read_text()) if state_path.is_file() else {}
    except (json.JSONDecodeError, OSError):
        data = {}
    if not isinstance(data, dict) or not isinstance(data.get("keys", {}), dict):
        data = {}
    return {"fingerprint": data.get("fingerprint"), "keys": dict(data.get("keys", {}))}


def write_state(root: str | Path, *, fingerprint: Mapping[str, Any] | None, keys: Mapping[str, str]) -> None:
    """Record the content keys of the planned images (atomically)."""
    data = {"format": STATE_FORMAT, "fingerprint": None if fingerprint is None else dict(fingerprint),
            "keys": dict(keys)}
    atomic_write_bytes(Path(root) / STATE_FILE, json.dumps(data, sort_keys=True).encode())


@dataclass
class GenerationResult:
    """What one generation run did. ``sha256``: path -> hash of every accepted image (new or kept);
    ``rejected``: path -> reason; ``batches``: pipeline calls."""

    generated: int = 0
    skipped: int = 0
    batches: int = 0
    seconds: float = 0.0
    sha256: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)

    @property
    def images_per_second(self) -> float:
        return self.generated / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counts for a manifest summary (rejections counted, hashes left out)."""
        d = asdict(self)
        d.pop("sha256")
        d["rejected"] = len(self.rejected)
        d["images_per_second"] = round(self.images_per_second, 3)
        d["seconds"] = round(self.seconds, 3)
        return d


def prepare_outputs(plan: pd.DataFrame, root: str | Path, fingerprint: Mapping[str, Any],
                    size: int) -> tuple[list[dict], set[str], GenerationResult]:
    """Before generating ``plan`` (path, prompt, negative_prompt, seed, ...) into ``root``: delete temporaries
    and the images (and markers) made for another content key, record the new keys, and find what is done.

    Returns ``(rows, done paths, result)`` with ``result.skipped`` and the remembered rejections filled in.
    """
    root = Path(root)
    remove_temporaries(root / "images", recursive=True)
    rows = plan.to_dict("records")
    keys = {r["path"]: content_key(r["prompt"], r["negative_prompt"], r["seed"], fingerprint) for r in rows}
    if len(keys) != len(rows):
        raise BadInputError("the image plan has duplicate paths; pass a plan made by expand_images")
    old_keys = read_state(root)["keys"]
    for rel, key in keys.items():  # an image made for another prompt/seed/setting is not valid: drop it first
        if old_keys.get(rel) != key:
            (root / rel).unlink(missing_ok=True)
            reject_marker(root / rel).unlink(missing_ok=True)
    write_state(root, fingerprint=fingerprint, keys=keys)
    result, done = GenerationResult(), set()
    for r in rows:
        p = root / r["path"]
        marker = reject_marker(p)
        if marker.is_file():
            result.rejected[r["path"]] = marker.read_text().strip() or "rejected"
            done.add(r["path"])
        elif p.is_file() and is_valid_image(p, size):
            done.add(r["path"])
    result.skipped = len(done)
    return rows, done, result


def write_image(root: str | Path, row: Mapping[str, Any], image, flag: str | None,
                image_checker: Callable | None = None) -> tuple[str, str]:
    """Write one generated image of the planned ``row`` into ``root``: accepted -> a PNG (prompt and seed in
    its text chunks); rejected (``flag`` from the pipeline, or ``image_checker(image, row)``) -> a marker with
    the reason. Returns ``(sha256 or '', reason or '')``."""
    p = Path(root) / row["path"]
    try:
        reason = flag or (image_checker(image, dict(row)) if image_checker is not None else None)
    except Exception as e:  # the user's checker: its failure is a one-line error naming it and the image
        name = getattr(image_checker, "__name__", type(image_checker).__name__)
        raise IsoodError(f"the safety checker {name} failed on {row['path']} ({type(e).__name__}: {one_line(e)}); "
                         "fix the checker or pass another --safety-checker") from None
    if reason:
        atomic_write_bytes(reject_marker(p), str(reason).encode())
        return "", str(reason)
    data = png_bytes(image, {"prompt": row["prompt"], "negative_prompt": row["negative_prompt"],
                             "seed": row["seed"], "isood": "syn-is"})
    atomic_write_bytes(p, data)
    return sha256_bytes(data), ""


def finish_hashes(rows: Sequence[Mapping[str, Any]], root: str | Path, result: GenerationResult) -> GenerationResult:
    """Hash every accepted image not generated in this run (kept from an earlier one)."""
    for r in rows:
        rel = r["path"]
        if rel not in result.rejected and rel not in result.sha256:
            result.sha256[rel] = sha256_file(Path(root) / rel)
    return result


def prune_images(root: str | Path, keep: set[str]) -> int:
    """Delete files under ``<root>/images`` that are neither in ``keep`` nor the marker of a kept path (images of
    an earlier plan no longer wanted); empty folders go too. Returns the number of files removed."""
    root = Path(root)
    images_dir = root / "images"
    if not images_dir.is_dir():
        return 0
    keep_all = set(keep) | {reject_marker(root / k).relative_to(root).as_posix() for k in keep}
    removed = 0
    for p in sorted(images_dir.rglob("*")):
        if p.is_file() and p.relative_to(root).as_posix() not in keep_all:
            p.unlink()
            removed += 1
    for d in sorted((d for d in images_dir.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    return removed
