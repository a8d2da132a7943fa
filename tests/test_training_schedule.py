"""Progressive resizing: the right image size each epoch, each phase's data asked for at the step it starts, and
a resumed run continues in the right phase, epoch and step."""

from __future__ import annotations

import csv
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pinstorm.training import TrainingError  # noqa: E402
from pinstorm.training.runs import FitOptions  # noqa: E402
from pinstorm.training.resume import resume_point  # noqa: E402
from pinstorm.training.schedule import ImageSizeSchedule, Phase  # noqa: E402

pytest_plugins = ["conftest_training"]


def test_schedule_parsing_and_phases():
    assert ImageSizeSchedule(64, 5).phases == [Phase(0, 5, 64)]
    assert not ImageSizeSchedule(64, 5).progressive
    schedule = ImageSizeSchedule([(0, 128), (6, 192), (12, 224)], 16)
    assert schedule.phases == [Phase(0, 6, 128), Phase(6, 12, 192), Phase(12, 16, 224)]
    assert schedule.final == 224 and schedule.size_at(11) == 192 and schedule.size_at(15) == 224
    cut = ImageSizeSchedule([(0, 128), (6, 192), (12, 224)], 8)   # phases past the run are dropped
    assert cut.phases == [Phase(0, 6, 128), Phase(6, 8, 192)] and cut.final == 192
    for bad in ([(1, 128)], [(0, 128), (0, 192)], [(0, 0)], "big", [], [(0, 128, 3)]):
        with pytest.raises(TrainingError):
            ImageSizeSchedule(bad, 4)


class _Recorder:
    """Which input size the model had at each epoch, the weights each fit started from and its first
    (epoch, batch); `kill_after` an epoch, or an (epoch, batch) to raise after."""

    def __init__(self, keras, kill_after=None):
        recorder = self
        self.sizes, self.start_weights, self.end_weights, self.kill_weights = {}, [], [], None
        self.first_batches, self.epoch = [], None

        class Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):   # after BackupAndRestore (listed first) restored
                recorder.start_weights.append([w.copy() for w in self.model.get_weights()])
                recorder.first_batches.append(None)

            def on_train_batch_begin(self, batch, logs=None):
                if recorder.first_batches[-1] is None:
                    recorder.first_batches[-1] = (recorder.epoch, batch)

            def on_train_batch_end(self, batch, logs=None):
                if kill_after == (recorder.epoch, batch):
                    recorder.kill_weights = [w.copy() for w in self.model.get_weights()]
                    raise KeyboardInterrupt("killed")

            def on_train_end(self, logs=None):
                recorder.end_weights.append([w.copy() for w in self.model.get_weights()])

            def on_epoch_begin(self, epoch, logs=None):
                recorder.sizes[epoch], recorder.epoch = self.model.input_shape[1], epoch

            def on_epoch_end(self, epoch, logs=None):
                if epoch == kill_after:
                    recorder.kill_weights = [w.copy() for w in self.model.get_weights()]
                    raise KeyboardInterrupt("killed")

        self.callback = Callback()


def _tools():
    import tensorflow as tf
    import tf_keras as keras

    rng = np.random.default_rng(0)
    images, labels = rng.random((32, 40, 40, 3), np.float32), rng.integers(0, 3, 32).astype(np.int32)
    fed = []

    def make_data(size, step=None):   # training data at the run's `step`; validation is asked for without
        fed.append((size, step))
        return tf.data.Dataset.from_tensor_slices((images, labels)).map(
            lambda x, y: (tf.image.resize(x, (size, size)), y)).batch(8)

    def make_model(size):
        inputs = keras.Input((size, size, 3))
        x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
        x = keras.layers.GlobalAveragePooling2D()(x)
        model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))
        model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
        return model

    return keras, make_data, make_model, fed


