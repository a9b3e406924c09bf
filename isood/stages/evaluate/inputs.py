"""What an ``isood evaluate`` run reads before any model loads: every OOD set's manifest (``--splits``, ``--syn``,
``--ood``), read through ``manifests.read(path, kind=...)`` and verified, with the folder its image paths are
relative to; whether the ID and test data are image folders or precomputed outputs; the ``--leak-audit`` manifest
and the leaking images it marks; and every path the run reads (the output folder may be none of them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

import manifests
from isood.classifiers.classes import wnids_of
from isood.core.defaults import DEFAULT_VERIFY
from isood.core.errors import BadInputError, IsoodError, ManifestError
from isood.kinds import AUDIT, IMAGE_LIST, SPLITS, SYN_IS, AuditView
from wordnet_tools.rules import leak_mask, parse_rules

from .assemble import EvalSet
from .options import SPLITS_SET, EvaluateOptions, OodSpec, named_values, ood_sets
from .outputs import is_outputs_dir

__all__ = ["EVALUABLE_KINDS", "OodInput", "load_grid", "load_ood_inputs", "check_roots", "input_kind",
           "load_leak_audit", "leak_masks", "paths_read"]

#: The manifest kinds an OOD set may be (``--ood``): grids and image lists.
EVALUABLE_KINDS = (SPLITS, SYN_IS, IMAGE_LIST)
_FLAG_KINDS = {"--splits": SPLITS, "--syn": SYN_IS}


@dataclass
class OodInput:
    """One OOD set: its ``spec`` (name, manifest path, group, flag), the manifest's typed ``view``, its ``kind``
    and ``root`` (the folder its image paths are relative to; None when unknown)."""

    spec: OodSpec
    view: Any
    kind: str
    root: Path | None


def load_grid(path: str | Path, kind, flag: str, *, verify: str = DEFAULT_VERIFY):
    """The typed view of a manifest of ``kind`` (a kind or several), refused when it fails verification
    (``verify``: 'fast' or 'full') or is of another kind (the error names ``flag``)."""
    try:
        return manifests.read(path, kind=kind, verify=verify)
    except ManifestError as e:
        raise type(e)(f"{flag}: {e}") from None


def load_ood_inputs(opts: EvaluateOptions) -> dict[str, OodInput]:
    """Every OOD set of the run (``options.ood_sets``), its manifest read and verified (``--splits``: a splits
    manifest, ``--syn``: a Syn-IS one, ``--ood``: any of ``EVALUABLE_KINDS``) and its image root: ``--ood-root
    NAME=DIR``, else ``--test-root`` (for ``--splits``), a splits manifest's ``test_root``, a Syn-IS manifest's
    folder; None for an image list without ``--ood-root``."""
    specs = ood_sets(opts)
    roots = named_values(opts.ood_root, "--ood-root", known={s.name for s in specs})
    out = {}
    for spec in specs:
        view = load_grid(spec.path, _FLAG_KINDS.get(spec.flag, EVALUABLE_KINDS), spec.flag, verify=opts.verify)
        root = roots.get(spec.name)
        if root is None and view.kind == SPLITS:
            root = opts.test_root if spec.name == SPLITS_SET and opts.test_root else view.test_root
        elif root is None and view.kind == SYN_IS:
            root = str(view.root)
        out[spec.name] = OodInput(spec, view, view.kind, Path(root) if root else None)
    return out


def check_roots(inputs: Mapping[str, OodInput]) -> None:
    """Every OOD set has an image root (before the model loads)."""
    for name, inp in inputs.items():
        if inp.root is not None:
            continue
        if name == SPLITS_SET and inp.spec.flag == "--splits":
            raise BadInputError(f"--splits {inp.view.root} records no test_root: pass --test-root (the folder its "
                                "image paths are relative to)")
        what = "an image-list manifest records no image folder" if inp.kind == IMAGE_LIST else \
            f"{inp.view.root} records no test_root"
        raise BadInputError(f"{inp.spec.flag}: {what}: pass --ood-root {name}=DIR (the folder its image paths are "
                            "relative to)")


def input_kind(opts: EvaluateOptions, test_root: str | None) -> str:
    """'outputs' when ``--id-train``, ``--id-test`` and the test root are all precomputed-outputs folders,
    'images' when none is; anything else is an error."""
    precomputed = [is_outputs_dir(p) for p in (opts.id_train, opts.id_test, test_root)]
    if any(precomputed) and not all(precomputed):
        raise BadInputError("--id-train, --id-test and --test-root must all be image folders or all precomputed "
                            "outputs folders (index.parquet + logits.npy)")
    if all(precomputed) and (opts.sanity_random_model or opts.syn):
        raise BadInputError("--sanity-random-model and --syn need a model and images: pass image folders and --model")
    if all(precomputed) and (opts.ood or opts.splits is None):
        raise BadInputError("--ood needs a model and images: precomputed outputs evaluate --splits only; pass image "
                            "folders and --model")
    return "outputs" if all(precomputed) else "images"


def load_leak_audit(opts: EvaluateOptions) -> AuditView | None:
    """The ``--leak-audit`` manifest (kind ``audit``), or None; ``--leak-rules`` is checked here too."""
    if opts.leak_audit is None:
        return None
    parse_rules(opts.leak_rules, option="--leak-rules")
    try:
        view = manifests.read(opts.leak_audit, kind=AUDIT, verify=opts.verify)
    except ManifestError as e:
        raise type(e)(f"--leak-audit: {e}") from None
    assert isinstance(view, AuditView)  # read(kind=AUDIT) returns the kind's registered view
    return view


def leak_masks(audit: AuditView | None, sets: Mapping[str, EvalSet], rules: str) -> dict[str, np.ndarray] | None:
    """The leaking images of every dataset of the splits manifest (aligned with its rows), from the audit's class
    verdicts; a class the audit has no verdict for is a one-line error naming it, and so are rules that flag
    every image of a dataset (its leak-free copy would hold nothing: pass fewer --leak-rules)."""
    if audit is None:
        return None
    parsed = parse_rules(rules, option="--leak-rules")
    masks = {}
    for name, s in sets.items():
        if s.grid != SPLITS_SET:
            continue
        mask = leak_mask(wnids_of(s.images), audit.class_rules(), rules=parsed, where=f"--leak-audit {audit.root}")
        if mask.size and mask.all():
            verdicts = ", ".join(sorted(v for v in set(audit.class_rules().values()) if v))
            raise BadInputError(f"--leak-rules {','.join(parsed)} flag all {mask.size} images of {name} as leaks: "
                                f"nothing is left to evaluate leak-free; pass fewer rules (among {verdicts}) or "
                                "drop --leak-audit")
        masks[name] = mask
    return masks


def _named_roots(manifest: str) -> list[str]:
    """The image roots a manifest's view names (``test_root``, ``id_root``, ``image_root``; [] for a folder that
    is no readable manifest of an evaluable kind, which the run refuses later with its own message)."""
    try:
        view = manifests.read(manifest, kind=EVALUABLE_KINDS)
    except (IsoodError, OSError):
        return []
    roots = (getattr(view, name, None) for name in ("test_root", "id_root", "image_root"))
    return [str(r) for r in roots if r]


def paths_read(opts: EvaluateOptions) -> list[str]:
    """Every path the run reads, the roots its manifests name included (the output folder may be none of them,
    nor inside one)."""
    named = [v for _, _, v in (str(t).partition("=") for t in (*opts.ood, *opts.ood_root))]
    manifests_read = [opts.splits, opts.syn, *[v for _, _, v in (str(t).partition("=") for t in opts.ood)]]
    roots = [r for m in manifests_read if m for r in _named_roots(m)]
    paths = [opts.splits, opts.syn, opts.leak_audit, opts.id_train, opts.id_test, opts.test_root, opts.checkpoint,
             opts.id_test_root, opts.id_test_labels, *named, *roots]
    return [p for p in paths if p]
