"""Each detector on a tiny seeded conv net against a direct formula written here (loops / torch / scipy)."""

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import entropy

from isood.core.errors import DetectorParamError, IsoodError
from isood.science.detectors import (Detector, DetectorInputError, ForwardOutputs, available_detectors,
                                        detector_class, get_detector, parse_detectors, register_detector)

pytestmark = pytest.mark.usefixtures("one_thread")

#: every registered detector that scores captured outputs (all but the input-perturbing ones), from the registry
POST_HOC = [n for n in available_detectors() if not {"input", "local_logits"} & set(detector_class(n).requires)]


@pytest.fixture()
def tiny_outputs(tiny_outputs, tiny, tiny_data):
    """conftest's outputs of the tiny net, plus ``block3`` (its first conv + ReLU) and ``tail`` (second conv + ReLU,
    global average pool, fc): the tiny backbone seen as two blocks, as RankFeat's fusion needs."""
    backbone, fc = tiny
    first, rest = backbone.body[:2], backbone.body[2:]

    def tail(a):  # numpy in, numpy out, as a model adapter hands it to the detectors
        with torch.no_grad():
            return fc(rest(torch.from_numpy(a)).mean(dim=(2, 3))).numpy()

    out = []
    for outputs, x in zip(tiny_outputs[:1] + tiny_outputs[2:], (tiny_data[0], tiny_data[2], tiny_data[3])):
        with torch.no_grad():
            outputs.block3 = first(x).numpy()
        outputs.tail = tail
        out.append(outputs)
    return out[0], tiny_outputs[1], out[1], out[2]


def _fit_score(name, tiny_outputs, **kw):
    tr, labels, te, _ = tiny_outputs
    d = get_detector(name, **kw)
    d.fit(tr, labels)
    return d, d.score(te)


def test_registry_lists_the_13_builtins_and_aliases():
    assert {"msp", "maxlogit", "energy", "odin", "mds", "knn", "vim", "react", "dice", "ash", "rankfeat",
            "gradnorm", "klm"} <= set(available_detectors())
    assert len(POST_HOC) >= 12
    for name in available_detectors():
        assert get_detector(name).name == name  # the name is given once, by the decorator
    assert type(get_detector("ASH_B")).__name__ == "ASH"
    assert type(get_detector("kl-matching")).__name__ == "KLMatching"
    with pytest.raises(IsoodError, match="unknown detector 'nope'"):
        get_detector("nope")


def test_user_detector_registration(tiny_outputs):
    def define():
        @register_detector("test-logit-std")
        class LogitStd(Detector):
            requires = frozenset({"logits"})

            def __init__(self, ddof: int = 0) -> None:
                self.ddof = self._param("ddof", ddof, int, lambda v: v >= 0, ">= 0")

            def _score(self, outputs):
                return outputs.logits.std(axis=1, ddof=self.ddof)

        return LogitStd

    first = define()
    te = tiny_outputs[2]
    assert "test-logit-std" in available_detectors() and first.name == "test-logit-std"
    det = get_detector("test-logit-std", ddof=1)
    np.testing.assert_allclose(det.score(te), te.logits.std(axis=1, ddof=1))
    np.testing.assert_allclose(det(te), det.score(te))  # __call__ = score
    assert det.params() == {"ddof": 1}  # derived from the constructor signature
    with pytest.raises(DetectorInputError, match="needs logits"):  # the template checks the requirements
        det(ForwardOutputs(features=np.zeros((2, 3))))
    # re-running the defining cell (a new class object of the same name) replaces the entry
    second = define()
    assert second is not first and type(get_detector("test-logit-std")) is second
    with pytest.raises(ValueError, match="already registered"):
        register_detector("test-logit-std", type("Other", (first,), {}))
    with pytest.raises(ValueError, match="unknown kind"):
        register_detector("test-bad", type("Bad", (Detector,), {"requires": frozenset({"attention"}),
                                                                "_score": lambda self, o: o.logits[:, 0]}))
    with pytest.raises(DetectorParamError, match="ddof"):
        get_detector("test-logit-std", ddof=-1)


@pytest.mark.parametrize("spec, names", [
    ("knn:k=0", ("knn", "k")), ("knn:k=abc", ("knn", "k")), ("react:percentile=150", ("react", "percentile")),
    ("msp:foo=1", ("msp", "foo")), ("dice:p=100", ("dice", "p")), ("vim:dim=0", ("vim", "dim")),
    ("energy:temperature=0", ("energy", "temperature")), ("ash:percentile=-1", ("ash", "percentile")),
    ("ash:variant=q", ("ash", "variant")), ("rankfeat:blocks=3", ("rankfeat", "blocks")),
])
def test_bad_parameters_are_one_line_detector_param_errors(spec, names):
    with pytest.raises(DetectorParamError) as info:
        parse_detectors(spec)
    message = str(info.value)
    assert "\n" not in message and all(n in message for n in names)


