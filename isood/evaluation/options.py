"""L3: the options of ``isood evaluate`` and their checks, importable without torch, scikit-learn or SciPy.

``check_options`` refuses a bad option with one line before anything is read or loaded: required paths, counts
below their least value, the seed (``isood.defaults.check_seed``), ``--leak-rules``, ``--plot-metrics``,
``--detectors`` (names and parameters, through the detector registry, which loads nothing heavy), ``--decode``
(``isood.images.EVALUATE_DECODE_MODES``), ``--precision`` (``PRECISIONS``) and the form of
``--model py:MODULE:FUNCTION`` (``model_function``). The CLI calls it before it imports the stage, so a bad
option is refused in well under a second; the stage calls it again (Python callers).
"""

from __future__ import annotations

from dataclasses import dataclass

from isood.defaults import ALL_PLOT_METRICS as ALL_METRICS
from isood.defaults import DEFAULT_DETECTORS, DEFAULT_PLOT_METRICS, DEFAULT_VERIFY, NA_THRESHOLD
from isood.errors import BadInputError
from isood.defaults import check_seed
from isood.images import EVALUATE_DECODE_MODES, REFERENCE_DECODE, check_decode_mode
from manifests.verify import check_verify_mode
from wordnet_tools.rules import LEAK_RULES, parse_rules

from .detectors import Detector, parse_detectors
from .metrics import METRICS

__all__ = ["EvaluateOptions", "check_options", "plot_metrics", "model_function", "PRECISIONS", "DEFAULT_PRECISION"]

#: ``--precision``: the forward passes in float32 (the default: OpenOOD's numbers), or under autocast to float16
#: (CUDA only) or bfloat16, the model and its inputs channels-last.
PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_PRECISION = "fp32"


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


def check_options(opts: EvaluateOptions) -> dict[str, Detector]:
    """One-line errors, before anything is read or loaded (see the module docstring); returns the parsed
    ``--detectors``."""
    for flag, value in (("--splits", opts.splits), ("--out", opts.out), ("--id-test", opts.id_test),
                        ("--id-train", opts.id_train)):
        if value is None:
            raise BadInputError(f"{flag} is required")
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
    return parse_detectors(opts.detectors)
