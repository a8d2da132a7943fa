"""train(ema_decay=d) with TensorFlow: tf-keras's moving average of the weights, validated each epoch, kept in the
backups, written beside the final weights and pinned with them, while the weights stay those trained (tf-keras
would overwrite them with the average at the end of every fit, and so at every progressive-resizing phase)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

pytest_plugins = ["conftest_training"]
tf = pytest.importorskip("tensorflow")

import tf_keras as keras  # noqa: E402

from pinstorm.training import keras_recipe  # noqa: E402
from pinstorm.training.runs import FitOptions  # noqa: E402


def _averages(model) -> list:
    with keras_recipe.averaged_weights(model):
        return [w.numpy().copy() for w in model.trainable_variables]


@pytest.mark.slow
@pytest.mark.once
def test_the_average_is_validated_kept_in_the_backup_written_and_pinned(digits_parquet, board, tmp_path):
    from pinstorm.training import train
    from pinstorm.training.experiments import experiment_lineage, load_experiment

    seen = {}

    class KilledAfterTheFirstEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):   # after the backup of the epoch (listed first) was written
            seen["killed"] = _averages(self.model)
            raise KeyboardInterrupt("killed")

    class Restored(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):   # after the backup was restored
            seen["restored"] = _averages(self.model)

    # with two accumulated batches of 4 a step: the average moves once an optimizer step, across the kill too
    args = dict(epochs=2, batch_size=4, accumulate_batches=2, image_size=32, steps_per_epoch=3, seed=5, ema_decay=0.8,
                model_kwargs={"width": 0.1}, input_options={"flip": False}, verbose=0,
                strategy=tf.distribute.MirroredStrategy(["/cpu:0"]), output_dir=tmp_path / "run",
                checkpoint_dir=tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        train("alexnet", digits_parquet["train"], digits_parquet["val"], callbacks=[KilledAfterTheFirstEpoch()],
              **args)
    result = train("alexnet", digits_parquet["train"], digits_parquet["val"], callbacks=[Restored()],
                   pin=f"{board}/ema-run", **args)
    assert result.epochs == [1] and result.global_batch_size == 8
    for restored, killed in zip(seen["restored"], seen["killed"]):
        np.testing.assert_array_equal(restored, killed)   # the backup kept the average, not only the weights

    assert {"val_ema_loss", "val_ema_accuracy", "val_ema_top5_accuracy"} <= set(result.history)
    assert {"ema_loss", "ema_accuracy", "ema_top5_accuracy"} <= set(result.val_metrics)
    with open(result.metrics_csv, newline="") as handle:   # one row an epoch, across the kill
        rows = list(csv.DictReader(handle))
    assert [row["epoch"] for row in rows] == ["0", "1"] and all(row["val_ema_accuracy"] for row in rows)

    # the model and final.weights.h5 hold the weights trained; final-ema.weights.h5 their average
    trained, averaged = [w.numpy() for w in result.model.trainable_variables], _averages(result.model)
    assert not all(np.array_equal(a, b) for a, b in zip(trained, averaged))
    assert result.ema_weights_path.endswith("final-ema.weights.h5")
    assert "final-ema.weights.h5" in result.experiment["files"]
    assert experiment_lineage(f"{board}/ema-run")["arguments"]["ema_decay"] == 0.8
    for loaded, expected in ((load_experiment(f"{board}/ema-run"), trained),
                             (load_experiment(f"{board}/ema-run", ema=True), averaged)):
        for got, want in zip(loaded.trainable_variables, expected):
            np.testing.assert_array_equal(got.numpy(), want)


def test_a_progressive_runs_next_phase_goes_on_from_the_weights_not_their_average():
    from pinstorm.training.schedule import ImageSizeSchedule

    rng = np.random.default_rng(0)
    images, labels = rng.random((32, 24, 24, 3), np.float32), rng.integers(0, 3, 32).astype(np.int32)
    ends, starts = [], []

    class Weights(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            starts.append([w.numpy().copy() for w in self.model.trainable_variables])

        def on_epoch_end(self, epoch, logs=None):   # the weights trained, before the end of the fit
            ends.append([w.numpy().copy() for w in self.model.trainable_variables])

    def make_model(size):
        inputs = keras.Input((size, size, 3))
        x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, activation="relu")(inputs))
        model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))
        recipe = FitOptions(learning_rate=1e-2, ema_decay=0.5)
        model.compile(keras_recipe.optimizer(recipe, 4, model), "sparse_categorical_crossentropy")
        return model

    def make_data(size, step=None):
        return tf.data.Dataset.from_tensor_slices((images, labels)).map(
            lambda x, y: (tf.image.resize(x, (size, size)), y)).batch(8)

    model, _ = ImageSizeSchedule([(0, 16), (1, 24)], 2).fit(make_model, make_data, epochs=2, steps_per_epoch=4,
                                                           callbacks=[Weights()], verbose=0)
    for started, ended in zip(starts[1], ends[0]):
        np.testing.assert_array_equal(started, ended)
    assert not all(np.array_equal(a, b) for a, b in zip(ends[1], _averages(model)))


def test_batch_norm_statistics_are_averaged_per_optimizer_step_across_replicas_and_checkpointed(two_cpu_devices,
                                                                                                  tmp_path):
    """The statistics' average moves as the weights' does, once an optimizer step, from what each replica's batch
    norm kept (read, the replicas' mean); `averaged_weights` swaps it in with the weights and puts both back; it
    is saved in the model's checkpoints (backups, a schedule's phases), as `train_torch`'s ``AveragedModel``."""
    rng = np.random.default_rng(1)
    images, labels = rng.normal(2.0, 3.0, (64, 6, 6, 3)).astype(np.float32), rng.integers(0, 3, 64).astype(np.int32)
    # all-reduce as make_strategy does on CPUs: the default collective ops number their instances afresh for each
    # strategy in a process, and one of an earlier test's strategies in this process collided with this one's (CI)
    decay = 0.6
    strategy = tf.distribute.MirroredStrategy(two_cpu_devices, cross_device_ops=tf.distribute.ReductionToOneDevice())

    def make_model():
        with strategy.scope():
            inputs = keras.Input((6, 6, 3))
            x = keras.layers.BatchNormalization(momentum=0.5)(keras.layers.Conv2D(4, 3)(inputs))
            model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(keras.layers.Flatten()(x)))
            model.compile(keras_recipe.optimizer(FitOptions(learning_rate=1e-2, ema_decay=decay), 4, model),
                          "sparse_categorical_crossentropy")
            model.optimizer.build(model.trainable_variables)   # as train() does before its fit
            return keras_recipe.average_statistics(model)

    model = make_model()
    norm = next(layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization))
    statistics = [norm.moving_mean, norm.moving_variance]
    seen = [[s.numpy().copy() for s in statistics]]

    class Statistics(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):   # after each optimizer step: the replicas' mean
            seen.append([s.numpy().copy() for s in statistics])

    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(16)   # 8 a replica, different data each
    model.fit(data, epochs=2, callbacks=[Statistics()], verbose=0)
    assert len(seen) == 9
    expected = seen[0]
    for values in seen[1:]:
        expected = [decay * e + (1 - decay) * v for e, v in zip(expected, values)]
    trained = seen[-1]
    assert not np.allclose(expected[0], trained[0], atol=1e-3)   # the test can tell the average from the last value
    with keras_recipe.averaged_weights(model):
        for statistic, want in zip(statistics, expected):
            np.testing.assert_allclose(statistic.numpy(), want, rtol=1e-5, atol=1e-6)
    for statistic, want in zip(statistics, trained):   # the statistics trained are back
        np.testing.assert_allclose(statistic.numpy(), want, rtol=1e-6)

    checkpoint = tf.train.Checkpoint(model=model).write(str(tmp_path / "checkpoint"))
    restored = make_model()
    tf.train.Checkpoint(model=restored).read(checkpoint).assert_existing_objects_matched()
    restored_norm = next(layer for layer in restored.layers if isinstance(layer, keras.layers.BatchNormalization))
    with keras_recipe.averaged_weights(restored):
        for statistic, want in zip([restored_norm.moving_mean, restored_norm.moving_variance], expected):
            np.testing.assert_allclose(statistic.numpy(), want, rtol=1e-5, atol=1e-6)
