"""The data an evaluation pass reads: ``ImageList`` (the torch dataset of image files ``isood evaluate`` feeds the
model), the DataLoader over any dataset, and the unreadable-image policy.

An unreadable image does not stop a pass at once: the pass reads on (without the model) and ends with one
``UnreadableImagesError`` naming every unreadable image of the dataset (``scan_unreadable`` reads another dataset
the same way, so a run names them all).

``--decode reference`` (the default) decodes every pixel with PIL and runs the classifier's own transform, as
OpenOOD does. ``--decode fast`` and ``--decode gpu`` go through the one batch decode pipeline of
``isood.features.batch_decode`` (the one ``isood extract`` runs): each item is the CPU part of its file
(``ImageDecoder.prepare``, in the DataLoader's worker processes), and ``ImageList.finish`` runs the device part
where the model is (``ImageDecoder.finish``: for ``gpu`` the JPEGs decoded in one batched call on the model's
device, every other file and a JPEG the device refuses by the reference path).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from isood.core.errors import BadInputError, IsoodError
from isood.core.progress import track
from isood.features.batch_decode import PreparedImages, image_decoder
from isood.features.decoding import EVALUATE_DECODE_MODES, REFERENCE_DECODE, check_decode_mode, read_rgb

__all__ = ["as_loader", "split_batch", "ImageList", "PendingImage", "Unreadable", "UnreadableImagesError",
           "worker_message", "scan_unreadable", "probe_input", "default_transform"]


def as_loader(data, batch_size: int, num_workers: int) -> torch.utils.data.DataLoader:
    """A DataLoader over ``data`` (a Dataset, a DataLoader as is, or an (N, C, H, W) tensor / array), its
    ``num_workers`` the decoding processes (``isood.core.workers.WorkerSpec.decode_processes``); a dataset with its
    own ``collate`` (``ImageList``) batches with it."""
    if isinstance(data, torch.utils.data.DataLoader):
        return data
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    if isinstance(data, torch.Tensor):
        data = torch.utils.data.TensorDataset(data)
    return torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                                       collate_fn=getattr(data, "collate", None))


def split_batch(batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(images, labels or None) from a batch that is a tensor, a (image, label, ...) sequence or a dict."""
    if isinstance(batch, torch.Tensor):
        return batch, None
    if isinstance(batch, Mapping):
        for k in ("image", "pixel_values", "img", "input"):
            if k in batch:
                y = batch.get("label", batch.get("labels"))
                return batch[k], (torch.as_tensor(y) if y is not None else None)
        raise BadInputError(f"batch dict has no image key (image / pixel_values): got {sorted(batch)}")
    if isinstance(batch, (list, tuple)) and batch:
        y = batch[1] if len(batch) > 1 and isinstance(batch[1], torch.Tensor) else None
        return batch[0], y
    raise BadInputError(f"cannot read images from a batch of type {type(batch).__name__}: yield tensors or "
                        "(image, label) pairs")


class Unreadable(NamedTuple):
    """An image that could not be read: its path and ``'<ExceptionType>'``."""

    path: str
    error: str


class UnreadableImagesError(BadInputError):
    """Images of an evaluation could not be read (every image must be scored). One line: the image and its error
    for one; for several their count, the first ``SHOWN`` and the file listing them all (``list_file``)."""

    SHOWN = 3

    def __init__(self, images: Sequence[Unreadable], list_file: str | os.PathLike | None = None) -> None:
        self.images = list(dict.fromkeys(images))
        n = len(self.images)
        if n == 1:
            text = f"cannot read image {self.images[0].path}: {self.images[0].error}: remove or replace it"
        else:
            shown = ", ".join(f"{u.path} ({u.error})" for u in self.images[:self.SHOWN])
            where = f"; all {n} listed in {list_file}" if list_file and n > self.SHOWN else ""
            more = ", ..." if n > self.SHOWN else ""
            text = f"cannot read images: {n} are unreadable ({shown}{more}{where}): remove or replace them"
        super().__init__(text)


class PendingImage(NamedTuple):
    """An ``ImageList`` item in the ``fast`` / ``gpu`` modes: the CPU part of decoding its file
    (``isood.features.batch_decode.PreparedImages`` of one image) and its path; ``ImageList.finish`` ends it."""

    part: PreparedImages
    path: str


