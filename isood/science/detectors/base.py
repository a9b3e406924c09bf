"""The contract of post-hoc OOD detectors and the container of what one forward pass captured.

A detector declares in ``requires`` what it needs from the classifier's forward pass:

- ``'logits'``       (N, C) class logits;
- ``'features'``     (N, D) penultimate features (the input of the final linear layer);
- ``'feature_maps'`` (N, C', H, W) the last feature maps before global pooling;
- ``'block3'``       (N, C'', H'', W'') the output of the block before the last (a ResNet's ``layer3``);
- ``'local_logits'`` (N, P, C) class logits of P local features per image (a CLIP model's patch features against
  its class prompts: GL-MCM);
- ``'fc'``           the final linear layer ``logits = features @ W.T + b`` (``fc_weight`` (C, D), ``fc_bias`` (C,));
- ``'tail'``         the model's last block + pooling + fc as a function ``block3 maps -> logits`` (RankFeat);
- ``'input'``        the model itself on the input batch (gradient-based input perturbation; only ODIN).

``requires`` is a class attribute; a detector whose needs depend on a hyper-parameter (RankFeat's ``blocks``)
sets it per instance in ``__init__``.

``Detector`` is an abstract base with template methods: ``fit(outputs, labels=None)`` checks the requirements
once, then calls the subclass's ``_fit`` and marks the detector fitted; ``score(outputs)`` (also ``detector(outputs)``)
checks, then calls ``_score``: one score per image, HIGHER = MORE in-distribution (OpenOOD's convention).
A subclass writes only ``_score`` (and ``_fit`` when ``needs_fit``), validates its hyper-parameters in
``__init__`` with ``self._param(...)`` (a one-line ``DetectorParamError``) and keeps each as an attribute of the
same name: ``params()`` is derived from the constructor's signature (keyword-only parameters after ``*`` are
execution settings such as a chunk size, accepted but not hyper-parameters). The name is given once, by
``@register_detector("name")``. Detectors are pure: arrays in, arrays out.

Importing the package loads no torch, scikit-learn or SciPy (each is imported inside the function that computes
with it): ``isood evaluate`` parses and checks ``--detectors`` before anything heavy loads. A hyper-parameter
that depends on the data (``knn``'s ``k`` at most the number of ID training images, ``vim``'s ``dim`` below the
feature dimension) is checked by ``preflight(n_train=, feature_dim=)`` before the forward pass.
"""

from __future__ import annotations

import abc
import inspect
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable

import numpy as np

from isood.core.arrays import as_array
from isood.core.errors import BadInputError, DetectorParamError, IsoodError

__all__ = [
    "KINDS", "CAPTURE_KINDS", "DetectorInputError", "ForwardOutputs", "Detector", "TemperatureDetector",
    "global_average_pool", "energy", "softmax", "ArrayFn",
]

CAPTURE_KINDS = ("logits", "features", "feature_maps", "block3", "local_logits")
KINDS = CAPTURE_KINDS + ("fc", "tail", "input")
_PER_IMAGE = ("logits", "features", "feature_maps", "block3", "local_logits", "labels")


class DetectorInputError(IsoodError):
    """A detector was given outputs that lack what it needs (or was never fitted)."""


#: A function of arrays, e.g. feature maps (N, C, H, W) -> features (N, C), or block-3 maps -> logits.
ArrayFn = Callable[[np.ndarray], np.ndarray]


