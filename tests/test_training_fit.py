"""train / alexnet_train: a short mirrored fit, resuming from a backup, Parquet and data-map inputs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from pinstorm.training import alexnet_train, make_strategy, train
from pinstorm.training.fit import TrainingError
from training_support import NO_FLIP, TINY

pytest_plugins = ["conftest_training"]


def _datasets(digits_arrays, rows=None):
    import tensorflow as tf

    x_train, y_train, x_val, y_val = digits_arrays
    rows = rows or len(x_train)
    train_ds = tf.data.Dataset.from_tensor_slices((x_train[:rows], y_train[:rows])).shuffle(2048, seed=0)
    return train_ds, tf.data.Dataset.from_tensor_slices((x_val, y_val))


def _csv_epochs(path) -> list[int]:
    with open(path, newline="") as handle:
        return [int(row["epoch"]) for row in csv.DictReader(handle)]


@pytest.mark.slow
@pytest.mark.once
def test_short_mirrored_fit_learns_and_writes_its_outputs(two_cpu_devices, digits_arrays, tmp_path):
    strategy = make_strategy("mirrored", devices=2, cross_device_ops="nccl")
    train_ds, val_ds = _datasets(digits_arrays)
    # 4 epochs: CPU kernels under 2 replicas are not bit-repeatable, and about one run in 15 leaves chance
    # late (loss 2.30, 2.27, 2.22 after 3 epochs, where most runs reach 0.5-0.8)
    result = train("alexnet", train_ds, val_ds, strategy=strategy, epochs=4, batch_size=16, image_size=32,
                   num_classes=10, model_kwargs={"width": 0.25}, output_dir=tmp_path / "run", seed=0, verbose=0)
    assert result.replicas == 2 and result.global_batch_size == 32
    assert result.strategy["fallback_from"] == "NcclAllReduce"
    assert result.epochs == [0, 1, 2, 3]
    losses = result.history["loss"]
    assert losses[-1] < losses[0] * 0.8, losses
    assert result.val_metrics["accuracy"] > 0.5, result.val_metrics     # chance is 0.1
    assert result.history["val_accuracy"][-1] == pytest.approx(result.val_metrics["accuracy"], abs=1e-6)
    assert _csv_epochs(result.metrics_csv) == [0, 1, 2, 3]
    assert Path(result.plot_png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(Path(result.tensorboard_dir, "train").glob("events.out.tfevents.*"))
    assert Path(result.weights_path).stat().st_size > 0
    assert result.images_per_second > 0
    assert result.summary()["val_metrics"] == result.val_metrics and "model" not in result.summary()


@pytest.mark.parametrize("kind", [pytest.param("mirrored", marks=pytest.mark.once), "one-device"])
def test_a_crashed_run_resumes_from_its_backup(two_cpu_devices, digits_arrays, tmp_path, kind):
    import tf_keras as keras

    class Crash(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("simulated crash after epoch 2")

    strategy = (make_strategy("mirrored", devices=2, cross_device_ops="one-device") if kind == "mirrored"
                else make_strategy("one-device"))   # a laptop's single device resumes too
    args = dict(strategy=strategy, epochs=4, num_classes=10, output_dir=tmp_path / "run",
                checkpoint_dir=tmp_path / "backup", verbose=0, **TINY)
    train_ds, _ = _datasets(digits_arrays, rows=256)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train("alexnet", train_ds, callbacks=[Crash()], **args)
    assert (tmp_path / "backup" / "chief" / "checkpoint").exists()

    resumed = train("alexnet", train_ds, **args)
    assert resumed.initial_epoch == 2 and resumed.epochs == [2, 3]
    assert _csv_epochs(resumed.metrics_csv) == [0, 1, 2, 3]          # appended, the plot shows the whole run
    assert not list((tmp_path / "backup").rglob("*.index"))          # a finished run deletes its backup


@pytest.mark.slow
def test_parquet_fit_reads_the_pipeline_and_learns(two_cpu_devices, digits_parquet, tmp_path):
    strategy = make_strategy("mirrored", devices=2, cross_device_ops="one-device")
    # no LRN and no dropout: AlexNet then learns 160 digits in ~80 steps (0.8 seen; LRN + dropout need ~300)
    result = alexnet_train(digits_parquet["train"], strategy=strategy, epochs=8, validation_data=digits_parquet["val"],
                           output_dir=tmp_path / "run", input_options=NO_FLIP, verbose=0, seed=1,
                           width=0.125, image_size=32, batch_size=8, normalization=None, dropout=0.0)
    assert result.num_classes == 10
    assert result.steps_per_epoch == digits_parquet["rows"] // 16
    assert result.input_shards == [None]                               # one worker reads every row
    assert set(result.history) == {"loss", "accuracy", "top5_accuracy", "val_loss", "val_accuracy", "val_top5_accuracy"}
    assert all(t >= a for t, a in zip(result.history["val_top5_accuracy"], result.history["val_accuracy"]))
    # 40 balanced validation digits, chance 0.1: P(>= 20 right by luck) ~ 1e-9
    assert digits_parquet["val_rows"] == 40
    assert result.val_metrics["accuracy"] >= 0.5, result.history["val_accuracy"]
    assert result.history["loss"][-1] < result.history["loss"][0]


def test_a_data_map_is_converted_before_training(two_cpu_devices, digits_parquet, tmp_path):
    from pinstorm.pipeline import dataset_info, scan

    layout = scan(digits_parquet["root"])
    items = layout.items("train")
    data_map = {"image": [p for p, _ in items], "category": [w for _, w in items], "categories": layout.classes}
    val_items = layout.items("val")
    val_map = {"image": [p for p, _ in val_items], "category": [w for _, w in val_items]}
    strategy = make_strategy("one-device")
    result = alexnet_train(data_map, strategy=strategy, epochs=1, validation_data=val_map, cache_dir=tmp_path / "cache",
                           output_dir=tmp_path / "run", input_options=NO_FLIP, verbose=0, width=0.125,
                           image_size=32, batch_size=16)
    converted = sorted(p.name.split("-")[0] for p in (tmp_path / "cache").iterdir())
    assert converted == ["train", "val"]
    train_url = next((tmp_path / "cache").glob("train-*"))
    assert dataset_info(str(train_url))["rows"] == len(items)
    assert result.steps_per_epoch == len(items) // 16 and "accuracy" in result.val_metrics


def test_bad_training_inputs_are_named(two_cpu_devices, digits_arrays, digits_parquet, tmp_path):
    strategy = make_strategy("one-device")
    train_ds, _ = _datasets(digits_arrays, rows=32)
    with pytest.raises(TrainingError, match="num_classes is required"):
        train("alexnet", train_ds, strategy=strategy, epochs=1, output_dir=tmp_path, **TINY)
    with pytest.raises(TrainingError, match="Parquet dataset URL, a data map or a tf.data.Dataset"):
        train("alexnet", [1, 2, 3], strategy=strategy, output_dir=tmp_path)
    with pytest.raises(TrainingError, match="fewer than one global batch"):
        train("alexnet", digits_parquet["train"], strategy=strategy, batch_size=4096, image_size=32,
              output_dir=tmp_path)
    with pytest.raises(TrainingError, match="num_classes=7 but the training data has 10"):
        train("alexnet", digits_parquet["train"], strategy=strategy, num_classes=7, image_size=32,
              output_dir=tmp_path)


def test_mixed_precision_computes_in_float16_with_a_float32_loss(two_cpu_devices, digits_arrays, tmp_path):
    import tf_keras as keras

    train_ds, _ = _datasets(digits_arrays, rows=64)
    result = train("alexnet", train_ds, strategy=make_strategy("one-device"), epochs=1, num_classes=10,
                   mixed_precision=True, output_dir=tmp_path, verbose=0, **TINY)
    model = result.model
    assert model.get_layer("conv1").compute_dtype == "float16" and model.output.dtype == "float32"
    assert isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert keras.mixed_precision.global_policy().name == "float32"   # the global policy is restored
