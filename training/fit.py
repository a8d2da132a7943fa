"""``train`` / ``alexnet_train``: a Keras fit under any strategy, resumable, with logs and plots.

Data comes as a Parquet dataset URL from the pipeline (read with ``pipeline.make_dataset``,
one shard per worker), as a data map ``{image, category, categories}`` (converted to Parquet
first) or as a ``tf.data.Dataset``. ``batch_size`` is per replica: the global batch grows with
the number of replicas, so adding devices adds throughput, not smaller steps. A
``checkpoint_dir`` turns on ``BackupAndRestore``: a run that is killed and started again with
the same arguments resumes at the last backup (each epoch, or every ``backup_every`` steps; a
Parquet input then continues mid-epoch where the backup left it, see ``training.resume``). Every
run writes TensorBoard logs, a CSV of per-epoch metrics and a PNG of the curves; in a
multi-worker run only the chief writes into ``output_dir`` and the others write into ``output_dir/workers/rank<N>``.
"""

from __future__ import annotations

from .keras_env import tensorflow  # must precede TensorFlow

import contextlib
import functools
import os
import random
import time
from datetime import datetime, timezone
from pathlib import Path

tf = tensorflow()   # imported without its start-up noise (see keras_env)
import tf_keras as keras

from .errors import InvalidTrainingInput, TrainingError
from . import keras_recipe, multiworker, resume
from .results import TrainResult
from .runs import DEFAULTS as FIT, EMA_WEIGHTS_FILES, WEIGHTS_FILES, FitOptions, default_output_dir
from .inputs import is_data_map, map_classes, resolve_input
from .models import build_model
from .plots import plot_curves, read_metrics_csv
from .schedule import ImageSizeSchedule
from .strategy import make_strategy, strategy_choice, uses_gpus
from pinstorm.boards.safety import secrets
from pinstorm.progress import progress_bar
from pinstorm.pipeline import dataset_position

__all__ = ["TrainResult", "TrainingError", "alexnet_train", "train"]

log = secrets.logger("pinstorm.training")


# --------------------------------------------------------------------------- callbacks

class _Throughput(keras.callbacks.Callback):
    """Wall time and images per second of each epoch (the first includes tracing)."""

    def __init__(self, global_batch: int):
        super().__init__()
        self.global_batch = global_batch
        self.epoch_seconds: list[float] = []
        self.epoch_images: list[int] = []
        self._started = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        # no per-batch hook: it would make Keras call back into Python after every step
        self.epoch_seconds.append(time.perf_counter() - self._started)
        self.epoch_images.append((self.params.get("steps") or 0) * self.global_batch)


class _EpochProgress(keras.callbacks.Callback):
    """The running epoch's steps as pinstorm's progress (`pinstorm.progress`: a bar on a terminal, a line
    every PINSTORM_PROGRESS_INTERVAL seconds in a log), so a long epoch is never silent. Its logs stay
    tensors (`_supports_tf_logs`): the per-step hook adds no device sync, only a Python call."""

    _supports_tf_logs = True

    def __init__(self):
        super().__init__()
        self._shown = contextlib.ExitStack()
        self._advance = None

    def on_epoch_begin(self, epoch, logs=None):
        self.close()
        self._advance = self._shown.enter_context(
            progress_bar(f"epoch {epoch + 1}/{self.params.get('epochs')}", self.params.get("steps"), unit="steps"))

    def on_train_batch_end(self, batch, logs=None):
        if self._advance is not None:
            self._advance(1)

    def on_epoch_end(self, epoch, logs=None):
        self.close()

    def close(self):
        self._advance = None
        self._shown.close()


def _has_backup(checkpoint_dir: Path | None) -> bool:
    return bool(checkpoint_dir) and tf.train.latest_checkpoint(str(checkpoint_dir / "chief")) is not None


def _input_position(strategy, train_input, global_batch, options):
    """(`DatasetPosition` of this worker's Parquet pipeline built with `options`, the batches it delivers per
    step), or None: several pipelines (shards) on this worker, whose positions are not kept."""
    if options is None or len(train_input.shards) != 1:
        return None
    replicas = strategy.num_replicas_in_sync
    local = len(getattr(strategy.extended, "worker_devices", ())) or replicas   # the replicas this pipeline feeds
    position = dataset_position(train_input.url, batch_size=global_batch // replicas, shard=train_input.shards[0],
                                shuffle=options.get("shuffle", True), seed=options.get("seed"),
                                shuffle_buffer=options.get("shuffle_buffer"), num_epochs=None, drop_remainder=True,
                                state=options.get("state"), storage_options=options.get("storage_options"),
                                stream=options.get("stream", False))
    return position, local


