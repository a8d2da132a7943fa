"""spark_train on a REAL Spark standalone cluster: a master and two 1-core workers started on 127.0.0.1
by the fixture (pyspark's bin/spark-class), one executor each.

In file order (one SparkContext per process at a time): the command line with executors that run
an interpreter without TensorFlow (a clear error, not a stack trace); then one session for the rest:
addresses and interpreters the executors really used, a bounded relaunch that lists each attempt's
cause, a worker process killed mid-fit and the stage relaunched from the backup, and the seed's
per-worker partitions fetched from the demo's digits board over HTTP.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pinstorm.training.spark import SparkTrainError, available_slots, spark_session, spark_train
from pinstorm.training.spark_session import wait_for_slots
from loopback_support import is_loopback, listening
from servers import spark_standalone

pytest_plugins = ["conftest_training"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("java") is None, reason="a Spark standalone cluster needs Java"),
]

TINY_ARGS = dict(model_name="alexnet", batch_size=8, image_size=32, model_kwargs={"width": 0.125}, seed=5,
                 input_options={"flip": False}, verbose=0)


@pytest.fixture(scope="module")
def cluster():
    yield from spark_standalone.serve(workers=2, cores=1)


@pytest.fixture(scope="module")
def session(cluster):
    spark = spark_session(cluster.master_url, app_name="pinstorm-tests")
    yield spark
    spark.stop()


@pytest.fixture
def python_without_tensorflow() -> str:
    """This venv's base interpreter: same Python version (PySpark insists), none of the venv's packages."""
    base = getattr(sys, "_base_executable", None)
    if not base or sys.prefix == sys.base_prefix:
        pytest.skip("not running in a virtual environment")
    found = subprocess.run([base, "-c", "import importlib.util as u; print(u.find_spec('tensorflow') is None)"],
                           capture_output=True, text=True)
    if found.stdout.strip() != "True":
        pytest.skip(f"{base} can import tensorflow")
    return base


def test_cli_names_the_executor_python_that_lacks_tensorflow(python_without_tensorflow, cluster, digits_parquet,
                                                             tmp_path):
    from click.testing import CliRunner

    from pinstorm.cli import cli

    python = python_without_tensorflow
    outcome = CliRunner().invoke(cli, ["spark-train", "alexnet", digits_parquet["train"], "--master",
                                       cluster.master_url, "--workers", "2", "--python", python, "--epochs", "1",
                                       "--output-dir", str(tmp_path / "out")])
    assert outcome.exit_code == 1, outcome.output
    assert f"executors run {python}, which cannot import pinstorm, tensorflow" in outcome.output
    assert "set PYSPARK_PYTHON" in outcome.output and sys.executable in outcome.output
    assert not (tmp_path / "out").exists()                    # nothing started training


def _whoami_function():
    """Defined in a closure, so Spark ships it by value (the tests are not importable on executors)."""

    def whoami(rank, num_workers):
        import json
        import os
        import sys

        ancestors, pid = [], os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
            ancestors.append(pid)
        return {"pid": os.getpid(), "ancestors": ancestors, "python": sys.executable,
                "pythonpath": os.environ.get("PYTHONPATH", ""), "tf_config": json.loads(os.environ["TF_CONFIG"])}

    return whoami


def test_executors_run_this_venv_and_everything_binds_to_loopback(session, cluster):
    conf = session.sparkContext.getConf()
    assert session.sparkContext.master == cluster.master_url
    assert conf.get("spark.driver.host") == conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert wait_for_slots(session, 2) == available_slots(session) == 2    # two 1-core executors registered
    results = spark_train(_whoami_function(), 2, session)
    assert [r.rank for r in results] == [0, 1] and results.restarts == 0
    assert {e["python"] for e in results.executors} == {sys.executable}
    assert all(r.result["python"] == sys.executable for r in results)
    repo_root = str(Path(__file__).resolve().parent.parent)
    for result in results:                                     # pinstorm comes from the install, not a path
        assert repo_root not in result.result["pythonpath"].split(":"), result.result["pythonpath"]
    workers = results[0].result["tf_config"]["cluster"]["worker"]
    assert workers == results[1].result["tf_config"]["cluster"]["worker"] == [r.address for r in results]
    assert all(address.startswith("127.0.0.1:") for address in workers), workers
    # the driver, master, workers and executors listen on loopback only
    jvms = [session.sparkContext._gateway.proc.pid, cluster.master.process.pid]
    for daemon in cluster.worker_daemons:
        jvms += [daemon.process.pid, *daemon.descendants()]
    sockets = listening(jvms)
    assert len(sockets) >= 5 and all(is_loopback(address) for address, _ in sockets), sockets
    # each task ran under its own worker daemon's executor, not in the driver
    worker_pids = [daemon.process.pid for daemon in cluster.worker_daemons]
    hosts = [[pid for pid in r.result["ancestors"] if pid in worker_pids] for r in results]
    assert sorted(sum(hosts, [])) == sorted(worker_pids), hosts


def test_failures_are_relaunched_then_reported_with_each_cause(session):
    def fails(rank, num_workers):
        import os

        raise RuntimeError(f"rank {rank} could not start (pid {os.getpid()})")

    with pytest.raises(SparkTrainError) as raised:
        spark_train(fails, 2, session, max_restarts=1)
    message = str(raised.value)
    assert "failed 2 times (max_restarts=1)" in message
    assert message.count("RuntimeError: rank") == 2, message
    assert "attempt 1 (" in message and "attempt 2 (" in message


def test_a_killed_worker_relaunches_the_stage_from_the_backup(session, cluster, digits_parquet, tmp_path):
    epochs = 4
    args = dict(TINY_ARGS, data=digits_parquet["train"], validation_data=digits_parquet["val"], epochs=epochs,
                output_dir=str(tmp_path / "out"), checkpoint_dir=str(tmp_path / "backup"))
    killed: list[int] = []
    stop = threading.Event()

    def kill_after_first_backup():
        backup = tmp_path / "backup" / "chief" / "checkpoint"
        deadline = time.monotonic() + 240
        while not backup.exists() and not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = cluster.python_task_pids()
        if backup.exists() and pids:
            subprocess.run(["kill", "-9", str(pids[-1])], check=False)
            killed.append(pids[-1])

    killer = threading.Thread(target=kill_after_first_backup, daemon=True)
    killer.start()
    try:
        results = spark_train(args, 2, session, max_restarts=2)
    finally:
        stop.set()
        killer.join(10)
    assert killed, "no task process was found to kill"
    assert results.restarts == 1, results.attempts
    assert results.attempts[0].error and results.attempts[1].error is None
    assert "Python worker exited unexpectedly" in results.attempts[0].error or "crashed" in results.attempts[0].error
    assert results.resumed_from_epoch >= 1                     # the backup kept the finished epochs
    assert 0 < results.seconds_lost <= results.failed_seconds
    summaries = [r.result for r in results]
    assert summaries[0]["epochs"] == list(range(results.resumed_from_epoch, epochs))
    assert summaries[0]["history"]["loss"] == summaries[1]["history"]["loss"]
    completed = [int(row["epoch"]) for row in csv.DictReader(open(tmp_path / "out" / "metrics.csv"))]
    assert set(completed) == set(range(epochs))
    assert json.loads(json.dumps(results.summary()))["restarts"] == 1


@pytest.fixture
def digits_board_url(http_board, tmp_path):
    """The demo's flow: an ILSVRC-shaped digits tree, one zipped pin per category, served over HTTP."""
    from pinstorm.pipeline import convert, make_digits_tree, repartition, scan

    board, folder, url = http_board
    layout = scan(make_digits_tree(tmp_path / "tree", image_size=32, per_class=10, seed=1))
    repartition(layout, board.name, zip=True, progress=False)
    val = convert(layout, str(tmp_path / "val"), split="val", classes=layout.classes, min_row_groups=2,
                  progress=False)
    return url, val.url, layout