def test_three_epochs_two_phases_feed_the_right_sizes(tmp_path):
    keras, make_data, make_model, fed = _tools()
    recorder = _Recorder(keras)
    csv_path = tmp_path / "metrics.csv"
    schedule = ImageSizeSchedule([(0, 16), (2, 24)], 3)
    model, history = schedule.fit(make_model, make_data, epochs=3, validation_data=make_data, steps_per_epoch=4,
                                  callbacks=[recorder.callback, keras.callbacks.CSVLogger(str(csv_path))], verbose=0)
    assert recorder.sizes == {0: 16, 1: 16, 2: 24}
    # train and validation data at each phase's size; the second phase's training data from step 2 * 4 on
    assert fed == [(16, 0), (16, None), (24, 8), (24, None)]
    assert history.epoch == [0, 1, 2] and len(history.history["loss"]) == 3 and "val_loss" in history.history
    assert model.input_shape[1] == 24
    with open(csv_path, newline="") as handle:
        assert [int(row["epoch"]) for row in csv.DictReader(handle)] == [0, 1, 2]   # one file for all phases
    # Phase 2 started from where phase 1 ended (weights carried, not re-initialised).
    for started, ended in zip(recorder.start_weights[1], recorder.end_weights[0]):
        np.testing.assert_allclose(started, ended)
    assert not all(np.allclose(a, b) for a, b in zip(recorder.start_weights[0], recorder.end_weights[0]))


@pytest.mark.parametrize("kill_after, resumed_sizes", [(0, {1: 24, 2: 24}), (1, {2: 24})])
def test_a_resumed_run_continues_in_the_right_phase(tmp_path, kill_after, resumed_sizes):
    keras, make_data, make_model, fed = _tools()
    schedule = ImageSizeSchedule([(0, 16), (1, 24)], 3)
    killed = _Recorder(keras, kill_after=kill_after)
    with pytest.raises(KeyboardInterrupt):
        schedule.fit(make_model, make_data, epochs=3, steps_per_epoch=4, callbacks=[killed.callback],
                     checkpoint_dir=tmp_path, verbose=0)
    assert resume_point(tmp_path, 4) == (kill_after + 1, 0)

    fed.clear()
    resumed = _Recorder(keras)
    model, history = schedule.fit(make_model, make_data, epochs=3, steps_per_epoch=4, callbacks=[resumed.callback],
                                  checkpoint_dir=tmp_path, verbose=0)
    assert resumed.sizes == resumed_sizes and history.epoch == sorted(resumed_sizes)
    assert fed == [(24, 4 * (kill_after + 1))]   # the data resumes where the backup left it
    for restored, at_kill in zip(resumed.start_weights[0], killed.kill_weights):
        np.testing.assert_allclose(restored, at_kill)   # continued from the backup, not from scratch
    assert resume_point(tmp_path, 4) is None   # the finished run removed its backup


def test_backups_every_n_steps_close_each_phase_and_resume_mid_epoch(tmp_path):
    """Backups every 3 steps of 4: phase 1 (epoch 0) also backs up after its last step, so phase 2 starts at
    epoch 1 step 0, not at the step after the last periodic backup; a run killed after epoch 1's batch 3 (its
    backup after batch 2) resumes at epoch 1 step 3, its data at the run's step 7, the weights of that backup."""
    keras, make_data, make_model, fed = _tools()
    schedule = ImageSizeSchedule([(0, 16), (1, 24)], 3)

    def every_3_steps(last):
        return keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=3, delete_checkpoint=last)

    killed = _Recorder(keras, kill_after=(1, 3))
    with pytest.raises(KeyboardInterrupt):
        schedule.fit(make_model, make_data, epochs=3, steps_per_epoch=4, callbacks=[killed.callback],
                     checkpoint_dir=tmp_path, backup=every_3_steps, verbose=0)
    assert killed.first_batches == [(0, 0), (1, 0)] and fed == [(16, 0), (24, 4)]
    assert resume_point(tmp_path, 4) == (1, 3)

    fed.clear()
    resumed = _Recorder(keras)
    model, history = schedule.fit(make_model, make_data, epochs=3, steps_per_epoch=4, callbacks=[resumed.callback],
                                  checkpoint_dir=tmp_path, backup=every_3_steps, verbose=0)
    assert resumed.first_batches == [(1, 3)] and fed == [(24, 7)] and history.epoch == [1, 2]
    assert resumed.sizes == {1: 24, 2: 24} and resume_point(tmp_path, 4) is None


def test_a_flattening_model_is_refused():
    keras, make_data, _, _ = _tools()

    def flat(size):
        inputs = keras.Input((size, size, 3))
        model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(inputs)))
        model.compile("adam", "sparse_categorical_crossentropy")
        return model

    with pytest.raises(TrainingError, match="global pooling"):
        ImageSizeSchedule([(0, 16), (1, 24)], 2).fit(flat, make_data, epochs=2, verbose=0)


