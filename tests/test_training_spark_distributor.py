"""spark_train(framework="torch") on Spark's own TorchDistributor, where it can run.

PySpark 4's TorchDistributor runs its barrier stage as a ``mapInArrow``, which needs pyarrow >= 18; the
full environment pins pyarrow 14 for petastorm and the modern one has no torch, so CI's environments skip
this file and test pinstorm's own barrier launcher (tests/test_training_torch.py). It runs wherever torch,
pyspark and pyarrow >= 18 meet: ``make test-distributor`` runs it in ``.venv-peers`` (``bench/peers-env``)."""

from __future__ import annotations

import shutil

import pytest

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")
pytest.importorskip("pyspark")
pyarrow = pytest.importorskip("pyarrow")
pytestmark = pytest.mark.skipif(int(pyarrow.__version__.split(".")[0]) < 18,
                                reason=f"TorchDistributor's mapInArrow needs pyarrow >= 18 (here {pyarrow.__version__})")


@pytest.fixture
def spark():
    from pinstorm.training.spark import local_spark_session

    session = local_spark_session(2)
    yield session
    session.stop()   # one SparkContext per process at a time: the cluster test makes its own


def _two_ranks(digits_parquet, tmp_path, name: str) -> dict:
    return dict(model_name="alexnet", data=digits_parquet["train"], epochs=1, batch_size=8, image_size=32,
                model_kwargs={"width": 0.125}, seed=0, output_dir=str(tmp_path / name), input_options={"flip": False})


def _same_weights(result) -> bool:
    first, second = (torch.load(w.result["weights_path"], weights_only=True) for w in result)
    return all(torch.equal(first[k], second[k]) for k in first)


def test_torch_distributor_runs_two_ddp_ranks_and_auto_picks_it(spark, digits_parquet, tmp_path):
    from pinstorm.training.spark import spark_train, torch_launcher

    assert torch_launcher("auto") == "torch-distributor"
    result = spark_train(_two_ranks(digits_parquet, tmp_path, "run"), 2, spark, framework="torch",
                         torch_launcher="torch-distributor")
    assert [w.rank for w in result] == [0, 1] and result.restarts == 0
    assert [w.result["input_shards"] for w in result] == [[[0, 2]], [[1, 2]]]
    assert _same_weights(result)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("java") is None, reason="a Spark standalone cluster needs Java")
def test_torch_distributor_on_the_standalone_cluster(digits_parquet, tmp_path):
    """A master and two 1-core workers on 127.0.0.1 (pyspark's spark-class): one rank per executor."""
    from pinstorm.training.spark import spark_session, spark_train
    from servers import spark_standalone

    cluster = spark_standalone.serve(workers=2, cores=1)
    master = next(cluster)
    try:
        spark = spark_session(master.master_url, app_name="pinstorm-torch-distributor")
        try:
            result = spark_train(_two_ranks(digits_parquet, tmp_path, "cluster"), 2, spark, framework="torch",
                                 torch_launcher="torch-distributor")
        finally:
            spark.stop()
    finally:
        cluster.close()
    assert [w.rank for w in result] == [0, 1] and result[0].address != result[1].address
    assert _same_weights(result)
