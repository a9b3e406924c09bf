"""Syn-IS: SDXL style x ImageNet label prompts, binned by their semantic/covariate shift, generated with
SDXL-Turbo (``isood generate-syn``). Modules: styles (style sets), prompts (labels, ids, binning, sampling),
safety (prompt blocklist, image checkers), sdxl (the diffusers generator), syn (the job)."""

from generation.prompts import build_prompts, expand_images, image_seed, load_labels, prompt_id, sample_per_cell
from generation.safety import DEFAULT_BLOCKLIST, PromptBlocklist, load_image_checker
from generation.sdxl import GeneratorSettings, SDXLGenerator, generate_images, load_pipeline
from generation.styles import SDXL_STYLES, Style, StyleError, load_styles

__all__ = [
    "DEFAULT_BLOCKLIST", "GeneratorSettings", "PromptBlocklist", "SDXLGenerator", "SDXL_STYLES", "Style", "StyleError",
    "build_prompts", "expand_images", "generate_images", "image_seed", "load_image_checker", "load_labels",
    "load_pipeline", "load_styles", "prompt_id", "sample_per_cell",
]