@pytest.mark.slow
@pytest.mark.once
def test_train_with_a_schedule(digits_parquet, tmp_path, monkeypatch):
    """`train(image_size=[(epoch, size), ...])` through fit.py: metrics of every epoch, final model at the last size,
    the learning-rate schedule and the seeded Parquet stream going on across the phases."""
    import tensorflow as tf

    from pinstorm.training import train

    started = _record_training_readers(monkeypatch)
    # with the training recipe: the rates logged are the rule's for the optimiser's step, which the phases carry
    recipe = dict(learning_rate=0.05, optimizer="sgd", lr_schedule="step", warmup_epochs=0.5, weight_decay=1e-4,
                  label_smoothing=0.1)
    result = train("mobilenet_v2", digits_parquet["train"], digits_parquet["val"], epochs=3, batch_size=8,
                   image_size=[(0, 32), (2, 40)], model_kwargs={"alpha": 0.35}, steps_per_epoch=2, seed=5,
                   output_dir=tmp_path / "run", strategy=tf.distribute.OneDeviceStrategy("/cpu:0"), verbose=0,
                   **recipe)   # no backup: the weights go from phase to phase in memory
    assert result.epochs == [0, 1, 2] and result.model.input_shape[1:3] == (40, 40)
    phase_two = [state for size, state in started if size == 40][-1]   # phase 1 ran 2 epochs of 2 steps of 8
    assert phase_two["seed"] == 5 and phase_two["streams"] == [[0, 2 * 2 * 8]]
    assert len(result.history["loss"]) == 3 and "accuracy" in result.val_metrics
    expected = FitOptions(epochs=3, **recipe)
    assert result.history["learning_rate"] == pytest.approx([expected.learning_rate_at(2 * e + 1, 2) for e in range(3)])
    assert result.history["learning_rate"] == pytest.approx([0.05, 0.005, 0.0005])
    with open(result.metrics_csv, newline="") as handle:
        assert [int(row["epoch"]) for row in csv.DictReader(handle)] == [0, 1, 2]
    with pytest.raises(TrainingError, match="global pooling"):
        train("alexnet", digits_parquet["train"], epochs=2, batch_size=8, image_size=[(0, 32), (1, 40)],
              model_kwargs={"width": 0.1}, steps_per_epoch=1, output_dir=tmp_path / "alex",
              strategy=tf.distribute.OneDeviceStrategy("/cpu:0"), verbose=0)


@pytest.mark.slow
@pytest.mark.once
def test_a_run_killed_after_a_phase_saves_the_input_position_and_resumes_from_it(digits_parquet, tmp_path,
                                                                                  monkeypatch):
    """On Parquet with a backup: a run killed at the end of phase 1 saves the seeded stream's position with its
    backup, and the relaunch's phase 2 reads on from it."""
    import tensorflow as tf
    import tf_keras as keras

    from pinstorm.training import train

    started = _record_training_readers(monkeypatch)

    class KilledAfterPhaseOne(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                raise KeyboardInterrupt("killed")

    backup = tmp_path / "backup"
    args = dict(epochs=2, batch_size=8, image_size=[(0, 32), (1, 40)], steps_per_epoch=3, seed=5,
                model_kwargs={"alpha": 0.35}, strategy=tf.distribute.MirroredStrategy(["/cpu:0"]), verbose=0,
                output_dir=tmp_path / "run", checkpoint_dir=backup)
    with pytest.raises(KeyboardInterrupt):
        train("mobilenet_v2", digits_parquet["train"], callbacks=[KilledAfterPhaseOne()], **args)
    saved = json.loads((backup / "input-position.json").read_text())
    assert saved["steps"] == 3 and saved["input"][0]["streams"] == [[0, 3 * 8]]   # phase 1's 3 steps of 8
    started.clear()
    result = train("mobilenet_v2", digits_parquet["train"], **args)
    assert result.epochs == [1] and started and all(size == 40 and state["streams"] == [[0, 24]]
                                                    for size, state in started)
    assert not (backup / "input-position.json").exists()


def _record_training_readers(monkeypatch) -> list:
    """(image size, start state) of every training reader `train` makes from now on (`make_dataset` runs as
    it is; this only notes its arguments)."""
    from pinstorm import pipeline

    started, real_make_dataset = [], pipeline.make_dataset

    def recording_make_dataset(url, **kwargs):
        if kwargs.get("training"):
            started.append((kwargs["image_size"][0], kwargs.get("state")))
        return real_make_dataset(url, **kwargs)

    monkeypatch.setattr(pipeline, "make_dataset", recording_make_dataset)
    return started
