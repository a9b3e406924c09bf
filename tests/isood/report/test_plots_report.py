"""Heatmaps read back from the PNG against independent expectations (pixel size = figsize x dpi, N/A cells in
the grey of ``NA_COLOR`` decoded by PIL, measured cells in matplotlib's own viridis and in value order), level
curves, the self-contained HTML report and the evaluation manifest writer."""

import base64
import io
import re

import numpy as np
import pandas as pd
import pytest
from matplotlib import colormaps
from PIL import Image, ImageColor

import manifests
from isood.evaluation import evaluate_scores
from isood.report import html as report, plots
from isood.stages.evaluate.write import write_evaluation

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def result():
    """3x3 grid; cov_2_sem_2 has 3 images (N/A), cov_2_sem_1 has none at all; two detectors."""
    rng = np.random.default_rng(0)
    cov, sem = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
    counts = np.full((3, 3), 20)
    counts[2, 2], counts[2, 1] = 3, 0
    cov = np.repeat(cov.ravel(), counts.ravel())
    sem = np.repeat(sem.ravel(), counts.ravel())
    images = pd.DataFrame({"cov_level": cov, "sem_level": sem})
    ood = rng.normal(-0.8 * sem, 1.0)
    idd = rng.normal(0.0, 1.0, 100)
    return evaluate_scores({"msp": idd, "energy": 2 * idd}, {"msp": ood, "energy": 2 * ood + 0.3 * cov}, images,
                           dataset="splits")


def _pixel(png: bytes, fig, ax, x: float, y: float):
    """RGB of the PNG pixel at data coordinates (x, y) of ``ax``."""
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    px, py = ax.transData.transform((x, y))
    return img[int(round(img.shape[0] - py)), int(round(px))]


def _nearest_lut_index(rgb, lut):
    """Index of the colour of a 256-entry colour table closest to ``rgb`` (0-255)."""
    return int(np.argmin(np.abs(lut - np.asarray(rgb, float)).sum(axis=1)))


def test_heatmap_size_grey_na_cells_and_cell_colours(result):
    fig = plots.heatmap_figure(result.per_cell, detector="msp", metric="auroc")
    png = plots.figure_png(fig)
    img = Image.open(io.BytesIO(png))
    assert img.size == (round(plots.HEATMAP_SIZE[0] * plots.DPI), round(plots.HEATMAP_SIZE[1] * plots.DPI))
    ax = fig.axes[0]
    grey = np.array(ImageColor.getrgb(plots.NA_COLOR), float)
    # (x = semantic level, y = covariate level); off-centre to miss the printed text
    for s, c in ((2, 2), (1, 2)):  # N/A by count, and a cell with no image at all
        assert np.abs(_pixel(png, fig, ax, s + 0.3, c + 0.3).astype(int) - grey).max() <= 2
    # a measured cell has the viridis colour of its value's place in the metric's own range, not grey
    measured = result.per_cell.query("detector == 'msp' and not na")
    lo, hi = measured["auroc"].min(), measured["auroc"].max()
    v = float(result.per_cell.query("detector == 'msp' and cell == 'cov_0_sem_2'")["auroc"].iloc[0])
    want = np.round(np.array(colormaps["viridis"]((v - lo) / (hi - lo))[:3]) * 255)
    got = _pixel(png, fig, ax, 2 + 0.3, 0 + 0.3).astype(int)
    assert np.abs(got - want).max() <= 3
    assert np.abs(got - grey).max() > 20
    # lower-is-better metrics use the reversed map: a low FPR is bright (yellow end of viridis)
    fig2 = plots.heatmap_figure(result.per_cell, detector="msp", metric="fpr95")
    png2 = plots.figure_png(fig2)
    f = float(result.per_cell.query("detector == 'msp' and cell == 'cov_0_sem_2'")["fpr95"].iloc[0])
    flo, fhi = measured["fpr95"].min(), measured["fpr95"].max()
    want2 = np.round(np.array(colormaps["viridis_r"]((f - flo) / (fhi - flo))[:3]) * 255)
    assert np.abs(_pixel(png2, fig2, fig2.axes[0], 2.3, 0.3).astype(int) - want2).max() <= 3
    # every measured cell's colour sits on viridis at its value's position in the range of the metric's values
    # (the lowest at one end, the highest at the other, not a fixed [0, 1]), so the colours follow the values
    lut = np.round(colormaps["viridis"](np.linspace(0, 1, 256))[:, :3] * 255)
    positions, values = [], []
    for rec in measured.itertuples():
        positions.append(_nearest_lut_index(_pixel(png, fig, ax, rec.sem_level + 0.3, rec.cov_level + 0.3), lut))
        values.append(rec.auroc)
    assert np.abs(np.array(positions) - (np.array(values) - lo) / (hi - lo) * 255).max() <= 3
    assert min(positions) <= 2 and max(positions) >= 253
    assert np.argsort(positions, kind="stable").tolist() == np.argsort(values, kind="stable").tolist()
    # a fixed range is still available: at [0, 1] the position is the value itself
    fixed = plots.figure_png(plots.heatmap_figure(result.per_cell, detector="msp", metric="auroc", limits=(0, 1)))
    assert abs(_nearest_lut_index(_pixel(fixed, fig, ax, 2.3, 0.3), lut) - v * 255) <= 3
    # each cell shows its number of images: the N/A cell of 3 images too; the cell without any image none
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("n=20") == 7 and texts.count("n=3") == 1 and "n=0" not in texts
    assert texts.count("N/A") == 2


