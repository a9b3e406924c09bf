"""The demo's report.html as a person sees it: opened from disk in headless Chromium (Debian's, via selenium).

Checks what only a browser can tell: every <img> decodes (``complete``, ``naturalWidth > 0``, ``img.decode()``
resolves), nothing is logged at level SEVERE on the console, the page loads no other file, Table 1 and the
per-cell table are there with the evaluation manifest's numbers, and a full-page screenshot shows the plots.

Chromium paints a truncated or bit-flipped PNG without any error (measured: half a PNG decodes, only a broken
signature fails), so each embedded image is also compared byte for byte with the manifest's plot files, which
``manifests.verify`` checks against their sha256. The last tests corrupt a copy of the report on purpose and
require each check to catch it.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import manifests

# Per <img>: alt, src, complete, naturalWidth, naturalHeight, whether img.decode() resolved, its box on the page and
# the <h2> section it is in.
_IMAGES_JS = """const done = arguments[arguments.length - 1];
const imgs = Array.from(document.images);
Promise.all(imgs.map(i => i.decode().then(() => true, () => false))).then(ok => done(imgs.map((i, k) =>
  ({alt: i.alt, src: i.getAttribute('src'), complete: i.complete, width: i.naturalWidth,
    height: i.naturalHeight, decoded: ok[k], rect: [i.getBoundingClientRect().left + window.scrollX,
    i.getBoundingClientRect().top + window.scrollY, i.getBoundingClientRect().width,
    i.getBoundingClientRect().height], section: document.evaluate('preceding::h2[1]', i, null,
    XPathResult.STRING_TYPE, null).stringValue}))));"""

# The first table after the <h2> whose text starts with arguments[0] (inside a <details> too).
_TABLE_JS = """const h = Array.from(document.querySelectorAll('h2')).find(e => e.textContent.startsWith(arguments[0]));
if (!h) return null;
for (let e = h.nextElementSibling; e && e.tagName !== 'H2'; e = e.nextElementSibling) {
  const t = e.tagName === 'TABLE' ? e : e.querySelector('table');
  if (t) return {headers: Array.from(t.querySelectorAll('thead th')).map(c => c.textContent),
                 rows: Array.from(t.querySelectorAll('tbody tr')).map(r =>
                       Array.from(r.children).map(c => c.textContent))};
}
return null;"""

# Anything that would make the page fetch another file (the report promises to be one self-contained file); a link
# to a section of the page itself (the table of contents: <a href="#id">) fetches nothing.
_EXTERNAL_JS = """return Array.from(document.querySelectorAll('script, link, iframe, object, embed, [src], [href]'))
  .map(e => e.tagName + ' ' + (e.getAttribute('src') || e.getAttribute('href') || ''))
  .filter(s => !s.startsWith('IMG data:image/png;base64,') && !/^A #[a-z0-9-]+$/.test(s));"""

# The table of contents: each link's text, target and whether an element with that id exists; and every <h2>.
_TOC_JS = """const nav = document.querySelector('nav.toc');
if (!nav) return null;
return {links: Array.from(nav.querySelectorAll('a')).map(a => ({text: a.textContent, href: a.getAttribute('href'),
          found: !!document.getElementById(a.getAttribute('href').slice(1)),
          heading: (document.getElementById(a.getAttribute('href').slice(1)) || {}).tagName})),
        h2: Array.from(document.querySelectorAll('h2')).map(h => ({id: h.id, text: h.textContent})),
        before_first_h2: !!(nav.compareDocumentPosition(document.querySelector('h2')) &
                            Node.DOCUMENT_POSITION_FOLLOWING)};"""

# The <h2> texts, and the <h3> texts inside the "Heatmaps: <dataset>" sections (one per detector).
_HEADINGS_JS = """const h2 = [], h3 = []; let heat = false;
for (const e of document.querySelectorAll('h2, h3')) {
  if (e.tagName === 'H2') { h2.push(e.textContent); heat = e.textContent.startsWith('Heatmaps'); }
  else if (heat) h3.push(e.textContent);
}
return [h2, h3];"""


@dataclass
class Page:
    """What the browser showed for one load of a report."""
    images: list[dict]
    severe: list[dict]
    toc: dict | None
    external: list[str]
    h2: list[str]
    heatmap_h3: list[str]
    table1: dict | None
    per_cell: dict | None
    screenshot: Path


def open_report(driver, html: Path, screenshot: Path) -> Page:
    """Load ``html`` from disk, collect the page's images, console errors, headings, tables and a full-page
    screenshot (PNG at ``screenshot``)."""
    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(html.resolve().as_uri())
    images = driver.execute_async_script(_IMAGES_JS)
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    headings = driver.execute_script(_HEADINGS_JS)
    return Page(images=images, severe=[e for e in driver.get_log("browser") if e["level"] == "SEVERE"],
                toc=driver.execute_script(_TOC_JS),
                external=driver.execute_script(_EXTERNAL_JS), h2=headings[0], heatmap_h3=headings[1],
                table1=driver.execute_script(_TABLE_JS, "Table 1"),
                per_cell=driver.execute_script(_TABLE_JS, "Per-cell"), screenshot=screenshot)


def plot_files(evaluation: Path) -> dict[str, bytes]:
    """The evaluation manifest's PNG plots: {relative path: bytes}."""
    m = manifests.read(evaluation, kind="evaluation")
    return {r["path"]: (evaluation / r["path"]).read_bytes() for r in m.meta["files"] if r["path"].endswith(".png")}


def _embedded_png(src: str) -> bytes:
    """The bytes of a ``data:image/png;base64,`` URI (b"" for anything else or bad base64)."""
    if not src.startswith("data:image/png;base64,"):
        return b""
    try:
        return base64.b64decode(src.split(",", 1)[1], validate=True)
    except binascii.Error:
        return b""


def image_problems(page: Page, plots: dict[str, bytes]) -> dict[str, list[str]]:
    """{alt: what is wrong} for each <img> the browser did not decode or that is not one of the plot files."""
    known = {png: Image.open(io.BytesIO(png)).size for png in plots.values()}
    problems = {}
    for img in page.images:
        why = []
        if not (img["complete"] and img["width"] > 0 and img["decoded"]):
            why.append(f"browser: complete={img['complete']} naturalWidth={img['width']} decode={img['decoded']}")
        data = _embedded_png(img["src"] or "")
        if data not in known:
            why.append("not byte-identical to any plot file")
        elif (img["width"], img["height"]) != known[data] and img["width"] > 0:
            why.append(f"browser size {img['width']}x{img['height']} != PNG size {known[data]}")
        if why:
            problems[img["alt"]] = why
    return problems


@pytest.fixture(scope="module")
def page(browser, demo_evaluation, tmp_path_factory) -> Page:
    """The demo's report.html loaded once in Chromium."""
    return open_report(browser, demo_evaluation / "report.html", tmp_path_factory.mktemp("shot") / "report.png")


def test_every_image_decodes_and_is_a_plot_of_the_manifest(page, demo_evaluation):
    plots = plot_files(demo_evaluation)
    assert plots and len(page.images) == len(plots)
    assert image_problems(page, plots) == {}
    # every plot file is shown once
    shown = [_embedded_png(i["src"]) for i in page.images]
    assert sorted(shown) == sorted(plots.values())


def test_no_console_error_and_nothing_else_is_loaded(page):
    assert page.severe == []
    assert page.external == []


def test_table1_shows_the_manifest_summary(page, demo_evaluation):
    m = manifests.read(demo_evaluation, kind="evaluation")
    summary = m.frame("table1").set_index(["detector", "dataset", "metric", "axis"])
    intervals = {}
    if "table1_intervals" in m.meta["tables"]:
        for r in m.frame("table1_intervals").itertuples():
            intervals[(r.detector, r.dataset, r.metric, r.axis)] = {
                "corr": (r.correlation_low, r.correlation_high), "sens": (r.sensitivity_low, r.sensitivity_high)}
        assert intervals  # the demo passes per-image scores: Table 1 has its intervals
    t = page.table1
    assert t is not None, page.h2
    labels = {"fpr95": "FPR@95", "auroc": "AUROC"}  # IS-OOD's Table 1: FPR@95 and AUROC, both axes
    columns = {f"{label} {kind} {axis}": (metric, kind, axis) for metric, label in labels.items()
               for axis in ("sem", "cov") for kind in ("corr", "sens")}
    assert t["headers"][:2] == ["detector", "dataset"] and sorted(t["headers"][2:]) == sorted(columns)
    pairs = summary.index.droplevel(["metric", "axis"]).unique()
    assert sorted(tuple(r[:2]) for r in t["rows"]) == sorted(pairs)
    for row in t["rows"]:
        for header, shown in zip(t["headers"][2:], row[2:]):
            metric, kind, axis = columns[header]
            ref = summary.loc[(row[0], row[1], metric, axis), "correlation" if kind == "corr" else "sensitivity"]
            value, _, interval = shown.partition(" ")  # "0.912 [0.884, 0.935]": the bootstrap 95% interval
            if math.isnan(ref):
                assert value == "N/A", (row[0], header)
            else:
                assert float(value) == pytest.approx(ref, abs=5e-4), (row[0], header)
            ci = intervals.get((row[0], row[1], metric, axis))
            if ci is not None and not math.isnan(ci[kind][0]):
                low, high = (float(x) for x in interval.strip("[]").split(", "))
                assert (low, high) == (pytest.approx(ci[kind][0], abs=5e-4), pytest.approx(ci[kind][1], abs=5e-4))


def test_per_cell_table_and_one_heatmap_section_per_detector(page, demo_evaluation):
    cells = manifests.read(demo_evaluation, kind="evaluation").frame("cell_metrics")
    t = page.per_cell
    assert t is not None, page.h2
    assert t["headers"] == list(cells.columns)
    assert len(t["rows"]) == len(cells)
    shown = {(r[0], r[2]) for r in t["rows"]}  # (detector, cell)
    assert shown == set(zip(cells["detector"], cells["cell"]))
    assert page.heatmap_h3 == list(dict.fromkeys(cells["detector"]))


def test_table_of_contents_links_every_section(browser, page, demo_evaluation, tmp_path):
    toc = page.toc
    assert toc is not None and toc["before_first_h2"]
    assert [(a["href"], a["text"]) for a in toc["links"]] == [(f"#{h['id']}", h["text"]) for h in toc["h2"]]
    assert all(a["found"] and a["heading"] == "H2" for a in toc["links"])
    assert len({h["id"] for h in toc["h2"]}) == len(toc["h2"]) == len(page.h2)
    assert any(t.startswith("Detectors compared") for t in page.h2) and "Per-cell bootstrap intervals" in page.h2
    # following a link scrolls its section to the top of the window (the page itself, nothing loaded)
    target = next(a for a in toc["links"] if a["text"].startswith("Level curves"))  # with page enough below it
    browser.find_element("css selector", f'nav.toc a[href="{target["href"]}"]').click()
    top = browser.execute_script("return document.getElementById(arguments[0]).getBoundingClientRect().top;",
                                 target["href"][1:])
    assert abs(top) < 5 and browser.current_url.endswith(target["href"])
    assert browser.execute_script("return window.scrollY;") > 300


def test_comparison_figures_are_embedded_and_written_as_vectors(page, demo_evaluation):
    m = manifests.read(demo_evaluation, kind="evaluation")
    files = {r["path"] for r in m.meta["files"]}
    compared = sorted(f for f in files if f.startswith("plots/compare_") and f.endswith(".png"))
    assert compared
    for f in compared:
        assert {f[:-3] + "svg", f[:-3] + "pdf"} <= files
    shown = [i for i in page.images if i["section"].startswith("Detectors compared")]
    assert len(shown) == len(compared)


def test_screenshot_shows_the_page_and_its_plots(page, demo_evaluation):
    shot = Image.open(page.screenshot).convert("RGB")
    assert shot.width >= 800 and shot.height >= 1000
    assert shot.getcolors(maxcolors=1) is None  # more than one colour
    # every heatmap is painted where the page lays it out: a colourful area, not blank
    heatmaps = [i for i in page.images if i["section"].startswith("Heatmaps")]
    assert len(heatmaps) == sum(p.startswith("plots/heatmap_") for p in plot_files(demo_evaluation))
    for img in heatmaps:
        x, y, w, h = (round(v) for v in img["rect"])
        assert w > 100 and h > 50 and y + h <= shot.height, img["alt"]
        crop = shot.crop((x, y, x + w, y + h))
        assert crop.getcolors(maxcolors=50) is None, img["alt"]  # many colours
        rgb = np.asarray(crop).astype(int)
        assert (np.ptp(rgb, axis=2) > 60).mean() > 0.05, img["alt"]  # saturated pixels, not only greys


def _corrupt_copy(evaluation: Path, out: Path, index: int, how: str) -> tuple[Path, str]:
    """A copy of report.html with its ``index``-th embedded PNG broken ``how``; returns (path, that image's alt)."""
    text = (evaluation / "report.html").read_text()
    found = list(re.finditer(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', text))
    match = found[index]
    data = match.group(2)
    bad = {"bad-signature": "A" * 12 + data[12:],       # the browser cannot decode it
           "truncated": data[: len(data) // 8 * 4]}[how]  # the browser paints half of it without an error
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.html").write_text(text[:match.start(2)] + bad + text[match.end(2):])
    return out / "report.html", match.group(1)


@pytest.mark.parametrize("how", ["bad-signature", "truncated"])
def test_a_broken_image_is_caught(browser, demo_evaluation, tmp_path, how):
    plots = plot_files(demo_evaluation)
    html, alt = _corrupt_copy(demo_evaluation, tmp_path / "copy", 1, how)
    page = open_report(browser, html, tmp_path / "shot.png")
    problems = image_problems(page, plots)
    assert list(problems) == [alt]
    if how == "bad-signature":
        assert problems[alt][0].startswith("browser:")


def test_a_console_error_is_caught(browser, demo_evaluation, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    text = (demo_evaluation / "report.html").read_text()
    (out / "report.html").write_text(text.replace("</head>", '<link rel="stylesheet" href="missing.css"></head>', 1))
    page = open_report(browser, out / "report.html", tmp_path / "shot.png")
    assert len(page.severe) == 1 and "missing.css" in page.severe[0]["message"]
    assert page.external == ["LINK missing.css"]


def test_report_copy_is_independent_of_the_directory(browser, demo_evaluation, tmp_path):
    """The report alone, copied away from plots/ and data/, shows every image (it embeds them)."""
    shutil.copy(demo_evaluation / "report.html", tmp_path / "alone.html")
    page = open_report(browser, tmp_path / "alone.html", tmp_path / "shot.png")
    assert image_problems(page, plot_files(demo_evaluation)) == {}
    assert page.severe == []
