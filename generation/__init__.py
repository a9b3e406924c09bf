"""Syn-IS: SDXL style x ImageNet label prompts, binned by their semantic/covariate shift, generated with
SDXL-Turbo (``isood generate-syn``). The synthesis library: styles (style sets), prompts (ids, binning, sampling,
the image plan), safety (prompt blocklist, image checkers), outputs (image files, content keys, resume state),
pipeline (the SDXL-Turbo settings and loading), fingerprint (what the images are keyed with), sdxl (the diffusers
generator and its engine worker). The ``generate-syn`` stage that uses it is ``isood.stages.syn``; labels come from
``isood.features.labels``."""

from generation.prompts import build_prompts, expand_images, image_seed, prompt_id, sample_per_cell
from generation.safety import DEFAULT_BLOCKLIST, PromptBlocklist, load_image_checker
from generation.pipeline import GeneratorSettings, load_pipeline
from generation.sdxl import GeneratorWorker, SDXLGenerator, generate_images
from generation.styles import SDXL_STYLES, Style, StyleError, load_styles

__all__ = [
    "DEFAULT_BLOCKLIST", "GeneratorSettings", "GeneratorWorker", "PromptBlocklist", "SDXLGenerator", "SDXL_STYLES",
    "Style", "StyleError", "build_prompts", "expand_images", "generate_images", "image_seed", "load_image_checker",
    "load_pipeline", "load_styles", "prompt_id", "sample_per_cell",
]