def _backup_callback(checkpoint_dir: Path, backup_every, tracked, saved, rank, last: bool = True):
    """``BackupAndRestore`` every `backup_every` steps (or epoch); with `tracked` (`_input_position`), one that
    also saves the input's position (`resume.ResumeState`), which this worker's pipeline started at `saved`.
    `last`: it deletes the backup when the fit ends (not between two phases of a schedule)."""
    if tracked is None:
        return keras.callbacks.BackupAndRestore(backup_dir=str(checkpoint_dir), save_freq=backup_every,
                                                delete_checkpoint=last)
    position, local = tracked
    return resume.ResumeState(checkpoint_dir, positions=[position], batches_per_step=local, save_freq=backup_every,
                              origin=saved["steps"] if saved else 0, rank=rank, delete_checkpoint=last)


# --------------------------------------------------------------------------- entry points

def train(
    model_name: str = "alexnet",
    data=None,
    validation_data=None,
    *,
    strategy: tf.distribute.Strategy | None = None,
    epochs: int = FIT.epochs,
    batch_size: int = FIT.batch_size,
    image_size: int | list = FIT.image_size,
    num_classes: int | None = FIT.num_classes,
    parallel: int | None = None,
    checkpoint_dir=FIT.checkpoint_dir,
    output_dir=FIT.output_dir,
    cache_dir=None,
    learning_rate: float = FIT.learning_rate,
    optimizer: str = FIT.optimizer,
    model_kwargs: dict | None = FIT.model_kwargs,
    steps_per_epoch: int | None = FIT.steps_per_epoch,
    mixed_precision: str | bool = "auto",
    seed: int | None = FIT.seed,
    callbacks: list | None = None,
    input_options: dict | None = FIT.input_options,
    verbose: int | str = 2,
    pin: str | tuple | None = FIT.pin,
    lineage: dict | None = FIT.lineage,
    backup_every: int | str = "epoch",
    lr_schedule: str = FIT.lr_schedule,
    warmup_epochs: float = FIT.warmup_epochs,
    weight_decay: float = FIT.weight_decay,
    label_smoothing: float = FIT.label_smoothing,
    accumulate_batches: int = FIT.accumulate_batches,
    ema_decay: float | None = FIT.ema_decay,
) -> TrainResult:
    """Fit ``model_name`` on ``data``; return the history and the final validation metrics.

    ``batch_size`` is per replica (global batch = batch_size x replicas). ``strategy``: a
    ``tf.distribute.Strategy`` or None for ``make_strategy("auto")``. ``checkpoint_dir``: back up
    every epoch (or ``backup_every`` steps) there and resume from it when a backup exists (deleted
    after a finished run).
    ``output_dir`` (default ``runs/<model>-<UTC time>``) receives ``metrics.csv``,
    ``curves.png``, ``tensorboard/`` and ``final.weights.h5``. ``mixed_precision="auto"`` uses
    mixed_float16 when every replica is a GPU. ``seed`` makes shuffling and initial weights
    repeatable (it seeds Python's and NumPy's generators, not TF's global seed).
    ``image_size``: pixels, or a progressive-resizing schedule ``[(0, 128), (6, 192), (12, 224)]``
    (epoch, size) for models with global pooling (see ``training.schedule``).
    ``input_options`` go to ``pipeline.make_dataset`` for Parquet inputs (e.g.
    ``{"flip": False, "crop_area": (0.8, 1.0)}`` for digits, which a mirror image would turn
    into other digits).

    ``pin="board/name"`` (a registered board), ``(board, "name")`` (a ``Board`` from a constructor
    such as ``board_folder``) or ``"name"`` (the default board) pins the finished run as a new
    version of that pin: weights, metrics.csv, curves.png, the TensorBoard logs zipped and a
    lineage record, to which ``lineage`` (a JSON-able dict, e.g. the pins the data came from) is
    added; ``result.experiment`` says where it went (see ``training.experiments``).

    ``backup_every``: back up every that many steps instead of every epoch (``BackupAndRestore``'s
    ``save_freq``). With a Parquet input (or a data map) the position of the input is saved with each
    backup (`training.resume`), and a restarted run continues mid-epoch with exactly the samples the
    interrupted one had not trained on (not with progressive resizing, nor the petastorm engine).

    The options every fit shares (``epochs``, ``batch_size``, ``image_size``, ``num_classes``,
    ``learning_rate``, ``optimizer``, ``model_kwargs``, ``steps_per_epoch``, ``seed``, ``output_dir``,
    ``checkpoint_dir``, ``input_options``, ``pin``, ``lineage``, ``lr_schedule``, ``warmup_epochs``,
    ``weight_decay``, ``label_smoothing``, ``accumulate_batches``, ``ema_decay``) are described once on
    [`FitOptions`][pinstorm.training.runs.FitOptions].

    ``accumulate_batches=N``: a Parquet input is read in batches of ``batch_size * N`` a replica, each cut in
    N slices whose gradients are summed before one update (`keras_recipe.accumulate`); a ``tf.data.Dataset``'s
    own batches are cut in N, so each must divide by N. Validation runs at ``batch_size``. One replica only (a
    strategy of more is refused; see docs/training.md).

    ``ema_decay=d`` keeps tf-keras's moving average of the trainable weights (``use_ema``, updated inside the
    compiled step) and one of the batch-norm statistics (`keras_recipe.average_statistics`), kept in the
    backups, validated after each
    epoch (``val_ema_*``; ``ema_*`` in ``val_metrics``) and written as ``final-ema.weights.h5``
    (``ema_weights_path``, pinned with ``pin=``).

    Args:
        model_name: The model to build: ``"alexnet"``, ``"resnet50"`` or ``"mobilenet_v2"`` (`build_model`).
        data: The training data: a Parquet dataset URL from `convert` (local, fsspec or ``board://``), a
            data map ``{image, category, categories}`` (converted to Parquet first) or a
            ``tf.data.Dataset`` of ``(image, label)`` batches.
        validation_data: Evaluated after each epoch, every row once; the same kinds as ``data`` (None:
            no validation).
        strategy: A ``tf.distribute.Strategy``, or None for ``make_strategy("auto")``.
        parallel: Parallel decode calls of the reader (None: ``tf.data.AUTOTUNE``).
        cache_dir: Where a data map is converted to Parquet (None: ``<output_dir>/data``).
        mixed_precision: ``"auto"`` (mixed_float16 when every replica is a GPU), True or False.
        callbacks: Extra Keras callbacks for ``model.fit``.
        verbose: Keras's ``verbose`` for ``model.fit`` (0, 1, 2 or ``"auto"``).
        backup_every: ``"epoch"``, or back up to ``checkpoint_dir`` every that many steps.

    Returns:
        A `TrainResult`: the history, the final validation metrics, where the run's files went and,
        with ``pin``, the pinned experiment.
    """
    wall_started, started_at = time.perf_counter(), datetime.now(timezone.utc)
    if data is None:
        raise InvalidTrainingInput("train() needs data: a Parquet URL, a data map or a tf.data.Dataset")
    recipe = FitOptions.pick(locals())   # the checks every fit shares, and its learning rates (training/runs.py)
    sizes = ImageSizeSchedule(image_size, epochs)   # an int, or progressive resizing [(epoch, size), ...]
    image_size = sizes.final
    strategy = strategy or make_strategy("auto")
    in_cluster = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    config = multiworker.read_tf_config() if in_cluster else None
    chief = multiworker.is_chief(config)
    if pin is not None and chief:   # a bad target fails now, not after hours of training
        from .experiments import check_target
        check_target(pin)
    output_dir = Path(output_dir) if output_dir else default_output_dir(model_name)
    write_dir = multiworker.worker_output_dir(output_dir, config)
    cache_dir = Path(cache_dir) if cache_dir else write_dir / "data"
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None

    replicas = strategy.num_replicas_in_sync
    if accumulate_batches > 1 and replicas > 1:
        raise InvalidTrainingInput(
            f"accumulate_batches={accumulate_batches} with TensorFlow trains on one replica; this strategy has "
            f"{replicas}: use a one-device strategy, or the replicas' own larger global batch, or train_torch "
            "(which accumulates under DDP)")
    global_batch = batch_size * replicas * accumulate_batches   # an optimizer step's; memory holds batch_size a replica
    common = dict(strategy=strategy, global_batch=batch_size * replicas, image_size=image_size, parallel=parallel,
                  seed=seed, cache_dir=cache_dir, input_options=dict(input_options or {}))
    training = {**common, "global_batch": global_batch}   # validation reads batch_size a replica
    rank = multiworker.task_rank(config)
    # a Parquet stream's position is kept for a backup to resume at, and for the phases of a schedule to go on
    keeps_position = ((checkpoint_dir is not None or sizes.progressive) and not isinstance(data, tf.data.Dataset)
                      and common["input_options"].get("engine", "pyarrow") == "pyarrow")
    saved_input = None
    if keeps_position:   # the data seed must be known to compute positions; a saved state carries its own
        saved_input = resume.load_state(checkpoint_dir, rank) if checkpoint_dir else None
        if saved_input is None and _has_backup(checkpoint_dir) and not (sizes.progressive and seed is not None):
            log.warning("%s: no input position saved with this backup; the data restarts at its beginning",
                        checkpoint_dir)
        train_options = dict(common["input_options"])
        train_options.setdefault("seed", seed if seed is not None else random.SystemRandom().randrange(2**31))
        if saved_input is not None:
            train_options["state"] = saved_input["input"][0]
        train_input = resolve_input(data, role="train", num_classes=num_classes, classes=None,
                                    **{**training, "input_options": train_options})
    else:
        train_input = resolve_input(data, role="train", num_classes=num_classes, classes=None, **training)
    num_classes = num_classes or train_input.num_classes
    if not num_classes:
        raise InvalidTrainingInput("num_classes is required when training on a tf.data.Dataset")
    if train_input.num_classes and num_classes != train_input.num_classes:
        raise InvalidTrainingInput(f"num_classes={num_classes} but the training data has "
                                   f"{train_input.num_classes} classes")
    val_input, validation_at = None, None
    if validation_data is not None:
        train_classes = train_input.classes or (map_classes(data) if is_data_map(data) else None)
        val_input = resolve_input(validation_data, role="val", num_classes=num_classes, classes=train_classes,
                                   **common)
        if val_input.classes and train_input.classes and val_input.classes != train_input.classes:
            raise InvalidTrainingInput("training and validation data label different classes; convert both with the "
                                       "same `classes`")

        @functools.cache
        def validation_at(size):
            """The validation data at `size` pixels (progressive resizing validates each phase at its own)."""
            if size == image_size:
                return val_input.dataset
            return resolve_input(validation_data, role="val", num_classes=num_classes, classes=train_classes,
                                 **{**common, "image_size": size}).dataset
    steps = steps_per_epoch or train_input.steps
    if recipe.scheduled and not steps:
        raise InvalidTrainingInput(f"lr_schedule={lr_schedule!r} with warmup_epochs={warmup_epochs} needs the steps "
                                   "of an epoch: give steps_per_epoch with a tf.data.Dataset")
    write_dir.mkdir(parents=True, exist_ok=True)   # once the run is possible: a refused one leaves no folder
    if seed is not None:
        _seed_python_and_numpy(seed)

    use_mixed = uses_gpus(strategy) if mixed_precision == "auto" else bool(mixed_precision)
    previous_policy = keras.mixed_precision.global_policy()

    def compiled_model(size):
        with strategy.scope():
            if use_mixed:
                keras.mixed_precision.set_global_policy("mixed_float16")
            try:
                model = build_model(model_name, (size, size, 3), num_classes, **(model_kwargs or {}))
            finally:
                keras.mixed_precision.set_global_policy(previous_policy)
            model.compile(optimizer=keras_recipe.optimizer(recipe, steps, model),
                          loss=keras_recipe.loss(recipe, num_classes), metrics=keras_recipe.metrics(num_classes))
            keras_recipe.accumulate(model, recipe.accumulate_batches)
            keras_recipe.average_statistics(model)
            _make_step_variables(model)
        return model
    model = compiled_model(image_size)

    resumed = _has_backup(checkpoint_dir)
    metrics_csv = write_dir / "metrics.csv"
    throughput = _Throughput(global_batch)
    fit_callbacks = [throughput, keras.callbacks.CSVLogger(str(metrics_csv), append=resumed),
                     keras.callbacks.TensorBoard(log_dir=str(write_dir / "tensorboard"), profile_batch=0)]
    tracked = _input_position(strategy, train_input, global_batch, train_options) if keeps_position else None
    if checkpoint_dir is not None and not sizes.progressive:   # a schedule makes one per phase
        fit_callbacks.insert(0, _backup_callback(checkpoint_dir, backup_every, tracked, saved_input, rank))
    if recipe.scheduled:   # before the CSVLogger, which writes what the epoch's logs hold when it runs
        fit_callbacks.insert(0, keras_recipe.LearningRateLog(recipe, steps))
    if recipe.ema_decay and validation_at:   # also before the CSVLogger
        fit_callbacks.insert(0, keras_recipe.AverageValidation(validation_at))
    fit_callbacks += list(callbacks or [])
    progress = _EpochProgress()
    if chief:
        fit_callbacks.append(progress)

    started = time.perf_counter()
    try:
        if sizes.progressive:   # one fit per phase, at its size (training/schedule.py)
            def phase_data(size, step):
                """The training data at `size`, starting at the run's `step` where its position is kept."""
                options = common["input_options"]
                if tracked is not None and step is not None:   # the position counts from the saved step, or 0
                    position, local = tracked
                    origin = saved_input["steps"] if saved_input else 0
                    options = {**train_options, "state": position.state((step - origin) * local)}
                return resolve_input(data, role="train", num_classes=num_classes, classes=None,
                                     **{**training, "image_size": size, "input_options": options}).dataset

            model, history = sizes.fit(
                compiled_model, phase_data,
                validation_data=validation_at, epochs=epochs, steps_per_epoch=steps, callbacks=fit_callbacks,
                checkpoint_dir=checkpoint_dir, verbose=verbose,
                backup=lambda last: _backup_callback(checkpoint_dir, backup_every, tracked, saved_input, rank, last))
        else:
            history = model.fit(train_input.dataset, epochs=epochs, steps_per_epoch=steps,
                                validation_data=val_input.dataset if val_input else None,
                                callbacks=fit_callbacks, verbose=verbose)
    finally:   # a fit that fails mid-epoch leaves no progress bar open
        progress.close()
    fit_seconds = time.perf_counter() - started
    val_metrics = {}
    if val_input is not None:
        val_metrics = {k: float(v) for k, v in model.evaluate(val_input.dataset, verbose=0, return_dict=True).items()}

    weights_path = _save_weights(model, write_dir / WEIGHTS_FILES["tensorflow"])
    ema_weights_path = None
    if recipe.ema_decay:
        with keras_recipe.averaged_weights(model):
            if val_input is not None:
                val_metrics.update({f"ema_{name}": float(value) for name, value in
                                    model.evaluate(val_input.dataset, verbose=0, return_dict=True).items()})
            ema_weights_path = _save_weights(model, write_dir / EMA_WEIGHTS_FILES["tensorflow"])
    plot_png = None
    if metrics_csv.exists() and metrics_csv.stat().st_size:
        plot_png = plot_curves(read_metrics_csv(metrics_csv), write_dir / "curves.png",
                               title=f"{model.name}: {replicas} replica(s), global batch {global_batch}")
    images = sum(throughput.epoch_images)
    train_seconds = sum(throughput.epoch_seconds)
    choice = strategy_choice(strategy)
    result = TrainResult(
        history={k: [float(x) for x in v] for k, v in history.history.items()},
        val_metrics=val_metrics, model=model, epochs=[int(e) for e in history.epoch],
        initial_epoch=(history.epoch[0] if history.epoch else epochs), global_batch_size=global_batch,
        replicas=replicas, steps_per_epoch=steps, seconds=fit_seconds,
        images_per_second=images / train_seconds if train_seconds else 0.0,
        strategy=choice.as_dict() if choice else None, output_dir=str(write_dir), metrics_csv=str(metrics_csv),
        plot_png=str(plot_png) if plot_png else None, tensorboard_dir=str(write_dir / "tensorboard"),
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None, weights_path=str(weights_path),
        num_classes=num_classes, is_chief=chief, input_shards=list(train_input.shards),
        ema_weights_path=str(ema_weights_path) if ema_weights_path else None,
    )
    if pin is not None and chief:
        from . import experiments

        result.experiment = experiments.pin_fit(
            result, pin, model_name=model_name, image_size=image_size, model_kwargs=model_kwargs, data=data,
            validation_data=validation_data, train_url=train_input.url, val_url=val_input.url if val_input else None,
            arguments={"epochs": epochs, "batch_size": batch_size,
                       "image_size": sizes.as_list() if sizes.progressive else image_size,
                       "learning_rate": learning_rate, "optimizer": optimizer, "lr_schedule": lr_schedule,
                       "warmup_epochs": warmup_epochs, "weight_decay": weight_decay,
                       "label_smoothing": label_smoothing, "accumulate_batches": accumulate_batches,
                       "ema_decay": ema_decay, "steps_per_epoch": steps_per_epoch,
                       "mixed_precision": mixed_precision, "seed": seed, "parallel": parallel,
                       "input_options": dict(input_options or {}), "output_dir": str(output_dir),
                       "checkpoint_dir": str(checkpoint_dir) if checkpoint_dir else None},
            strategy=strategy, started_at=started_at, wall_started=wall_started, lineage=lineage)
    return result


