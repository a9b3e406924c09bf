"""isood.science.laid: text triplets, LAID fitting on the planted world (recovery, orthogonality, determinism), save/load."""
import inspect
import json

import numpy as np
import pytest
import torch

from isood.core.errors import BadInputError, IsoodError
from isood.science.laid import DEFAULT_FIT_OPTIONS, LAID, LaidFitOptions, fit_laid, make_text_triplets, text_set_hash
from isood.science.simulate import make_planted_world, random_orthogonal, subspace_recovery

RECOVERY_THRESHOLD = 0.95  # documented in DEFAULT_FIT_OPTIONS; measured ~0.999 on seeds 0-2
RANDOM_CEILING = 0.65      # a random orthogonal W: ~0.5 (k/D for k = D/2)


@pytest.fixture(scope="module")
def world():
    return make_planted_world(seed=0)


@pytest.fixture(scope="module")
def laid(world):
    return fit_laid(world.text_anchor, world.text_semantic_shift, world.text_covariate_shift)


# --- text triplets -------------------------------------------------------------------------------------------

def test_text_triplets_follow_the_seed_definition():
    labels = ["dog", "cat", "car", "tree"]
    templates = ["a photo of a {}.", lambda c: f"a sketch of the {c}.", "itap of a {}."]
    parse = {}
    for ti, t in enumerate(templates):
        for li, lab in enumerate(labels):
            text = t(lab) if callable(t) else t.format(lab)
            parse[text] = (ti, li)
    anchor, sem, cov = make_text_triplets(labels, templates, n=300, seed=7)
    assert len(anchor) == len(sem) == len(cov) == 300
    a, s, c = (np.array([parse[x] for x in xs]) for xs in (anchor, sem, cov))
    assert np.all(a[:, 0] == s[:, 0]) and np.all(a[:, 1] != s[:, 1])  # same template, other label
    assert np.all(a[:, 1] == c[:, 1]) and np.all(a[:, 0] != c[:, 0])  # same label, other template
    assert set(a[:, 0]) == {0, 1, 2} and set(a[:, 1]) == {0, 1, 2, 3}  # every template and label is drawn
    assert make_text_triplets(labels, templates, n=300, seed=7) == (anchor, sem, cov)
    assert make_text_triplets(labels, templates, n=300, seed=8)[0] != anchor


def test_text_triplets_accept_open_clip_templates_and_reject_too_few():
    from isood.features.laid_training import openai_imagenet_templates

    templates = openai_imagenet_templates()
    assert len(templates) == 80
    anchor, _, cov = make_text_triplets(["goldfish", "tabby cat"], templates, n=20, seed=0)
    assert all(("goldfish" in x) or ("tabby cat" in x) for x in anchor + cov)
    with pytest.raises(IsoodError, match="at least 2 distinct labels"):
        make_text_triplets(["dog", "dog"], templates, n=5)
    with pytest.raises(IsoodError, match="at least 2 templates"):
        make_text_triplets(["dog", "cat"], ["a {}"], n=5)
    with pytest.raises(IsoodError, match="neither a callable nor a string containing"):
        make_text_triplets(["dog", "cat"], ["a {}", "no slot"], n=50)


def test_text_set_hash_is_order_and_boundary_sensitive():
    h = text_set_hash(["a photo of a dog.", "cat"])
    assert h == text_set_hash(["a photo of a dog.", "cat"]) and len(h) == 64
    assert h != text_set_hash(["cat", "a photo of a dog."])
    assert text_set_hash(["ab", "c"]) != text_set_hash(["a", "bc"])


# --- fitting on the planted world -------------------------------------------------------------------------

def test_laid_recovers_the_planted_semantic_subspace(world, laid):
    learned = subspace_recovery(laid.W, world.semantic_basis)
    random = subspace_recovery(random_orthogonal(world.dim, seed=1), world.semantic_basis)
    identity = subspace_recovery(np.eye(world.dim), world.semantic_basis)
    assert learned >= RECOVERY_THRESHOLD
    assert random <= RANDOM_CEILING and identity <= RANDOM_CEILING
    # the covariate half is recovered too: its span is the planted covariate subspace
    k = world.dim // 2
    assert subspace_recovery(laid.W[:, k:], world.covariate_basis) >= RECOVERY_THRESHOLD


