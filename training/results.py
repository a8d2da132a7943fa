"""What a training run produced, and why one could not start: one definition for the TensorFlow path
(`fit.train`) and the PyTorch path (`torch_fit.train_torch`). No framework is imported here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pinstorm.boards.safety import secrets

from .errors import InvalidTrainingInput, TrainingError  # noqa: F401  (re-exported: their old home)


@dataclass
class TrainResult:
    """What a fit produced. ``history`` covers this call's epochs; ``metrics_csv`` the whole run.

    Attributes:
        history: Each metric's value per epoch of this call.
        val_metrics: The final validation metrics (empty without validation data).
        model: The trained model (Keras, or a ``torch.nn.Module``).
        epochs: The epochs this call trained (0-based).
        initial_epoch: The epoch this call started at (after a resume, not 0).
        global_batch_size: Images per step over all replicas or ranks.
        replicas: Replicas (TensorFlow) or ranks (PyTorch) that trained.
        steps_per_epoch: Training steps per epoch.
        seconds: How long the fit took.
        images_per_second: Training throughput over all replicas.
        strategy: What strategy or backend was chosen, and why (a fallback included).
        output_dir: The run's folder.
        metrics_csv: The run's per-epoch metrics, every call's epochs included.
        plot_png: The training curves.
        tensorboard_dir: The TensorBoard logs (TensorFlow).
        checkpoint_dir: Where backups were kept (None: none).
        weights_path: The final weights.
        ema_weights_path: The final moving average of the weights (torch's ``ema_decay``; None: none kept).
        num_classes: Output classes.
        is_chief: This worker or rank wrote the run's files.
        input_shards: Each input's ``(index, count)`` shard this worker read (None: all of it).
        experiment: Where ``pin=`` stored the run (board, name, version), else None.
        framework: ``"tensorflow"`` or ``"torch"``.
        input_stall: The share of the training time the model waited for its input (torch; None:
            not measured).
    """

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
    ema_weights_path: str | None = None
    num_classes: int = 0
    is_chief: bool = True
    input_shards: list = field(default_factory=list)
    experiment: dict | None = None      # where ``pin=`` stored the run (an ExperimentRecord: board, name, version)
    framework: str = "tensorflow"       # or "torch"
    # the share of the training time the model waited for its input (the torch path times each batch's
    # fetch; TensorFlow fetches inside its compiled step, where `pinstorm profile` measures it instead)
    input_stall: float | None = None

    def summary(self) -> dict:
        """Everything but the model, JSON-serialisable (for reports and for Spark to send home)."""
        out = {k: v for k, v in self.__dict__.items() if k != "model"}
        return secrets.scrub(json.loads(json.dumps(out, default=float)))
