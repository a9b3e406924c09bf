"""Named SDXL style templates: the covariate axis of Syn-IS (style x label -> prompt).

A style is a prompt template with a ``{prompt}`` slot (filled with the label) and a negative prompt. The
built-in ``sdxl`` set spans photographic renderings (small covariate shift from ImageNet photographs) to
abstract media (large shift). User styles come in the standard SDXL style-file format: a JSON list of
``{"name": ..., "prompt": "... {prompt} ...", "negative_prompt": ...}`` objects.

Spec forms accepted by :func:`load_styles`: ``sdxl``, ``sdxl:name1,name2``, ``FILE.json``, ``FILE.json:name1,name2``.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from isood.core.errors import BadInputError
from isood.core.textio import read_text

SLOT = "{prompt}"


class StyleError(BadInputError):
    """A style spec, style file or style template is unusable."""


@dataclass(frozen=True)
class Style:
    """One named style: ``prompt`` holds the ``{prompt}`` slot the label is written into."""

    name: str
    prompt: str
    negative_prompt: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise StyleError("a style has an empty name; give every style a non-empty 'name'")
        if not isinstance(self.prompt, str) or SLOT not in self.prompt:
            raise StyleError(
                f"style {self.name!r}: template {self.prompt!r} has no {SLOT} slot; write {SLOT} where the label goes"
            )
        if not isinstance(self.negative_prompt, str):
            raise StyleError(f"style {self.name!r}: negative_prompt must be a string")

    def apply(self, label: str) -> tuple[str, str]:
        """(prompt, negative prompt) for one label. Plain replacement, so other braces in a template are kept."""
        return self.prompt.replace(SLOT, label), self.negative_prompt


_PHOTO_NEG = "drawing, painting, illustration, cartoon, anime, sketch, render, text, watermark, deformed"
_ART_NEG = "photo, photograph, photorealistic, realistic, text, watermark, blurry, deformed"

# Ordered roughly from photographic (near ImageNet's covariate distribution) to abstract.
SDXL_STYLES: tuple[Style, ...] = (
    Style("photographic", "a sharp photograph of {prompt}, natural light, 50mm lens, high detail", _PHOTO_NEG),
    Style("hdr-photo", "an HDR photo of {prompt}, high dynamic range, vivid tones, crisp detail in shadows and highlights",
          _PHOTO_NEG + ", flat lighting"),
    Style("analog-film", "an analog film photograph of {prompt}, 35mm, visible film grain, faded colors, slight vignette",
          _PHOTO_NEG + ", digital look"),
    Style("cinematic", "a cinematic film still of {prompt}, anamorphic lens, shallow depth of field, moody color grading",
          _PHOTO_NEG),
    Style("long-exposure", "a long exposure photograph of {prompt}, motion blur trails, light streaks, tripod shot",
          _PHOTO_NEG),
    Style("macro-photo", "a macro photograph of {prompt}, extreme close-up, tiny details, soft bokeh background",
          _PHOTO_NEG),
    Style("infrared-photo", "an infrared photograph of {prompt}, false color, glowing white foliage, surreal tones",
          _PHOTO_NEG),
    Style("digital-art", "digital art of {prompt}, concept art, painterly brushwork, trending artstation illustration",
          _ART_NEG),
    Style("fantasy-art", "a fantasy painting of {prompt}, epic, magical atmosphere, ornate detail, dramatic light",
          _ART_NEG),
    Style("anime", "an anime illustration of {prompt}, cel shading, clean outlines, bright flat colors", _ART_NEG),
    Style("manga", "a black and white manga panel of {prompt}, screentone shading, ink lines, dynamic composition",
          _ART_NEG + ", color"),
    Style("comic-book", "a comic book drawing of {prompt}, bold ink outlines, halftone dots, saturated primary colors",
          _ART_NEG),
    Style("line-art", "minimalist line art of {prompt}, single continuous black line on white background",
          _ART_NEG + ", shading, color, texture"),
    Style("pencil-sketch", "a graphite pencil sketch of {prompt}, hatching, rough construction lines, paper texture",
          _ART_NEG + ", color"),
    Style("watercolor", "a watercolor painting of {prompt}, soft washes, bleeding pigments, textured paper", _ART_NEG),
    Style("oil-painting", "an oil painting of {prompt}, thick impasto brush strokes, rich pigments, canvas texture",
          _ART_NEG),
    Style("ukiyo-e", "an ukiyo-e woodblock print of {prompt}, Edo period style, flat color areas, bold contours",
          _ART_NEG + ", 3d"),
    Style("stained-glass", "a stained glass window depicting {prompt}, lead lines, glowing translucent colored glass",
          _ART_NEG),
    Style("mosaic", "a Roman tile mosaic of {prompt}, small square tesserae, grout lines, weathered stone", _ART_NEG),
    Style("pop-art", "a pop art print of {prompt}, Ben-Day dots, bold flat colors, repeated silkscreen look", _ART_NEG),
    Style("neon-punk", "a neon punk image of {prompt}, cyberpunk, glowing neon outlines, magenta and cyan, dark background",
          _ART_NEG),
    Style("3d-model", "a 3D render of {prompt}, octane render, studio lighting, smooth plastic materials", _ART_NEG),
    Style("isometric", "an isometric illustration of {prompt}, 3D game asset, clean geometry, soft shadows, plain background",
          _ART_NEG),
    Style("low-poly", "a low-poly model of {prompt}, faceted flat-shaded polygons, simple geometric shapes", _ART_NEG),
    Style("pixel-art", "pixel art of {prompt}, 16-bit retro game sprite, limited palette, crisp pixels",
          _ART_NEG + ", smooth, anti-aliased"),
    Style("clay", "a clay sculpture of {prompt}, claymation, plasticine, fingerprints, stop-motion look", _ART_NEG),
    Style("origami", "an origami model of {prompt}, folded paper, sharp creases, plain background", _ART_NEG),
    Style("papercut", "a layered papercut artwork of {prompt}, cut paper shapes, depth shadows, craft style", _ART_NEG),
    Style("embroidery", "an embroidery of {prompt}, colored thread stitches on fabric, hoop texture", _ART_NEG),
    Style("constructivist", "a constructivist poster of {prompt}, Soviet avant-garde, red black and cream, diagonal shapes",
          _ART_NEG),
    Style("cubist", "a cubist painting of {prompt}, fragmented planes, multiple viewpoints, muted earthy palette",
          _ART_NEG),
    Style("art-deco", "an art deco poster of {prompt}, geometric ornament, gold and black, symmetric streamlined forms",
          _ART_NEG),
    Style("abstract", "an abstract composition inspired by {prompt}, non-representational shapes and color fields",
          _ART_NEG + ", realistic detail"),
)


def builtin_styles() -> dict[str, Style]:
    """The built-in ``sdxl`` set, by name (in order)."""
    return {s.name: s for s in SDXL_STYLES}


def parse_style_file(path: str | Path) -> list[Style]:
    """Read a standard SDXL style file (JSON list of {name, prompt, negative_prompt})."""
    path = Path(path)
    if not path.exists():
        raise StyleError(f"style file {path} does not exist; pass --styles sdxl or an existing FILE.json")
    try:
        data = json.loads(read_text(path, what="style file", error=StyleError))
    except json.JSONDecodeError as e:
        raise StyleError(f"style file {path} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(data, list) or not data:
        raise StyleError(
            f"style file {path} must hold a non-empty JSON list of {{name, prompt, negative_prompt}} objects"
        )
    styles: list[Style] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "name" not in item or "prompt" not in item:
            raise StyleError(f"style file {path}: entry {i} is not an object with 'name' and 'prompt'")
        name = item["name"]
        if name in seen:
            raise StyleError(f"style file {path}: style name {name!r} appears twice; names must be unique")
        seen.add(name)
        try:
            styles.append(Style(name, item["prompt"], item.get("negative_prompt") or ""))
        except StyleError as e:
            raise StyleError(f"style file {path}: {e}") from None
    return styles


def select_styles(styles: list[Style], names: list[str], source: str) -> list[Style]:
    """Pick styles by name (in the order given); unknown names fail with close matches."""
    by_name = {s.name: s for s in styles}
    picked: list[Style] = []
    for name in names:
        if name not in by_name:
            close = difflib.get_close_matches(name, list(by_name), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(list(by_name)[:12])}, ..."
            raise StyleError(f"unknown style {name!r} in {source}; {hint}")
        if by_name[name] not in picked:
            picked.append(by_name[name])
    return picked


def load_styles(spec: str) -> list[Style]:
    """Styles from a spec: ``sdxl``, ``sdxl:a,b``, ``FILE.json`` or ``FILE.json:a,b``."""
    spec = (spec or "").strip()
    if not spec:
        raise StyleError("no styles given; pass --styles sdxl, sdxl:NAME,NAME or FILE.json")
    base, names = spec, None
    if spec != "sdxl" and not spec.lower().endswith(".json"):
        head, sep, tail = spec.rpartition(":")
        if sep and (head == "sdxl" or head.lower().endswith(".json")):
            base, names = head, [n.strip() for n in tail.split(",") if n.strip()]
            if not names:
                raise StyleError(f"--styles {spec!r} selects no style names after ':'")
    if base == "sdxl":
        styles, source = list(SDXL_STYLES), "the built-in sdxl set"
    elif base.lower().endswith(".json"):
        styles, source = parse_style_file(base), base
    else:
        raise StyleError(f"--styles {spec!r} is neither 'sdxl[:names]' nor a FILE.json[:names] style file")
    return select_styles(styles, names, source) if names else styles
