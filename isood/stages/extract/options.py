"""The options of `isood extract`, one description each (``isood.core.optspec``)."""

from __future__ import annotations

from dataclasses import dataclass

from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import (EngineFields, JobArrayFields, batch_size_option, decode_processes_option,
                                       device_option, out_option, shard_size_option)
from isood.features.clip import ClipEncoder
from isood.features.decoding import DECODE_MODES, REFERENCE_DECODE

__all__ = ["ExtractOptions"]


@dataclass(frozen=True, kw_only=True)
class ExtractOptions(EngineFields, JobArrayFields):
    """What ``isood extract`` is asked, one description per option (``isood.core.optspec``): the images (dataset root
    or file list), the CLIP (``--clip`` name, or a loaded ``ClipEncoder`` from Python), the output directory,
    sizes, ``decode_processes`` per model worker (``isood.core.workers``), device, the job-array task (``num_shards``,
    ``shard_index``), the decoding mode (``decode``: one of ``isood.features.decoding.DECODE_MODES``) and ``follow_symlinks``
    (also read files whose links lead outside the image root; by default they are rejected, see
    ``isood.features.listing``). The engine fields name the engine the command builds (the stage takes it built)."""

    images: str = option(REQUIRED, kind="path", help="Images: a dataset root with wnid subfolders, or a file list "
                                                     "(one path per line).")
    clip: str | ClipEncoder = option(REQUIRED, kind="str", objects=True, metavar="MODEL:PRETRAINED",
                                     help="CLIP encoder: MODEL:PRETRAINED (e.g. ViT-B-32:openai), local-dir:PATH or "
                                          "hf-hub:ORG/REPO.")
    out: str = out_option("Output directory (features manifest; rerun to resume).")
    batch_size: int = batch_size_option()
    decode_processes: int | None = decode_processes_option("with --engine ray: decoding threads of each actor, "
                                                           "default 4; the features do not depend on it")
    shard_size: int = shard_size_option("Images per features-NNNNN.npy shard (the unit of resuming).")
    device: str | None = device_option("AMP on CUDA")
    decode: str = option(REFERENCE_DECODE, choices=DECODE_MODES, metavar="MODE",
                         help="Image decoding: reference (PIL + the model's own preprocessing, comparable across "
                              "runs); fast (large JPEGs decoded at reduced size, resizing on uint8 tensors); gpu "
                              "(JPEGs decoded in one batched torchvision decode_jpeg call per batch on the model's "
                              "--device, nvJPEG on CUDA, then resized, cropped and normalised there; other files "
                              "(PNG, CMYK, cut short) by the reference path; with --device cpu the same batched code "
                              "runs on the CPU). fast and gpu keep cosine >= 0.999 to the reference features "
                              "(bench/decode.py on the CPU; bench/gpu_extract.py measures nvJPEG's); the mode is "
                              "recorded in the manifest and shards of different modes never mix.")
    follow_symlinks: bool = option(False, help="Also read images whose symlinks lead outside the --images root "
                                               "(default: listed in the rejected table, since manifest paths "
                                               "promise files inside the root).")
    progress: bool = option(True, cli=False, help="Progress bars.")
