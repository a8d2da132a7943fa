"""spark_train on local[2]: a barrier stage of two TensorFlow workers, each on its own shard, and a
stage asking for more tasks than slots failing at once with a clear message."""

from __future__ import annotations

import sys
import time

import pytest

from pinstorm.training.spark import SparkTrainError, available_slots, local_spark_session, spark_train

pytest_plugins = ["conftest_training"]


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
    assert [r.result["tf_config"]["task"]["index"] for r in results] == [0, 1]


@pytest.mark.slow
def test_too_many_tasks_fail_fast(spark):
    started = time.monotonic()
    with pytest.raises(SparkTrainError, match="needs all 3 tasks running at once but this Spark cluster has 2"):
        spark_train(_whoami_function(), 3, spark)
    assert time.monotonic() - started < 5


@pytest.mark.slow
def test_spark_barrier_trains_alexnet_on_shards(spark, digits_parquet, tmp_path):
    args = dict(model_name="alexnet", data=digits_parquet["train"], validation_data=digits_parquet["val"],
                epochs=2, batch_size=8, image_size=32, model_kwargs={"width": 0.125}, seed=5,
                output_dir=str(tmp_path / "out"), checkpoint_dir=str(tmp_path / "backup"),
                input_options={"flip": False}, verbose=0)
    results = spark_train(args, 2, spark)
    summaries = [r.result for r in results]
    assert [s["is_chief"] for s in summaries] == [True, False]
    assert [s["input_shards"] for s in summaries] == [[[0, 2]], [[1, 2]]]
    assert all(s["strategy"]["kind"] == "multiworker" and s["replicas"] == 2 for s in summaries)
    assert summaries[0]["history"]["loss"] == summaries[1]["history"]["loss"]
    assert len(summaries[0]["history"]["loss"]) == 2 and "accuracy" in summaries[0]["val_metrics"]
    assert (tmp_path / "out" / "metrics.csv").exists() and (tmp_path / "out" / "curves.png").exists()
    assert (tmp_path / "out" / "workers" / "rank1" / "final.weights.h5").exists()
