"""`make_torch_loader`: a converted dataset as a PyTorch ``DataLoader`` of (images, labels), sharded, exact epochs.

The same rows as `make_dataset` (the same shard rule, counted epochs, verified parts and JPEG checks,
all from `pipeline.epochs`), decoded with libjpeg-turbo through simplejpeg instead of TensorFlow:
images float32 ``[B, 3, H, W]`` in [0, 1] (or uint8), labels int64 ``[B]``.

* DataLoader workers (`num_workers` > 0) are processes; each reads a disjoint slice of every
  epoch's row groups (every n-th of the epoch's seeded order), counts its slice, decodes and batches
  it into shared memory as uint8. Together they deliver each row of the shard once per epoch. The
  calling process scales the uint8 batch to float32 in reused memory (`BatchMemory`). Without workers,
  each decoding thread writes its image into the float32 batch itself, scaled while its pixels are
  still in cache.
* Decoding: libjpeg-turbo decodes at 1/2, 1/4 or 1/8 DCT scale when the crop window stays at least
  the target size there (`make_dataset`'s rule), into a reused buffer; the window is then cut out
  and resized as ``tf.image.resize`` does (bilinear, half-pixel centres, no antialiasing) by torch's
  uint8 kernel. No Python library exposes libjpeg-turbo's window decode (``decode_and_crop_jpeg``'s):
  the whole image is decoded, which is most of the CPU time (bench/bench_torch_loader.py). simplejpeg
  decodes the same pixels as Pillow, ~25% faster here; what it refuses goes to Pillow.
* Pixels are bounded before decoding (`images.DEFAULT_MAX_PIXELS`, the converter's rule): a larger
  JPEG is decoded at the DCT scale that fits, or refused if even 1/8 does not.
* Resuming mid-epoch: a sample's ID is its global row number; one stream's epoch is a sequence of IDs
  computed from the row counts alone (`positions.stream_ids`), which the reader delivers; crops and flips are
  seeded per sample (`sample_rng`). So `TorchLoader.state_dict()` (per stream: epoch, samples received)
  is enough to deliver exactly the rest, or, on another shard layout, every sample not yet received once.

Nothing else in pinstorm imports torch; ``import pinstorm.pipeline`` does not import this module
until `make_torch_loader` is asked for. Without torch this module raises `MissingExtra`.
"""

from __future__ import annotations

import collections
import contextlib
import io
import math
import os
import queue
import random
import socket
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from pinstorm.extras import require

from .columns_reader import refuse_tabular
from .errors import InvalidPipelineInput, WorkerHandoverError
from .epochs import check_arguments, epoch_order, epoch_seed, open_epochs
from .options import ASPECT_RANGE, CROP_ATTEMPTS, DEFAULTS as READER, ReaderOptionError
from .device_decode import DeviceDecoder, JpegBatch, check_pixels, resolve as resolve_decode
from .images import DEFAULT_MAX_PIXELS, UndecodableImage, _draft_factor
from .positions import (STATE_FORMAT, Position, ResumeStateError, planned_rows, resume_position,  # noqa: F401
                        row_starts, state_dict, stream_ids)

torch = require("torch", "torch", "pinstorm.pipeline.make_torch_loader")
simplejpeg = require("simplejpeg", "torch", "pinstorm.pipeline.make_torch_loader")

DCT_RATIOS = (1, 2, 4, 8)


def train_window(width: int, height: int, rng: random.Random, crop_area) -> tuple[int, int, int, int]:
    """A random (x, y, w, h) covering `crop_area` of the image with aspect 3/4..4/3, or the whole image
    when `CROP_ATTEMPTS` samples do not fit (as ``sample_distorted_bounding_box`` falls back)."""
    area = width * height
    for _ in range(CROP_ATTEMPTS):
        target = area * rng.uniform(*crop_area)
        aspect = rng.uniform(*ASPECT_RANGE)
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height and crop_area[0] * area <= w * h:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    return 0, 0, width, height


def eval_window(width: int, height: int, size, eval_crop: float) -> tuple[int, int, int, int]:
    """The centred (x, y, w, h): `eval_crop` of the largest window of the target's aspect (`make_dataset`'s)."""
    aspect = size[1] / size[0]
    crop_h = min(height, width / aspect) * eval_crop
    crop_w = max(1, round(crop_h * aspect))
    crop_h = max(1, round(crop_h))
    return (width - crop_w) // 2, (height - crop_h) // 2, crop_w, crop_h


