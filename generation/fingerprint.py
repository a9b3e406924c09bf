"""The fingerprint Syn-IS images are keyed with: the generator settings that change an image's content, and for a
local pipeline folder the content of its weights.

:func:`generator_fingerprint` is the one builder: a loaded generator's (``SDXLGenerator.fingerprint``), the one
expected before any worker has loaded the pipeline (:func:`expected_fingerprint`, from its model_index.json) and
a run's (:func:`plan_fingerprint`) all come from it. Files, content keys and markers: ``generation.outputs``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

from generation.pipeline import LOCAL_PREFIX, PIPELINE_HINT, GeneratorSettings, dtype_for
from isood.core.content import folder_fingerprint
from isood.core.devices import explicit_device, resolve_device
from isood.core.engine import BatchEngine, LocalEngine
from isood.core.errors import BadInputError, MissingWeightsError, one_line
from isood.core.hub_access import hub_access, hub_guard

__all__ = ["pipeline_weights", "generator_fingerprint", "expected_fingerprint", "fingerprint_of", "plan_fingerprint"]

#: The files of a pipeline folder that shape its images: weights, configs, tokenizer and scheduler files, custom
#: pipeline code (READMEs, licences in Markdown and sample pictures do not).
_PIPELINE_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".onnx", ".json", ".txt",
                                ".model", ".py"})


def _pipeline_file(p: Path) -> bool:
    return p.suffix in _PIPELINE_SUFFIXES


def pipeline_weights(spec: str) -> str | None:
    """The content fingerprint of a ``local-dir:PATH`` pipeline: ``isood.core.content.folder_fingerprint`` of its
    weights, configs and tokenizer files in every subfolder (hashed once, then read again only when a file's
    stat changes), so new weights saved into the same folder are another generator. None for a Hub name (keyed
    by its name)."""
    if not spec.startswith(LOCAL_PREFIX):
        return None
    folder = Path(spec[len(LOCAL_PREFIX):]).expanduser()
    return folder_fingerprint(folder, _pipeline_file, recursive=True) if folder.is_dir() else None


def generator_fingerprint(settings: GeneratorSettings, *, pipeline_class: str, dtype: Any,
                          weights: str | None = None) -> dict[str, Any]:
    """The settings that change image content (batch size and device placement do not, by design), and for a
    local pipeline folder the content of its weights (``weights``, default ``pipeline_weights``): the one
    builder behind :attr:`generation.sdxl.SDXLGenerator.fingerprint` and :func:`expected_fingerprint`."""
    fingerprint = {
        "pipeline": settings.pipeline,
        "pipeline_class": pipeline_class,
        "steps": settings.steps,
        "guidance_scale": float(settings.guidance_scale),
        "size": settings.size,
        "dtype": str(dtype).replace("torch.", "") if dtype is not None else "unknown",
    }
    weights = weights if weights is not None else pipeline_weights(settings.pipeline)
    if weights is not None:
        fingerprint["weights"] = weights
    return fingerprint


def expected_fingerprint(settings: GeneratorSettings, device: str) -> dict[str, Any]:
    """The fingerprint a generator loaded from ``settings`` on ``device`` will have, computed from the
    pipeline's model_index.json without loading weights: the driver keys the images with it before any worker
    (e.g. a Ray actor) has started; each worker checks its own against it."""
    from diffusers import DiffusionPipeline

    spec = settings.pipeline
    local = spec.startswith(LOCAL_PREFIX)
    source = str(Path(spec[len(LOCAL_PREFIX):]).expanduser()) if local else spec
    access = None if local else hub_access()
    try:
        with contextlib.nullcontext() if access is None else hub_guard(access):
            config = DiffusionPipeline.load_config(source, local_files_only=local or None)
    except Exception as e:
        if access is None:
            raise MissingWeightsError(f"cannot read the pipeline config of {spec!r} ({one_line(e, 160)}); "
                                      "pass --pipeline local-dir:PATH to a diffusers folder") from None
        raise MissingWeightsError(access.missing(f"--pipeline {spec}", PIPELINE_HINT, e)) from None
    name = config.get("_class_name", "unknown")
    try:  # AutoPipelineForText2Image loads the text-to-image class of the family
        from diffusers.pipelines.auto_pipeline import AUTO_TEXT2IMAGE_PIPELINES_MAPPING, _get_task_class

        name = _get_task_class(AUTO_TEXT2IMAGE_PIPELINES_MAPPING, name).__name__
    except Exception:
        pass
    device = explicit_device(device) or resolve_device(device)  # an explicit one may be a cluster's, not ours
    return generator_fingerprint(settings, pipeline_class=name, dtype=dtype_for(device))


def fingerprint_of(generator: Callable, settings: GeneratorSettings) -> dict[str, Any]:
    """A given generator's fingerprint: its ``fingerprint`` attribute, else (a plain callable) its type name
    with the size and steps."""
    fp = getattr(generator, "fingerprint", None)
    if fp is not None:
        return dict(fp)
    return {"generator": type(generator).__name__, "size": settings.size, "steps": settings.steps}


def plan_fingerprint(settings: GeneratorSettings, *, generator: Callable | None = None,
                     engine: BatchEngine | None = None) -> dict[str, Any]:
    """The fingerprint the images of a run are keyed with: the given ``generator``'s (local engine only), else
    the :func:`expected_fingerprint` of ``settings`` on the engine's workers' device."""
    engine = engine or LocalEngine()
    if generator is not None:
        if engine.name != "local":
            raise BadInputError(f"a custom generator runs only with the local engine, not {engine.name!r}")
        return fingerprint_of(generator, settings)
    return expected_fingerprint(settings, engine.device_name(settings.device))

