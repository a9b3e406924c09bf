"""Model adapters (isood.classifiers.models) and loading classifiers by name (classifiers): timm, torchvision and
user modules expose the same tensors as the model itself; offline loading errors say what to pass."""

import numpy as np
import pytest
import torch
from torch import nn

from isood.core.errors import IsoodError, MissingWeightsError
from isood.classifiers.named import adapter_from_option, load_classifier
from isood.science.detectors import get_detector
from isood.classifiers.models import HookAdapter, TimmAdapter, randomized_copy, wrap_model
from isood.classifiers.scoring import run_detectors

pytestmark = pytest.mark.usefixtures("one_thread")


def test_timm_adapter_matches_model_and_pool(tiny_data):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=5).eval()
    adapter = wrap_model(model)
    assert isinstance(adapter, TimmAdapter)
    assert adapter.provides == {"logits", "features", "feature_maps", "fc", "block3", "tail"}
    x = torch.randn(3, 3, 32, 32)
    out = adapter.forward(x, ["logits", "features", "feature_maps", "block3"])
    with torch.no_grad():
        np.testing.assert_allclose(out["logits"], model(x), rtol=1e-5, atol=1e-5)
        # block3 = layer3's output; tail = layer4 + pool + fc on it (RankFeat's fusion)
        stem = model.maxpool(model.act1(model.bn1(model.conv1(x))))
        b3 = model.layer3(model.layer2(model.layer1(stem)))
        np.testing.assert_allclose(out["block3"], b3, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(adapter.tail(b3), model.fc(model.layer4(b3).mean(dim=(2, 3))), rtol=1e-5,
                                   atol=1e-5)
        np.testing.assert_allclose(out["features"], out["feature_maps"].mean(dim=(2, 3)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(adapter.pool(out["feature_maps"]), out["features"], rtol=1e-6)
    w, b = adapter.fc_params()
    np.testing.assert_allclose(out["features"].numpy() @ w.T + b, out["logits"].numpy(), rtol=1e-4, atol=1e-4)
    assert adapter.input_std == pytest.approx((0.229, 0.224, 0.225))


def test_timm_vit_has_no_feature_maps():
    import timm

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5, img_size=32, depth=1).eval()
    adapter = wrap_model(vit)
    assert "feature_maps" not in adapter.provides and {"features", "fc"} <= adapter.provides
    with pytest.raises(IsoodError, match="detector 'rankfeat' needs block3, feature_maps, tail"):
        run_detectors(adapter, ["rankfeat"], {"t": torch.randn(2, 3, 32, 32)})
    with pytest.raises(IsoodError, match="detector 'rankfeat' needs feature_maps, which"):
        run_detectors(adapter, [get_detector("rankfeat", blocks=4)], {"t": torch.randn(2, 3, 32, 32)})


def test_torchvision_resnet_hook_adapter():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=4).eval()
    adapter = wrap_model(model)
    assert isinstance(adapter, HookAdapter)
    x = torch.randn(2, 3, 32, 32)
    out = adapter.forward(x, ["logits", "features", "feature_maps", "block3"])
    with torch.no_grad():
        b3 = model.layer3(model.layer2(model.layer1(model.maxpool(model.relu(model.bn1(model.conv1(x)))))))
        fmap = model.layer4(b3)
        tail, ref_tail = adapter.tail(b3), model.fc(fmap.mean(dim=(2, 3)))
    assert {"block3", "tail"} <= adapter.provides
    np.testing.assert_allclose(out["block3"], b3, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tail, ref_tail, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["feature_maps"], fmap, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["features"], fmap.mean(dim=(2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["logits"], model.fc(fmap.mean(dim=(2, 3))).detach(), rtol=1e-5, atol=1e-5)
    assert adapter.forward_calls == 1
    with pytest.raises(IsoodError, match="cannot find the layers"):
        wrap_model(nn.Sequential(nn.Flatten(), nn.Linear(12, 2)))


def test_block3_and_tail_only_when_the_forward_chains_layer3_layer4_pool_fc():
    """A model with layer3/layer4 modules whose forward does not run layer4 after layer3 gets no tail (the probe
    compares tail(block3) with the real logits); a user backbone has none either."""
    import torchvision

    class SkipsLayer4(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torchvision.models.resnet18(num_classes=3)
            self.layer3, self.layer4 = self.body.layer3, self.body.layer4
            self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(256, 3)

        def forward(self, x):
            b = self.body
            h = self.layer3(b.layer2(b.layer1(b.maxpool(b.relu(b.bn1(b.conv1(x)))))))
            return self.fc(torch.flatten(self.avgpool(h), 1))  # layer4 skipped

    torch.manual_seed(0)
    adapter = wrap_model(SkipsLayer4())
    assert isinstance(adapter, HookAdapter) and adapter.provides == {"logits", "features", "feature_maps", "fc"}
    assert adapter.forward_calls == 0  # the probe is not a capture pass
    backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    assert "tail" not in wrap_model(backbone=backbone, fc=nn.Linear(4, 2)).provides
    with pytest.raises(IsoodError, match="rankfeat:blocks=4"):
        run_detectors(adapter, ["rankfeat"], {"t": torch.randn(2, 3, 32, 32)})
    res = run_detectors(adapter, [get_detector("rankfeat", blocks=4)], {"t": torch.randn(2, 3, 32, 32)})
    assert np.isfinite(res.scores["rankfeat"]["t"]).all()


def test_load_classifier_offline_and_checkpoint(tmp_path, monkeypatch):
    import huggingface_hub.constants as hfc
    from safetensors.torch import save_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hfc, "HF_HUB_OFFLINE", True)
    with pytest.raises(MissingWeightsError, match="pretrained=False"):
        load_classifier("resnet18")
    with pytest.raises(IsoodError, match="unknown model 'not_a_model_xyz'"):
        load_classifier("not_a_model_xyz", pretrained=False)
    with pytest.raises(IsoodError, match="does not exist"):
        load_classifier("resnet18", checkpoint=tmp_path / "missing.pth")
    torch.manual_seed(0)
    random_model = load_classifier("resnet18", pretrained=False, num_classes=3)
    assert random_model.transform is not None
    path = tmp_path / "r18.safetensors"
    save_file(random_model.model.state_dict(), str(path))
    again = load_classifier("resnet18", checkpoint=path, num_classes=3)
    assert again.identity == random_model.identity
    torch.manual_seed(1)
    assert load_classifier("resnet18", pretrained=False, num_classes=3).identity != random_model.identity


def test_randomized_copy_reinitialises_every_adapter_kind(tiny):
    import torchvision

    backbone, fc = tiny
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    for adapter in (wrap_model(backbone=backbone, fc=fc), wrap_model(torchvision.models.resnet18(num_classes=3))):
        rand = randomized_copy(adapter, seed=1)
        assert type(rand) is type(adapter) and rand.identity != adapter.identity
        assert rand.identity == randomized_copy(adapter, seed=1).identity  # seeded
        out = rand.forward(x, ["logits", "features"])
        np.testing.assert_allclose(out["logits"], rand.model(x).detach(), rtol=1e-5, atol=1e-5)
        before = adapter.forward_calls
        adapter.forward(x, ["logits"])
        assert adapter.forward_calls == before + 1  # the original still captures with its own hooks


def test_model_option_forms(tmp_path, monkeypatch):
    with pytest.raises(IsoodError, match="--model is required"):
        adapter_from_option(None)
    with pytest.raises(IsoodError, match="py:package.module:function"):
        adapter_from_option("py:nomodule")
    with pytest.raises(IsoodError, match="cannot import"):
        adapter_from_option("py:not_a_module_xyz:make")
    module = tmp_path / "my_models_xyz.py"
    module.write_text("import torch.nn as nn\n\ndef make():\n    return nn.Sequential(nn.Flatten(), nn.Linear(12, 2))\n"
                      "\ndef make_resnet():\n    import torchvision\n    return torchvision.models.resnet18(num_classes=2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(adapter_from_option("py:my_models_xyz:make_resnet"), HookAdapter)
    with pytest.raises(IsoodError, match="cannot find the layers"):
        adapter_from_option("py:my_models_xyz:make")


@pytest.mark.parametrize("num_classes", [None, 7])
def test_checkpoint_of_another_head_is_one_sentence_naming_both_sizes(tmp_path, num_classes):
    """A 3-class checkpoint loaded into a model built for another number of classes: one sentence with the
    checkpoint's head size (read from its tensors), the model's, and the --num-classes to pass."""
    import timm
    from safetensors.torch import load_file

    from isood.dev.tiny_models import build_tiny_classifier

    path = build_tiny_classifier(tmp_path / "m.safetensors", num_classes=3)
    heads = [v for k, v in load_file(str(path)).items() if k.endswith("fc.weight")]
    expected_model = num_classes or timm.create_model("test_resnet", pretrained=False).num_classes
    with pytest.raises(IsoodError) as e:
        adapter_from_option("test_resnet", checkpoint=str(path), num_classes=num_classes)
    msg = str(e.value)
    assert msg == (f"--checkpoint {path} does not fit test_resnet: its classifier head has {heads[0].shape[0]} "
                   f"classes, the model {expected_model}; pass --num-classes 3")
    assert "Error(s)" not in msg and "state_dict" not in msg
    adapter_from_option("test_resnet", checkpoint=str(path), num_classes=3)  # the advice works
