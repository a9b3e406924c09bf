"""The stage of `isood compare RUN...`, a leaderboard across evaluation runs (read every run's ``evaluation`` manifest,
verified -> one table (pure) -> ``leaderboard.csv`` and ``leaderboard.md`` in ``--out``).

One row per run, detector and dataset: the run's label (``--names``, else its folder name), model, the mean of
every metric over the measured cells (the run's ``detector_means``), Table 1's correlation and sensitivity of AUROC
and FPR@95 per axis (its ``table1``, with the bootstrap 95% intervals when the run has ``table1_intervals``), and
the content hashes that say what was compared: the run's, and the dataset's benchmark manifest's (the run's input
``<dataset>_manifest``), and each detector's hyper-parameters as the run recorded them (``params``, read back
from the run's ``detector_params``). Rows are ranked within each dataset by ``--rank-by`` (default AUROC; ascending for
lower-is-better metrics; ties share a rank; a missing value ranks last). A dataset evaluated on different benchmark
manifests (or ID test sets) in different runs, or a detector run with different hyper-parameters, is ranked anyway
but flagged: a warning line each and a note in the markdown. So are runs made with different settings that change
the numbers compared (``SETTINGS``: the N/A threshold, Table 1's convention, decoding, precision, preprocessing):
the ``settings`` column holds each run's, and one note names what differs. The same run given twice (one content
hash) is compared once, with a note: no row appears twice.

The output is not a manifest: the leaderboard is derived from manifests that are already versioned and hashed,
costs seconds to rebuild, and records their content hashes in every row. ``--out`` is written under its lock
(``isood.core.files.output_lock``), each file by rename; it must be new, empty or an earlier ``isood compare`` output
(recognised by the first line of ``leaderboard.md``), and is never a manifest or inside a run.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

import manifests
from isood.core.defaults import DEFAULT_VERIFY
from isood.core.errors import BadInputError, IsoodWarning
from isood.science.levels import leak_free_name
from isood.science.metrics import METRICS, lower_is_better, metric_label
from isood.core.files import TMP_PREFIX, atomic_write_bytes, output_lock
from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import verify_option
from isood.kinds import EVALUATION, EvaluationView
from manifests.paths import is_inside

__all__ = ["CompareOptions", "LEADERBOARD_CSV", "LEADERBOARD_MD", "MARKER", "Run", "CompareResult", "load_run", "leaderboard",
           "differing_inputs", "params_text", "leaderboard_markdown", "compare_runs", "SETTINGS", "run_settings",
           "unique_runs", "differing_settings"]

LEADERBOARD_CSV, LEADERBOARD_MD = "leaderboard.csv", "leaderboard.md"
MARKER = "<!-- isood compare: a leaderboard of evaluation runs -->"
_TABLE1 = ("auroc", "fpr95")
#: The recorded options of an evaluation run that change the numbers a leaderboard compares (its config keys).
SETTINGS = ("na_threshold", "table_convention", "decode", "precision", "preprocess")


@dataclass(frozen=True, kw_only=True)
class CompareOptions:
    """`isood compare` (``compare_runs`` takes the same values)."""

    runs: tuple[str, ...] = option(REQUIRED, kind="list", argument=True, least=1, metavar="RUN...",
                                   help="Evaluation manifests (isood evaluate --out), one or more.")
    out: str = option(REQUIRED, kind="path", metavar="DIR",
                      help="Output folder for leaderboard.csv and leaderboard.md (new, empty, or an earlier isood "
                           "compare --out).")
    names: str | None = option(None, commas=True, help="Comma-separated labels of the runs, in order (default: their folder "
                                          "names).")
    rank_by: str = option("auroc", metavar="METRIC",
                          help="Metric ranking the detectors of each dataset (mean over the measured cells; "
                               "lower-is-better metrics rank ascending).")
    verify: str = verify_option()


@dataclass
class Run:
    """What the leaderboard reads of one evaluation run."""

    label: str
    root: str
    content_sha256: str
    model: str
    means: pd.DataFrame
    table1: pd.DataFrame
    intervals: pd.DataFrame | None = None
    inputs: dict[str, str] = field(default_factory=dict)  # input name -> sha256
    params: dict[str, dict] = field(default_factory=dict)  # detector -> its hyper-parameters in this run
    settings: dict[str, str] = field(default_factory=dict)  # SETTINGS this run recorded -> value as text


@dataclass
class CompareResult:
    out: Path
    board: pd.DataFrame
    notes: list[str]


def load_run(path: str | os.PathLike, label: str, *, verify: str = DEFAULT_VERIFY) -> Run:
    """One run: its evaluation manifest read and verified (``manifests.read``; a one-line error otherwise)."""
    m = manifests.read(path, kind=EVALUATION, verify=verify)
    if not isinstance(m, EvaluationView):  # the kind is registered explicitly: a guard for type checkers
        raise BadInputError(f"{path}: not an evaluation manifest; pass an isood evaluate --out")
    return Run(label=label, root=str(m.root), content_sha256=m.content_sha256 or "", model=m.model,
               means=m.frame("detector_means"), table1=m.frame("table1"), intervals=m.optional("table1_intervals"),
               inputs=m.input_hashes, params=m.detector_params, settings=run_settings(m.config))


def run_settings(config: Mapping[str, Any]) -> dict[str, str]:
    """The ``SETTINGS`` an evaluation's config records, each as text (a setting it does not record is left out;
    ``preprocess`` and other structured values as sorted JSON)."""
    out = {}
    for key in SETTINGS:
        v = config.get(key)
        if v is None or v == () or v == []:
            continue
        out[key] = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return out


def unique_runs(runs: Sequence[Run]) -> tuple[list[Run], list[str]]:
    """``runs`` without repeats of one run (the same content hash and settings, whatever its path or label: the
    first kept), and one note per repeat."""
    kept: dict[tuple, Run] = {}
    out, notes = [], []
    for run in runs:
        key = (run.content_sha256, tuple(sorted(run.settings.items())))
        first = kept.get(key) if run.content_sha256 else None
        if first is not None:
            notes.append(f"run {run.label!r} is the same evaluation as {first.label!r} (content sha256 "
                         f"{run.content_sha256[:12]}): compared once")
            continue
        kept[key] = run
        out.append(run)
    return out, notes


def _labels(paths: Sequence[Path], names: Sequence[str] | None) -> list[str]:
    """``names``, or each run's folder name (with its parents' names where two folders share a name)."""
    if names is not None:
        if len(names) != len(paths):
            raise BadInputError(f"--names lists {len(names)} names for {len(paths)} runs: pass one name per run")
        if len(set(names)) != len(names):
            raise BadInputError(f"--names {','.join(names)}: the names must differ")
        return list(names)
    parts = [Path(os.path.abspath(p)).parts for p in paths]
    depth = 1
    while True:
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels) or depth >= max(len(p) for p in parts):
            return labels
        depth += 1


def _benchmark(run: Run, dataset: str) -> str:
    """The content hash of the manifest ``dataset`` was evaluated on ('' when the run does not record it)."""
    base = dataset[: -len(leak_free_name(""))] if dataset.endswith(leak_free_name("")) else dataset
    return run.inputs.get(f"{base}_manifest", "")


def leaderboard(runs: Sequence[Run], *, rank_by: str = "auroc") -> pd.DataFrame:
    """The leaderboard of ``runs`` (pure; module docstring): one row per run, detector and dataset, ranked per
    dataset by ``rank_by``."""
    frames = []
    for run in runs:
        rows = run.means.copy()
        rows.insert(0, "run", run.label)
        rows.insert(1, "model", run.model)
        t1 = run.table1[run.table1["metric"].isin(_TABLE1)]
        ci = run.intervals.set_index(["detector", "dataset", "metric", "axis"]) if run.intervals is not None \
            and len(run.intervals) else None
        for m in _TABLE1:
            for ax in ("sem", "cov"):
                part = t1[(t1["metric"] == m) & (t1["axis"] == ax)].set_index(["detector", "dataset"])
                keys = list(zip(rows["detector"], rows["dataset"]))
                for kind, col in (("corr", "correlation"), ("sens", "sensitivity")):
                    name = f"{m}_{ax}_{kind}"
                    if not len(part):
                        continue
                    rows[name] = [float(part.loc[k, col]) if k in part.index else np.nan for k in keys]
                    if ci is not None:
                        for end in ("low", "high"):
                            rows[f"{name}_{end}"] = [float(ci.loc[(*k, m, ax), f"{col}_{end}"])
                                                     if (*k, m, ax) in ci.index else np.nan for k in keys]
        rows["params"] = [params_text(run.params.get(d, {})) for d in rows["detector"]]
        rows["settings"] = ", ".join(f"{k}={run.settings[k]}" for k in sorted(run.settings))
        rows["benchmark_sha256"] = [_benchmark(run, ds) for ds in rows["dataset"]]
        rows["id_test_sha256"] = run.inputs.get("id_test", "")
        rows["run_sha256"] = run.content_sha256
        rows["run_path"] = run.root
        frames.append(rows)
    board = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if rank_by not in board.columns or not board[rank_by].notna().any():
        have = [m for m in METRICS if m in board.columns and board[m].notna().any()]
        raise BadInputError(f"--rank-by {rank_by!r}: no run has it; pass one of {', '.join(have) or 'auroc'}")
    key = board[rank_by] if lower_is_better(rank_by) else -board[rank_by]
    board.insert(0, "rank", key.groupby(board["dataset"]).rank(method="min", na_option="bottom").astype(np.int64))
    order = board.assign(_k=key).sort_values(["dataset", "rank", "_k", "run", "detector"], kind="stable")
    return order.drop(columns="_k").reset_index(drop=True)


def params_text(params: dict) -> str:
    """A detector's hyper-parameters as one sorted ``k=v, ...`` string ('' without any)."""
    return ", ".join(f"{k}={params[k]!r}" for k in sorted(params))