def test_plots_are_deterministic_with_fixed_names(result):
    a = plots.heatmap_png(result.per_cell, detector="energy", metric="autc")
    b = plots.heatmap_png(result.per_cell, detector="energy", metric="autc")
    assert a == b
    curve = plots.level_curve_png(result.levels, metric="auroc", axis="sem")
    assert Image.open(io.BytesIO(curve)).size == (round(plots.CURVE_SIZE[0] * plots.DPI),
                                                  round(plots.CURVE_SIZE[1] * plots.DPI))
    rendered = plots.render_plots(result, metrics=["auroc", "fpr95"])
    paper = {f"plots/{f}.{ext}" for f in ("compare_splits_auroc", "compare_splits_fpr95", "levels_splits_sem_auroc",
                                          "levels_splits_cov_auroc", "levels_splits_sem_fpr95",
                                          "levels_splits_cov_fpr95") for ext in ("png", "svg", "pdf")}
    assert set(rendered) == paper | {
        f"plots/heatmap_splits_{d}_{m}.{ext}" for d in ("msp", "energy") for m in ("auroc", "fpr95")
        for ext in ("png", "svg", "pdf")}
    again = plots.render_plots(result, metrics=["auroc", "fpr95"])
    assert again == rendered  # every format byte for byte, SVG ids and PDF metadata included
    svg, pdf = rendered["plots/compare_splits_auroc.svg"], rendered["plots/compare_splits_auroc.pdf"]
    assert svg.startswith(b"<?xml") and b"<dc:date>" not in svg
    assert pdf.startswith(b"%PDF") and b"/CreationDate" not in pdf
    assert rendered["plots/heatmap_splits_energy_autc.png".replace("autc", "auroc")] != a
    with pytest.raises(ValueError, match="not computed"):
        plots.render_plots(result, metrics=["der95"])


