"""`ResumeState`: ``BackupAndRestore`` that also keeps where the input was, so a run resumes mid-epoch exactly.

tf-keras's ``BackupAndRestore(save_freq=N)`` saves every N steps and, restarted, sets the step counter to
the step after the save; it does not skip any data (data_adapter's ``steps`` starts at the restored step
and iterates a fresh iterator). So the input must start where the saved weights left it: at each backup,
this callback writes the input's position next to it (`pipeline.reader.DatasetPosition.state`, the
steps run since the dataset's start, JSON, atomic rename), and `train` hands that state to
``make_dataset(state=...)`` when it restarts. The position counts steps, not what tf.data prefetched.
The file is read back bounded (`MAX_STATE_BYTES`) and checked (`ResumeStateError`); the reader then checks
the position against its epoch plan (`pipeline.positions.check_state`).
"""

from __future__ import annotations

from .keras_env import tensorflow  # must precede TensorFlow

import json
import os
from pathlib import Path

from pinstorm.pipeline import ResumeStateError

tf = tensorflow()
import tf_keras as keras  # noqa: E402

STATE_FILE = "input-position{}.json"
MAX_STATE_BYTES = 64 << 20   # per input: the position and the bitmaps of at most 65 epochs (ImageNet: ~160 kB each)


def state_path(checkpoint_dir, rank: int = 0) -> Path:
    """Where a worker keeps its input position: next to the backup, one file per rank."""
    return Path(checkpoint_dir) / STATE_FILE.format("" if rank == 0 else f"-rank{rank}")


def saved_counters(checkpoint_dir) -> tuple[int, int] | None:
    """(epoch, batch) of the last backup ``BackupAndRestore`` wrote (batch -1: saved at an epoch's end), or None."""
    latest = tf.train.latest_checkpoint(str(Path(checkpoint_dir) / "chief"))
    if latest is None:
        return None
    return (int(tf.train.load_variable(latest, "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE")),
            int(tf.train.load_variable(latest, "ckpt_saved_batch/.ATTRIBUTES/VARIABLE_VALUE")))


def resume_point(checkpoint_dir, steps_per_epoch: int | None) -> tuple[int, int] | None:
    """(epoch, step in it) where a fit restored from the backup in `checkpoint_dir` starts, or None (no
    backup), as tf-keras decides it (worker_training_state.maybe_load_initial_counters_from_ckpt): only
    backups every N steps save a batch (>= 0), and one saved at an epoch's last step resumes at the next."""
    counters = saved_counters(checkpoint_dir)
    if counters is None or counters[0] < 0:
        return None
    epoch, batch = counters
    if batch >= 0 and (steps_per_epoch is None or batch < steps_per_epoch - 1):
        return epoch, batch + 1
    return epoch + 1, 0


def steps_done(epoch: int, batch: int, steps_per_epoch: int, every_step: bool) -> int:
    """Steps before the one a restored run starts at, as tf-keras computes it from the saved (`epoch`, `batch`)
    (worker_training_state.maybe_load_initial_counters_from_ckpt): the step after `batch` with an integer
    ``save_freq``, the next epoch's first with ``"epoch"``."""
    if every_step and batch >= 0:
        return epoch * steps_per_epoch + batch + 1
    return (epoch + 1) * steps_per_epoch


def load_state(checkpoint_dir, rank: int = 0) -> dict | None:
    """The input position saved with the backup the run restores, or None (no file, or one that belongs to
    another backup: killed between the two writes, so the position is not the weights')."""
    path, counters = state_path(checkpoint_dir, rank), saved_counters(checkpoint_dir)
    if counters is None or not path.exists():
        return None
    saved = read_state(path)
    return saved if saved["counters"] == list(counters) else None


def read_state(path) -> dict:
    """An input-position file `ResumeState` wrote, checked: bounded in size, JSON, ``counters`` two
    integers, ``steps`` a count, ``input`` a non-empty list of reader states (checked by the reader), or
    `ResumeStateError` naming the file and what is wrong."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise ResumeStateError(f"{path}: more than {MAX_STATE_BYTES:,} bytes, not an input position")
    try:
        saved = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ResumeStateError(f"{path}: not an input position ({type(error).__name__}: {str(error)[:200]})") from None
    if not isinstance(saved, dict):
        raise ResumeStateError(f"{path}: not an input position (a JSON {type(saved).__name__})")
    counters, steps, states = saved.get("counters"), saved.get("steps"), saved.get("input")
    if (not isinstance(counters, list) or len(counters) != 2
            or not all(isinstance(c, int) and not isinstance(c, bool) and -1 <= c < 2**53 for c in counters)):
        raise ResumeStateError(f"{path}: counters must be [epoch, batch], two integers from -1")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 0 <= steps < 2**53:
        raise ResumeStateError(f"{path}: steps must be a count of steps, not {str(steps)[:40]}")
    if not isinstance(states, list) or not states or not all(isinstance(s, dict) for s in states):
        raise ResumeStateError(f"{path}: input must be a list of reader states")
    return saved


class ResumeState(keras.callbacks.BackupAndRestore):
    """``BackupAndRestore`` that writes the input's position (per input pipeline of this worker) with every backup.

    `positions`: the `DatasetPosition` of each input pipeline of this worker; `batches_per_step`: batches
    each pipeline delivers per step (replicas it feeds); `origin`: steps already done when the
    pipelines started (the saved ``steps`` of a restored run, else 0).
    """

    def __init__(self, backup_dir, *, positions, batches_per_step: int, save_freq="epoch", origin: int = 0,
                 rank: int = 0, delete_checkpoint: bool = True):
        super().__init__(backup_dir=str(backup_dir), save_freq=save_freq, delete_checkpoint=delete_checkpoint)
        self.positions, self.batches_per_step, self.origin = list(positions), int(batches_per_step), int(origin)
        self.path = state_path(backup_dir, rank)

    def _backup(self, epoch, batch=0):
        super()._backup(epoch=epoch, batch=batch)
        state = self._training_state   # what the backup holds, and what a restart reads back
        counters = [int(state._ckpt_saved_epoch.numpy()), int(state._ckpt_saved_batch.numpy())]
        done = steps_done(*counters, int(self.params["steps"]), self.save_freq != "epoch")
        consumed = (done - self.origin) * self.batches_per_step
        saved = {"counters": counters, "steps": done, "input": [p.state(consumed) for p in self.positions]}
        temporary = self.path.with_name(self.path.name + ".partial")
        temporary.write_text(json.dumps(saved))
        os.replace(temporary, self.path)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self.delete_checkpoint:
            self.path.unlink(missing_ok=True)
