"""The stage of `isood extract`: images -> CLIP image features in shards -> a ``features`` manifest, resumable, and
the merge of its job-array parts (``options``: its options; ``stage``: the steps and the writer)."""

from isood.stages.extract.options import ExtractOptions
from isood.stages.extract.stage import merge_parts, output_kind, run_extract, validate

__all__ = ["ExtractOptions", "merge_parts", "output_kind", "run_extract", "validate"]
