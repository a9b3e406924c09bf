import nltk
import pytest

from isood.core.errors import BadInputError, IsoodError
from wordnet_tools import loader
from wordnet_tools.errors import UnknownWnidError, WordNetNotFound
from wordnet_tools.loader import LEXNAMES, find_wordnet_source, load_wordnet, synset_from_wnid, wnid_of


def test_load_is_cached_and_is_wordnet_30(wordnet):
    assert load_wordnet() is wordnet
    assert wordnet.get_version() == "3.0"


def test_wnid_maps_to_synset_by_offset_and_back(wordnet):
    assert synset_from_wnid("n02084071", wordnet).name() == "dog.n.01"
    assert synset_from_wnid("n03483316", wordnet).name() == "hand_blower.n.01"
    assert wnid_of(wordnet.synset("organism.n.01")) == "n00004475"
    assert wnid_of(wordnet.synset("entity.n.01")) == "n00001740"


def test_bad_wnids_raise_the_specific_error(wordnet):
    with pytest.raises(UnknownWnidError, match="not a wnid"):
        synset_from_wnid("dog", wordnet)
    with pytest.raises(UnknownWnidError, match="unknown wnid n00000001"):
        synset_from_wnid("n00000001", wordnet)  # offset inside the licence header, starts no synset
    with pytest.raises(UnknownWnidError, match="unknown wnid"):
        synset_from_wnid("n99999999", wordnet)  # past the end of data.noun
    with pytest.raises(BadInputError, match="run.v.01"):
        wnid_of(wordnet.synset("run.v.01"))


def test_lexnames_order_gives_the_right_lexicographer_files(wordnet):
    assert len(LEXNAMES) == 45
    assert synset_from_wnid("n03483316", wordnet).lexname() == "noun.artifact"
    assert synset_from_wnid("n02129165", wordnet).lexname() == "noun.animal"
    assert wordnet.synset("run.v.01").lexname() == "verb.motion"


def test_missing_wordnet_is_one_line_with_install_commands(monkeypatch, tmp_path):
    monkeypatch.delenv("ISOOD_WORDNET_DIR", raising=False)
    monkeypatch.setenv("ISOOD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "DEBIAN_WORDNET_DIR", tmp_path / "nothing")

    def not_found(name):
        raise LookupError(name)

    monkeypatch.setattr(nltk.data, "find", not_found)
    with pytest.raises(WordNetNotFound) as info:
        load_wordnet()
    msg = str(info.value)
    assert isinstance(info.value, IsoodError)
    assert "\n" not in msg
    assert "apt-get install wordnet-base" in msg
    assert "python -m nltk.downloader wordnet" in msg
    assert "ISOOD_WORDNET_DIR" in msg


def test_env_dir_without_wordnet_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("ISOOD_WORDNET_DIR", str(tmp_path))
    with pytest.raises(WordNetNotFound, match="not a WordNet 3.0 dict folder"):
        load_wordnet()


def test_source_priority_env_then_nltk_then_debian(monkeypatch, tmp_path):
    monkeypatch.delenv("ISOOD_WORDNET_DIR", raising=False)
    monkeypatch.setenv("ISOOD_CACHE_DIR", str(tmp_path / "cache"))
    fake_nltk = tmp_path / "nltk_data" / "corpora" / "wordnet"
    monkeypatch.setattr(nltk.data, "find", lambda name: str(fake_nltk))
    assert find_wordnet_source().kind == "nltk"
    monkeypatch.setenv("ISOOD_WORDNET_DIR", str(loader.DEBIAN_WORDNET_DIR))
    assert find_wordnet_source().kind == "env"

    def not_found(name):
        raise LookupError(name)

    monkeypatch.delenv("ISOOD_WORDNET_DIR")
    monkeypatch.setattr(nltk.data, "find", not_found)
    assert find_wordnet_source() == loader.WordNetSource("debian", str(loader.DEBIAN_WORDNET_DIR))


def test_raw_dict_folder_is_staged_with_lexnames(monkeypatch, tmp_path, wordnet):
    # A raw WordNet dict folder without lexnames (like Debian's wordnet-base), made from the data in use.
    raw = tmp_path / "dict"
    raw.mkdir()
    for name in ("data.noun", "index.noun", "data.verb", "index.verb", "data.adj", "index.adj",
                 "data.adv", "index.adv", "noun.exc", "verb.exc", "adj.exc", "adv.exc"):
        with wordnet.abspath(name).open() as src:
            (raw / name).write_bytes(src.read())
    monkeypatch.setenv("HOME", str(tmp_path))  # both variables expand ~ (isood.core.defaults)
    monkeypatch.setenv("ISOOD_WORDNET_DIR", "~/dict")
    monkeypatch.setenv("ISOOD_CACHE_DIR", "~/cache")
    assert find_wordnet_source() == loader.WordNetSource("env", str(raw.resolve()))
    wn = load_wordnet()
    assert wn is not wordnet
    staged = tmp_path / "cache" / "nltk_data" / "corpora" / "wordnet"
    lines = (staged / "lexnames").read_text().splitlines()
    assert len(lines) == 45
    assert lines[6].split("\t") == ["06", "noun.artifact", "1"]
    assert (staged / "data.noun").stat().st_size == (raw / "data.noun").stat().st_size
    assert wn.synset("hand_blower.n.01").offset() == 3483316
    assert wn.synset("hand_blower.n.01").lexname() == "noun.artifact"


def test_nltk_data_zip_is_used_when_present(monkeypatch, tmp_path, wordnet):
    # nltk.downloader installs corpora/wordnet.zip; build one from the data in use (with a lexnames file).
    import zipfile

    corpora = tmp_path / "nltk_data" / "corpora"
    corpora.mkdir(parents=True)
    with zipfile.ZipFile(corpora / "wordnet.zip", "w", zipfile.ZIP_STORED) as zf:
        for name in ("data.noun", "index.noun", "data.verb", "index.verb", "data.adj", "index.adj",
                     "data.adv", "index.adv", "noun.exc", "verb.exc", "adj.exc", "adv.exc", "lexnames"):
            with wordnet.abspath(name).open() as src:
                zf.writestr(f"wordnet/{name}", src.read())
    monkeypatch.delenv("ISOOD_WORDNET_DIR", raising=False)
    monkeypatch.setenv("ISOOD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nltk_data")])
    source = find_wordnet_source()
    assert source.kind == "nltk" and "wordnet.zip" in source.path
    wn = load_wordnet()
    assert wn is not wordnet
    assert synset_from_wnid("n03483316", wn).name() == "hand_blower.n.01"
    assert not (tmp_path / "cache").exists()  # nothing staged for nltk's own data
