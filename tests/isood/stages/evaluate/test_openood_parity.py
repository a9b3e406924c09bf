"""OpenOOD v1.5 parity: each built-in detector against OpenOOD's published procedure (its postprocessor code and
default config, from the papers) WRITTEN OUT here on a tiny torchvision-style ResNet; nothing is imported from
OpenOOD. isood runs end to end: its model adapter captures every tensor in one pass, ``run_detectors`` fits on the
ID training set and scores the ID test and OOD sets.

Where isood differs on purpose the test says by how much: KNN returns minus the distance (OpenOOD minus the squared
distance: Spearman 1), GradNorm is OpenOOD's value divided by the number of classes C, and ViM / MDS are compared
with OpenOOD's steps run in float64 (OpenOOD ships float32: its eigenvectors / precision near a cut differ slightly,
Spearman >= 0.999). The statistics OpenOOD fits on its ``val`` split (ReAct's threshold, KL-Matching's templates)
are fitted here on the same ID training set isood uses.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.special import logsumexp
from scipy.stats import spearmanr
from sklearn import metrics as skm
from sklearn.covariance import EmpiricalCovariance
from torch import nn

from isood.evaluation import metrics as M
from isood.science.detectors import get_detector
from isood.classifiers.models import HookAdapter, wrap_model
from isood.classifiers.scoring import run_detectors

pytestmark = pytest.mark.usefixtures("one_thread")

N_CLASSES = 5
ODIN_STD = (63.0 / 255.0, 62.1 / 255.0, 66.7 / 255.0)  # the std OpenOOD's ODIN divides the gradient sign by


def _block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


class TinyResNet(nn.Module):
    """torchvision's ResNet layout in miniature: stem, layer1..layer4, avgpool, fc (32x32 RGB -> 64 x 4 x 4)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.relu = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
        self.layer1, self.layer2 = _block(8, 16, 2), _block(16, 16, 2)
        self.layer3, self.layer4 = _block(16, 32, 2), _block(32, 64, 1)
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(64, N_CLASSES)

    def intermediate_forward(self, x, layer_index):
        """OpenOOD's ``intermediate_forward``: the output of ``layer{layer_index}`` (3 or 4)."""
        h = self.layer3(self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x))))))
        return h if layer_index == 3 else self.layer4(h)

    def forward(self, x, return_feature=False):
        feature = torch.flatten(self.avgpool(self.intermediate_forward(x, 4)), 1)
        logits = self.fc(feature)
        return (logits, feature) if return_feature else logits


@pytest.fixture(scope="module")
def world():
    """The net, the data, and isood's scores of every detector from one ``run_detectors`` call."""
    torch.manual_seed(0)
    net = TinyResNet().eval()
    with torch.no_grad():
        for m in net.modules():  # non-trivial BatchNorm statistics, sharper logits
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2), m.running_var.uniform_(0.5, 1.5), m.bias.uniform_(-0.3, 0.3)
        net.fc.weight.mul_(8.0)
    g = torch.Generator().manual_seed(1)
    train = torch.randn(200, 3, 32, 32, generator=g)
    labels = torch.randint(0, N_CLASSES, (200,), generator=g)
    with torch.no_grad():  # centre the logits so that every class is predicted on some images
        net.fc.bias.sub_(net(train).mean(0))
    data = {"id_test": torch.randn(40, 3, 32, 32, generator=g),
            "ood": torch.randn(40, 3, 32, 32, generator=g) * 1.5 + 0.5}
    adapter = wrap_model(net, input_std=ODIN_STD)
    assert isinstance(adapter, HookAdapter) and {"block3", "tail"} <= adapter.provides
    names = ["msp", "maxlogit", "energy", "odin", "mds", "knn", "vim", "react", "dice", "ash", "rankfeat",
             "gradnorm", "klm"]
    dets = {n: get_detector(n) for n in names}
    dets.update({"ash_p": get_detector("ash", variant="p"), "ash_s": get_detector("ash", variant="s"),
                 "rankfeat_4": get_detector("rankfeat", blocks=4)})
    calls = {"stem": 0, "layer4": 0}
    for key, module in (("stem", net.conv1), ("layer4", net.layer4)):
        module.register_forward_hook(lambda *a, key=key: calls.__setitem__(key, calls[key] + 1))
    res = run_detectors(adapter, dets, data, id_train=torch.utils.data.TensorDataset(train, labels), batch_size=64)
    assert adapter.forward_calls == 4 + 1 + 1  # one capture pass per batch: train 200/64, id_test, ood
    # the only other passes from the input are ODIN's two forwards per test batch; RankFeat's fusion re-runs
    # layer4 alone on each scored set's block-3 maps (no pass from the input)
    assert calls["stem"] == 6 + 2 * 2 and calls["layer4"] == calls["stem"] + 2
    return net, train, labels, data, res


