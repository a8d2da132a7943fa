"""spark_train(framework="torch"): DDP ranks as Spark tasks (TorchDistributor or a barrier stage),
relaunched after a killed task and resumed from the checkpoint, mid-epoch too. Apart from
test_training_torch.py so the test processes share the two heaviest torch modules between them."""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")

from training_support import NO_FLIP  # noqa: E402

TINY = dict(width=0.125, normalization=None, dropout=0.0)   # small and quick (test_training_torch.py's)


# --------------------------------------------------------------------------- spark_train(framework="torch")

@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    from pinstorm.training.spark import local_spark_session

    session = local_spark_session(2)
    yield session
    session.stop()


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["auto", "barrier"])   # auto: TorchDistributor where PySpark allows it
def test_spark_train_torch_runs_two_ddp_ranks(spark, digits_parquet, tmp_path, launcher):
    from pinstorm.training.spark import spark_train

    lines = []
    result = spark_train(dict(model_name="alexnet", data=digits_parquet["train"], validation_data=digits_parquet["val"],
                              epochs=2, batch_size=8, image_size=32, model_kwargs=TINY, seed=0,
                              output_dir=str(tmp_path / "run"), input_options={"flip": False}, backend="nccl"),
                         2, spark, framework="torch", progress=lines.append, torch_launcher=launcher)
    assert [w.rank for w in result] == [0, 1] and result.restarts == 0
    summaries = [w.result for w in result]
    assert [s["input_shards"] for s in summaries] == [[[0, 2]], [[1, 2]]]
    assert all(s["strategy"]["backend"] == "gloo" and s["strategy"]["fallback_from"] == "nccl" for s in summaries)
    assert result[0].address != result[1].address                         # two processes
    assert [line.split(":")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"]   # rank 0's progress, on the driver
    first, second = (torch.load(s["weights_path"], weights_only=True) for s in summaries)
    assert all(torch.equal(first[k], second[k]) for k in first)


def _dies_mid_epoch_once(data: str, output: str, checkpoint: str | None, marker: str, die_at_step: int):
    """A torch train function (2 ranks, backups every 3 steps) whose rank 1 process dies in the middle of a
    training step, once: ``die_at_step`` counts the model's training forwards on that rank."""

    def train(rank, num_workers):
        import os

        import torch

        from pinstorm.training.torch_fit import train_torch

        steps = [0]

        def die_once(module, inputs, output):
            if type(module).__name__ == "AlexNet" and module.training:
                steps[0] += 1
                if rank == 1 and steps[0] == die_at_step and not os.path.exists(marker):
                    open(marker, "w").close()
                    os._exit(1)                   # the process is gone, as when a node is lost

        hook = torch.nn.modules.module.register_module_forward_hook(die_once)
        try:
            return train_torch("alexnet", data, epochs=2, batch_size=8, image_size=32, seed=0, output_dir=output,
                               checkpoint_dir=checkpoint, backup_every=3 if checkpoint else None,
                               input_options={"crop_area": (0.6, 1.0)},
                               model_kwargs={"width": 0.125, "normalization": None, "dropout": 0.5}).summary()
        finally:
            hook.remove()

    return train


@pytest.mark.slow
@pytest.mark.once
def test_spark_train_torch_relaunched_mid_epoch_ends_as_if_never_killed(spark, digits_parquet, tmp_path):
    """A rank lost mid-epoch: Spark relaunches the stage, which resumes at the last backup (every rank's input
    position, the random state), appends to the run's metrics, and both ranks end with the weights of a run
    that lost nothing."""
    from pinstorm.training.spark import spark_train

    (tmp_path / "never").touch()
    whole = spark_train(_dies_mid_epoch_once(digits_parquet["train"], str(tmp_path / "whole"), None,
                                             str(tmp_path / "never"), 0), 2, spark, framework="torch")
    steps = whole[0].result["steps_per_epoch"]
    result = spark_train(_dies_mid_epoch_once(digits_parquet["train"], str(tmp_path / "run"), str(tmp_path / "ckpt"),
                                              str(tmp_path / "died"), steps + 5), 2, spark, framework="torch",
                         max_restarts=1)
    assert (tmp_path / "died").exists() and result.restarts == 1 and result[0].result["initial_epoch"] == 1
    assert result.attempts[0].error and result.resumed_from_epoch == 1 and result[0].result["epochs"] == [1]
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["0", "1"]   # the first attempt's epoch, then the relaunch's
    expected = torch.load(whole[0].result["weights_path"], weights_only=True)
    for worker in result:
        weights = torch.load(worker.result["weights_path"], weights_only=True)
        assert all(torch.equal(weights[k], v) for k, v in expected.items())


def _records_batches_and_dies_once(log_dir: str, marker: str, die_at: tuple[int, int, int]):
    """An ``on_batch`` that appends each step's sample IDs to its rank's log, and whose rank ``die_at[0]``
    process dies after step ``die_at[2]`` of epoch ``die_at[1]``, once (before that step's backup)."""

    def on_batch(epoch, step, ids):
        import json
        import os

        rank = int(os.environ["RANK"])
        with open(os.path.join(log_dir, f"rank{rank}.jsonl"), "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "epoch": epoch, "step": step, "ids": ids.tolist()}) + "\n")
        if (rank, epoch, step) == die_at and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)                         # the process is gone, as when a node is lost

    return on_batch


@pytest.mark.slow
def test_spark_train_torch_partitions_from_the_board_and_resumes_mid_epoch(spark, http_board, tmp_path):
    """The seed's flow with torch: each rank fetches its own categories from a data.txt board over HTTP,
    converts them and trains on them alone; rank 1 dies mid-epoch and the relaunch goes on from the
    last backup, each rank from its own position in its own slice."""
    from pinstorm.pipeline import make_digits_tree, repartition, scan
    from pinstorm.training.spark import spark_train

    board, _, url = http_board
    layout = scan(make_digits_tree(tmp_path / "tree", image_size=32, per_class=12, seed=1))
    repartition(layout, board.name, zip=True, progress=False)
    logs = tmp_path / "batches"
    logs.mkdir()
    result = spark_train(dict(model_name="alexnet", partition_board=url, epochs=2, batch_size=4, image_size=32,
                              model_kwargs=TINY, seed=0, output_dir=str(tmp_path / "run"),
                              checkpoint_dir=str(tmp_path / "ckpt"), backup_every=3, input_options=NO_FLIP,
                              on_batch=_records_batches_and_dies_once(str(logs), str(tmp_path / "died"), (1, 0, 4))),
                         2, spark, framework="torch", max_restarts=1)
    assert (tmp_path / "died").exists() and result.restarts == 1
    summaries = [worker.result for worker in result]
    partitions = [s["partition"] for s in summaries]
    mine, theirs = (set(p["categories"]) for p in partitions)
    assert mine and theirs and not mine & theirs and mine | theirs == set(layout.classes)
    assert sum(p["rows"] for p in partitions) == len(layout.items("train"))
    assert partitions[0]["rows_per_worker"] == partitions[1]["rows_per_worker"] == [p["rows"] for p in partitions]
    steps = min(p["rows"] for p in partitions) // 4
    assert all(s["steps_per_epoch"] == steps and s["input_shards"] == [None] for s in summaries)
    assert steps > 5
    first, second = (torch.load(s["weights_path"], weights_only=True) for s in summaries)
    assert all(torch.equal(first[k], second[k]) for k in first)          # one model, all-reduced

    for rank, partition in enumerate(partitions):
        records = [json.loads(line) for line in (logs / f"rank{rank}.jsonl").read_text().splitlines()]
        pids = list(dict.fromkeys(r["pid"] for r in records))
        assert len(pids) == 2                                              # the first attempt, the relaunch
        before = {r["step"]: r["ids"] for r in records if r["pid"] == pids[0] and r["epoch"] == 0}
        after = {r["step"]: r["ids"] for r in records if r["pid"] == pids[1] and r["epoch"] == 0}
        assert min(after) == 3 and max(after) == steps - 1                 # from the backup after step 2 on
        assert all(after[step] == before[step] for step in after if step in before)   # the replay is the same
        epoch = [i for step in range(steps) for i in (before[step] if step < 3 else after[step])]
        assert len(set(epoch)) == len(epoch) == steps * 4                   # no sample twice
        assert all(0 <= i < partition["rows"] for i in epoch)              # all from this rank's own slice


def test_spark_train_torch_refuses_what_it_cannot_do(digits_parquet):
    from pinstorm.training.spark import SparkTrainError, _check_args, torch_launcher

    with pytest.raises(SparkTrainError, match="framework must be one of"):
        _check_args({"data": digits_parquet["train"]}, 2, "jax")
    with pytest.raises(SparkTrainError, match="torch_launcher must be one of"):
        torch_launcher("mpi")
