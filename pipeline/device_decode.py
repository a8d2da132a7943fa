"""JPEG decode on the device that trains: ``make_torch_loader(..., decode="gpu")``.

A CPU core decodes a few hundred ImageNet-size JPEGs a second; one GPU's nvJPEG decodes thousands. With
``decode="gpu"`` the loader's threads and workers do only what is cheap and bounded on the CPU: read the
rows, parse each JPEG's header (a corrupt one is the same `UndecodableImage` as on the CPU path), check its
pixels against ``max_pixels`` and draw its crop window and flip from the sample's own seed, exactly as the
CPU path draws them. A batch then travels as its JPEG bytes plus those windows and flips (`JpegBatch`), and
`DeviceDecoder` decodes it there in one batched call (``torchvision.io.decode_jpeg(device="cuda")``),
crops, resizes (bilinear, half-pixel centres, antialiased where the CPU path would decode at a reduced DCT
scale), flips and scales it: the batch arrives on the device.

Without CUDA (or torchvision) ``decode="gpu"`` says so in one warning and decodes on the CPU. With
``device="cpu"`` the same code runs on the CPU with libjpeg-turbo standing in for nvJPEG: that is how the
device path is tested on machines without a GPU.
"""

from __future__ import annotations

import warnings

import numpy as np

from pinstorm.extras import require

from .images import UndecodableImage

torch = require("torch", "torch", "pinstorm.pipeline.make_torch_loader")

DECODES = ("cpu", "gpu")


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
        from .options import ReaderOptionError

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


class DeviceDecoder:
    """Decodes `JpegBatch`es on `device` into ``[B, 3, H, W]`` batches of `dtype` (float32 in [0, 1], or uint8)."""

    def __init__(self, device, size, dtype, cpu_decode=None):
        """`cpu_decode(bytes, where)`: RGB pixels [h, w, 3] of a whole JPEG, for a CPU device (the loader's
        libjpeg-turbo decoder, handed in so this module needs nothing of the loader's)."""
        self.device, self.size, self.dtype = torch.device(device), tuple(size), dtype
        self.io = _torchvision_io() if self.device.type == "cuda" else None
        self.cpu_decode = cpu_decode

    def __call__(self, batch: JpegBatch):
        images = self._decode(batch)
        out = torch.empty((len(images), 3, *self.size), dtype=torch.float32, device=self.device)
        height, width = self.size
        # per image only the crop (a view) and its resize into the batch; flips and scaling are batched
        for i, (image, (x, y, w, h, ratio)) in enumerate(zip(images, batch.windows.tolist())):
            crop = image[:, y:y + h, x:x + w]
            if (h, w) == (height, width):
                out[i].copy_(crop)
            else:   # where the CPU path decodes at 1/2..1/8 DCT scale (an area filter), antialias likewise
                out[i] = torch.nn.functional.interpolate(crop[None].float(), size=self.size, mode="bilinear",
                                                         align_corners=False, antialias=ratio > 1)[0]
        flips = batch.flips.nonzero().flatten().tolist()
        if flips:
            index = torch.as_tensor(flips, device=self.device)
            out[index] = out[index].flip(-1)
        if self.dtype == torch.uint8:
            return out.round_().clamp_(0, 255).to(torch.uint8)
        return out.clamp_(0, 255).mul_(1 / 255)

    def _decode(self, batch: JpegBatch) -> list:
        """[3, h, w] uint8 images on the device: nvJPEG in one batched call; on the CPU, libjpeg-turbo."""
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
