"""The options both readers share, written once: what `make_dataset` (TensorFlow) and `make_torch_loader`
(PyTorch) mean by training, sharding, epochs, shuffling, augmentation, verification, retries and the pixels
an image may have.

The two readers keep their keyword arguments (users pass them by name), but their defaults are read from
`DEFAULTS` here and each call checks its values by building a `ReaderOptions`, so the frameworks cannot
drift apart: the same crop, flip and centre crop, the same errors for the same mistakes. A test compares
both signatures with this type, and the command line's reader flags are made from it.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import PipelineError
from .images import DEFAULT_MAX_PIXELS


# The aspect ratios a training crop may have (Inception's, as torchvision and tf.image use them), and the
# crops sampled before the whole image is taken (tf.image.sample_distorted_bounding_box's default).
ASPECT_RANGE = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10
# Where `make_torch_loader` decodes JPEGs: "gpu" is on the training device with nvJPEG (`pipeline.device_decode`).
# Here, not there, so the command line offers them without importing torch.
DECODES = ("cpu", "gpu")


class ReaderOptionError(PipelineError, ValueError):
    """A reader option out of its range (the message names the option and the value)."""


@dataclass(frozen=True)
class ReaderOptions:
    """What a reader delivers, independent of the framework.

    `make_dataset` and `make_torch_loader` take each of these as a keyword argument of the same name and
    default; they are described here once. Every value is checked when the options are made
    (`ReaderOptionError` names the option).

    Attributes:
        training: True: random crops (``crop_area`` of the image, aspect in ``ASPECT_RANGE``) and
            left-right flips (``flip``). False: a centre crop of ``eval_crop`` of the largest window of the
            target's aspect, no randomness.
        shard: ``(index, count)``: this worker's disjoint share of row groups; the shards together cover
            every row exactly once per epoch. None: every row group.
        num_epochs: Exact passes over the data (None: endless). Each epoch is counted; an epoch short of
            the stored rows is retried when empty, else raises `IncompleteEpochError`.
        shuffle: Row groups in a random order and rows through a shuffle buffer. False (with
            ``training=False``): the stored order, the same every time.
        seed: Makes shuffling and augmentation reproducible (None: a fresh seed).
        drop_remainder: Only full batches (static batch shapes, as some strategies need).
        shuffle_buffer: Rows in the shuffle buffer (None: about 4 row groups, at most about 256 MB of JPEGs).
        crop_area: ``(low, high)``: the share of the image a training crop covers, ``0 < low <= high <= 1``.
        flip: Random left-right flips when training.
        eval_crop: The share of the largest target-aspect window an evaluation crop keeps, in (0, 1].
        dct_scale: Decode a crop window at 1/2, 1/4 or 1/8 DCT scale when the target is at least that much
            smaller, then resize (far fewer pixels for small targets). False: always full scale.
        verify: Check footer and row-group checksums (`verify_dataset`) before rows are delivered. Parts are
            checked for presence and size before every epoch either way.
        retries: Reads of a part retried on I/O errors.
        storage_options: For fsspec (credentials, endpoints) when the URL is remote.
        return_ids: Batches also carry the samples' int64 IDs (their global row numbers).
        stream: A remote dataset (fsspec URL, object-store ``board://``) is read part by part through the
            machine's bounded part cache (`pipeline.part_cache`), shared by every reader on the machine;
            the same rows in the same order.
        cache_limit: That part cache's size in bytes (None: 80% of what its disk could give it).
        max_pixels: Pixels an image may have, read from its JPEG header before it is decoded (None: no limit;
            the default is `convert`'s bound, above every ILSVRC image). `make_dataset` refuses a larger image
            (`UndecodableImage` naming part, row group, row and file); `make_torch_loader` decodes it at a
            reduced DCT scale that fits, and refuses it where even 1/8 does not.
    """

    training: bool = True
    shard: tuple[int, int] | None = None
    num_epochs: int | None = 1
    shuffle: bool = True
    seed: int | None = None
    drop_remainder: bool = False
    shuffle_buffer: int | None = None
    crop_area: tuple[float, float] = (0.25, 1.0)
    flip: bool = True
    eval_crop: float = 0.875
    dct_scale: bool = True
    verify: bool = True
    retries: int = 2
    storage_options: Mapping[str, Any] | None = None
    return_ids: bool = False
    stream: bool = False
    cache_limit: int | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        crop = _pair(self.crop_area, "crop_area")
        if not 0 < crop[0] <= crop[1] <= 1:
            raise ReaderOptionError(f"crop_area must satisfy 0 < low <= high <= 1, got {self.crop_area!r}")
        object.__setattr__(self, "crop_area", crop)
        if isinstance(self.eval_crop, bool) or not isinstance(self.eval_crop, (int, float)) \
                or not 0 < self.eval_crop <= 1:
            raise ReaderOptionError(f"eval_crop must be in (0, 1], got {self.eval_crop!r}")
        if self.num_epochs is not None and (_not_int(self.num_epochs) or self.num_epochs < 1):
            raise ReaderOptionError(f"num_epochs must be None or an integer of at least 1, got {self.num_epochs!r}")
        if self.shuffle_buffer is not None and (_not_int(self.shuffle_buffer) or self.shuffle_buffer < 1):
            raise ReaderOptionError(f"shuffle_buffer must be None or a positive integer, got {self.shuffle_buffer!r}")
        if _not_int(self.retries) or self.retries < 0:
            raise ReaderOptionError(f"retries must be a non-negative integer, got {self.retries!r}")
        if self.seed is not None and _not_int(self.seed):
            raise ReaderOptionError(f"seed must be None or an integer, got {self.seed!r}")
        if self.cache_limit is not None and (_not_int(self.cache_limit) or self.cache_limit < 1):
            raise ReaderOptionError(f"cache_limit must be None or a positive number of bytes, got {self.cache_limit!r}")
        if self.max_pixels is not None and (_not_int(self.max_pixels) or self.max_pixels < 1):
            raise ReaderOptionError(f"max_pixels must be None or a positive integer, got {self.max_pixels!r}")
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise ReaderOptionError(f"storage_options must be a mapping, got {type(self.storage_options).__name__}")

    def replace(self, **changes: Any) -> "ReaderOptions":
        """A copy with `changes` (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def pick(cls, arguments: Mapping[str, Any]) -> "ReaderOptions":
        """The options among a reader's `arguments` (its `locals()`), checked.

        Args:
            arguments: A reader's arguments by name; the names that are not options are ignored.
        """
        return cls(**{name: arguments[name] for name in cls.names() if name in arguments})


def _pair(value: Any, name: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ReaderOptionError(f"{name} must be a (low, high) pair of numbers, got {value!r}") from None
    return low, high


def _not_int(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, numbers.Integral)   # NumPy's integers are Integral


DEFAULTS = ReaderOptions()

__all__ = ["ASPECT_RANGE", "CROP_ATTEMPTS", "DEFAULTS", "ReaderOptionError", "ReaderOptions"]
