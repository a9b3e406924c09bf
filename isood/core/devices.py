"""Devices and CPU threads: which device a run uses (``resolve_device``: ``auto`` -> CUDA when there is a
GPU), torch's thread cap for tiny tensors (``thread_limit``) and the precisions of forward passes. torch is
imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib

from isood.core.errors import BadInputError

__all__ = ["explicit_device", "resolve_device", "torch_device", "thread_limit", "PRECISIONS",
           "DEFAULT_PRECISION"]

#: ``--precision`` of a model's forward passes: float32 (the default: OpenOOD's numbers), or under autocast to
#: float16 (CUDA only) or bfloat16, the model and its inputs channels-last (``isood.classifiers.capture``).
PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_PRECISION = "fp32"


def explicit_device(device: str | None) -> str | None:
    """``device`` as given, or ``None`` when it asks for the default (``None``, ``''`` or ``'auto'``)."""
    return None if device in (None, "", "auto") else str(device)


def resolve_device(device: str | None) -> str:
    """``None``/``''``/``'auto'`` -> ``'cuda'`` when a GPU is present else ``'cpu'``; ``'cpu'``, ``'cuda'``,
    ``'cuda:N'`` are checked against the machine. A one-line error names what to pass instead."""
    import torch

    if explicit_device(device) is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    text = str(device)
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise BadInputError(f"unknown device {text!r}; pass cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError(f"device {text!r} requested but CUDA is not available; pass --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BadInputError(f"device {text!r}: only {torch.cuda.device_count()} GPU(s); pass --device cuda:0 "
                                "or --device cpu")
    elif dev.type != "cpu":
        raise BadInputError(f"unsupported device {text!r}; pass cpu, cuda, cuda:N or auto")
    return text


def torch_device(device: str | None):
    """``resolve_device`` as a ``torch.device``."""
    import torch

    return torch.device(resolve_device(device))


@contextlib.contextmanager
def thread_limit(n: int):
    """Cap torch's CPU threads inside the block (tiny tensors run fastest on one); restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)
