"""`make_torch_loader(decode="gpu")`: the device path run on the CPU (``device="cpu"``, libjpeg-turbo standing
in for nvJPEG), compared with ``decode="cpu"`` for the same seed: the same rows, labels, sample IDs, windows and
flips; pixels within the stated tolerance; the same named errors and bounds. Without CUDA, ``decode="gpu"``
says so once and decodes on the CPU. (nvJPEG itself runs in `bench/gpu_check.py` on a lent GPU.)"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from pinstorm.pipeline import (UndecodableImage, convert, make_imagenet_size_tree, make_torch_loader,  # noqa: E402
                               scan)
from pinstorm.pipeline.options import ReaderOptionError  # noqa: E402


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """24 ImageNet-size JPEGs (~500x375): crops large enough for the CPU path's DCT reduction."""
    base = tmp_path_factory.mktemp("device-decode")
    layout = scan(make_imagenet_size_tree(base / "tree", classes=2, per_class=12, seed=0))
    return convert(layout, str(base / "ds"), split="train", progress=False).url


def _both(url, **options):
    cpu = list(make_torch_loader(url, return_ids=True, **options))
    device = list(make_torch_loader(url, return_ids=True, decode="gpu", device="cpu", **options))
    assert len(cpu) == len(device) > 0
    for (_, labels, ids), (_, device_labels, device_ids) in zip(cpu, device):
        assert torch.equal(labels, device_labels) and torch.equal(ids, device_ids)   # the same rows, in order
    return (torch.cat([b[0] for b in cpu]), torch.cat([b[0] for b in device]))


@pytest.mark.parametrize("training", [True, False])
def test_without_dct_reduction_every_pixel_agrees_within_one_level(photos, training):
    cpu, device = _both(photos, batch_size=8, image_size=96, seed=3, training=training, dct_scale=False)
    assert device.dtype == torch.float32 and device.shape == cpu.shape
    assert float((cpu - device).abs().max()) <= 1.01 / 255   # the same window and flip; rounding alone


@pytest.mark.parametrize("training", [True, False])
def test_with_dct_reduction_the_same_window_is_read_and_pixels_agree_on_average(photos, training):
    """The CPU path decodes a crop twice the target or more at 1/2..1/8 DCT scale; a device decodes it whole
    and resizes it antialiased: the same part of the image, pixels within a mean of 3 levels of 255."""
    cpu, device = _both(photos, batch_size=8, image_size=96, seed=3, training=training)
    difference = (cpu - device).abs() * 255
    assert float(difference.mean()) <= 3.0
    flipped = (cpu - device.flip(-1)).abs().mean() * 255   # a flip or a shifted window would show
    assert float(flipped) > 4 * float(difference.mean())


def test_uint8_batches_and_workers(photos):
    cpu = torch.cat([b[0] for b in make_torch_loader(photos, batch_size=8, image_size=64, seed=1, dtype=torch.uint8,
                                                        dct_scale=False)])
    device = torch.cat([b[0] for b in make_torch_loader(photos, batch_size=8, image_size=64, seed=1,
                                                           dtype=torch.uint8, dct_scale=False, decode="gpu",
                                                           device="cpu")])
    assert device.dtype == torch.uint8 and int((cpu.int() - device.int()).abs().max()) <= 1
    with_workers = list(make_torch_loader(photos, batch_size=8, image_size=64, seed=1, num_workers=2, decode="gpu",
                                          device="cpu", return_ids=True))
    assert sorted(int(i) for b in with_workers for i in b[2]) == list(range(24))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cpu_share_decodes_that_share_of_the_batches_on_the_cpu_exactly_as_decode_cpu(photos, workers):
    """`cpu_share=0.5`: every other batch of each stream is decoded by the workers whole, pixel for pixel what
    ``decode="cpu"`` gives; the rest on the device; the same rows, labels and IDs, each sample once."""
    options = dict(batch_size=4, image_size=64, seed=2, num_workers=workers, dct_scale=False, return_ids=True)
    cpu = list(make_torch_loader(photos, **options))
    split = list(make_torch_loader(photos, decode="gpu", device="cpu", cpu_share=0.5, **options))
    assert len(cpu) == len(split) == (6 if workers == 0 else 7)   # two streams: 12 + 12 rows, the last partial
    for (images, labels, ids), (split_images, split_labels, split_ids) in zip(cpu, split):
        assert torch.equal(labels, split_labels) and torch.equal(ids, split_ids)
        assert split_images.dtype == torch.float32 and float((images - split_images).abs().max()) <= 1.01 / 255
    exact = [torch.equal(a[0], b[0]) for a, b in zip(cpu, split)]
    # stream 0's batches 1, 3, 5 are the CPU's, stream 1's 0, 2, 4 (shifted by one); streams are taken in turn
    assert exact == ([False, True] * 3 if workers == 0 else [False, True, True, False, False, True, True])
    cpu_uint8 = list(make_torch_loader(photos, dtype=torch.uint8, **options))
    whole = list(make_torch_loader(photos, decode="gpu", device="cpu", cpu_share=1, dtype=torch.uint8, **options))
    assert all(torch.equal(a[0], b[0]) and b[0].dtype == torch.uint8 for a, b in zip(cpu_uint8, whole))
    with pytest.raises(ReaderOptionError, match="cpu_share must be a number from 0 to 1"):
        make_torch_loader(photos, batch_size=4, decode="gpu", device="cpu", cpu_share=1.5)
    with pytest.raises(ReaderOptionError, match="splits decode='gpu'"):
        make_torch_loader(photos, batch_size=4, cpu_share=0.5)


