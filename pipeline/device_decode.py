"""JPEG decode on the device that trains: ``make_torch_loader(..., decode="gpu")``.

A CPU core decodes a few hundred ImageNet-size JPEGs a second; one GPU's nvJPEG decodes thousands. With
``decode="gpu"`` the loader's threads and workers do only what is cheap and bounded on the CPU: read the
rows, parse each JPEG's header (a corrupt one is the same `UndecodableImage` as on the CPU path), check its
pixels against ``max_pixels`` and draw its crop window and flip from the sample's own seed, exactly as the
CPU path draws them. A batch then travels as its JPEG bytes plus those windows and flips (`JpegBatch`), and
`DeviceDecoder` decodes it there in one batched call (``torchvision.io.decode_jpeg(device="cuda")``),
crops, resizes (bilinear, half-pixel centres, antialiased where the CPU path would decode at a reduced DCT
scale), flips and scales it: the batch arrives on the device. The crop and resize are batched too: a kernel
or three an image, launched from Python, ran at 19,700 img/s on an H200 against nvJPEG's 23,800
(bench/results/gpu/gpu_decode_probe.json), so images of one shape go through one ``grid_sample`` (or, where
antialiased, one separable matrix product), each with its own window, and give what ``interpolate`` gives
image by image, float rounding apart.

Without CUDA (or torchvision) ``decode="gpu"`` says so in one warning and decodes on the CPU. With
``device="cpu"`` the same code runs on the CPU with libjpeg-turbo standing in for nvJPEG: that is how the
device path is tested on machines without a GPU.
"""

from __future__ import annotations

import warnings

import numpy as np

from pinstorm.extras import require

from .images import UndecodableImage
from .options import DECODES, ReaderOptionError

torch = require("torch", "torch", "pinstorm.pipeline.make_torch_loader")

class JpegBatch:
    """A batch not yet decoded: each sample's JPEG bytes, its crop window (x, y, w, h at full resolution, and
    the DCT reduction the CPU path would decode it at) and flip, and where it came from (for errors). Small:
    it crosses from DataLoader workers to the calling process as bytes, a tenth of the decoded pixels, packed
    into one tensor (one shared-memory segment a batch: a tensor per image cost a file descriptor hand-over
    each, which held one H200 at 1,900 img/s, bench/results/gpu/gpu_check.json of 2026-11-27)."""

    def __init__(self, size: int):
        self.size = size
        self._parts: list = [b""] * size        # bytes per sample, until packed
        self._packed = None                     # (uint8 tensor of all bytes, int64 offsets [size + 1])
        self._where: list = [""] * size
        self.windows = torch.zeros((size, 5), dtype=torch.int64)   # x, y, w, h at full size; the CPU's DCT ratio
        self.flips = torch.zeros(size, dtype=torch.bool)

    def _pack(self):
        if self._packed is None:
            parts = self._parts[:self.size]
            offsets = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum([len(p) for p in parts], out=offsets[1:])
            self._packed = (torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
                            if offsets[-1] else torch.empty(0, dtype=torch.uint8), torch.from_numpy(offsets))
            self._parts = None
        return self._packed

    @property
    def data(self) -> list:
        """Each sample's JPEG bytes, as 1-D uint8 CPU tensors (views of the packed bytes, as nvJPEG takes them)."""
        packed, offsets = self._pack()
        bounds = offsets.tolist()
        return [packed[bounds[i]:bounds[i + 1]] for i in range(self.size)]

    @property
    def where(self) -> list:
        return self._where[:self.size]

    def __len__(self) -> int:
        return self.size

    def __getstate__(self) -> dict:
        """Pickled (to the calling process) packed: one tensor of bytes, one of offsets."""
        self._pack()
        return self.__dict__

    def __getitem__(self, index):
        if isinstance(index, slice):   # the last, partial batch of a pass: a view, filled as decodes finish
            if index.start not in (None, 0) or index.step not in (None, 1):
                raise IndexError("a JpegBatch is cut only to its first samples")
            part = JpegBatch.__new__(JpegBatch)
            part.__dict__.update(self.__dict__)
            part.size = min(self.size, index.stop)
            part.windows, part.flips = self.windows[:part.size], self.flips[:part.size]
            return part
        return _Slot(self, index)

    def pin_memory(self, device=None) -> "JpegBatch":
        """What the DataLoader's pin_memory calls: the bytes are copied to the device as they are."""
        return self


