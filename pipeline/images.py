"""Check that bytes hold a whole image, and make the few odd ones into plain RGB JPEGs.

Real ImageNet train holds CMYK JPEGs, one-channel JPEGs, a PNG named ``.JPEG``, and crawls also leave
truncated and empty files. The stored column promises one thing to every reader (petastorm's
``CompressedImageCodec``, ``tf.io.decode_jpeg``/``decode_and_crop_jpeg``, Pillow, Spark UDFs):
*a 3-channel JPEG*. So:

* a three-channel (YCbCr or RGB) JPEG is kept byte for byte — the normal case, no quality lost;
* any other decodable image (CMYK/YCCK or grayscale JPEG, PNG, GIF, ...) is converted to RGB and
  re-encoded once as JPEG at quality 95, and reported as re-encoded. Grayscale is re-encoded too
  because OpenCV (petastorm's decoder) would hand back a 2-D array, and PNG because
  ``decode_and_crop_jpeg`` refuses it;
* anything that does not decode completely raises `UndecodableImage`; the converter skips it and
  lists it in its report.

Completeness is checked by letting libjpeg read every entropy-coded byte (Pillow raises on a file
cut short, even by one byte); for JPEGs this runs at 1/8 DCT scale, which skips most of the pixel
work but none of the reading.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image
from pinstorm.errors import PinstormError

REENCODE_QUALITY = 95
_JPEG_FORMATS = {"JPEG", "MPO"}  # MPO: a JPEG with extra pictures appended; its first is the image


class UndecodableImage(PinstormError, ValueError):
    """Bytes that are empty, not an image, or an image cut short."""


@dataclass(frozen=True)
class CheckedImage:
    data: bytes            # what to store: the original bytes, or a re-encoded JPEG
    width: int
    height: int
    original_format: str   # as Pillow names it: JPEG, PNG, ...
    original_mode: str     # RGB, L, CMYK, ...
    reencoded: bool


def check_image(data: bytes, *, name: str = "image") -> CheckedImage:
    """Return the bytes to store for one image file, or raise `UndecodableImage` saying why."""
    if not data:
        raise UndecodableImage(f"{name}: empty file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            original_format, original_mode, size = image.format or "?", image.mode, image.size
            if original_format in _JPEG_FORMATS and original_mode == "RGB":
                image.draft("RGB", (max(1, size[0] // 8), max(1, size[1] // 8)))
                image.load()
                return CheckedImage(data, size[0], size[1], "JPEG", original_mode, False)
            image.load()
            return _reencode(image, original_format, original_mode)
    except UndecodableImage:
        raise
    except Exception as error:  # Pillow raises OSError, SyntaxError, ValueError... for broken files
        reason = str(error) or type(error).__name__
        raise UndecodableImage(f"{name}: {reason}") from None


def _reencode(image: Image.Image, original_format: str, original_mode: str) -> CheckedImage:
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        # Composite on white, as a browser shows a transparent image on a page, rather than on black.
        rgba = image.convert("RGBA")
        rgb = Image.new("RGB", rgba.size, (255, 255, 255))
        rgb.paste(rgba, mask=rgba.getchannel("A"))
    else:
        rgb = image.convert("RGB")
    buffer = io.BytesIO()
    rgb.save(buffer, "JPEG", quality=REENCODE_QUALITY)
    return CheckedImage(buffer.getvalue(), rgb.width, rgb.height, original_format, original_mode, True)


def decode_rgb(data: bytes):
    """Decode stored bytes to an RGB uint8 array with Pillow (for contact sheets and tests)."""
    import numpy as np

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