def test_without_cuda_gpu_decode_says_so_once_and_decodes_on_the_cpu(photos):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = make_torch_loader(photos, batch_size=8, image_size=32, seed=0, decode="gpu")
    assert [str(w.message) for w in seen] == ["decode='gpu': no CUDA device here; decoding on the CPU"]
    plain = make_torch_loader(photos, batch_size=8, image_size=32, seed=0)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(loader, plain))
    with pytest.raises(ReaderOptionError, match="decode must be one of"):
        make_torch_loader(photos, batch_size=8, decode="nvjpeg")


def test_a_jpeg_whose_body_is_broken_is_an_undecodable_image_naming_it():
    """The header parses (the loader's threads accept it), the body is cut: the device decode names the image."""
    import io

    import numpy as np
    from PIL import Image

    from pinstorm.pipeline.device_decode import DeviceDecoder, JpegBatch

    buffer = io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((64, 64, 3)) * 255).astype("uint8")).save(buffer, "JPEG")
    good, cut = buffer.getvalue(), buffer.getvalue()[:300]
    batch = JpegBatch(2)
    batch[0].fill(good, (0, 0, 64, 64), 1, False, "ds part-00000 row group 0: an image")
    batch[1].fill(cut, (0, 0, 64, 64), 1, False, "ds part-00000 row group 1: an image")
    from pinstorm.pipeline.torch_loader import decode_whole

    decoder = DeviceDecoder("cpu", (32, 32), torch.float32, cpu_decode=decode_whole)
    assert decoder(batch[:1]).shape == (1, 3, 32, 32)
    with pytest.raises(UndecodableImage, match="ds part-00000 row group 1: an image"):
        decoder(batch)


def test_an_image_over_max_pixels_is_refused_before_it_is_decoded(photos):
    with pytest.raises(UndecodableImage, match="too large to decode on the device: .* over max_pixels 0.1 MP"):
        list(make_torch_loader(photos, batch_size=8, image_size=32, decode="gpu", device="cpu", max_pixels=100_000))


def test_a_jpeg_batch_crosses_processes_as_one_tensor_of_bytes():
    """One shared-memory segment a batch, not one per image (a descriptor hand-over each held an H200 at
    1,900 img/s): pickled, the bytes travel packed, and each sample's bytes come back as they were."""
    import pickle

    from pinstorm.pipeline.device_decode import JpegBatch

    samples = [bytes([i]) * (10 + i) for i in range(5)]
    batch = JpegBatch(5)
    for i, data in enumerate(samples):
        batch[i].fill(data, (0, 0, 8, 8), 1, i % 2 == 1, f"image {i}")
    state = batch.__getstate__()
    assert [name for name, value in state.items() if isinstance(value, torch.Tensor)] == ["windows", "flips"]
    packed, offsets = state["_packed"]
    assert packed.numel() == sum(map(len, samples)) and offsets.tolist()[-1] == packed.numel()
    back = pickle.loads(pickle.dumps(batch))
    assert [bytes(t.numpy()) for t in back.data] == samples and back.flips.tolist() == [False, True] * 2 + [False]