def global_average_pool(feature_maps: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N, C): the mean over the spatial positions (ResNet's ``avgpool`` + ``flatten``)."""
    return np.asarray(feature_maps).mean(axis=(2, 3))


@dataclass
class ForwardOutputs:
    """What one forward pass over a dataset captured (NumPy arrays; absent kinds are ``None``).

    ``pool`` maps captured feature maps to penultimate features with the model's own head (defaults to global
    average pooling); ``tail`` (when the model has one) maps ``block3`` maps to logits through the model's last
    block, pooling and fc; both take and return numpy arrays (a model adapter wraps its layers: detectors never
    see torch). ``labels`` are the dataset's labels when it yields them.
    Users with their own arrays build one with ``ForwardOutputs.from_arrays(logits=..., features=...)``.
    """

    logits: np.ndarray | None = None
    features: np.ndarray | None = None
    feature_maps: np.ndarray | None = None
    block3: np.ndarray | None = None
    local_logits: np.ndarray | None = None
    fc_weight: np.ndarray | None = None
    fc_bias: np.ndarray | None = None
    labels: np.ndarray | None = None
    pool: ArrayFn = field(default=global_average_pool, repr=False, compare=False)
    tail: ArrayFn | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_arrays(cls, *, logits=None, features=None, feature_maps=None, block3=None, local_logits=None,
                    fc_weight=None, fc_bias=None, labels=None, pool: ArrayFn | None = None,
                    tail: ArrayFn | None = None) -> "ForwardOutputs":
        """Outputs from arrays (numpy, torch tensors or lists): logits (N, C), features (N, D), feature_maps
        (N, C', H, W), block3 (N, C'', H'', W''), local_logits (N, P, C), fc_weight (C, D), fc_bias (C,), labels
        (N,); per-image arrays must agree on N. ``pool``: feature maps -> features; ``tail``: block3 maps ->
        logits (numpy functions)."""
        ranks = {"logits": 2, "features": 2, "feature_maps": 4, "block3": 4, "local_logits": 3, "fc_weight": 2,
                 "fc_bias": 1, "labels": 1}
        given = {"logits": logits, "features": features, "feature_maps": feature_maps, "block3": block3,
                 "local_logits": local_logits, "fc_weight": fc_weight, "fc_bias": fc_bias, "labels": labels}
        arrays: dict[str, Any] = {k: None if v is None else as_array(v, k, ndim=ranks[k]) for k, v in given.items()}
        sizes = {k: arrays[k].shape[0] for k in _PER_IMAGE if arrays[k] is not None}
        if len(set(sizes.values())) > 1:
            raise BadInputError(f"per-image arrays disagree on the number of images ({sizes}): pass one row each")
        w, b = arrays["fc_weight"], arrays["fc_bias"]
        if b is not None and (w is None or b.shape[0] != w.shape[0]):
            raise BadInputError("fc_bias needs fc_weight with one row per bias entry: pass both (C, D) and (C,)")
        return cls(**arrays, pool=pool or global_average_pool, tail=tail)

    def __len__(self) -> int:
        for k in _PER_IMAGE:
            v = getattr(self, k)
            if v is not None:
                return int(v.shape[0])
        return 0

    @property
    def available(self) -> frozenset[str]:
        """The kinds present (``'fc'`` when the final layer's weight is known, ``'tail'`` when the last block is)."""
        got = {k for k in CAPTURE_KINDS if getattr(self, k) is not None}
        if self.fc_weight is not None:
            got.add("fc")
        if self.tail is not None:
            got.add("tail")
        return frozenset(got)

    def subset(self, index) -> "ForwardOutputs":
        """Rows ``index`` (slice, integer or boolean array) of every per-image array; fc, pool, tail are shared."""
        rows: dict[str, Any] = {k: (getattr(self, k)[index] if getattr(self, k) is not None else None)
                                for k in _PER_IMAGE}
        return replace(self, **rows)

    @staticmethod
    def concatenate(parts: Iterable["ForwardOutputs"]) -> "ForwardOutputs":
        """Stack the per-image arrays of several parts (fc, pool and tail are taken from the first)."""
        parts = list(parts)
        if not parts:
            raise BadInputError("nothing to concatenate: pass at least one ForwardOutputs")
        out: dict[str, Any] = {}
        for f in fields(ForwardOutputs):
            vals = [getattr(p, f.name) for p in parts]
            if f.name in _PER_IMAGE:
                out[f.name] = None if any(v is None for v in vals) else np.concatenate(vals, axis=0)
            else:
                out[f.name] = vals[0]
        return ForwardOutputs(**out)

    def captured(self, kind: str) -> np.ndarray:
        """The array of a captured kind (``'logits'``, ``'features'``, ...): what a detector's ``_score`` reads
        once ``check`` found it; a one-line ``DetectorInputError`` when the forward pass did not capture it."""
        if kind not in _PER_IMAGE:
            raise BadInputError(f"unknown captured kind {kind!r}: pass one of {', '.join(_PER_IMAGE)}")
        value = getattr(self, kind)
        if value is None:
            raise DetectorInputError(f"the forward pass captured no {kind}: capture them (a model exposing them)")
        return value

    def fc(self) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` of the final linear layer (a missing bias is zeros)."""
        if self.fc_weight is None:
            raise DetectorInputError("the final linear layer (fc) was not captured: the model must expose it")
        b = self.fc_bias if self.fc_bias is not None else np.zeros(self.fc_weight.shape[0], self.fc_weight.dtype)
        return self.fc_weight, b

    def head(self, features: np.ndarray) -> np.ndarray:
        """Logits of (possibly modified) penultimate features through the captured fc layer."""
        w, b = self.fc()
        return features @ w.T + b


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``logits / temperature`` in float64."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def energy(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Negative free energy ``T * logsumexp(logits / T)`` (Liu et al., NeurIPS 2020): higher = more ID."""
    from scipy.special import logsumexp

    z = np.asarray(logits, dtype=np.float64)
    return temperature * logsumexp(z / temperature, axis=1)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _cast(value: Any, kind: type) -> Any:
    """``value`` as ``kind`` (int: integers or integral floats only; float: numbers, not bools); else ValueError."""
    if isinstance(value, bool) or isinstance(value, str) and kind in (int, float):
        raise ValueError(value)
    if kind is int:
        if _is_int(value):
            return int(value)
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            return int(value)
        raise ValueError(value)
    return kind(value)


def _spec_value(value: Any) -> str:
    """A hyper-parameter as ``--detectors`` writes it (``registry._value`` reads it back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)) and "," not in str(value) and "=" not in str(value):
        return repr(value) if isinstance(value, float) else str(value)
    raise DetectorParamError(f"a detector parameter {value!r} cannot be written as --detectors text")


class Detector(abc.ABC):
    """Base class of every detector (see the module docstring). Class attributes: ``name`` (set by
    ``@register_detector``), ``requires``, ``needs_fit``, ``needs_labels``, ``zero_shot`` (True: the scores
    assume a CLIP zero-shot classifier's logits, cosine similarities with class prompts; MCM, GL-MCM)."""

    # class attributes, which an instance may override (RankFeat's ``requires``, a pytorch-ood adapter's all four)
    name: str = ""
    requires: frozenset[str] = frozenset()
    needs_fit: bool = False
    needs_labels: bool = False
    zero_shot: bool = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:  # an unregistered subclass is known by its class name
            cls.name = cls.__name__.lower()

    @property
    def fitted(self) -> bool:
        """True once ``fit`` ran (always for detectors that need no fitting)."""
        return not self.needs_fit or self.__dict__.get("_fitted", False)

    # -- the template ---------------------------------------------------------------------------------------
    def fit(self, outputs: ForwardOutputs, labels: np.ndarray | None = None) -> "Detector":
        """Check the requirements, estimate statistics on the ID training ``outputs`` (``_fit``); returns self."""
        self.check(outputs, fitting=True)
        self._fit(outputs, labels)
        self._fitted = True
        return self

    def score(self, outputs: ForwardOutputs) -> np.ndarray:
        """Check the requirements and that the detector is fitted; one score per image, higher = more ID."""
        self.check(outputs)
        return self._score(outputs)

    __call__ = score

    def _fit(self, outputs: ForwardOutputs, labels: np.ndarray | None) -> None:
        """Estimate statistics on the ID training outputs (nothing by default)."""

    @abc.abstractmethod
    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        """One score per image of checked outputs."""

    # -- requirements -------------------------------------------------------------------------------------
    def missing(self, available: Iterable[str]) -> frozenset[str]:
        """The captured kinds this detector needs that ``available`` lacks (``'input'`` is never captured)."""
        return frozenset(self.requires) - {"input"} - set(available)

    def preflight(self, *, n_train: int | None = None, feature_dim: int | None = None) -> None:
        """Check the hyper-parameters against what is known before the forward pass: ``n_train`` ID training
        images, ``feature_dim`` dimensions of the penultimate features (None: unknown, not checked). A value that
        cannot fit the data is a one-line ``DetectorParamError`` naming it and what to pass; nothing by default.
        ``_fit`` calls the same check on the data it gets, so the rule has one home per detector."""

    def requirement_hint(self, lack: frozenset[str]) -> str:
        """What to pass instead when the kinds ``lack`` are missing ("" when nothing but another model helps)."""
        return ""

    def check(self, outputs: ForwardOutputs, *, fitting: bool = False) -> None:
        """``DetectorInputError`` when ``outputs`` lack a required kind or images, or the detector is unfitted."""
        lack = self.missing(outputs.available)
        if lack:
            hint = self.requirement_hint(lack) or f"capture {sorted(self.requires - {'input'})} (a model exposing them)"
            raise DetectorInputError(
                f"detector '{self.name}' needs {', '.join(sorted(lack))} from the forward pass, which these "
                f"outputs lack: {hint}")
        if not fitting and not self.fitted:
            raise DetectorInputError(f"detector '{self.name}' is not fitted: call fit(id_train_outputs) first")
        if len(outputs) == 0:
            raise DetectorInputError(f"detector '{self.name}' got outputs with no image")

    # -- hyper-parameters ---------------------------------------------------------------------------------
    @classmethod
    def parameters(cls, *, settings: bool = True) -> dict[str, Any]:
        """The constructor's parameters and their defaults: the hyper-parameters (positional-or-keyword) and,
        with ``settings``, the keyword-only execution settings (e.g. ``chunk``) that never change a score."""
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD,) + ((inspect.Parameter.KEYWORD_ONLY,) if settings else ())
        sig = inspect.signature(cls.__init__)
        return {p.name: p.default for p in list(sig.parameters.values())[1:] if p.kind in kinds}

    def params(self) -> dict[str, Any]:
        """The hyper-parameters of this instance (for reports and cache keys): the positional-or-keyword
        parameters of the constructor, each read from the attribute of the same name."""
        return {name: getattr(self, name) for name in self.parameters(settings=False)}

    def resolved_params(self) -> dict[str, Any]:
        """The hyper-parameters as the run used them (for manifests and reports): ``params()`` with each
        data-dependent default (None until fitted, e.g. ViM's ``dim``) replaced by the value fitting chose."""
        return self.params()

    def _param(self, key: str, value: Any, kind: type, ok: Callable[[Any], bool] | None = None,
               rule: str = "") -> Any:
        """A validated hyper-parameter: ``value`` cast to ``kind`` and satisfying ``ok`` (described by ``rule``,
        e.g. ``'>= 1'``), else a one-line ``DetectorParamError`` naming the detector, the parameter and the
        default to pass instead."""
        default = self.parameters().get(key)
        hint = f"; pass {key}={default}" if default is not None and default is not inspect.Parameter.empty else ""
        try:
            v = _cast(value, kind)
        except (TypeError, ValueError):
            word = "an integer" if kind is int else "a number" if kind is float else kind.__name__
            raise DetectorParamError(f"{self.name}: {key} must be {word}, got {value!r}{hint}") from None
        if ok is not None and not ok(v):
            raise DetectorParamError(f"{self.name}: {key} must be {rule}, got {value!r}{hint}")
        return v

    def spec(self) -> str:
        """This detector as a ``--detectors`` entry (``'knn:k=50'``): its name and the hyper-parameters that differ
        from the defaults (None, the data-dependent default, is left out). ``parse_detectors(d.spec())`` builds an
        equal detector: the CLI's strings and the Python objects are one description."""
        defaults = self.parameters(settings=False)
        given = {k: v for k, v in self.params().items() if v is not None and v != defaults.get(k)}
        return self.name + "".join(f"{':' if i == 0 else ','}{k}={_spec_value(v)}" for i, (k, v) in
                                   enumerate(given.items()))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


class TemperatureDetector(Detector):
    """A detector whose one hyper-parameter is the softmax/energy temperature ``T`` (default 1, as in the
    MSP, Energy and GradNorm papers and OpenOOD v1.5)."""

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = self._param("temperature", temperature, float, lambda t: t > 0, "> 0")
