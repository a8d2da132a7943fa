"""spark_train on local[2]: a barrier stage of two TensorFlow workers, each on its own shard, a stage
asking for more tasks than slots failing at once with a clear message, everything on 127.0.0.1; and
the fast parts (argument checks, error messages, restart figures) without Spark.

The standalone-cluster tests (relaunch after a killed worker, per-worker partitions, the command
line) are in test_training_spark_cluster.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from loopback_support import is_loopback, listening
from pinstorm.training.spark import (Attempt, SparkTrainError, SparkTrainResult, WorkerResult, _check_args,
                                     available_slots, local_spark_session, spark_error_message, spark_train)
from pinstorm.training.spark_session import master_is_local, session_settings

pytest_plugins = ["conftest_training"]


@pytest.fixture
def python_without_tensorflow() -> str:
    """This venv's base interpreter: the same Python version (PySpark insists), none of the venv's packages."""
    base = getattr(sys, "_base_executable", None)
    if not base or sys.prefix == sys.base_prefix:
        pytest.skip("not running in a virtual environment")
    found = subprocess.run([base, "-c", "import importlib.util as u; print(u.find_spec('tensorflow') is None)"],
                           capture_output=True, text=True)
    if found.stdout.strip() != "True":
        pytest.skip(f"{base} can import tensorflow")
    return base


@pytest.mark.slow
@pytest.mark.once
def test_cli_names_the_executor_python_that_lacks_tensorflow(python_without_tensorflow, digits_parquet, tmp_path):
    """First in the file: the command line makes (and stops) its own session before the module's one starts."""
    from click.testing import CliRunner

    from pinstorm.cli import cli

    python = python_without_tensorflow
    outcome = CliRunner().invoke(cli, ["spark-train", "alexnet", digits_parquet["train"], "--master", "local[2]",
                                       "--python", python, "--epochs", "1", "--output-dir", str(tmp_path / "out")])
    assert outcome.exit_code == 1, outcome.output
    assert f"executors run {python}, which cannot import pinstorm, tensorflow" in outcome.output
    assert "set PYSPARK_PYTHON" in outcome.output and sys.executable in outcome.output
    assert not (tmp_path / "out").exists()                    # nothing started training


@pytest.fixture(scope="module")
def spark():
    session = local_spark_session(2)
    yield session
    session.stop()


def _whoami_function():
    """A task function defined in a closure, so Spark ships it by value (tests are not importable there)."""

    def whoami(rank, num_workers):
        import json
        import os
        import sys

        return {"rank": rank, "num_workers": num_workers, "pid": os.getpid(), "python": sys.executable,
                "tf_config": json.loads(os.environ["TF_CONFIG"])}

    return whoami


@pytest.mark.slow
def test_barrier_tasks_exchange_addresses(spark):
    assert available_slots(spark) == 2
    results = spark_train(_whoami_function(), 2, spark)
    assert [r.rank for r in results] == [0, 1]
    assert results[0].result["pid"] != results[1].result["pid"]
    assert all(r.result["python"] == sys.executable for r in results)   # PYSPARK_PYTHON: this venv
    clusters = [r.result["tf_config"]["cluster"]["worker"] for r in results]
    assert clusters[0] == clusters[1] == [results[0].address, results[1].address]
    assert len(set(clusters[0])) == 2                                     # same host, different ports
    assert all(address.startswith("127.0.0.1:") for address in clusters[0]), clusters[0]
    assert [r.result["tf_config"]["task"]["index"] for r in results] == [0, 1]


@pytest.mark.slow
def test_local_session_binds_only_loopback(spark):
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == conf.get("spark.driver.bindAddress") == "127.0.0.1"
    driver_jvm = spark.sparkContext._gateway.proc.pid
    sockets = listening([driver_jvm])
    assert sockets and all(is_loopback(address) for address, _ in sockets), sockets


@pytest.mark.slow
def test_too_many_tasks_fail_fast(spark):
    started = time.monotonic()
    with pytest.raises(SparkTrainError, match="needs all 3 tasks running at once but this Spark cluster has 2"):
        spark_train(_whoami_function(), 3, spark)
    assert time.monotonic() - started < 60        # not Spark's default ten minutes of retries


