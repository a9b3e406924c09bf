"""The `isood generate-syn` stage: styles x labels -> binned prompts -> SDXL-Turbo images -> a Syn-IS manifest.

Steps (IS-OOD, Syn-IS), one module each: ``options`` (SynOptions and their checks), ``load`` (styles, labels,
blocklist, the image splits through their typed view, the ID image features, CLIP, LAID given / from the splits /
trained on labels x CLIP templates; measuring each prompt's D_sem / D_cov through LAID), ``edges`` (pure: the
edges of ``--prompt-edges``, the prompts' own by default, and the check that they spread the prompts), ``steps``
(pure: bin with those edges, sample K prompts per cell, expand to M images per prompt, the cells, rejected and
merged tables), ``stage`` (the run: generation through an ``isood.core.engine.BatchEngine``) and
``write`` (the manifest; a job-array task's part; the merge of the parts). A job-array task (``--num-shards N
--shard-index i``) generates the pipeline batches ``b % N == i`` and writes a ``syn-is-part`` manifest;
:func:`merge_parts` combines the parts into the bytes a single run writes (the CLI maps kind ``syn-is`` to it).

Output directory::

    manifest.json, README.md             (kind syn-is; --prompts-only: kind syn-is-prompts, no card)
    data/images.parquet                  path, prompt, negative_prompt, style, wnid, label, prompt_id,
                                         image_index, seed, d_sem, d_cov, sem_level, cov_level, cell, sha256
    data/prompts.parquet                 every candidate prompt with its shift, levels and `selected`
    data/cells.parquet                   cell, cov_level, sem_level, n (images), na, prompts_available, prompts_sampled
    data/edges.parquet                   axis (sem|cov), level, lower, upper (the splits format)
    data/rejected.parquet                stage (prompt|image), path, prompt_id, style, wnid, label, prompt, reason
    laid.safetensors (+ laid.json)       the LAID map used
    lists/cov_{c}_sem_{s}.txt            image paths per non-empty cell
    images/<style>/<prompt_id>_<i>.png   the images
"""

from isood.stages.syn.options import KIND, KIND_PART, KIND_PROMPTS, SynOptions, SynResult, check_options
from isood.stages.syn.stage import run_generate_syn
from isood.stages.syn.steps import IMAGE_COLUMNS, REJECTED_COLUMNS
from isood.stages.syn.write import merge_parts, write_part, write_syn_manifest

__all__ = [
    "KIND", "KIND_PART", "KIND_PROMPTS", "IMAGE_COLUMNS", "REJECTED_COLUMNS", "SynOptions", "SynResult",
    "check_options", "run_generate_syn", "write_syn_manifest", "write_part", "merge_parts",
]
