"""Never train on wrong data: stable labels, faithful pixels, checked parts, bounded memory (issue 9)."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from pinstorm import boards
from pinstorm.pipeline import (CorruptPartError, EmptyClassesWarning, LayoutError, MissingPartError, UndecodableImage,
                               check_image, convert, dataset_info, imagenet_partition, repartition, scan,
                               verify_dataset)
from pinstorm.pipeline.images import decode_rgb
from pinstorm.pipeline.metadata import COMMON_METADATA, petastorm_unischema_pickle, read_info, write_common_metadata
from pinstorm.pipeline.storage import resolve
from pipeline_support import read_rows

CLASSES = ["n01", "n02", "n03", "n04"]   # n02 is the empty one


def _jpeg(seed: int, size=(48, 40), **save) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).resize(size, Image.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **save)
    return buffer.getvalue()


def _tree(root: Path, counts: dict[str, int], seed: int = 0, size=(48, 40)) -> Path:
    for c, (wnid, n) in enumerate(counts.items()):
        (root / wnid).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / wnid / f"{wnid}_{i}.JPEG").write_bytes(_jpeg(seed * 1000 + c * 100 + i, size))
    return root


def _labels_by_wnid(url) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for row in read_rows(url):
        found.setdefault(row["wnid"], set()).add(row["label"])
    return found


# ---- 1. labels -------------------------------------------------------------------------------------


def test_an_empty_class_folder_keeps_its_label_in_splits_and_partitions(tmp_path):
    root = tmp_path / "tree"
    _tree(root / "train", {"n01": 5, "n02": 0, "n03": 5, "n04": 5})
    _tree(root / "val", {"n01": 2, "n03": 2, "n04": 2}, seed=1)
    with pytest.warns(EmptyClassesWarning, match="1 of 4 classes.*n02"):
        layout = scan(root)
    assert layout.classes == CLASSES and layout.empty_classes == ["n02"]

    with pytest.warns(EmptyClassesWarning, match="n02"):
        train = convert(layout, tmp_path / "train", progress=False)
    with pytest.warns(EmptyClassesWarning, match="n02"):
        val = convert(layout, tmp_path / "val", split="val", progress=False)
    assert train.empty_classes == val.empty_classes == ["n02"]
    expected = {"n01": {0}, "n03": {2}, "n04": {3}}
    assert _labels_by_wnid(tmp_path / "train") == _labels_by_wnid(tmp_path / "val") == expected
    info = dataset_info(tmp_path / "train")
    assert info["classes"] == CLASSES and info["num_classes"] == 4 and info["class_rows"] == [5, 0, 5, 5]
    assert info["empty_classes"] == ["n02"]

    # two partitions of the same tree through per-category pins: the empty category is listed, not pinned
    boards.board_register("local", name="cats", path=tmp_path / "board")
    with pytest.warns(EmptyClassesWarning, match="n02"):
        categories = repartition(root / "train", "cats", parallel=2, progress=False)
    assert categories["id"].tolist() == CLASSES and categories["images"].tolist() == [5, 0, 5, 5]
    for p in range(2):
        data = imagenet_partition(p, 2, "cats")
        assert data["classes"] == CLASSES
        if p == 0:   # the slice's own empty category is reported, not the other slice's classes
            with pytest.warns(EmptyClassesWarning, match="1 of 2 classes.*n02"):
                assert convert(data, tmp_path / f"part-{p}", progress=False).empty_classes == ["n02"]
        else:
            assert convert(data, tmp_path / f"part-{p}", progress=False).empty_classes == []
    merged = {**_labels_by_wnid(tmp_path / "part-0"), **_labels_by_wnid(tmp_path / "part-1")}
    assert merged == expected


def test_synset_mapping_is_the_class_list(tmp_path):
    root = _tree(tmp_path / "tree", {"n01": 3, "n03": 3})
    (root / "LOC_synset_mapping.txt").write_text("n01 one\nn02 two\nn03 three\nn04 four\n")
    with pytest.warns(EmptyClassesWarning, match="2 of 4 classes.*n02, n04"):
        layout = scan(root)
    assert layout.classes == CLASSES and layout.names["n04"] == "four"
    (root / "n09").mkdir()
    with pytest.raises(LayoutError, match="class folders missing from .*LOC_synset_mapping.txt: n09"):
        scan(root)


# ---- 2., 3., 7. pixels and reasons ------------------------------------------------------------------


def _gradient(width=256, height=16) -> np.ndarray:
    return np.tile(np.linspace(0, 65535, width).round().astype(np.uint16), (height, 1))


@pytest.mark.parametrize("kind", ["png16", "tiff32"])
def test_high_bit_depth_is_scaled_not_clipped(kind):
    gradient = _gradient()
    buffer = io.BytesIO()
    if kind == "png16":
        Image.fromarray(gradient).save(buffer, "PNG")          # mode I;16
    else:
        Image.fromarray(gradient.astype(np.int32)).save(buffer, "TIFF")   # mode I
    assert Image.open(io.BytesIO(buffer.getvalue())).mode == {"png16": "I;16", "tiff32": "I"}[kind]
    checked = check_image(buffer.getvalue())
    assert checked.reencoded and "high bit depth scaled" in checked.reason
    row = decode_rgb(checked.data)[8, :, 0].astype(int)
    expected = np.round(gradient[8] / 257).astype(int)
    assert np.abs(row - expected).max() <= 4, row[::32]
    assert row[0] <= 4 and abs(row[128] - 128) <= 4 and row[-1] >= 251


def _oriented_jpeg(orientation: int) -> bytes:
    pixels = np.zeros((40, 80, 3), np.uint8)     # 80 wide, 40 high; left half white
    pixels[:, :40] = 255
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=95, exif=exif.tobytes())
    return buffer.getvalue()


def test_exif_orientation_is_applied_and_counted(tmp_path):
    root = _tree(tmp_path / "tree", {"n01": 3, "n02": 3})
    rotated = root / "n01" / "phone.JPEG"
    rotated.write_bytes(_oriented_jpeg(6))
    upright = root / "n02" / "upright.JPEG"
    upright.write_bytes(_oriented_jpeg(1))
    (root / "n02" / "notes.JPEG").write_text("meeting notes, not a picture")
    result = convert(root, tmp_path / "ds", progress=False)

    assert result.reoriented == 1 and dataset_info(tmp_path / "ds")["reoriented"] == 1
    assert [(Path(r["path"]).name, r["reason"]) for r in result.reencoded] == [("phone.JPEG", "EXIF orientation 6")]
    assert result.skipped == [{"path": str(root / "n02" / "notes.JPEG"),
                               "reason": "not an image (first bytes: b'meeting notes, n')"}]
    rows = {r["filename"]: r for r in read_rows(tmp_path / "ds", ("image", "filename", "height", "width"))}
    assert (rows["phone.JPEG"]["width"], rows["phone.JPEG"]["height"]) == (40, 80)
    pixels = decode_rgb(rows["phone.JPEG"]["image"])      # orientation 6: rotate 90 degrees clockwise
    assert pixels.shape == (80, 40, 3) and pixels[10, 20].min() > 230 and pixels[70, 20].max() < 25
    assert Image.open(io.BytesIO(rows["phone.JPEG"]["image"])).getexif().get(0x0112) is None
    for path in [upright, *(root / "n01").glob("n01_*.JPEG")]:   # everything else: byte for byte
        assert rows[path.name]["image"] == path.read_bytes()


# ---- 6. memory ---------------------------------------------------------------------------------------


def _giant_png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (the pixels are missing): refused from the header alone."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(1000))))


def test_pixel_budget_downscales_jpegs_and_skips_other_giants(tmp_path):
    root = _tree(tmp_path / "tree", {"n01": 2, "n02": 2})
    gradient = (np.linspace(0, 255, 1500)[None, :, None] * np.ones((1000, 1, 3))).astype(np.uint8)
    Image.fromarray(gradient).save(root / "n01" / "big.png")                      # 1.5 MP
    Image.fromarray(gradient).save(root / "n02" / "big.JPEG", quality=90)
    (root / "n02" / "giant.png").write_bytes(_giant_png_header(12000, 12000))       # 144 MP, header only

    result = convert(root, tmp_path / "ds", max_pixels=400_000, progress=False)
    reasons = {Path(s["path"]).name: s["reason"] for s in result.skipped}
    assert reasons == {"big.png": "too large: 1500x1000 = 1.5 MP, over max_pixels 0.4 MP",
                       "giant.png": "too large: 12000x12000 = 144.0 MP, over max_pixels 0.4 MP"}
    assert [r["reason"] for r in result.reencoded] == ["downscaled from 1500x1000 (max_pixels 400000)"]
    row = next(r for r in read_rows(tmp_path / "ds", ("filename", "height", "width")) if r["filename"] == "big.JPEG")
    assert row["width"] * row["height"] <= 400_000 and abs(row["width"] / row["height"] - 1.5) < 0.02

    default = convert(root, tmp_path / "default", progress=False)        # 40 MP default: only the giant goes
    assert [Path(s["path"]).name for s in default.skipped] == ["giant.png"]
    with pytest.raises(ValueError, match="max_pixels"):
        convert(root, tmp_path / "x", max_pixels=0, progress=False)


def test_decode_cost_is_read_from_the_header():
    from pinstorm.pipeline.images import decode_cost, read_header

    plain, rotated = read_header(io.BytesIO(_oriented_jpeg(1))), read_header(io.BytesIO(_oriented_jpeg(6)))
    assert (plain.orientation, rotated.orientation) == (1, 6)
    assert decode_cost(plain) * 64 == decode_cost(rotated) == 80 * 40 * 12   # a rotation decodes in full
    giant = read_header(io.BytesIO(_giant_png_header(12000, 12000)))
    assert decode_cost(giant) == 0                                   # refused from its header
    assert decode_cost(giant, max_pixels=None) == 12000 * 12000 * 12


def test_memory_budget_limits_what_threads_hold_at_once():
    from pinstorm.pipeline.convert import _MemoryBudget

    budget = _MemoryBudget(1000)
    inside, most = [0], [0]
    lock = threading.Lock()

    def work(cost):
        with budget.hold(cost):
            with lock:
                inside[0] += cost
                most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= cost

    threads = [threading.Thread(target=work, args=(cost,)) for cost in [600, 600, 300, 300, 5000, 100] * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert most[0] <= 1000 + 4000   # the one over-budget image runs alone (clipped to the budget)
    assert budget.peak <= 1000 and budget.used == 0


# ---- 4., 5. checked parts ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def noisy_dataset(tmp_path_factory):
    """60 noisy 96x80 JPEGs (~10 KB each) in 2 parts of 3 row groups each."""
    base = tmp_path_factory.mktemp("noisy")
    root = _tree(base / "tree", {f"n{c:02d}": 15 for c in range(4)}, seed=3, size=(96, 80))
    url = base / "ds"
    convert(scan(root), url, partitions=2, min_row_groups=6, progress=False)
    return url


def _copy(url, tmp_path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(url, target)
    return target


def _flip(path: Path, fraction: float, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    at = int(len(data) * fraction)
    for i in range(at, at + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.75])
def test_flipped_bytes_are_found_naming_part_and_row_group(noisy_dataset, tmp_path, fraction):
    url = _copy(noisy_dataset, tmp_path)
    _flip(url / "part-00001.parquet", fraction)
    with pytest.raises(CorruptPartError, match=r"part-00001\.parquet row group \d"):
        verify_dataset(url)
    assert verify_dataset(noisy_dataset)["rows"] == 60


def test_verify_dataset_checks_every_byte_the_small_columns_too(noisy_dataset, tmp_path):
    url = _copy(noisy_dataset, tmp_path)
    part = url / "part-00000.parquet"
    chunk = pq.ParquetFile(part).metadata.row_group(1).column(3)      # the filename column of row group 1
    assert chunk.path_in_schema == "filename"
    _flip(part, (chunk.data_page_offset + chunk.total_compressed_size - 3) / part.stat().st_size, count=1)
    with pytest.raises(CorruptPartError, match=r"part-00000\.parquet( row group 1: cannot be read|: file checksum)"):
        verify_dataset(url)


def test_a_corrupted_footer_and_a_changed_size_are_found_when_the_part_opens(noisy_dataset, tmp_path):
    url = _copy(noisy_dataset, tmp_path)
    _flip(url / "part-00000.parquet", 1.0 - 40 / (url / "part-00000.parquet").stat().st_size, count=4)
    with pytest.raises(CorruptPartError, match=r"part-00000\.parquet: (footer checksum mismatch|cannot be read)"):
        verify_dataset(url)
    with (url / "part-00001.parquet").open("ab") as handle:
        handle.write(b"x")
    with pytest.raises(CorruptPartError, match=r"part-00001\.parquet: \d+ bytes, but conversion wrote"):
        dataset_info(url)


def test_a_missing_part_is_found_by_dataset_info_and_before_reading(noisy_dataset, tmp_path):
    url = _copy(noisy_dataset, tmp_path)
    (url / "part-00001.parquet").unlink()
    with pytest.raises(MissingPartError, match=r"1 of 2 part file\(s\) missing: part-00001\.parquet"):
        dataset_info(url)
    assert dataset_info(url, check=False)["rows"] == 60
    with pytest.raises(MissingPartError, match="part-00001.parquet"):
        verify_dataset(url)


def _iterate(dataset) -> tuple[int, str]:
    """(rows delivered, error message or "")."""
    import tensorflow as tf

    rows = 0
    try:
        for _, labels in dataset:
            rows += int(labels.shape[0])
    except tf.errors.OpError as error:
        return rows, str(error)
    return rows, ""


@pytest.mark.parametrize("engine", ["pyarrow", "petastorm"])
def test_reader_refuses_a_corrupted_row_group_before_any_of_its_rows(noisy_dataset, tmp_path, engine):
    pytest.importorskip("tensorflow")
    if engine == "petastorm":
        pytest.importorskip("petastorm")
    from pinstorm.pipeline import make_dataset

    url = _copy(noisy_dataset, tmp_path)
    _flip(url / "part-00001.parquet", 0.5)
    with pytest.raises(CorruptPartError) as caught:
        verify_dataset(url)
    bad_group = int(re.search(r"row group (\d+)", str(caught.value)).group(1))
    info = read_info(resolve(url))
    before = sum(info["row_group_rows"][:3 + bad_group])      # rows stored before the bad row group
    rows, error = _iterate(make_dataset(url, batch_size=1, image_size=(16, 16), training=False, shuffle=False,
                                        engine=engine))
    assert "part-00001.parquet" in error and "row group" in error, error
    if engine == "pyarrow":
        assert f"part-00001.parquet row group {bad_group}" in error
    assert rows <= before


def test_page_crcs_are_verified_for_every_column_the_content_checksum_does_not_cover(noisy_dataset, monkeypatch):
    """Readers of image and label (checked by the row-group checksum) skip the CRC pass over the JPEG pages;
    a read of any other column, or of a part without row-group checksums, keeps it (pyarrow >= 15)."""
    from pinstorm.boards.safety import parquet_limits
    from pinstorm.pipeline import verify
    from pinstorm.pipeline.epochs import open_epochs

    opened = []
    original = parquet_limits.BoundedParquetFile.__init__

    def spy(self, source, where, *args, **kwargs):
        if "part-" in where:   # (not the dataset's _common_metadata)
            opened.append(kwargs.get("page_checksum_verification", False))
        original(self, source, where, *args, **kwargs)

    monkeypatch.setattr(parquet_limits.BoundedParquetFile, "__init__", spy)
    source = open_epochs(noisy_dataset, None, shuffle=False, seed=0)   # make_dataset's and the torch loader's
    rows = sum(len(labels) for _, labels in source(0))
    assert rows == 60 and opened and not any(opened)
    opened.clear()
    verify_dataset(noisy_dataset)                                      # reads every column
    assert opened and all(opened) == verify.PAGE_CRC
    entry = read_info(resolve(noisy_dataset))["files"]["part-00000.parquet"]
    crc = {"page_checksum_verification": True} if verify.PAGE_CRC else {}
    assert verify.reader_options(entry, ("image", "label")) == {}
    assert verify.reader_options(entry, ("image", "label", "filename")) == crc
    assert verify.reader_options(entry) == crc
    unchecked = {k: v for k, v in entry.items() if k != "row_group_xxh3"}
    assert verify.reader_options(unchecked, ("image", "label")) == crc


def test_reader_checks_every_part_before_the_epoch_starts(noisy_dataset, tmp_path):
    pytest.importorskip("tensorflow")
    from pinstorm.pipeline import make_dataset

    url = _copy(noisy_dataset, tmp_path)
    (url / "part-00001.parquet").rename(tmp_path / "aside.parquet")
    with pytest.raises(MissingPartError, match="part-00001.parquet"):
        make_dataset(url, batch_size=4)
    (tmp_path / "aside.parquet").rename(url / "part-00001.parquet")
    dataset = make_dataset(url, batch_size=4, training=False, shuffle=False, image_size=(16, 16))
    (url / "part-00001.parquet").unlink()          # gone after the reader was built: found at epoch start
    rows, error = _iterate(dataset)
    assert rows == 0 and "MissingPartError" in error and "part-00001.parquet" in error


def _rewrite_without_checksums(url: Path, edit) -> None:
    """Apply `edit(images)` to row group 1 of part 0, and record the dataset as one without checksums
    (as an older pinstorm wrote it), with the part's new size."""
    import pyarrow as pa

    part = url / "part-00000.parquet"
    handle = pq.ParquetFile(part)
    groups = [handle.read_row_group(g) for g in range(handle.num_row_groups)]
    schema = handle.schema_arrow
    images = groups[1].column("image").to_pylist()
    edit(images)
    groups[1] = groups[1].set_column(0, "image", pa.array(images, pa.binary()))
    with pq.ParquetWriter(part, schema) as writer:
        for table in groups:
            writer.write_table(table.cast(schema), row_group_size=len(table))
    location = resolve(url)
    info = read_info(location).to_dict()   # a copy to edit
    for entry in info["files"].values():
        for key in ("row_group_xxh3", "footer_xxh3", "xxh3"):
            entry.pop(key)
    info["files"]["part-00000.parquet"]["bytes"] = part.stat().st_size
    write_common_metadata(location, info, {n: e["row_groups"] for n, e in info["files"].items()})


