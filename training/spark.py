"""``spark_train``: gang-schedule multi-worker training as one Spark barrier stage.

A barrier stage starts all of its tasks together or none, which is what MultiWorkerMirroredStrategy
needs: every worker must join the collective before anyone can step. Each task binds a free port,
shares ``host:port`` with the others through ``BarrierTaskContext.allGather`` (in local mode every
task reports the same executor address, so ports, not hosts, tell them apart), writes
``TF_CONFIG`` and trains; Parquet inputs are read as one shard per task. Results from every rank
come back to the driver, rank 0 first.

Spark retries a barrier stage that asks for more tasks than there are slots for about ten
minutes by default; this module checks the slots first and fails at once with a clear message.
Importing it does not import TensorFlow or pyspark.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from pinstorm.errors import PinstormError

log = logging.getLogger("pinstorm.training")

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


class SparkTrainError(PinstormError, RuntimeError):
    """The barrier stage cannot run (too few slots) or one of its tasks failed."""


@dataclass
class WorkerResult:
    """What one barrier task sent back."""

    rank: int
    num_workers: int
    address: str
    seconds: float
    result: Any


def local_spark_session(slots: int = 2, app_name: str = "pinstorm-train", extra_conf: dict | None = None):
    """A ``local[slots]`` SparkSession set up for barrier training on this machine.

    Executors run this interpreter (``PYSPARK_PYTHON``) with this checkout importable, a
    Python worker is never reused (TensorFlow's runtime is configured once per process), and
    a barrier stage that cannot get its slots fails in seconds instead of ten minutes.
    """
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    _add_to_pythonpath(PACKAGE_ROOT)
    builder = (SparkSession.builder.master(f"local[{slots}]").appName(app_name)
               .config("spark.python.worker.reuse", "false")
               .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
               .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
               .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
               .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _add_to_pythonpath(path: str) -> None:
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([path, *parts])


def available_slots(spark) -> int:
    """Tasks the cluster can run at once (``sc.defaultParallelism``: local[N] -> N, else total cores)."""
    return int(spark.sparkContext.defaultParallelism)


def _bind_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class _BarrierTask:
    """What each barrier task runs; a module-level class, so executors import it rather than unpickle code."""

    def __init__(self, train_fn_or_args, num_workers: int, extra_env: dict):
        self.train_fn_or_args, self.num_workers, self.extra_env = train_fn_or_args, num_workers, extra_env

    def __call__(self, _partition):
        from pyspark import BarrierTaskContext

        from pinstorm.training.multiworker import make_tf_config

        context = BarrierTaskContext.get()
        rank = context.partitionId()
        host = context.getTaskInfos()[rank].address.rsplit(":", 1)[0]
        address = f"{host}:{_bind_free_port()}"
        gathered = [json.loads(item) for item in context.allGather(json.dumps({"rank": rank, "address": address}))]
        workers = [entry["address"] for entry in sorted(gathered, key=lambda entry: entry["rank"])]
        os.environ.update(self.extra_env)
        os.environ["TF_CONFIG"] = make_tf_config(workers, rank)
        started = time.perf_counter()
        if callable(self.train_fn_or_args):
            result = self.train_fn_or_args(rank, self.num_workers)
        else:
            result = _train_from_args(dict(self.train_fn_or_args))
        yield WorkerResult(rank, self.num_workers, address, time.perf_counter() - started, result)


def _train_from_args(args: dict) -> dict:
    """``train(**args)`` under a MultiWorkerMirroredStrategy; returns the JSON-able summary."""
    from pinstorm.training.strategy import make_strategy
    from pinstorm.training.fit import train

    strategy_args = args.pop("strategy_args", {}) or {}
    strategy = make_strategy("multiworker", **strategy_args)
    model_name = args.pop("model_name", "alexnet")
    return train(model_name, strategy=strategy, **args).summary()


def spark_train(train_fn_or_args: Callable[[int, int], Any] | dict, num_workers: int, spark=None,
                *, env: dict | None = None) -> list[WorkerResult]:
    """Run ``num_workers`` training workers as one Spark barrier stage; return every rank's result.

    ``train_fn_or_args``: a function ``fn(rank, num_workers)`` run in each task with ``TF_CONFIG``
    set (it must build its own ``make_strategy("multiworker")``), or a dict of ``train()``
    arguments (``model_name``, ``data``, ``validation_data``, ``epochs``, ... and optional
    ``strategy_args`` for ``make_strategy``); Parquet data is read as one shard per task. Paths
    must be visible to every executor (shared storage on a real cluster). ``spark``: a session
    (its executors must be able to import pinstorm and run one Python worker per task: set
    ``spark.python.worker.reuse=false``); None starts ``local_spark_session(num_workers)``.
    ``env``: environment variables for the tasks.
    """
    if not isinstance(num_workers, int) or num_workers < 1:
        raise SparkTrainError(f"num_workers must be a positive integer, got {num_workers!r}")
    if not callable(train_fn_or_args) and not isinstance(train_fn_or_args, dict):
        raise SparkTrainError("train_fn_or_args must be a function fn(rank, num_workers) or a dict of train() args")
    own_session = spark is None
    if own_session:
        spark = local_spark_session(num_workers)
    try:
        slots = available_slots(spark)
        if num_workers > slots:
            raise SparkTrainError(
                f"a barrier stage needs all {num_workers} tasks running at once but this Spark cluster has "
                f"{slots} task slot(s) (spark.default.parallelism); use num_workers <= {slots} or add executors"
            )
        task_env = {"TF_USE_LEGACY_KERAS": "1", **(env or {})}
        rdd = spark.sparkContext.parallelize(range(num_workers), num_workers)
        try:
            results = rdd.barrier().mapPartitions(_BarrierTask(train_fn_or_args, num_workers, task_env)).collect()
        except Exception as exc:  # py4j wraps the executors' errors; keep the first useful lines
            raise SparkTrainError(f"the barrier training stage failed: {_spark_message(exc)}") from exc
        return sorted(results, key=lambda result: result.rank)
    finally:
        if own_session:
            spark.stop()


def _spark_message(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("Traceback (most recent call last)", "org.apache.spark.scheduler.BarrierJobSlotsNumberCheckFailed",
                   "BarrierJobSlotsNumberCheckFailed"):
        if marker in text:
            start = text.index(marker)
            if marker.startswith("Traceback"):
                lines = [line for line in text[start:].splitlines() if line.strip()]
                errors = [line for line in lines if not line.startswith((" ", "\t")) and ":" in line]
                return errors[-1].strip() if errors else lines[-1].strip()
            return "not enough task slots for the barrier stage (" + text[start:].splitlines()[0] + ")"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