def _isood(world, name):
    return world[4].scores[name]


def _sets(world):
    return world[3].items()


def _train_feats(world):
    net, train = world[0], world[1]
    with torch.no_grad():
        return net(train, return_feature=True)


# ----------------------------------------------------------------------------------------- logit-based
@pytest.mark.parametrize("name", ["msp", "maxlogit", "energy"])
def test_logit_detectors_equal_openood(world, name):
    net = world[0]
    for ds, x in _sets(world):
        with torch.no_grad():
            output = net(x)
        if name == "msp":  # BasePostprocessor: max softmax
            ref = torch.softmax(output, dim=1).max(dim=1).values
        elif name == "maxlogit":  # MaxLogitPostprocessor
            ref = output.max(dim=1).values
        else:  # EBOPostprocessor, temperature 1
            ref = 1.0 * torch.logsumexp(output / 1.0, dim=1)
        np.testing.assert_allclose(_isood(world, name)[ds], ref.numpy(), rtol=1e-5, atol=1e-6)


def test_odin_equals_openood(world):
    """ODINPostprocessor, temperature 1000, noise 0.0014, gradient sign divided by its fixed channel std."""
    net = world[0]
    for ds, x in _sets(world):
        data = x.clone().requires_grad_(True)
        output = net(data)
        labels = output.detach().argmax(axis=1)
        loss = nn.CrossEntropyLoss()(output / 1000.0, labels)
        loss.backward()
        gradient = (torch.ge(data.grad.detach(), 0).float() - 0.5) * 2
        for c in range(3):
            gradient[:, c] = gradient[:, c] / ODIN_STD[c]
        with torch.no_grad():
            out = net(torch.add(data.detach(), gradient, alpha=-0.0014)) / 1000.0
        conf = torch.softmax(out.double(), dim=1).max(dim=1).values
        np.testing.assert_allclose(_isood(world, "odin")[ds], conf.numpy(), rtol=1e-6)


# --------------------------------------------------------------------------------------- feature-based
def _openood_mds(world, dtype):
    """MDSPostprocessor (v1.5): class means, one covariance of the class-centred training features
    (EmpiricalCovariance(assume_centered=False)), score max_c -(h - mu_c)^T P (h - mu_c)."""
    _, feats = _train_feats(world)
    feats, labels = feats.numpy().astype(dtype), world[2].numpy()
    means = np.stack([feats[labels == c].mean(0) for c in range(N_CLASSES)])
    centred = np.concatenate([feats[labels == c] - means[c] for c in range(N_CLASSES)])
    precision = EmpiricalCovariance(assume_centered=False).fit(centred).precision_
    out = {}
    for ds, x in _sets(world):
        with torch.no_grad():
            f = world[0](x, return_feature=True)[1].numpy().astype(dtype)
        scores = np.stack([-np.diag((f - means[c]) @ precision @ (f - means[c]).T) for c in range(N_CLASSES)], 1)
        out[ds] = scores.max(1)
    return out


def test_mds_equals_openood(world):
    exact, shipped = _openood_mds(world, np.float64), _openood_mds(world, np.float32)
    for ds, _ in _sets(world):
        np.testing.assert_allclose(_isood(world, "mds")[ds], exact[ds], rtol=1e-6)
        assert spearmanr(_isood(world, "mds")[ds], shipped[ds])[0] >= 0.999


def test_knn_is_openood_up_to_the_square(world):
    """KNNPostprocessor, K = 50: its normaliser ``x / ||x|| + 1e-10`` and faiss IndexFlatL2 give minus the SQUARED
    distance to the K-th neighbour; isood returns minus the distance (same ranking, other AUTC)."""
    def normalizer(a):
        return a / np.linalg.norm(a, axis=-1, keepdims=True) + 1e-10

    bank = normalizer(_train_feats(world)[1].numpy().astype(np.float64))
    for ds, x in _sets(world):
        with torch.no_grad():
            q = normalizer(world[0](x, return_feature=True)[1].numpy().astype(np.float64))
        d2 = ((q[:, None, :] - bank[None, :, :]) ** 2).sum(-1)
        ref = -np.sort(d2, axis=1)[:, 50 - 1]
        got = _isood(world, "knn")[ds]
        np.testing.assert_allclose(-(got ** 2), ref, rtol=1e-4, atol=1e-6)
        assert spearmanr(got, ref)[0] == pytest.approx(1.0)


