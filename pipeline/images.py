"""Check that bytes hold a whole image, and make the few odd ones into plain RGB JPEGs a reader sees right.

Real ImageNet train holds CMYK JPEGs, one-channel JPEGs, a PNG named ``.JPEG``, and crawls also leave
truncated and empty files, 16-bit scans, phone photos with an EXIF orientation and giant images. The
stored column promises one thing to every reader (petastorm's ``CompressedImageCodec``,
``tf.io.decode_jpeg``/``decode_and_crop_jpeg``, Pillow, Spark UDFs): *a 3-channel JPEG whose pixels
are the ones a careful viewer shows*. So:

* a three-channel (YCbCr or RGB) JPEG without a rotating EXIF orientation, within the pixel budget,
  is kept byte for byte — the normal case, no quality lost;
* any other decodable image is converted to RGB and re-encoded once as JPEG at quality 95, and
  reported as re-encoded with the reason: CMYK/YCCK or grayscale JPEG, PNG, GIF, ... (grayscale
  because OpenCV, petastorm's decoder, would hand back a 2-D array; PNG because
  ``decode_and_crop_jpeg`` refuses it); an EXIF orientation other than 1 (applied, so
  ``tf.io.decode_jpeg``, which ignores EXIF, sees what a browser shows); high bit depth (16-bit
  ``I;16`` PNGs, mode ``I``/``F`` TIFFs: *scaled* to 8 bits, never clipped); transparency
  (composited on white);
* an image over `max_pixels` is a JPEG decoded at a reduced DCT scale (Pillow ``draft``: the full
  image is never in memory) and re-encoded, or any other format skipped — decoding a 12000x12000
  PNG takes ~1.1 GB;
* with `max_side` (off by default), an image whose longer side exceeds it is downscaled once
  (JPEGs first at a reduced DCT scale with Pillow ``draft``, then bicubic (antialiased) to the exact size) and
  stored as a JPEG at `quality`: readers then decode far fewer pixels per epoch;
* anything that does not decode completely raises `UndecodableImage`; the converter skips it and
  lists it in its report.

Completeness is checked by letting libjpeg read every entropy-coded byte (Pillow raises on a file
cut short, even by one byte); for JPEGs this runs at 1/8 DCT scale, which skips most of the pixel
work but none of the reading.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from dataclasses import dataclass

from PIL import Image, ImageOps

from .errors import InvalidPipelineInput, PipelineError


REENCODE_QUALITY = 95
DOWNSCALE_QUALITY = 90            # `max_side` re-encodes: what FFCV stores ImageNet at
DEFAULT_MAX_PIXELS = 40_000_000   # 40 MP: above every ILSVRC image; ~0.5 GB at most to decode and convert
_JPEG_FORMATS = {"JPEG", "MPO"}  # MPO: a JPEG with extra pictures appended; its first is the image
_ORIENTATION = 0x0112
_HIGH_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
# Bytes per pixel Pillow holds while an image is decoded and converted (decode + RGB copy + headroom).
_BYTES_PER_PIXEL = 12


class UndecodableImage(PipelineError, ValueError):
    """Bytes that are empty, not an image, an image cut short, or one too large to decode."""


@dataclass(frozen=True)
class CheckedImage:
    data: bytes            # what to store: the original bytes, or a re-encoded JPEG
    width: int
    height: int
    original_format: str   # as Pillow names it: JPEG, PNG, ...
    original_mode: str     # RGB, L, CMYK, I;16, ...
    reencoded: bool
    reason: str = ""       # why it was re-encoded: "mode CMYK", "format PNG", "EXIF orientation 6", ...
    resized: bool = False      # scaled down to max_side (what `convert --max-side` reports)
    reoriented: bool = False   # turned upright by its EXIF orientation


@dataclass(frozen=True)
class ImageHeader:
    """What the header says, before any pixel is decoded: enough to budget memory."""

    format: str
    mode: str
    width: int
    height: int
    orientation: int = 1   # EXIF orientation (JPEG): other than 1 means a full decode to rotate it

    @property
    def pixels(self) -> int:
        return self.width * self.height


_SIGNATURES = {b"\xff\xd8\xff": "JPEG", b"\x89PNG": "PNG", b"GIF8": "GIF", b"II*\x00": "TIFF", b"MM\x00*": "TIFF",
               b"BM": "BMP", b"RIFF": "WebP"}


def _not_an_image(data: bytes) -> str:
    """Why Pillow could not identify `data` (its first bytes at least): a cut-off or broken header of a
    known format, or not an image at all."""
    for magic, fmt in _SIGNATURES.items():
        if data.startswith(magic):
            return f"truncated or broken {fmt} header (first bytes: {data[:16]!r})"
    return f"not an image (first bytes: {data[:16]!r})"


def read_header(data_or_file, *, name: str = "image") -> ImageHeader:
    """Format, mode and size from the header alone (no pixels decoded), or `UndecodableImage`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            source = io.BytesIO(data_or_file) if isinstance(data_or_file, (bytes, bytearray)) else data_or_file
            with Image.open(source) as image:
                orientation = _orientation(image) if image.format in _JPEG_FORMATS else 1
                return ImageHeader(image.format or "?", image.mode, image.size[0], image.size[1], orientation)
    except Image.UnidentifiedImageError:
        if isinstance(data_or_file, (bytes, bytearray)):
            first = bytes(data_or_file[:16])
        else:
            data_or_file.seek(0)
            first = data_or_file.read(16)
        raise UndecodableImage(f"{name}: {_not_an_image(first)}") from None
    except Exception as error:
        raise UndecodableImage(f"{name}: {error or type(error).__name__}") from None