class ImageList(torch.utils.data.Dataset):
    """A torch dataset of image files: ``(transform(RGB image), label)``, decoded as
    ``isood.features.decoding.read_rgb`` decodes them (a decompression bomb refused from its header, 16-bit images
    scaled to 8 bits); an unreadable file yields ``(Unreadable(path, error), label)`` and ``collate`` sets it apart
    (batches are dicts: ``image``, ``label``, ``unreadable``), so that a pass names every unreadable image
    (``isood.classifiers.capture.extract_outputs``).

    ``decode='fast'`` or ``'gpu'`` (``isood.features.decoding.EVALUATE_DECODE_MODES``): the batch decode pipeline
    of ``isood extract`` (``isood.features.batch_decode.image_decoder`` of the transform, as ``decoder``); an item
    is a ``PendingImage``, ``collate`` keeps a batch's parts (``pending``, ``path``, ``label``) and ``finish``
    decodes them where the model is (a transform the tensor steps do not know: every file the reference way)."""

    def __init__(self, files: Sequence[Path], labels: Sequence[int] | np.ndarray, transform: Callable,
                 decode: str = REFERENCE_DECODE) -> None:
        self.files = [Path(f) for f in files]
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.decode = check_decode_mode(decode, EVALUATE_DECODE_MODES)
        self.decoder = image_decoder(transform, decode) if self.decode != REFERENCE_DECODE else None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from PIL import Image

        path, label = str(self.files[i]), int(self.labels[i])
        if self.decoder is not None:  # the CPU part only; an unreadable file's error is in the part
            return PendingImage(self.decoder.prepare([path], [path]), path), label
        try:
            with warnings.catch_warnings():  # read_rgb refuses what PIL only warns about
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img = read_rgb(self.files[i])
        except Exception as e:  # missing, truncated, not an image, a bomb, a decoder's ValueError
            return Unreadable(path, type(e).__name__), label
        return self.transform(img), label

    @staticmethod
    def collate(items: Sequence[tuple]) -> dict:
        """A batch of ``__getitem__`` items: the readable images stacked (None when there is none) with their
        labels, and the ``Unreadable`` ones; ``PendingImage`` items (``fast`` / ``gpu``) kept as parts for
        ``finish``."""
        if items and isinstance(items[0][0], PendingImage):
            return {"pending": [x.part for x, _ in items], "path": [x.path for x, _ in items],
                    "label": torch.as_tensor([y for _, y in items], dtype=torch.int64), "unreadable": []}
        good = [(x, y) for x, y in items if not isinstance(x, Unreadable)]
        return {"image": torch.stack([x for x, _ in good]) if good else None,
                "label": torch.as_tensor([y for _, y in good], dtype=torch.int64),
                "unreadable": [x for x, _ in items if isinstance(x, Unreadable)]}

    def finish(self, batch: dict, device) -> dict:
        """A batch of parts (``fast`` / ``gpu``) decoded to the model's inputs on ``device``
        (``isood.features.batch_decode.ImageDecoder.finish``), an unreadable image named ``Unreadable``; other
        batches as they are."""
        if "pending" not in batch:
            return batch
        assert self.decoder is not None, "collate keeps parts only for a decoder mode"
        paths = batch["path"]
        got = self.decoder.finish(batch["pending"], paths, device)
        unreadable = [Unreadable(paths[p], error.split(":", 1)[0]) for p, error in enumerate(got.errors) if error]
        return {"image": got.tensor, "label": batch["label"][got.ok], "unreadable": unreadable}


def worker_message(error: BaseException) -> str:
    """The one-line message of an error a DataLoader worker raised: torch re-raises it with the worker's whole
    traceback in the message ('Caught X in DataLoader worker process 0. Original Traceback ...'); its last line
    carries the original message."""
    text = str(error)
    if "Original Traceback" not in text:
        return text
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1]
    head, sep, tail = last.partition(": ")
    return tail if sep and " " not in head else last


def scan_unreadable(data, *, batch_size: int = 64, num_workers: int = 0, desc: str = "reading",
                    progress: bool = False) -> list[Unreadable]:
    """Read every image of ``data`` (no model) and return the unreadable ones (only datasets whose batches
    carry ``unreadable``, i.e. ``ImageList``, can have any)."""
    found: list[Unreadable] = []
    if not hasattr(data, "collate"):
        return found
    loader = as_loader(data, batch_size, num_workers)
    try:
        for batch in track(loader, len(loader), desc, progress):
            if "pending" in batch:  # --decode fast / gpu: the device part, on the CPU here
                batch = data.finish(batch, "cpu")
            found += batch["unreadable"]
    except IsoodError as e:  # raised in a DataLoader worker: one line, not the worker's traceback
        raise type(e)(worker_message(e)) from None
    return found


def probe_input(data, tries: int = 16) -> torch.Tensor | None:
    """One image of ``data`` as a (1, C, H, W) batch, to check a model before a pass: its first readable item
    among the first ``tries`` (None when there is none)."""
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    if isinstance(data, torch.Tensor):
        return data[:1] if len(data) else None
    if isinstance(data, torch.utils.data.DataLoader):
        for batch in data:
            x, _ = split_batch(batch)
            return x[:1] if x is not None and len(x) else None
        return None
    for i in range(min(len(data), tries)):
        x, _ = split_batch(data[i])
        if isinstance(x, torch.Tensor):
            return x.unsqueeze(0)
    return None


def default_transform() -> Callable:
    """ImageNet preprocessing (resize 256, centre crop 224, normalise) for models without their own."""
    from torchvision import transforms as T

    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                      T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