def test_each_worker_trains_on_its_own_partition_from_the_board(session, digits_board_url, tmp_path):
    url, val_url, layout = digits_board_url
    board = {"kind": "datatxt", "url": url, "cache": str(tmp_path / "executor-cache")}
    args = dict(TINY_ARGS, partition_board=board, validation_data=val_url, epochs=2,
                output_dir=str(tmp_path / "out"), checkpoint_dir=str(tmp_path / "backup"))
    results = spark_train(args, 2, session)
    summaries = [r.result for r in results]
    partitions = [s["partition"] for s in summaries]
    assert [p["index"] for p in partitions] == [0, 1] and all(p["of"] == 2 for p in partitions)
    first, second = (set(p["categories"]) for p in partitions)
    assert first and second and not first & second and first | second == set(layout.classes)
    assert sum(p["rows"] for p in partitions) == len(layout.items("train"))
    assert partitions[0]["rows_per_worker"] == partitions[1]["rows_per_worker"] == [p["rows"] for p in partitions]
    assert all(s["input_shards"] == [None] for s in summaries)     # each read all of its own slice
    steps = min(p["rows"] for p in partitions) // 8
    assert all(s["steps_per_epoch"] == steps for s in summaries)
    assert summaries[0]["history"]["loss"] == summaries[1]["history"]["loss"]   # one model, all-reduced
    assert summaries[0]["num_classes"] == len(layout.classes) and "accuracy" in summaries[0]["val_metrics"]
    assert (tmp_path / "out" / "metrics.csv").exists()
    assert Path(partitions[1]["url"].removeprefix("file://")).is_relative_to(tmp_path / "out" / "workers")
