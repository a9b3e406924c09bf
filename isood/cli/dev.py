"""`isood dev tiny-models DIR`: tiny models with random weights and a tiny image world (``isood.dev.tiny_models``),
so that every command can be tried offline, with the exact flags printed."""

from __future__ import annotations

from isood.cli._app import dev_app, out_console
from isood.cli.options import command
from isood.dev.tiny_models import TinyModelsOptions

__all__ = ["tiny_models"]


@command(dev_app, "tiny-models", TinyModelsOptions, config=False,
         help="Write a tiny open_clip model, a tiny SDXL pipeline, a tiny timm classifier and a few images into DIR "
              "(random weights: they run offline in seconds and recognise nothing), with DIR/README.txt giving the "
              "flags to use. DIR must be new or empty.")
def tiny_models(opts: TinyModelsOptions) -> None:
    from isood.dev.tiny_models import write_tiny_models  # torch, open_clip, diffusers: only when the command runs

    with out_console.status("building tiny models (random weights)"):
        models = write_tiny_models(opts.out, seed=opts.seed)
    if not models.written:
        out_console.print(f"{models.root} already holds tiny models of seed {opts.seed}: nothing written",
                          highlight=False, soft_wrap=True)
    out_console.print((models.root / "README.txt").read_text(), highlight=False, soft_wrap=True, markup=False)
