"""spark_train(framework="torch") on Spark's own TorchDistributor, where it can run.

PySpark 4's TorchDistributor runs its barrier stage as a ``mapInArrow``, which needs pyarrow >= 18; the
full environment pins pyarrow 14 for petastorm and the modern one has no torch, so CI's environments skip
this file and test pinstorm's own barrier launcher (tests/test_training_torch.py). It runs wherever torch,
pyspark and pyarrow >= 18 meet (``bench/peers-env`` plus ``pip install pyspark``, for one)."""

from __future__ import annotations

import pytest

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")
pytest.importorskip("pyspark")
pyarrow = pytest.importorskip("pyarrow")
pytestmark = pytest.mark.skipif(int(pyarrow.__version__.split(".")[0]) < 18,
                                reason=f"TorchDistributor's mapInArrow needs pyarrow >= 18 (here {pyarrow.__version__})")


@pytest.fixture(scope="module")
def spark():
    from pinstorm.training.spark import local_spark_session

    session = local_spark_session(2)
    yield session
    session.stop()


def test_torch_distributor_runs_two_ddp_ranks_and_auto_picks_it(spark, digits_parquet, tmp_path):
    from pinstorm.training.spark import spark_train, torch_launcher

    assert torch_launcher("auto") == "torch-distributor"
    result = spark_train(dict(model_name="alexnet", data=digits_parquet["train"], epochs=1, batch_size=8,
                              image_size=32, model_kwargs={"width": 0.125}, seed=0, output_dir=str(tmp_path / "run"),
                              input_options={"flip": False}),
                         2, spark, framework="torch", torch_launcher="torch-distributor")
    assert [w.rank for w in result] == [0, 1] and result.restarts == 0
    assert [w.result["input_shards"] for w in result] == [[[0, 2]], [[1, 2]]]
    first, second = (torch.load(w.result["weights_path"], weights_only=True) for w in result)
    assert all(torch.equal(first[k], second[k]) for k in first)
