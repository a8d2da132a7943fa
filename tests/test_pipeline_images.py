"""Bytes that must become a 3-channel JPEG, stay byte-identical, or be refused with a reason."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pinstorm.pipeline import UndecodableImage, check_image, imagenet_size_jpegs

COLOURS = [(230, 30, 30), (30, 200, 40), (20, 40, 220)]


def _stripes() -> Image.Image:
    pixels = np.zeros((48, 72, 3), np.uint8)
    for i, colour in enumerate(COLOURS):
        pixels[:, 24 * i:24 * (i + 1)] = colour
    return Image.fromarray(pixels)


def _encode(image: Image.Image, fmt: str, **kw) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kw)
    return buffer.getvalue()


def _rgb(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    assert (image.format, image.mode) == ("JPEG", "RGB")
    return np.asarray(image).astype(int)


def test_rgb_jpeg_is_kept_byte_for_byte():
    data = next(imagenet_size_jpegs(1))
    checked = check_image(data)
    assert checked.data is data and not checked.reencoded
    assert (checked.width, checked.height) == Image.open(io.BytesIO(data)).size


@pytest.mark.parametrize("mode, fmt", [("CMYK", "JPEG"), ("L", "JPEG"), ("RGB", "PNG"), ("RGBA", "PNG"),
                                       ("P", "GIF"), ("RGB", "BMP")])
def test_other_images_become_rgb_jpegs_with_their_colours(mode, fmt):
    original = _stripes()
    source = original.quantize(colors=8) if mode == "P" else original.convert(mode)  # exact palette
    data = _encode(source, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    checked = check_image(data)
    assert checked.reencoded and checked.original_mode == mode and checked.original_format == fmt
    pixels = _rgb(checked.data)
    centres = [pixels[24, 12 + 24 * i] for i in range(3)]
    if mode == "L":
        assert all(len(set(c)) == 1 for c in centres)  # gray stays gray, in three channels
        expected = [np.asarray(original.convert("L"))[24, 12 + 24 * i] for i in range(3)]
        assert np.abs(np.array([c[0] for c in centres]) - expected).max() <= 6
    else:
        assert np.abs(np.array(centres) - np.array(COLOURS)).max() <= 12, centres


def test_transparent_png_is_composited_on_white():
    image = Image.new("RGBA", (20, 20), (0, 0, 0, 0))
    pixels = _rgb(check_image(_encode(image, "PNG")).data)
    assert pixels.min() >= 240


def test_truncated_empty_and_garbage_bytes_are_refused_with_a_reason():
    data = next(imagenet_size_jpegs(1, seed=2))
    for cut in (len(data) - 1, len(data) - 50, len(data) // 2, 700, 100, 3):
        with pytest.raises(UndecodableImage, match="truncated|Truncated|broken"):
            check_image(data[:cut], name="cut.JPEG")
    with pytest.raises(UndecodableImage, match="x.JPEG: empty file"):
        check_image(b"", name="x.JPEG")
    with pytest.raises(UndecodableImage, match=r"^page.html: not an image \(first bytes: b'<html>404 not fo'\)$"):
        check_image(b"<html>404 not found</html>", name="page.html")
    png = _encode(_stripes(), "PNG")
    with pytest.raises(UndecodableImage):
        check_image(png[: len(png) // 2])
