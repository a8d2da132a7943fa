"""Shape rules both frameworks' models follow (framework-free, so the Keras and torch AlexNets agree)."""

from __future__ import annotations


def alexnet_stem(side: int) -> tuple[int, int] | None:
    """(kernel, stride) of AlexNet's first convolution: the paper's 11/4 at ImageNet sizes, gentler
    below. Three 3x3/2 poolings follow, so the stem keeps at least ~3 pixels for the last one; None
    for inputs too small for that (under 24 pixels)."""
    if side >= 128:
        return 11, 4
    if side >= 64:
        return 7, 2
    if side >= 24:
        return 5, 1
    return None
