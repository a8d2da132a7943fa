"""``train`` / ``alexnet_train``: a Keras fit under any strategy, resumable, with logs and plots.

Data comes as a Parquet dataset URL from the pipeline (read with ``pipeline.make_dataset``,
one shard per worker), as a data map ``{image, category, categories}`` (converted to Parquet
first) or as a ``tf.data.Dataset``. ``batch_size`` is per replica: the global batch grows with
the number of replicas, so adding devices adds throughput, not smaller steps. A
``checkpoint_dir`` turns on ``BackupAndRestore``: a run that is killed and started again with
the same arguments resumes at the last finished epoch. Every run writes TensorBoard logs, a CSV
of per-epoch metrics and a PNG of the curves; in a multi-worker run only the chief writes into
``output_dir`` and the others write into ``output_dir/workers/rank<N>``.
"""

from __future__ import annotations

from . import keras_env  # noqa: F401  (must precede TensorFlow)

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from . import multiworker
from .models import build_model
from .plots import plot_curves, read_metrics_csv
from .strategy import make_strategy, strategy_choice, uses_gpus
from pinstorm.errors import PinstormError

log = logging.getLogger("pinstorm.training")


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

    def summary(self) -> dict:
        """Everything but the model, JSON-serialisable (for reports and for Spark to send home)."""
        out = {k: v for k, v in self.__dict__.items() if k != "model"}
        return json.loads(json.dumps(out, default=float))


# --------------------------------------------------------------------------- inputs

@dataclass
class _Input:
    """A training or validation input ready for ``fit``: a dataset (maybe distributed) and its size."""

    dataset: Any
    rows: int | None
    num_classes: int | None
    classes: list | None = None
    steps: int | None = None
    shards: list = field(default_factory=list)   # (index, count) each input pipeline read, None = all rows


def _is_data_map(data) -> bool:
    return isinstance(data, dict) and "image" in data and "category" in data


def _map_classes(data_map: dict) -> list | None:
    """The wnids that fix a data map's labels: all of them (``classes``), else its ``categories``."""
    return data_map.get("classes") or data_map.get("categories")


def _convert_data_map(data_map: dict, cache_dir: Path, split: str, classes, parallel) -> str:
    """Convert a data map to Parquet under ``cache_dir`` (the pipeline reuses a finished identical one)."""
    from pinstorm import pipeline
    digest = hashlib.sha1(json.dumps([list(map(str, data_map["image"])), list(map(str, data_map["category"])),
                                      list(classes or [])]).encode()).hexdigest()[:12]
    target = cache_dir / f"{split}-{digest}"
    result = pipeline.convert(data_map, str(target), classes=classes, split=split, parallel=parallel)
    log.info("converted %d %s images to %s", result.rows, split, target)
    return str(target)


def _prepare_images(dataset: tf.data.Dataset, image_size: int) -> tf.data.Dataset:
    """Resize images to ``image_size`` when they are not already, and make labels int32."""
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise TrainingError("a tf.data.Dataset must yield (image, label) pairs")
    shape = spec[0].shape
    needs_resize = shape.rank is None or tuple(shape[-3:-1]) != (image_size, image_size)

    def prepare(images, labels):
        images = tf.cast(images, tf.float32)
        if needs_resize:
            images = tf.image.resize(images, (image_size, image_size))
        return images, tf.cast(labels, tf.int32)

    return dataset.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)