def test_a_stored_value_that_is_not_a_jpeg_is_named_with_its_file(noisy_dataset, tmp_path):
    """A dataset without checksums (older pinstorm, or edited) holding a non-JPEG value."""
    pytest.importorskip("tensorflow")
    from pinstorm.pipeline import make_dataset

    url = _copy(noisy_dataset, tmp_path)

    def edit(images):
        images[2] = b"<html>gone</html>"
        images[4] = images[4][:len(images[4]) // 2]

    _rewrite_without_checksums(url, edit)
    victim = pq.ParquetFile(url / "part-00000.parquet").read_row_group(1).column("filename")[2].as_py()
    rows, error = _iterate(make_dataset(url, batch_size=4, training=False, shuffle=False, image_size=(16, 16)))
    assert f"part-00000.parquet row group 1: row 2 ({victim}) is not a JPEG (first bytes: b'<html>gone</html'); " \
           "2 such row(s) in this row group" in error, error
    with pytest.raises(UndecodableImage, match=rf"part-00000\.parquet row group 1: {victim}: not an image"):
        verify_dataset(url, decode=True)


def _with_frame_size(jpeg: bytes, height: int, width: int) -> bytes:
    """`jpeg` with its baseline frame header claiming `height` x `width`: what a hostile writer stores."""
    at = jpeg.index(b"\xff\xc0")
    return jpeg[:at + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + jpeg[at + 9:]


def test_the_frame_header_gives_the_size_pillow_reads():
    from pinstorm.pipeline.epochs import jpeg_size

    exif = Image.Exif()
    exif[0x010F] = "camera " * 900   # a 6 KB APP1 segment before the frame header
    for size, options in [((96, 80), {}), ((333, 17), {"progressive": True}), ((640, 480), {"exif": exif.tobytes()})]:
        data = io.BytesIO()
        Image.new("RGB", size, (90, 20, 200)).save(data, "JPEG", **options)
        assert jpeg_size(data.getvalue()) == (size[1], size[0])
    assert jpeg_size(b"\xff\xd8\xff\xe0\x00") is None   # cut before any frame header
    data = io.BytesIO()
    Image.new("RGB", (40, 30)).save(data, "JPEG")
    data = data.getvalue()
    at = data.index(b"\xff\xc0")
    hidden = data[:at] + b"\x00garbage\x00" + data[at:]   # libjpeg skips such bytes to the next marker
    assert jpeg_size(_with_frame_size(hidden, 60_000, 60_000)) == (60_000, 60_000)


def test_make_dataset_refuses_an_image_over_max_pixels_before_decoding_it(noisy_dataset, tmp_path):
    """A checksum says nothing of an image's size: a frame header claiming 60000x60000 (10.8 GB to decode)
    is refused by its header, named with its part, row group and file, before TensorFlow allocates a byte
    for it; `max_pixels` also bounds genuine images, and None reads them all."""
    pytest.importorskip("tensorflow")
    from pinstorm.pipeline import make_dataset

    def read(url, **options):
        return _iterate(make_dataset(url, batch_size=4, training=True, shuffle=False, image_size=(16, 16),
                                     **options))

    assert read(noisy_dataset) == (60, "")   # the default bound (40 MP) passes every genuine image
    rows, error = read(noisy_dataset, max_pixels=96 * 80 - 1)
    assert rows == 0 and re.search(r"part-0000\d\.parquet row group 0: row 0 \(.+\.JPEG\) is too large to decode: "
                                   r"96x80 = 0\.0 MP, over max_pixels 0\.0 MP; 10 such row\(s\)", error), error
    assert read(noisy_dataset, max_pixels=None) == (60, "")

    url = _copy(noisy_dataset, tmp_path)

    def edit(images):
        images[3] = _with_frame_size(images[3], 60_000, 60_000)

    _rewrite_without_checksums(url, edit)
    victim = pq.ParquetFile(url / "part-00000.parquet").read_row_group(1).column("filename")[3].as_py()
    rows, error = read(url)
    assert f"part-00000.parquet row group 1: row 3 ({victim}) is too large to decode: 60000x60000 = 3600.0 MP, " \
           "over max_pixels 40.0 MP; 1 such row(s) in this row group" in error, error
    assert rows < 60


def test_a_jpeg_cut_short_is_named_before_libjpeg_fails(noisy_dataset, tmp_path):
    pytest.importorskip("tensorflow")
    from pinstorm.pipeline import make_dataset
    from pinstorm.pipeline.reader import _jpeg_problem

    url = _copy(noisy_dataset, tmp_path)
    rows = read_rows(url, ("image", "filename"))
    assert all(_jpeg_problem(r["image"]) is None for r in rows)
    _rewrite_without_checksums(url, lambda images: images.__setitem__(0, images[0][:-40]))
    victim = pq.ParquetFile(url / "part-00000.parquet").read_row_group(1).column("filename")[0].as_py()
    delivered, error = _iterate(make_dataset(url, batch_size=4, training=False, shuffle=False, image_size=(16, 16)))
    assert f"row group 1: row 0 ({victim}) is truncated JPEG (no end-of-image marker)" in error, error
    assert "Invalid JPEG data" not in error


# ---- issue 8 item 6: private staging for board outputs ------------------------------------------------


def test_board_output_stages_in_a_private_folder_and_publishes_nothing_planted(tmp_path, monkeypatch):
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    planted = shared_tmp / "pinstorm-convert-b-ds"                  # the name the old code used
    (planted / "ds").mkdir(parents=True)
    (planted / "ds" / "evil.parquet").write_bytes(b"planted")
    (planted / "evil.txt").write_text("planted")
    root = _tree(tmp_path / "tree", {"n01": 3, "n02": 3})
    boards.board_register("local", name="b", path=tmp_path / "board")
    modes = []

    def on_part(name, entry):
        staging = [p for p in shared_tmp.iterdir() if p != planted]
        modes.extend(p.stat().st_mode & 0o777 for p in staging)

    convert(root, "board://b/ds", progress=False, on_part=on_part)
    files = [Path(p).name for p in boards.pin_get("ds", board="b")]
    assert "evil.parquet" not in files and "evil.txt" not in files and "part-00000.parquet" in files
    assert modes == [0o700]
    assert sorted(p.name for p in shared_tmp.iterdir()) == ["pinstorm-convert-b-ds"]   # staging removed
    assert dataset_info("board://b/ds")["rows"] == 6


# ---- issue 11: petastorm metadata without petastorm ----------------------------------------------------


def test_convert_writes_petastorm_metadata_without_importing_petastorm_or_pyspark(tmp_path):
    _tree(tmp_path / "tree", {"n01": 2, "n02": 2})
    script = textwrap.dedent(f"""
        import sys
        from pinstorm.pipeline import convert, dataset_info
        convert({str(tmp_path / "tree")!r}, {str(tmp_path / "ds")!r}, progress=False)
        heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"petastorm", "pyspark", "tensorflow", "cv2"}})
        print("IMPORTED", heavy)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "IMPORTED []" in done.stdout
    kv = pq.read_metadata(tmp_path / "ds" / COMMON_METADATA).metadata
    assert kv[b"dataset-toolkit.unischema.v1"] == petastorm_unischema_pickle()
    assert json.loads(kv[b"dataset-toolkit.num_row_groups_per_file.v1"]) == {"part-00000.parquet": 4}


def test_the_pickled_unischema_is_what_petastorm_builds():
    pytest.importorskip("petastorm")
    from petastorm.etl.legacy import depickle_legacy_package_name_compatible

    from pinstorm.pipeline.metadata import unischema

    ours = depickle_legacy_package_name_compatible(petastorm_unischema_pickle())   # petastorm's own loader
    real = unischema()
    assert type(ours) is type(real) and ours._name == real._name and list(ours.fields) == list(real.fields)
    assert vars(ours).keys() == vars(real).keys()
    for mine, theirs in zip(ours.fields.values(), real.fields.values()):
        assert type(mine) is type(theirs) and mine == theirs
        assert mine.numpy_dtype is theirs.numpy_dtype and mine.shape == theirs.shape
        assert type(mine.codec) is type(theirs.codec) and vars(mine.codec) == vars(theirs.codec)
    assert ours.image == real.image


# ---- properties ------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(images=st.lists(st.binary(max_size=40), max_size=25), cut=st.integers(0, 25), data=st.data())
def test_content_checksum_is_the_same_however_the_rows_are_held(images, cut, data):
    """pyarrow tables (one chunk, several, sliced, large_binary) and petastorm's Python rows agree."""
    import pyarrow as pa

    from pinstorm.pipeline.verify import rows_digest, table_digest

    labels = data.draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=len(images), max_size=len(images)))
    table = pa.table({"image": pa.array(images, pa.binary()), "label": pa.array(labels, pa.int32())})
    cut = min(cut, len(images))
    chunked = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    large = table.cast(pa.schema([("image", pa.large_binary()), ("label", pa.int32())]))
    digest = rows_digest(images, labels)
    assert table_digest(table) == table_digest(chunked) == table_digest(large) == digest
    assert table_digest(table.slice(cut)) == rows_digest(images[cut:], labels[cut:])
    if images:   # moving a byte from one image to the next is a different row group
        moved = [images[0] + b"x"] + images[1:]
        assert rows_digest(moved, labels) != digest


@settings(max_examples=40, deadline=None)
@given(cut=st.floats(0, 1, exclude_max=True), progressive=st.booleans())
def test_every_cut_off_jpeg_is_named_truncated(cut, progressive):
    from pinstorm.pipeline.reader import _jpeg_problem

    data = _jpeg(7, (64, 48), progressive=progressive)
    assert _jpeg_problem(data) is None
    assert _jpeg_problem(data[:int(len(data) * cut)]) is not None