def _save_weights(model, path: Path) -> Path:
    """The model's weights at `path`, whole or not at all: written beside it, then renamed (a crash never
    leaves half a weights file). The ".weights.h5" ending selects the Keras weights format."""
    temporary = path.with_name(f".partial-{path.name}")
    model.save_weights(str(temporary))
    os.replace(temporary, path)
    return path


def _seed_python_and_numpy(seed: int) -> None:
    """Make initial weights and dropout repeatable without TensorFlow's global seed.

    tf-keras draws every unseeded initializer's and dropout layer's seed from Python's ``random``.
    TF's global seed (``tf.random.set_seed``, which ``keras.utils.set_random_seed`` also sets) is
    left alone: it is process-wide, and any tf.data graph in the process that passes a tensor seed
    to ``shuffle`` then fails to build (TF's ``get_seed`` compares the seed pair with ``==``).
    """
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)


def _make_step_variables(model) -> None:
    """Create the optimizer's slots and the loss and metric variables now, as Keras would in the first training
    step: a variable made while ``fit`` traces its step makes TensorFlow trace the step a second time. Each
    `fit` (each phase of a schedule) then traces once: a MobileNetV2 fit of two steps took 5.1 CPU-s instead
    of 8.5. Labels are class indices (rank 1), as every reader here gives them, so "accuracy" resolves to the
    same sparse accuracy it would in the step. Where tf_keras lacks a part of this, the step makes it."""
    try:
        model.optimizer.build(model.trainable_variables)
        y_pred = tf.zeros((1, *model.output_shape[1:]))
        model.compiled_loss.build(y_pred)
        model.compiled_metrics.build(y_pred, tf.zeros((1,), tf.int64))
    except (AttributeError, NotImplementedError):
        pass


