"""Load Princeton WordNet 3.0 through nltk, offline, and map ImageNet wnids to synsets.

Where the data comes from (first match wins):

1. ``$ISOOD_WORDNET_DIR`` if set (``isood.core.defaults.wordnet_dir_override()``; an explicit choice, so an error if
   it holds no WordNet),
2. nltk's own data (``nltk.data.find('corpora/wordnet')``, e.g. after ``python -m nltk.downloader wordnet``),
3. Debian's ``wordnet-base`` folder ``/usr/share/wordnet``.

A raw WordNet ``dict`` folder (Debian's, or one named by ``$ISOOD_WORDNET_DIR``) is not readable by nltk as-is:
nltk only opens corpora under a folder on ``nltk.data.path``, the folder has no ``lexnames`` file, and nltk's
reader maps "WordNet 3.0 -> nltk's wordnet" through ``index.sense`` files the folder lacks. The loader stages
the files plus a generated ``lexnames`` into ``<cache>/nltk_data/corpora/wordnet`` (``<cache>`` is
``isood.core.defaults.cache_dir()``: ``$ISOOD_CACHE_DIR`` with ``~`` expanded, default ``~/.cache/isood``), registers
``<cache>/nltk_data`` on ``nltk.data.path`` (nltk's documented way to add a data location) and reads it with a
``WordNetCorpusReader`` subclass whose only change is that the data is already WordNet 3.0, so that mapping is
the identity (it is only used for multilingual lookups, which isood does not use; no OMW reader is attached).

ImageNet names a class by its wnid, ``'n'`` + the 8-digit byte offset of the noun synset in WordNet 3.0's
``data.noun``: ``synset_from_wnid('n02084071')`` is ``dog.n.01`` and ``wnid_of`` is its inverse.
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import nltk
from nltk.corpus.reader.wordnet import WordNetCorpusReader

from wordnet_tools.errors import UnknownWnidError, WordNetNotFound
from isood.core.defaults import ENV_WORDNET_DIR, cache_dir, wordnet_dir_override
from isood.core.errors import BadInputError
from wordnet_tools.wnids import is_wnid

DEBIAN_WORDNET_DIR = Path("/usr/share/wordnet")

#: The 45 standard lexicographer files of WordNet 3.0, in order, with their syntactic category
#: (1 noun, 2 verb, 3 adjective, 4 adverb), as in the ``lexnames`` file of the Princeton distribution.
LEXNAMES: tuple[tuple[str, int], ...] = (
    ("adj.all", 3), ("adj.pert", 3), ("adv.all", 4), ("noun.Tops", 1), ("noun.act", 1), ("noun.animal", 1),
    ("noun.artifact", 1), ("noun.attribute", 1), ("noun.body", 1), ("noun.cognition", 1),
    ("noun.communication", 1), ("noun.event", 1), ("noun.feeling", 1), ("noun.food", 1), ("noun.group", 1),
    ("noun.location", 1), ("noun.motive", 1), ("noun.object", 1), ("noun.person", 1), ("noun.phenomenon", 1),
    ("noun.plant", 1), ("noun.possession", 1), ("noun.process", 1), ("noun.quantity", 1), ("noun.relation", 1),
    ("noun.shape", 1), ("noun.state", 1), ("noun.substance", 1), ("noun.time", 1), ("verb.body", 2),
    ("verb.change", 2), ("verb.cognition", 2), ("verb.communication", 2), ("verb.competition", 2),
    ("verb.consumption", 2), ("verb.contact", 2), ("verb.creation", 2), ("verb.emotion", 2), ("verb.motion", 2),
    ("verb.perception", 2), ("verb.possession", 2), ("verb.social", 2), ("verb.stative", 2),
    ("verb.weather", 2), ("adj.ppl", 3),
)

# Files of a WordNet dict folder that nltk's reader uses; data.noun is the one ImageNet wnids point into.
_REQUIRED_FILES = ("data.noun", "index.noun")
_OPTIONAL_FILES = (
    "data.adj", "data.adv", "data.verb", "index.adj", "index.adv", "index.verb",
    "adj.exc", "adv.exc", "noun.exc", "verb.exc", "cntlist.rev", "index.sense", "lexnames",
)

INSTALL_HINT = (
    "install it with `apt-get install wordnet-base` (Debian/Ubuntu), or `python -m nltk.downloader wordnet`, "
    "or set ISOOD_WORDNET_DIR to a WordNet 3.0 dict folder"
)


@dataclass(frozen=True)
class WordNetSource:
    """Where WordNet was found: ``kind`` is 'env' (ISOOD_WORDNET_DIR), 'nltk' (nltk data) or 'debian'."""

    kind: str
    path: str


class _WordNet30Reader(WordNetCorpusReader):
    """nltk's reader for data that is WordNet 3.0 itself: mapping 3.0 -> nltk's wordnet is the identity."""

    def map_wn(self, version="wordnet"):
        if version in ("wordnet", "3.0"):
            return None  # identity; nltk would otherwise compare index.sense files a raw dict folder lacks
        return super().map_wn(version)


def _is_dict_folder(path: Path) -> bool:
    return all((path / name).is_file() for name in _REQUIRED_FILES)


def _staging_folder() -> Path:
    return cache_dir("nltk_data", "corpora", "wordnet")


def _is_staging_folder(path: str) -> bool:
    """True for the folder this loader stages raw dict folders into (found by nltk once registered)."""
    try:
        return Path(path).resolve() == _staging_folder().resolve()
    except OSError:
        return False


def _find_nltk_wordnet():
    """nltk's own WordNet: a folder, or the zip nltk.downloader installs (found as nltk's LazyCorpusLoader does)."""
    for resource in ("corpora/wordnet", "corpora/wordnet.zip/wordnet/"):
        try:
            return nltk.data.find(resource)
        except LookupError:
            continue
    return None


def find_wordnet_source() -> WordNetSource:
    """Pick the WordNet data to load (see the module docstring); raise WordNetNotFound if there is none."""
    path = wordnet_dir_override()
    if path is not None:
        if not _is_dict_folder(path):
            raise WordNetNotFound(
                f"{ENV_WORDNET_DIR}={path} is not a WordNet 3.0 dict folder (no data.noun/index.noun); "
                f"point it at one, or unset it and {INSTALL_HINT}"
            )
        return WordNetSource("env", str(path.resolve()))
    found = _find_nltk_wordnet()
    if found is not None and not _is_staging_folder(str(found)):
        return WordNetSource("nltk", str(found))
    if _is_dict_folder(DEBIAN_WORDNET_DIR):
        return WordNetSource("debian", str(DEBIAN_WORDNET_DIR))
    raise WordNetNotFound(f"WordNet 3.0 not found; {INSTALL_HINT}")


def _stage_dict_folder(source: Path) -> Path:
    """Copy a raw dict folder (plus a generated ``lexnames``) to ``<cache>/nltk_data/corpora/wordnet``.

    Files are copied, not linked, because nltk refuses to read through links that leave its data roots.
    A file is re-copied when its size or modification time differs from the source's.
    """
    target = _staging_folder()
    data_root = target.parent.parent
    target.mkdir(parents=True, exist_ok=True)
    for name in _REQUIRED_FILES + _OPTIONAL_FILES:
        src = source / name
        dst = target / name
        if not src.is_file():
            continue
        s = src.stat()
        if dst.is_file():
            d = dst.stat()
            if d.st_size == s.st_size and int(d.st_mtime) == int(s.st_mtime):
                continue
        tmp = target / f".{name}.tmp{os.getpid()}"
        shutil.copy2(src, tmp)  # copy2 keeps mtime, so the size+mtime check above sees it as current
        os.replace(tmp, dst)
    lexnames = target / "lexnames"
    if not (source / "lexnames").is_file():
        text = "".join(f"{i:02d}\t{name}\t{cat}\n" for i, (name, cat) in enumerate(LEXNAMES))
        if not lexnames.is_file() or lexnames.read_text() != text:
            tmp = target / f".lexnames.tmp{os.getpid()}"
            tmp.write_text(text)
            os.replace(tmp, lexnames)
    # A file left from an earlier source (e.g. index.sense) would be read as part of this one: remove it.
    for name in _OPTIONAL_FILES:
        if name != "lexnames" and (target / name).is_file() and not (source / name).is_file():
            (target / name).unlink()
    if str(data_root) not in nltk.data.path:
        nltk.data.path.append(str(data_root))
    return target


@lru_cache(maxsize=None)
def _load(kind: str, path: str) -> WordNetCorpusReader:
    # nltk's own data may be a zip (corpora/wordnet.zip): hand the reader nltk's path pointer for it.
    root = _find_nltk_wordnet() if kind == "nltk" else str(_stage_dict_folder(Path(path)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "multilingual functions are not available": no OMW reader, by design
        try:
            reader = _WordNet30Reader(root, None)
            version = reader.get_version()
        except (OSError, LookupError, ValueError, AssertionError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise WordNetNotFound(
                f"cannot read WordNet at {path} ({type(exc).__name__}: {reason}); {INSTALL_HINT}"
            ) from exc
    if version != "3.0":
        raise WordNetNotFound(
            f"WordNet at {path} is version {version}, but ImageNet wnids are WordNet 3.0 offsets; {INSTALL_HINT}"
        )
    return reader


def load_wordnet() -> WordNetCorpusReader:
    """The WordNet 3.0 reader, loaded once per process and data source (~2 s the first time)."""
    source = find_wordnet_source()
    return _load(source.kind, source.path)


def synset_from_wnid(wnid: str, wordnet: WordNetCorpusReader | None = None):
    """The noun synset of an ImageNet wnid; UnknownWnidError if malformed or not in WordNet 3.0."""
    if not is_wnid(wnid):
        raise UnknownWnidError(f"not a wnid: {wnid!r} (expected 'n' followed by 8 digits, e.g. n02084071)", wnid)
    wn = wordnet if wordnet is not None else load_wordnet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nltk warns and returns None for an offset that starts no synset
        try:
            synset = wn.synset_from_pos_and_offset("n", int(wnid[1:]))
        except (ValueError, AssertionError, nltk.corpus.reader.wordnet.WordNetError):
            synset = None
    if synset is None:
        raise UnknownWnidError(f"unknown wnid {wnid}: no WordNet 3.0 noun synset at offset {wnid[1:]}", wnid)
    return synset


def wnid_of(synset) -> str:
    """The ImageNet wnid of a noun synset: 'n' + its 8-digit WordNet 3.0 offset."""
    if synset.pos() != "n":
        raise BadInputError(f"{synset.name()} is not a noun synset; only nouns have ImageNet wnids")
    return f"n{synset.offset():08d}"
