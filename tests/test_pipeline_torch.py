"""make_torch_loader: the rows of make_dataset, in PyTorch: shapes, shards, workers, exact epochs, order, trust."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pinstorm import boards
from pinstorm.pipeline import CorruptPartError, IncompleteEpochError, UndecodableImage, convert, dataset_info
from pipeline_support import IMAGE_SIZE, read_rows

pytest_plugins = ["conftest_pipeline"]
torch = pytest.importorskip("torch")

from pinstorm.pipeline import make_torch_loader  # noqa: E402 (only with torch installed)
from pinstorm.pipeline.torch_loader import decode_window, eval_window, open_jpeg  # noqa: E402


def _fingerprints(loader) -> Counter:
    """Rows as (label, hash of pixels): exact in eval mode at the stored size (no crop, no resize)."""
    prints = Counter()
    for images, labels in loader:
        pixels = np.round(images.permute(0, 2, 3, 1).numpy() * 255).astype(np.uint8)
        for image, label in zip(pixels, labels.tolist()):
            prints[(label, hashlib.sha1(image.tobytes()).hexdigest())] += 1
    return prints


def _exact(url, **kw):
    return make_torch_loader(url, batch_size=50, image_size=IMAGE_SIZE, training=False, eval_crop=1.0, **kw)


@pytest.fixture(scope="module")
def stored_fingerprints(digits_dataset):
    """What every row decodes to with Pillow, straight from the stored bytes."""
    url, _ = digits_dataset
    prints = Counter()
    for row in read_rows(url, columns=("image", "label")):
        pixels = np.asarray(Image.open(io.BytesIO(row["image"])).convert("RGB"))
        prints[(row["label"], hashlib.sha1(pixels.tobytes()).hexdigest())] += 1
    return prints


def test_workers_under_a_tmpdir_too_deep_for_their_socket_are_refused_not_left_waiting(digits_dataset, tmp_path):
    """A worker hands each batch over through a Unix socket under TMPDIR; where its path is too long, torch's
    DataLoader waited forever (a test runner's deep temporary folders did it). The loader says so instead."""
    url, _ = digits_dataset
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    script = textwrap.dedent(f"""
        from pinstorm.pipeline import make_torch_loader
        from pinstorm.pipeline import WorkerHandoverError
        loader = make_torch_loader({str(url)!r}, batch_size=8, image_size=16, num_workers=1)
        try:
            next(iter(loader))
        except WorkerHandoverError as error:
            print("REFUSED", error)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(deep)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "REFUSED" in done.stdout and "TMPDIR" in done.stdout and str(deep) in done.stdout, done.stdout
    assert not list(deep.iterdir())   # the probe socket and multiprocessing's folder are gone


def test_batches_shapes_dtypes_and_range(digits_dataset):
    url, result = digits_dataset
    batches = list(make_torch_loader(url, batch_size=32, image_size=(40, 56), seed=0))
    assert sum(len(y) for _, y in batches) == result.rows
    images, labels = batches[0]
    assert images.shape == (32, 3, 40, 56) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert images.is_contiguous()
    assert float(images.min()) >= 0.0 and float(images.max()) <= 1.0
    assert float(images.max()) > 0.9 and float(images.min()) < 0.3   # ink on paper
    assert len(batches[-1][1]) == result.rows % 32   # a partial last batch unless asked otherwise
    assert set(torch.cat([y for _, y in batches]).tolist()) == set(range(dataset_info(url)["num_classes"]))

    full = list(make_torch_loader(url, batch_size=32, image_size=24, drop_remainder=True, seed=0))
    assert {tuple(x.shape) for x, _ in full} == {(32, 3, 24, 24)} and len(full) == result.rows // 32


def test_every_row_once_per_epoch_and_exact_epochs(digits_dataset, stored_fingerprints):
    url, _ = digits_dataset
    assert _fingerprints(_exact(url, seed=1)) == stored_fingerprints
    twice = _fingerprints(_exact(url, num_epochs=2, seed=1))
    assert twice == Counter({k: 2 * v for k, v in stored_fingerprints.items()})


def test_shards_are_disjoint_and_cover_every_row(digits_dataset, stored_fingerprints):
    url, _ = digits_dataset
    shards = [_fingerprints(_exact(url, shard=(i, 2), seed=2)) for i in range(2)]
    assert sum(shards, Counter()) == stored_fingerprints
    info = dataset_info(url)
    assert [sum(s.values()) for s in shards] == [sum(info["row_group_rows"][i::2]) for i in range(2)]


def test_two_workers_deliver_every_row_once_per_epoch(digits_dataset, stored_fingerprints):
    url, _ = digits_dataset
    assert _fingerprints(_exact(url, num_workers=2, seed=3)) == stored_fingerprints
    assert _fingerprints(_exact(url, num_workers=2, num_epochs=2, shuffle=False)) == Counter(
        {k: 2 * v for k, v in stored_fingerprints.items()})
    # Workers split a shard, not the dataset: shard 1 of 2 read by two workers is shard 1 of 2.
    assert _fingerprints(_exact(url, num_workers=2, shard=(1, 2), seed=3)) == _fingerprints(
        _exact(url, shard=(1, 2), seed=3))


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_the_caller_keeps_are_never_written_over(digits_dataset, workers):
    """Float batches come from reused memory (`BatchMemory`), but only once nothing holds any part of them:
    a batch kept, or a view of it kept, stays as delivered; memory let go of is used again."""
    url, _ = digits_dataset
    kept, views = [], []
    for images, _ in _exact(url, num_workers=workers, num_epochs=2, seed=3):
        kept.append((images, images.clone()))
    for images, _ in _exact(url, num_workers=workers, num_epochs=2, seed=3):
        views.append((images[:2, 0], images[:2, 0].clone()))
    assert len(kept) > 4 and all(torch.equal(batch, copy) for batch, copy in kept)
    assert all(torch.equal(view, copy) for view, copy in views)
    assert all(torch.equal(view, batch[:2, 0]) for (view, _), (batch, _) in zip(views, kept))
    addresses = [images.data_ptr() for images, _ in _exact(url, num_workers=workers, num_epochs=2, seed=3)]
    assert len(set(addresses)) < len(addresses) / 2


@pytest.mark.parametrize("workers", [0, 2])
def test_uint8_batches_are_the_float_ones_unscaled(digits_dataset, workers):
    """Workers hand over uint8 scaled by the caller; without workers the decoding threads scale: the same pixels."""
    url, _ = digits_dataset
    floats = [(x.clone(), y) for x, y in _exact(url, num_workers=workers, seed=4)]
    raw = list(_exact(url, num_workers=workers, seed=4, dtype=torch.uint8))
    assert [len(y) for _, y in raw] == [len(y) for _, y in floats]
    assert all(f.dtype == torch.float32 and 0 <= float(f.min()) and float(f.max()) <= 1 for f, _ in floats)
    assert all(x.dtype == torch.uint8 and torch.equal(x.float().mul_(1 / 255), f)
               for (x, _), (f, _) in zip(raw, floats))
    with pytest.raises(ValueError, match="dtype must be"):
        make_torch_loader(url, batch_size=8, dtype=torch.float16)


def test_the_in_process_reader_stops_its_threads_and_leaves_torch_threads_alone(digits_dataset):
    """Without workers, batches are made ahead in a thread and decoded by others: stopping early ends
    them, and the caller's torch thread setting is what it was."""
    import threading

    url, _ = digits_dataset
    threads = torch.get_num_threads()
    for _ in _exact(url, num_epochs=3, seed=5, decode_threads=2):
        break
    left = [t.name for t in threading.enumerate() if t.name.startswith(("pinstorm-batches", "pinstorm-decode"))]
    assert left == [] and torch.get_num_threads() == threads
    def batches(threads):
        loader = make_torch_loader(url, batch_size=50, image_size=24, seed=5, decode_threads=threads)   # crops, flips
        return [(x.clone(), y) for x, y in loader]

    one, three = batches(1), batches(3)
    assert len(one) == len(three) and all(torch.equal(a, c) and torch.equal(b, d)   # threads change nothing
                                          for (a, b), (c, d) in zip(one, three))
    with pytest.raises(ValueError, match="decode_threads"):
        make_torch_loader(url, batch_size=8, decode_threads=0)


def test_same_rows_in_the_same_order_as_make_dataset(digits_dataset):
    pytest.importorskip("tensorflow")
    from pinstorm.pipeline import make_dataset

    url, _ = digits_dataset
    for shard in (None, (1, 2)):
        kw = dict(batch_size=64, image_size=(32, 32), training=False, shuffle=False, shard=shard, seed=5)
        tf_batches = [(x.numpy(), y.numpy()) for x, y in make_dataset(url, **kw)]
        torch_batches = [(x.permute(0, 2, 3, 1).numpy(), y.numpy()) for x, y in make_torch_loader(url, **kw)]
        tf_labels = np.concatenate([y for _, y in tf_batches])
        assert np.concatenate([y for _, y in torch_batches]).tolist() == tf_labels.tolist()
        # The same source rows, cropped and resized alike: each image is within rounding of TensorFlow's
        # (another libjpeg build and IDCT), and far from its neighbour.
        tf_images = np.concatenate([x for x, _ in tf_batches])
        torch_images = np.concatenate([x for x, _ in torch_batches])
        same = np.abs(tf_images - torch_images).mean(axis=(1, 2, 3))
        shifted = np.abs(tf_images[1:] - torch_images[:-1]).mean(axis=(1, 2, 3))
        assert same.max() < 0.015 and same.mean() < 0.005 and np.median(shifted) > 10 * same.max(), (
            same.max(), same.mean(), np.median(shifted))
    assert tf_labels.tolist() == [r["label"] for g, r in _rows_by_group(url) if g % 2 == 1]


def _rows_by_group(url):
    """(global row-group index, row) in stored order."""
    import pyarrow.parquet as pq

    g = 0
    for part in sorted(Path(url).glob("part-*.parquet")):
        handle = pq.ParquetFile(part)
        for rg in range(handle.num_row_groups):
            for row in handle.read_row_group(rg, columns=["label"]).to_pylist():
                yield g, row
            g += 1


def test_a_seed_repeats_order_and_augmentation(digits_dataset):
    url, _ = digits_dataset
    run = lambda **kw: list(make_torch_loader(url, batch_size=64, image_size=(24, 24), **kw))  # noqa: E731
    a, b = run(seed=7), run(seed=7)
    assert all(torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in zip(a, b))
    c = run(seed=8)
    assert not torch.equal(torch.cat([y for _, y in a]), torch.cat([y for _, y in c]))
    a2, b2 = run(seed=7, num_workers=2), run(seed=7, num_workers=2)
    assert all(torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in zip(a2, b2))
    stored = [r["label"] for r in read_rows(url)]
    shuffled = torch.cat([y for _, y in a]).tolist()
    assert shuffled != stored and sorted(shuffled) == sorted(stored)

    loader = make_torch_loader(url, batch_size=64, image_size=(24, 24), seed=7)
    first = torch.cat([y for _, y in loader])
    loader.dataset.set_epoch(1)
    assert not torch.equal(first, torch.cat([y for _, y in loader]))   # the next epoch's own order


def _flip(path: Path, fraction: float, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    at = int(len(data) * fraction)
    for i in range(at, at + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupted_row_group_is_named_before_any_of_its_rows(digits_dataset, tmp_path, workers):
    from pinstorm.pipeline import verify_dataset

    url = tmp_path / "copy"
    shutil.copytree(digits_dataset[0], url)
    _flip(url / "part-00001.parquet", 0.5)
    with pytest.raises(CorruptPartError) as caught:
        verify_dataset(url)
    bad = str(caught.value).split(": ")[0]   # <url>/part-00001.parquet row group N
    assert "part-00001.parquet row group" in bad
    with pytest.raises(CorruptPartError, match=r"part-00001\.parquet row group \d+: checksum mismatch"):
        for _ in make_torch_loader(url, batch_size=8, image_size=16, training=False, shuffle=False,
                                   num_workers=workers):
            pass


def test_an_epoch_short_of_its_rows_raises(digits_dataset, tmp_path):
    """A dataset without checksums whose part lost a row: counting the epoch catches it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pinstorm.pipeline.metadata import read_info, write_common_metadata
    from pinstorm.pipeline.storage import resolve

    url = tmp_path / "short"
    shutil.copytree(digits_dataset[0], url)
    part = url / "part-00001.parquet"
    handle = pq.ParquetFile(part)
    groups = [handle.read_row_group(g) for g in range(handle.num_row_groups)]
    schema = handle.schema_arrow
    groups[-1] = groups[-1].slice(1)
    with pq.ParquetWriter(part, schema) as writer:
        for table in groups:
            writer.write_table(pa.Table.from_batches(table.to_batches(), schema), row_group_size=len(table))
    location = resolve(url)
    info = read_info(location).to_dict()   # a copy to edit
    for entry in info["files"].values():
        entry.pop("row_group_xxh3"), entry.pop("footer_xxh3")
    info["files"]["part-00001.parquet"]["bytes"] = part.stat().st_size
    write_common_metadata(location, info, {n: e["row_groups"] for n, e in info["files"].items()})
    with pytest.raises(IncompleteEpochError, match=r"delivered \d+ rows, expected \d+"):
        for _ in make_torch_loader(url, batch_size=64, image_size=16, seed=0):
            pass


def test_a_board_url_is_read(digits_layout, tmp_path):
    boards.board_register("local", name="b", path=tmp_path / "board")
    classes = digits_layout.classes[:2]
    rows = [(p, w) for w in classes for p, _ in [r for r in digits_layout.train if r[1] == w][:12]]
    data = {"image": [p for p, _ in rows], "category": [w for _, w in rows], "classes": classes,
            "categories": classes}
    convert(data, "board://b/digits", min_row_groups=2, progress=False)
    batches = list(make_torch_loader("board://b/digits", batch_size=10, image_size=16, num_workers=2, seed=0))
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == [0] * 12 + [1] * 12
    assert batches[0][0].shape[1:] == (3, 16, 16)


def _jpeg(width: int, height: int) -> bytes:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).resize((width, height), Image.BILINEAR).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def test_reduced_scale_decode_is_used_when_the_window_allows():
    data = _jpeg(96, 80)
    cases = {(80, 96): 1, (40, 48): 2, (20, 24): 4, (10, 12): 8, (5, 6): 8, (21, 24): 2}
    for size, ratio in cases.items():
        image = open_jpeg(data)
        out, used = decode_window(image, (0, 0, 96, 80), size)
        assert used == ratio and image.size == (96, 80), (size, used, image.size)   # the header's size
        assert tuple(out.shape) == (3, *size) and out.dtype == torch.uint8
    image = open_jpeg(data)
    assert decode_window(image, (0, 0, 96, 80), (10, 12), dct_scale=False)[1] == 1 and image.size == (96, 80)
    # A centre window of half the image at 1/4 scale: the window is mapped into scaled pixels.
    window = eval_window(96, 80, (10, 10), 0.5)
    assert window == (28, 20, 40, 40)
    scaled, used = decode_window(open_jpeg(data), window, (10, 10))
    full, _ = decode_window(open_jpeg(data), window, (10, 10), dct_scale=False)
    assert used == 4 and float((scaled.float() - full.float()).abs().mean()) < 12


def test_pixels_are_bounded_before_decoding():
    data = _jpeg(96, 80)
    image = open_jpeg(data)
    _, used = decode_window(image, (0, 0, 96, 80), (80, 96), max_pixels=96 * 80 // 3)   # 1/2 scale fits
    assert used == 2
    with pytest.raises(UndecodableImage, match="too large to decode"):
        decode_window(open_jpeg(data), (0, 0, 96, 80), (80, 96), max_pixels=100)   # even 1/8 is 12x10
    with pytest.raises(UndecodableImage, match="not an image|cannot identify"):
        open_jpeg(b"\xff\xd8\xff" + b"\x00" * 40)


def test_an_image_over_the_pixel_budget_is_refused_naming_its_row_group(digits_dataset):
    url, _ = digits_dataset   # 48x48 digits: 6x6 = 36 pixels even at 1/8 scale
    with pytest.raises(UndecodableImage, match=r"part-0000\d\.parquet row group \d+: an image: too large to decode"):
        next(iter(make_torch_loader(url, batch_size=8, image_size=48, training=False, max_pixels=30)))
    assert len(next(iter(make_torch_loader(url, batch_size=8, image_size=6, training=False, max_pixels=36)))[1]) == 8


def test_refuses_bad_arguments(digits_dataset, tmp_path):
    url, _ = digits_dataset
    with pytest.raises(ValueError, match="batch_size"):
        make_torch_loader(url, batch_size=0)
    with pytest.raises(ValueError, match="num_workers"):
        make_torch_loader(url, batch_size=8, num_workers=-1)
    with pytest.raises(ValueError, match="8 row groups, fewer than 9 shards"):
        make_torch_loader(url, batch_size=8, shard=(0, 9))
    with pytest.raises(FileNotFoundError, match="no such dataset"):
        make_torch_loader(tmp_path / "nothing", batch_size=8)


def test_torch_is_imported_only_on_demand_and_named_when_missing():
    script = textwrap.dedent("""
        import sys
        import pinstorm.pipeline
        assert "torch" not in sys.modules, "import pinstorm.pipeline imported torch"
        sys.modules["torch"] = None          # as if torch were not installed
        from pinstorm.errors import MissingExtra
        try:
            from pinstorm.pipeline import make_torch_loader
        except MissingExtra as error:
            print("MISSING", error)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MISSING" in done.stdout and "pinstorm[torch]" in done.stdout, done.stdout
