"""spark_train (TensorFlow) relaunched after a worker died mid-epoch resumes at its last mid-epoch backup.

``spark_train({..., "checkpoint_dir": ..., "backup_every": N}, 2, spark, max_restarts=1)`` on
``local[2]``: the dict goes through ``_train_from_args`` to ``train``, which backs up every N steps
with each worker's input position (``training.resume.ResumeState``). Worker 1's Python process
exits in the middle of an epoch, after a backup; Spark fails the barrier stage, spark_train
relaunches it, and the relaunch starts at the step after that backup (not at the epoch's start),
with the input position saved for exactly that step, and finishes the run.
"""

from __future__ import annotations

import csv
import json

import pytest

pytest_plugins = ["conftest_training"]
pytest.importorskip("pyspark")

EPOCHS, BACKUP_EVERY, KILL_AT = 2, 3, (1, 5)   # worker 1 dies as the second epoch's 6th step begins


@pytest.fixture(scope="module")
def spark():
    from pinstorm.training.spark import local_spark_session

    session = local_spark_session(2)
    yield session
    session.stop()


def _mid_epoch_probe(folder: str, checkpoint_dir: str, marker: str, kill_at: tuple[int, int]):
    """A Keras callback (a class made here, so Spark ships it by value) that writes, per attempt and rank,
    the input position the fit started from and every (epoch, step) it began; worker 1 of the first
    attempt exits (``os._exit``: the process is gone, as when a node is lost) as step ``kill_at`` begins."""
    import tf_keras as keras

    class MidEpochProbe(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            import os
            from pathlib import Path

            from pinstorm.training.multiworker import read_tf_config, task_rank
            from pinstorm.training.resume import state_path

            self.rank = task_rank(read_tf_config())
            self.attempt = "relaunch" if os.path.exists(marker) else "first"
            position = state_path(checkpoint_dir, self.rank)
            self.record = {"position": json.loads(position.read_text()) if position.exists() else None,
                           "steps": []}
            self.path = Path(folder) / f"{self.attempt}-rank{self.rank}.json"
            self.epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = int(epoch)

        def on_train_batch_begin(self, batch, logs=None):
            import os

            batch = int(batch)   # numpy in a restored run
            if self.rank == 1 and self.attempt == "first" and (self.epoch, batch) == tuple(kill_at):
                open(marker, "w").close()
                os._exit(1)
            self.record["steps"].append([self.epoch, batch])
            self.path.write_text(json.dumps(self.record))

    return MidEpochProbe()


@pytest.mark.slow
@pytest.mark.once
def test_a_relaunch_after_a_worker_died_mid_epoch_resumes_at_the_last_backup(spark, digits_parquet, tmp_path):
    from pinstorm.training.spark import spark_train

    marker, probes = tmp_path / "died", tmp_path / "probes"
    probes.mkdir()
    checkpoint = tmp_path / "backup"
    args = dict(model_name="alexnet", data=digits_parquet["train"], epochs=EPOCHS, batch_size=8, image_size=32,
                model_kwargs={"width": 0.125}, seed=5, output_dir=str(tmp_path / "out"),
                checkpoint_dir=str(checkpoint), backup_every=BACKUP_EVERY, input_options={"flip": False}, verbose=0,
                callbacks=[_mid_epoch_probe(str(probes), str(checkpoint), str(marker), KILL_AT)])
    result = spark_train(args, 2, spark, max_restarts=1)

    assert marker.exists() and result.restarts == 1 and result.attempts[0].error
    steps = result[0].result["steps_per_epoch"]
    assert steps > KILL_AT[1] + 1
    first = json.loads((probes / "first-rank1.json").read_text())
    assert first["position"] is None and first["steps"][-1] == [KILL_AT[0], KILL_AT[1] - 1]   # died at KILL_AT

    for rank in (0, 1):
        relaunch = json.loads((probes / f"relaunch-rank{rank}.json").read_text())
        saved_epoch, saved_step = relaunch["position"]["counters"]         # the backup it restored
        assert relaunch["position"]["steps"] == saved_epoch * steps + saved_step + 1   # the input's position
        assert 0 < KILL_AT[1] - saved_step <= BACKUP_EVERY and saved_epoch == KILL_AT[0]
        # it starts at the step after the backup, mid-epoch, and runs every later step once
        resumed_at = saved_epoch * steps + saved_step + 1
        assert [e * steps + s for e, s in relaunch["steps"]] == list(range(resumed_at, EPOCHS * steps))
        assert relaunch["steps"][0][1] > 0

    assert result.resumed_from_epoch == KILL_AT[0] and result[0].result["epochs"] == [1]
    completed = [int(row["epoch"]) for row in csv.DictReader(open(tmp_path / "out" / "metrics.csv"))]
    assert completed == list(range(EPOCHS))                                 # every epoch once
    assert not (checkpoint / "input-position.json").exists()               # a finished run leaves no backup
