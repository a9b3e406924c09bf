"""The rows of bench/shift_nn.py: the exact truth, one measured index setting (:class:`Row`), and the indexes the
field uses, run through faiss directly (HNSWFlat, IVF-PQ fast-scan + exact refine, IVFFlat's own search). The
IVF-based ones reuse isood's k-means centroids (their build time excludes that k-means)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from _results import rss_bytes

from isood.science.grid import bin_with_edges, level_edges

HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF = 32, 40, (64, 128, 256, 512)
PQ_M, PQ_NPROBE, PQ_K_FACTORS = 64, 128, (16, 64, 256)


@dataclass
class Row:
    """One index setting as measured."""

    name: str
    params: str
    build_s: float = float("nan")
    index_bytes: float = float("nan")
    rss_bytes: float = float("nan")
    qps: float = float("nan")
    cpu_qps: float = float("nan")
    speedup: float = float("nan")
    speedup_cpu: float = float("nan")
    recall: float = float("nan")
    agreement: float = float("nan")
    note: str = ""

    def meets(self, speedup: float, recall: float, agreement: float) -> bool:
        return self.speedup >= speedup and self.recall >= recall and self.agreement >= agreement

    def line(self) -> str:
        mb = lambda b: "-" if b != b else f"{b / 2**20:,.0f}"  # noqa: E731 - NaN: not measured
        if self.qps != self.qps:
            return f"{self.name:<22} {self.params:<62} {self.note}"
        return (f"{self.name:<22} {self.params:<62} {self.build_s:8.1f} {mb(self.index_bytes):>9} {mb(self.rss_bytes):>8} "
                f"{self.qps:8,.0f} {self.speedup:7.1f} {self.speedup_cpu:6.1f} {self.recall:7.4f} {self.agreement:7.2%}")

    def short(self) -> str:
        if self.qps != self.qps:
            return f"{self.name} {self.params}"
        return (f"{self.name} {self.params}: build {self.build_s:.0f} s, RSS +{self.rss_bytes / 2**20:,.0f} MB, "
                f"{self.speedup:.1f}x ({self.speedup_cpu:.1f}x CPU), R@1 {self.recall:.4f}, levels {self.agreement:.2%}")


@dataclass
class Truth:
    """Exact answers on the measured queries (and the tuning queries' nearest rows) and faiss flat's rate."""

    sims: np.ndarray
    idx: np.ndarray
    tune_idx: np.ndarray
    flat_qps: float
    flat_cpu: float
    flat_s: float
    edges: np.ndarray = field(init=False)
    levels: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        d = np.clip(1.0 - self.sims, 0.0, 2.0)
        self.edges = level_edges(d)
        self.levels = bin_with_edges(d, self.edges)

    def row(self, name: str, params: str, sims: np.ndarray, idx: np.ndarray, qps: float, cpu_qps: float,
            **build) -> Row:
        """A measured setting: recall@1 and level agreement of its answers on the measured queries."""
        agree = bin_with_edges(np.clip(1.0 - sims, 0.0, 2.0), self.edges) == self.levels
        return Row(name, params, qps=qps, cpu_qps=cpu_qps, speedup=qps / self.flat_qps,
                   speedup_cpu=cpu_qps / self.flat_cpu, recall=float(np.mean(idx == self.idx)),
                   agreement=float(np.mean(agree)), **build)


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def _built(fn):
    rss0 = rss_bytes()
    index, wall, _ = _timed(fn)
    return index, dict(build_s=wall, rss_bytes=rss_bytes() - rss0)


def hnsw_rows(ref: np.ndarray, q: np.ndarray, truth: Truth, *, centroids: np.ndarray, **_) -> list[Row]:
    """faiss IndexHNSWFlat (inner product), M 32, efConstruction 40, efSearch swept."""
    import faiss

    def build():
        index = faiss.IndexHNSWFlat(ref.shape[1], HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.add(ref)
        return index

    index, build_info = _built(build)
    build_info["index_bytes"] = ref.nbytes + index.hnsw.neighbors.size() * 4 + index.hnsw.offsets.size() * 8
    rows = []
    for ef in HNSW_EF:
        index.hnsw.efSearch = ef
        (sims, idx), wall, cpu = _timed(lambda: index.search(q, 1))
        rows.append(truth.row("faiss hnsw", f"M {HNSW_M}, efConstruction {HNSW_EF_CONSTRUCTION}, efSearch {ef}",
                              sims[:, 0], idx[:, 0], len(q) / wall, len(q) / cpu, **build_info))
    return rows


def _quantizer(centroids: np.ndarray):
    import faiss

    quantizer = faiss.IndexFlatIP(centroids.shape[1])
    quantizer.add(centroids)
    return quantizer


def pq_refine_rows(ref: np.ndarray, q: np.ndarray, truth: Truth, *, centroids: np.ndarray, seed: int,
                   **_) -> list[Row]:
    """faiss IVF-PQ fast-scan (PQ 64 x 4 bits) on isood's centroids, candidates re-ranked exactly
    (IndexRefineFlat, k_factor swept) at nprobe 128."""
    import faiss

    quantizer = _quantizer(centroids)

    def build():
        base = faiss.IndexIVFPQFastScan(quantizer, ref.shape[1], len(centroids), PQ_M, 4, faiss.METRIC_INNER_PRODUCT)
        index = faiss.IndexRefineFlat(base)
        rng = np.random.default_rng(seed)
        index.train(ref[np.sort(rng.choice(len(ref), min(len(ref), 65_536), replace=False))])
        index.add(ref)
        return index, base

    (index, base), build_info = _built(build)
    base.nprobe = PQ_NPROBE
    build_info["index_bytes"] = len(ref) * (PQ_M // 2 + 8) + ref.nbytes
    rows = []
    for k in PQ_K_FACTORS:
        index.k_factor = k
        (sims, idx), wall, cpu = _timed(lambda: index.search(q, 1))
        rows.append(truth.row("faiss ivf-pq + refine", f"nlist {len(centroids)}, PQ{PQ_M}x4fs, nprobe {PQ_NPROBE}, "
                              f"k_factor {k}", sims[:, 0], idx[:, 0], len(q) / wall, len(q) / cpu, **build_info))
    return rows


def faiss_ivf_rows(ref: np.ndarray, q: np.ndarray, truth: Truth, *, centroids: np.ndarray, nprobes: list[int],
                   **_) -> list[Row]:
    """faiss IndexIVFFlat's own (per-query) search on isood's centroids: the same lists, another scan."""
    import faiss

    quantizer = _quantizer(centroids)

    def build():
        index = faiss.IndexIVFFlat(quantizer, ref.shape[1], len(centroids), faiss.METRIC_INNER_PRODUCT)
        index.is_trained = True
        index.add(ref)
        return index

    index, build_info = _built(build)
    build_info["index_bytes"] = len(ref) * (ref.shape[1] * 4 + 8)
    rows = []
    for nprobe in nprobes:
        index.nprobe = nprobe
        (sims, idx), wall, cpu = _timed(lambda: index.search(q, 1))
        rows.append(truth.row("faiss ivf (own search)", f"nlist {len(centroids)}, nprobe {nprobe}", sims[:, 0],
                              idx[:, 0], len(q) / wall, len(q) / cpu, **build_info))
    return rows


#: The field's indexes, by --skip name.
FIELD_INDEXES = {"ivf": faiss_ivf_rows, "hnsw": hnsw_rows, "pq": pq_refine_rows}
