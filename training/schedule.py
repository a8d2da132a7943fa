"""Progressive resizing: train the first epochs on small images, the last ones at full size (fast.ai's
ImageNet-in-18-minutes trick), resumable inside any phase.

A schedule is ``[(epoch, size), ...]``: from `epoch` on, images are `size` pixels square (the first entry
must start at epoch 0). Each phase is its own ``model.fit(initial_epoch=start, epochs=stop)`` over a
model built at the phase's size and a dataset decoding at that size (`pipeline.make_dataset` then
decodes at a reduced DCT scale, see docs/pipeline.md "Decode less"). The weights (and the optimizer's
state, and the epoch counter) go from one phase to the next through Keras's ``BackupAndRestore``: every
phase but the last keeps its backup (``delete_checkpoint=False``, and one taken at its very end when
backups are every N steps) and the next phase restores it, so a run killed anywhere resumes at the right
epoch, step *and* size. Without a `checkpoint_dir` (and so under any strategy, OneDeviceStrategy too,
which ``BackupAndRestore`` refuses) a ``tf.train.Checkpoint`` of the model and its optimizer in a private
temporary folder carries the weights from phase to phase.

The data goes on too: each phase's dataset is asked for at the step the phase starts (or the step a
restored backup resumes at), so a seeded Parquet stream continues across phases instead of replaying
its first epochs at every size (`train` starts it there with ``make_dataset(state=...)``).

The model's weights must not depend on the input size (convolutions + global pooling: ``resnet50``,
``mobilenet_v2``); AlexNet's dense layers after ``Flatten`` do, and a schedule refuses it before
training.
"""

from __future__ import annotations

from .keras_env import tensorflow  # must precede TensorFlow
from .errors import InvalidTrainingInput
from .image_sizes import ImageSizes, Phase
from .resume import resume_point

import shutil
import tempfile
from pathlib import Path
from typing import Callable

tf = tensorflow()   # imported without its start-up noise (see keras_env)
import tf_keras as keras

from pinstorm.boards.safety import secrets

log = secrets.logger("pinstorm.training")


class ImageSizeSchedule(ImageSizes):
    """`ImageSizes` that a Keras fit runs phase by phase (`fit`)."""

    def fit(self, make_model: Callable[[int], keras.Model], make_data: Callable[[int, int | None], object], *,
            epochs: int, steps_per_epoch=None, validation_data: Callable[[int], object] | None = None, callbacks=(),
            checkpoint_dir=None, backup: Callable[[bool], keras.callbacks.BackupAndRestore] | None = None,
            verbose=2):
        """Run the phases; return (the final model, one merged ``History``).

        `make_model(size)`: a compiled model for that size (built inside the strategy's scope);
        `make_data(size, step)`: the training dataset at that size whose first batch is the run's step
        `step` (from 0: the phase's first step, or the one a restored backup resumes at; None when
        `steps_per_epoch` is unknown); `validation_data(size)`: validation at that size. `callbacks` go to
        every phase (a ``CSVLogger`` appends after the first); a ``BackupAndRestore`` among them is
        replaced by the schedule's own on `checkpoint_dir`: ``backup(last)``, the one the caller makes
        (``last``: the phase that deletes it when done), else Keras's, every epoch.
        """
        callbacks = [c for c in callbacks if not isinstance(c, keras.callbacks.BackupAndRestore)]
        private = checkpoint_dir is None
        backup_dir = Path(tempfile.mkdtemp(prefix="pinstorm-phases-")) if private else Path(checkpoint_dir)
        backup = backup or (lambda last: keras.callbacks.BackupAndRestore(backup_dir=str(backup_dir),
                                                                           delete_checkpoint=last))
        carry = str(backup_dir / "carry" / "phase")
        resumed = None if private else resume_point(backup_dir, steps_per_epoch)
        first_epoch, first_step = resumed or (0, 0)
        history = keras.callbacks.History()
        history.history, history.epoch = {}, []
        model = None
        try:
            for index, phase in enumerate(self.phases):
                if phase.stop <= first_epoch:
                    continue   # finished before the interruption
                model = make_model(phase.size)
                if self.progressive:
                    _check_portable(model)
                last = index == len(self.phases) - 1
                phase_callbacks = []
                if private:
                    if index > 0:   # the previous phase's weights and optimizer state (slots restored when built)
                        tf.train.Checkpoint(model=model).read(carry)
                else:
                    phase_callbacks.append(backup(last))
                    if not last:
                        phase_callbacks.append(_BackUpAtTheEnd(phase_callbacks[0], phase.stop - 1))
                epoch, step = (first_epoch, first_step) if phase.start <= first_epoch else (phase.start, 0)
                log.info("phase %d: epochs %d-%d at %d px", index + 1, phase.start + 1, phase.stop, phase.size)
                data = make_data(phase.size, epoch * steps_per_epoch + step if steps_per_epoch else None)
                result = model.fit(data, epochs=phase.stop, initial_epoch=phase.start, steps_per_epoch=steps_per_epoch,
                                   validation_data=validation_data(phase.size) if validation_data else None,
                                   callbacks=phase_callbacks + callbacks, verbose=verbose)
                if private and not last:
                    tf.train.Checkpoint(model=model).write(carry)
                for key, values in result.history.items():
                    history.history.setdefault(key, []).extend(values)
                history.epoch.extend(result.epoch)
                for callback in callbacks:
                    if isinstance(callback, keras.callbacks.CSVLogger):
                        callback.append = True   # the next phase adds rows to the same file
        finally:
            if private:
                shutil.rmtree(backup_dir, ignore_errors=True)
        if model is None:   # every phase had finished: the backup is gone with the last one
            model = make_model(self.final)
        history.model = model
        return model, history


class _BackUpAtTheEnd(keras.callbacks.Callback):
    """Backs a phase up after its last step when its backups are every N steps and N did not fall there:
    the next phase restores that backup, and must not restore (and so repeat) the steps after it."""

    def __init__(self, backup: keras.callbacks.BackupAndRestore, last_epoch: int):
        super().__init__()
        self.backup, self.last_epoch = backup, last_epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.last_epoch and self.backup.save_freq != "epoch" and self.backup._batches_count:
            self.backup._backup(epoch=epoch, batch=self.params["steps"] - 1)
            self.backup._batches_count = 0


def _check_portable(model: keras.Model) -> None:
    """Weights whose shapes change with the input size cannot carry over from phase to phase."""
    if any(isinstance(layer, keras.layers.Flatten) for layer in model.layers):
        raise InvalidTrainingInput(f"{model.name} flattens its feature maps, so its dense weights depend on the "
                                   "image size; progressive resizing needs a model with global pooling (resnet50, "
                                   "mobilenet_v2)")


__all__ = ["ImageSizeSchedule", "Phase"]
