"""pytorch-ood detectors inside isood (isood.classifiers.pytorch_ood), and pytorch-ood as an independent
reference for isood's own detectors: for the detectors both libraries have, the scores agree (Spearman >= 0.999;
equal where both compute the same formula)."""

import sys

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from isood.core.errors import DetectorParamError, IsoodError
from isood.classifiers.pytorch_ood import from_pytorch_ood
from isood.science.detectors import (DetectorInputError, ForwardOutputs, get_detector,
                                        parse_detectors)
from isood.classifiers.models import wrap_model
from isood.classifiers.scoring import run_detectors, score_precomputed

pytestmark = pytest.mark.usefixtures("one_thread")

pood = pytest.importorskip("pytorch_ood.detector")


def _pooled_as_maps(outputs):
    """The pooled features as 1 x 1 feature maps, pooled back by flattening: pytorch-ood's feature-map detectors
    (ASH, ReAct) then act where OpenOOD and isood apply them, on the penultimate feature."""
    return ForwardOutputs(logits=outputs.logits, features=outputs.features,
                          feature_maps=outputs.features[:, :, None, None], fc_weight=outputs.fc_weight,
                          fc_bias=outputs.fc_bias, labels=outputs.labels, pool=lambda m: m.reshape(len(m), -1))


# (isood spec, pytorch-ood spec, exact?) — exact: the same formula, so the scores are equal, not only the ranks
PAIRS = [
    ("msp", "pytorch-ood:MaxSoftmax", True),
    ("energy", "pytorch-ood:EnergyBased", True),
    ("maxlogit", "pytorch-ood:MaxLogit", True),
    ("klm", "pytorch-ood:KLMatching", True),
    ("knn:k=50", "pytorch-ood:KNN:k=50", True),
    ("dice:p=90", "pytorch-ood:DICE:p=0.9", True),
    ("vim:dim=8", "pytorch-ood:ViM:d=8", False),  # float32 eigh in pytorch-ood
    ("mds", "pytorch-ood:Mahalanobis", False),  # pytorch-ood: unnormalised scatter + 1e-6 ridge, factor -1/2
    ("react", "pytorch-ood:ReAct:percentile=0.9", True),
    ("ash", "pytorch-ood:ASH:variant=ash-b,percentile=0.9", True),
    ("ash:variant=s", "pytorch-ood:ASH:variant=ash-s,percentile=0.9", True),
    ("rankfeat:blocks=4", "pytorch-ood:RankFeat", True),
]


@pytest.mark.parametrize("ours, theirs, exact", PAIRS, ids=[p[0] for p in PAIRS])
def test_scores_agree_with_pytorch_ood(tiny_outputs, ours, theirs, exact):
    tr, labels, te, ood = tiny_outputs
    if ours.split(":")[0] in ("react", "ash"):
        tr, te, ood = (_pooled_as_maps(o) for o in (tr, te, ood))
    tr.labels = labels
    dets = {**parse_detectors(ours), **parse_detectors(theirs)}
    res = score_precomputed(dets, tr, {"id_test": te, "ood": ood}, score_train=False)
    a, b = (res.scores[n] for n in dets)
    x, y = np.r_[a["id_test"], a["ood"]], np.r_[b["id_test"], b["ood"]]
    assert spearmanr(x, y)[0] >= 0.999
    if exact:
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_by_name_scores_captured_outputs_in_one_pass(tiny, tiny_data):
    """``--detectors pytorch-ood:ViM,pytorch-ood:EnergyBased``: built from the captured outputs (fc, feature dim:
    ViM's d from isood's rule), fitted with fit_features, no forward pass of their own."""
    backbone, fc = tiny
    train, labels, test, ood = tiny_data
    adapter = wrap_model(backbone=backbone, fc=fc)
    res = run_detectors(adapter, "vim,energy,pytorch-ood:ViM,pytorch-ood:EnergyBased", {"t": test, "o": ood},
                        id_train=torch.utils.data.TensorDataset(train, labels), batch_size=64)
    assert adapter.forward_calls == 2 + 1 + 1  # train 120/64, test, ood: the capture passes only
    for ds in ("t", "o"):
        np.testing.assert_allclose(res.scores["pytorch-ood:EnergyBased"][ds], res.scores["energy"][ds], rtol=1e-5)
        assert spearmanr(res.scores["pytorch-ood:ViM"][ds], res.scores["vim"][ds])[0] >= 0.999
    det = parse_detectors("pytorch-ood:ViM")["pytorch-ood:ViM"]
    assert det.requires == {"features", "fc"} and det.needs_fit
    assert parse_detectors("pytorch-ood:maxsoftmax")["pytorch-ood:maxsoftmax"].requires == {"logits"}
    assert parse_detectors("pytorch-ood:ReAct")["pytorch-ood:ReAct"].requires == {"feature_maps", "fc"}


def test_from_pytorch_ood_wraps_a_users_detector(tiny_outputs):
    tr, labels, te, _ = tiny_outputs
    w, b = torch.from_numpy(tr.fc_weight), torch.from_numpy(tr.fc_bias)
    vim = from_pytorch_ood(pood.ViM(None, d=8, w=w, b=b))
    assert vim.name == "pytorch-ood:ViM" and vim.requires == {"features"} and vim.params() == {"d": 8}
    vim.fit(tr)
    ref = pood.ViM(None, d=8, w=w, b=b).fit_features(torch.from_numpy(tr.features), torch.zeros(len(tr)).long())
    np.testing.assert_allclose(vim.score(te), -ref.predict_features(torch.from_numpy(te.features)).numpy(),
                               rtol=1e-6)  # the sign flipped, nothing else
    # a feature-map detector without a head gets the model's pool + fc
    rank = from_pytorch_ood(pood.RankFeat(None, None))
    assert rank.requires == {"feature_maps", "fc"}
    np.testing.assert_allclose(rank.score(te), get_detector("rankfeat", blocks=4).score(te), rtol=1e-4)
    with pytest.raises(DetectorInputError, match="needs the real class labels"):
        from_pytorch_ood(pood.Mahalanobis(None)).fit(ForwardOutputs(features=tr.features))
    with pytest.raises(DetectorInputError, match="not fitted"):
        from_pytorch_ood(pood.KNN(None)).score(te)


@pytest.mark.parametrize("spec, words", [
    ("pytorch-ood:NoSuchThing", ("NoSuchThing", "ViM")),
    ("pytorch-ood:ODIN", ("ODIN",)),  # needs the model on the input: refused by name
    ("pytorch-ood:KNN:kk=3", ("KNN", "kk", "k")),
    ("pytorch-ood:DICE", ("DICE", "p=")),  # a required parameter with no default
])
def test_bad_names_and_parameters_are_one_line_errors(spec, words):
    with pytest.raises(IsoodError) as info:
        parse_detectors(spec)
    assert "\n" not in str(info.value) and all(w in str(info.value) for w in words)


def test_bad_value_at_build_time_is_a_parameter_error(tiny_outputs):
    tr = tiny_outputs[0]
    with pytest.raises(DetectorParamError, match="pytorch-ood:ReAct"):
        parse_detectors("pytorch-ood:ReAct:percentile=90")["pytorch-ood:ReAct"].fit(tr)


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pytorch_ood", None)  # import pytorch_ood -> ImportError
    with pytest.raises(IsoodError, match=r"pip install 'isood\[pytorch-ood\]'"):
        parse_detectors("msp,pytorch-ood:ViM")