def test_vim_equals_openood_in_float64(world):
    """VIMPostprocessor with dim = 32 (isood's default for a 64-dim feature: half): np.linalg.eig of the covariance
    about u = -pinv(W) b, the eigenvectors past the top ``dim``, alpha from the training set."""
    net = world[0]
    w, b = (t.detach().numpy().astype(np.float64) for t in (net.fc.weight, net.fc.bias))
    feats = _train_feats(world)[1].numpy().astype(np.float64)
    u = -np.matmul(np.linalg.pinv(w), b)
    cov = EmpiricalCovariance(assume_centered=True).fit(feats - u).covariance_
    eig_vals, eigen_vectors = np.linalg.eig(cov)
    ns = np.ascontiguousarray((eigen_vectors.T[np.argsort(eig_vals * -1)[32:]]).T)
    alpha = (feats @ w.T + b).max(axis=-1).mean() / np.linalg.norm((feats - u) @ ns, axis=-1).mean()
    for ds, x in _sets(world):
        with torch.no_grad():
            f = net(x, return_feature=True)[1].numpy().astype(np.float64)
        ref = -np.linalg.norm((f - u) @ ns, axis=-1) * alpha + logsumexp(f @ w.T + b, axis=-1)
        np.testing.assert_allclose(_isood(world, "vim")[ds], ref, rtol=1e-7)


def test_react_equals_openood(world):
    """ReactPostprocessor, percentile 90: clip the pooled feature at the 90th percentile of all ID activations,
    fc, logsumexp."""
    net = world[0]
    threshold = np.percentile(_train_feats(world)[1].numpy().flatten(), 90)
    for ds, x in _sets(world):
        with torch.no_grad():
            f = net(x, return_feature=True)[1]
            ref = torch.logsumexp(net.fc(f.clip(max=threshold)), dim=1)
        np.testing.assert_allclose(_isood(world, "react")[ds], ref.numpy(), rtol=1e-5)


def test_dice_equals_openood(world):
    """DICEPostprocessor, p = 90: contribution = mean ID activation x W, keep W where above its 90th percentile."""
    net = world[0]
    mean_act = _train_feats(world)[1].numpy().mean(0)
    w = net.fc.weight.detach()
    contrib = mean_act[None, :] * w.numpy()
    masked_w = w * torch.Tensor(contrib > np.percentile(contrib, 90))
    for ds, x in _sets(world):
        with torch.no_grad():
            f = net(x, return_feature=True)[1]
            ref = torch.logsumexp((f[:, None, :] * masked_w).sum(2) + net.fc.bias, dim=1)
        np.testing.assert_allclose(_isood(world, "dice")[ds], ref.numpy(), rtol=1e-5)


# ------------------------------------------------------------------------------------ activation shaping
def _ash(x, percentile, variant):
    """The ASH authors' ``ash_b`` / ``ash_p`` / ``ash_s`` (also OpenOOD's ash_net.py) on a (N, D, 1, 1) tensor."""
    x = x.clone()
    b, c, h, w = x.shape
    s1 = x.sum(dim=[1, 2, 3])
    n = x.shape[1:].numel()
    k = n - int(np.round(n * percentile / 100.0))
    t = x.view((b, c * h * w))
    v, i = torch.topk(t, k, dim=1)
    src = (s1 / k).unsqueeze(dim=1).expand(v.shape) if variant == "b" else v
    t.zero_().scatter_(dim=1, index=i, src=src)
    if variant == "s":
        x = x * torch.exp((s1 / x.sum(dim=[1, 2, 3]))[:, None, None, None])
    return x


@pytest.mark.parametrize("name, variant", [("ash", "b"), ("ash_p", "p"), ("ash_s", "s")])
def test_ash_equals_openood_on_the_pooled_feature(world, name, variant):
    """ASHNet.forward_threshold: feature_list[-1] is the avgpool output (N, D, 1, 1); ASH at percentile 90,
    flatten, fc, logsumexp (ASHPostprocessor). The authors' ResNet applies it at the same place."""
    net = world[0]
    for ds, x in _sets(world):
        with torch.no_grad():
            feature5 = net.avgpool(net.intermediate_forward(x, 4)).double()
            logits_cls = F.linear(_ash(feature5, 90, variant).view(len(x), -1), net.fc.weight.double(),
                                  net.fc.bias.double())
            ref = torch.logsumexp(logits_cls, dim=1)
        np.testing.assert_allclose(_isood(world, name)[ds], ref.numpy(), rtol=1e-6)


