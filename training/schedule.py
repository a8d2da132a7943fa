"""Progressive resizing: train the first epochs on small images, the last ones at full size (fast.ai's
ImageNet-in-18-minutes trick), resumable inside any phase.

A schedule is ``[(epoch, size), ...]``: from `epoch` on, images are `size` pixels square (the first entry
must start at epoch 0). Each phase is its own ``model.fit(initial_epoch=start, epochs=stop)`` over a
model built at the phase's size and a dataset decoding at that size (`pipeline.make_dataset` then
decodes at a reduced DCT scale, see docs/pipeline.md "Decode less"). The weights (and the optimizer's
state, and the epoch counter) go from one phase to the next through Keras's ``BackupAndRestore``: every
phase but the last keeps its backup (``delete_checkpoint=False``) and the next phase restores it, so a
run killed anywhere resumes at the right epoch *and* the right size. Without a `checkpoint_dir` (and so
under any strategy, OneDeviceStrategy too, which ``BackupAndRestore`` refuses) a ``tf.train.Checkpoint``
of the model and its optimizer in a private temporary folder carries the weights from phase to phase.

The model's weights must not depend on the input size (convolutions + global pooling: ``resnet50``,
``mobilenet_v2``); AlexNet's dense layers after ``Flatten`` do, and a schedule refuses it before
training.
"""

from __future__ import annotations

from .keras_env import tensorflow  # must precede TensorFlow
from .errors import InvalidTrainingInput
from .image_sizes import ImageSizes, Phase

import shutil
import tempfile
from pathlib import Path
from typing import Callable

tf = tensorflow()   # imported without its start-up noise (see keras_env)
import tf_keras as keras

from pinstorm.boards.safety import secrets

log = secrets.logger("pinstorm.training")

_SAVED_EPOCH = "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"


class ImageSizeSchedule(ImageSizes):
    """`ImageSizes` that a Keras fit runs phase by phase (`fit`)."""

    def fit(self, make_model: Callable[[int], keras.Model], make_data: Callable[[int], object], *, epochs: int,
            steps_per_epoch=None, validation_data: Callable[[int], object] | None = None, callbacks=(),
            checkpoint_dir=None, verbose=2):
        """Run the phases; return (the final model, one merged ``History``).

        `make_model(size)`: a compiled model for that size (built inside the strategy's scope);
        `make_data(size)`, `validation_data(size)`: datasets at that size. `callbacks` go to every
        phase (a ``CSVLogger`` appends after the first); a ``BackupAndRestore`` among them is replaced by
        the schedule's own on `checkpoint_dir`.
        """
        callbacks = [c for c in callbacks if not isinstance(c, keras.callbacks.BackupAndRestore)]
        private = checkpoint_dir is None
        backup_dir = Path(tempfile.mkdtemp(prefix="pinstorm-phases-")) if private else Path(checkpoint_dir)
        carry = str(backup_dir / "carry" / "phase")
        resume = None if private else saved_epoch(backup_dir)
        first = 0 if resume is None else resume + 1
        history = keras.callbacks.History()
        history.history, history.epoch = {}, []
        model = None
        try:
            for index, phase in enumerate(self.phases):
                if phase.stop <= first:
                    continue   # finished before the interruption
                model = make_model(phase.size)
                if self.progressive:
                    _check_portable(model)
                last = index == len(self.phases) - 1
                if private:
                    if index > 0:   # the previous phase's weights and optimizer state (slots restored when built)
                        tf.train.Checkpoint(model=model).read(carry)
                    backup = []
                else:
                    backup = [keras.callbacks.BackupAndRestore(backup_dir=str(backup_dir), delete_checkpoint=last)]
                log.info("phase %d: epochs %d-%d at %d px", index + 1, phase.start + 1, phase.stop, phase.size)
                result = model.fit(make_data(phase.size), epochs=phase.stop, initial_epoch=phase.start,
                                   steps_per_epoch=steps_per_epoch,
                                   validation_data=validation_data(phase.size) if validation_data else None,
                                   callbacks=backup + callbacks, verbose=verbose)
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


def saved_epoch(backup_dir) -> int | None:
    """The last epoch (0-based) a ``BackupAndRestore`` backup in `backup_dir` finished, or None."""
    if backup_dir is None:
        return None
    latest = tf.train.latest_checkpoint(str(Path(backup_dir) / "chief"))
    if latest is None:
        return None
    value = int(tf.train.load_checkpoint(latest).get_tensor(_SAVED_EPOCH))
    return value if value >= 0 else None


def _check_portable(model: keras.Model) -> None:
    """Weights whose shapes change with the input size cannot carry over from phase to phase."""
    if any(isinstance(layer, keras.layers.Flatten) for layer in model.layers):
        raise InvalidTrainingInput(f"{model.name} flattens its feature maps, so its dense weights depend on the "
                                   "image size; progressive resizing needs a model with global pooling (resnet50, "
                                   "mobilenet_v2)")


__all__ = ["ImageSizeSchedule", "Phase", "saved_epoch"]