def test_fit_is_near_orthogonal_and_reports_loss_curves(laid):
    assert laid.orthogonality_error < 0.15
    h = laid.history
    assert set(h) == {"sem", "cov", "orth", "total"}
    assert all(len(v) == DEFAULT_FIT_OPTIONS["steps"] for v in h.values())
    np.testing.assert_allclose(h["total"], h["sem"] + h["cov"] + h["orth"], rtol=1e-5)  # default weights are 1
    assert h["sem"][-50:].mean() < 0.5 * h["sem"][:10].mean()
    assert h["cov"][-50:].mean() < 0.5 * h["cov"][:10].mean()
    assert laid.config["margin"] == DEFAULT_FIT_OPTIONS["margin"] and laid.config["dim"] == 64


def test_fit_is_deterministic_for_a_seed(world):
    args = (world.text_anchor[:800], world.text_semantic_shift[:800], world.text_covariate_shift[:800])
    a = fit_laid(*args, steps=40, seed=3, init="orthogonal")
    b = fit_laid(*args, steps=40, seed=3, init="orthogonal")
    c = fit_laid(*args, steps=40, seed=4, init="orthogonal")
    np.testing.assert_array_equal(a.W, b.W)
    np.testing.assert_array_equal(a.history["total"], b.history["total"])
    assert np.abs(a.W - c.W).max() > 1e-3


def test_callback_and_text_hash_options(world):
    seen = []
    texts = ["a photo of a dog.", "a photo of a cat.", "a sketch of a dog."]
    out = fit_laid(world.text_anchor[:100], world.text_semantic_shift[:100], world.text_covariate_shift[:100],
                   steps=5, batch_size=32, texts=texts, callback=lambda step, total, losses: seen.append((step, total, losses["total"])))
    assert [s[0] for s in seen] == [0, 1, 2, 3, 4] and all(s[1] == 5 for s in seen)
    assert [s[2] for s in seen] == pytest.approx(list(out.history["total"]))
    assert out.config["text_hash"] == text_set_hash(texts)


def test_transform_splits_halves_and_accepts_torch(world, laid):
    sem, cov = laid.transform(world.test_features[:10])
    full = world.test_features[:10] @ laid.W
    np.testing.assert_allclose(np.hstack([sem, cov]), full, rtol=1e-6, atol=1e-6)
    assert sem.shape == (10, 32) and cov.shape == (10, 32)
    sem_t, cov_t = laid.transform(torch.from_numpy(world.test_features[:10]))
    np.testing.assert_array_equal(sem_t, sem)
    with pytest.raises(IsoodError, match="feature dimension mismatch: LAID W is 64x64"):
        laid.transform(np.zeros((3, 32), np.float32))


