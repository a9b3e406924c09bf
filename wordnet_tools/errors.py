"""Errors raised by wordnet_tools; each is an IsoodError, so the CLI prints it as one line and exits 2."""

from isood.core.errors import IsoodError


class WordNetNotFound(IsoodError):
    """No usable WordNet 3.0 data was found (or the data found is not WordNet 3.0)."""


class UnknownWnidError(IsoodError):
    """A wnid is malformed (not 'n' + 8 digits) or names no noun synset of WordNet 3.0."""

    def __init__(self, message: str, wnid: str = ""):
        super().__init__(message)
        self.wnid = wnid


class ClassListError(IsoodError, ValueError):
    """A class list (synset list file, dataset root, list of image paths) cannot be read as wnids."""
