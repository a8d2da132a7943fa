"""The sample trees: ILSVRC-shaped digits with real quirks, and ImageNet-size JPEGs for benchmarks."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pinstorm.pipeline import imagenet_size_jpegs, make_digits_tree, scan
from pinstorm.pipeline.samples import IMAGENET_SIZES, digit_wnid, digits_quirks
from pipeline_support import IMAGE_SIZE, PER_CLASS

pytest_plugins = ["conftest_pipeline"]


def test_digits_tree_files_look_like_ilsvrc(digits_root):
    cls_loc = digits_root / "ILSVRC" / "Data" / "CLS-LOC"
    train = sorted((cls_loc / "train").glob("n*/*.JPEG"))
    val = sorted((cls_loc / "val").glob("ILSVRC2012_val_*.JPEG"))
    n_val = round(PER_CLASS * 0.2)
    assert len(train) == 10 * (PER_CLASS - n_val) + 5 and len(val) == 10 * n_val
    assert val[0].name == "ILSVRC2012_val_00000001.JPEG"
    assert (digits_root / "LOC_val_solution.csv").read_text().startswith("ImageId,PredictionString\n")
    mapping = (digits_root / "LOC_synset_mapping.txt").read_text().splitlines()
    assert mapping[0].startswith(f"{digit_wnid(0)} digit zero")
    image = Image.open(cls_loc / "train" / digit_wnid(7) / f"{digit_wnid(7)}_1.JPEG")
    assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (IMAGE_SIZE, IMAGE_SIZE))
    pixels = np.asarray(image)
    assert pixels.min() < 60 and pixels.max() > 200  # dark ink on white paper, not noise


def test_quirk_files_are_what_real_imagenet_has(digits_root):
    quirks = digits_quirks(digits_root)
    cmyk, gray, png = (Image.open(quirks[k]) for k in ("cmyk", "grayscale", "png"))
    assert (cmyk.format, cmyk.mode) == ("JPEG", "CMYK")
    assert (gray.format, gray.mode) == ("JPEG", "L")
    assert png.format == "PNG" and quirks["png"].suffix == ".JPEG"
    assert quirks["empty"].stat().st_size == 0
    with pytest.raises(OSError, match="truncated"):
        Image.open(quirks["truncated"]).load()


def test_digits_tree_is_deterministic_and_respects_options(tmp_path):
    a = make_digits_tree(tmp_path / "a", image_size=16, per_class=5, val_fraction=0.4, seed=3)
    b = make_digits_tree(tmp_path / "b", image_size=16, per_class=5, val_fraction=0.4, seed=3)
    la, lb = scan(a), scan(b)
    assert len(la.train) == 30 and len(la.val) == 20
    assert [open(p, "rb").read() for p, _ in la.val] == [open(p, "rb").read() for p, _ in lb.val]
    assert [w for _, w in la.val] == [w for _, w in lb.val]
    with pytest.raises(ValueError, match="val_fraction"):
        make_digits_tree(tmp_path / "c", val_fraction=1.0)


def test_imagenet_size_jpegs_are_imagenet_like():
    images = list(imagenet_size_jpegs(6, seed=1))
    sizes = [len(b) for b in images]
    assert 70_000 < np.mean(sizes) < 150_000
    decoded = [Image.open(io.BytesIO(b)) for b in images]
    assert all(im.format == "JPEG" and im.mode == "RGB" and im.size in IMAGENET_SIZES for im in decoded)
    assert len({b[:2000] for b in images}) == 6  # varied, not one picture six times
    assert images == list(imagenet_size_jpegs(6, seed=1))