def test_save_load_round_trip(tmp_path, world, laid):
    laid.config["text_hash"] = text_set_hash(["x", "y"])
    path = laid.save(tmp_path / "laid.safetensors")
    side = json.loads((tmp_path / "laid.json").read_text())
    assert side["text_hash"] == text_set_hash(["x", "y"])
    assert side["orthogonality_error"] == pytest.approx(laid.orthogonality_error)
    back = LAID.load(path)
    np.testing.assert_array_equal(back.W, laid.W)
    for got, want in zip(back.transform(world.test_features), laid.transform(world.test_features)):
        np.testing.assert_array_equal(got, want)
    assert back.config == laid.config
    np.testing.assert_array_equal(back.history["sem"], laid.history["sem"])
    with pytest.raises(IsoodError, match="LAID file not found"):
        LAID.load(tmp_path / "missing.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(IsoodError, match="cannot read LAID file"):
        LAID.load(tmp_path / "bad.safetensors")


def test_bad_inputs(world):
    a = world.text_anchor[:50]
    with pytest.raises(IsoodError, match="must be \\(N, D\\) arrays of one shape"):
        fit_laid(a, a[:40], a)
    with pytest.raises(TypeError, match="lr_decay"):
        fit_laid(a, a, a, lr_decay=0.5)
    with pytest.raises(TypeError):
        fit_laid(a, a, a, 1.0)  # options are keyword-only
    with pytest.raises(IsoodError, match="unknown LAID init 'zeros'"):
        fit_laid(a, a, a, init="zeros", steps=1)
    bad = a.copy()
    bad[0, 0] = np.nan
    with pytest.warns(UserWarning, match="1 of 50 triplets contain NaN/inf and are dropped"):
        out = fit_laid(bad, a, a, steps=2)
    assert out.config["n_triplets"] == 49 and np.isfinite(out.W).all()


def test_signature_defaults_are_the_documented_defaults():
    params = inspect.signature(fit_laid).parameters
    for name, value in DEFAULT_FIT_OPTIONS.items():
        assert params[name].default == value and params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert dict(DEFAULT_FIT_OPTIONS) == {f: getattr(LaidFitOptions(), f) for f in DEFAULT_FIT_OPTIONS}
    with pytest.raises(TypeError):
        DEFAULT_FIT_OPTIONS["steps"] = 1  # read-only


@pytest.mark.parametrize("option, value", [
    ("margin", -1.0), ("margin", float("nan")), ("lr", 0.0), ("semantic_weight", "1"), ("steps", 0),
    ("batch_size", 2.5), ("optimizer", "lbfgs"), ("init", "zeros"), ("num_threads", -2), ("steps", True),
])
def test_bad_option_values_are_bad_input_errors_naming_the_option(world, option, value):
    a = world.text_anchor[:20]
    with pytest.raises(BadInputError) as info:
        fit_laid(a, a, a, **{option: value})
    assert (option in str(info.value)) or (str(value) in str(info.value))


def test_laid_file_bytes_are_identical_for_identical_content(tmp_path):
    rng = np.random.default_rng(0)
    laid = LAID(rng.standard_normal((4, 4)), config={"seed": 0, "margin": 1.0, "text_hash": "ab"},
                history={"total": np.arange(3.0), "sem": np.ones(3)})
    saved = {laid.save(tmp_path / f"w{i}.safetensors").read_bytes() for i in range(12)}
    assert len(saved) == 1  # safetensors alone orders a multi-key header differently from call to call
    back = LAID.load(tmp_path / "w0.safetensors")
    assert np.array_equal(back.W, laid.W) and back.config == laid.config
    assert np.array_equal(back.history["total"], laid.history["total"])


@pytest.mark.parametrize("margin, weights", [(1.0, (1.0, 1.0, 1.0)), (0.2, (1.0, 0.5, 0.1)), (0.0, (0.3, 2.0, 0.0))])
def test_laid_loss_and_gradient_equal_torch_autograd(margin, weights):
    """The closed-form gradient of the LAID losses (numpy, ``laid_loss``) against torch autograd of the same
    formulas (module docstring; torch's ``cosine_similarity``) in float64: an independent reference."""
    import torch

    from isood.science.laid import laid_loss

    rng = np.random.default_rng(7)
    dim, n = 12, 64
    W = rng.standard_normal((dim, dim))
    A, S, C = (rng.standard_normal((n, dim)) for _ in range(3))
    ws, wc, wo = weights
    losses, grad = laid_loss(W, A, S, C, margin=margin, semantic_weight=ws, covariate_weight=wc,
                             orthogonality_weight=wo)
    Wt = torch.tensor(W, requires_grad=True)
    a, s, c = (torch.tensor(x) @ Wt for x in (A, S, C))
    k = dim // 2

    def d(x, y):
        return 1 - torch.nn.functional.cosine_similarity(x, y, dim=1, eps=1e-8)

    l_sem = torch.relu(d(a[:, :k], c[:, :k]) - d(a[:, :k], s[:, :k]) + margin).mean()
    l_cov = torch.relu(d(a[:, k:], s[:, k:]) - d(a[:, k:], c[:, k:]) + margin).mean()
    l_orth = ((Wt.T @ Wt - torch.eye(dim, dtype=torch.float64)) ** 2).sum()
    total = ws * l_sem + wc * l_cov + wo * l_orth
    total.backward()
    assert 0 < l_sem.item() and 0 < l_cov.item()  # some hinges active, so the gradient is not trivially zero
    for name, ref in (("sem", l_sem), ("cov", l_cov), ("orth", l_orth), ("total", total)):
        assert losses[name] == pytest.approx(ref.item(), rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(grad, Wt.grad.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_optimiser_updates_equal_torchs(name):
    """The numpy Adam / SGD-with-momentum steps against torch.optim's on the same gradient sequence."""
    import torch

    from isood.science.laid import _SGD, _Adam

    rng = np.random.default_rng(3)
    W = rng.standard_normal((5, 5))
    grads = [rng.standard_normal((5, 5)) for _ in range(6)]
    ours = (_Adam if name == "adam" else _SGD)(0.05)
    Wt = torch.tensor(W.copy(), requires_grad=True)
    theirs = torch.optim.Adam([Wt], lr=0.05) if name == "adam" else torch.optim.SGD([Wt], lr=0.05, momentum=0.9)
    for g in grads:
        ours.step(W, g)
        Wt.grad = torch.tensor(g)
        theirs.step()
    np.testing.assert_allclose(W, Wt.detach().numpy(), rtol=1e-12, atol=1e-12)