def alexnet_train(
    data,
    strategy: tf.distribute.Strategy | None = None,
    epochs: int = 10,
    batch_size: int = 32,
    image_size: int = 224,
    parallel: int | None = None,
    checkpoint_dir=None,
    *,
    width: float = 1.0,
    normalization: str | None = "lrn",
    dropout: float = 0.5,
    validation_data=None,
    **kwargs,
) -> TrainResult:
    """Train AlexNet (``width`` scales it down for small inputs and CPUs); see ``train``.

    Args:
        data: As `train`'s.
        strategy: As `train`'s.
        epochs: As `train`'s (`FitOptions`).
        batch_size: As `train`'s (`FitOptions`).
        image_size: As `train`'s (`FitOptions`).
        parallel: As `train`'s.
        checkpoint_dir: As `train`'s (`FitOptions`).
        width: Scales every layer's channels (0.25: a quarter).
        normalization: ``"lrn"`` (the paper's local response normalisation), ``"batch"`` or None.
        dropout: The dropout rate of the dense layers.
        validation_data: As `train`'s.
        **kwargs: Any other `train` argument.

    Returns:
        A `TrainResult`.
    """
    model_kwargs = dict(width=width, normalization=normalization, dropout=dropout)
    model_kwargs.update(kwargs.pop("model_kwargs", None) or {})
    return train("alexnet", data, validation_data, strategy=strategy, epochs=epochs, batch_size=batch_size,
                 image_size=image_size, parallel=parallel, checkpoint_dir=checkpoint_dir,
                 model_kwargs=model_kwargs, **kwargs)