def _windows_and_images(seed: int):
    """Images of mixed shapes (some shared: stacked; some alone: padded) and every kind of window: down- and
    upscaled, exact size, one pixel, at the edges, flipped or not, antialiased (DCT ratio > 1) or not."""
    import random

    from pinstorm.pipeline.device_decode import JpegBatch

    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    shapes = [(75, 100)] * 4 + [(100, 75)] * 3 + [(40, 30), (130, 90), (33, 50), (200, 140), (48, 64), (9, 7)]
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator) for h, w in shapes]
    batch = JpegBatch(len(images))
    for i, (h, w) in enumerate(shapes):
        crop_w, crop_h = [(rng.randint(1, w), rng.randint(1, h)), (w, h), (1, 1), (min(w, 32), min(h, 24))][i % 4]
        x, y = rng.choice([(0, 0), (w - crop_w, h - crop_h), (rng.randint(0, w - crop_w), rng.randint(0, h - crop_h))])
        batch[i].fill(b"", (x, y, crop_w, crop_h), rng.choice([1, 1, 2, 4]), rng.random() < 0.5, f"image {i}")
    return images, batch


@pytest.mark.parametrize("size", [(24, 32), (48, 48)])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_batched_crop_and_resize_is_the_per_image_one(size, seed):
    """One grid_sample (bilinear) or one separable matrix product (antialiased) a group of images gives what
    ``interpolate`` gives image by image, crops, flips and all: float rounding apart."""
    from pinstorm.pipeline.device_decode import DeviceDecoder

    images, batch = _windows_and_images(seed)
    assert {bool(r > 1) for r in batch.windows[:, 4]} == {True, False} and batch.flips.any() and not batch.flips.all()
    batched = DeviceDecoder("cpu", size, torch.float32).finish(images, batch)
    reference = DeviceDecoder("cpu", size, torch.float32, batched=False).finish(images, batch)
    assert batched.shape == (len(images), 3, *size)
    assert float((batched - reference).abs().max()) * 255 < 0.02
    as_bytes = DeviceDecoder("cpu", size, torch.uint8).finish(images, batch)
    assert as_bytes.dtype == torch.uint8 and int((as_bytes.int() - (reference * 255).round().int()).abs().max()) <= 1


def test_images_are_grouped_by_kind_and_shape_within_bounds():
    from pinstorm.pipeline.device_decode import _groups

    shapes = [(375, 500)] * 7 + [(500, 375)] * 2 + [(100, 80), (2000, 1500), (90, 120), (333, 500), (10, 10)]
    kinds = [False, True] * 7   # of the 7 of one shape, 4 of one kind (3 to a group, then 1) and 3 of the other
    groups = _groups(shapes, kinds, max_pixels=600_000)
    assert sorted(i for g in groups for i in g) == list(range(len(shapes)))
    for group in groups:
        assert len({kinds[i] for i in group}) == 1
        padded = len(group) * max(shapes[i][0] for i in group) * max(shapes[i][1] for i in group)
        area = sum(shapes[i][0] * shapes[i][1] for i in group)
        assert len(group) == 1 or (padded <= 600_000 and padded <= 2 * area)
    assert [len(g) for g in groups if shapes[g[0]] == (375, 500) and len({shapes[i] for i in g}) == 1] == [3, 1, 3]


def test_an_error_in_the_device_decode_is_raised_naming_the_sample_and_stopping_early_ends_its_threads(photos):
    """The device path runs in two threads (receive and decode; crop and resize): an image its decoder
    refuses is raised to the caller by name, and a caller that stops early leaves no thread behind."""
    import threading

    from pinstorm.pipeline.torch_loader import decode_whole

    def running():
        return [t.name for t in threading.enumerate() if t.name.startswith("pinstorm-")]

    loader = make_torch_loader(photos, batch_size=4, image_size=32, seed=0, decode="gpu", device="cpu")
    calls = []

    def refusing(data, where):
        calls.append(where)
        if len(calls) == 11:
            raise UndecodableImage(f"{where}: the 11th image, refused")
        return decode_whole(data, where)

    loader.device_decoder.cpu_decode = refusing
    with pytest.raises(UndecodableImage, match=r"part-\d+\.parquet row group \d+: an image: the 11th image, refused"):
        list(loader)
    assert running() == []
    for _ in make_torch_loader(photos, batch_size=4, image_size=32, seed=0, num_epochs=3, decode="gpu", device="cpu"):
        break
    assert running() == []
