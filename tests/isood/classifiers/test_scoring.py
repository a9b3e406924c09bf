"""One-pass scoring (isood.classifiers.scoring, capture): scores equal to each detector alone, one forward pass
per batch, the on-disk output cache (no second forward), precomputed outputs."""

import numpy as np
import pytest
import torch
from torch import nn

from isood.core.errors import IsoodError
from isood.classifiers.capture import extract_outputs
from isood.science.detectors import POST_HOC_DETECTORS, ForwardOutputs, get_detector
from isood.classifiers.models import ModuleAdapter, wrap_model
from isood.classifiers.scoring import DetectorScores, run_detectors, score_precomputed

pytestmark = pytest.mark.usefixtures("one_thread")


class _Counter:
    """Counts real calls of a module's forward (hook), whatever path reaches it."""

    def __init__(self, module):
        self.n = 0
        module.register_forward_hook(lambda *a: setattr(self, "n", self.n + 1))


def _datasets(tiny_data):
    train, labels, test, ood = tiny_data
    return torch.utils.data.TensorDataset(train, labels), {"id_test": test, "ood": ood}


def test_one_pass_equals_each_detector_alone_and_counts_batches(tiny, tiny_data):
    backbone, fc = tiny
    counter = _Counter(backbone)
    adapter = wrap_model(backbone=backbone, fc=fc, input_std=(0.5, 0.5, 0.5))
    assert isinstance(adapter, ModuleAdapter)
    train, datasets = _datasets(tiny_data)
    # a backbone + fc module has no block 3: RankFeat on block 4 only (the fusion: test_openood_parity)
    names = [n if n != "rankfeat" else "rankfeat:blocks=4" for n in POST_HOC_DETECTORS] + ["odin"]
    together = run_detectors(adapter, names, datasets, id_train=train, batch_size=32)
    # batches: train 120/32 -> 4, id_test 40/32 -> 2, ood 30/32 -> 1; capture passes = 7
    assert adapter.forward_calls == 7
    # ODIN alone adds forward + backward + forward on the two test sets (3 batches x 2 forwards)
    assert counter.n == 7 + 3 * 2
    for spec in names:
        name = spec.split(":")[0]
        alone = run_detectors(wrap_model(backbone=backbone, fc=fc, input_std=(0.5, 0.5, 0.5)), [spec], datasets,
                              id_train=train, batch_size=32)
        for ds in datasets:
            np.testing.assert_allclose(together.scores[name][ds], alone.scores[name][ds], rtol=1e-6, atol=1e-9)
    # and a detector scoring captured outputs equals it scoring directly computed tensors
    with torch.no_grad():
        z = fc(backbone(tiny_data[2]).mean(dim=(2, 3))).double()
    np.testing.assert_allclose(together.scores["energy"]["id_test"], torch.logsumexp(z, 1).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(together.predictions["id_test"], z.argmax(1).numpy())


def test_no_train_pass_when_no_detector_needs_fitting(tiny, tiny_data):
    backbone, fc = tiny
    adapter = wrap_model(backbone=backbone, fc=fc)
    _, datasets = _datasets(tiny_data)
    run_detectors(adapter, ["msp", "energy", "ash", "rankfeat:blocks=4", "gradnorm"], datasets, batch_size=64)
    assert adapter.forward_calls == 2
    with pytest.raises(IsoodError, match="knn need the ID training data"):
        run_detectors(adapter, ["knn"], datasets)


def test_cache_serves_second_evaluation_without_forward(tiny, tiny_data, tmp_path):
    backbone, fc = tiny
    counter = _Counter(backbone)
    train, datasets = _datasets(tiny_data)
    ids = {"id_train": "toy-train-v1", "id_test": "toy-test-v1", "ood": "toy-ood-v1"}
    first = run_detectors(wrap_model(backbone=backbone, fc=fc), ["msp", "knn", "rankfeat:blocks=4", "odin"],
                          datasets, id_train=train, batch_size=32, cache_dir=tmp_path, data_ids=ids, score_train=True)
    n_first = counter.n
    assert n_first > 0
    # other detectors, same kinds already cached (+ ODIN scores cached): no forward at all
    second = run_detectors(wrap_model(backbone=backbone, fc=fc), ["energy", "mds", "ash", "odin", "knn"], datasets,
                           id_train=train, batch_size=32, cache_dir=tmp_path, data_ids=ids, score_train=True)
    assert counter.n == n_first
    for ds in ("id_test", "ood", "id_train"):
        np.testing.assert_allclose(second.scores["odin"][ds], first.scores["odin"][ds])
        np.testing.assert_allclose(second.scores["knn"][ds], first.scores["knn"][ds])
    np.testing.assert_array_equal(second.labels["id_train"], tiny_data[1].numpy())
    assert second.labels["id_test"] is None
    # ViM needs fc + features (cached) -> still no forward; a different model -> a new pass
    run_detectors(wrap_model(backbone=backbone, fc=fc), ["vim"], datasets, id_train=train, cache_dir=tmp_path,
                  data_ids=ids)
    assert counter.n == n_first
    with torch.no_grad():
        fc.weight.mul_(2.0)
    run_detectors(wrap_model(backbone=backbone, fc=fc), ["msp"], {"id_test": datasets["id_test"]},
                  cache_dir=tmp_path, data_ids=ids)
    assert counter.n == n_first + 1
    # ODIN with another eps is not served from the cache
    run_detectors(wrap_model(backbone=backbone, fc=fc), [get_detector("odin", eps=0.01)],
                  {"ood": datasets["ood"]}, cache_dir=tmp_path, data_ids=ids, batch_size=64)
    assert counter.n == n_first + 1 + 1 + 2  # capture pass + ODIN's two forwards


def test_correctness_and_der_inputs(tiny, tiny_data):
    backbone, fc = tiny
    train, datasets = _datasets(tiny_data)
    res = run_detectors(wrap_model(backbone=backbone, fc=fc), ["msp"], datasets, id_train=train, score_train=True)
    assert isinstance(res, DetectorScores)
    assert set(res.scores["msp"]) == {"id_train", "id_test", "ood"}
    np.testing.assert_array_equal(res.correct("id_train"), res.predictions["id_train"] == tiny_data[1].numpy())
    with pytest.raises(IsoodError, match="no labels"):
        res.correct("ood")


def test_class_count_mismatch_and_missing_internals(tiny, tiny_data):
    backbone, fc = tiny
    train, labels, test, _ = tiny_data
    bad = torch.utils.data.TensorDataset(train, labels + 7)
    with pytest.raises(IsoodError, match="has 5 classes"):
        run_detectors(wrap_model(backbone=backbone, fc=fc), ["mds"], {"t": test}, id_train=bad)
    flat = wrap_model(backbone=nn.Sequential(backbone, nn.AdaptiveAvgPool2d(1), nn.Flatten()), fc=fc)
    with pytest.raises(IsoodError, match="feature maps"):
        run_detectors(flat, [get_detector("rankfeat", blocks=4)], {"t": test})
    with pytest.raises(IsoodError, match="needs block3, tail.*rankfeat:blocks=4"):
        run_detectors(flat, ["rankfeat"], {"t": test})
    # ASH shapes the pooled feature: a backbone returning features is enough
    assert np.isfinite(run_detectors(flat, ["ash"], {"t": test}).scores["ash"]["t"]).all()


def test_extract_outputs_reads_labels_and_hashes_tensors(tiny, tiny_data, tmp_path):
    backbone, fc = tiny
    adapter = wrap_model(backbone=backbone, fc=fc)
    x = tiny_data[2]
    out, _ = extract_outputs(adapter, x, ["features"], batch_size=16, cache_dir=tmp_path)
    assert out.features.shape == (40, 16) and out.labels is None and out.logits is None
    calls = adapter.forward_calls
    out2, _ = extract_outputs(adapter, x.clone(), ["features"], batch_size=16, cache_dir=tmp_path)
    assert adapter.forward_calls == calls  # same tensor content -> same cache entry
    np.testing.assert_array_equal(out.features, out2.features)
    with pytest.raises(IsoodError, match="data_id"):
        extract_outputs(adapter, torch.utils.data.TensorDataset(x), ["features"], cache_dir=tmp_path)
    with pytest.raises(IsoodError, match="no image"):
        extract_outputs(adapter, torch.zeros(0, 3, 8, 8), ["features"])


def test_two_odin_settings_in_one_run_and_dict_batches(tiny, tiny_data):
    backbone, fc = tiny
    test = tiny_data[2]

    class DictData(torch.utils.data.Dataset):
        def __len__(self):
            return len(test)

        def __getitem__(self, i):
            return {"image": test[i], "label": i % 5}

    res = run_detectors(wrap_model(backbone=backbone, fc=fc),
                        {"odin_a": get_detector("odin"), "odin_b": get_detector("odin", eps=0.05)},
                        {"t": DictData()}, batch_size=16)
    a, b = res.scores["odin_a"]["t"], res.scores["odin_b"]["t"]
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(res.labels["t"], np.arange(40) % 5)
    # a larger perturbation against the loss raises the (temperature-scaled) softmax score on average
    assert b.mean() > a.mean()


def test_precomputed_outputs_score_like_captured_ones(tiny_outputs):
    tr, labels, te, ood = tiny_outputs
    tr.labels = labels
    dets = {n: get_detector(n) for n in ("msp", "knn", "mds", "react")}
    res = score_precomputed(dets, tr, {"id_test": te, "ood": ood}, score_train=True)
    assert set(res.scores["knn"]) == {"id_train", "id_test", "ood"}
    for n in dets:
        alone = get_detector(n).fit(tr, labels)
        np.testing.assert_allclose(res.scores[n]["ood"], alone.score(ood), rtol=1e-9)
    np.testing.assert_array_equal(res.predictions["id_test"], te.logits.argmax(1))
    no_fc = ForwardOutputs(logits=tr.logits, features=tr.features, labels=labels)
    with pytest.raises(IsoodError, match="detector 'react' needs fc"):
        score_precomputed({"react": get_detector("react")}, no_fc, {"t": no_fc}, score_train=False)
    with pytest.raises(IsoodError, match="detector 'odin' perturbs the input"):
        score_precomputed({"odin": get_detector("odin")}, tr, {"t": te}, score_train=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_scores_on_cuda_equal_scores_on_cpu(tiny, tiny_data):
    backbone, fc = tiny
    train, datasets = _datasets(tiny_data)
    names = ["msp", "energy", "knn", "mds", "react", "ash", "rankfeat:blocks=4", "odin"]
    cpu = run_detectors(wrap_model(backbone=backbone, fc=fc), names, datasets, id_train=train, device="cpu")
    gpu = run_detectors(wrap_model(backbone=backbone, fc=fc), names, datasets, id_train=train, device="cuda")
    for name in cpu.scores:
        for ds in datasets:
            np.testing.assert_allclose(gpu.scores[name][ds], cpu.scores[name][ds], rtol=1e-3, atol=1e-4)