def decode_cost(header: ImageHeader, max_pixels: int | None = DEFAULT_MAX_PIXELS, max_side: int | None = None) -> int:
    """Bytes of memory checking this image may take (for the converter's global budget)."""
    pixels = header.pixels
    if header.format in _JPEG_FORMATS:
        if max_side and max(header.width, header.height) > max_side:
            target = _fit_side(header.width, header.height, max_side)
            if max_pixels and pixels > max_pixels:
                target = min(target, _fit_pixels(header.width, header.height, max_pixels))
            pixels //= _pillow_draft_factor((header.width, header.height), target) ** 2
        elif max_pixels and pixels > max_pixels:
            pixels //= _draft_factor(header.width, header.height, max_pixels) ** 2
        elif header.mode == "RGB" and header.orientation == 1:
            pixels = max(pixels // 64, 1)   # the 1/8-scale check; a rotation or another mode decodes in full
    elif max_pixels and pixels > max_pixels:
        return 0   # refused from its header
    return pixels * _BYTES_PER_PIXEL


def _draft_factor(width: int, height: int, max_pixels: int) -> int:
    """The smallest JPEG DCT reduction (1, 2, 4, 8) that brings the image within `max_pixels`."""
    for factor in (1, 2, 4, 8):
        if math.ceil(width / factor) * math.ceil(height / factor) <= max_pixels:
            return factor
    return 8


def _fit_side(width: int, height: int, max_side: int) -> tuple[int, int]:
    """(width, height) scaled so that the longer side is `max_side` (aspect kept, each side >= 1)."""
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _fit_pixels(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    scale = math.sqrt(max_pixels / (width * height))
    return max(1, int(width * scale)), max(1, int(height * scale))


def _pillow_draft_factor(size: tuple[int, int], requested: tuple[int, int]) -> int:
    """The DCT reduction Pillow's ``draft`` picks for `requested`: the largest of 8, 4, 2, 1 that keeps
    the image at least that large (mirrors ``JpegImageFile.draft``)."""
    scale = min(size[0] // max(1, requested[0]), size[1] // max(1, requested[1]))
    return next(f for f in (8, 4, 2, 1) if f <= max(scale, 1))


def _orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(_ORIENTATION, 1) or 1)
    except Exception:   # a broken EXIF block is no reason to refuse the image
        return 1


def check_image(data: bytes, *, name: str = "image", max_pixels: int | None = DEFAULT_MAX_PIXELS,
                max_side: int | None = None, quality: int = DOWNSCALE_QUALITY, hold=None) -> CheckedImage:
    """Return the bytes to store for one image file, or raise `UndecodableImage` saying why.

    `max_pixels` (width x height, None: no limit): larger JPEGs are decoded at a reduced scale and
    re-encoded, larger images of other formats refused ("too large").
    `max_side` (None: off): an image whose longer side exceeds it is downscaled to it and stored as a
    JPEG at `quality` (reason "downscaled ... (max_side N)"); smaller ones are treated as without it.
    `hold(cost)`: a context manager entered with `decode_cost` (from the header just parsed) before any
    pixel is decoded, and left after (the converter's memory budget; one header parse, not two).

    Args:
        data: The image file's bytes.
        name: The file's name, for messages.
        max_pixels: Width x height above which JPEGs are decoded at a reduced scale and re-encoded, and
            other formats refused (None: no limit).
        max_side: Downscale an image whose longer side exceeds it (None: off).
        quality: The JPEG quality of re-encoded or downscaled images.
        hold: A function ``hold(cost)`` returning a context manager held while pixels are decoded (None: none).

    Returns:
        A ``CheckedImage``: the bytes to store, the size, and why they were re-encoded (if they were).

    Raises:
        UndecodableImage: The bytes are not an image that decodes to RGB, or it is too large.
    """
    if max_side is not None and max_side < 1:
        raise InvalidPipelineInput(f"max_side must be None or positive, got {max_side!r}")
    if not 1 <= quality <= 100:
        raise InvalidPipelineInput(f"quality must be 1..100, got {quality!r}")
    if not data:
        raise UndecodableImage(f"{name}: empty file")
    try:
        with warnings.catch_warnings(), contextlib.ExitStack() as budget:
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            try:
                image = Image.open(io.BytesIO(data))
            except Image.UnidentifiedImageError:
                raise UndecodableImage(f"{name}: {_not_an_image(data)}") from None
            fmt, mode, (width, height) = image.format or "?", image.mode, image.size
            orientation = _orientation(image) if fmt in _JPEG_FORMATS else 1
            if hold is not None:
                header = ImageHeader(fmt, mode, width, height, orientation)
                budget.enter_context(hold(decode_cost(header, max_pixels, max_side)))
            over = bool(max_pixels) and width * height > max_pixels
            shrink = bool(max_side) and max(width, height) > max_side
            if shrink and (fmt in _JPEG_FORMATS or not over):
                target = _fit_side(width, height, max_side)
                if over:
                    target = min(target, _fit_pixels(width, height, max_pixels))
                if fmt in _JPEG_FORMATS:
                    image.draft("RGB", target)   # DCT-domain reduction first: fewer pixels decoded
                image.load()
                return _reencode(image, fmt, mode, f"downscaled from {width}x{height} (max_side {max_side})",
                                 size=target, quality=quality)
            if fmt in _JPEG_FORMATS:
                if over:
                    factor = _draft_factor(width, height, max_pixels)
                    image.draft("RGB", (math.ceil(width / factor), math.ceil(height / factor)))
                    image.load()
                    return _reencode(image, fmt, mode, f"downscaled from {width}x{height} (max_pixels "
                                                       f"{max_pixels})", max_pixels=max_pixels)
                if mode == "RGB" and orientation == 1:
                    image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
                    image.load()
                    return CheckedImage(data, width, height, "JPEG", mode, False)
                image.load()
                reason = f"EXIF orientation {orientation}" if orientation != 1 else f"mode {mode}"
                return _reencode(image, fmt, mode, reason)
            if over:
                raise UndecodableImage(f"{name}: too large: {width}x{height} = {width * height / 1e6:.1f} MP, "
                                       f"over max_pixels {max_pixels / 1e6:.1f} MP")
            image.load()
            return _reencode(image, fmt, mode, f"format {fmt}" + (f", mode {mode}" if mode != "RGB" else ""))
    except UndecodableImage:
        raise
    except Exception as error:  # Pillow raises OSError, SyntaxError, ValueError... for broken files
        reason = str(error) or type(error).__name__
        raise UndecodableImage(f"{name}: {reason}") from None


def _to_8bit(image: Image.Image) -> Image.Image:
    """A one-channel high-bit-depth image scaled to 8 bits over its nominal range (not clipped at 255)."""
    import numpy as np

    pixels = np.asarray(image)
    if image.mode.startswith("I;16"):
        top = 65535
    else:   # mode I (32-bit TIFFs mostly hold 16-bit data) or F: judge the nominal range by the values
        low, high = (float(pixels.min()), float(pixels.max())) if pixels.size else (0.0, 0.0)
        if image.mode == "F" and low >= 0 and high <= 1:
            top = 1.0
        elif low >= 0 and high <= 255:
            top = 255
        elif low >= 0 and high <= 65535:
            top = 65535
        else:   # values outside any nominal range: stretch what is there
            span = high - low or 1.0
            scaled = ((pixels.astype(np.float32) - low) * (255.0 / span) + 0.5).astype(np.uint8)
            return Image.fromarray(scaled, "L")
    if isinstance(top, int):
        wide = pixels.astype(np.uint32)   # in place from here: 4 bytes a pixel at most
        wide *= 255
        wide += top // 2
        wide //= top
        scaled = wide.astype(np.uint8)
    else:
        scaled = (np.clip(pixels, 0, 1) * 255.0 + 0.5).astype(np.uint8)
    return Image.fromarray(scaled, "L")


def _reencode(image: Image.Image, original_format: str, original_mode: str, reason: str, *,
              max_pixels: int | None = None, size: tuple[int, int] | None = None,
              quality: int = REENCODE_QUALITY) -> CheckedImage:
    """`size`: the (width, height) to resize to before any EXIF rotation (the stored image's sides
    are swapped by a 90-degree orientation)."""
    if size is not None and image.size != size:
        if image.mode not in ("RGB", "L", "RGBA", "LA"):
            # Resizing needs 8-bit bands: a CMYK/P/16-bit image is brought to RGB (or L) first.
            image = _to_8bit(image) if image.mode in _HIGH_BIT_MODES else image.convert(
                "RGBA" if image.mode == "PA" or "transparency" in image.info else "RGB")
        image = image.resize(size, Image.BICUBIC, reducing_gap=3.0)   # antialiased; 1.5-2x faster than Lanczos
    reoriented = _orientation(image) != 1
    if reoriented:   # exif_transpose copies even when there is nothing to do: ask first
        image = ImageOps.exif_transpose(image)
        if "EXIF orientation" not in reason:
            reason += ", EXIF orientation applied"
    if image.mode in _HIGH_BIT_MODES:
        image = _to_8bit(image)
        reason += ", high bit depth scaled to 8 bits"
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        # Composite on white, as a browser shows a transparent image on a page, rather than on black.
        rgba = image.convert("RGBA")
        rgb = Image.new("RGB", rgba.size, (255, 255, 255))
        rgb.paste(rgba, mask=rgba.getchannel("A"))
    else:
        rgb = image if image.mode == "RGB" else image.convert("RGB")   # convert() copies even RGB to RGB
    if max_pixels and rgb.width * rgb.height > max_pixels:   # a DCT scale step overshot: finish the job
        factor = math.sqrt(max_pixels / (rgb.width * rgb.height))
        rgb = rgb.resize((max(1, int(rgb.width * factor)), max(1, int(rgb.height * factor))), Image.LANCZOS)
    buffer = io.BytesIO()
    rgb.save(buffer, "JPEG", quality=quality)
    return CheckedImage(buffer.getvalue(), rgb.width, rgb.height, original_format, original_mode, True, reason,
                        resized=size is not None, reoriented=reoriented)


def decode_rgb(data: bytes):
    """Decode stored bytes to an RGB uint8 array with Pillow (for contact sheets and tests)."""
    import numpy as np

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
