"""spark_train(framework="torch") on Spark's own TorchDistributor, where it can run.

TorchDistributor runs its barrier stage as a ``mapInArrow``, which needs the pyarrow PySpark asks for:
any >= 4 on PySpark 3.5, >= 18 on PySpark 4. CI's full environment (PySpark 3.5 beside petastorm's
pyarrow 14, torch's CPU build) runs this file; the modern one has no torch and skips it. ``make
test-distributor`` runs it on PySpark 4 (``.venv-peers``: pyarrow 26, torch 2.14)."""

from __future__ import annotations

import shutil

import pytest

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")
pytest.importorskip("pyspark")


def _pyspark_refuses_this_pyarrow() -> str | None:
    """PySpark's own verdict on the installed pyarrow, asked directly (not through pinstorm)."""
    from pyspark.sql.pandas.utils import require_minimum_pyarrow_version

    try:
        require_minimum_pyarrow_version()
    except Exception as error:
        return str(error)
    return None


needs_arrow_stages = pytest.mark.skipif(_pyspark_refuses_this_pyarrow() is not None,
                                        reason="TorchDistributor's mapInArrow: PySpark refuses this pyarrow")


def test_auto_picks_torch_distributor_exactly_where_pyspark_accepts_the_pyarrow(monkeypatch, caplog):
    import pyspark.sql.pandas.utils

    from pinstorm.training.spark import _chosen_launcher, torch_launcher

    expected = "barrier" if _pyspark_refuses_this_pyarrow() else "torch-distributor"
    assert torch_launcher("auto") == expected
    assert torch_launcher("barrier") == "barrier" and torch_launcher("torch-distributor") == "torch-distributor"

    def refuse():   # what PySpark 4 says beside petastorm's pyarrow 14
        raise ImportError("PyArrow >= 18.0.0 must be installed; however, your version was 14.0.2.")

    monkeypatch.setattr(pyspark.sql.pandas.utils, "require_minimum_pyarrow_version", refuse)
    with caplog.at_level("WARNING", logger="pinstorm"):
        assert _chosen_launcher("auto") == "barrier"
    assert "PyArrow >= 18.0.0 must be installed" in caplog.text and "own barrier stage" in caplog.text
    assert _chosen_launcher("torch-distributor") == "torch-distributor"   # asked for: no second guess


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


@needs_arrow_stages
def test_torch_distributor_runs_two_ddp_ranks(spark, digits_parquet, tmp_path):
    from pinstorm.training.spark import spark_train

    result = spark_train(_two_ranks(digits_parquet, tmp_path, "run"), 2, spark, framework="torch",
                         torch_launcher="torch-distributor")
    assert [w.rank for w in result] == [0, 1] and result.restarts == 0
    assert [w.result["input_shards"] for w in result] == [[[0, 2]], [[1, 2]]]
    assert _same_weights(result)


@pytest.mark.slow
@needs_arrow_stages
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
