"""An image size, or a progressive-resizing schedule ``[(epoch, size), ...]``: checked and cut into phases
of epochs at one size. Framework-free: `train` (TensorFlow, `training.schedule`) and `train_torch` read the
same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidTrainingInput


@dataclass(frozen=True)
class Phase:
    start: int   # first epoch (0-based)
    stop: int    # one past the last epoch
    size: int


class ImageSizes:
    """An image size, or ``[(epoch, size), ...]`` steps of one; `phases` cut to `epochs`."""

    def __init__(self, image_size, epochs: int):
        if isinstance(image_size, (int,)) and not isinstance(image_size, bool):
            steps = [(0, int(image_size))]
        else:
            try:
                steps = [(int(e), int(s)) for e, s in image_size]
            except (TypeError, ValueError):
                raise InvalidTrainingInput("image_size must be an int or [(epoch, size), ...], got "
                                           f"{image_size!r}") from None
        if not steps or steps[0][0] != 0:
            raise InvalidTrainingInput(f"an image-size schedule must start at epoch 0, got {image_size!r}")
        if any(b[0] <= a[0] for a, b in zip(steps, steps[1:])):
            raise InvalidTrainingInput(f"schedule epochs must increase strictly, got {image_size!r}")
        if any(size < 1 for _, size in steps):
            raise InvalidTrainingInput(f"image sizes must be positive, got {image_size!r}")
        self.steps = steps
        bounds = [e for e, _ in steps if e < epochs] + [epochs]
        self.phases = [Phase(start, stop, self.size_at(start)) for start, stop in zip(bounds, bounds[1:])]

    @property
    def progressive(self) -> bool:
        return len(self.phases) > 1

    @property
    def final(self) -> int:
        """The size of the last phase that runs: the model's and validation's size at the end."""
        return self.phases[-1].size

    def size_at(self, epoch: int) -> int:
        return [size for start, size in self.steps if start <= epoch][-1]

    def as_list(self) -> list:
        return [list(step) for step in self.steps]


__all__ = ["ImageSizes", "Phase"]