def differing_inputs(board: pd.DataFrame) -> list[str]:
    """One note per dataset whose runs were evaluated on different benchmark manifests or ID test sets, and one
    per detector run with different hyper-parameters in different runs (pure)."""
    notes = []
    if "params" in board.columns:
        for det, g in board.drop_duplicates(["run", "detector"]).groupby("detector", sort=True):
            seen = dict(zip(g["run"], g["params"]))
            if len(set(seen.values())) > 1:
                runs = "; ".join(f"{r}: {p or 'defaults unrecorded'}" for r, p in seen.items())
                notes.append(f"detector {det!r} ran with different hyper-parameters in different runs ({runs}); "
                             "its rows compare different settings")
    for ds, g in board.groupby("dataset", sort=True):
        for col, what in (("benchmark_sha256", "benchmark manifests"), ("id_test_sha256", "ID test sets")):
            distinct = {v for v in g[col] if v}
            if len(distinct) > 1:
                runs = ", ".join(f"{r} ({v[:12]})" for r, v in dict(zip(g["run"], g[col])).items() if v)
                notes.append(f"dataset {ds!r} was evaluated on different {what} in different runs: {runs}; the "
                             "ranks compare different data")
    return notes


def differing_settings(runs: Sequence[Run]) -> list[str]:
    """One note (or none) naming every ``SETTINGS`` entry whose value differs between ``runs``, run by run (pure;
    a setting a run does not record counts as 'unrecorded')."""
    differ = [k for k in SETTINGS if len({r.settings.get(k, "unrecorded") for r in runs}) > 1]
    if not differ:
        return []
    what = "; ".join(f"{k}: " + ", ".join(f"{r.label}={r.settings.get(k, 'unrecorded')}" for r in runs)
                     for k in differ)
    return [f"the runs were made with different settings ({what}); their ranks compare different evaluations"]