def test_parse_detectors_reads_parameters_and_follow_ups():
    dets = parse_detectors("msp, knn:k=7 ,ash:percentile=85,chunk=16")
    assert list(dets) == ["msp", "knn", "ash"]
    assert dets["knn"].params() == {"k": 7}
    assert dets["ash"].params() == {"percentile": 85.0, "variant": "b"} and dets["ash"].chunk == 16  # a setting
    dets = parse_detectors("ash:variant=S,percentile=65,rankfeat:blocks=4")
    assert dets["ash"].params() == {"percentile": 65.0, "variant": "s"}
    assert dets["rankfeat"].params() == {"temperature": 1.0, "blocks": "4"}
    assert dets["rankfeat"].requires == {"feature_maps", "fc"}  # block 4 only: no block-3 map, no tail
    assert get_detector("rankfeat").requires == {"feature_maps", "block3", "fc", "tail"}
    with pytest.raises(IsoodError, match="unknown detector 'nope'"):
        parse_detectors("msp,nope")
    with pytest.raises(ValueError, match="twice"):
        parse_detectors("msp,msp")


def test_logit_detectors(tiny_outputs):
    te = tiny_outputs[2]
    z = torch.from_numpy(te.logits).double()
    np.testing.assert_allclose(get_detector("msp").score(te), torch.softmax(z, 1).max(1).values.numpy(), rtol=1e-6)
    np.testing.assert_allclose(get_detector("maxlogit").score(te), z.max(1).values.numpy(), rtol=1e-6)
    np.testing.assert_allclose(get_detector("energy").score(te), torch.logsumexp(z, 1).numpy(), rtol=1e-6)
    np.testing.assert_allclose(get_detector("energy", temperature=2.0).score(te),
                               2.0 * torch.logsumexp(z / 2.0, 1).numpy(), rtol=1e-6)


def test_odin_against_per_image_autograd(tiny, tiny_data):
    backbone, fc = tiny
    x = tiny_data[2][:6]

    def net(inp):
        return fc(backbone(inp).mean(dim=(2, 3)))

    std = (0.5, 0.25, 0.2)
    from isood.classifiers.perturbation import odin_scores

    got = odin_scores(get_detector("odin"), net, x, input_std=std)
    T, eps = 1000.0, 0.0014
    for i in range(x.shape[0]):
        xi = x[i:i + 1].clone().requires_grad_(True)
        out = net(xi)
        loss = -torch.log_softmax(out / T, dim=1)[0, out.argmax()]
        loss.backward()
        sign = torch.where(xi.grad >= 0, 1.0, -1.0) / torch.tensor(std).view(1, 3, 1, 1)
        with torch.no_grad():
            ref = torch.softmax(net(xi - eps * sign).double() / T, dim=1).max().item()
        assert got[i] == pytest.approx(ref, rel=1e-9, abs=1e-12)
    # eps = 0 is temperature-scaled MSP
    with torch.no_grad():
        msp_t = torch.softmax(net(x).double() / 1000.0, 1).max(1).values.numpy()
    np.testing.assert_allclose(odin_scores(get_detector("odin", eps=0.0), net, x), msp_t, rtol=1e-9)
    with pytest.raises(DetectorInputError, match="perturbs the input"):
        get_detector("odin").score(ForwardOutputs(logits=np.zeros((1, 2))))


def test_mds_against_explicit_inverse(tiny_outputs):
    tr, labels, te, _ = tiny_outputs
    _, got = _fit_score("mds", tiny_outputs)
    x = tr.features.astype(np.float64)
    classes = np.unique(labels)
    mus = {c: x[labels == c].mean(0) for c in classes}
    centred = np.stack([x[i] - mus[labels[i]] for i in range(len(x))])
    prec = np.linalg.inv(centred.T @ centred / len(x))
    for i, h in enumerate(te.features.astype(np.float64)):
        ref = max(-(h - mus[c]) @ prec @ (h - mus[c]) for c in classes)
        assert got[i] == pytest.approx(ref, rel=1e-6)
    with pytest.raises(DetectorInputError, match="labels"):
        get_detector("mds").fit(tr, None)


def test_knn_against_brute_force(tiny_outputs):
    tr, _, te, _ = tiny_outputs
    _, got = _fit_score("knn", tiny_outputs, k=50)
    bank = tr.features / np.linalg.norm(tr.features, axis=1, keepdims=True)
    q = te.features / np.linalg.norm(te.features, axis=1, keepdims=True)
    d = np.sqrt(((q[:, None, :] - bank[None, :, :]) ** 2).sum(-1))
    ref = -np.sort(d, axis=1)[:, 49]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(DetectorParamError, match="k=500"):
        get_detector("knn", k=500).fit(tr)


