"""`isood show MANIFEST`: a mosaic of a grid manifest, k sampled thumbnails per cell (``isood.stages.show``)."""

from __future__ import annotations

import dataclasses

from isood.cli._app import app, out_console
from isood.cli.options import command
from isood.stages.show import ShowOptions, show as show_stage

__all__ = ["show"]


@command(app, "show", ShowOptions,
         help="A mosaic of a grid manifest (splits, Syn-IS or an imported release): sampled thumbnails per cell, "
              "axes labelled by shift level and distance, N/A cells marked, as PNG and PDF.")
def show(opts: ShowOptions) -> None:
    values = dataclasses.asdict(opts)
    r = show_stage(values.pop("manifest"), values.pop("out"), **values)
    out_console.print(f"mosaic of {opts.manifest} ({r.kind}, images under {r.image_root}) -> "
                      + ", ".join(str(p) for p in r.files), highlight=False, soft_wrap=True)