class _Slot:
    """One sample's place in a `JpegBatch` (what the decoding threads fill instead of a tensor slice)."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: JpegBatch, index: int):
        self.batch, self.index = batch, index

    def fill(self, data: bytes, window, ratio: int, flip: bool, where: str) -> None:
        batch, i = self.batch, self.index
        batch._parts[i] = bytes(data)
        batch.windows[i] = torch.as_tensor((*window, ratio), dtype=torch.int64)
        batch.flips[i] = bool(flip)
        batch._where[i] = where


def check_pixels(width: int, height: int, max_pixels: int | None, where: str) -> None:
    """A device decodes at full size (nvJPEG has no reduced DCT scale): the image must fit `max_pixels` whole."""
    if max_pixels and width * height > max_pixels:
        raise UndecodableImage(f"{where}: too large to decode on the device: {width}x{height} = "
                               f"{width * height / 1e6:.1f} MP, over max_pixels {max_pixels / 1e6:.1f} MP")


def resolve(decode: str, device) -> "torch.device | None":
    """The device `decode` decodes on, None for the CPU path: ``"gpu"`` without CUDA or torchvision says so
    in one warning and is the CPU path; ``device="cpu"`` keeps the device path on the CPU (libjpeg-turbo
    standing in for nvJPEG)."""
    if decode not in DECODES:
        raise ReaderOptionError(f"decode must be one of {DECODES}, got {decode!r}")
    if decode == "cpu":
        return None
    target = torch.device(device if device is not None else "cuda")
    if target.type == "cuda" and not torch.cuda.is_available():
        warnings.warn("decode='gpu': no CUDA device here; decoding on the CPU", stacklevel=3)
        return None
    if target.type == "cuda" and _torchvision_io() is None:
        warnings.warn("decode='gpu': torchvision (for nvJPEG) is not installed; decoding on the CPU", stacklevel=3)
        return None
    if target.type == "cuda" and target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    return target


def _torchvision_io():
    try:
        import torchvision.io as tvio
    except Exception:   # noqa: BLE001 - missing, or built for another torch: the CPU path then
        return None
    return tvio


MAX_GROUP_PIXELS = 1 << 24   # pixels (of 3 channels) resized in one go: ~200 MB of float32 on the device


def _resize_weights(starts, lengths, size: int, extent: int):
    """[n, size, extent] float32: row j of image i holds the weights output pixel j gives the input pixels
    0..extent-1 along one axis, for a window of `lengths` pixels from `starts`, as
    ``interpolate(mode="bilinear", align_corners=False, antialias=True)`` weighs them: a triangle widened by
    the scale (at least 1), normalised over the window (torch's filter, after Pillow's). Outside the window
    every weight is 0: the crop is part of the resize."""
    device = starts.device
    start = starts.to(torch.float32)[:, None, None]
    length = lengths.to(torch.float32)[:, None, None]
    scale = length / size
    centre = scale * (torch.arange(size, device=device, dtype=torch.float32)[None, :, None] + 0.5)
    k = torch.arange(extent, device=device, dtype=torch.float32)[None, None, :] - start   # window coordinates
    weights = (1 - ((k + 0.5 - centre) / scale.clamp(min=1)).abs_()).clamp_(min=0)
    weights.mul_((k >= 0) & (k < length))
    return weights.div_(weights.sum(-1, keepdim=True).clamp_(min=1e-12))


def _sampling_grid(windows, flips, size, extent):
    """[n, H, W, 2]: where ``grid_sample(align_corners=False)`` reads each output pixel of each window
    (x, y, w, h) in images padded to `extent` (height, width): torch's bilinear source coordinates
    (half-pixel centres, clamped to the window), flipped where `flips`, normalised to [-1, 1]."""
    device = windows.device
    x, y, w, h = (windows[:, i].to(torch.float32)[:, None] for i in range(4))

    def axis(start, length, count, padded):
        centre = torch.arange(count, device=device, dtype=torch.float32)[None, :] + 0.5
        source = torch.minimum((centre * (length / count) - 0.5).clamp_(min=0), length - 1)
        return (2 * (start + source) + 1) / padded - 1

    across = axis(x, w, size[1], extent[1])
    across = torch.where(flips[:, None], across.flip(1), across)
    down = axis(y, h, size[0], extent[0])
    return torch.stack(torch.broadcast_tensors(across[:, None, :], down[:, :, None]), -1)


def _groups(shapes: list, kinds: list, max_pixels: int = MAX_GROUP_PIXELS) -> list:
    """The images (indexes) resized together, each group of one kind (resized one way): those of one shape
    (stacked as they are), and the rest padded to their largest, smallest first; each group within
    `max_pixels` and its padding at most as many pixels as its images'."""
    by_shape: dict = {}
    for i, key in enumerate(zip(kinds, shapes)):
        by_shape.setdefault(key, []).append(i)
    groups, rest = [], {}
    for (kind, (h, w)), members in by_shape.items():
        if len(members) == 1:
            rest.setdefault(kind, []).extend(members)
            continue
        step = max(1, max_pixels // (h * w))
        groups.extend(members[i:i + step] for i in range(0, len(members), step))
    for members in rest.values():
        members.sort(key=lambda i: shapes[i][0] * shapes[i][1])
        group, height, width, area = [], 0, 0, 0
        for i in members:
            h, w = shapes[i]
            grown = (len(group) + 1) * max(height, h) * max(width, w)
            if group and (grown > max_pixels or grown > 2 * (area + h * w)):
                groups.append(group)
                group, height, width, area = [], 0, 0, 0
            group.append(i)
            height, width, area = max(height, h), max(width, w), area + h * w
        if group:
            groups.append(group)
    return groups


class DeviceDecoder:
    """Decodes `JpegBatch`es on `device` into ``[B, 3, H, W]`` batches of `dtype` (float32 in [0, 1], or uint8),
    in two steps the loader runs in two threads: `decode` (nvJPEG, one batched call) and `finish` (crop,
    resize, flip and scale, batched: a few kernels a group of images, not a few an image)."""

    def __init__(self, device, size, dtype, cpu_decode=None, batched: bool = True):
        """`cpu_decode(bytes, where)`: RGB pixels [h, w, 3] of a whole JPEG, for a CPU device (the loader's
        libjpeg-turbo decoder, handed in so this module needs nothing of the loader's). `batched=False`: crop
        and resize image by image (the reference the batched resize is tested and timed against)."""
        self.device, self.size, self.dtype = torch.device(device), tuple(size), dtype
        self.io = _torchvision_io() if self.device.type == "cuda" else None
        self.cpu_decode = cpu_decode
        self.batched = batched

    def __call__(self, batch: JpegBatch):
        return self.finish(self.decode(batch), batch)

    def decode(self, batch):
        """[3, h, w] uint8 images on the device: nvJPEG in one batched call; on the CPU, libjpeg-turbo. A batch
        the loader's workers decoded already (a uint8 ``[B, 3, H, W]`` tensor, `cpu_share`) is only copied."""
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        return self._decode(batch)

    def finish(self, images, batch):
        """`images` (from `decode`) cropped to their windows, resized, flipped and scaled: ``[B, 3, H, W]``."""
        if isinstance(images, torch.Tensor):   # decoded by the workers: cropped, resized and flipped there
            return images if self.dtype == torch.uint8 else images.float().mul_(1 / 255)
        if self.batched:
            out = self._resized(images, batch.windows, batch.flips)
        else:
            out = self._resized_one_by_one(images, batch.windows.tolist(), batch.flips)
        if self.dtype == torch.uint8:
            return out.round_().clamp_(0, 255).to(torch.uint8)
        return out.clamp_(0, 255).mul_(1 / 255)

    def _resized(self, images: list, windows, flips):
        """Crop and resize a group of images at once. Bilinear: one ``grid_sample`` reading each output
        pixel where torch's ``interpolate`` would (`_sampling_grid`). Antialiased (where the CPU path decodes
        at 1/2..1/8 DCT scale, an area filter): one separable linear map, ``Wy @ image @ Wx.T``, with
        per-image weight matrices that read only the window (`_resize_weights`). A flip is part of either.
        What the groups need crosses to the device in one copy, and nothing waits for the device."""
        height, width = self.size
        out = torch.empty((len(images), 3, height, width), dtype=torch.float32, device=self.device)
        smooth = (windows[:, 4] > 1).tolist()
        groups = _groups([tuple(image.shape[-2:]) for image in images], smooth)
        order = torch.as_tensor([i for group in groups for i in group], dtype=torch.int64)
        # per image in group order: its index, x, y, w, h, DCT ratio, flip; x and y within its group's bounds:
        # the rows and columns some window of the group reads (an eval crop's: half the image)
        plan = torch.cat([order[:, None], windows[order], flips[order, None].long()], 1)
        bounds, start = [], 0
        for group in groups:
            part = plan[start:start + len(group)]
            start += len(group)
            corner = part[:, 1:3].min(0).values
            bounds.append((*corner.tolist(), *(part[:, 1:3] + part[:, 3:5]).max(0).values.tolist()))
            part[:, 1:3] -= corner
        on_device = plan.to(self.device, non_blocking=True)
        start = 0
        for group, (left, top, right, bottom) in zip(groups, bounds):
            part = on_device[start:start + len(group)]
            start += len(group)
            views = [images[i][:, top:bottom, left:right] for i in group]
            shapes = [tuple(view.shape[-2:]) for view in views]
            if len(set(shapes)) == 1:
                pixels = torch.stack(views)
            else:   # shapes differ: padded with zeros, which no output pixel reads
                pixels = torch.zeros((len(group), 3, max(s[0] for s in shapes), max(s[1] for s in shapes)),
                                     dtype=views[0].dtype, device=self.device)
                for row, (view, (h, w)) in enumerate(zip(views, shapes)):
                    pixels[row, :, :h, :w].copy_(view)
            index, windows, flip = part[:, 0], part[:, 1:5], part[:, 6].bool()
            if smooth[group[0]]:
                x, y, w, h = windows.unbind(1)
                rows = _resize_weights(y, h, height, pixels.shape[-2])
                columns = _resize_weights(x, w, width, pixels.shape[-1])
                columns = torch.where(flip[:, None, None], columns.flip(1), columns)
                resized = rows[:, None] @ (pixels.float() @ columns.transpose(1, 2)[:, None])
            else:
                grid = _sampling_grid(windows, flip, self.size, pixels.shape[-2:])
                resized = torch.nn.functional.grid_sample(pixels.float(), grid, mode="bilinear",
                                                          padding_mode="border", align_corners=False)
            out.index_copy_(0, index, resized)
        return out

    def _resized_one_by_one(self, images: list, windows: list, flips):
        """The reference: per image the crop (a view) and its resize into the batch; flips batched."""
        out = torch.empty((len(images), 3, *self.size), dtype=torch.float32, device=self.device)
        height, width = self.size
        for i, (image, (x, y, w, h, ratio)) in enumerate(zip(images, windows)):
            crop = image[:, y:y + h, x:x + w]
            if (h, w) == (height, width):
                out[i].copy_(crop)
            else:   # where the CPU path decodes at 1/2..1/8 DCT scale (an area filter), antialias likewise
                out[i] = torch.nn.functional.interpolate(crop[None].float(), size=self.size, mode="bilinear",
                                                         align_corners=False, antialias=ratio > 1)[0]
        flipped = flips.nonzero().flatten().tolist()
        if flipped:
            index = torch.as_tensor(flipped, device=self.device)
            out[index] = out[index].flip(-1)
        return out

    def _decode(self, batch: JpegBatch) -> list:
        if self.io is None:
            return [self._cpu(data, where) for data, where in zip(batch.data, batch.where)]
        try:
            return self.io.decode_jpeg(list(batch.data), mode=self.io.ImageReadMode.RGB, device=self.device)
        except RuntimeError:   # one broken body fails the batch: find it and name it
            images = []
            for data, where in zip(batch.data, batch.where):
                try:
                    images.append(self.io.decode_jpeg(data, mode=self.io.ImageReadMode.RGB, device=self.device))
                except RuntimeError as error:
                    raise UndecodableImage(f"{where}: {str(error).splitlines()[0]}") from None
            return images

    def _cpu(self, data, where: str):
        pixels = self.cpu_decode(data.numpy().tobytes(), where)
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1).to(self.device)


__all__ = ["DECODES", "DeviceDecoder", "JpegBatch", "check_pixels", "resolve"]