def dct_ratio(window, size, dct_scale: bool = True) -> int:
    """The largest DCT reduction (1, 2, 4, 8) that leaves `window` (x, y, w, h) at least `size`
    (height, width) on both sides: `make_dataset`'s rule."""
    if not dct_scale:
        return 1
    fit = min(window[3] // size[0], window[2] // size[1])
    return max(r for r in DCT_RATIOS if r <= max(fit, 1))


class JpegImage:
    """A JPEG's bytes and its size from the header, nothing decoded yet (`open_jpeg`)."""

    __slots__ = ("data", "size", "where")

    def __init__(self, data, size: tuple[int, int], where: str):
        self.data, self.size, self.where = data, size, where


def open_jpeg(data, where: str = "image") -> JpegImage:
    """The header of a JPEG (width, height: what the crop window is drawn from), or `UndecodableImage`.
    libjpeg-turbo's header reader first; what it refuses, Pillow's (which names the problem better)."""
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                width, height = Image.open(io.BytesIO(data)).size
        except Exception as error:   # Pillow raises several types for broken headers and bombs
            raise UndecodableImage(f"{where}: {error or type(error).__name__}") from None
    return JpegImage(data, (int(width), int(height)), where)


class _DecodeBuffer(threading.local):
    """One decode buffer per thread, grown as needed: a fresh ~0.5 MB array per image costs page faults
    that, in this VM, were a fifth of the decode, and serialised two decoding threads."""

    memory = np.empty(0, dtype=np.uint8)

    def at_least(self, size: int) -> np.ndarray:
        if self.memory.size < size:
            self.memory = np.empty(max(size, 2 * self.memory.size), dtype=np.uint8)
        return self.memory


_decode_buffer = _DecodeBuffer()


def _decode(image: JpegImage, ratio: int) -> np.ndarray:
    """RGB pixels [h, w, 3] of `image` decoded at 1/`ratio` DCT scale by libjpeg-turbo (simplejpeg), into
    this thread's decode buffer (valid until its next decode). A JPEG simplejpeg refuses in a way Pillow
    may not (an odd colour space) goes to Pillow; a broken one is `UndecodableImage` either way."""
    width, height = image.size
    scaled = (math.ceil(height / ratio), math.ceil(width / ratio))
    try:
        return simplejpeg.decode_jpeg(image.data, "RGB", min_height=scaled[0], min_width=scaled[1], min_factor=ratio,
                                      buffer=_decode_buffer.at_least(scaled[0] * scaled[1] * 3))
    except ValueError as error:
        problem = error
    try:   # Pillow: its own colour conversions, the same libjpeg-turbo underneath
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            pillow = Image.open(io.BytesIO(image.data))
            if ratio > 1:
                pillow.draft("RGB", (width // ratio, height // ratio))
            pixels = np.asarray(pillow.convert("RGB"))
    except Exception:
        raise UndecodableImage(f"{image.where}: {problem}") from None
    if pixels.shape[:2] != scaled:
        raise UndecodableImage(f"{image.where}: {problem}")
    return pixels


def decode_whole(data, where: str) -> np.ndarray:
    """RGB pixels [h, w, 3] of a whole JPEG at full scale (the device path's stand-in for nvJPEG on a CPU)."""
    return _decode(open_jpeg(data, where), 1)


def decode_window(image: JpegImage, window, size, *, dct_scale: bool = True,
                  max_pixels: int | None = DEFAULT_MAX_PIXELS, where: str | None = None):
    """(`window` (x, y, w, h) of `image` resized to `size` (height, width): a uint8 tensor [3, H, W], the
    DCT reduction used).

    The reduction is the largest that keeps the window at least `size` (`dct_ratio`), raised if
    needed so the decoded image stays within `max_pixels`; over it even at 1/8: `UndecodableImage`.
    The window is mapped into the reduced image as `make_dataset` maps it (integer pixels, clipped),
    and resized as ``tf.image.resize`` does (bilinear, half-pixel centres, no antialiasing) by torch's
    uint8 kernel: ~3x faster here than Pillow's antialiased resize.
    """
    width, height = image.size
    where = where or image.where
    ratio = dct_ratio(window, size, dct_scale)
    if max_pixels and math.ceil(width / ratio) * math.ceil(height / ratio) > max_pixels:
        ratio = max(ratio, _draft_factor(width, height, max_pixels))
        if math.ceil(width / ratio) * math.ceil(height / ratio) > max_pixels:
            raise UndecodableImage(f"{where}: too large to decode: {width}x{height} = {width * height / 1e6:.1f} MP, "
                                   f"over max_pixels {max_pixels / 1e6:.1f} MP even at 1/8 scale")
    pixels = _decode(image, ratio)
    ratio = round(width / pixels.shape[1])   # what was decoded (the test of the DCT rule)
    x, y, w, h = window
    if ratio > 1:   # as make_dataset's _decode_crop: scaled down, clipped to the scaled image
        x, y = x // ratio, y // ratio
        w = min(max(1, w // ratio), pixels.shape[1] - x)
        h = min(max(1, h // ratio), pixels.shape[0] - y)
    crop = torch.from_numpy(pixels)[y:y + h, x:x + w].permute(2, 0, 1)
    if (h, w) == tuple(size):
        return crop.clone(), ratio   # its own memory: the decode buffer is reused by the next image
    out = torch.nn.functional.interpolate(crop[None], size=tuple(size), mode="bilinear", align_corners=False,
                                          antialias=False)
    return out[0], ratio


def full_size_window(window, ratio: int, width: int, height: int) -> tuple[int, int, int, int]:
    """The full-resolution pixels `decode_window` reads for `window` at 1/`ratio` DCT scale (its window,
    mapped into the scaled image and clipped there, mapped back): what a device decoding at full size
    crops, so both paths see the same part of the image."""
    if ratio == 1:
        return tuple(window)
    x, y, w, h = window
    scaled_w, scaled_h = math.ceil(width / ratio), math.ceil(height / ratio)
    x, y = x // ratio, y // ratio
    w, h = min(max(1, w // ratio), scaled_w - x), min(max(1, h // ratio), scaled_h - y)
    return x * ratio, y * ratio, min(w * ratio, width - x * ratio), min(h * ratio, height - y * ratio)


def sample_rng(seed: int, sample_id: int) -> random.Random:
    """The augmentation of one sample in the epoch of `seed`: its own, whichever stream delivers it and
    wherever in the stream, so a resumed or re-sharded run crops and flips each sample as before."""
    return random.Random((seed << 40) | sample_id)


def _empty(shape, dtype, shared: bool):
    """A tensor for a batch; in a worker process, in shared memory from the start (as torch's own
    collate does, with the same private call), so handing it to the main process copies nothing."""
    empty = torch.empty(0, dtype=dtype)
    if not shared:
        return torch.empty(shape, dtype=dtype)
    try:
        storage = empty.untyped_storage()._new_shared(math.prod(shape) * empty.element_size())
    except AttributeError:   # a torch without it: shared at hand-over instead (one copy)
        return torch.empty(shape, dtype=dtype)
    return empty.set_(storage).view(shape)


def _use_count(tensor) -> int | None:
    """How many tensors share `tensor`'s memory (torch's private count; None where it is missing)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return None if count is None else count(tensor.untyped_storage()._cdata)


class BatchMemory:
    """Batch tensors handed out again once the caller holds no part of them (no view, no reference).

    A fresh float32 batch of 64 x 3 x 224 x 224 is 38 MB, which the allocator maps anew each time, and
    its first touch page-faults: ~0.3 ms per image here, as much as the resize (bench/bench_torch_loader.py).
    Reused memory costs nothing of that. A batch still held (kept in a list, a view alive) is never
    written over: a new one is made, and at most `keep` are remembered.
    """

    def __init__(self, keep: int = 4, pin: bool = False):
        self.keep, self.pin, self.held = keep, pin, []
        self.baseline = None

    def empty(self, shape, dtype):
        for tensor in self.held:
            if tensor.shape == shape and tensor.dtype == dtype and self._holders(tensor) == self.baseline:
                return tensor
        tensor = self._new(shape, dtype)
        self.held.append(tensor)
        if self.baseline is None and _use_count(tensor) is not None:
            self.baseline = self._holders(tensor)   # here, held by nobody but `self.held`
        del self.held[:-self.keep]
        return tensor

    @staticmethod
    def _holders(tensor) -> tuple:
        """(references to the tensor object, tensors sharing its memory): the same call from `empty`
        counts the same frames, so equal to the baseline means the caller let go of it."""
        return sys.getrefcount(tensor), _use_count(tensor)

    def __getstate__(self):   # sent to worker processes: the memory stays here
        return {**self.__dict__, "held": [], "baseline": None}

    def _new(self, shape, dtype):
        if self.pin:
            try:
                return torch.empty(shape, dtype=dtype, pin_memory=True)
            except RuntimeError:   # no accelerator to pin for
                self.pin = False
        return torch.empty(shape, dtype=dtype)


PREFETCH_BATCHES = 2   # batches made ahead in the calling process (num_workers=0)
DEVICE_AHEAD_BATCHES = 2   # decode="gpu": batches decoded on the device ahead of the caller
DEVICE_DECODED_BATCHES = 1   # decode="gpu": batches nvJPEG has decoded ahead of the resize (full-size pixels)


def _one_torch_thread() -> None:
    """For a thread that runs per-image ops: one torch thread (a second doubled their CPU here). OpenMP's
    setting is per thread, so the caller's own setting is untouched once torch has read it (see `_ahead`)."""
    torch.set_num_threads(1)


def default_decode_threads(num_workers: int) -> int:
    """Decoding threads per stream: in the calling process (no workers), this process's share of the CPUs
    (torchrun's LOCAL_WORLD_SIZE ranks share a machine); in each worker process, one."""
    if num_workers:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))


class _Decoder:
    """Decodes rows into their batch slots on `threads` threads, while the next rows are read: libjpeg-turbo
    (simplejpeg) and torch's resize let go of the GIL, so two threads decoded 1.9x as fast as one here.
    With one thread, `submit` decodes at once."""

    def __init__(self, decode_into, threads: int):
        self.decode_into = decode_into
        self.pool = (ThreadPoolExecutor(threads, thread_name_prefix="pinstorm-decode", initializer=_one_torch_thread)
                     if threads > 1 else None)

    def submit(self, *args):
        if self.pool is None:
            self.decode_into(*args)
            return None
        return self.pool.submit(self.decode_into, *args)

    @staticmethod
    def wait(handles) -> None:
        for handle in handles:   # the first error is raised
            if handle is not None:
                handle.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _ahead(make, depth: int, name: str = "pinstorm-batches"):
    """The items of the generator `make()`, made in a thread (`name`) of their own up to `depth` ahead. An
    error there is raised here; when the caller stops early, the thread stops and closes the generator."""
    torch.get_num_threads()   # torch reads its thread setting here first, before the thread sets its own
    items, stop = queue.Queue(depth), threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        _one_torch_thread()
        made = None
        try:
            made = make()
            for item in made:
                if not put((item, None)):
                    return
            put((None, None))
        except BaseException as error:   # handed to the caller, raised there
            put((None, error))
        finally:
            if made is not None:
                made.close()

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item, error = items.get()
            if error is not None:
                raise error
            if item is None:
                return
            yield item
    finally:
        stop.set()
        thread.join()


def check_worker_handover() -> None:
    """Raise `WorkerHandoverError` unless DataLoader workers can hand batches over. A worker passes each batch's
    shared memory (torch's ``file_descriptor`` strategy) through a Unix socket that multiprocessing makes in its
    temporary folder under ``TMPDIR``; where that path is longer than a socket address holds (108 bytes on Linux,
    104 on macOS: a deep ``TMPDIR`` of a batch system or a test runner), the worker drops the batch with a
    traceback on stderr and the loader waits for it forever. Binding a socket of that name there says so first."""
    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor" or not hasattr(socket, "AF_UNIX"):
        return
    import multiprocessing.util

    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "pymp-...", "listener-...")   # named if the folder fails
    try:
        folder = multiprocessing.util.get_temp_dir()   # where multiprocessing.resource_sharer listens
        path = os.path.join(folder, f"listener-{os.getpid() % 10 ** 8:08d}")   # its names: "listener-" + 8 characters
        with socket.socket(socket.AF_UNIX) as probe:
            probe.bind(path)
    except OSError as error:
        raise WorkerHandoverError(
            f"DataLoader workers cannot hand batches over: multiprocessing's socket {path!r} ({len(os.fsencode(path))} "
            f"bytes) cannot be made ({error}); the loader would wait forever. Set TMPDIR to a shorter folder "
            "(e.g. /tmp), or num_workers=0") from error
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


class ParquetImages(torch.utils.data.IterableDataset):
    """Batches of (images float32 [B, 3, H, W], labels int64 [B], sample IDs int64 [B], position) from one
    shard, every epoch counted; `TorchLoader` strips the last two unless asked for the IDs.

    Made by `make_torch_loader`. Run by a DataLoader with workers, each worker process is one stream: it
    reads its own slice of every epoch's row groups. `set_epoch(n)` makes the next pass start at epoch `n`
    (its own row-group order, shuffle and augmentation), for loops that iterate the loader once per epoch.
    """

    def __init__(self, source, *, batch_size, image_size, training, num_epochs, shuffle, shuffle_buffer,
                 crop_area, flip, eval_crop, dct_scale, drop_remainder, max_pixels, streams=1, decode_threads=1,
                 deferred=False, cpu_share=0.0):
        self.source, self.batch_size, self.size = source, batch_size, image_size
        self.training, self.num_epochs, self.shuffle = training, num_epochs, shuffle
        self.shuffle_buffer = shuffle_buffer
        self.crop_area, self.flip, self.eval_crop, self.dct_scale = crop_area, flip, eval_crop, dct_scale
        self.drop_remainder, self.max_pixels = drop_remainder, max_pixels
        self.streams, self.first_epoch, self.decode_threads = streams, 0, max(1, int(decode_threads))
        self.position = Position.fresh(0, streams)   # what the caller has received (kept by TorchLoader)
        self.resume = None                           # a Position the next pass starts from (load_state_dict)
        self.memory = BatchMemory(keep=PREFETCH_BATCHES + 4)   # batches made here (no workers)
        self.dtype = torch.uint8   # of batches made in the calling process (`TorchLoader` sets it); workers': uint8
        self.deferred = deferred   # decode="gpu": batches of JPEG bytes, windows and flips (`device_decode`)
        self.cpu_share = cpu_share if deferred else 0.0   # of those, the share decoded here whole (uint8)

    def set_epoch(self, epoch: int) -> None:
        """The next pass starts at epoch `epoch`; a position loaded for another epoch is dropped."""
        self.first_epoch = int(epoch)
        if self.resume is not None and self.resume.epoch == self.first_epoch:
            return
        self.resume, self.position = None, Position.fresh(self.first_epoch, self.streams)

    def start(self) -> Position:
        """Where the next pass starts: the loaded position, else `first_epoch`'s beginning."""
        return self.resume.copy() if self.resume is not None else Position.fresh(self.first_epoch, self.streams)

    def __iter__(self):
        return self._iterate(getattr(self, "_pass", None) or self.start())

    def _iterate(self, start: Position):
        worker = torch.utils.data.get_worker_info()
        if worker is not None:   # a DataLoader worker process: it runs one torch thread already
            self.source.in_this_process()   # forked: an object store's filesystem is made again here
            yield from self._batches((worker.id, worker.num_workers), start, shared=True)
            return
        # In the calling process: batches are made ahead in a thread of their own (as tf.data prefetches),
        # so decoding overlaps the caller's step.
        yield from _ahead(lambda: self._batches(None, start, shared=False), PREFETCH_BATCHES)

    def ids(self, epoch: int, split=None, consumed=None):
        """`stream_ids` of this shard for `epoch`."""
        return stream_ids(self.source.info, self.source.groups, seed=epoch_seed(self.source.base_seed, epoch),
                          shuffle=self.shuffle, shuffle_buffer=self.shuffle_buffer, split=split, consumed=consumed)

    def _batches(self, split, start: Position, shared: bool):
        """This stream's batches from `start` to the end of the pass, each tagged (stream, epoch, count
        received of that epoch after it, 0), then an empty end-of-stream batch tagged (..., 1)."""
        stream = split[0] if split else 0
        epoch, count = start.streams.get(stream, (start.epoch, 0))
        end = None if self.num_epochs is None else start.epoch + self.num_epochs
        images, labels, ids, filled, pending, made = None, None, None, 0, [], 0
        decoder = _Decoder(self._decode_into, self.decode_threads)
        decoding = collections.deque()   # (decodes under way, batch): one decodes while the next is read
        try:
            while end is None or epoch < end:
                seed = epoch_seed(self.source.base_seed, epoch)
                for sample, jpeg, label in self._planned_rows(epoch, split, count, start.consumed.get(epoch)):
                    if images is None and self.deferred and not self._decoded_here(made, stream):
                        images = JpegBatch(self.batch_size)
                        labels = torch.empty((self.batch_size,), dtype=torch.int64)
                        ids = torch.empty((self.batch_size,), dtype=torch.int64)
                    elif images is None:   # workers: uint8, a quarter of float32's memory to hand over
                        dtype = torch.uint8 if self.deferred else self.dtype
                        images = (_empty((self.batch_size, 3, *self.size), torch.uint8, shared) if shared
                                  else self.memory.empty((self.batch_size, 3, *self.size), dtype))
                        labels = _empty((self.batch_size,), torch.int64, shared)
                        ids = _empty((self.batch_size,), torch.int64, shared)
                    pending.append(decoder.submit(images[filled], jpeg, sample_rng(seed, sample)))
                    labels[filled], ids[filled] = label, sample
                    filled += 1
                    count += 1
                    if filled == self.batch_size:
                        decoding.append((pending, (images, labels, ids, (stream, epoch, count, 0))))
                        images, filled, pending, made = None, 0, [], made + 1
                        if len(decoding) > 1:
                            handles, batch = decoding.popleft()
                            decoder.wait(handles)
                            yield batch
                if end is not None and epoch + 1 == end:
                    break
                epoch, count = epoch + 1, 0
            if filled and not self.drop_remainder:
                decoding.append((pending, (images[:filled], labels[:filled], ids[:filled], (stream, epoch, count, 0))))
            while decoding:
                handles, batch = decoding.popleft()
                decoder.wait(handles)
                yield batch
        finally:
            decoder.close()
        nothing = torch.empty(0)
        yield nothing, nothing, nothing, (stream, epoch, count, 1)

    def _decoded_here(self, made: int, stream: int) -> bool:
        """decode="gpu" with `cpu_share`: whether `stream`'s batch number `made` (of this pass) is decoded here
        whole, as ``decode="cpu"`` decodes it: `cpu_share` of the batches, spread evenly, each stream's pattern
        shifted by its number, so that the workers' slow (CPU-decoded) batches do not all fall in one turn."""
        place = made + stream
        return int((place + 1) * self.cpu_share) > int(place * self.cpu_share)

    def _planned_rows(self, epoch, split, skip: int, consumed):
        """(sample ID, jpeg, label) of `stream_ids` after its first `skip` (`positions.planned_rows`)."""
        order = epoch_order(self.source.groups, epoch_seed(self.source.base_seed, epoch), self.shuffle, split)
        return planned_rows(self.source, self.ids(epoch, split, consumed), order, skip=skip, consumed=consumed,
                            where=self._where(split), epoch=epoch)

    def _where(self, split) -> str:
        shard = self.source.shard
        return (self.source.location.url + (f" shard {shard[0]}/{shard[1]}" if shard else "")
                + (f" split {split[0]}/{split[1]}" if split else ""))

    def _decode_into(self, planes, jpeg, rng: random.Random) -> None:
        """Decode one row into `planes` ([3, H, W], a slice of the batch tensor): uint8, or float32 in [0, 1]
        (scaled here, in the decoding thread, while the pixels are in cache: 0.03 ms an image, against
        0.05 for a whole batch scaled by the calling thread, bench/bench_torch_loader.py)."""
        where = f"{self.source.where}: an image"
        image = open_jpeg(jpeg, where)
        width, height = image.size
        if self.training:
            window = train_window(width, height, rng, self.crop_area)
        else:
            window = eval_window(width, height, self.size, self.eval_crop)
        if not isinstance(planes, torch.Tensor):   # a `JpegBatch` place: decoded on the device (`device_decode`)
            check_pixels(width, height, self.max_pixels, where)
            ratio = dct_ratio(window, self.size, self.dct_scale)
            planes.fill(jpeg, full_size_window(window, ratio, width, height), ratio,
                        self.training and self.flip and rng.random() < 0.5, where)
            return
        decoded, _ = decode_window(image, window, self.size, dct_scale=self.dct_scale, max_pixels=self.max_pixels,
                                   where=where)
        if self.training and self.flip and rng.random() < 0.5:
            decoded = decoded.flip(-1)
        planes.copy_(decoded)
        if planes.is_floating_point():
            planes.mul_(1 / 255)


class TorchLoader(torch.utils.data.DataLoader):
    """The DataLoader `make_torch_loader` returns: batches from the streams in turn, (images, labels) (or
    with the sample IDs), and the caller's position as a small JSON-able state, to resume mid-epoch.

    ``state_dict()`` says what the caller has received; ``load_state_dict(state)`` (before iterating)
    makes the next pass deliver exactly the rest. States of all ranks, ``load_state_dict([s0, s1])``,
    resume on another shard layout or `num_workers`: then no sample of the epoch comes twice or never.
    """

    def __init__(self, dataset: ParquetImages, *, return_ids: bool = False, dtype=None, device=None, **kwargs):
        super().__init__(dataset, batch_size=None, **kwargs)
        self.return_ids, self.dtype = return_ids, torch.float32 if dtype is None else dtype
        if self.dtype not in (torch.float32, torch.uint8):
            raise InvalidPipelineInput(f"dtype must be torch.float32 (pixels in [0, 1]) or torch.uint8 (0..255), got {dtype!r}")
        self.memory = BatchMemory(pin=bool(kwargs.get("pin_memory")))
        # Without workers, the batches are made in this process: float32 ones straight away.
        dataset.dtype = self.dtype if self.num_workers == 0 else torch.uint8
        # decode="gpu": batches are decoded on `device` as they are handed out, and arrive there
        self.device_decoder = (DeviceDecoder(device, dataset.size, self.dtype, cpu_decode=decode_whole)
                               if device is not None else None)

    def __iter__(self):
        if self.num_workers:
            check_worker_handover()
        dataset = self.dataset
        start = dataset.start()
        dataset._pass = start   # what the workers (forked or pickled now) and the calling process start from
        try:
            batches = super().__iter__()
        finally:
            del dataset._pass
        dataset.resume, dataset.position = None, start.copy()
        return self._delivered(self._in_turn(batches, start.next_stream), dataset.position)

    def _in_turn(self, batches, next_stream: int):
        """(images, labels, ids, (stream, epoch, count, next stream)) from each stream in turn from
        `next_stream`, whatever order the DataLoader hands them over in, so a resumed pass interleaves the
        streams as the uninterrupted one."""
        streams = self.dataset.streams
        turns = collections.deque((next_stream + i) % streams for i in range(streams))
        waiting = {s: collections.deque() for s in range(streams)}
        while turns:
            stream = turns[0]
            while not waiting[stream]:
                images, labels, ids, tag = next(batches)
                waiting[int(tag[0])].append((images, labels, ids, tag))
            images, labels, ids, (_, epoch, count, done) = waiting[stream].popleft()
            if done:
                turns.popleft()
                continue
            turns.rotate(-1)
            yield images, labels, ids, (stream, int(epoch), int(count), turns[0])

    def _delivered(self, batches, position: Position):
        """The batches as the caller gets them; `position` follows what it has received."""
        if self.device_decoder is not None:
            batches = self._decoded_ahead(batches)
        for images, labels, ids, (stream, epoch, count, next_stream) in batches:
            position.streams[stream] = (epoch, count)
            position.next_stream = next_stream
            if self.device_decoder is None:
                images = self._scaled(images)
            yield (images, labels, ids) if self.return_ids else (images, labels)

    def _decoded_ahead(self, batches):
        """decode="gpu": each batch decoded on the device while the caller works on the one before, in two
        threads, each with (on CUDA) a stream of its own: one receives a batch and decodes its JPEGs (nvJPEG),
        the other crops, resizes, flips and scales the batch before, so nvJPEG, the resize and the training
        step overlap instead of adding up (decode in the caller's turn held an H200's ResNet-50 at the sum of
        the two times: bench/results/gpu/gpu_check.json; receive, nvJPEG and resize in one thread held the
        decode at ~6,000 img/s where each alone ran at over 19,000: bench/results/gpu/gpu_decode_probe.json).
        Each stage waits for the other's work by a CUDA event, and tells the allocator that memory made on
        one stream is used on another (`record_stream`); an error in either is raised here, and stopping
        early stops both threads."""
        decoder = self.device_decoder
        cuda = decoder.device.type == "cuda"
        decoding, resizing = ((torch.cuda.Stream(decoder.device), torch.cuda.Stream(decoder.device)) if cuda
                              else (None, None))

        def on(stream):
            return torch.cuda.stream(stream) if cuda else contextlib.nullcontext()

        def recorded(stream):
            if not cuda:
                return None
            event = torch.cuda.Event()
            event.record(stream)
            return event

        def decoded():   # the first thread: a batch received from the workers, its JPEGs decoded
            try:
                with on(decoding):
                    for jpegs, labels, ids, tag in batches:
                        pixels = decoder.decode(jpegs)
                        yield pixels, jpegs, labels, ids, tag, recorded(decoding)
            finally:   # the reader's threads end now, not when an error's traceback is let go
                batches.close()

        def finished():   # the second: the batch decoded before cropped, resized, flipped, scaled
            ahead = _ahead(decoded, DEVICE_DECODED_BATCHES, name="pinstorm-device-decode")
            try:
                with on(resizing):
                    for pixels, jpegs, labels, ids, tag, done in ahead:
                        if cuda:
                            resizing.wait_event(done)
                            for image in ([pixels] if isinstance(pixels, torch.Tensor) else pixels):
                                image.record_stream(resizing)
                        images, labels = decoder.finish(pixels, jpegs), labels.to(decoder.device, non_blocking=True)
                        del pixels   # freed here (after the resize, for the allocator's streams)
                        yield images, labels, ids, tag, recorded(resizing)
            finally:
                ahead.close()

        for images, labels, ids, tag, done in _ahead(finished, DEVICE_AHEAD_BATCHES, name="pinstorm-device-resize"):
            if cuda:   # the caller's stream waits for the decode; the allocator keeps the memory till it is used
                current = torch.cuda.current_stream(decoder.device)
                current.wait_event(done)
                images.record_stream(current)
                labels.record_stream(current)
            yield images, labels, ids, tag

    def _scaled(self, images):
        """A worker's uint8 batch as the caller asked: float32 in [0, 1] (into reused memory), or as is
        (uint8 asked for, or a float32 batch made in this process)."""
        if images.dtype == self.dtype:
            return images
        # copy, then scale in place: ~8x less CPU than torch.mul(uint8, 1 / 255, out=float32) here; on one
        # thread, as a second one spins for the workers' CPUs (0.25 ms per image here, against 0.04)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self.memory.empty(images.shape, torch.float32).copy_(images).mul_(1 / 255)
        finally:
            torch.set_num_threads(threads)

    def state_dict(self) -> dict:
        """The caller's position: dataset identity, seed, shard layout, per stream (epoch, samples received),
        and the samples of those epochs consumed under an earlier layout (`positions.state_dict`)."""
        dataset = self.dataset
        return state_dict(dataset.source, dataset.resume or dataset.position, shuffle=dataset.shuffle,
                          shuffle_buffer=dataset.shuffle_buffer, num_workers=self.num_workers,
                          streams=dataset.streams)

    def load_state_dict(self, state) -> None:
        """Make the next pass continue from `state` (a `state_dict()`, or a list of them, one per rank).

        The same shard and `num_workers` (and shuffle settings): each stream skips what it had delivered,
        and the pass is the rest of the uninterrupted one, sample for sample. Another layout: give every
        rank's state; this epoch's streams then deliver only the samples none of them had received, and
        later epochs are whole. The state's seed replaces the loader's.

        A state comes from a file: it is checked against this dataset's epoch plan first (types, epochs in
        [0, 2**31 - 1], samples received within the stream's epoch; `positions.check_state`), and refused
        with `ResumeStateError` naming the field, before any work that grows with the values it holds.
        """
        dataset = self.dataset
        resume = resume_position(state, dataset.source, shuffle=dataset.shuffle, shuffle_buffer=dataset.shuffle_buffer,
                                 num_workers=self.num_workers, streams=dataset.streams)
        dataset.first_epoch = resume.epoch
        dataset.resume, dataset.position = resume, resume.copy()




def make_torch_loader(url, *, batch_size: int, image_size=224, training: bool = READER.training,
                      shard=READER.shard, num_epochs: int | None = READER.num_epochs, seed: int | None = READER.seed,
                      num_workers: int = 0, shuffle: bool = READER.shuffle,
                      drop_remainder: bool = READER.drop_remainder, shuffle_buffer: int | None = READER.shuffle_buffer,
                      crop_area=READER.crop_area, flip: bool = READER.flip, eval_crop: float = READER.eval_crop,
                      dct_scale: bool = READER.dct_scale, retries: int = READER.retries,
                      storage_options: dict | None = READER.storage_options, verify: bool = READER.verify,
                      max_pixels: int | None = READER.max_pixels, prefetch_factor: int | None = None,
                      pin_memory: bool = False, multiprocessing_context=None, return_ids: bool = READER.return_ids,
                      dtype=None, decode_threads: int | None = None, decode: str = "cpu", device=None,
                      cpu_share: float = 0.0, stream: bool = READER.stream, cache_limit: int | None = READER.cache_limit):
    """A ``torch.utils.data.DataLoader`` (`TorchLoader`) of ``(images, labels)`` batches from a converted dataset.

    images: float32 ``[B, 3, H, W]`` in [0, 1]; labels: int64 ``[B]`` class indexes. The arguments
    mean what they mean for `make_dataset` (`training`, `crop_area`, `flip`, `eval_crop`, `shard`,
    `num_epochs`, `shuffle`, `shuffle_buffer`, `seed`, `dct_scale`, `verify`, `retries`, `url`), and
    for the same url, shard, epoch and seed with ``shuffle=False, training=False`` both deliver the
    same rows in the same order (with ``num_workers=0``).

    * `num_workers`: DataLoader worker processes; each reads a disjoint slice of every epoch's row
      groups (so no more workers than the shard has row groups are useful), and batches are taken
      from the workers in turn. 0 (the fastest here): everything in the calling process, batches made
      `PREFETCH_BATCHES` ahead in a thread, decoded by `decode_threads` threads, no memory handed
      between processes.
    * `decode_threads`: threads decoding each stream's images (None: this process's share of the CPUs
      without workers, torchrun's ``LOCAL_WORLD_SIZE`` ranks sharing them; 1 per worker process).
    * Batches run across epoch boundaries (as `make_dataset`'s); each worker's last one may be
      partial unless `drop_remainder`.
    * `seed`: the same seed gives the same batches for the same `num_workers`. A sample's crop and flip
      depend only on the seed, the epoch and the sample.
    * `max_pixels`: pixels a JPEG may decode to (after DCT scaling), see `pipeline.images`.
    * `prefetch_factor`, `pin_memory`, `multiprocessing_context`: handed to the DataLoader (a fork
      server's workers start in ~4 s instead of ~0.5 s).
    * Decoding threads run one torch thread each; the caller's ``torch.get_num_threads()`` is untouched.
    * `return_ids`: batches are ``(images, labels, ids)``, ids int64 ``[B]`` the samples' global row
      numbers (row groups in the dataset's order).
    * `dtype`: ``torch.float32`` (the default: pixels in [0, 1]) or ``torch.uint8`` (0..255, a quarter of
      the memory, for normalising on the GPU). Workers hand over uint8 either way; the float32 batch
      is made in the calling process, in memory reused once the caller holds no part of an earlier
      batch (`BatchMemory`); without workers, the decoding threads write float32 pixels into it.

    * `decode="gpu"`: JPEGs are decoded on `device` (default ``"cuda"``) by nvJPEG, batched, and cropped,
      resized, flipped and scaled there: batches arrive on the device. The threads and workers only read
      rows, check headers and pixels and draw the same windows and flips as ``decode="cpu"``
      (`pipeline.device_decode`). Without CUDA or torchvision it warns once and decodes on the CPU;
      ``device="cpu"`` runs the device path on the CPU (libjpeg-turbo standing in for nvJPEG).
      `cpu_share`: the share of each stream's batches its worker decodes whole on the CPU, as ``decode="cpu"``
      does, while the device decodes the rest: where neither the CPU cores nor the GPU (which trains too)
      decodes as fast as the model trains, both decode at once. Every sample still comes once an epoch,
      with the same window and flip; a CPU-decoded batch is copied to the device (``pin_memory=True``
      makes that copy asynchronous). Give it enough `num_workers` for the CPU's part.

    * `stream`, `cache_limit`: as `make_dataset`'s (a bounded part cache shared by every worker and rank on
      the machine).

    ``loader.dataset.set_epoch(n)`` before a pass starts it at epoch n (for ``num_epochs=1`` loops).
    ``loader.state_dict()`` / ``loader.load_state_dict(state)``: resume mid-epoch (`TorchLoader`).

    The options both readers share (``training``, ``shard``, ``num_epochs``, ``shuffle``, ``seed``,
    ``drop_remainder``, ``shuffle_buffer``, ``crop_area``, ``flip``, ``eval_crop``, ``dct_scale``,
    ``verify``, ``retries``, ``storage_options``, ``return_ids``, ``stream``, ``cache_limit``, ``max_pixels``)
    are described once on [`ReaderOptions`][pinstorm.pipeline.options.ReaderOptions].

    Args:
        url: The converted dataset: a local folder, an fsspec URL or ``board://<board>/<pin>``.
        batch_size: Rows per batch (per rank under DDP).
        image_size: The delivered images' side, or ``(height, width)``.
        num_workers: DataLoader worker processes (0: everything in the calling process).
        prefetch_factor: Handed to the DataLoader (with workers).
        pin_memory: Handed to the DataLoader.
        multiprocessing_context: Handed to the DataLoader (e.g. ``"forkserver"``).
        dtype: ``torch.float32`` (None, the default: pixels in [0, 1]) or ``torch.uint8`` (0..255).
        decode_threads: Threads decoding each stream's images (None: this process's share of the CPUs
            without workers, 1 per worker process).
        decode: ``"cpu"``, or ``"gpu"`` to decode, crop and resize on `device` (batches arrive there).
        device: Where ``decode="gpu"`` decodes (None: ``"cuda"``).
        cpu_share: With ``decode="gpu"``, the share of batches (0 to 1) decoded on the CPU instead.

    Returns:
        A `TorchLoader` (a ``torch.utils.data.DataLoader`` that can ``state_dict()`` and resume).

    Raises:
        ReaderOptionError: An option out of its range.
        DatasetNotFound: No finished dataset at `url`.
    """
    image_size, options = check_arguments(batch_size, image_size, locals())   # the checks both readers share
    crop_area = options.crop_area
    if not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
        raise ReaderOptionError(f"num_workers must be a non-negative integer, got {num_workers!r}")
    if decode_threads is not None and (not isinstance(decode_threads, (int, np.integer)) or decode_threads < 1):
        raise ReaderOptionError(f"decode_threads must be a positive integer or None, got {decode_threads!r}")
    target = resolve_decode(decode, device)   # None: decode on the CPU
    if isinstance(cpu_share, bool) or not isinstance(cpu_share, (int, float, np.integer, np.floating)) \
            or not 0 <= cpu_share <= 1:
        raise ReaderOptionError(f"cpu_share must be a number from 0 to 1, got {cpu_share!r}")
    if cpu_share and decode != "gpu":
        raise ReaderOptionError(f"cpu_share={cpu_share} splits decode='gpu' between the CPU and the device; "
                                f"decode={decode!r} decodes everything on the CPU")
    source = open_epochs(url, shard, shuffle=shuffle, seed=seed, retries=retries, storage_options=storage_options,
                         verify=verify, stream=stream, cache_limit=cache_limit)
    refuse_tabular(source.info, source.location.url, "make_torch_loader")
    dataset = ParquetImages(source, batch_size=int(batch_size), image_size=image_size, training=training,
                            num_epochs=num_epochs, shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                            crop_area=crop_area, flip=flip, eval_crop=eval_crop, dct_scale=dct_scale,
                            drop_remainder=drop_remainder, max_pixels=max_pixels, streams=max(1, int(num_workers)),
                            decode_threads=default_decode_threads(num_workers) if decode_threads is None
                            else decode_threads, deferred=target is not None, cpu_share=float(cpu_share))
    extra = {} if num_workers == 0 else {"prefetch_factor": prefetch_factor,
                                         "multiprocessing_context": multiprocessing_context}
    return TorchLoader(dataset, return_ids=return_ids, dtype=dtype, device=target, num_workers=int(num_workers),
                       pin_memory=pin_memory,
                       **extra)
