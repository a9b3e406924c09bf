"""MCM and GL-MCM on a CLIP zero-shot classifier, against the published formulas computed here by
hand with torch on tiny open_clip models (a ViT and a ModifiedResNet, seeded weights, no download).

MCM (Ming et al., NeurIPS 2022): S = max_c softmax(cos(f(x), t_c) / T), T = 1, prompts "a photo of a <class>".
GL-MCM (Miyai et al., 2023): S = MCM + lambda * max over local features p and classes c of softmax(cos(f_p(x),
t_c) / T); local features of a ViT: the last block's value path (v = x + out_proj(v_proj(ln_1(x))), then
v + mlp(ln_2(v))), ln_post, projection; of a ModifiedResNet: c_proj(v_proj(.)) of the attention pool's input map.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from isood.classifiers.clip_zero_shot import class_prompts, clip_zero_shot
from isood.science.detectors import ForwardOutputs, get_detector
from isood.classifiers.scoring import run_detectors

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["n01440764", "n01443537", "n02084071"]  # tench, goldfish, dog (timm's ImageNet lemmas)
RN_CONFIG = {"model_cfg": {"embed_dim": 32, "vision_cfg": {"image_size": 64, "layers": [1, 1, 1, 1], "width": 16,
                                                           "head_width": 16},
                           "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2,
                                        "layers": 2}},
             "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073],
                                "std": [0.26862954, 0.26130258, 0.27577711]}}


@pytest.fixture(scope="module")
def tiny_rn_clip(tmp_path_factory):
    from open_clip.model import CLIP
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny_rn_clip")
    torch.manual_seed(3)
    model = CLIP(**RN_CONFIG["model_cfg"])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps(RN_CONFIG))
    return folder


def _open_clip(folder):
    import open_clip

    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{folder}", device="cpu")
    return model.eval(), open_clip.get_tokenizer(f"local-dir:{folder}")


def _hand_text(model, tokenizer, prompts):
    with torch.no_grad():
        return F.normalize(model.encode_text(tokenizer(prompts)).float(), dim=-1)


def _hand_vit_local(model, x):
    """Local features of an open_clip ViT, GL-MCM's way, from the input of the last block (caught by a hook)."""
    visual = model.visual
    seen = {}
    last = visual.transformer.resblocks[-1]
    h = last.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))
    with torch.no_grad():
        glob = model.encode_image(x)
        h.remove()
        z = seen["x"]
        _, _, wv = last.attn.in_proj_weight.chunk(3)
        _, _, bv = last.attn.in_proj_bias.chunk(3)
        v = z + last.attn.out_proj(last.ln_1(z) @ wv.T + bv)
        v = v + last.mlp(last.ln_2(v))
        local = visual.ln_post(v[:, 1:]) @ visual.proj
    return glob, local


def _hand_rn_local(model, x):
    visual = model.visual
    seen = {}
    h = visual.attnpool.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))
    with torch.no_grad():
        glob = model.encode_image(x)
        h.remove()
        fmap = seen["x"].permute(0, 2, 3, 1).reshape(x.shape[0], -1, seen["x"].shape[1])
        local = visual.attnpool.c_proj(visual.attnpool.v_proj(fmap))
    return glob, local


def _hand_scores(glob, local, text, temperature=1.0, lam=1.0):
    g = F.normalize(glob.float(), dim=-1) @ text.T
    loc = F.normalize(local.float(), dim=-1) @ text.T
    mcm = torch.softmax(g / temperature, dim=1).max(dim=1).values
    local_max = torch.softmax(loc / temperature, dim=-1).amax(dim=(1, 2))
    return mcm.numpy(), (mcm + lam * local_max).numpy()


def test_prompts_use_the_class_names():
    assert class_prompts(CLASSES) == ["a photo of a tench", "a photo of a goldfish", "a photo of a dog"]
    assert class_prompts(["n01440764", "zebra"], {"n01440764": "tinca tinca"}) == ["a photo of a tinca tinca",
                                                                                  "a photo of a zebra"]


@pytest.mark.parametrize("tower", ["vit", "rn"])
def test_mcm_and_glmcm_equal_the_formulas_by_hand(tower, tiny_clip_dir, tiny_rn_clip):
    folder = tiny_clip_dir if tower == "vit" else tiny_rn_clip
    size = 32 if tower == "vit" else 64
    adapter = clip_zero_shot(f"local-dir:{folder}", CLASSES, device="cpu")
    assert {"local_logits", "fc", "features"} <= adapter.provides
    model, tokenizer = _open_clip(folder)
    text = _hand_text(model, tokenizer, ["a photo of a tench", "a photo of a goldfish", "a photo of a dog"])
    x = torch.randn(12, 3, size, size, generator=torch.Generator().manual_seed(0))
    glob, local = (_hand_vit_local if tower == "vit" else _hand_rn_local)(model, x)
    mcm, glmcm = _hand_scores(glob, local, text)
    mcm_t2, glmcm_l = _hand_scores(glob, local, text, temperature=2.0, lam=0.5)
    got = run_detectors(adapter, ["mcm", "glmcm"], {"x": x}, batch_size=5)
    np.testing.assert_allclose(got.scores["mcm"]["x"], mcm, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.scores["glmcm"]["x"], glmcm, rtol=1e-5, atol=1e-7)
    other = run_detectors(adapter, ["mcm:temperature=2", "glmcm:temperature=2,lambda_local=0.5"], {"x": x},
                          batch_size=5)
    np.testing.assert_allclose(other.scores["mcm"]["x"], mcm_t2, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(other.scores["glmcm"]["x"], glmcm_l, rtol=1e-5, atol=1e-7)
    # predictions are CLIP's zero-shot classes; the fc layer maps the features to the logits (cosines)
    np.testing.assert_array_equal(got.predictions["x"], (F.normalize(glob, dim=-1) @ text.T).argmax(1).numpy())
    out = adapter.forward(x[:3], {"features", "logits"})
    w, b = adapter.fc_params()
    np.testing.assert_allclose(out["features"].numpy() @ w.T + b, out["logits"].numpy(), rtol=1e-5, atol=1e-6)


def test_glmcm_on_arrays_and_without_local_features():
    rng = np.random.default_rng(0)
    logits, local = rng.normal(size=(5, 4)), rng.normal(size=(5, 7, 4))
    out = ForwardOutputs.from_arrays(logits=logits, local_logits=local)
    e = np.exp(local / 1.0)
    local_max = (e / e.sum(-1, keepdims=True)).max(axis=(1, 2))
    g = np.exp(logits)
    expected = (g / g.sum(1, keepdims=True)).max(1) + 0.3 * local_max
    np.testing.assert_allclose(get_detector("glmcm", lambda_local=0.3).score(out), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="lambda_local"):
        get_detector("glmcm", lambda_local=-1)
    with pytest.raises(Exception, match="local"):
        get_detector("glmcm").score(ForwardOutputs.from_arrays(logits=logits))
