"""The options of ``isood evaluate`` and their checks, importable without torch, scikit-learn or SciPy.

``check_options`` refuses a bad option with one line before anything is read or loaded: required paths, every
field's kind, bounds and choices as ``EvaluateOptions`` describes them (``isood.core.optspec.check``: the same rule as
every other command's), ``--leak-rules``, ``--plot-metrics``, ``--detectors`` (names and parameters, through the
detector registry, which loads nothing heavy) and the form of ``--model py:MODULE:FUNCTION``
(``model_function``). The CLI calls it before it imports the stage, so a bad
option is refused in well under a second; the stage calls it again (Python callers).

The OOD sets (``ood_sets``): ``--splits`` (dataset ``splits``), ``--syn`` (``syn-is``) and any number of
``--ood [GROUP:]NAME=MANIFEST`` (a splits, syn-is or image-list manifest; GROUP ``near`` or ``far`` puts the set
in OpenOOD's group of that name); at least one is needed. ``--ood-root NAME=DIR`` is the folder a set's image
paths are relative to; ``--preprocess PRESET`` / ``NAME=PRESET`` the transform (``preprocess.PRESETS``);
``--table-convention`` Table 1's rule (``conventions.TABLE_CONVENTIONS``). Without ``--id-train`` nothing is
fitted and DER is not computed (a detector that needs fitting is refused).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from isood.core.defaults import ALL_PLOT_METRICS as ALL_METRICS
from isood.core.defaults import DEFAULT_BOOTSTRAP, DEFAULT_DETECTORS, DEFAULT_PLOT_METRICS, OOD_GROUPS
from isood.core.devices import DEFAULT_PRECISION, PRECISIONS
from isood.core.errors import BadInputError
from isood.features.decoding import EVALUATE_DECODE_MODES, REFERENCE_DECODE
from isood.core.optspec import check, option
from isood.core.shared_options import (batch_size_option, decode_processes_option, device_option, na_threshold_option,
                                       seed_option, verify_option)
from isood.core.workers import WorkerSpec, resolve_workers
from wordnet_tools.rules import LEAK_RULES, parse_rules

from isood.classifiers import pytorch_ood  # noqa: F401  (registers the pytorch-ood: name space before --detectors is parsed)
from isood.science.conventions import TABLE_CONVENTIONS
from isood.science.detectors import Detector, parse_detectors  # re-exported by isood.evaluation (name space registered)
from isood.science.metrics import METRICS
from isood.classifiers.model_option import model_function
from isood.classifiers.preprocess import DEFAULT_PRESET, check_preset

__all__ = ["EvaluateOptions", "check_options", "plot_metrics", "model_function", "OodSpec", "ood_sets",
           "named_values", "preprocess_presets", "check_paths", "resolved", "SPLITS_SET", "SYN_SET", "PRECISIONS",
           "DEFAULT_PRECISION"]  # PRECISIONS, DEFAULT_PRECISION: isood.core.devices

#: The dataset names of ``--splits`` and ``--syn``.
SPLITS_SET, SYN_SET = "splits", "syn-is"
GROUPS = tuple(OOD_GROUPS)
_RESERVED = {"id_train", "id_test", *OOD_GROUPS.values()}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True, kw_only=True)
class EvaluateOptions:
    """Everything `isood evaluate` takes, one description per option (``isood.core.optspec``: flag = field name with
    - for _; the command line, ``--config`` and the checks come from it)."""

    splits: str | None = option(None, kind="path", metavar="MANIFEST",
                                help="A splits manifest (isood build-splits or import isood-lists): dataset 'splits'; "
                                     "must pass `isood verify`. Same as --ood splits=SPLITS, with --test-root.")
    out: str | None = option(None, kind="path", metavar="DIR", required=True,
                             help="Output directory (evaluation manifest, plots, report.html, summary.md).")
    id_test: str | None = option(None, kind="path",
                                 help="ID test set: image folder with wnid sub-folders, a file list (flat paths "
                                      "without wnids too: see --id-test-root, --id-test-labels), or a "
                                      "precomputed-outputs folder. Required, unless --benchmark names one.")
    id_train: str | None = option(None, kind="path",
                                  help="ID training set (fits MDS/KNN/ViM..., DER threshold): a folder with wnid "
                                       "sub-folders (or file list), or precomputed outputs. Optional when no "
                                       "detector is fitted (then no DER).")
    model: str | None = option(None, metavar="MODEL",
                               help="Classifier: a timm name, 'torchvision/<name>', py:MODULE:FUNCTION, or clip:SPEC "
                                    "for a CLIP zero-shot classifier (SPEC: an open_clip name such as "
                                    "ViT-B-16:openai or local-dir:PATH; classes from --classes or --id-train; "
                                    "detectors mcm, glmcm) (not needed with precomputed outputs). py:MODULE:FUNCTION "
                                    "imports MODULE and calls FUNCTION (also from --config): it runs as trusted "
                                    "code, pass only code you would run yourself.")
    detectors: str = option(DEFAULT_DETECTORS, metavar="SPEC", commas=True,
                            help="Comma-separated detectors, with parameters as name:key=value (e.g. knn:k=10): msp, "
                                 "maxlogit, energy, odin, mds, knn, vim, react, dice, gradnorm, klm; ash (ASH-B at "
                                 "percentile 90 on the pooled feature, as OpenOOD; ash:variant=p|s); rankfeat "
                                 "(OpenOOD's block 3 + 4 fusion; rankfeat:blocks=4 for block 4 only); mcm, glmcm "
                                 "(with --model clip:SPEC); pytorch-ood:NAME for pytorch-ood's detectors (e.g. "
                                 "pytorch-ood:ViM; pip install 'isood[pytorch-ood]').")
    syn: str | None = option(None, kind="path", metavar="MANIFEST",
                             help="A Syn-IS manifest (isood generate-syn): dataset 'syn-is', alone or with others "
                                  "(paths relative to it).")
    test_root: str | None = option(None, kind="path",
                                   help="Folder the --splits image paths are relative to (default: the manifest's "
                                        "test_root), or a precomputed-outputs folder.")
    checkpoint: str | None = option(None, kind="path",
                                    help="Local weights for --model (.safetensors / .pth); no download.")
    num_classes: int | None = option(None, least=1, help="Classifier head size with --checkpoint (default: the "
                                                         "number of --id-train classes).")
    classes: str | None = option(None, kind="path",
                                 help="The model's class wnids in logit order, one per line, optionally followed by "
                                      "the class name (CLIP prompts; default names: CLIP's cleaned ImageNet-1K "
                                      "names, open_clip's IMAGENET_CLASSNAMES, for ImageNet-1K wnids, else the "
                                      "first WordNet lemma) (default: sorted --id-train wnids, or ImageNet-1K order "
                                      "for 1000-class models).")
    batch_size: int = batch_size_option()
    device: str | None = device_option()
    decode_processes: int | None = decode_processes_option()
    decode: str = option(REFERENCE_DECODE, choices=EVALUATE_DECODE_MODES, metavar="MODE",
                         help="Image decoding: reference (PIL + the classifier's own transform, as OpenOOD); fast (the "
                              "transform's steps on uint8 tensors, large JPEGs decoded at reduced size, as extract "
                              "--decode fast); gpu "
                              "(JPEGs decoded in one batched torchvision decode_jpeg call per batch on the --device, "
                              "nvJPEG on CUDA, then resized, cropped and normalised there; other files and JPEGs "
                              "the device refuses by the reference path; with --device cpu the same batched code "
                              "runs on the CPU). Part of the output-cache key.")
    precision: str = option(DEFAULT_PRECISION, choices=PRECISIONS, metavar="PRECISION",
                            help="Forward passes in fp32 (OpenOOD's numbers), fp16 (CUDA only) or bf16, the last two "
                                 "under autocast with the model channels-last. Part of the output-cache key.")
    cache_dir: str | None = option(None, metavar="DIR", path=True,
                                   help="Model-output cache (default $ISOOD_CACHE_DIR/outputs; '' for none).")
    sanity_random_model: bool = option(False, help="Also run the detectors on a randomly initialised copy of the "
                                                   "model (AUROC vs AUROC_M).")
    na_threshold: int | None = na_threshold_option(
        "A cell with fewer images is N/A, counted on the images each grid evaluates (a manifest's stored N/A "
        "flags are not read; the leak-free images follow their grid's rule). Default: each grid manifest's own "
        "threshold (its build's --na-threshold; 10 when it records none); a value here overrides it for every "
        "grid, and the output records both.", from_manifest=True)
    der: bool = option(True, secondary="--no-der", help="Score the ID training set for DER95/DER99 (--no-der skips "
                                                        "it).")
    plot_metrics: str = option(DEFAULT_PLOT_METRICS, metavar="METRICS", commas=True,
                               help="Metrics to draw (heatmaps and level curves), comma-separated, or 'all' (every "
                                    "computed metric); every metric is in the tables and CSVs.")
    bootstrap: int = option(DEFAULT_BOOTSTRAP, least=0,
                            help="Bootstrap resamples behind the 95% intervals of every cell's metric and of Table 1 "
                                 "(0: none; the cost grows with resamples x detectors x images).")
    seed: int = seed_option("Seed of the random re-initialisation (--sanity-random-model) and of the bootstrap.")
    leak_audit: str | None = option(None, kind="path", metavar="AUDIT",
                                    help="An audit of the --splits classes (isood wordnet audit SPLITS --out AUDIT): "
                                         "report every metric per cell on all images and on the leak-free ones, "
                                         "with difference heatmaps and ranking changes.")
    leak_rules: str = option(",".join(LEAK_RULES), metavar="RULES", commas=True,
                             help="Audit verdicts that count as leaks with --leak-audit (among unknown, id, hypernym, "
                                  "hyponym, excluded_subtree).")
    verify: str = verify_option()
    progress: bool = option(True, cli=False, help="Progress bars.")
    # -- any benchmark: OOD sets by name, their roots, the ID test list's root and labels, the
    #    preprocessing per set, Table 1's convention
    ood: tuple[str, ...] = option((), kind="list", metavar="[GROUP:]NAME=MANIFEST", named_path=True,
                                  help="An OOD set, repeatable: a splits (cells: per-cell rows and Table 1), syn-is, "
                                       "or image-list manifest (isood import imagenet-ood / openood-imglist: per-set "
                                       "rows); GROUP near or far adds OpenOOD's nearood / farood mean rows.")
    ood_root: tuple[str, ...] = option((), kind="list", metavar="NAME=DIR", named_path=True,
                                       help="Repeatable: the folder an OOD set's image paths are relative to "
                                            "(required for image lists; default: a splits manifest's test_root, a "
                                            "Syn-IS manifest's folder).")
    id_test_root: str | None = option(None, kind="path",
                                      help="The folder the --id-test file list's entries are relative to (default: "
                                           "the list's folder), e.g. the ImageNet-1K root for the release's "
                                           "test_imagenet.txt.")
    id_test_labels: str | None = option(None, kind="path",
                                        help="Ground truth of --id-test: '<image> <label>' lines (image: path, file "
                                             "name or stem; label: wnid or class index). Without it (and without "
                                             "wnids in the paths) OOD metrics only: no accuracy.")
    preprocess: tuple[str, ...] = option((), kind="list", metavar="[NAME=]PRESET",
                                         help="Preprocessing preset for every set (PRESET) or one set (NAME=PRESET; "
                                              "names: id_train, id_test, splits, syn-is, --ood names), repeatable: "
                                              "model (default), imagenet, openood, timm, release (per set as the "
                                              "IS-OOD release: Resize(224) for splits manifests, Resize(256) "
                                              "otherwise), release-1k, release-21k.")
    benchmark: str | None = option(None, metavar="NAME", maybe_path=True,
                                   help="A named benchmark (`isood benchmarks` lists them; or a .toml file): its OOD "
                                        "sets, groups, image roots and ID test set are found under --data-root and "
                                        "added to any --splits/--syn/--ood; its lists are imported once into the "
                                        "cache.")
    data_root: str | None = option(None, kind="path", metavar="DIR",
                                   help="The folder holding the --benchmark's lists and images, in its documented "
                                        "layout (`isood benchmarks NAME`).")
    table_convention: str = option(TABLE_CONVENTIONS[0], choices=TABLE_CONVENTIONS, metavar="RULE",
                                   help="Table 1's rule: exact (fractions, N/A left out) or release (the IS-OOD "
                                        "release's analyze_metrics.py: percent rounded to 0.01, N/A as 0, level "
                                        "means over values > 1e-16; also writes results/<detector>.csv in the "
                                        "release's format).")

    @property
    def workers(self) -> WorkerSpec:
        """The workers of the passes: ``decode_processes`` by the one default rule (``isood.core.workers``)."""
        return resolve_workers(self.decode_processes)


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
        raise BadInputError("no OOD set: pass --splits SPLITS, --syn SYN, --ood NAME=MANIFEST (repeatable) or "
                            "--benchmark NAME --data-root DIR")
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
    """The folders and files the options name besides the manifests exist (checked with the options, before
    anything is read or loaded): ``--ood-root`` folders, ``--id-test-root``, ``--id-test-labels``, ``--classes``,
    ``--checkpoint``, a ``clip:local-dir:PATH`` model's folder, a ``py:MODULE:FUNCTION`` model's module."""
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
    if opts.classes is not None and not Path(opts.classes).is_file():
        raise BadInputError(f"--classes {opts.classes}: file not found; pass a file of the model's class wnids in "
                            "logit order, one per line")
    if opts.checkpoint is not None and not Path(opts.checkpoint).is_file():
        raise BadInputError(f"--checkpoint {opts.checkpoint}: file not found; pass a local weights file "
                            "(.safetensors / .pth)")
    model = opts.model if isinstance(opts.model, str) else ""
    local = model[len("clip:local-dir:"):] if model.startswith("clip:local-dir:") else None
    if local is not None and not Path(local).is_dir():
        raise BadInputError(f"--model {model}: no folder at {local}; pass the folder of a local open_clip model")
    if model.startswith("py:"):
        module = model_function(model)[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise BadInputError(f"--model {model}: no module {module!r} is installed; pass py:MODULE:FUNCTION of an "
                                "importable module (it runs as trusted code)")


def resolved(opts: EvaluateOptions) -> bool:
    """Whether ``opts``' ``--benchmark`` has been resolved into its sets (``isood.benchmarks``, which the CLI and
    ``isood.Benchmark`` run before the stage): its ID test set is then given."""
    return opts.benchmark is None or opts.id_test is not None


def check_options(opts: EvaluateOptions, *, need_out: bool = True) -> dict[str, Detector]:
    """One-line errors, before anything is read or loaded (see the module docstring); returns the parsed
    ``--detectors``. ``need_out``: False for an evaluation kept in memory (``isood.evaluate``)."""
    required = (("--out", opts.out),) if need_out else ()
    for flag, value in required:
        if value is None:
            raise BadInputError(f"{flag} is required")
    if (opts.benchmark is None) != (opts.data_root is None):
        raise BadInputError("--benchmark and --data-root go together: pass both (`isood benchmarks` lists the "
                            "benchmarks and their layouts)")
    if opts.benchmark is not None and not resolved(opts):  # filled in from the benchmark before the stage runs
        return parse_detectors(check(opts).detectors)
    if opts.id_test is None:
        raise BadInputError("--id-test is required (or pass --benchmark NAME --data-root DIR)")
    check(opts)  # every field's kind, bounds and choices (isood.core.optspec): one line naming the flag
    specs = ood_sets(opts)
    names = {s.name for s in specs}
    named_values(opts.ood_root, "--ood-root", known=names)
    preprocess_presets(opts, names | {"id_train", "id_test"})
    parse_rules(opts.leak_rules, option="--leak-rules")
    plot_metrics(opts)
    if opts.model is not None and opts.model.startswith("py:"):
        model_function(opts.model)
    check_paths(opts)  # files and folders the options name: before anything heavy loads
    detectors = parse_detectors(opts.detectors)
    zero_shot = [n for n, d in detectors.items() if d.zero_shot]
    if zero_shot and opts.model is not None and not opts.model.startswith(("clip:", "py:")):
        raise BadInputError(f"detector '{zero_shot[0]}' scores a CLIP zero-shot classifier's similarities with the "
                            f"class prompts, not --model {opts.model}'s logits (it would give MSP's numbers): pass "
                            "--model clip:SPEC (e.g. clip:ViT-B-16:openai) or drop it")
    if opts.id_train is None:
        fitted = [n for n, d in detectors.items() if d.needs_fit]
        if fitted:
            raise BadInputError(f"detector '{fitted[0]}' is fitted on ID training images: pass --id-train (a folder "
                                "with one wnid sub-folder per class) or drop it")
    return detectors
