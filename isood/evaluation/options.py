"""L3: the options of ``isood evaluate`` and their checks, importable without torch, scikit-learn or SciPy.

``check_options`` refuses a bad option with one line before anything is read or loaded: required paths, counts
below their least value, the seed (``isood.defaults.check_seed``), ``--leak-rules``, ``--plot-metrics``,
``--detectors`` (names and parameters, through the detector registry, which loads nothing heavy), ``--decode``
(``isood.images.EVALUATE_DECODE_MODES``), ``--precision`` (``PRECISIONS``) and the form of
``--model py:MODULE:FUNCTION`` (``model_function``). The CLI calls it before it imports the stage, so a bad
option is refused in well under a second; the stage calls it again (Python callers).

The OOD sets (``ood_sets``): ``--splits`` (dataset ``splits``), ``--syn`` (``syn-is``) and any number of
``--ood [GROUP:]NAME=MANIFEST`` (a splits, syn-is or image-list manifest; GROUP ``near`` or ``far`` puts the set
in OpenOOD's group of that name); at least one is needed. ``--ood-root NAME=DIR`` is the folder a set's image
paths are relative to; ``--preprocess PRESET`` / ``NAME=PRESET`` the transform (``preprocess.PRESETS``);
``--table-convention`` Table 1's rule (``conventions.TABLE_CONVENTIONS``). Without ``--id-train`` nothing is
fitted and DER is not computed (a detector that needs fitting is refused).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from isood.defaults import ALL_PLOT_METRICS as ALL_METRICS
from isood.defaults import DEFAULT_DETECTORS, DEFAULT_PLOT_METRICS, DEFAULT_VERIFY, NA_THRESHOLD, OOD_GROUPS
from isood.defaults import check_seed
from isood.devices import DEFAULT_PRECISION, PRECISIONS
from isood.errors import BadInputError
from isood.images import EVALUATE_DECODE_MODES, REFERENCE_DECODE, check_decode_mode
from manifests.verify import check_verify_mode
from wordnet_tools.rules import LEAK_RULES, parse_rules

from . import pytorch_ood  # noqa: F401  (registers the pytorch-ood: name space before --detectors is parsed)
from .conventions import check_convention
from .detectors import Detector, parse_detectors  # re-exported by isood.evaluation (name space registered)
from .metrics import METRICS
from .preprocess import DEFAULT_PRESET, check_preset

__all__ = ["EvaluateOptions", "check_options", "plot_metrics", "model_function", "OodSpec", "ood_sets",
           "named_values", "preprocess_presets", "check_paths", "SPLITS_SET", "SYN_SET", "PRECISIONS",
           "DEFAULT_PRECISION"]  # PRECISIONS, DEFAULT_PRECISION: isood.devices

#: The dataset names of ``--splits`` and ``--syn``.
SPLITS_SET, SYN_SET = "splits", "syn-is"
GROUPS = tuple(OOD_GROUPS)
_RESERVED = {"id_train", "id_test", *OOD_GROUPS.values()}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True, kw_only=True)
class EvaluateOptions:
    """Everything `isood evaluate` takes (CLI flag = field name with - for _)."""

    splits: str | None = None
    out: str | None = None
    id_test: str | None = None
    id_train: str | None = None
    model: str | None = None
    detectors: str = DEFAULT_DETECTORS
    syn: str | None = None
    test_root: str | None = None
    checkpoint: str | None = None
    num_classes: int | None = None
    classes: str | None = None
    batch_size: int = 64
    device: str | None = None
    workers: int = 0
    cache_dir: str | None = None
    sanity_random_model: bool = False
    na_threshold: int = NA_THRESHOLD
    der: bool = True
    plot_metrics: str | None = DEFAULT_PLOT_METRICS
    seed: int = 0
    leak_audit: str | None = None
    leak_rules: str = ",".join(LEAK_RULES)
    verify: str = DEFAULT_VERIFY
    decode: str = REFERENCE_DECODE
    precision: str = DEFAULT_PRECISION
    progress: bool = True
    # -- any benchmark (issue 18): OOD sets by name, their roots, the ID test list's root and labels, the
    #    preprocessing per set, Table 1's convention
    ood: tuple[str, ...] = ()
    ood_root: tuple[str, ...] = ()
    id_test_root: str | None = None
    id_test_labels: str | None = None
    preprocess: tuple[str, ...] = ()
    table_convention: str = "exact"


#: Integer options and their least value (``None`` = the default, allowed where the field is optional).
_LEAST = {"batch_size": 1, "workers": 0, "na_threshold": 1, "num_classes": 1}


def plot_metrics(opts: EvaluateOptions) -> list[str] | str:
    """The metrics to draw: the ``--plot-metrics`` names (default ``DEFAULT_PLOT_METRICS``: AUROC and FPR@95),
    or ``'all'`` (every computed metric), as ``plots.render_plots`` takes them. Every metric is in the tables and
    CSVs whatever is drawn."""
    text = DEFAULT_PLOT_METRICS if opts.plot_metrics is None else str(opts.plot_metrics)
    names = [m.strip() for m in text.split(",") if m.strip()]
    if names == [ALL_METRICS]:
        return ALL_METRICS
    if not names:
        raise BadInputError(f"--plot-metrics is empty: pass metric names (e.g. {DEFAULT_PLOT_METRICS}) or "
                            f"{ALL_METRICS}")
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise BadInputError(f"--plot-metrics {', '.join(unknown)}: unknown metric; pass among {', '.join(METRICS)} "
                            f"(or {ALL_METRICS})")
    return names


def model_function(option: str) -> tuple[str, str]:
    """``(module, function)`` of ``--model py:MODULE:FUNCTION``, or a one-line error saying how to write it."""
    mod, _, attr = option[3:].partition(":")
    if not mod.strip() or not attr.strip() or ":" in attr:
        raise BadInputError(f"--model {option}: write py:package.module:function (a function returning the model)")
    return mod.strip(), attr.strip()


class OodSpec(NamedTuple):
    """One OOD set of an evaluation: its dataset ``name``, the manifest ``path``, its OpenOOD ``group`` ('near',
    'far' or '') and the ``flag`` it came from (for messages)."""

    name: str
    path: str
    group: str
    flag: str


def _check_name(name: str, flag: str) -> str:
    if not _NAME.match(name):
        raise BadInputError(f"{flag}: set name {name!r} must start with a letter or digit and hold only letters, "
                            "digits, '.', '_' or '-'")
    if name in _RESERVED:
        raise BadInputError(f"{flag}: {name!r} is a reserved dataset name ({', '.join(sorted(_RESERVED))}): "
                            "pick another")
    return name


def _as_tuple(value) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(str(v) for v in value)


def ood_sets(opts: EvaluateOptions) -> list[OodSpec]:
    """The OOD sets in order: ``--splits`` (``splits``), ``--syn`` (``syn-is``), then every ``--ood
    [GROUP:]NAME=MANIFEST``; one-line errors for a malformed or repeated name, an unknown group, a manifest path
    or no OOD set at all (the manifests are read by the stage)."""
    specs = []
    if opts.splits is not None:
        specs.append(OodSpec(SPLITS_SET, str(opts.splits), "", "--splits"))
    if opts.syn is not None:
        specs.append(OodSpec(SYN_SET, str(opts.syn), "", "--syn"))
    for text in _as_tuple(opts.ood):
        head, eq, path = str(text).partition("=")
        if not eq or not head.strip() or not path.strip():
            raise BadInputError(f"--ood {text}: write NAME=MANIFEST or GROUP:NAME=MANIFEST (GROUP: "
                                f"{', '.join(GROUPS)}), e.g. --ood near:ssb=imports/ssb")
        group, colon, name = head.strip().rpartition(":")
        if colon and group not in GROUPS:
            raise BadInputError(f"--ood {text}: unknown group {group!r}; pass one of {', '.join(GROUPS)} (or none: "
                                "NAME=MANIFEST)")
        specs.append(OodSpec(_check_name(name.strip(), f"--ood {text}"), path.strip(), group, f"--ood {text}"))
    if not specs:
        raise BadInputError("no OOD set: pass --splits SPLITS, --syn SYN or --ood NAME=MANIFEST (repeatable)")
    seen: dict[str, str] = {}
    for s in specs:
        if s.name in seen:
            raise BadInputError(f"{s.flag}: the set name {s.name!r} is taken by {seen[s.name]}: give each set its "
                                "own name")
        seen[s.name] = s.flag
    return specs


def named_values(values, flag: str, known: set[str] | None = None) -> dict[str, str]:
    """``NAME=VALUE`` entries as a dict (one-line errors for a malformed entry, a repeated name, or a name not in
    ``known`` when given)."""
    out: dict[str, str] = {}
    for text in _as_tuple(values):
        name, eq, value = str(text).partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or not value:
            raise BadInputError(f"{flag} {text}: write NAME=VALUE")
        if name in out:
            raise BadInputError(f"{flag} names {name!r} twice: pass one value per set")
        if known is not None and name not in known:
            raise BadInputError(f"{flag} {text}: no set is named {name!r}; the sets are {', '.join(sorted(known))}")
        out[name] = value
    return out


def preprocess_presets(opts: EvaluateOptions, names: set[str]) -> tuple[str, dict[str, str]]:
    """``(default preset, {dataset: preset})`` of ``--preprocess`` (``PRESET`` for every dataset, ``NAME=PRESET``
    for one of ``names``); unknown presets and names are one-line errors."""
    default, per_set = DEFAULT_PRESET, []
    for text in _as_tuple(opts.preprocess):
        if "=" in text:
            per_set.append(text)
        else:
            default = check_preset(text.strip(), f"--preprocess {text}")
    chosen = named_values(per_set, "--preprocess", known=names)
    for name, preset in chosen.items():
        check_preset(preset, f"--preprocess {name}={preset}")
    return default, chosen


def check_paths(opts: EvaluateOptions) -> None:
    """The folders and files the options name besides the manifests exist (checked by the stage, before anything
    is read): ``--ood-root`` folders, ``--id-test-root``, ``--id-test-labels``."""
    for name, folder in named_values(opts.ood_root, "--ood-root").items():
        if not Path(folder).is_dir():
            raise BadInputError(f"--ood-root {name}={folder}: not a folder; pass the folder the set's image paths "
                                "are relative to")
    if opts.id_test_root is not None and not Path(opts.id_test_root).is_dir():
        raise BadInputError(f"--id-test-root {opts.id_test_root}: not a folder; pass the folder the --id-test list's "
                            "paths are relative to")
    if opts.id_test_labels is not None and not Path(opts.id_test_labels).is_file():
        raise BadInputError(f"--id-test-labels {opts.id_test_labels}: file not found; pass a file of "
                            "'<image> <label>' lines")


def check_options(opts: EvaluateOptions, *, need_out: bool = True) -> dict[str, Detector]:
    """One-line errors, before anything is read or loaded (see the module docstring); returns the parsed
    ``--detectors``. ``need_out``: False for an evaluation kept in memory (``isood.evaluate``)."""
    required = (("--out", opts.out),) if need_out else ()
    for flag, value in (*required, ("--id-test", opts.id_test)):
        if value is None:
            raise BadInputError(f"{flag} is required")
    specs = ood_sets(opts)
    names = {s.name for s in specs}
    named_values(opts.ood_root, "--ood-root", known=names)
    preprocess_presets(opts, names | {"id_train", "id_test"})
    check_convention(opts.table_convention)
    for name, least in _LEAST.items():
        value = getattr(opts, name)
        if value is None and name == "num_classes":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BadInputError(f"--{name.replace('_', '-')} must be an integer >= {least}, got {value!r}")
    check_seed(opts.seed)
    check_verify_mode(opts.verify)
    parse_rules(opts.leak_rules, option="--leak-rules")
    plot_metrics(opts)
    check_decode_mode(opts.decode, EVALUATE_DECODE_MODES)
    if opts.precision not in PRECISIONS:
        raise BadInputError(f"--precision {opts.precision}: unknown precision; pass one of {', '.join(PRECISIONS)}")
    if opts.model is not None and opts.model.startswith("py:"):
        model_function(opts.model)
    detectors = parse_detectors(opts.detectors)
    if opts.id_train is None:
        fitted = [n for n, d in detectors.items() if d.needs_fit]
        if fitted:
            raise BadInputError(f"detector '{fitted[0]}' is fitted on ID training images: pass --id-train (a folder "
                                "with one wnid sub-folder per class) or drop it")
    return detectors
