"""Tiny seeded models and data for the evaluation tests (CPU, a few ms each). The evaluation test modules run on
one thread (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""

import pytest
import torch
from torch import nn

N_CLASSES = 5


@pytest.fixture
def one_thread():
    """Tiny tensors run fastest on one thread (and the 2 shared cores stay free); restored afterwards."""
    import faiss

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    yield
    torch.set_num_threads(before)
    faiss.omp_set_num_threads(before)


class TinyBackbone(nn.Module):
    """8x8 RGB -> 16 x 4 x 4 feature map (conv, ReLU, strided conv, ReLU)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                                  nn.ReLU())

    def forward(self, x):
        return self.body(x)


def make_tiny(seed: int = 0):
    torch.manual_seed(seed)
    backbone, fc = TinyBackbone().eval(), nn.Linear(16, N_CLASSES).eval()
    return backbone, fc


def make_images(n: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g) + shift


@pytest.fixture()
def tiny():
    return make_tiny(0)


@pytest.fixture()
def tiny_data():
    """(train images, train labels, test images, ood images)."""
    g = torch.Generator().manual_seed(1)
    train = make_images(120, 2)
    labels = torch.randint(0, N_CLASSES, (120,), generator=g)
    return train, labels, make_images(40, 3), make_images(30, 4, shift=1.5)


def direct_outputs(backbone, fc, x):
    """Every kind computed directly with torch (the reference the detectors are tested against)."""
    from isood.science.detectors import ForwardOutputs

    with torch.no_grad():
        fmap = backbone(x)
        feats = fmap.mean(dim=(2, 3))
        logits = fc(feats)
    return ForwardOutputs(logits=logits.numpy(), features=feats.numpy(), feature_maps=fmap.numpy(),
                          fc_weight=fc.weight.detach().numpy(), fc_bias=fc.bias.detach().numpy())


@pytest.fixture()
def tiny_outputs(tiny, tiny_data):
    backbone, fc = tiny
    train, labels, test, ood = tiny_data
    return (direct_outputs(backbone, fc, train), labels.numpy(), direct_outputs(backbone, fc, test),
            direct_outputs(backbone, fc, ood))


@pytest.fixture()
def direct():
    """The ``direct_outputs(backbone, fc, x)`` reference function."""
    return direct_outputs


@pytest.fixture()
def tiny_factory():
    """``make_tiny(seed) -> (backbone, fc)`` and ``make_images(n, seed, shift)``."""
    return make_tiny, make_images
