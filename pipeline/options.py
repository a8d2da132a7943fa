"""The options both readers share, written once: what `make_dataset` (TensorFlow) and `make_torch_loader`
(PyTorch) mean by training, sharding, epochs, shuffling, augmentation, verification and retries.

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

from pinstorm.errors import PinstormError

# The aspect ratios a training crop may have (Inception's, as torchvision and tf.image use them), and the
# crops sampled before the whole image is taken (tf.image.sample_distorted_bounding_box's default).
ASPECT_RANGE = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10


class ReaderOptionError(PinstormError, ValueError):
    """A reader option out of its range (the message names the option and the value)."""


@dataclass(frozen=True)
class ReaderOptions:
    """What a reader delivers, independent of the framework.

    * ``training``: random crops (``crop_area`` of the image, aspect in ``ASPECT_RANGE``) and
      left-right flips (``flip``); otherwise a centre crop of ``eval_crop`` of the largest window of the
      target's aspect.
    * ``shard``: ``(index, count)``, this worker's disjoint share of row groups.
    * ``num_epochs``: exact passes (None: endless). ``shuffle`` / ``shuffle_buffer`` / ``seed``: the
      order of row groups and rows, reproducible for a seed. ``drop_remainder``: only full batches.
    * ``dct_scale``: decode at 1/2, 1/4 or 1/8 DCT scale when the target is that much smaller.
    * ``verify``: footer and row-group checksums; ``retries``: reads of a part retried on I/O errors.
    * ``storage_options``: for fsspec (credentials, endpoints); ``return_ids``: batches carry sample IDs.
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
        """The options among a reader's `arguments` (its `locals()`), checked."""
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
