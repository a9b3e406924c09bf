"""Pytorch-ood detectors as isood detectors (the adapter runs torch, so it lives here, beside the models; the
name space ``pytorch-ood:`` is registered when this module is imported, as ``isood.stages.evaluate.options`` does): ``from_pytorch_ood(detector)`` and ``--detectors pytorch-ood:Name``.

pytorch-ood (``pip install 'isood[pytorch-ood]'``; tested with 0.4) scores mean MORE OOD: the adapter negates them
(isood: higher = more ID). It feeds a detector the captured outputs that its representation API consumes, so
there is no new forward pass:

- ``LogitsDetector`` (MaxSoftmax, EnergyBased, MaxLogit, Entropy, GEN, KLMatching, ...): ``logits``, through
  ``fit_logits`` / ``predict_logits``;
- ``FeaturesDetector`` (ViM, KNN, Mahalanobis, RMD, DICE, fDBD, NCI, SHE, ...): the penultimate ``features``,
  through ``fit_features`` / ``predict_features``;
- ``FeatureMapsDetector`` (ASH, ReAct, RankFeat, SCALE, ...): the pre-pool ``feature_maps``, through
  ``fit_feature_maps`` / ``predict_feature_maps``; a missing ``head`` (maps -> logits) is the model's pool + fc.

Detectors that need the model on the input (``GradientDetector``: ODIN, GradNorm, MCD, ...) or several layers
(``StructuredDetector``) cannot score captured outputs and are refused by name.

By name (``pytorch-ood:ViM``, ``pytorch-ood:KNN:k=10``) the detector is built at its first fit or score, from the
outputs: ``model`` / ``encoder`` / ``backbone`` = None, ``w`` / ``b`` = the fc layer, ``head`` = the fc layer
(features) or pool + fc (feature maps); ViM's ``d`` defaults to isood's ViM rule. Fitting labels are the ID
training labels when the data has them, else all 0 (pytorch-ood reads labels < 0 as OOD); the class-conditional
detectors (Mahalanobis, RMD, GMM, SHE) and TemperatureScaling need real labels.

Parameters are checked as early as their rule allows, each a one-line ``DetectorParamError``: their type when
``--detectors`` is parsed (the type of pytorch-ood's default, else its annotation: ``EnergyBased:t`` is a
number, ``KNN:k`` an integer); before the forward pass (``preflight``) what depends on the data: ``KNN`` /
``NNGuide``'s ``k`` at most the ID training images, ``ViM``'s ``d`` below the feature dimension (pytorch-ood
would silently halve it), and the detector's own constructor checks (a trial build on the feature dimension).
What pytorch-ood logs or warns while isood calls it becomes one warning line per distinct message, prefixed by
the detector's name (``_library_messages``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from isood.core.errors import BadInputError, DetectorParamError

from isood.science.detectors.base import Detector, DetectorInputError, ForwardOutputs, _cast
from isood.science.detectors.registry import UnknownDetectorError, register_namespace
from isood.science.detectors.vim import default_vim_dim

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["PREFIX", "PytorchOODDetector", "from_pytorch_ood", "pytorch_ood_detector", "pytorch_ood_names"]

PREFIX = "pytorch-ood"
INSTALL = "pip install 'isood[pytorch-ood]'"
_BASES = (("LogitsDetector", "logits"), ("FeaturesDetector", "features"), ("FeatureMapsDetector", "feature_maps"))
_MODEL_ARGS = ("model", "encoder", "backbone")
_FC_ARGS = ("w", "b", "head")
_NEEDS_LABELS = frozenset({"Mahalanobis", "RMD", "GMM", "SHE", "TemperatureScaling"})
_DEFAULTS = {("ViM", "d"): default_vim_dim}  # name, parameter -> f(feature dim)
_NEIGHBOURS = {("KNN", "k"), ("NNGuide", "k")}  # name, parameter: a neighbour count among the ID training images
_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false"}
#: What pytorch-ood logs about its own model-driven API (isood hands it captured tensors): never shown.
_NOISE = re.compile(r"^No device (set|given)\b")


def _library():
    """``(pytorch_ood.api, pytorch_ood.detector)``; a one-line error naming the extra when it is missing."""
    try:
        from pytorch_ood import api, detector
    except ImportError:
        raise BadInputError(f"pytorch-ood detectors need the pytorch-ood package: {INSTALL}") from None
    return api, detector


def _representation(cls: type) -> str | None:
    """'logits' / 'features' / 'feature_maps' from the pytorch-ood base class, None for the others."""
    api, _ = _library()
    for base, kind in _BASES:
        b = getattr(api, base, None)
        if b is not None and issubclass(cls, b):
            return kind
    return None


def pytorch_ood_names() -> list[str]:
    """The pytorch-ood detector classes that can score captured outputs (logits, features or feature maps)."""
    api, module = _library()
    return sorted(n for n, c in vars(module).items()
                  if inspect.isclass(c) and issubclass(c, api.Detector) and _representation(c) is not None)


def _pool_fc(pool, fc: nn.Linear) -> nn.Module:
    """Feature maps -> logits with the model's own pooling and fc layer (a FeatureMapsDetector's ``head``)."""
    from torch import nn

    class PoolFC(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pool_fn, self.fc = pool, fc

        def forward(self, maps: torch.Tensor) -> torch.Tensor:  # the outputs' pool works on arrays
            import torch

            pooled = self.pool_fn(maps.detach().cpu().numpy())
            return self.fc(torch.as_tensor(pooled, device=maps.device).to(self.fc.weight.dtype))

    return PoolFC()


def _linear(outputs: ForwardOutputs) -> nn.Linear:
    import torch
    from torch import nn

    w, b = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) for a in outputs.fc())
    fc = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        fc.weight.copy_(w), fc.bias.copy_(b)
    return fc.eval()


def _head(kind: str, outputs: ForwardOutputs) -> nn.Module:
    fc = _linear(outputs)
    return _pool_fc(outputs.pool, fc) if kind == "feature_maps" else fc


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e).strip() else type(e).__name__


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@contextlib.contextmanager
def _library_messages(name: str, told: set[str]) -> Iterator[None]:
    """Route what pytorch-ood logs (WARNING and above, its ``pytorch_ood`` loggers) or warns during a call: each
    message not yet in ``told`` becomes one ``warnings.warn`` line ``'<name>: <message>'`` (the CLI shows it as one
    line); notes on its own device handling (``_NOISE``) are dropped. Nothing reaches the terminal directly."""
    said: list[str] = []
    logger = logging.getLogger("pytorch_ood")
    handler, propagate = _Collect(said), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    said += [str(w.message) for w in caught]
    for text in dict.fromkeys(" ".join(m.split()) for m in said):
        if text and text not in told and not _NOISE.match(text):
            told.add(text)
            warnings.warn(f"{name}: {text}", UserWarning, stacklevel=4)


def _expected_type(p: inspect.Parameter) -> type | None:
    """int / float / bool for a parameter whose default (else annotation) says so; None when it does not."""
    d = p.default
    if d is not inspect.Parameter.empty and d is not None:
        for kind in (bool, int, float):
            if isinstance(d, kind):
                return kind
        return None
    ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))
    m = re.fullmatch(r"(?:typing\.)?(?:Optional\[)?(int|float|bool)\]?", str(ann).replace(" ", ""))
    return {"int": int, "float": float, "bool": bool}[m.group(1)] if m else None


def _typed(name: str, p: inspect.Parameter, value: Any) -> Any:
    """``value`` of the parameter ``p`` cast to its expected type (``_expected_type``), else a one-line error
    naming the parameter and the type (with pytorch-ood's default when there is one)."""
    kind = _expected_type(p)
    if kind is None:
        return value
    try:
        if kind is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(value)
            return bool(value)
        return _cast(value, kind)
    except (TypeError, ValueError):
        default = "" if p.default is inspect.Parameter.empty else f" (pytorch-ood's default: {p.default!r})"
        raise DetectorParamError(f"{name}: {p.name} must be {_TYPE_WORDS[kind]}{default}, got {value!r}") from None


class PytorchOODDetector(Detector):
    """A pytorch-ood detector scoring isood's captured outputs; sign flipped (higher = more ID). Build one with
    ``from_pytorch_ood(detector)`` or by name (``pytorch_ood_detector('ViM', d=64)``, ``pytorch-ood:ViM``)."""

    name = PREFIX

    def __init__(self, detector: Any = None, *, cls: type | None = None, params: dict | None = None,
                 inputs: str | None = None, needs_labels: bool | None = None, chunk: int = 1024) -> None:
        self.chunk = self._param("chunk", chunk, int, lambda v: v >= 1, ">= 1")
        self.cls: type[Any] = cls or type(detector)
        self.detector, self.kwargs = detector, dict(params or {})
        kind = inputs or _representation(self.cls)
        if kind not in ("logits", "features", "feature_maps"):
            raise BadInputError(f"pytorch-ood's {self.cls.__name__} does not score logits, features or feature "
                                "maps: pass inputs='logits'|'features'|'feature_maps' or a detector of that kind")
        self.kind, self.name = kind, f"{PREFIX}:{self.cls.__name__}"
        fc_needed = (detector is None and kind != "logits" and bool(set(self._signature()) & set(_FC_ARGS))) or (
            kind == "feature_maps" and getattr(detector, "head", True) is None)
        self.requires = frozenset({kind} | ({"fc"} if fc_needed else set()))
        self.needs_fit = bool(getattr(detector if detector is not None else self.cls, "requires_fit", False))
        self.needs_labels = self.cls.__name__ in _NEEDS_LABELS if needs_labels is None else bool(needs_labels)
        self._told: set[str] = set()
        self._by_name = detector is None  # built from the outputs with self.kwargs (checked by preflight)

    def _signature(self) -> dict[str, inspect.Parameter]:
        return dict(list(inspect.signature(self.cls.__init__).parameters.items())[1:])

    def params(self) -> dict[str, Any]:
        """The parameters given by name, or the wrapped detector's ``get_hyperparameters()``."""
        if self.detector is not None and not self.kwargs and hasattr(self.detector, "get_hyperparameters"):
            return dict(self.detector.get_hyperparameters())
        return dict(self.kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, {self.params()})"

    # -- checks before the forward pass ---------------------------------------------------------------------
    def _given(self, key: str, feature_dim: int | None = None) -> Any:
        """The value parameter ``key`` will have: given, else isood's default rule, else pytorch-ood's default."""
        if key in self.kwargs:
            return self.kwargs[key]
        if (self.cls.__name__, key) in _DEFAULTS:
            return None if feature_dim is None else _DEFAULTS[self.cls.__name__, key](feature_dim)
        p = self._signature().get(key)
        return None if p is None or p.default is inspect.Parameter.empty else p.default

    def _check_sizes(self, n_train: int | None, feature_dim: int | None) -> None:
        """Neighbour counts at most ``n_train``; ViM's ``d`` below ``feature_dim`` (None: not checked)."""
        name = self.cls.__name__
        for (cls_name, key) in _NEIGHBOURS:
            k = self._given(key)
            if cls_name == name and n_train is not None and isinstance(k, int) and k > n_train:
                raise DetectorParamError(f"{self.name}: {key}={k} but only {n_train} ID training images: pass "
                                         f"{self.name}:{key}=N with N <= {n_train}, or more ID training images")
        d = self._given("d", feature_dim) if name == "ViM" and feature_dim is not None else None
        if feature_dim is not None and isinstance(d, int) and not 0 < d < feature_dim:
            raise DetectorParamError(f"{self.name}: d={d} must be below the feature dimension {feature_dim} of this "
                                     f"model: pass {self.name}:d=N with N < {feature_dim}")

    def preflight(self, *, n_train: int | None = None, feature_dim: int | None = None) -> None:
        """``_check_sizes``, and the detector's own constructor checks on a trial build with a
        ``feature_dim``-wide zero fc layer (detectors given by name only)."""
        if not self._by_name:
            return
        self._check_sizes(n_train, feature_dim)
        if feature_dim is None:
            return
        zeros = ForwardOutputs(features=np.zeros((1, feature_dim), np.float32),
                               fc_weight=np.zeros((2, feature_dim), np.float32), fc_bias=np.zeros(2, np.float32))
        try:
            self._construct(zeros)
        except DetectorParamError:
            raise
        except Exception:  # noqa: BLE001 -- a zero fc layer is not the model's: the real build will tell
            pass

    # -- building, fitting, scoring ------------------------------------------------------------------------
    def _construct(self, outputs: ForwardOutputs):
        """A new pytorch-ood detector of ``cls`` with the given parameters and the fc / head / defaults taken
        from ``outputs``; its constructor's refusals as one-line ``DetectorParamError``."""
        import torch

        args = dict(self.kwargs)
        for p in self._signature().values():
            if p.name in args or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.name in _MODEL_ARGS:
                args[p.name] = None
            elif p.name in ("w", "b"):
                args[p.name] = torch.from_numpy(np.asarray(outputs.fc()[p.name == "b"], np.float32))
            elif p.name == "head":
                args[p.name] = _head(self.kind, outputs)
            elif (self.cls.__name__, p.name) in _DEFAULTS:
                args[p.name] = _DEFAULTS[self.cls.__name__, p.name](outputs.captured("features").shape[1])
        try:
            with _library_messages(self.name, self._told):
                return self.cls(**args)
        except (TypeError, ValueError, AssertionError) as e:
            raise DetectorParamError(f"{self.name}: {_first_line(e)}; see pytorch-ood's documentation of its "
                                     "parameters") from None

    def _built(self, outputs: ForwardOutputs):
        """The pytorch-ood detector: built from ``outputs`` at first use when given by name (after ``preflight``
        on them); a missing ``head`` of a feature-map detector is filled with the model's pool + fc."""
        if self.detector is None:
            feats = outputs.features
            self._check_sizes(None, int(feats.shape[1]) if feats is not None and feats.ndim == 2 else None)
            self.detector = self._construct(outputs)
        if self.kind == "feature_maps" and getattr(self.detector, "head", True) is None:
            self.detector.head = _head(self.kind, outputs)
        return self.detector

    def _inputs(self, outputs: ForwardOutputs, rows: slice = slice(None)) -> torch.Tensor:
        import torch

        return torch.from_numpy(np.ascontiguousarray(getattr(outputs, self.kind)[rows], dtype=np.float32))

    def _call(self, method: str, *args):
        det = self.detector
        fn = getattr(det, f"{method}_{self.kind}", None) or getattr(det, f"{method}_features")
        try:
            with _library_messages(self.name, self._told):
                return fn(*args)
        except (ValueError, AssertionError, RuntimeError, TypeError) as e:
            raise DetectorInputError(f"{self.name}: pytorch-ood's {method} failed: {_first_line(e)}") from None

    def _fit(self, outputs: ForwardOutputs, labels: np.ndarray | None) -> None:
        import torch

        self._built(outputs)
        if self._by_name:
            self._check_sizes(len(outputs), None)
        y = labels if labels is not None else outputs.labels
        if y is None and self.needs_labels:
            raise DetectorInputError(f"detector '{self.name}' needs the real class labels of the ID training "
                                     "images: pass labels")
        target = torch.zeros(len(outputs), dtype=torch.long) if y is None else torch.as_tensor(np.asarray(y)).long()
        self._call("fit", self._inputs(outputs), target)

    def _score(self, outputs: ForwardOutputs) -> np.ndarray:
        import torch

        self._built(outputs)
        parts = []
        with torch.no_grad():
            for i in range(0, len(outputs), self.chunk):
                s = self._call("predict", self._inputs(outputs, slice(i, i + self.chunk)))
                parts.append(-np.asarray(torch.as_tensor(s).detach().cpu().double().numpy()).reshape(-1))
        return np.concatenate(parts)


def from_pytorch_ood(detector: Any, *, inputs: str | None = None,
                     needs_labels: bool | None = None) -> PytorchOODDetector:
    """An isood ``Detector`` scoring captured outputs with the pytorch-ood ``detector`` (built by you, e.g.
    ``ViM(None, d=64, w=fc.weight, b=fc.bias)``), scores negated. ``inputs`` ('logits' / 'features' /
    'feature_maps') is read from its pytorch-ood base class (>= 0.4) unless given; ``needs_labels`` (real ID
    training labels for fitting) is True for the class-conditional ones (Mahalanobis, RMD, GMM, SHE) and
    TemperatureScaling."""
    _library()
    return PytorchOODDetector(detector, inputs=inputs, needs_labels=needs_labels)


def pytorch_ood_detector(name: str, params: dict | None = None) -> PytorchOODDetector:
    """The pytorch-ood detector class ``name`` (case-insensitive) with constructor ``params``, built from the
    outputs at first use: what ``--detectors pytorch-ood:NAME:key=value`` resolves to."""
    api, module = _library()
    supported = {n.lower(): n for n in pytorch_ood_names()}
    if name.strip().lower() not in supported:
        raise UnknownDetectorError(f"unknown or unsupported pytorch-ood detector '{name}' (scoring captured outputs "
                                   f"needs a logits, features or feature-map detector): pass one of "
                                   f"{', '.join(sorted(supported.values()))}")
    cls = getattr(module, supported[name.strip().lower()])
    det = PytorchOODDetector(cls=cls, params=params)
    sig = det._signature()
    auto = set(_MODEL_ARGS) | set(_FC_ARGS) | {p for (c, p) in _DEFAULTS if c == cls.__name__}
    allowed = [p for p in sig if p not in auto and sig[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                                      inspect.Parameter.VAR_KEYWORD)]
    unknown = sorted(set(det.kwargs) - set(sig))
    if unknown:
        if not allowed:
            raise DetectorParamError(f"{det.name} takes no parameters, got {unknown[0]!r}; pass it as "
                                     f"'{PREFIX}:{cls.__name__}'")
        raise DetectorParamError(f"{det.name}: unknown parameter {unknown[0]!r}; pass one of: {', '.join(allowed)}")
    det.kwargs = {k: _typed(det.name, sig[k], v) for k, v in det.kwargs.items()}
    missing = [p for p in allowed if sig[p].default is inspect.Parameter.empty and p not in det.kwargs]
    if missing:
        raise DetectorParamError(f"{det.name} needs {missing[0]}: pass {PREFIX}:{cls.__name__}:{missing[0]}=VALUE")
    return det


register_namespace(PREFIX, pytorch_ood_detector)