def _cell(v, lo=np.nan, hi=np.nan, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "N/A"
    text = f"{v:.{digits}f}" if isinstance(v, (float, np.floating)) else str(v)
    return text + (f" [{lo:.{digits}f}, {hi:.{digits}f}]" if np.isfinite(lo) else "")


def leaderboard_markdown(board: pd.DataFrame, *, rank_by: str, notes: Sequence[str] = ()) -> str:
    """The leaderboard as markdown (pure): a table per dataset (rank, run, model, detector, cells, AUROC and FPR@95
    means, Table 1 for AUROC), the notes, and the runs compared with their content hashes."""
    out = [MARKER, "", "# isood compare: leaderboard", "",
           f"Ranked by the mean {metric_label(rank_by)} over the measured cells "
           f"({'lower' if lower_is_better(rank_by) else 'higher'} is better); params: the detector's hyper-parameters "
           "in that run; Table 1 columns: Pearson correlation "
           "(corr) and |slope| per level (sens) of the per-level AUROC; brackets: bootstrap 95% intervals.", ""]
    out += [f"> **Note:** {n}" for n in notes] + ([""] if notes else [])
    means = [m for m in dict.fromkeys([rank_by, "auroc", "fpr95"]) if m in board.columns]
    t1 = [c for c in ("auroc_sem_corr", "auroc_sem_sens", "auroc_cov_corr", "auroc_cov_sens") if c in board.columns]
    settings = "settings" in board.columns and board["settings"].nunique() > 1
    head = ["rank", "run", "model", "detector", "params", *(["settings"] if settings else []), "cells",
            *(metric_label(m) for m in means),
            *(c.replace("auroc_", "AUROC ").replace("_", " ") for c in t1)]
    for ds, g in board.groupby("dataset", sort=False):
        out += [f"## {ds}", "", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for r in g.to_dict("records"):
            cells = [str(r["rank"]), str(r["run"]), str(r["model"]) or "-", str(r["detector"]),
                     str(r.get("params") or "-"), *([str(r.get("settings") or "-")] if settings else []),
                     str(r["cells"])]
            cells += [_cell(r[m]) for m in means]
            cells += [_cell(r[c], r.get(f"{c}_low", np.nan), r.get(f"{c}_high", np.nan), 2) for c in t1]
            out.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
        out.append("")
    runs = board.drop_duplicates("run")
    out += ["## Runs", "", "| run | evaluation manifest | content sha256 |", "|---|---|---|"]
    out += [f"| {r['run']} | {r['run_path']} | {r['run_sha256']} |" for r in runs.to_dict("records")]
    return "\n".join(out) + "\n"


def _check_out(out: Path, paths: Sequence[Path]) -> None:
    """Refuse an ``--out`` that is a manifest, inside a run, or holds anything but an earlier leaderboard."""
    for p in paths:
        if is_inside(os.path.abspath(out), os.path.abspath(p)):
            raise BadInputError(f"--out {out} is inside the run {p}; pass a folder outside it")
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {out} is a file; pass a folder")
    if out.is_dir():
        if (out / "manifest.json").exists():
            raise BadInputError(f"--out {out} is a manifest; pass a new folder for the leaderboard")
        others = sorted(p.name for p in out.iterdir() if not p.name.startswith(TMP_PREFIX)
                        and p.name not in (LEADERBOARD_CSV, LEADERBOARD_MD))
        md = out / LEADERBOARD_MD
        earlier = md.is_file() and md.read_text(encoding="utf-8", errors="replace").startswith(MARKER)
        if others or ((out / LEADERBOARD_CSV).exists() and not earlier):
            raise BadInputError(f"--out {out} holds other files ({', '.join(others) or LEADERBOARD_CSV}); pass a new "
                                "or empty folder, or an earlier `isood compare --out`")


def compare_runs(runs: Sequence[str | os.PathLike], out: str | os.PathLike, *, names: Sequence[str] | None = None,
                 rank_by: str = "auroc", verify: str = DEFAULT_VERIFY) -> CompareResult:
    """Read the runs, build the leaderboard and write ``leaderboard.csv`` and ``leaderboard.md`` in ``out``
    (module docstring); every refusal comes before anything is written."""
    paths = [Path(p) for p in runs]
    if not paths:
        raise BadInputError("no run to compare: pass one or more evaluation manifests (isood evaluate --out)")
    if rank_by not in METRICS:
        raise BadInputError(f"--rank-by {rank_by!r} is not a metric: pass one of {', '.join(METRICS)}")
    out = Path(out)
    _check_out(out, paths)
    labels = _labels(paths, names)
    loaded, repeats = unique_runs([load_run(p, label, verify=verify) for p, label in zip(paths, labels)])
    board = leaderboard(loaded, rank_by=rank_by)
    notes = repeats + differing_settings(loaded) + differing_inputs(board)
    for n in notes:
        warnings.warn(n, IsoodWarning, stacklevel=2)
    with output_lock(out):
        _check_out(out, paths)
        atomic_write_bytes(out / LEADERBOARD_CSV, board.to_csv(index=False, float_format="%.6g").encode())
        atomic_write_bytes(out / LEADERBOARD_MD, leaderboard_markdown(board, rank_by=rank_by, notes=notes).encode())
    return CompareResult(out, board, notes)