def test_html_report_is_self_contained(result):
    images = plots.render_plots(result, metrics=["auroc"])
    text = report.render_html(result, images, title="T <1>", meta={"model": "m&m"})
    srcs = re.findall(r'src="([^"]*)"', text)
    pngs = {k: v for k, v in images.items() if k.endswith(".png")}
    assert len(srcs) == len(pngs) == 5  # 2 heatmaps, the comparison, 2 level curves; SVG / PDF stay files
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    decoded = {base64.b64decode(s.split(",", 1)[1]) for s in srcs}
    assert decoded == set(pngs.values())
    low = text.lower()
    assert "http://" not in low and "https://" not in low and "<script" not in low and "<link" not in low
    # the only links are the table of contents', each to a section of the page
    targets = re.findall(r'href="([^"]*)"', text)
    ids = re.findall(r'<h2 id="([^"]+)">', text)
    assert targets == [f"#{i}" for i in ids] and len(ids) == len(re.findall(r"<h2", text)) == len(set(ids))
    assert "T &lt;1&gt;" in text and "m&amp;m" in text  # escaped
    # Table 1 numbers appear as computed
    corr = result.summary.query("detector == 'msp' and axis == 'sem' and metric == 'auroc'")["correlation"].iloc[0]
    assert f"{corr:.3f}" in text
    md = report.render_markdown(result, title="T")
    assert "### splits" in md and "| msp |" in md and f"{corr:.3f}" in md
    mean = result.means.query("detector == 'energy'")["auroc"].iloc[0]
    assert f"{mean:.3f}" in md


def test_write_evaluation_is_a_verified_manifest(result, tmp_path):
    out = tmp_path / "ev"
    m = write_evaluation(result, out, config={"note": "test"}, metrics=["auroc", "fpr95"],
                         heatmap_metrics=["auroc"])
    assert m.kind == "evaluation" and manifests.verify(out).ok
    files = {r["path"] for r in m.meta["files"]}
    assert {"report.html", "summary.md", "results/cell_metrics.csv", "README.md",
            "plots/heatmap_splits_msp_auroc.png", "plots/levels_splits_cov_fpr95.png"} <= files
    assert "plots/heatmap_splits_msp_fpr95.png" not in files
    back = manifests.read(out, kind="evaluation").cell_metrics
    pd.testing.assert_frame_equal(back, result.per_cell, check_dtype=False)
    csv = pd.read_csv(out / "results" / "table1.csv")
    assert np.allclose(csv["correlation"].to_numpy(), result.summary["correlation"].to_numpy(), equal_nan=True,
                       rtol=1e-5)


def test_heatmaps_come_as_vector_files_whose_counts_are_the_cells(result):
    """Every per-detector heatmap has an SVG and a PDF beside its PNG; both parse, and the count drawn in each
    cell of the SVG (the group named after the cell) is that cell's number of images in the per-cell table."""
    import xml.etree.ElementTree as ET

    rendered = plots.render_plots(result, metrics=["auroc"])
    pngs = [k for k in rendered if k.startswith("plots/heatmap_") and k.endswith(".png")]
    assert pngs
    per_cell = result.per_cell
    for png in pngs:
        stem = png[:-len(".png")]
        pdf, svg = rendered[f"{stem}.pdf"], rendered[f"{stem}.svg"]
        assert pdf.startswith(b"%PDF-") and pdf.rstrip().endswith(b"%%EOF")
        root = ET.fromstring(svg, parser=ET.XMLParser(target=ET.TreeBuilder(insert_comments=True)))  # well-formed
        det = stem.split("_")[2]
        rows = per_cell[(per_cell["detector"] == det) & (per_cell["dataset"] == "splits")]
        expected = {f"count_cov_{r.cov_level}_sem_{r.sem_level}": f"n={r.n}" for r in rows.itertuples()}
        shown = {}
        for g in root.iter("{http://www.w3.org/2000/svg}g"):
            if g.get("id", "").startswith("count_"):
                comment = next(c for c in g if c.tag is ET.Comment)  # matplotlib writes each text as a comment
                shown[g.get("id")] = comment.text.strip()
        assert shown == expected, (png, shown, expected)
    fig = plots.heatmap_figure(per_cell, detector="msp", metric="auroc", dataset="splits")
    counts = [t for t in fig.axes[0].texts if t.get_text().startswith("n=")]
    values = [t for t in fig.axes[0].texts if re.fullmatch(r"\d\.\d\d", t.get_text())]
    assert min(t.get_fontsize() for t in counts) >= max(t.get_fontsize() for t in values) - 1 >= 6
    na = [t for t in fig.axes[0].texts if t.get_text() == "N/A"]
    assert na and all(t.get_color() == plots.NA_TEXT_COLOR for t in na)