@pytest.mark.slow
def test_spark_barrier_trains_alexnet_on_shards(spark, digits_parquet, tmp_path):
    args = dict(model_name="alexnet", data=digits_parquet["train"], validation_data=digits_parquet["val"],
                epochs=2, batch_size=8, image_size=32, model_kwargs={"width": 0.125}, seed=5,
                output_dir=str(tmp_path / "out"), checkpoint_dir=str(tmp_path / "backup"),
                input_options={"flip": False}, verbose=0)
    lines: list[str] = []
    results = spark_train(args, 2, spark, progress=lines.append)
    summaries = [r.result for r in results]
    # rank 0 reported each epoch to the driver while it trained (and only rank 0)
    assert [line.split(":")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"], lines
    assert all(" loss " in line and "val_accuracy" in line for line in lines), lines
    assert [s["is_chief"] for s in summaries] == [True, False]
    assert [s["input_shards"] for s in summaries] == [[[0, 2]], [[1, 2]]]
    assert all(s["strategy"]["kind"] == "multiworker" and s["replicas"] == 2 for s in summaries)
    assert summaries[0]["history"]["loss"] == summaries[1]["history"]["loss"]
    assert len(summaries[0]["history"]["loss"]) == 2 and "accuracy" in summaries[0]["val_metrics"]
    assert (tmp_path / "out" / "metrics.csv").exists() and (tmp_path / "out" / "curves.png").exists()
    assert (tmp_path / "out" / "workers" / "rank1" / "final.weights.h5").exists()


# --------------------------------------------------------------------------- without Spark

def test_arguments_are_checked_before_any_session_starts(tmp_path):
    with pytest.raises(SparkTrainError, match="positive integer"):
        spark_train({"data": "x"}, 0)
    with pytest.raises(SparkTrainError, match="either data .* or partition_board"):
        _check_args({"data": "x", "partition_board": "http://127.0.0.1:1/"}, 2)
    with pytest.raises(SparkTrainError, match="needs data"):
        _check_args({"epochs": 1}, 2)
    with pytest.raises(SparkTrainError, match="needs a 'kind'"):
        _check_args({"partition_board": {"url": "http://127.0.0.1:1/"}}, 2)
    with pytest.raises(SparkTrainError, match="'nope' is not a registered board"):
        _check_args({"partition_board": "nope"}, 2)
    with pytest.raises(SparkTrainError, match="max_restarts"):
        spark_train({"data": "x"}, 2, max_restarts=-1)
    args = _check_args({"partition_board": "http://127.0.0.1:1/b", "model_name": "alexnet"}, 2)
    assert args["partition_board"] == {"kind": "url", "url": "http://127.0.0.1:1/b"}   # boards.resolve_board's rule
    # one output folder for every rank and every relaunch, chosen on the driver
    assert os.path.isabs(args["output_dir"]) and os.path.basename(args["output_dir"]).startswith("alexnet-")
    from pinstorm import boards

    boards.board_register("local", name="parts", path=tmp_path / "b")
    assert _check_args({"partition_board": "parts"}, 2)["partition_board"] == {"kind": "local",
                                                                               "path": str(tmp_path / "b")}
    # a Board from a constructor needs no registration: its spec travels to the executors
    folder = boards.board_folder(tmp_path / "f", cache=tmp_path / "c")
    spec = _check_args({"partition_board": folder}, 2)["partition_board"]
    assert spec["kind"] == "folder" and spec["path"] == str(tmp_path / "f") and spec["cache"] == str(tmp_path / "c")
    assert boards.board_from_spec(spec).pin_list() == []


def test_progress_lines_reach_the_driver_only_with_the_token():
    from pinstorm.training.spark_progress import ProgressListener, epoch_line, send_line

    lines: list[str] = []
    with ProgressListener("127.0.0.1", lines.append) as listener:
        assert listener.address.startswith("127.0.0.1:")
        assert send_line(listener.address, "not-the-token", "epoch 9: forged")
        assert send_line(listener.address, listener.token, epoch_line(0, 3, {"loss": 0.4123, "accuracy": 0.5,
                                                                              "note": "x"}, 12.34))
        assert send_line(listener.address, listener.token, "bell\x07 and " + "x" * 5000)
        deadline = time.monotonic() + 10
        while len(lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    epoch, long = sorted(lines, key=lambda line: not line.startswith("epoch"))   # two connections, any order
    assert epoch == "epoch 1/3: loss 0.4123  accuracy 0.5  (12.3 s)"
    assert long.startswith("bell and xxx") and len(long) <= 1000               # no control characters, bounded
    assert len(lines) == 2                                                     # the forged line was dropped
    assert not send_line(listener.address, listener.token, "closed")          # the listener is gone


def test_master_urls_on_this_machine():
    assert master_is_local("local[2]") and master_is_local("local")
    assert master_is_local("spark://127.0.0.1:7077") and master_is_local("spark://localhost:7077,127.0.0.2:7078")
    assert not master_is_local("spark://10.0.0.5:7077") and not master_is_local("spark://127.0.0.1:1,10.0.0.5:2")
    assert not master_is_local("yarn") and not master_is_local("k8s://https://127.0.0.1:6443")


def test_session_settings_for_each_kind_of_master(monkeypatch):
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    master, settings, environment = session_settings(None, workers=3)
    assert master == "local[3]" and settings["spark.ui.enabled"] == "false"
    assert settings["spark.driver.host"] == settings["spark.driver.bindAddress"] == "127.0.0.1"
    assert environment == {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                           "SPARK_LOCAL_IP": "127.0.0.1"}
    assert settings["spark.python.worker.reuse"] == "false"
    assert not any("PYTHONPATH" in key for key in settings)            # pinstorm is installed: no path added

    _, settings, environment = session_settings("spark://127.0.0.1:7077")
    assert settings["spark.driver.host"] == "127.0.0.1" and environment["SPARK_LOCAL_IP"] == "127.0.0.1"

    for remote in ("spark://10.0.0.5:7077", "yarn", "k8s://https://10.0.0.1:6443"):
        master, settings, environment = session_settings(remote, python="./environment/bin/python")
        assert master == remote                                            # passed through unchanged
        assert "spark.driver.host" not in settings and environment["SPARK_LOCAL_IP"] is None
        assert environment["PYSPARK_PYTHON"] == settings["spark.pyspark.python"] == "./environment/bin/python"

    _, settings, environment = session_settings(
        "yarn", pythonpath=["/opt/extra"], conf={"spark.pyspark.python": "/env/bin/python",
                                                 "spark.archives": "env.tar.gz#environment",
                                                 "spark.python.worker.reuse": "true"})
    assert environment["PYSPARK_PYTHON"] == "/env/bin/python"               # Spark's own setting is honoured
    assert settings["spark.executorEnv.PYTHONPATH"] == "/opt/extra"
    assert settings["spark.archives"] == "env.tar.gz#environment"
    assert settings["spark.python.worker.reuse"] == "true"                  # the caller's conf wins


def test_restart_figures():
    summary = {"initial_epoch": 2, "epochs": [2, 3], "seconds": 20.0}
    run = SparkTrainResult([WorkerResult(0, 2, "127.0.0.1:1", 25.0, summary)],
                           [Attempt(1, 45.0, "PythonException: worker crashed"), Attempt(2, 30.0)])
    assert run.restarts == 1 and run.failed_seconds == 45.0 and run.resumed_from_epoch == 2
    assert run.seconds_lost == pytest.approx(25.0)      # 45 s failed, 2 epochs of ~10 s kept
    assert run[0].rank == 0 and len(run) == 1 and run.summary()["restarts"] == 1
    clean = SparkTrainResult([WorkerResult(0, 1, "a:1", 1.0, {"epochs": [0], "seconds": 1.0})], [Attempt(1, 2.0)])
    assert clean.restarts == 0 and clean.seconds_lost == 0.0


def test_spark_error_messages_name_the_cause():
    python_error = ("An error occurred while calling o77.collect.\n: org.apache.spark.SparkException: Job aborted\n"
                    "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
                    '  File "x.py", line 1, in f\n    raise ValueError("boom")\nValueError: boom 1\n SQLSTATE: 38000\n'
                    "\tat org.apache.spark.Foo.bar(Foo.scala:1)\n")
    assert spark_error_message(Exception(python_error)) == "ValueError: boom 1"
    crashed = ("An error occurred while calling o90.collect.\n: org.apache.spark.SparkException: Job aborted due to "
               "stage failure: Could not recover from a failed barrier ResultStage.\norg.apache.spark.SparkException: "
               "Python worker exited unexpectedly (crashed). Consider setting 'spark.python.worker.faulthandler."
               "enabled' configuration to 'true' for the better Python traceback.\n"
               "\tat org.apache.spark.Foo.bar(F.scala:1)\n")
    assert spark_error_message(Exception(crashed)) == ("org.apache.spark.SparkException: Python worker exited "
                                                       "unexpectedly (crashed)")
    assert spark_error_message(Exception("")) == "Exception"


@pytest.mark.slow
def test_a_session_starts_without_pysparks_pandas_3_warning():
    """PySpark 4 warns about pandas >= 3 whenever a context starts; pinstorm silences exactly that warning."""
    import pandas

    if int(pandas.__version__.split(".")[0]) < 3:
        pytest.skip("PySpark warns only with pandas >= 3")
    code = ("import warnings; warnings.simplefilter('default')\n"
            "from pinstorm.training.spark_session import local_spark_session\n"
            "warnings.warn('another FutureWarning still shows', FutureWarning)\n"
            "local_spark_session(1).stop()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "another FutureWarning still shows" in run.stderr
    assert "fully support pandas" not in run.stderr


@pytest.mark.parametrize("ending, code", [("", 0), ("raise RuntimeError('after the rank')", 1)])
@pytest.mark.parametrize("torchrun", [True, False])
def test_a_torchrun_rank_ends_without_teardown_keeping_its_output_and_exit_code(ending, code, torchrun):
    """`_end_without_teardown`: under torchrun the process ends through os._exit at exit (the atexit hook
    registered before it never runs), with its buffered output flushed and 1 after an unhandled error;
    elsewhere the process ends as usual (the hook runs)."""
    script = ("import atexit, sys\n"
              "atexit.register(lambda: print('ordinary teardown', flush=True))\n"
              "from pinstorm.training.spark import _end_without_teardown\n"
              "_end_without_teardown()\n"
              "sys.stdout.write('the result, unflushed')\n" + ending + "\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    if torchrun:
        env["TORCHELASTIC_RUN_ID"] = "test"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert "the result, unflushed" in done.stdout
    assert ("ordinary teardown" in done.stdout) is not torchrun
    assert ("RuntimeError: after the rank" in done.stderr) is bool(ending)