def test_vim_against_projector_formula(tiny_outputs):
    tr, _, te, _ = tiny_outputs
    det, got = _fit_score("vim", tiny_outputs, dim=6)
    w, b = tr.fc_weight.astype(np.float64), tr.fc_bias.astype(np.float64)
    x = tr.features.astype(np.float64)
    u = -np.linalg.pinv(w) @ b
    vals, vecs = np.linalg.eig((x - u).T @ (x - u) / len(x))
    top = vecs[:, np.argsort(-vals.real)[:6]].real
    resid = lambda f: np.linalg.norm((f - u) - (f - u) @ top @ top.T, axis=1)  # noqa: E731
    alpha = (x @ w.T + b).max(1).mean() / resid(x).mean()
    h = te.features.astype(np.float64)
    ref = logsumexp(h @ w.T + b, axis=1) - alpha * resid(h)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    assert det.alpha_ == pytest.approx(alpha, rel=1e-6)
    assert get_detector("vim").fit(tr).dim_ == 8  # default: half of 16 dims


def test_react_against_clip_formula(tiny_outputs):
    tr, _, te, _ = tiny_outputs
    det, got = _fit_score("react", tiny_outputs)
    c = np.percentile(tr.features.ravel(), 90)
    assert det.threshold_ == pytest.approx(c)
    z = np.minimum(te.features, c) @ te.fc_weight.T + te.fc_bias
    np.testing.assert_allclose(got, logsumexp(z.astype(np.float64), axis=1), rtol=1e-5)
    assert (te.features > c).any()  # the clip is active on this data


def test_dice_against_per_class_loop(tiny_outputs):
    tr, _, te, _ = tiny_outputs
    _, got = _fit_score("dice", tiny_outputs, p=90)
    w, b = te.fc_weight.astype(np.float64), te.fc_bias.astype(np.float64)
    m = tr.features.astype(np.float64).mean(0)
    contrib = [[w[c, j] * m[j] for j in range(w.shape[1])] for c in range(w.shape[0])]
    thr = np.percentile(np.array(contrib), 90)
    kept = sum(v > thr for row in contrib for v in row)
    assert kept == pytest.approx(0.1 * w.size, abs=1)
    for i, h in enumerate(te.features.astype(np.float64)):
        z = [sum(w[c, j] * h[j] for j in range(len(h)) if contrib[c][j] > thr) + b[c] for c in range(len(b))]
        assert got[i] == pytest.approx(logsumexp(z), rel=1e-6)


@pytest.mark.parametrize("variant", ["b", "p", "s"])
def test_ash_shapes_the_pooled_feature_against_numpy_sort(tiny_outputs, variant):
    """pool -> ASH -> fc -> energy (OpenOOD / the authors' placement), each variant written out per image."""
    te = tiny_outputs[2]
    got = get_detector("ash", variant=variant).score(te)
    w, b = te.fc_weight.astype(np.float64), te.fc_bias.astype(np.float64)
    for i, h in enumerate(te.features.astype(np.float64)):
        k = h.size - int(round(h.size * 0.9))  # 16 dims -> keep 2
        keep = np.argsort(-h)[:k]
        shaped = np.zeros_like(h)
        shaped[keep] = h.sum() / k if variant == "b" else h[keep]
        if variant == "s":
            shaped *= np.exp(h.sum() / h[keep].sum())
        assert got[i] == pytest.approx(logsumexp(shaped @ w.T + b), rel=1e-9)
    # the shaped vector, not the map: features alone (no feature maps) are enough
    no_maps = ForwardOutputs(features=te.features, fc_weight=te.fc_weight, fc_bias=te.fc_bias)
    np.testing.assert_allclose(get_detector("ash", variant=variant).score(no_maps), got)


def _rank1_removed(x):
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    return x - s[0] * np.outer(u[:, 0], vt[0])


def test_rankfeat_fuses_blocks_3_and_4_against_numpy_svd(tiny_outputs, tiny):
    backbone, fc = tiny
    te = tiny_outputs[2]
    fused, block4 = get_detector("rankfeat").score(te), get_detector("rankfeat", blocks=4).score(te)
    w, b = te.fc_weight.astype(np.float64), te.fc_bias.astype(np.float64)
    for i, (fm, b3) in enumerate(zip(te.feature_maps.astype(np.float64), te.block3)):
        z4 = _rank1_removed(fm.reshape(fm.shape[0], -1)).mean(axis=1) @ w.T + b
        assert block4[i] == pytest.approx(logsumexp(z4), rel=1e-4)
        m3 = _rank1_removed(b3.astype(np.float64).reshape(b3.shape[0], -1)).reshape(b3.shape)
        with torch.no_grad():  # the last block (second conv + ReLU), pool and fc on the modified block-3 map
            z3 = fc(backbone.body[2:](torch.tensor(m3[None], dtype=torch.float32)).mean(dim=(2, 3)))[0].numpy()
        assert fused[i] == pytest.approx(logsumexp((z3 + z4) / 2), rel=1e-4)
    assert not np.allclose(fused, block4, rtol=1e-3)


