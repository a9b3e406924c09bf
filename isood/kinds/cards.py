"""The licence texts of isood's dataset cards (``CardSpec.licence``): what a published manifest may carry and
under whose terms (ImageNet's images never; generated images under their model's licence)."""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["imagenet_licence", "syn_licence", "syn_prompts_licence"]


def imagenet_licence(meta: Mapping[str, Any]) -> str:
    return ("ImageNet images are never redistributed: this dataset holds relative image paths, WordNet ids and shift "
            "values only. Obtain ImageNet-1K / ImageNet-21K from https://image-net.org under its terms of access and "
            "resolve `path` against the root of your own copy. WordNet is under the Princeton WordNet licence. "
            "The metadata in this repository is released by its publisher under the licence stated in the front "
            "matter.\n")


def syn_licence(meta: Mapping[str, Any]) -> str:
    pipeline = ((meta.get("command") or {}).get("config") or {}).get("pipeline") or "stabilityai/sdxl-turbo"
    settings = (((meta.get("command") or {}).get("config") or {}).get("generator") or {}).get("settings") or {}
    pipeline = settings.get("pipeline", pipeline)
    return (f"The Syn-IS images under `images/` were generated with `{pipeline}` and may be redistributed within "
            "the terms of that model's licence (for SDXL-Turbo: the Stability AI licence); check it before any "
            "commercial use. Prompts use ImageNet-21K labels (WordNet, Princeton licence). No ImageNet image is "
            "included; `d_sem` / `d_cov` were measured against in-distribution ImageNet features.\n")


def syn_prompts_licence(meta: Mapping[str, Any]) -> str:
    return ("No image is included (a plan only). Prompts use ImageNet-21K labels (WordNet, Princeton licence); "
            "`d_sem` / `d_cov` were measured against in-distribution ImageNet features.\n")
