"""SDXL-Turbo image generation for Syn-IS over diffusers: deterministic, resumable, batched, with safety checks.

Defaults follow SDXL-Turbo's model card: ``stabilityai/sdxl-turbo`` through
``AutoPipelineForText2Image.from_pretrained(name, torch_dtype=float16, variant='fp16')`` on CUDA (float32 on
CPU), 1 step, guidance_scale 0.0, 512x512. ``local-dir:PATH`` loads a saved or downloaded pipeline folder with
``local_files_only=True``.

Determinism: each image has its own seed (``generation.prompts.image_seed``: global seed, prompt id, image
index) fed through its own CPU ``torch.Generator``, so an image's latent does not depend on its batch-mates or
the device. Batches are fixed slices of the planned image list; a resumed run regenerates a whole slice when
any image of it is missing (writing only the missing ones), so batch composition - and hence numerics - match
an uninterrupted run.

Resumability: images are written to a temporary ``.~`` name and renamed, so no partial image survives a kill.
An image is skipped when it decodes at the planned size and its content key (prompt, negative prompt, seed,
generator settings), kept in ``<out>/.~syn-state.json``, is unchanged; otherwise it is regenerated.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from isood.errors import IsoodError, MissingWeightsError

DEFAULT_PIPELINE = "stabilityai/sdxl-turbo"
LOCAL_PREFIX = "local-dir:"
STATE_FILE = ".~syn-state.json"
_TMP_PREFIX = ".~"
_REJECT_SUFFIX = ".rejected"


@dataclass(frozen=True)
class GeneratorSettings:
    """What determines an image besides its prompt and seed (plus the batch size, which does not)."""

    pipeline: str = DEFAULT_PIPELINE
    steps: int = 1
    guidance_scale: float = 0.0
    size: int = 512
    batch_size: int = 4
    device: str | None = None  # None: cuda when available, else cpu

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise IsoodError(f"--steps must be >= 1, got {self.steps}")
        if self.size < 8 or self.size % 8:
            raise IsoodError(f"--size must be a positive multiple of 8 (SDXL latents are 1/8 scale), got {self.size}")
        if self.batch_size < 1:
            raise IsoodError(f"--batch-size must be >= 1, got {self.batch_size}")


def resolve_device(device: str | None) -> str:
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise IsoodError(f"--device {device}: CUDA is not available here; pass --device cpu")
    return str(device)


def _dtype_for(device: str):
    import torch

    return torch.float16 if device.startswith("cuda") else torch.float32


def load_pipeline(spec: str = DEFAULT_PIPELINE, device: str | None = None):
    """A diffusers text-to-image pipeline on ``device`` (fp16 on CUDA). Missing/offline weights ->
    :class:`MissingWeightsError` in one line naming ``--pipeline local-dir:PATH``."""
    import torch
    from diffusers import AutoPipelineForText2Image

    device = resolve_device(device)
    kwargs: dict[str, Any] = {"torch_dtype": _dtype_for(device)}
    cuda = device.startswith("cuda")
    if spec.startswith(LOCAL_PREFIX):
        path = Path(spec[len(LOCAL_PREFIX):]).expanduser()
        if not (path / "model_index.json").is_file():
            raise MissingWeightsError(
                f"--pipeline {spec}: {path} has no model_index.json; pass a folder written by save_pretrained "
                "or a downloaded snapshot of stabilityai/sdxl-turbo"
            )
        weights = [q.name for q in path.rglob("*") if q.suffix in (".safetensors", ".bin")]
        has_fp16 = any(".fp16." in n for n in weights)
        if has_fp16 and (cuda or all(".fp16." in n for n in weights)):  # a snapshot with only fp16 files: cast up on CPU
            kwargs["variant"] = "fp16"
        source, kwargs["local_files_only"] = str(path), True
    else:
        source = spec
        if cuda:
            kwargs["variant"] = "fp16"
    try:
        with warnings.catch_warnings():  # newer diffusers rename torch_dtype to dtype; older ones only know torch_dtype
            warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
            pipe = AutoPipelineForText2Image.from_pretrained(source, **kwargs)
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as e:  # hub / cache / offline errors come in many types
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        if spec.startswith(LOCAL_PREFIX):
            raise MissingWeightsError(f"cannot load the pipeline in {source} ({reason}); pass --pipeline local-dir:PATH "
                                      "to a complete diffusers folder") from None
        raise MissingWeightsError(
            f"cannot load SDXL pipeline {spec!r} (offline or not in the local Hugging Face cache: {reason}); "
            "download it where there is internet and pass --pipeline local-dir:PATH"
        ) from None
    pipe = pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


class SDXLGenerator:
    """Calls a diffusers pipeline on a batch: ``generator(prompts, negative_prompts, seeds) -> [(image, flag)]``.

    ``flag`` is a rejection reason from the pipeline's own safety checker (pipelines that have one) or None.
    ``calls`` counts pipeline invocations.
    """

    def __init__(self, pipe, settings: GeneratorSettings):
        self.pipe = pipe
        self.settings = settings
        self.calls = 0

    @classmethod
    def load(cls, settings: GeneratorSettings) -> "SDXLGenerator":
        return cls(load_pipeline(settings.pipeline, settings.device), settings)

    @property
    def fingerprint(self) -> dict[str, Any]:
        """Settings that change image content (batch size and device placement do not, by design)."""
        dtype = getattr(self.pipe, "dtype", None)
        return {
            "pipeline": self.settings.pipeline,
            "pipeline_class": type(self.pipe).__name__,
            "steps": self.settings.steps,
            "guidance_scale": float(self.settings.guidance_scale),
            "size": self.settings.size,
            "dtype": str(dtype).replace("torch.", "") if dtype is not None else "unknown",
        }

    def __call__(self, prompts: Sequence[str], negative_prompts: Sequence[str], seeds: Sequence[int]):
        import torch

        s = self.settings
        generators = [torch.Generator("cpu").manual_seed(int(seed)) for seed in seeds]
        self.calls += 1
        out = self.pipe(
            prompt=list(prompts),
            negative_prompt=list(negative_prompts),
            num_inference_steps=s.steps,
            guidance_scale=s.guidance_scale,
            height=s.size,
            width=s.size,
            generator=generators,
        )
        flags = getattr(out, "nsfw_content_detected", None) or [False] * len(out.images)
        return [(img, "pipeline safety checker" if flag else None) for img, flag in zip(out.images, flags)]


# ------------------------------------------------------------------------------------------- files
def png_bytes(image, text: Mapping[str, str] | None = None) -> bytes:
    """Deterministic PNG encoding (same pixels + text -> same bytes); ``text`` goes into tEXt chunks."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for k, v in (text or {}).items():
        info.add_text(k, str(v))
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write to ``.~<name>.tmp`` beside ``path``, fsync, rename: a kill leaves the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_valid_image(path: Path, size: int | None = None) -> bool:
    """True when ``path`` decodes as an image (of ``size`` x ``size`` when given)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            return size is None or im.size == (size, size)
    except Exception:
        return False


def _reject_marker(path: Path) -> Path:
    return path.with_name(f"{_TMP_PREFIX}{path.name}{_REJECT_SUFFIX}")


def content_key(prompt: str, negative_prompt: str, seed: int, fingerprint: Mapping[str, Any]) -> str:
    blob = json.dumps([prompt, negative_prompt, int(seed), dict(fingerprint)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


# ------------------------------------------------------------------------------------------- generation
@dataclass
class GenerationResult:
    """What one generation run did. ``sha256``: path -> hash of every accepted image (new or kept)."""

    generated: int = 0
    skipped: int = 0
    batches: int = 0
    seconds: float = 0.0
    sha256: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # path -> reason

    @property
    def images_per_second(self) -> float:
        return self.generated / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("sha256")
        d["rejected"] = len(self.rejected)
        d["images_per_second"] = round(self.images_per_second, 3)
        d["seconds"] = round(self.seconds, 3)
        return d


def _clean_temporaries(images_dir: Path) -> None:
    if images_dir.is_dir():
        for p in images_dir.rglob(f"{_TMP_PREFIX}*.tmp"):
            p.unlink(missing_ok=True)


def _progress(enabled: bool, total: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]generating"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:.2f} images/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


def prepare_outputs(plan: pd.DataFrame, root: str | Path, fingerprint: Mapping[str, Any],
                    size: int) -> tuple[list[dict], set[str], GenerationResult]:
    """Before generating ``plan`` into ``root``: drop temporaries and images made for another content key,
    record the keys (``.~syn-state.json``), and find what is already done. Returns ``(rows, done paths,
    result with skipped/rejected filled)``. Shared by the local loop and the Ray engine."""
    root = Path(root)
    _clean_temporaries(root / "images")
    rows = plan.to_dict("records")
    keys = {r["path"]: content_key(r["prompt"], r["negative_prompt"], r["seed"], fingerprint) for r in rows}
    if len(keys) != len(rows):
        raise IsoodError("generate_images: the plan has duplicate image paths")

    state_path = root / STATE_FILE
    try:
        old_keys = json.loads(state_path.read_text()).get("keys", {}) if state_path.is_file() else {}
    except (json.JSONDecodeError, OSError, AttributeError):
        old_keys = {}
    for rel, key in keys.items():  # an image made for another prompt/seed/setting is not valid: drop it first
        if old_keys.get(rel) != key:
            (root / rel).unlink(missing_ok=True)
            _reject_marker(root / rel).unlink(missing_ok=True)
    write_file_atomic(state_path, json.dumps({"format": "isood.syn-state/1", "fingerprint": dict(fingerprint),
                                              "keys": keys}, sort_keys=True).encode())

    result = GenerationResult()
    done: set[str] = set()
    for r in rows:
        p = root / r["path"]
        marker = _reject_marker(p)
        if marker.is_file():
            result.rejected[r["path"]] = marker.read_text().strip() or "rejected"
            done.add(r["path"])
        elif p.is_file() and is_valid_image(p, size):
            done.add(r["path"])
    result.skipped = len(done)
    return rows, done, result


def write_outputs(root: str | Path, chunk: Sequence[dict], outputs, done: set[str], result: GenerationResult,
                  image_checker: Callable | None = None, on_image: Callable[[dict], None] | None = None,
                  on_written: Callable[[], None] | None = None) -> None:
    """Write one generator call's ``outputs`` for the planned ``chunk`` rows: accepted images as PNG (atomic),
    rejected ones as markers; rows already in ``done`` are skipped. Updates ``done`` and ``result``."""
    root = Path(root)
    for r, (image, flag) in zip(chunk, outputs):
        if r["path"] in done:
            continue
        p = root / r["path"]
        reason = flag or (image_checker(image, r) if image_checker is not None else None)
        if reason:
            write_file_atomic(_reject_marker(p), str(reason).encode())
            result.rejected[r["path"]] = str(reason)
        else:
            data = png_bytes(image, {"prompt": r["prompt"], "negative_prompt": r["negative_prompt"],
                                     "seed": r["seed"], "isood": "syn-is"})
            write_file_atomic(p, data)
            result.sha256[r["path"]] = hashlib.sha256(data).hexdigest()
            result.generated += 1
        done.add(r["path"])
        if on_written is not None:
            on_written()
        if on_image is not None and not reason:
            on_image(r)


def finish_hashes(rows: Sequence[dict], root: str | Path, result: GenerationResult) -> GenerationResult:
    """Hash every accepted image not generated in this run (kept from an earlier one)."""
    from manifests import sha256_file

    for r in rows:
        rel = r["path"]
        if rel not in result.rejected and rel not in result.sha256:
            result.sha256[rel] = sha256_file(Path(root) / rel)
    return result


def generate_images(
    plan: pd.DataFrame,
    root: str | Path,
    generator: Callable,
    *,
    fingerprint: Mapping[str, Any],
    size: int,
    batch_size: int = 4,
    image_checker: Callable | None = None,
    on_image: Callable[[dict], None] | None = None,
    progress: bool = True,
) -> GenerationResult:
    """Generate the planned images into ``root`` (``plan`` columns: path, prompt, negative_prompt, seed, ...).

    Skips images already present and valid for the same content key; rejected items (``image_checker`` or the
    pipeline's checker) are not written, and are remembered (a ``.~<name>.rejected`` marker) so a rerun does
    not regenerate them. ``on_image(row)`` is called after each image is written (tests use it to interrupt).
    """
    rows, done, result = prepare_outputs(plan, root, fingerprint, size)
    t0 = time.perf_counter()
    with _progress(progress, len(rows)) as bar:
        task = bar.add_task("generate", total=len(rows), completed=len(done), rate=0.0)

        def tick() -> None:
            elapsed = time.perf_counter() - t0
            bar.update(task, advance=1, rate=result.generated / elapsed if elapsed > 0 else 0.0)

        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            if all(r["path"] in done for r in chunk):
                continue
            outputs = generator([r["prompt"] for r in chunk], [r["negative_prompt"] for r in chunk],
                                [r["seed"] for r in chunk])
            result.batches += 1
            write_outputs(root, chunk, outputs, done, result, image_checker, on_image, tick)
    result.seconds = time.perf_counter() - t0
    return finish_hashes(rows, root, result)


def prune_images(root: str | Path, keep: set[str]) -> int:
    """Delete files under ``<root>/images`` that are neither in ``keep`` nor a marker of a kept path; returns
    the number removed (images of an earlier plan no longer wanted). Empty folders are removed too."""
    root = Path(root)
    images_dir = root / "images"
    if not images_dir.is_dir():
        return 0
    keep_all = set(keep) | {_reject_marker(root / k).relative_to(root).as_posix() for k in keep}
    removed = 0
    for p in sorted(images_dir.rglob("*")):
        if p.is_file() and p.relative_to(root).as_posix() not in keep_all:
            p.unlink()
            removed += 1
    for d in sorted((d for d in images_dir.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    return removed
