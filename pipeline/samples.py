"""Small ILSVRC-shaped trees built from real images that ship in packages.

Real ImageNet cannot be downloaded here, so tests, the demo and the benchmark need trees that look
like it: the same folders and label files, and (on request) the same quirks real crawls have.
Two sources, both inside scikit-learn: the handwritten digits (1797 images of 8x8, 10 classes) for
something a model can learn in minutes, and the two sample photographs (china.jpg, flower.jpg) cut
into varied ImageNet-size JPEGs (~500x375, ~110 KB) for speed measurements.
"""

from __future__ import annotations

import csv
import io
import random
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image

from .errors import InvalidPipelineInput

DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

# The quirks real ImageNet has, each put into a different class of the digits tree:
# kind -> (digit, file number). Numbers above any real one so they never collide.
QUIRKS = {
    "cmyk": (1, 90001),        # a CMYK JPEG (22 of those in ILSVRC train)
    "grayscale": (2, 90002),   # a one-channel JPEG
    "png": (3, 90003),         # PNG bytes behind a .JPEG name (n02105855_2933.JPEG)
    "truncated": (4, 90004),   # a JPEG cut off mid-scan, as interrupted crawls leave them
    "empty": (5, 90005),       # a zero-byte file
}


def digit_wnid(digit: int) -> str:
    """An ImageNet-looking WordNet id for a digit: n00000000 ... n00000009."""
    return f"n{digit:08d}"


def _jpeg_bytes(image: Image.Image, quality: int = 92) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def _digit_image(pixels: np.ndarray, image_size: int) -> Image.Image:
    """An 8x8 digit (values 0..16) upscaled bilinearly to an RGB image, dark ink on white paper."""
    gray = (255 - np.clip(pixels * 16, 0, 255)).astype(np.uint8)
    return Image.fromarray(gray, mode="L").resize((image_size, image_size), Image.BILINEAR).convert("RGB")


