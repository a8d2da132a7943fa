"""Small stored images (issue 36): `make_dataset` builds its map without the DCT-scale branch when the parts'
statistics show that no crop window can fit a reduced decode, and delivers exactly what the branch would."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from pinstorm.pipeline import convert, make_dataset, make_imagenet_size_tree
from pinstorm.pipeline.epochs import epoch_seed, open_epochs
from pinstorm.pipeline.reader import _largest_stored, _may_scale, preprocess_fn

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """ImageNet-size photos stored at most 200 px on the longer side, in 2 parts' worth of row groups."""
    root = tmp_path_factory.mktemp("small")
    tree = make_imagenet_size_tree(root / "tree", classes=2, per_class=5, seed=4)
    converted = convert(tree, root / "ds", min_row_groups=3, progress=False, max_side=200)
    return converted.url, root / "tree"


def test_largest_stored_is_the_largest_height_and_width_in_the_shard(small):
    url, _ = small
    table = pq.read_table(url, columns=["height", "width"])
    heights, widths = table.column("height").to_pylist(), table.column("width").to_pylist()
    source = open_epochs(url, None, shuffle=False, seed=1)
    assert _largest_stored(source) == (max(heights), max(widths))
    assert max(max(heights), max(widths)) == 200
    # A shard's bound comes from its own row groups, never above the dataset's.
    shards = [_largest_stored(open_epochs(url, (i, 2), shuffle=False, seed=1)) for i in range(2)]
    assert all(s[0] <= max(heights) and s[1] <= max(widths) for s in shards)
    assert (max(s[0] for s in shards), max(s[1] for s in shards)) == (max(heights), max(widths))


def test_may_scale_only_where_a_window_could_be_twice_the_target_on_both_sides(small):
    url, tree = small
    source = open_epochs(url, None, shuffle=False, seed=1)
    height, width = _largest_stored(source)
    assert not _may_scale(source, (height // 2 + 1, 8)) and not _may_scale(source, (8, width // 2 + 1))
    assert _may_scale(source, (height // 2, width // 2))
    full = convert(tree, url + "-full", progress=False)   # the photos as generated: ~500 px
    assert _may_scale(open_epochs(full.url, None, shuffle=False, seed=1), (112, 112))


@pytest.mark.parametrize("training", [True, False])
def test_without_the_branch_the_images_are_those_the_branch_decodes(small, training):
    url, _ = small
    jpegs = pq.read_table(url, columns=["image"]).column("image").to_pylist()
    fn = preprocess_fn((112, 112), training=training)   # the per-image map with the DCT-scale branch
    import tensorflow as tf

    seen = 0
    for images, _, ids in make_dataset(url, batch_size=4, image_size=112, training=training, seed=3,
                                       return_ids=True, num_epochs=1):
        for image, i in zip(images.numpy(), ids.numpy()):
            expected, _ = fn(tf.constant(jpegs[i]), 0, tf.constant([epoch_seed(3, 0), i], tf.int64))
            np.testing.assert_allclose(image, expected.numpy(), rtol=0, atol=1e-6)
            seen += 1
    assert seen == len(jpegs)


def test_the_flip_is_drawn_and_applied_as_tf_image_stateless_random_flip_left_right():
    import tensorflow as tf

    from pinstorm.pipeline.reader import _flipped

    image = tf.reshape(tf.range(2 * 5 * 3, dtype=tf.float32), [2, 5, 3])
    flipped = 0
    for i in range(200):
        seed = tf.constant([987_654_321 + 31 * i, i], tf.int64)
        expected = tf.image.stateless_random_flip_left_right(image, seed=tf.reverse(seed, [0]))
        got = _flipped(tf, image, seed)
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
        flipped += int(not np.array_equal(got.numpy(), image.numpy()))
    assert 60 < flipped < 140   # both ways, about half each


def test_the_unit_scale_is_the_clip_it_replaced_on_any_bilinear_resize_of_bytes():
    import tensorflow as tf

    from pinstorm.pipeline.reader import _unit_scale

    rng = np.random.default_rng(5)
    for _ in range(60):
        h, w = (int(v) for v in rng.integers(1, 90, size=2))
        pixels = rng.choice([0, 1, 254, 255], size=(h, w, 3)) if rng.random() < 0.5 else rng.integers(0, 256, (h, w, 3))
        resized = tf.image.resize(tf.constant(pixels.astype(np.uint8)), [int(v) for v in rng.integers(1, 120, size=2)])
        assert float(tf.reduce_min(resized)) >= 0.0
        np.testing.assert_array_equal(_unit_scale(tf, resized).numpy(),
                                      tf.clip_by_value(resized / 255.0, 0.0, 1.0).numpy())


def test_the_float_resize_gives_the_uint8_resize_pixels_bit_for_bit():
    """`_resized` casts before resizing for speed; the pixels must be those of the plain uint8 resize, for
    shrinking, enlarging and odd shapes alike."""
    import tensorflow as tf

    from pinstorm.pipeline.reader import _resized

    rng = np.random.default_rng(11)
    for _ in range(40):
        h, w = (int(v) for v in rng.integers(1, 400, size=2))
        size = [int(v) for v in rng.integers(1, 260, size=2)]
        pixels = tf.constant(rng.integers(0, 256, (h, w, 3)).astype(np.uint8))
        got = _resized(tf, pixels, size)
        assert got.dtype == tf.float32
        np.testing.assert_array_equal(got.numpy(), tf.image.resize(pixels, size).numpy())
