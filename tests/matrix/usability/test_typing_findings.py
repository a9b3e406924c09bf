"""What the type checker (mypy, ``[tool.mypy]`` in pyproject.toml) found that was a real bug, one
row each. Every row was a Python exception of the wrong kind (``TypeError``, ``KeyError``, ``AttributeError``: a
traceback for a user) where the house asks for a one-line error saying what to pass instead.

| row                                      | mypy's complaint                      | guard                             |
|------------------------------------------|---------------------------------------|-----------------------------------|
| build_splits without id / test / out     | SplitsOptions.out / .id may be None     | stages.splits.config.validate     |
| a DER metric without thresholds          | CellInputs.der_thresholds may be None | evaluation.metrics._der_metric    |
| a leak mask on a set that is no grid     | EvalSet.images may be None            | stages.evaluate.assemble.leak_free_set|
| a streamed layout whose main is unlisted | ConfigLayout.main may be None         | manifests.card.write_with_card    |
| write() on a file staged by path         | StagedFile.file may be None           | manifests.stream.StagedFile.write |
| an input detector without input scores   | input_scores may be None              | classifiers.scoring.score_dataset|
| outputs without logits, fitted / scored  | ForwardOutputs.logits may be None     | ForwardOutputs.captured           |
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from isood.core.errors import BadInputError, ManifestError


@pytest.mark.parametrize("missing, named", [("id", "--id"), ("test", "--test"), ("out", "--out")])
def test_build_splits_without_a_required_path(tmp_path, missing, named):
    from isood.stages.splits import SplitsOptions, build_splits

    src = tmp_path / "src"
    src.mkdir()
    paths = {"id": str(src), "test": str(src), "out": str(tmp_path / "out")}
    paths[missing] = None
    with pytest.raises(BadInputError) as e:
        build_splits(SplitsOptions(**paths))
    message = str(e.value)
    assert "\n" not in message and f"{named} is required" in message, message
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_der_metric_without_thresholds():
    from isood.science.metrics import METRICS, CellInputs

    rng = np.random.default_rng(0)
    inputs = CellInputs(rng.normal(1, 1, 50), rng.normal(0, 1, 40), id_correct=np.ones(50, bool))
    for name in ("der95", "der99"):
        with pytest.raises(BadInputError, match="DER needs the thresholds"):
            METRICS[name].function(inputs)
    # with thresholds it is the DER of ``der_at_threshold`` (the guard changes nothing else)
    from isood.science.ood_metrics import der_at_threshold

    with_t = inputs._replace(der_thresholds={0.95: 0.5, 0.99: 0.1})
    assert METRICS["der95"].function(with_t) == der_at_threshold(
        with_t.id_scores, with_t.ood_scores, id_correct=with_t.id_correct, threshold=0.5)


def test_leak_mask_on_a_set_without_images():
    from isood.stages.evaluate.assemble import EvalSet, leak_free_set

    flat = EvalSet("ood_list", np.full(3, -1, np.int64), paths=["a.png", "b.png", "c.png"])
    with pytest.raises(BadInputError, match="ood_list is not a grid dataset"):
        leak_free_set(flat, np.array([True, False, False]))


@pytest.mark.parametrize("main", [None, "rows"])
def test_streamed_layout_whose_main_table_is_not_given(tmp_path, main):
    from manifests.card import write_with_card
    from manifests.card_layout import ConfigLayout

    with pytest.raises(ManifestError, match="is not in table_files"):
        write_with_card(tmp_path / "m", kind="card-test", tables={"other": pd.DataFrame({"x": [1]})}, config={},
                        layout=ConfigLayout(main=main), table_files={})
    assert not (tmp_path / "m" / "manifest.json").exists()


def test_write_on_a_file_staged_by_path(tmp_path):
    from manifests.stream import StagedFile

    staged = StagedFile(tmp_path / "t.bin", open_file=False)
    with pytest.raises(ValueError, match="open_file=False"):
        staged.write(b"x")
    staged.abort()
    assert list(tmp_path.iterdir()) == []


def test_input_detector_scored_without_its_input_scores():
    from isood.science.detectors import ODIN, ForwardOutputs
    from isood.classifiers.scoring import DetectorScores, score_dataset

    outputs = ForwardOutputs.from_arrays(logits=np.eye(3, dtype=np.float32))
    with pytest.raises(BadInputError) as e:
        score_dataset(DetectorScores(), "ood", {"odin": ODIN()}, outputs)
    assert "\n" not in str(e.value) and "perturbs the input images" in str(e.value), str(e.value)
    # given them, they are what is recorded (the guard changes nothing else)
    result = DetectorScores()
    score_dataset(result, "ood", {"odin": ODIN()}, outputs, {"odin": np.array([0.1, 0.2, 0.3])})
    np.testing.assert_array_equal(result.scores["odin"]["ood"], [0.1, 0.2, 0.3])
    np.testing.assert_array_equal(result.predictions["ood"], [0, 1, 2])


def test_outputs_without_logits_are_a_one_line_error():
    from isood.core.errors import IsoodError
    from isood.science.detectors import ForwardOutputs, parse_detectors
    from isood.classifiers.scoring import DetectorScores, fit_detectors, score_dataset

    outputs = ForwardOutputs.from_arrays(features=np.ones((4, 2), np.float32), labels=np.zeros(4, np.int64))
    knn = parse_detectors("knn")
    with pytest.raises(IsoodError, match="captured no logits"):
        fit_detectors(knn, outputs)
    with pytest.raises(IsoodError, match="captured no logits"):
        score_dataset(DetectorScores(), "ood", knn, outputs)
