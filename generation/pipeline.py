"""The SDXL-Turbo pipeline and its settings: what determines an image, and loading the diffusers pipeline.

Defaults follow SDXL-Turbo's model card: ``stabilityai/sdxl-turbo`` through
``AutoPipelineForText2Image.from_pretrained(name, torch_dtype=float16, variant='fp16')`` on CUDA (float32 on
CPU), 1 step, guidance_scale 0.0, 512x512. ``local-dir:PATH`` loads a saved or downloaded pipeline folder with
``local_files_only=True``. The generator that calls the pipeline is :mod:`generation.sdxl`; the fingerprint its
images are keyed with is :mod:`generation.fingerprint`.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from isood.core.defaults import DEFAULT_PIPELINE
from isood.core.devices import resolve_device
from isood.core.errors import BadInputError, MissingWeightsError, one_line
from isood.core.hub_access import TINY_HINT, hub_access, hub_guard

__all__ = ["DEFAULT_PIPELINE", "LOCAL_PREFIX", "MAX_SIZE", "PIPELINE_HINT", "GeneratorSettings", "dtype_for",
           "quiet_libraries", "load_pipeline"]

LOCAL_PREFIX = "local-dir:"
#: What to pass instead of a Hub name that cannot be loaded.
PIPELINE_HINT = ("pass --pipeline local-dir:PATH (a folder written by save_pretrained or a downloaded snapshot of "
                 f"{DEFAULT_PIPELINE}, {TINY_HINT})")
#: The largest --size: 8x SDXL-Turbo's 512 and 4x SDXL's 1024 (a 4096 x 4096 image already needs ~10 GB of
#: VAE activations; 100000 would ask for tens of GB before the first step).
MAX_SIZE = 4096


@dataclass(frozen=True)
class GeneratorSettings:
    """What determines an image besides its prompt and seed (plus the batch size and device, which do not)."""

    pipeline: str = DEFAULT_PIPELINE
    steps: int = 1
    guidance_scale: float = 0.0
    size: int = 512
    batch_size: int = 4
    device: str | None = None  # None: cuda when available, else cpu

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise BadInputError(f"--steps must be >= 1, got {self.steps}")
        if self.size < 8 or self.size > MAX_SIZE or self.size % 8:
            raise BadInputError(f"--size must be a multiple of 8 from 8 to {MAX_SIZE} (SDXL latents are 1/8 scale; "
                                f"SDXL-Turbo is made for 512, SDXL for 1024), got {self.size}")
        if not math.isfinite(self.guidance_scale) or self.guidance_scale < 0:
            raise BadInputError(f"--guidance-scale must be a finite number >= 0 (SDXL-Turbo: 0), got "
                                f"{self.guidance_scale}")
        if self.batch_size < 1:
            raise BadInputError(f"--batch-size must be >= 1, got {self.batch_size}")


def dtype_for(device: str):
    """The pipeline's torch dtype on ``device``: float16 on CUDA, float32 elsewhere."""
    import torch

    return torch.float16 if str(device).startswith("cuda") else torch.float32


def _local_kwargs(spec: str, cuda: bool) -> tuple[str, dict[str, Any]]:
    path = Path(spec[len(LOCAL_PREFIX):]).expanduser()
    if not (path / "model_index.json").is_file():
        raise MissingWeightsError(f"--pipeline {spec}: {path} has no model_index.json; pass a folder written by "
                                  "save_pretrained or a downloaded snapshot of stabilityai/sdxl-turbo")
    weights = [q.name for q in path.rglob("*") if q.suffix in (".safetensors", ".bin")]
    kwargs: dict[str, Any] = {"local_files_only": True}
    if any(".fp16." in n for n in weights) and (cuda or all(".fp16." in n for n in weights)):
        kwargs["variant"] = "fp16"  # a snapshot with only fp16 files: cast up on CPU
    return str(path), kwargs


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """diffusers' and transformers' log lines below errors, their progress bars ("Loading pipeline
    components", "Loading weights") and Python warnings are silenced inside, so that only isood's lines and bars
    reach the terminal (their errors still raise); the libraries' settings are restored on the way out."""
    from diffusers.utils import logging as diffusers_logging

    libs = [diffusers_logging]
    try:
        from transformers.utils import logging as transformers_logging

        libs.append(transformers_logging)
    except ImportError:  # pragma: no cover - transformers comes with every SDXL pipeline
        pass
    saved = [(lib, lib.get_verbosity(), lib.is_progress_bar_enabled()) for lib in libs]
    for lib in libs:
        lib.set_verbosity_error()
        lib.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lib, verbosity, bar in saved:
            lib.set_verbosity(verbosity)
            (lib.enable_progress_bar if bar else lib.disable_progress_bar)()


def load_pipeline(spec: str = DEFAULT_PIPELINE, device: str | None = None):
    """A diffusers text-to-image pipeline on ``device`` (fp16 on CUDA). Missing/offline weights ->
    :class:`MissingWeightsError` in one line naming ``--pipeline local-dir:PATH`` (a Hub name fails in about a
    second when the Hub is out of reach, naming ``HF_HUB_OFFLINE``: ``isood.core.hub_access``)."""
    import torch
    from diffusers import AutoPipelineForText2Image

    device = resolve_device(device)
    cuda = device.startswith("cuda")
    access = None
    if spec.startswith(LOCAL_PREFIX):
        source, kwargs = _local_kwargs(spec, cuda)
    else:
        source, kwargs = spec, ({"variant": "fp16"} if cuda else {})
        access = hub_access()  # a Hub name: fail in a second when the Hub is out of reach
    try:
        # e.g. newer diffusers rename torch_dtype to dtype; older ones only know torch_dtype
        with quiet_libraries(), (contextlib.nullcontext() if access is None else hub_guard(access)):
            pipe = AutoPipelineForText2Image.from_pretrained(source, torch_dtype=dtype_for(device), **kwargs)
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as e:  # hub / cache / offline errors come in many types
        reason = one_line((str(e).strip().splitlines() or [type(e).__name__])[0])
        if access is None:
            raise MissingWeightsError(f"cannot load the pipeline in {source} ({reason}); pass --pipeline "
                                      "local-dir:PATH to a complete diffusers folder") from None
        raise MissingWeightsError(access.missing(f"--pipeline {spec}", PIPELINE_HINT, e)) from None
    pipe = pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe
