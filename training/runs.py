"""What a fit is asked to do, written once for `train` (TensorFlow), `train_torch` (PyTorch), `spark_train`
and the command line: the shared options with their defaults and checks (`FitOptions`), where a run's
files go (`default_output_dir`) and the optimisers a run may name. No framework is imported here, so
both fits and the command line read the same rules.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from pinstorm.boards.meta import TIME_FORMAT
from .errors import InvalidTrainingInput


# The optimisers a run may name, and SGD's momentum (the AlexNet and ResNet papers' 0.9) for both frameworks.
OPTIMIZERS = ("adam", "sgd")
SGD_MOMENTUM = 0.9
# The precisions a PyTorch fit trains in (`train_torch`, `--precision`): "auto" is bf16 autocast on a GPU that
# has bf16, else fp32. Here, not in torch_fit, so the command line offers them without importing torch.
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
RUNS_FOLDER = "runs"


@dataclass(frozen=True)
class FitOptions:
    """The options every fit takes, with their defaults (``train`` and ``train_torch`` read them from
    ``DEFAULTS``). ``batch_size`` is per replica or rank; ``input_options`` go to the reader
    (`pipeline.options.ReaderOptions` names what both readers share); ``pin`` (``"board/name"``,
    ``(board, "name")`` or ``"name"``) pins the finished run with ``lineage`` added to its record.

    `train`, `train_torch` (and `spark_train`'s argument dicts) take each of these as a keyword argument
    of the same name and default; they are described here once.

    Attributes:
        epochs: Passes over the training data.
        batch_size: Images per step per replica (TensorFlow) or per rank (PyTorch); the global batch is
            that times the replicas or ranks.
        image_size: Square side in pixels the reader crops and resizes to; for `train`, also a
            progressive-resizing schedule ``[(0, 128), (6, 192), (12, 224)]`` of ``(epoch, size)``
            (models with global pooling; `training.schedule`).
        num_classes: Output classes (None: the dataset's number of classes).
        learning_rate: The optimiser's learning rate, a positive number.
        optimizer: ``"adam"`` or ``"sgd"`` (momentum 0.9).
        model_kwargs: Keyword arguments for the model builder (`build_model` / `build_torch_model`).
        steps_per_epoch: Training steps per epoch (None: a full pass; under DDP the smallest shard's
            full batches).
        seed: Makes shuffling, augmentation and initial weights repeatable (None: not seeded).
        output_dir: Where the run's ``metrics.csv``, ``curves.png``, logs and final weights go (None:
            ``runs/<model>-<UTC time>``).
        checkpoint_dir: Back up there during the fit and resume from it when a backup exists; removed
            after a finished run (None: no backups).
        input_options: Reader options for a Parquet input, passed to `make_dataset` or
            `make_torch_loader` (`ReaderOptions`), e.g. ``{"flip": False}`` for digits.
        pin: Pin the finished run as a new version of this pin: ``"board/name"`` (a registered board),
            ``(board, "name")`` (a ``Board``) or ``"name"`` (the default board); see `training.experiments`.
        lineage: A JSON-able dict added to the pinned run's lineage record (e.g. the pins the data came
            from).
    """

    epochs: int = 10
    batch_size: int = 32
    image_size: Any = 224
    num_classes: int | None = None
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    model_kwargs: Mapping[str, Any] | None = None
    steps_per_epoch: int | None = None
    seed: int | None = None
    output_dir: Any = None
    checkpoint_dir: Any = None
    input_options: Mapping[str, Any] | None = None
    pin: Any = None
    lineage: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise InvalidTrainingInput(f"{name} must be a positive integer, got {value!r}")
        if self.steps_per_epoch is not None and (not _is_int(self.steps_per_epoch) or self.steps_per_epoch < 1):
            raise InvalidTrainingInput("steps_per_epoch must be None or a positive integer, got "
                                       f"{self.steps_per_epoch!r}")
        if self.num_classes is not None and (not _is_int(self.num_classes) or self.num_classes < 2):
            raise InvalidTrainingInput("num_classes must be None or an integer of at least 2, got "
                                       f"{self.num_classes!r}")
        if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, numbers.Real) \
                or not self.learning_rate > 0:
            raise InvalidTrainingInput(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        object.__setattr__(self, "optimizer", check_optimizer(self.optimizer))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def pick(cls, arguments: Mapping[str, Any]) -> "FitOptions":
        """The fit options among a fit's `arguments` (its `locals()`), checked.

        Args:
            arguments: A fit's arguments by name; the names that are not options are ignored.
        """
        return cls(**{name: arguments[name] for name in cls.names() if name in arguments})


def check_optimizer(name: str) -> str:
    """`name` in lower case, if it is one of `OPTIMIZERS` (the same error for both frameworks)."""
    lowered = str(name).lower()
    if lowered not in OPTIMIZERS:
        raise InvalidTrainingInput(f"unknown optimizer {name!r}: use {' or '.join(repr(o) for o in OPTIMIZERS)}")
    return lowered


def default_output_dir(model_name: str) -> Path:
    """``runs/<model>-<UTC time>``: a new folder per run, named in the pins version-time format."""

    return Path(RUNS_FOLDER) / f"{model_name}-{datetime.now(timezone.utc).strftime(TIME_FORMAT)}"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


DEFAULTS = FitOptions()

__all__ = ["DEFAULTS", "FitOptions", "OPTIMIZERS", "RUNS_FOLDER", "SGD_MOMENTUM", "check_optimizer",
           "default_output_dir"]
