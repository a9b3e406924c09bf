"""isood.features.laid_training: the LAID recipe on a CLIP (triplets of labels x templates, encoded once, cached, fitted)."""

import numpy as np
import pytest

from isood.core.errors import BadInputError
from isood.science.laid import make_text_triplets, text_set_hash
from isood.features.laid_training import TEMPLATES_NAME, TextTriplets, sample_triplets, train_laid_from_labels, triplet_features

LABELS = ["tench", "goldfish", "dog", "teddy bear", "car"]


def test_sample_triplets_dedupes_labels_and_uses_the_80_templates():
    t = sample_triplets(LABELS + ["dog"], triplets=50, seed=3)
    assert isinstance(t, TextTriplets) and len(t.anchor) == len(t.semantic) == len(t.covariate) == 50
    from isood.features.laid_training import openai_imagenet_templates

    want = make_text_triplets(LABELS, openai_imagenet_templates(), 50, seed=3)
    assert (t.anchor, t.semantic, t.covariate) == want
    assert t.all_texts == want[0] + want[1] + want[2]
    assert t.distinct == list(dict.fromkeys(t.all_texts))
    with pytest.raises(BadInputError, match="at least 2 distinct labels"):
        sample_triplets(["dog", "dog"])


def test_triplet_features_look_rows_up_by_text():
    t = TextTriplets(["a", "b"], ["c", "a"], ["b", "b"])
    distinct = ["a", "b", "c"]
    feats = np.arange(6, dtype=np.float32).reshape(3, 2)
    A, S, C = triplet_features(t, distinct, feats)
    np.testing.assert_array_equal(A, feats[[0, 1]])
    np.testing.assert_array_equal(S, feats[[2, 0]])
    np.testing.assert_array_equal(C, feats[[1, 1]])
    with pytest.raises(BadInputError, match="3 texts but 2 feature rows"):
        triplet_features(t, distinct, feats[:2])


def test_train_laid_from_labels_is_deterministic_and_caches_texts(tiny_clip_spec, tmp_path):
    import torch

    from isood.features.clip import encode_texts, load_clip

    torch.set_num_threads(1)
    encoder = load_clip(tiny_clip_spec, device="cpu")
    kw = dict(labels_from="test labels", triplets=60, seed=1, steps=15, cache_dir=tmp_path / "cache", progress=False)
    a, seconds = train_laid_from_labels(encoder, LABELS, **kw)
    cached = sorted((tmp_path / "cache").rglob("*.npy"))
    assert len(cached) == 1 and seconds is not None and seconds >= 0
    b, _ = train_laid_from_labels(encoder, LABELS, **kw)
    np.testing.assert_array_equal(a.W, b.W)
    assert sorted((tmp_path / "cache").rglob("*.npy")) == cached
    assert a.W.shape == (encoder.embed_dim, encoder.embed_dim) and len(a.history["total"]) == 15
    texts = sample_triplets(LABELS, triplets=60, seed=1)
    assert a.config["text_hash"] == text_set_hash(texts.all_texts) and a.config["n_triplets"] == 60
    assert (a.config["labels"], a.config["n_labels"], a.config["templates"]) == ("test labels", 5, TEMPLATES_NAME)
    assert a.config["clip_identity"] == encoder.identity and "fit_seconds" not in a.config
    # the features it trained on are the CLIP's text features of the triplets
    feats = encode_texts(encoder, texts.distinct)
    A, _, _ = triplet_features(texts, texts.distinct, feats)
    np.testing.assert_allclose(np.load(cached[0])[[texts.distinct.index(x) for x in texts.anchor]], A, atol=1e-6)