def _with_data_sharding(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Shard by element across workers (in-memory datasets have no files to shard by)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def _dataset_input(dataset: tf.data.Dataset, *, global_batch, image_size, num_classes) -> _Input:
    images_spec = dataset.element_spec[0] if isinstance(dataset.element_spec, tuple) else None
    if images_spec is None:
        raise TrainingError("a tf.data.Dataset must yield (image, label) pairs")
    batched = images_spec.shape.rank == 4
    dataset = _prepare_images(dataset, image_size)
    cardinality = int(dataset.cardinality())
    rows = None
    if not batched:
        rows = cardinality if cardinality >= 0 else None
        dataset = dataset.batch(global_batch, drop_remainder=False)
    dataset = _with_data_sharding(dataset.prefetch(tf.data.AUTOTUNE))
    return _Input(dataset, rows, num_classes)


def _parquet_train_input(strategy, url: str, info: dict, *, global_batch, image_size, parallel, seed,
                         input_options):
    """One endless ``make_dataset`` per worker over its own shard, batched per replica."""
    from pinstorm import pipeline
    rows = int(info["rows"])
    steps = rows // global_batch
    if steps < 1:
        raise TrainingError(f"{url} has {rows} rows, fewer than one global batch of {global_batch}; "
                            "lower batch_size")

    shards: list = []

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        shard = None
        if context.num_input_pipelines > 1:
            shard = (context.input_pipeline_id, context.num_input_pipelines)
        shards.append(shard)
        # endless: shards may differ by a row group, and every worker must run the same number of steps.
        options = dict(shuffle=True, seed=seed, parallel=parallel)
        options.update(input_options)
        return pipeline.make_dataset(
            url, batch_size=context.get_per_replica_batch_size(global_batch), image_size=(image_size, image_size),
            training=True, shard=shard, num_epochs=None, drop_remainder=True, **options)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    return _Input(dataset, rows, int(info["num_classes"]), list(info.get("classes") or []), steps, shards)


def _parquet_eval_input(url: str, info: dict, *, global_batch, image_size, parallel, input_options) -> _Input:
    """Every validation row once per evaluation (Keras splits each global batch across replicas)."""
    from pinstorm import pipeline
    options = {k: v for k, v in input_options.items() if k in ("eval_crop", "engine", "reader_workers")}
    dataset = pipeline.make_dataset(url, batch_size=global_batch, image_size=(image_size, image_size),
                                    training=False, num_epochs=1, shuffle=False, parallel=parallel, **options)
    return _Input(_with_data_sharding(dataset), int(info["rows"]), int(info["num_classes"]),
                  list(info.get("classes") or []))


def _resolve_input(data, *, role, strategy, global_batch, image_size, parallel, seed, num_classes,
                   cache_dir, classes, input_options) -> _Input:
    training = role == "train"
    if isinstance(data, tf.data.Dataset):
        return _dataset_input(data, global_batch=global_batch, image_size=image_size, num_classes=num_classes)
    if _is_data_map(data):
        classes = classes or _map_classes(data)
        data = _convert_data_map(data, cache_dir, "train" if training else "val", classes, parallel)
    if isinstance(data, (str, os.PathLike)):
        from pinstorm import pipeline
        url = os.fspath(data)
        info = pipeline.dataset_info(url)
        if training:
            return _parquet_train_input(strategy, url, info, global_batch=global_batch, image_size=image_size,
                                        parallel=parallel, seed=seed, input_options=input_options)
        return _parquet_eval_input(url, info, global_batch=global_batch, image_size=image_size, parallel=parallel,
                                   input_options=input_options)
    raise TrainingError(f"{role} data must be a Parquet dataset URL, a data map or a tf.data.Dataset, "
                        f"not {type(data).__name__}")


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


def _has_backup(checkpoint_dir: Path | None) -> bool:
    return bool(checkpoint_dir) and tf.train.latest_checkpoint(str(checkpoint_dir / "chief")) is not None


def _default_output_dir(model_name: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("runs") / f"{model_name}-{stamp}"


# --------------------------------------------------------------------------- entry points

def train(
    model_name: str = "alexnet",
    data=None,
    validation_data=None,
    *,
    strategy: tf.distribute.Strategy | None = None,
    epochs: int = 10,
    batch_size: int = 32,
    image_size: int = 224,
    num_classes: int | None = None,
    parallel: int | None = None,
    checkpoint_dir=None,
    output_dir=None,
    cache_dir=None,
    learning_rate: float = 1e-3,
    optimizer: str = "adam",
    model_kwargs: dict | None = None,
    steps_per_epoch: int | None = None,
    mixed_precision: str | bool = "auto",
    seed: int | None = None,
    callbacks: list | None = None,
    input_options: dict | None = None,
    verbose: int | str = 2,
) -> TrainResult:
    """Fit ``model_name`` on ``data``; return the history and the final validation metrics.

    ``batch_size`` is per replica (global batch = batch_size x replicas). ``strategy``: a
    ``tf.distribute.Strategy`` or None for ``make_strategy("auto")``. ``checkpoint_dir``: back up
    every epoch there and resume from it when a backup exists (deleted after a finished run).
    ``output_dir`` (default ``runs/<model>-<UTC time>``) receives ``metrics.csv``,
    ``curves.png``, ``tensorboard/`` and ``final.weights.h5``. ``mixed_precision="auto"`` uses
    mixed_float16 when every replica is a GPU. ``seed`` makes shuffling and initial weights
    repeatable (it seeds Python's and NumPy's generators, not TF's global seed).
    ``input_options`` go to ``pipeline.make_dataset`` for Parquet inputs (e.g.
    ``{"flip": False, "crop_area": (0.8, 1.0)}`` for digits, which a mirror image would turn
    into other digits).
    """
    if data is None:
        raise TrainingError("train() needs data: a Parquet URL, a data map or a tf.data.Dataset")
    if epochs < 1 or batch_size < 1:
        raise TrainingError(f"epochs and batch_size must be positive (got {epochs}, {batch_size})")
    strategy = strategy or make_strategy("auto")
    in_cluster = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    config = multiworker.read_tf_config() if in_cluster else None
    chief = multiworker.is_chief(config)
    output_dir = Path(output_dir) if output_dir else _default_output_dir(model_name)
    write_dir = multiworker.worker_output_dir(output_dir, config)
    write_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_dir) if cache_dir else write_dir / "data"
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None

    replicas = strategy.num_replicas_in_sync
    global_batch = batch_size * replicas
    common = dict(strategy=strategy, global_batch=global_batch, image_size=image_size, parallel=parallel,
                  seed=seed, cache_dir=cache_dir, input_options=dict(input_options or {}))
    train_input = _resolve_input(data, role="train", num_classes=num_classes, classes=None, **common)
    num_classes = num_classes or train_input.num_classes
    if not num_classes:
        raise TrainingError("num_classes is required when training on a tf.data.Dataset")
    if train_input.num_classes and num_classes != train_input.num_classes:
        raise TrainingError(f"num_classes={num_classes} but the training data has {train_input.num_classes} classes")
    val_input = None
    if validation_data is not None:
        train_classes = train_input.classes or (_map_classes(data) if _is_data_map(data) else None)
        val_input = _resolve_input(validation_data, role="val", num_classes=num_classes, classes=train_classes,
                                   **common)
        if val_input.classes and train_input.classes and val_input.classes != train_input.classes:
            raise TrainingError("training and validation data label different classes; convert both with the "
                                "same `classes`")
    steps = steps_per_epoch or train_input.steps
    if seed is not None:
        _seed_python_and_numpy(seed)

    use_mixed = uses_gpus(strategy) if mixed_precision == "auto" else bool(mixed_precision)
    previous_policy = keras.mixed_precision.global_policy()
    with strategy.scope():
        if use_mixed:
            keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            model = build_model(model_name, (image_size, image_size, 3), num_classes, **(model_kwargs or {}))
        finally:
            keras.mixed_precision.set_global_policy(previous_policy)
        model.compile(optimizer=_optimizer(optimizer, learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(),
                      metrics=["accuracy"])

    resumed = _has_backup(checkpoint_dir)
    metrics_csv = write_dir / "metrics.csv"
    throughput = _Throughput(global_batch)
    fit_callbacks = [throughput, keras.callbacks.CSVLogger(str(metrics_csv), append=resumed),
                     keras.callbacks.TensorBoard(log_dir=str(write_dir / "tensorboard"), profile_batch=0)]
    if checkpoint_dir is not None:
        fit_callbacks.insert(0, keras.callbacks.BackupAndRestore(backup_dir=str(checkpoint_dir)))
    fit_callbacks += list(callbacks or [])

    started = time.perf_counter()
    history = model.fit(train_input.dataset, epochs=epochs, steps_per_epoch=steps,
                        validation_data=val_input.dataset if val_input else None,
                        callbacks=fit_callbacks, verbose=verbose)
    fit_seconds = time.perf_counter() - started
    val_metrics = {}
    if val_input is not None:
        val_metrics = {k: float(v) for k, v in model.evaluate(val_input.dataset, verbose=0, return_dict=True).items()}

    weights_path = write_dir / "final.weights.h5"
    temporary = write_dir / ".final.weights.tmp.h5"   # a crash never leaves half a weights file
    model.save_weights(str(temporary))
    os.replace(temporary, weights_path)
    plot_png = None
    if metrics_csv.exists() and metrics_csv.stat().st_size:
        plot_png = plot_curves(read_metrics_csv(metrics_csv), write_dir / "curves.png",
                               title=f"{model.name}: {replicas} replica(s), global batch {global_batch}")
    images = sum(throughput.epoch_images)
    train_seconds = sum(throughput.epoch_seconds)
    choice = strategy_choice(strategy)
    return TrainResult(
        history={k: [float(x) for x in v] for k, v in history.history.items()},
        val_metrics=val_metrics, model=model, epochs=[int(e) for e in history.epoch],
        initial_epoch=(history.epoch[0] if history.epoch else epochs), global_batch_size=global_batch,
        replicas=replicas, steps_per_epoch=steps, seconds=fit_seconds,
        images_per_second=images / train_seconds if train_seconds else 0.0,
        strategy=choice.as_dict() if choice else None, output_dir=str(write_dir), metrics_csv=str(metrics_csv),
        plot_png=str(plot_png) if plot_png else None, tensorboard_dir=str(write_dir / "tensorboard"),
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None, weights_path=str(weights_path),
        num_classes=num_classes, is_chief=chief, input_shards=list(train_input.shards),
    )


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


def _optimizer(name: str, learning_rate: float):
    name = name.lower()
    if name == "adam":
        return keras.optimizers.Adam(learning_rate)
    if name == "sgd":  # the paper's choice: momentum 0.9
        return keras.optimizers.SGD(learning_rate, momentum=0.9)
    raise TrainingError(f"unknown optimizer {name!r}: use 'adam' or 'sgd'")


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
    """Train AlexNet (``width`` scales it down for small inputs and CPUs); see ``train``."""
    model_kwargs = dict(width=width, normalization=normalization, dropout=dropout)
    model_kwargs.update(kwargs.pop("model_kwargs", None) or {})
    return train("alexnet", data, validation_data, strategy=strategy, epochs=epochs, batch_size=batch_size,
                 image_size=image_size, parallel=parallel, checkpoint_dir=checkpoint_dir,
                 model_kwargs=model_kwargs, **kwargs)

