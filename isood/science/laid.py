"""LAID: a learned linear map that splits CLIP features into a semantic and a covariate half (IS-OOD, Sec. LAID).

A feature f (length D) is mapped to fW; the semantic part is the first D/2 coordinates of fW and the covariate
part the last D/2 (D odd: the semantic part has D//2). W is trained on text triplets only and applied to image
features (CLIP aligns the two modalities):

    L_sem  = [ d(st_sem, cs_sem) - d(st_sem, ss_sem) + m ]_+      (same label close, other label far)
    L_cov  = [ d(st_cov, ss_cov) - d(st_cov, cs_cov) + m ]_+      (same template close, other template far)
    L_orth = || W^T W - I ||_F^2
    L      = w_sem * mean L_sem + w_cov * mean L_cov + w_orth * L_orth

with d the cosine distance 1 - cos, st = anchor text template_a(label_x), ss = semantic shift template_a(label_y),
cs = covariate shift template_b(label_x).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import struct
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from isood.core.arrays import as_array
from isood.core.errors import BadInputError
from isood.core.files import atomic_write_bytes, read_file

__all__ = ["LAID", "LaidFitOptions", "fit_laid", "laid_loss", "make_text_triplets", "text_set_hash",
           "DEFAULT_FIT_OPTIONS", "FitCallback"]

#: ``callback(step, steps, losses)`` after every optimisation step (losses: sem, cov, orth, total as floats).
FitCallback = Callable[[int, int, Mapping[str, float]], None]

#: Defaults of :func:`fit_laid`, chosen on the planted world (``isood.science.simulate.make_planted_world()``, D=64,
#: 4,000 triplets), where they recover the planted semantic subspace with mean cos^2 of principal angles
#: ~0.999 over seeds 0-2 (tests assert >= 0.95; a random orthogonal W gives ~0.5) in 1-2 s on one CPU core:
#: - margin 1.0: the cosine distance between unrelated texts is ~1, so the hinge stays active for nearly every
#:   triplet and keeps cleaning the halves; smaller margins switch off early and leave some covariate
#:   directions in the semantic half (measured recovery: m=0.7 -> 0.994, m=0.5 -> 0.988).
#: - orthogonality_weight 1.0: keeps ||W^T W - I||_F below ~0.1, so fW stays a near-rotation.
#: - num_threads 1: W is small (D x D), so one BLAS thread is as fast, makes the result independent of the
#:   machine's core count, and avoids oversubscription on busy machines (None = the BLAS library's setting).
#: - Adam, lr 0.01, 500 steps of batch 512 (longer runs change nothing measurable), init "identity"
#:   (W = I: the untrained split is the encoder's own first/last halves; "orthogonal" draws a random
#:   orthogonal start from the seed and converges to the same subspaces).
@dataclass(frozen=True)
class LaidFitOptions:
    """The options of :func:`fit_laid` (defaults above), checked on construction (``BadInputError``).

    ``optimizer`` 'adam' or 'sgd' (momentum 0.9), with torch's update rules; ``init`` 'identity', 'orthogonal' or
    a (D, D) array; ``num_threads`` BLAS threads during the fit, restored afterwards (None or 0: the library's
    setting).
    """

    margin: float = 1.0
    semantic_weight: float = 1.0
    covariate_weight: float = 1.0
    orthogonality_weight: float = 1.0
    optimizer: str = "adam"
    lr: float = 0.01
    steps: int = 500
    batch_size: int = 512
    init: Any = "identity"
    seed: int = 0
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        for name in ("margin", "semantic_weight", "covariate_weight", "orthogonality_weight", "lr"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (name == "lr" and v == 0):
                bound = "> 0" if name == "lr" else ">= 0"
                raise BadInputError(f"fit_laid: {name} must be a finite number {bound}, got {v!r}")
        for name in ("steps", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise BadInputError(f"fit_laid: {name} must be an integer >= 1, got {v!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise BadInputError(f"unknown optimizer {self.optimizer!r}; pass 'adam' or 'sgd'")
        if isinstance(self.init, str) and self.init not in ("identity", "orthogonal"):
            raise BadInputError(f"unknown LAID init {self.init!r}; pass 'identity', 'orthogonal' or a (D, D) array")
        if self.num_threads is not None and (isinstance(self.num_threads, bool) or int(self.num_threads) < 0):
            raise BadInputError(f"fit_laid: num_threads must be None or an integer >= 0, got {self.num_threads!r}")


#: The defaults of :func:`fit_laid` as a read-only mapping (option name -> value).
DEFAULT_FIT_OPTIONS: Mapping[str, Any] = MappingProxyType(asdict(LaidFitOptions()))


def text_set_hash(strings: Iterable[str]) -> str:
    """SHA-256 (hex) of a sequence of strings, in the given order (order is part of what W was trained on)."""
    h = hashlib.sha256()
    n = 0
    for s in strings:
        if not isinstance(s, str):
            raise BadInputError(f"text_set_hash: expected strings, got {type(s).__name__}; pass a list of texts")
        b = s.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
        n += 1
    h.update(n.to_bytes(8, "little"))
    return h.hexdigest()


def _apply_template(template: str | Callable[[str], str], label: str) -> str:
    if callable(template):
        return template(label)
    if isinstance(template, str) and "{}" in template:
        return template.format(label)
    raise BadInputError(f"template {template!r} is neither a callable nor a string containing '{{}}'; pass e.g. 'a photo of a {{}}.'")


def make_text_triplets(
    labels: Sequence[str], templates: Sequence[str | Callable[[str], str]], n: int, seed: int = 0
) -> tuple[list[str], list[str], list[str]]:
    """Sample ``n`` text triplets (anchor, semantic shift, covariate shift) from labels x templates, seeded.

    anchor = template_a(label_x); semantic shift = template_a(label_y), y != x; covariate shift =
    template_b(label_x), b != a. Templates are callables (open_clip's OPENAI_IMAGENET_TEMPLATES) or format
    strings with ``'{}'``. Duplicate labels are removed (order kept) so that y != x means a different text.
    """
    labels = list(dict.fromkeys(str(x) for x in labels))
    templates = list(templates)
    if len(labels) < 2:
        raise BadInputError(f"make_text_triplets needs at least 2 distinct labels, got {len(labels)}; pass more labels")
    if len(templates) < 2:
        raise BadInputError(f"make_text_triplets needs at least 2 templates, got {len(templates)}; pass more templates")
    if n < 1:
        raise BadInputError(f"make_text_triplets: n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    nl, nt = len(labels), len(templates)
    x = rng.integers(0, nl, size=n)
    y = (x + rng.integers(1, nl, size=n)) % nl
    a = rng.integers(0, nt, size=n)
    b = (a + rng.integers(1, nt, size=n)) % nt
    anchor = [_apply_template(templates[i], labels[j]) for i, j in zip(a, x)]
    semantic = [_apply_template(templates[i], labels[j]) for i, j in zip(a, y)]
    covariate = [_apply_template(templates[i], labels[j]) for i, j in zip(b, x)]
    return anchor, semantic, covariate


class LAID:
    """A fitted LAID map. ``W`` is a (D, D) numpy array; ``transform(x) -> (x @ W[:, :D//2], x @ W[:, D//2:])``."""

    def __init__(self, W: Any, config: dict | None = None, history: dict[str, Any] | None = None):
        W = as_array(W, "W").astype(np.float32)
        if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 2:
            raise BadInputError(f"LAID: W must be a square (D, D) matrix with D >= 2, got shape {W.shape}")
        self.W = W
        self.config = dict(config or {})
        self.history = {k: np.asarray(v, dtype=np.float64) for k, v in (history or {}).items()}
        #: How long ``fit_laid`` took (a run-time figure: never saved, so one seed gives one file hash).
        self.fit_seconds: float | None = None

    @property
    def dim(self) -> int:
        return self.W.shape[0]

    @property
    def semantic_dim(self) -> int:
        return self.dim // 2

    @property
    def orthogonality_error(self) -> float:
        """||W^T W - I||_F (0 for an exact rotation)."""
        W = self.W.astype(np.float64)
        return float(np.linalg.norm(W.T @ W - np.eye(self.dim)))

    def transform(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        """Split features (N, D) or (D,) into (semantic, covariate) parts of fW. Numpy or torch in, numpy out."""
        x = as_array(x, "features")
        if x.ndim not in (1, 2) or x.shape[-1] != self.dim:
            raise BadInputError(f"feature dimension mismatch: LAID W is {self.dim}x{self.dim} but features have shape {x.shape}; pass features from the encoder W was trained for")
        dtype = np.float64 if x.dtype == np.float64 else np.float32
        y = x.astype(dtype, copy=False) @ self.W.astype(dtype, copy=False)
        k = self.semantic_dim
        return y[..., :k], y[..., k:]

    # --- persistence ---
    def files(self, name: str = "laid.safetensors") -> dict[str, bytes]:
        """``{name: safetensors bytes, <stem>.json: config sidecar}``; identical W, history and config give
        identical bytes (the safetensors header is written with sorted keys)."""
        from safetensors.numpy import save

        tensors = {"W": np.ascontiguousarray(self.W)}
        for k, v in self.history.items():
            tensors[f"history.{k}"] = np.ascontiguousarray(v)
        meta = {"format": "isood.science.laid", "config": json.dumps(self.config, sort_keys=True)}
        side = dict(self.config)
        side["orthogonality_error"] = self.orthogonality_error
        return {
            name: _canonical_safetensors(save(tensors, metadata=meta)),
            Path(name).with_suffix(".json").name: (json.dumps(side, indent=2, sort_keys=True) + "\n").encode(),
        }

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "LAID bytes") -> "LAID":
        """The LAID whose ``files()`` safetensors bytes are ``data`` (pure: no file is touched); a one-line
        ``BadInputError`` naming ``where`` for bytes that are not a LAID."""
        from safetensors import SafetensorError
        from safetensors.numpy import load

        try:
            tensors = load(bytes(data))
            n = struct.unpack("<Q", data[:8])[0]
            meta = json.loads(data[8:8 + n]).get("__metadata__") or {}
            config = json.loads(meta.get("config", "{}"))
        except (SafetensorError, ValueError, struct.error, TypeError) as exc:
            raise BadInputError(f"cannot read LAID file {where}: {' '.join(str(exc).split())}; pass the "
                                ".safetensors written by LAID.save") from None
        if "W" not in tensors:
            raise BadInputError(f"LAID file {where} has no 'W' tensor; pass a file written by LAID.save")
        history = {k[len("history."):]: v for k, v in tensors.items() if k.startswith("history.")}
        return cls(tensors["W"], config=config, history=history)

    def save(self, path: str | Path) -> Path:
        """Write W (and the loss history) to ``path`` (safetensors) and the config to ``<path stem>.json``: the
        bytes of :meth:`files`, each written by the foundation's one file writer (``isood.core.files``)."""
        path = Path(path)
        for name, data in self.files(path.name).items():
            atomic_write_bytes(path.with_name(name), data)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "LAID":
        """Read a LAID saved by :meth:`save` (the JSON sidecar is optional; the config is also in the header):
        the file's bytes (``isood.core.files.read_file``) through :meth:`from_bytes`."""
        return cls.from_bytes(read_file(path, what="LAID file", hint="pass the .safetensors written by LAID.save"),
                              where=str(path))

    def __repr__(self) -> str:
        return f"LAID(dim={self.dim}, orthogonality_error={self.orthogonality_error:.3g})"


def _canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors bytes with the JSON header's keys sorted: safetensors writes ``__metadata__`` from
    a Rust HashMap, so with two or more metadata keys the byte order (and file hash) varies from call to call."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:  # cannot happen for a header serde_json wrote compactly; keep the original then
        return data
    return data[:8] + text + b" " * (n - len(text)) + data[8 + n :]


def _initial_W(init: Any, dim: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(init, str):
        if init == "identity":
            return np.eye(dim, dtype=np.float32)
        q, r = np.linalg.qr(rng.standard_normal((dim, dim)))  # "orthogonal": Haar-distributed (signs fixed)
        return (q * np.sign(np.diagonal(r))).astype(np.float32)
    W0 = as_array(init, "init")
    if W0.shape != (dim, dim):
        raise BadInputError(f"LAID init has shape {W0.shape}, expected ({dim}, {dim})")
    return np.array(W0, dtype=np.float32)


def _check_triplets(anchor: Any, semantic_shift: Any, covariate_shift: Any) -> list[np.ndarray]:
    """The three (N, D) arrays of one shape, triplets with a NaN/inf row dropped (with a warning)."""
    arrays = [as_array(a, n) for a, n in ((anchor, "anchor"), (semantic_shift, "semantic_shift"),
                                          (covariate_shift, "covariate_shift"))]
    if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 2:
        raise BadInputError(f"fit_laid: anchor, semantic_shift and covariate_shift must be (N, D) arrays of one "
                            f"shape, got {[a.shape for a in arrays]}")
    n, dim = arrays[0].shape
    if dim < 2 or n < 1:
        raise BadInputError(f"fit_laid: need at least one triplet of dimension >= 2, got shape {(n, dim)}")
    finite = np.all([np.isfinite(a).all(axis=1) for a in arrays], axis=0)
    if not finite.all():
        warnings.warn(f"fit_laid: {int((~finite).sum())} of {n} triplets contain NaN/inf and are dropped",
                      stacklevel=3)
        arrays = [a[finite] for a in arrays]
        if not finite.any():
            raise BadInputError("fit_laid: every triplet contains NaN/inf; pass finite text features")
    return arrays


def _cosine(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise cosine similarity of (B, k) arrays and its gradients with respect to x and y (as torch's
    ``cosine_similarity(eps=1e-8)`` computes it: the norms' product clamped at eps)."""
    nx = np.linalg.norm(x, axis=1, keepdims=True)
    ny = np.linalg.norm(y, axis=1, keepdims=True)
    den = np.maximum(nx * ny, _EPS)
    cos = (x * y).sum(axis=1, keepdims=True) / den
    return cos[:, 0], y / den - cos * x / np.maximum(nx * nx, _EPS), x / den - cos * y / np.maximum(ny * ny, _EPS)


_EPS = 1e-8


def laid_loss(W: np.ndarray, anchor: np.ndarray, semantic_shift: np.ndarray, covariate_shift: np.ndarray, *,
              margin: float = 1.0, semantic_weight: float = 1.0, covariate_weight: float = 1.0,
              orthogonality_weight: float = 1.0) -> tuple[dict[str, float], np.ndarray]:
    """The LAID losses of ``W`` on a batch of triplets (module docstring) and the gradient of the total with
    respect to ``W``, in closed form: ``({'sem', 'cov', 'orth', 'total'}, dL/dW)``. Pure numpy; the dtype of the
    arrays is kept (float64 for checks, float32 for fitting)."""
    dim = W.shape[0]
    k, n, m = dim // 2, len(anchor), float(margin)
    a, s, c = anchor @ W, semantic_shift @ W, covariate_shift @ W
    ga, gs, gc = np.zeros_like(a), np.zeros_like(s), np.zeros_like(c)
    losses = {}
    # semantic half: [d(a, c) - d(a, s) + m]_+ = [cos(a, s) - cos(a, c) + m]_+ (same label close)
    # covariate half: [d(a, s) - d(a, c) + m]_+ = [cos(a, c) - cos(a, s) + m]_+ (same template close)
    for name, half, near, far, g_near, g_far, weight in (
            ("sem", slice(0, k), s, c, gs, gc, semantic_weight),
            ("cov", slice(k, dim), c, s, gc, gs, covariate_weight)):
        cos_near, d_a_near, d_near = _cosine(a[:, half], near[:, half])
        cos_far, d_a_far, d_far = _cosine(a[:, half], far[:, half])
        hinge = cos_near - cos_far + m
        losses[name] = float(np.maximum(hinge, 0.0).mean())
        active = (weight * (hinge > 0) / n).astype(W.dtype)[:, None]
        ga[:, half] += active * (d_a_near - d_a_far)
        g_near[:, half] += active * d_near
        g_far[:, half] -= active * d_far
    gap = W.T @ W - np.eye(dim, dtype=W.dtype)
    losses["orth"] = float((gap * gap).sum())
    losses["total"] = (semantic_weight * losses["sem"] + covariate_weight * losses["cov"]
                       + orthogonality_weight * losses["orth"])
    grad = anchor.T @ ga + semantic_shift.T @ gs + covariate_shift.T @ gc + 4.0 * orthogonality_weight * (W @ gap)
    return losses, grad


class _Adam:
    """torch.optim.Adam's update (betas 0.9 / 0.999, eps 1e-8, bias-corrected), on one numpy array."""

    def __init__(self, lr: float) -> None:
        self.lr, self.t = lr, 0
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None

    def step(self, W: np.ndarray, grad: np.ndarray) -> None:
        m = np.zeros_like(W) if self.m is None else self.m
        v = np.zeros_like(W) if self.v is None else self.v
        self.t += 1
        self.m = m = 0.9 * m + 0.1 * grad
        self.v = v = 0.999 * v + 0.001 * grad * grad
        m_hat = m / (1 - 0.9 ** self.t)
        v_hat = v / (1 - 0.999 ** self.t)
        W -= (self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)).astype(W.dtype)


class _SGD:
    """torch.optim.SGD's update with momentum 0.9 (no dampening, no Nesterov), on one numpy array."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.buf: np.ndarray | None = None

    def step(self, W: np.ndarray, grad: np.ndarray) -> None:
        self.buf = grad.copy() if self.buf is None else 0.9 * self.buf + grad
        W -= (self.lr * self.buf).astype(W.dtype)


def fit_laid(anchor: Any, semantic_shift: Any, covariate_shift: Any, *, margin: float = 1.0,
             semantic_weight: float = 1.0, covariate_weight: float = 1.0, orthogonality_weight: float = 1.0,
             optimizer: str = "adam", lr: float = 0.01, steps: int = 500, batch_size: int = 512,
             init: Any = "identity", seed: int = 0, num_threads: int | None = 1,
             callback: FitCallback | None = None, texts: Sequence[str] | None = None,
             text_hash: str | None = None) -> LAID:
    """Train W on text triplets (N, D) with the LAID losses (module docstring); returns a :class:`LAID`.

    Options are those of :class:`LaidFitOptions` (defaults: :data:`DEFAULT_FIT_OPTIONS`, chosen so the planted
    world is recovered with mean cos^2 of principal angles >= 0.95). Pure numpy: the gradient of the losses in
    closed form (``laid_loss``), Adam or SGD with torch's update rules, float32, one BLAS thread by default.
    ``callback(step, steps, losses)`` is called after every step; ``texts`` (the training strings, hashed into
    ``config['text_hash']``) or ``text_hash`` (a precomputed hash) record what W was trained on. Triplets with a
    NaN/inf row are dropped with a warning.
    """
    options = LaidFitOptions(margin=margin, semantic_weight=semantic_weight, covariate_weight=covariate_weight,
                             orthogonality_weight=orthogonality_weight, optimizer=optimizer, lr=lr, steps=steps,
                             batch_size=batch_size, init=init, seed=seed, num_threads=num_threads)
    if texts is not None:
        text_hash = text_set_hash(texts)
    arrays = _check_triplets(anchor, semantic_shift, covariate_shift)
    with _blas_threads(num_threads):
        return _fit(arrays, options, callback, text_hash)


@contextlib.contextmanager
def _blas_threads(n: int | None):
    """Cap the BLAS threads inside the block (``threadpoolctl``, a dependency of scikit-learn); None/0: as is."""
    if not n:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(n), user_api="blas"):
        yield


def _fit(arrays: list[np.ndarray], opt: LaidFitOptions, callback: FitCallback | None, text_hash: str | None) -> LAID:
    n, dim = arrays[0].shape
    rng = np.random.default_rng(int(opt.seed))
    st, ss, cs = (np.ascontiguousarray(a, dtype=np.float32) for a in arrays)
    W = _initial_W(opt.init, dim, rng)
    step_fn = (_Adam if opt.optimizer == "adam" else _SGD)(float(opt.lr))
    weights = dict(margin=opt.margin, semantic_weight=opt.semantic_weight, covariate_weight=opt.covariate_weight,
                   orthogonality_weight=opt.orthogonality_weight)
    batch = min(int(opt.batch_size), n)
    hist: dict[str, list[float]] = {"sem": [], "cov": [], "orth": [], "total": []}
    t0 = time.perf_counter()
    for step in range(int(opt.steps)):
        idx = rng.integers(0, n, size=batch)
        losses, grad = laid_loss(W, st[idx], ss[idx], cs[idx], **weights)
        step_fn.step(W, grad)
        for key, v in losses.items():
            hist[key].append(v)
        if callback is not None:
            callback(step, int(opt.steps), losses)
    config = _fit_config(opt)
    config.update(dim=dim, n_triplets=n, text_hash=text_hash)
    laid = LAID(W, config=config, history=hist)
    laid.fit_seconds = round(time.perf_counter() - t0, 3)
    return laid


def _fit_config(opt: LaidFitOptions) -> dict[str, Any]:
    """The options as JSON-able values, as recorded in ``LAID.config`` (an init array is recorded as 'array')."""
    config = {key: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
              for key, v in asdict(opt).items()}
    if not isinstance(opt.init, str):
        config["init"] = "array"
    return config
