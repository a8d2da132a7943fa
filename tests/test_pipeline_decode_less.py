"""Decode less: `max_side` storage in convert, and reduced DCT-scale decodes in make_dataset."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from pinstorm.pipeline import (DatasetExistsError, check_image, convert, dataset_info, imagenet_size_jpegs,
                               make_dataset, make_imagenet_size_tree, verify_dataset)
from pinstorm.pipeline.images import decode_cost, read_header

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _encode(image: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kw)
    return buffer.getvalue()


def _open(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    assert (image.format, image.mode) == ("JPEG", "RGB")
    return image


@pytest.fixture(scope="module")
def photos():
    return list(imagenet_size_jpegs(4, seed=3))


# ---------------------------------------------------------------------------------------------
# check_image(max_side, quality)


def test_max_side_downscales_larger_images_once_and_keeps_smaller_ones(photos):
    data = photos[0]
    width, height = Image.open(io.BytesIO(data)).size
    checked = check_image(data, max_side=256)
    assert checked.reencoded and "max_side 256" in checked.reason and f"from {width}x{height}" in checked.reason
    stored = _open(checked.data)
    assert max(stored.size) == 256 and stored.size == (checked.width, checked.height)
    assert abs(stored.size[0] / stored.size[1] - width / height) < 0.01
    # The content is the photo, smaller: compare against Pillow's own resize of the full decode.
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize(stored.size, Image.LANCZOS), float)
    assert np.abs(np.asarray(stored, float) - reference).mean() < 6

    kept = check_image(data, max_side=max(width, height))
    assert kept.data is data and not kept.reencoded
    assert check_image(data).data is data   # off by default


def test_quality_sets_the_jpeg_quality_of_downscaled_images(photos):
    low = check_image(photos[1], max_side=300, quality=50).data
    high = check_image(photos[1], max_side=300, quality=95).data
    assert len(low) < len(high)
    with pytest.raises(ValueError, match="quality"):
        check_image(photos[1], max_side=300, quality=0)
    with pytest.raises(ValueError, match="max_side"):
        check_image(photos[1], max_side=0)


def test_max_side_applies_exif_orientation_png_and_cmyk():
    pixels = np.zeros((600, 800, 3), np.uint8)
    pixels[:, :400] = (250, 20, 20)          # left half red
    image = Image.fromarray(pixels)
    exif = Image.Exif()
    exif[0x0112] = 6                         # display rotated 90 degrees clockwise
    rotated = check_image(_encode(image, exif=exif.tobytes()), max_side=256)
    assert (rotated.width, rotated.height) == (192, 256)   # the displayed (portrait) image, longer side 256
    top = np.asarray(_open(rotated.data))[:60].reshape(-1, 3).mean(0)
    assert top[0] > 200 and top[1] < 60      # red now on top, as a viewer shows it

    png = check_image(_encode(image, "PNG"), max_side=100)
    assert (png.width, png.height) == (100, 75) and "max_side 100" in png.reason
    cmyk = check_image(_encode(image.convert("CMYK")), max_side=100)
    assert (cmyk.width, cmyk.height) == (100, 75) and _open(cmyk.data).mode == "RGB"


def test_max_side_budget_counts_the_draft_decode():
    big = _encode(Image.new("RGB", (4000, 3000), (90, 120, 30)))
    header = read_header(big)
    assert decode_cost(header, max_side=256) == 4000 * 3000 // 64 * 12   # a 1/8-scale draft, not a full decode
    assert decode_cost(header, max_side=1000) == 4000 * 3000 // 16 * 12  # 1/4: the draft stays >= 1000x750
    checked = check_image(big, max_side=256)
    assert (checked.width, checked.height) == (256, 192)


# ---------------------------------------------------------------------------------------------
# convert(max_side=...)


@pytest.fixture(scope="module")
def imagenet_tree(tmp_path_factory):
    return make_imagenet_size_tree(tmp_path_factory.mktemp("inet"), classes=2, per_class=6, seed=1)


def test_convert_max_side_reports_resized_and_checksums_cover_stored_bytes(imagenet_tree, tmp_path):
    plain = convert(imagenet_tree, tmp_path / "plain", min_row_groups=2, progress=False)
    small = convert(imagenet_tree, tmp_path / "small", min_row_groups=2, progress=False, max_side=200, quality=85)
    assert plain.resized == 0 and not plain.reencoded
    assert small.resized == small.rows == 12 and all("max_side 200" in r["reason"] for r in small.reencoded)
    assert small.bytes < plain.bytes / 2
    info = dataset_info(tmp_path / "small")
    assert info["resized"] == 12
    verify_dataset(tmp_path / "small")   # every part and row-group checksum matches the stored (resized) bytes

    import pyarrow.parquet as pq
    table = pq.read_table(tmp_path / "small", columns=["image", "height", "width"])
    for data, height, width in zip(*(table.column(c).to_pylist() for c in ("image", "height", "width"))):
        assert _open(data).size == (width, height) and max(width, height) == 200

    # The settings are part of the plan: another max_side is another dataset.
    with pytest.raises(DatasetExistsError):
        convert(imagenet_tree, tmp_path / "small", min_row_groups=2, progress=False, max_side=128)
    again = convert(imagenet_tree, tmp_path / "small", min_row_groups=2, progress=False, max_side=200, quality=85)
    assert again.images_read == 0 and again.resized == 12
    with pytest.raises(ValueError, match="max_side"):
        convert(imagenet_tree, tmp_path / "bad", max_side=-5)


def test_cli_max_side_and_quality(imagenet_tree, tmp_path):
    from pinstorm.cli import cli

    result = CliRunner().invoke(cli, ["convert", str(imagenet_tree), str(tmp_path / "ds"), "--min-row-groups", "2",
                                      "--max-side", "160", "--quality", "80"])
    assert result.exit_code == 0, result.output
    assert "12 resized to --max-side" in result.output
    result = CliRunner().invoke(cli, ["convert", str(imagenet_tree), str(tmp_path / "ds2"), "--quality", "80"])
    assert result.exit_code != 0 and "--max-side" in result.output


# ---------------------------------------------------------------------------------------------
# make_dataset: reduced DCT scale


def test_dct_scaled_crop_has_the_scaled_shape_even_at_odd_borders():
    import tensorflow as tf

    from pinstorm.pipeline.reader import _decode_crop

    data = _encode(Image.fromarray(np.random.default_rng(0).integers(0, 255, (377, 501, 3), np.uint8)), quality=90)
    shape = tf.constant([377, 501, 3])
    cases = [([0, 0, 377, 501], (60, 70), (94, 125)),       # ratio 4: floor(side / 4)
             ([17, 33, 360, 468], (60, 70), (90, 117)),     # ratio 4, window to the far border
             ([1, 1, 376, 500], (10, 10), (47, 62)),        # ratio 8
             ([376, 500, 1, 1], (1, 1), (1, 1)),            # the last pixel, at full scale
             ([100, 100, 100, 100], (60, 60), (100, 100)),  # too small for any ratio: full scale
             ([100, 100, 100, 100], (50, 50), (50, 50))]    # exactly twice: ratio 2
    for window, target, expected in cases:
        out = _decode_crop(tf, tf.constant(data), shape, tf.constant(window), target, True)
        assert tuple(out.shape[:2]) == expected, (window, target)
        full = _decode_crop(tf, tf.constant(data), shape, tf.constant(window), target, False)
        assert tuple(full.shape[:2]) == tuple(window[2:])


def _centre_crop_reference(tf, data, size):
    """What `training=False` computes, from a full decode with an antialiased (area-averaging) resize."""
    height, width = (int(v) for v in tf.io.extract_jpeg_shape(data)[:2])
    side = round(min(height, width) * 0.875)
    window = [(height - side) // 2, (width - side) // 2, side, side]
    image = tf.cast(tf.image.decode_and_crop_jpeg(data, window, channels=3), tf.float32)
    return tf.image.resize(image, (size, size), antialias=True) / 255.0


@pytest.mark.parametrize("size", [64, 128])
def test_dct_scaled_images_match_full_decode_and_resize(photos, size):
    import tensorflow as tf

    from pinstorm.pipeline.reader import preprocess_fn

    def mad(a, b):
        return float(tf.reduce_mean(tf.abs(a - b)))

    # Measured on these noisy photos: scaled vs antialiased full decode 0.009-0.041, plain full-scale
    # bilinear vs the same 0.007-0.030, scaled vs plain 0.012-0.054. A crop misplaced by even 1/8 of
    # the image lands far above these bounds.
    for training in (False, True):
        scaled = preprocess_fn((size, size), training=training, flip=False)
        full = preprocess_fn((size, size), training=training, flip=False, dct_scale=False)
        for i, data in enumerate(photos):
            seed = tf.constant([i, 7], tf.int64)
            a, _ = scaled(tf.constant(data), 0, seed)
            b, _ = full(tf.constant(data), 0, seed)
            assert a.shape == b.shape == (size, size, 3)
            assert mad(a, b) < 0.07, (size, training, i, mad(a, b))
            if not training:
                assert mad(a, _centre_crop_reference(tf, data, size)) < 0.05, (size, i)
    shifted = _centre_crop_reference(tf, photos[0][:], size)
    a, _ = preprocess_fn((size, size), training=False, flip=False)(tf.constant(photos[0]), 0, None)
    assert mad(a[:, size // 8:], shifted[:, :-(size // 8)]) > 0.07   # the bound tells a misplaced crop apart


def test_make_dataset_small_targets(imagenet_tree, tmp_path):
    convert(imagenet_tree, tmp_path / "ds", min_row_groups=2, progress=False)
    for training in (True, False):
        batches = list(make_dataset(tmp_path / "ds", batch_size=5, image_size=64, training=training, seed=1))
        assert sum(int(b[1].shape[0]) for b in batches) == 12
        images = np.concatenate([b[0].numpy() for b in batches])
        assert images.shape == (12, 64, 64, 3) and 0 <= images.min() and images.max() <= 1 and images.std() > 0.05
    scaled = np.concatenate([b[0].numpy() for b in make_dataset(tmp_path / "ds", batch_size=12, image_size=64,
                                                                training=False, shuffle=False)])
    full = np.concatenate([b[0].numpy() for b in make_dataset(tmp_path / "ds", batch_size=12, image_size=64,
                                                              training=False, shuffle=False, dct_scale=False)])
    assert np.abs(scaled - full).mean() < 0.07   # see the bounds above


def test_check_image_holds_the_header_cost_while_it_decodes(photos):
    """convert parses each header once: check_image enters the memory budget with its decode cost."""
    from contextlib import contextmanager

    seen, decoding = [], []

    @contextmanager
    def hold(cost):
        seen.append(cost)
        decoding.append(True)
        try:
            yield
        finally:
            decoding.append(False)

    header = read_header(photos[0])
    check_image(photos[0], hold=hold)
    check_image(photos[0], max_side=256, hold=hold)
    assert seen == [decode_cost(header), decode_cost(header, max_side=256)] and decoding == [True, False] * 2
    giant = _encode(Image.new("RGB", (3000, 2000)), "PNG")
    with pytest.raises(Exception, match="too large"):
        check_image(giant, max_pixels=1_000_000, hold=hold)
    assert seen[-1] == 0 and decoding[-1] is False   # refused from its header, budget released


def test_inspect_names_the_resized_images(imagenet_tree, tmp_path):
    from pinstorm.pipeline.inspect import format_summary, inspect_dataset

    convert(imagenet_tree, tmp_path / "small", min_row_groups=2, progress=False, max_side=100)
    summary = inspect_dataset(tmp_path / "small")
    assert "12 re-encoded at conversion (12 downscaled to max_side)" in format_summary(summary)
    assert summary["width"][2] <= 100 and summary["height"][2] <= 100
