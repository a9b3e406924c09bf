"""wordnet_tools.wnids: the one rule for the ImageNet class an image path names."""

import pytest

from wordnet_tools.wnids import is_wnid, wnid_from_path


@pytest.mark.parametrize("path,wnid", [
    ("places/abbey/x.jpg", None),  # folders that are not wnids name no ImageNet class
    ("x/n01440764", "n01440764"),  # a path ending in a wnid is that wnid (a class entry)
    ("n01440764", "n01440764"),
    ("n01440764/", "n01440764"),
    ("n01440764/n01440764_1.JPEG", "n01440764"),
    ("val/n01440764_10026.JPEG", "n01440764"),  # ImageNet's own file naming
    ("n01440764_10026.JPEG", "n01440764"),
    ("n01440764/n02084071_1.JPEG", "n01440764"),  # the folder wins over the file name
    ("a/n01440764/b/c/x.JPEG", "n01440764"),  # the nearest wnid folder
    ("n02084071/n01440764/x.JPEG", "n01440764"),
    ("train\\n01440764\\x.JPEG", "n01440764"),  # Windows separators
    ("C:\\imgs\\n03251766\\a.jpg", "n03251766"),
    ("", None),
    ("/", None),
    ("ILSVRC2012_val_00000293.JPEG", None),
    ("n0144076/x.jpg", None),  # 7 digits: not a wnid
    ("n014407640/x.jpg", None),  # 9 digits
    ("N01440764/x.jpg", None),  # wnids are lower-case 'n'
    ("n01440764x/y.jpg", None),
    ("n01440764.JPEG", None),  # a file name needs the '_' of ImageNet's naming
])
def test_wnid_from_path(path, wnid):
    assert wnid_from_path(path) == wnid


@pytest.mark.parametrize("text,ok", [("n01440764", True), ("n0144076", False), ("n014407641", False),
                                     ("x01440764", False), (" n01440764", False), (None, False), (1440764, False)])
def test_is_wnid(text, ok):
    assert is_wnid(text) is ok
