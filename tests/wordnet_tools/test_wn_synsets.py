import pytest

from wordnet_tools.errors import ClassListError
from wordnet_tools.synsets import imagenet_definitions, imagenet_lemmas, imagenet_names, load_synset_list


@pytest.mark.parametrize(
    "spec,size", [("1k", 1000), ("21k", 21841), ("21k-p", 11221), ("21k-p-w21", 10450), ("12k", 11821),
                  ("21k-goog", 21843)],
)
def test_named_list_sizes(spec, size):
    wnids = load_synset_list(spec)
    assert len(wnids) == size
    assert len(set(wnids)) == size


def test_list_contents_and_the_teddy_bear_pitfall(in1k, in21k):
    assert in1k[0] == "n01440764"  # tench, class 0 of ImageNet-1K
    assert in1k[-1] == "n15075141"  # toilet tissue, class 999
    assert "n04399382" in in1k
    assert "n04399382" not in in21k  # teddy bear: an ImageNet-1K class missing from fall11 full
    assert set(in1k) - set(in21k) == {"n04399382"}
    assert set(load_synset_list("21k-p-w21")) <= set(load_synset_list("21k-p"))


def test_every_1k_wnid_is_a_wordnet_noun(in1k, hierarchy):
    assert all(hierarchy.is_known(w) for w in in1k)


def test_list_file_with_comments_and_trailing_text(tmp_path):
    f = tmp_path / "classes.txt"
    f.write_text("# my classes\n\nn01440764 tench, Tinca tinca\n  n03483316  # hand blower\nn02084071\n")
    assert load_synset_list(f) == ["n01440764", "n03483316", "n02084071"]
    assert load_synset_list(str(f)) == ["n01440764", "n03483316", "n02084071"]


def test_malformed_list_line_names_file_and_line(tmp_path):
    f = tmp_path / "classes.txt"
    f.write_text("n01440764\n\nn0348331\n")
    with pytest.raises(ClassListError, match=r"classes\.txt:3: not a wnid: 'n0348331'"):
        load_synset_list(f)


def test_duplicate_wnid_in_list_file(tmp_path):
    f = tmp_path / "classes.txt"
    f.write_text("n01440764\nn03483316\nn01440764\n")
    with pytest.raises(ClassListError, match=r"classes\.txt:3: duplicate wnid n01440764 \(first at line 1\)"):
        load_synset_list(f)


def test_dataset_root_subfolders(tmp_path):
    for name in ("n03483316", "n01440764", ".cache"):
        (tmp_path / name).mkdir()
    (tmp_path / "README.txt").write_text("not a class")
    assert load_synset_list(tmp_path) == ["n01440764", "n03483316"]
    (tmp_path / "train").mkdir()
    with pytest.raises(ClassListError, match="'train'"):
        load_synset_list(tmp_path)


def test_unknown_spec_lists_the_names(tmp_path):
    with pytest.raises(ClassListError, match="1k, 21k, 21k-p"):
        load_synset_list("22k-typo")


def test_lemma_and_definition_fallbacks():
    assert imagenet_lemmas()["n03483316"].startswith("hand blower, blow dryer")
    assert imagenet_names()["n03483316"] == "hand blower"
    assert imagenet_names()["n04399382"] == "teddy"
    assert "hair" in imagenet_definitions()["n03483316"]