def test_rankfeat_equals_openood_fusion_and_block4(world):
    """RankFeatPostprocessor (exact SVD, T = 1): rank-1 removal on block 4 -> avgpool -> fc (logits1); on block 3
    -> layer4 -> avgpool -> fc (logits2); score T logsumexp(((logits1 + logits2) / 2) / T)."""
    net = world[0]

    def rank1_removed(feat):
        bsz, c, h, w = feat.size()
        feat = feat.view(bsz, c, h * w)
        u, s, v = torch.linalg.svd(feat, full_matrices=False)
        return (feat - s[:, 0:1].unsqueeze(2) * u[:, :, 0:1].bmm(v[:, 0:1, :])).view(bsz, c, h, w)

    for ds, x in _sets(world):
        with torch.no_grad():
            logits1 = net.fc(torch.flatten(net.avgpool(rank1_removed(net.intermediate_forward(x, 4))), 1))
            feat2 = net.layer4(rank1_removed(net.intermediate_forward(x, 3)))
            logits2 = net.fc(torch.flatten(net.avgpool(feat2), 1))
            fused = 1.0 * torch.logsumexp(((logits1 + logits2) / 2) / 1.0, dim=1)
        np.testing.assert_allclose(_isood(world, "rankfeat")[ds], fused.numpy(), rtol=1e-5)
        np.testing.assert_allclose(_isood(world, "rankfeat_4")[ds], torch.logsumexp(logits1, 1).numpy(), rtol=1e-5)
        assert not np.allclose(_isood(world, "rankfeat")[ds], _isood(world, "rankfeat_4")[ds], rtol=1e-3)


def test_gradnorm_is_openood_divided_by_the_number_of_classes(world):
    """GradNormPostprocessor: per image, backward of mean(sum(-1 * log_softmax(fc(h)))) (targets all ones, OpenOOD
    hard-codes 1000 columns: C here), score = L1 norm of the fc weight gradient. isood's analytic KL form is that
    divided by C (same ranking)."""
    net = world[0]
    fc = nn.Linear(64, N_CLASSES)
    fc.load_state_dict(net.fc.state_dict())
    for ds, x in _sets(world):
        with torch.no_grad():
            feats = net(x, return_feature=True)[1]
        confs = []
        for i in feats:
            fc.zero_grad()
            loss = torch.mean(torch.sum(-torch.ones((1, N_CLASSES)) * F.log_softmax(fc(i[None]), dim=-1), dim=-1))
            loss.backward()
            confs.append(torch.sum(torch.abs(fc.weight.grad.data)).item())
        got = _isood(world, "gradnorm")[ds]
        np.testing.assert_allclose(got * N_CLASSES, confs, rtol=1e-4)  # OpenOOD backpropagates in float32
        assert spearmanr(got, confs)[0] == pytest.approx(1.0)


def test_kl_matching_equals_openood(world):
    """KLMatchingPostprocessor: templates = mean softmax of the fitting images PREDICTED as each class; score
    -min_c KL(p || template_c) with kl(p, q) = sum(where(p != 0, p log(p / q), 0))."""
    net = world[0]
    with torch.no_grad():
        softmax_train = torch.softmax(net(world[1]).double(), dim=-1).numpy()
    pred = softmax_train.argmax(-1)
    assert set(pred) == set(range(N_CLASSES))  # OpenOOD averages an empty class into a NaN template
    templates = [softmax_train[pred == i].mean(axis=0) for i in range(N_CLASSES)]

    def kl(p, q):
        return np.sum(np.where(p != 0, p * np.log(p / q), 0))

    for ds, x in _sets(world):
        with torch.no_grad():
            p = torch.softmax(net(x).double(), dim=-1).numpy()
        ref = [-min(kl(pi, q) for q in templates) for pi in p]
        np.testing.assert_allclose(_isood(world, "klm")[ds], ref, rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------------------------------------- metrics
def test_metrics_equal_openood_compute_all_metrics(world):
    """auc_and_fpr_recall: OOD positive, roc_curve(ood_indicator, -conf) (sklearn's defaults), FPR at the first
    TPR >= 0.95, auc of the ROC and of both precision-recall curves. On scores with ties (rounded MSP)."""
    for name, digits in (("energy", None), ("msp", 2)):
        ids, ood = _isood(world, name)["id_test"], _isood(world, name)["ood"]
        if digits is not None:
            ids, ood = np.round(ids, digits), np.round(ood, digits)
        conf = np.r_[ids, ood]
        label = np.r_[np.zeros(len(ids)), -np.ones(len(ood))]
        ood_indicator = np.zeros_like(label)
        ood_indicator[label == -1] = 1
        fpr_list, tpr_list, _ = skm.roc_curve(ood_indicator, -conf)
        fpr = fpr_list[np.argmax(tpr_list >= 0.95)]
        precision_in, recall_in, _ = skm.precision_recall_curve(1 - ood_indicator, conf)
        precision_out, recall_out, _ = skm.precision_recall_curve(ood_indicator, -conf)
        assert M.auroc(ids, ood) == pytest.approx(skm.auc(fpr_list, tpr_list), abs=1e-15)
        assert M.aupr_in(ids, ood) == pytest.approx(skm.auc(recall_in, precision_in), abs=1e-15)
        assert M.aupr_out(ids, ood) == pytest.approx(skm.auc(recall_out, precision_out), abs=1e-15)
        assert M.fpr_at_tpr(ids, ood, convention="openood") == fpr
