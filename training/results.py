"""What a training run produced, and why one could not start: one definition for the TensorFlow path
(`fit.train`) and the PyTorch path (`torch_fit.train_torch`). No framework is imported here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pinstorm.boards import secrets
from pinstorm.errors import PinstormError


class TrainingError(PinstormError, ValueError):
    """Training cannot start with the arguments given (data, sizes, classes, ...)."""


@dataclass
class TrainResult:
    """What a fit produced. ``history`` covers this call's epochs; ``metrics_csv`` the whole run."""

    history: dict[str, list[float]]
    val_metrics: dict[str, float]
    model: Any = field(repr=False)
    epochs: list[int] = field(default_factory=list)
    initial_epoch: int = 0
    global_batch_size: int = 0
    replicas: int = 1
    steps_per_epoch: int | None = None
    seconds: float = 0.0
    images_per_second: float = 0.0
    strategy: dict | None = None
    output_dir: str | None = None
    metrics_csv: str | None = None
    plot_png: str | None = None
    tensorboard_dir: str | None = None
    checkpoint_dir: str | None = None
    weights_path: str | None = None
    num_classes: int = 0
    is_chief: bool = True
    input_shards: list = field(default_factory=list)
    experiment: dict | None = None      # where ``pin=`` stored the run (an ExperimentRecord: board, name, version)
    framework: str = "tensorflow"       # or "torch"

    def summary(self) -> dict:
        """Everything but the model, JSON-serialisable (for reports and for Spark to send home)."""
        out = {k: v for k, v in self.__dict__.items() if k != "model"}
        return secrets.scrub(json.loads(json.dumps(out, default=float)))
