"""Training inputs: turn what ``train`` was given into a dataset ready for ``fit``, and its size.

Three kinds are accepted: a Parquet dataset URL from the pipeline (read with
``pipeline.make_dataset``, one endless shard per worker, batched per replica; validation reads
every row once), a data map ``{image, category, categories}`` (converted to Parquet first, a
finished identical conversion is reused) and a ``tf.data.Dataset`` of ``(image, label)``.
"""

from __future__ import annotations

from .keras_env import tensorflow  # must precede TensorFlow
from .errors import InvalidTrainingInput

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

tf = tensorflow()   # imported without its start-up noise (see keras_env)

from pinstorm.boards.safety import secrets
from pinstorm import pipeline

log = secrets.logger("pinstorm.training")



@dataclass
class Input:
    """A training or validation input ready for ``fit``: a dataset (maybe distributed) and its size."""

    dataset: Any
    rows: int | None
    num_classes: int | None
    classes: list | None = None
    steps: int | None = None
    shards: list = field(default_factory=list)   # (index, count) each input pipeline read, None = all rows
    url: str | None = None                       # the Parquet dataset read (a data map's conversion too)


def is_data_map(data) -> bool:
    """A `pipeline.DataMap`, or a dict with its keys (the pipeline's one test)."""
    return pipeline.DataMap.is_data_map(data)


def map_classes(data) -> list | None:
    """The wnids that fix a data map's labels: all of them (``classes``), else its ``categories``."""
    data_map = pipeline.DataMap.from_source(data)
    return (data_map.label_classes() or None) if data_map is not None else None


def _convert_data_map(data, cache_dir: Path, split: str, classes, parallel) -> str:
    """Convert a data map to Parquet under ``cache_dir`` (the pipeline reuses a finished identical one)."""

    data_map = pipeline.DataMap.from_source(data)
    assert data_map is not None
    digest = hashlib.sha1(json.dumps([list(map(str, data_map.image)), list(map(str, data_map.category)),
                                      list(classes or [])]).encode()).hexdigest()[:12]
    target = cache_dir / f"{split}-{digest}"
    result = pipeline.convert(data_map, str(target), classes=classes, split=split, parallel=parallel)
    log.info("converted %d %s images to %s", result.rows, split, target)
    return str(target)


def _prepare_images(dataset: tf.data.Dataset, image_size: int) -> tf.data.Dataset:
    """Resize images to ``image_size`` when they are not already, and make labels int32."""
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise InvalidTrainingInput("a tf.data.Dataset must yield (image, label) pairs")
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


def _dataset_input(dataset: tf.data.Dataset, *, global_batch, image_size, num_classes) -> Input:
    images_spec = dataset.element_spec[0] if isinstance(dataset.element_spec, tuple) else None
    if images_spec is None:
        raise InvalidTrainingInput("a tf.data.Dataset must yield (image, label) pairs")
    batched = images_spec.shape.rank == 4
    dataset = _prepare_images(dataset, image_size)
    cardinality = int(dataset.cardinality())
    rows = None
    if not batched:
        rows = cardinality if cardinality >= 0 else None
        dataset = dataset.batch(global_batch, drop_remainder=False)
    dataset = _with_data_sharding(dataset.prefetch(tf.data.AUTOTUNE))
    return Input(dataset, rows, num_classes)


def _parquet_train_input(strategy, url: str, info: pipeline.DatasetInfo, *, global_batch, image_size, parallel, seed,
                         input_options):
    """One endless ``make_dataset`` per worker over its own shard, batched per replica."""

    rows = info.rows
    steps = rows // global_batch
    if steps < 1:
        raise InvalidTrainingInput(f"{url} has {rows} rows, fewer than one global batch of {global_batch}; "
                                   "lower batch_size")

    shards: list = []

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        shard = None
        if context.num_input_pipelines > 1:
            shard = (context.input_pipeline_id, context.num_input_pipelines)
        # endless: shards may differ by a row group, and every worker must run the same number of steps.
        options = dict(shuffle=True, seed=seed, parallel=parallel)
        options.update(input_options)
        if "shard" in options:   # the caller split the data itself (spark_train: one partition per worker)
            shard = options.pop("shard")
        shards.append(shard)
        return pipeline.make_dataset(
            url, batch_size=context.get_per_replica_batch_size(global_batch), image_size=(image_size, image_size),
            training=True, shard=shard, num_epochs=None, drop_remainder=True, **options)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    return Input(dataset, rows, info.num_classes, list(info.classes), steps, shards)


def _parquet_eval_input(url: str, info: pipeline.DatasetInfo, *, global_batch, image_size, parallel, input_options) -> Input:
    """Every validation row once per evaluation (Keras splits each global batch across replicas)."""

    options = {k: v for k, v in input_options.items() if k in ("eval_crop", "engine", "reader_workers", "stream",
                                                               "cache_limit", "storage_options")}
    dataset = pipeline.make_dataset(url, batch_size=global_batch, image_size=(image_size, image_size),
                                    training=False, num_epochs=1, shuffle=False, parallel=parallel, **options)
    return Input(_with_data_sharding(dataset), info.rows, info.num_classes, list(info.classes))


def resolve_input(data, *, role, strategy, global_batch, image_size, parallel, seed, num_classes,
                   cache_dir, classes, input_options) -> Input:
    training = role == "train"
    if isinstance(data, tf.data.Dataset):
        return _dataset_input(data, global_batch=global_batch, image_size=image_size, num_classes=num_classes)
    if is_data_map(data):
        classes = classes or map_classes(data)
        data = _convert_data_map(data, cache_dir, "train" if training else "val", classes, parallel)
    if isinstance(data, (str, os.PathLike)):
        url = os.fspath(data)
        info = pipeline.dataset_info(url, storage_options=input_options.get("storage_options"))
        if training:
            resolved = _parquet_train_input(strategy, url, info, global_batch=global_batch, image_size=image_size,
                                            parallel=parallel, seed=seed, input_options=input_options)
        else:
            resolved = _parquet_eval_input(url, info, global_batch=global_batch, image_size=image_size,
                                           parallel=parallel, input_options=input_options)
        resolved.url = url
        return resolved
    raise InvalidTrainingInput(f"{role} data must be a Parquet dataset URL, a data map or a tf.data.Dataset, "
                               f"not {type(data).__name__}")