def make_digits_tree(root, *, image_size: int = 64, per_class: int | None = None, val_fraction: float = 0.2,
                     quirks: bool = False, seed: int = 0) -> Path:
    """Build an ILSVRC-shaped tree under `root` from scikit-learn's handwritten digits; return `root`.

    Layout (as Kaggle's ImageNet download has it)::

        root/ILSVRC/Data/CLS-LOC/train/<wnid>/<wnid>_<n>.JPEG
        root/ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_<8 digits>.JPEG
        root/LOC_val_solution.csv        ImageId,PredictionString ("<wnid> x0 y0 x1 y1")
        root/LOC_synset_mapping.txt      "<wnid> <names>" per line

    `per_class` caps the images per digit before the split (all ~180 when None); `val_fraction` of
    each class goes to val. `quirks=True` adds five extra train files (see `QUIRKS`): a CMYK JPEG, a
    grayscale JPEG, a PNG named .JPEG, a truncated JPEG and an empty file; `digits_quirks(root)`
    returns their paths. Deterministic for a given `seed`.

    Args:
        root: The folder to build the tree in.
        image_size: The images' side in pixels (the 8x8 digits scaled up).
        per_class: At most this many images per digit before the split (None: all, about 180).
        val_fraction: The share of each class that goes to val.
        quirks: Add the five quirk files to train.
        seed: Makes the tree reproducible.

    Returns:
        `root`, as a `Path`.
    """
    from sklearn.datasets import load_digits

    if not 0 <= val_fraction < 1:
        raise InvalidPipelineInput(f"val_fraction must be in [0, 1), got {val_fraction}")
    if image_size < 8:
        raise InvalidPipelineInput(f"image_size must be at least 8, got {image_size}")
    root = Path(root)
    cls_loc = root / "ILSVRC" / "Data" / "CLS-LOC"
    train_dir, val_dir = cls_loc / "train", cls_loc / "val"
    digits = load_digits()
    rng = random.Random(seed)
    val_entries: list[tuple[np.ndarray, int]] = []
    for digit in range(10):
        indexes = [i for i, target in enumerate(digits.target) if target == digit]
        rng.shuffle(indexes)
        if per_class is not None:
            indexes = indexes[:per_class]
        n_val = int(round(len(indexes) * val_fraction))
        wnid = digit_wnid(digit)
        class_dir = train_dir / wnid
        class_dir.mkdir(parents=True, exist_ok=True)
        for number, index in enumerate(indexes[n_val:], start=1):
            image = _digit_image(digits.images[index], image_size)
            (class_dir / f"{wnid}_{number}.JPEG").write_bytes(_jpeg_bytes(image))
        val_entries += [(digits.images[index], digit) for index in indexes[:n_val]]

    # Val files are numbered in a shuffled order, so a folder listing says nothing about labels.
    rng.shuffle(val_entries)
    val_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for number, (pixels, digit) in enumerate(val_entries, start=1):
        image_id = f"ILSVRC2012_val_{number:08d}"
        (val_dir / f"{image_id}.JPEG").write_bytes(_jpeg_bytes(_digit_image(pixels, image_size)))
        rows.append((image_id, f"{digit_wnid(digit)} 0 0 {image_size - 1} {image_size - 1}"))
    with open(root / "LOC_val_solution.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["ImageId", "PredictionString"])
        writer.writerows(rows)
    (root / "LOC_synset_mapping.txt").write_text(
        "".join(f"{digit_wnid(d)} digit {DIGIT_NAMES[d]}, handwritten {DIGIT_NAMES[d]}\n" for d in range(10)))

    if quirks:
        _add_quirks(root, digits, image_size)
    return root


def digits_quirks(root) -> dict[str, Path]:
    """Paths of the quirk files `make_digits_tree(root, quirks=True)` wrote, by kind.

    Args:
        root: The tree's folder.

    Returns:
        ``{kind: path}``.
    """
    train_dir = Path(root) / "ILSVRC" / "Data" / "CLS-LOC" / "train"
    return {kind: train_dir / digit_wnid(digit) / f"{digit_wnid(digit)}_{number}.JPEG"
            for kind, (digit, number) in QUIRKS.items()}


def _add_quirks(root: Path, digits, image_size: int) -> None:
    paths = digits_quirks(root)

    def image_of(digit: int) -> Image.Image:
        index = int(np.flatnonzero(digits.target == digit)[-1])
        return _digit_image(digits.images[index], image_size)

    buffer = io.BytesIO()
    image_of(QUIRKS["cmyk"][0]).convert("CMYK").save(buffer, "JPEG", quality=92)
    paths["cmyk"].write_bytes(buffer.getvalue())
    buffer = io.BytesIO()
    image_of(QUIRKS["grayscale"][0]).convert("L").save(buffer, "JPEG", quality=92)
    paths["grayscale"].write_bytes(buffer.getvalue())
    buffer = io.BytesIO()
    image_of(QUIRKS["png"][0]).save(buffer, "PNG")
    paths["png"].write_bytes(buffer.getvalue())
    whole = _jpeg_bytes(image_of(QUIRKS["truncated"][0]))
    paths["truncated"].write_bytes(whole[: len(whole) * 2 // 3])
    paths["empty"].write_bytes(b"")


# ---------------------------------------------------------------------------------------------
# ImageNet-size images for benchmarks

IMAGENET_SIZES = [(500, 375), (375, 500), (500, 333), (500, 400), (333, 500), (500, 353), (448, 336)]


def imagenet_size_jpegs(count: int, *, seed: int = 0, target_kb: float = 110.0) -> Iterator[bytes]:
    """Yield `count` varied RGB JPEGs of ImageNet size (~500x375, ~`target_kb` KB each).

    Cut from scikit-learn's two sample photographs by random crops (30-100 % of the area), flips,
    scales and colour shifts; the JPEG quality is chosen per image to land near the target size.

    Args:
        count: How many JPEGs.
        seed: Makes the images reproducible.
        target_kb: The size each JPEG aims at, in KB.

    Yields:
        The JPEG files' bytes.
    """
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(array) for array in load_sample_images().images]
    rng = random.Random(seed)
    for _ in range(count):
        photo = rng.choice(photos)
        width, height = rng.choice(IMAGENET_SIZES)
        area = rng.uniform(0.3, 1.0) * photo.width * photo.height
        aspect = width / height * rng.uniform(0.9, 1.1)
        crop_w = int(min(photo.width, (area * aspect) ** 0.5))
        crop_h = int(min(photo.height, crop_w / aspect))
        left = rng.randint(0, photo.width - crop_w)
        top = rng.randint(0, photo.height - crop_h)
        image = photo.crop((left, top, left + crop_w, top + crop_h)).resize((width, height), Image.BICUBIC)
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        gains = np.array([rng.uniform(0.8, 1.2) for _ in range(3)], dtype=np.float32)
        pixels = np.asarray(image, dtype=np.float32) * gains
        # A little sensor-like noise: real photos carry fine detail that JPEG must spend bytes on.
        pixels += np.random.default_rng(rng.randrange(2**32)).normal(0, 4, pixels.shape)
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        yield _jpeg_near_size(image, target_kb * 1024 * rng.uniform(0.85, 1.15))


def _jpeg_near_size(image: Image.Image, target_bytes: float) -> bytes:
    """The JPEG encoding of `image` whose size is closest to `target_bytes` (binary search on quality)."""
    low, high, best = 50, 98, None
    while low <= high:
        quality = (low + high) // 2
        data = _jpeg_bytes(image, quality)
        if best is None or abs(len(data) - target_bytes) < abs(len(best) - target_bytes):
            best = data
        if len(data) < target_bytes:
            low = quality + 1
        else:
            high = quality - 1
    return best


def make_imagenet_size_tree(root, *, classes: int = 10, per_class: int = 50, seed: int = 0) -> Path:
    """An ILSVRC-shaped train tree of ImageNet-size JPEGs (see `imagenet_size_jpegs`); returns `root`.

    Labels carry no meaning here: the tree exists to measure conversion and reading speed on files
    of realistic size. Also writes `LOC_synset_mapping.txt`.

    Args:
        root: The folder to build the tree in.
        classes: How many classes.
        per_class: Images per class.
        seed: Makes the tree reproducible.

    Returns:
        `root`, as a `Path`.
    """
    root = Path(root)
    train_dir = root / "ILSVRC" / "Data" / "CLS-LOC" / "train"
    images = imagenet_size_jpegs(classes * per_class, seed=seed)
    lines = []
    for c in range(classes):
        wnid = f"n{90000000 + c:08d}"
        lines.append(f"{wnid} sample class {c}\n")
        class_dir = train_dir / wnid
        class_dir.mkdir(parents=True, exist_ok=True)
        for number in range(1, per_class + 1):
            (class_dir / f"{wnid}_{number}.JPEG").write_bytes(next(images))
    (root / "LOC_synset_mapping.txt").write_text("".join(lines))
    (root / "ILSVRC" / "Data" / "CLS-LOC" / "val").mkdir(parents=True, exist_ok=True)
    return root
