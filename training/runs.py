"""What a fit is asked to do, written once for `train` (TensorFlow), `train_torch` (PyTorch), `spark_train`
and the command line: the shared options with their defaults and checks (`FitOptions`), where a run's
files go (`default_output_dir`) and the optimisers a run may name. No framework is imported here, so
both fits and the command line read the same rules.
"""

from __future__ import annotations

import dataclasses
import math
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
# How the learning rate moves over a fit (after any warm-up): held, a cosine to zero at the last step, or
# divided by 10 at a third, two thirds and eight ninths of the epochs (the ResNet papers' 30, 60, 80 of 90).
LR_SCHEDULES = ("constant", "cosine", "step")
STEP_DECAY_AT = (1 / 3, 2 / 3, 8 / 9)
STEP_DECAY = 0.1
RUNS_FOLDER = "runs"
FRAMEWORKS = ("tensorflow", "torch")
# The files a run writes its final weights to, by framework, and the moving average of them (ema_decay) beside them
WEIGHTS_FILES = {"tensorflow": "final.weights.h5", "torch": "final.pt"}
EMA_WEIGHTS_FILES = {"tensorflow": "final-ema.weights.h5", "torch": "final-ema.pt"}


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
        image_size: Square side in pixels the reader crops and resizes to, or a progressive-resizing
            schedule ``[(0, 128), (6, 192), (12, 224)]`` of ``(epoch, size)`` (models with global pooling;
            `training.image_sizes`).
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
        lr_schedule: ``"constant"``, ``"cosine"`` (to zero at the last step) or ``"step"`` (divided by 10
            at a third, two thirds and eight ninths of the epochs); see `learning_rate_at`.
        warmup_epochs: Epochs (a fraction too) over which the rate rises linearly, step by step, to
            ``learning_rate`` before the schedule (0: none; large global batches want ~5, Goyal et al.).
        weight_decay: With ``"sgd"``, L2 added to the gradient (the ResNet recipe's 1e-4); with ``"adam"``,
            decoupled decay (AdamW). Only weights of more than one dimension decay, not biases or
            normalisation scales and shifts (`decays`). 0: none.
        label_smoothing: The share of each target spread evenly over all classes, in [0, 1) (0.1 is the
            common choice for ImageNet).
        accumulate_batches: Batches (a replica's or rank's) whose gradients make one optimizer step: the
            global batch is ``batch_size`` x replicas x this, where memory holds ``batch_size`` images at once.
            Steps (``steps_per_epoch``, backups, the learning-rate schedule) count optimizer steps.
        ema_decay: Also keep an exponential moving average of the weights with this decay a step, in (0, 1)
            (e.g. 0.9998), validated each epoch (``val_ema_*``) and written beside the final weights
            (`EMA_WEIGHTS_FILES`). None: none.
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
    lr_schedule: str = "constant"
    warmup_epochs: float = 0.0
    weight_decay: float = 0.0
    label_smoothing: float = 0.0
    accumulate_batches: int = 1
    ema_decay: float | None = None

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
        if self.lr_schedule not in LR_SCHEDULES:
            raise InvalidTrainingInput(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        for name, fits, bounds in (("warmup_epochs", lambda v: v <= self.epochs, f"from 0 to epochs ({self.epochs})"),
                                   ("weight_decay", lambda v: True, "of at least 0"),
                                   ("label_smoothing", lambda v: v < 1, "in [0, 1)")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value >= 0 and fits(value)):
                raise InvalidTrainingInput(f"{name} must be a number {bounds}, got {value!r}")
        if not _is_int(self.accumulate_batches) or self.accumulate_batches < 1:
            raise InvalidTrainingInput(f"accumulate_batches must be a positive number of batches, got "
                                       f"{self.accumulate_batches!r}")
        decay = self.ema_decay
        if decay is not None and (isinstance(decay, bool) or not isinstance(decay, numbers.Real) or not 0 < decay < 1):
            raise InvalidTrainingInput(f"ema_decay must be a decay a step between 0 and 1 (e.g. 0.9998), got {decay!r}")

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate changes during the fit (a schedule or a warm-up)."""
        return self.lr_schedule != "constant" or self.warmup_epochs > 0

    def learning_rate_at(self, step, steps_per_epoch: int, ops=None):
        """The learning rate of a training step: the one rule both frameworks follow. The warm-up takes step
        ``s`` to ``learning_rate * (s + 1) / warmup_steps``; then the schedule.

        Args:
            step: The step, 0-based, counted over the whole fit (a number, or a step tensor with `ops`).
            steps_per_epoch: Steps in an epoch (the warm-up and the step decay count epochs).
            ops: The math to compute it with: `PYTHON_MATH` (None) for a number; TensorFlow's for a step
                tensor inside the compiled step (`keras_recipe`).
        """
        ops = ops or PYTHON_MATH
        s = ops.as_float(step)
        rate = self.learning_rate
        warmup = round(self.warmup_epochs * steps_per_epoch)
        if warmup:
            rate = rate * ops.minimum((s + 1) / warmup, 1.0)
        if self.lr_schedule == "cosine":
            done = ops.minimum(ops.maximum((s - warmup) / max(self.epochs * steps_per_epoch - warmup, 1), 0.0), 1.0)
            rate = rate * 0.5 * (1 + ops.cos(math.pi * done))
        elif self.lr_schedule == "step":
            for fraction in STEP_DECAY_AT:
                rate = rate * (1 - (1 - STEP_DECAY) * ops.reached(s, round(fraction * self.epochs) * steps_per_epoch))
        return rate

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


class PYTHON_MATH:  # noqa: N801 - a namespace, named as the constant it is
    """`FitOptions.learning_rate_at`'s math on Python numbers."""
    as_float = staticmethod(float)
    minimum = staticmethod(min)
    maximum = staticmethod(max)
    cos = staticmethod(math.cos)

    @staticmethod
    def reached(step, milestone) -> float:
        return 1.0 if step >= milestone else 0.0


TOP_K = 5   # top-5 accuracy, ImageNet's second figure


def reports_top_k(num_classes: int) -> bool:
    """Whether a fit reports ``top5_accuracy`` (and ``val_top5_accuracy``): with more than `TOP_K` classes,
    where it is not always 1."""
    return int(num_classes) > TOP_K


def decays(shape) -> bool:
    """Whether `weight_decay` applies to a parameter of this shape: weights of convolutions and dense layers,
    not biases or normalisation scales and shifts (the "no bias decay" of Goyal et al., 2017)."""
    return len(shape) > 1


def default_output_dir(model_name: str) -> Path:
    """``runs/<model>-<UTC time>``: a new folder per run, named in the pins version-time format."""

    return Path(RUNS_FOLDER) / f"{model_name}-{datetime.now(timezone.utc).strftime(TIME_FORMAT)}"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


DEFAULTS = FitOptions()

__all__ = ["DEFAULTS", "FitOptions", "LR_SCHEDULES", "OPTIMIZERS", "PYTHON_MATH", "RUNS_FOLDER", "SGD_MOMENTUM",
           "TOP_K", "check_optimizer", "decays", "default_output_dir", "reports_top_k"]
