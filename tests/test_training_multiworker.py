"""Two workers on 127.0.0.1 through the real entry point (``pinstorm train`` with TF_CONFIG set):
identical weights at the end, and a run whose worker is killed mid-fit resumes from the backup.
The workers' TF_CONFIG and the connections they really made stay on loopback."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest

from pinstorm.training.multiworker import (MultiWorkerError, cluster_size, is_chief, local_cluster, make_tf_config,
                                  read_tf_config, task_rank, worker_output_dir)
from loopback_support import is_loopback, peers
from training_support import finish

pytest_plugins = ["conftest_training"]


def test_tf_config_helpers(tmp_path):
    workers = ["127.0.0.1:1111", "127.0.0.1:2222"]
    config = read_tf_config({"TF_CONFIG": make_tf_config(workers, 1)})
    assert cluster_size(config) == 2 and task_rank(config) == 1 and not is_chief(config)
    assert worker_output_dir(tmp_path, config) == tmp_path / "workers" / "rank1"
    chief = read_tf_config({"TF_CONFIG": json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:2"]},
                                                       "task": {"type": "worker", "index": 0}})})
    assert task_rank(chief) == 1 and cluster_size(chief) == 2
    assert read_tf_config({}) is None and cluster_size(None) == 1 and is_chief(None)
    with pytest.raises(MultiWorkerError, match="task worker:5 is not in the cluster"):
        read_tf_config({"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker",
                                                                                            "index": 5}})})
    with pytest.raises(MultiWorkerError, match="needs a 'cluster'"):
        read_tf_config({"TF_CONFIG": json.dumps({"task": {}})})
    addresses = local_cluster(3)
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)


def _launch(processes, digits_parquet, tmp_path, epochs, workers=None):
    workers = workers or local_cluster(2)
    args = ["-m", "pinstorm.cli", "train", "alexnet", digits_parquet["train"], "--val", digits_parquet["val"],
            "--strategy", "multiworker", "--epochs", str(epochs), "--batch-size", "8", "--image-size", "32",
            "--width", "0.125", "--no-flip", "--seed", "3", "--json",
            "--output-dir", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "backup")]
    return [processes.start(args, env={"TF_CONFIG": make_tf_config(workers, i)}) for i in range(len(workers))]


def _weights(path) -> list[np.ndarray]:
    import h5py

    arrays = []
    with h5py.File(path, "r") as handle:
        handle.visititems(lambda name, item: arrays.append((name, item[()])) if isinstance(item, h5py.Dataset)
                          else None)
    return [value for _, value in sorted(arrays, key=lambda pair: pair[0])]


def _summaries(started) -> list[dict]:
    return [json.loads(finish(process, timeout=240)[0].strip().splitlines()[-1]) for process in started]


def _assert_identical_weights(tmp_path):
    chief = _weights(tmp_path / "out" / "final.weights.h5")
    other = _weights(tmp_path / "out" / "workers" / "rank1" / "final.weights.h5")
    assert len(chief) == len(other) > 10
    for a, b in zip(chief, other):
        np.testing.assert_array_equal(a, b)


def _assert_on_loopback(started):
    """The TF_CONFIG each worker process got, and the peers it is connected to, are all 127.0.0.1."""
    for process in started:
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{process.pid}/environ").read_bytes().decode().split("\0") if "=" in item)
        addresses = json.loads(environ["TF_CONFIG"])["cluster"]["worker"]
        assert all(address.startswith("127.0.0.1:") for address in addresses), addresses
    connected = peers([process.pid for process in started])
    assert connected and all(is_loopback(address) for address, _ in connected), connected


@pytest.mark.slow
def test_two_workers_finish_with_identical_weights(processes, digits_parquet, tmp_path):
    summaries = _summaries(_launch(processes, digits_parquet, tmp_path, epochs=2))
    assert [s["is_chief"] for s in summaries] == [True, False]
    assert all(s["replicas"] == 2 and s["global_batch_size"] == 16 for s in summaries)
    assert all(s["strategy"]["kind"] == "multiworker" for s in summaries)
    assert [s["input_shards"] for s in summaries] == [[[0, 2]], [[1, 2]]]   # each read its own shard
    assert summaries[0]["history"]["loss"] == summaries[1]["history"]["loss"]  # all-reduced, step for step
    _assert_identical_weights(tmp_path)


@pytest.mark.slow
@pytest.mark.once
def test_a_killed_worker_run_resumes_from_the_backup(processes, digits_parquet, tmp_path):
    epochs = 6
    first = _launch(processes, digits_parquet, tmp_path, epochs)
    backup = tmp_path / "backup" / "chief" / "checkpoint"
    deadline = time.monotonic() + 180
    while not backup.exists():
        assert time.monotonic() < deadline, "no backup was written"
        assert all(p.poll() is None for p in first), "a worker ended before its first backup"
        time.sleep(0.1)
    _assert_on_loopback(first)
    first[1].kill()                                         # worker 1 dies mid-fit
    first[1].wait(10)
    try:
        first[0].wait(120)                                  # the chief loses its peer and fails
    except Exception:
        pytest.fail("the surviving worker did not notice that its peer died")
    assert first[0].returncode != 0
    completed = [int(row["epoch"]) for row in csv.DictReader(open(tmp_path / "out" / "metrics.csv"))]
    assert completed and max(completed) < epochs - 1, completed

    summaries = _summaries(_launch(processes, digits_parquet, tmp_path, epochs))   # relaunch both
    assert all(s["initial_epoch"] >= 1 for s in summaries), [s["initial_epoch"] for s in summaries]
    assert summaries[0]["epochs"] == list(range(summaries[0]["initial_epoch"], epochs))
    resumed = [int(row["epoch"]) for row in csv.DictReader(open(tmp_path / "out" / "metrics.csv"))]
    assert set(resumed) == set(range(epochs))
    assert not list(Path(tmp_path / "backup").rglob("*.index"))
    _assert_identical_weights(tmp_path)
