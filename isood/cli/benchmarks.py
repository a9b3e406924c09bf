"""`isood benchmarks [NAME]`: the named benchmarks (``isood.benchmarks``), or one benchmark's layout and, with
``--data-root``, what of it is there."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from isood.benchmarks.registry import ENV_BENCHMARKS, available_benchmarks, benchmark_folders, get_benchmark
from isood.cli._app import app, out_console
from isood.cli.options import command
from isood.core.optspec import option

__all__ = ["BenchmarksOptions", "benchmarks"]


@dataclass(frozen=True, kw_only=True)
class BenchmarksOptions:
    """`isood benchmarks`."""

    name: str | None = option(None, argument=True, metavar="NAME",
                              help="A benchmark to show (its sets, groups and the paths it needs); none: list all.")
    data_root: str | None = option(None, kind="path", metavar="DIR",
                                   help="With NAME: say which of its paths are there under DIR and which are missing.")


@command(app, "benchmarks", BenchmarksOptions,
         help="The named benchmarks `isood evaluate --benchmark NAME --data-root DIR` takes (built-in ones and yours, "
              f"from .toml files in ${ENV_BENCHMARKS}); with NAME, its layout under a data root.")
def benchmarks(opts: BenchmarksOptions) -> None:
    if opts.name is None:
        t = Table(title=f"benchmarks (files in {', '.join(str(f) for f in benchmark_folders())})")
        for col in ("name", "OOD sets", "title"):
            t.add_column(col)
        for name, spec in available_benchmarks().items():
            sets = ", ".join(f"{s.name} ({s.group})" if s.group else s.name for s in spec.ood)
            t.add_row(name, sets, spec.title)
        out_console.print(t)
        return
    spec = get_benchmark(opts.name)
    out_console.print(f"{spec.name}: {spec.title}\nsource: {spec.source}\nfile: {spec.file}", highlight=False,
                      soft_wrap=True)
    missing = set(spec.missing(opts.data_root)) if opts.data_root is not None else set()
    t = Table(title=f"paths under {opts.data_root or 'DATA_ROOT'}")
    for col in ("path", "what", *(("there",) if opts.data_root is not None else ())):
        t.add_column(col)
    for rel, what, folder in spec.paths():
        row = [rel + ("/" if folder else ""), what]
        if opts.data_root is not None:
            row.append("missing" if f"{rel} ({what})" in missing else "yes")
        t.add_row(*row)
    out_console.print(t)
