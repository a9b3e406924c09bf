"""Errors that users see as one clear line (the CLI prints the message and exits 2)."""


class IsoodError(Exception):
    """A problem with the user's input or environment, described in one line with what to do instead."""


class MissingWeightsError(IsoodError):
    """Model weights could not be loaded (offline, or not in the local cache)."""


class ManifestError(IsoodError):
    """A manifest is malformed, of an unknown schema version, or fails verification."""
