"""train(accumulate_batches=N) with TensorFlow: each step cuts its batch in N slices, runs them one after another
and applies their summed gradients once, so N slices of 4 end where one batch of 8 does (up to float rounding);
the optimizer's step counter, the schedule and the moving average count optimizer steps. One replica only."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest_plugins = ["conftest_training"]
tf = pytest.importorskip("tensorflow")

import tf_keras as keras  # noqa: E402

from pinstorm.training import keras_recipe  # noqa: E402
from pinstorm.training.runs import FitOptions  # noqa: E402


class _SeenBatch(keras.layers.Layer):
    """Passes its input on and notes the batch size each trace of the step gives it."""

    def __init__(self, seen, **kwargs):
        super().__init__(**kwargs)
        self.seen = seen

    def call(self, inputs):
        self.seen.append(inputs.shape[0])
        return inputs


def _fit(batches: int, seen: list, ema_decay=None):
    rng = np.random.default_rng(0)
    images, labels = rng.random((32, 12, 12, 3), np.float32), rng.integers(0, 3, 32).astype(np.int32)
    random.seed(0)   # tf-keras draws its initializers' seeds from Python's random (TF's global seed stays unset,
    np.random.seed(0)   # as `train` leaves it: set, it makes later models' initial weights differ)
    inputs = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(_SeenBatch(seen)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(keras.layers.Flatten()(x)))
    recipe = FitOptions(optimizer="sgd", learning_rate=0.05, lr_schedule="cosine", epochs=2, weight_decay=1e-3,
                        accumulate_batches=batches, ema_decay=ema_decay)
    model.compile(keras_recipe.optimizer(recipe, 4, model), keras_recipe.loss(recipe, 3), metrics=["accuracy"])
    keras_recipe.accumulate(model, batches)
    history = model.fit(tf.data.Dataset.from_tensor_slices((images, labels)).batch(8, drop_remainder=True), epochs=2,
                        verbose=0)
    return model, history


def test_two_slices_of_4_end_where_one_batch_of_8_does():
    whole_seen, sliced_seen = [], []
    whole, whole_history = _fit(1, whole_seen)
    sliced, sliced_history = _fit(2, sliced_seen)
    assert set(whole_seen) - {None} == {8} and set(sliced_seen) - {None} == {4}   # (None: when the model was built)
    assert int(sliced.optimizer.iterations) == int(whole.optimizer.iterations) == 8   # optimizer steps, not slices
    for a, b in zip(sliced.get_weights(), whole.get_weights()):   # the schedule and the L2 decay once a step
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(sliced_history.history["loss"], whole_history.history["loss"], rtol=1e-4)
    assert sliced_history.history["accuracy"] == whole_history.history["accuracy"]


def test_the_moving_average_is_updated_once_a_step():
    whole, _ = _fit(1, [], ema_decay=0.5)
    sliced, _ = _fit(2, [], ema_decay=0.5)
    with keras_recipe.averaged_weights(whole):
        expected = [w.numpy() for w in whole.trainable_variables]
    with keras_recipe.averaged_weights(sliced):
        for got, want in zip(sliced.trainable_variables, expected):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.once
def test_train_reads_n_batches_a_step_and_ends_as_one_batch_would(two_cpu_devices, digits_parquet, tmp_path):
    from pinstorm.training import TrainingError, train

    args = dict(epochs=1, image_size=32, seed=3, steps_per_epoch=3, optimizer="sgd", learning_rate=0.05,
                model_kwargs={"width": 0.1, "dropout": 0.0}, input_options={"flip": False}, verbose=0)
    runs = [train("alexnet", digits_parquet["train"], digits_parquet["val"], batch_size=size, accumulate_batches=n,
                  strategy=tf.distribute.MirroredStrategy(two_cpu_devices[:1]), output_dir=tmp_path / f"n{n}", **args)
            for size, n in ((8, 1), (4, 2))]
    assert [r.global_batch_size for r in runs] == [8, 8] and [r.steps_per_epoch for r in runs] == [3, 3]
    for a, b in zip(runs[1].model.get_weights(), runs[0].model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert runs[1].val_metrics["accuracy"] == pytest.approx(runs[0].val_metrics["accuracy"])
    # more replicas are refused, before any work (docs/training.md says why)
    with pytest.raises(TrainingError, match="accumulate_batches=2 with TensorFlow trains on one replica; this "
                                            "strategy has 2"):
        train("alexnet", digits_parquet["train"], batch_size=4, accumulate_batches=2, output_dir=tmp_path / "two",
              strategy=tf.distribute.MirroredStrategy(two_cpu_devices), **args)
    assert not (tmp_path / "two").exists()


def test_a_batch_that_does_not_cut_into_n_slices_is_named():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    recipe = FitOptions(accumulate_batches=3)
    model.compile(keras_recipe.optimizer(recipe, 1, model), keras_recipe.loss(recipe, 2))
    keras_recipe.accumulate(model, 3)
    data = tf.data.Dataset.from_tensor_slices((np.zeros((8, 4), np.float32), np.zeros(8, np.int32))).batch(4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="accumulate_batches=3: a batch does not cut into 3 equal"):
        model.fit(data, epochs=1, verbose=0)