def test_gradnorm_analytic_equals_autograd(tiny_outputs):
    te = tiny_outputs[2]
    got = get_detector("gradnorm").score(te)
    w = torch.tensor(te.fc_weight, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(te.fc_bias, dtype=torch.float64)
    n_cls = w.shape[0]
    for i, h in enumerate(torch.tensor(te.features, dtype=torch.float64)):
        w.grad = None
        logp = torch.log_softmax(w @ h + b, dim=0)
        kl = torch.sum((1.0 / n_cls) * (np.log(1.0 / n_cls) - logp))  # KL(uniform || softmax)
        kl.backward()
        assert got[i] == pytest.approx(w.grad.abs().sum().item(), rel=1e-6)
        # the original code's loss sum_c -log p_c gives exactly C times the KL gradient norm
        w.grad = None
        (-torch.log_softmax(w @ h + b, dim=0)).sum().backward()
        assert n_cls * got[i] == pytest.approx(w.grad.abs().sum().item(), rel=1e-6)


def test_kl_matching_against_scipy_entropy(tiny_outputs):
    tr, _, te, _ = tiny_outputs
    det, got = _fit_score("klm", tiny_outputs)
    p_tr = torch.softmax(torch.from_numpy(tr.logits).double(), 1).numpy()
    pred = p_tr.argmax(1)
    templates = [p_tr[pred == c].mean(0) for c in np.unique(pred)]
    p_te = torch.softmax(torch.from_numpy(te.logits).double(), 1).numpy()
    ref = [-min(entropy(p, d) for d in templates) for p in p_te]
    np.testing.assert_allclose(got, ref, rtol=1e-8)


@pytest.mark.parametrize("name", POST_HOC)
def test_every_detector_scores_each_image_independently_and_checks_inputs(name, tiny_outputs):
    tr, labels, te, ood = tiny_outputs
    d = get_detector(name)
    if d.needs_fit:
        with pytest.raises(DetectorInputError, match="not fitted"):
            d.score(te)
        d.fit(tr, labels)
    s = d.score(te)
    assert s.shape == (len(te),) and np.isfinite(s).all()
    # a single image scores the same alone as in the batch (no cross-image leakage)
    assert d.score(te.subset(slice(3, 4)))[0] == pytest.approx(s[3], rel=1e-6, abs=1e-9)
    with pytest.raises(DetectorInputError, match=f"detector '{name}' needs"):
        d.score(ForwardOutputs(labels=np.zeros(3)))


def test_forward_outputs_subset_and_concatenate(tiny_outputs):
    te = tiny_outputs[2]
    a, b = te.subset(slice(0, 10)), te.subset(np.arange(10, len(te)))
    both = ForwardOutputs.concatenate([a, b])
    np.testing.assert_array_equal(both.feature_maps, te.feature_maps)
    np.testing.assert_array_equal(both.logits, te.logits)
    assert both.fc_weight is te.fc_weight and len(both) == len(te) == 40
    np.testing.assert_array_equal(both.block3, te.block3)
    assert both.tail is te.tail
    assert te.available == {"logits", "features", "feature_maps", "block3", "fc", "tail"}
    np.testing.assert_allclose(te.head(te.features), te.logits, rtol=1e-5, atol=1e-6)


def test_forward_outputs_from_arrays_scores_like_captured_outputs(tiny_outputs):
    import torch

    tr, labels, te, _ = tiny_outputs
    mine = ForwardOutputs.from_arrays(logits=torch.from_numpy(te.logits), features=te.features.tolist(),
                                      fc_weight=te.fc_weight, fc_bias=te.fc_bias)
    assert mine.available == {"logits", "features", "fc"} and len(mine) == len(te)
    react = get_detector("react").fit(ForwardOutputs.from_arrays(features=tr.features, logits=tr.logits,
                                                                 fc_weight=tr.fc_weight, fc_bias=tr.fc_bias))
    np.testing.assert_allclose(react.score(mine), get_detector("react").fit(tr).score(te), rtol=1e-6)
    with pytest.raises(ValueError, match="disagree"):
        ForwardOutputs.from_arrays(logits=te.logits, features=te.features[:3])
    with pytest.raises(ValueError, match="2-D"):
        ForwardOutputs.from_arrays(logits=te.logits[0])
