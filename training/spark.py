"""``spark_train``: gang-schedule multi-worker training as one Spark barrier stage, and relaunch it.

A barrier stage starts all of its tasks together or none, which is what MultiWorkerMirroredStrategy
needs: every worker must join the collective before anyone can step. Each task binds a free port
on its executor's address, shares ``host:port`` with the others through
``BarrierTaskContext.allGather`` (in local mode every task reports the same address, so ports tell
them apart), writes ``TF_CONFIG`` and trains.

Before the stage, the executors are probed with a tiny ordinary job, so an executor Python without
TensorFlow or pinstorm is named at once. When a task dies, Spark fails the whole barrier stage
(a barrier result stage is never retried by Spark itself); ``max_restarts`` relaunches it, and
``BackupAndRestore`` in ``checkpoint_dir`` makes the new attempt resume at the last finished epoch.

The seed's flow is built in: with ``partition_board``, task ``rank`` of ``n`` fetches
``imagenet_partition(rank, n)`` from that board, converts its slice to Parquet on its executor and
trains on it alone; the workers agree on the steps per epoch (the smallest slice decides).
``framework="torch"`` runs ``train_torch`` instead, on Spark's ``TorchDistributor`` (one torchrun
process per barrier task, ``local_mode=False``): it sets the torch.distributed environment, each
rank reads its own shard (with ``partition_board``, its own slice) and ``init_distributed`` probes
NCCL (gloo on CPU); ``max_restarts`` and ``checkpoint_dir`` work as above. TorchDistributor's
barrier stage is a ``mapInArrow``, which needs the pyarrow PySpark itself asks for (4.x: >= 18; 3.5:
>= 4); where pyarrow is older (PySpark 4 beside petastorm's pyarrow 14), the same ranks run in
pinstorm's own barrier stage instead: each task sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (rank 0's address and a port it found free) and trains in its task process.
Importing this module imports neither TensorFlow nor pyspark (nor torch).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import InvalidTrainingInput
from .spark_session import (REQUIRED_MODULES, SparkTrainError, available_slots, local_spark_session, probe_executors,
                            session_settings, spark_error_message, spark_session, wait_for_slots)
from pinstorm.boards.safety import secrets
from pinstorm import boards, pipeline
from .runs import FRAMEWORKS, FitOptions, default_output_dir

__all__ = ["Attempt", "SparkTrainError", "SparkTrainResult", "WorkerResult", "available_slots",
           "local_spark_session", "probe_executors", "session_settings", "spark_error_message", "spark_session",
           "spark_train", "wait_for_slots"]

log = secrets.logger("pinstorm.training")

# spark_train(dict) keys that drive the partition flow rather than train()
PARTITION_KEYS = ("partition_board", "partition_parallel", "partition_dir")
TORCH_MODULES = ("pinstorm.training.multiworker", "torch", "pyspark.ml.torch.distributor")


@dataclass
class WorkerResult:
    """What one barrier task sent back."""

    rank: int
    num_workers: int
    address: str
    seconds: float
    result: Any


@dataclass
class Attempt:
    """One launch of the barrier stage: how long it ran and, when it failed, why."""

    number: int
    seconds: float
    error: str | None = None


@dataclass
class SparkTrainResult(Sequence):
    """Every rank's ``WorkerResult`` (rank 0 first; indexable like a list) and the launch history.

    ``restarts``: relaunches after a failed attempt. ``failed_seconds``: wall time of the failed
    attempts. ``seconds_lost``: the part of it that was thrown away, i.e. ``failed_seconds`` minus
    the epochs those attempts finished and the backup kept (estimated from the final attempt's
    time per epoch; equal to ``failed_seconds`` when the result carries no epochs).
    ``resumed_from_epoch``: where the final attempt started (0 without a restart or a backup).
    """

    workers: list[WorkerResult]
    attempts: list[Attempt] = field(default_factory=list)
    executors: list[dict] = field(default_factory=list)

    def __getitem__(self, index):
        return self.workers[index]

    def __len__(self) -> int:
        return len(self.workers)

    @property
    def restarts(self) -> int:
        return max(len(self.attempts) - 1, 0)

    @property
    def failed_seconds(self) -> float:
        return sum(attempt.seconds for attempt in self.attempts if attempt.error)

    @property
    def resumed_from_epoch(self) -> int:
        summary = self.workers[0].result if self.workers else None
        return int(summary.get("initial_epoch", 0)) if isinstance(summary, dict) else 0

    @property
    def seconds_lost(self) -> float:
        summary = self.workers[0].result if self.workers else None
        if not (self.restarts and isinstance(summary, dict) and summary.get("epochs")):
            return self.failed_seconds
        per_epoch = float(summary.get("seconds", 0.0)) / len(summary["epochs"])
        return max(self.failed_seconds - self.resumed_from_epoch * per_epoch, 0.0)

    def summary(self) -> dict:
        """JSON-able: the ranks' results, the attempts and the restart figures."""
        return {"workers": [dict(rank=w.rank, num_workers=w.num_workers, address=w.address, seconds=w.seconds,
                                 result=w.result) for w in self.workers],
                "attempts": [dict(number=a.number, seconds=a.seconds, error=a.error) for a in self.attempts],
                "restarts": self.restarts, "failed_seconds": self.failed_seconds,
                "seconds_lost": self.seconds_lost, "resumed_from_epoch": self.resumed_from_epoch}


def _bind_free_port(host: str) -> int:
    """A port free on ``host`` a moment ago (bound on that address only, never on all of them)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]
    except OSError:      # a host name that is not an address of this machine as written: let the OS choose
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]


class _BarrierTask:
    """What each barrier task runs; a module-level class, so executors import it rather than unpickle code.

    ``progress``: ``(address, token)`` of the driver's ``ProgressListener``; rank 0 of a ``train()``
    run sends it one line per epoch.
    """

    def __init__(self, train_fn_or_args, num_workers: int, extra_env: dict,
                 progress: tuple[str, str] | None = None):
        self.train_fn_or_args, self.num_workers, self.extra_env = train_fn_or_args, num_workers, extra_env
        self.progress = progress

    def __call__(self, _partition):
        from pyspark import BarrierTaskContext

        from .multiworker import make_tf_config

        context = BarrierTaskContext.get()
        rank = context.partitionId()
        host = context.getTaskInfos()[rank].address.rsplit(":", 1)[0]
        address = f"{host}:{_bind_free_port(host)}"
        gathered = [json.loads(item) for item in context.allGather(json.dumps({"rank": rank, "address": address}))]
        workers = [entry["address"] for entry in sorted(gathered, key=lambda entry: entry["rank"])]
        os.environ.update(self.extra_env)
        os.environ["TF_CONFIG"] = make_tf_config(workers, rank)
        started = time.perf_counter()
        if callable(self.train_fn_or_args):
            result = self.train_fn_or_args(rank, self.num_workers)
        else:
            args = dict(self.train_fn_or_args)
            partition = None
            if args.get("partition_board") is not None:
                from .multiworker import read_tf_config, worker_output_dir

                own_dir = worker_output_dir(args.get("output_dir") or "runs/spark", read_tf_config())
                partition = _fetch_partition(args, rank, self.num_workers, context.allGather, own_dir)
            for key in PARTITION_KEYS:
                args.pop(key, None)
            callbacks = []
            if rank == 0 and self.progress:
                from .spark_progress import EpochReporter

                callbacks.append(EpochReporter(*self.progress))
            result = _train_from_args(args, per_worker_rows=min(partition["rows_per_worker"]) if partition else None,
                                      callbacks=callbacks)
            if partition is not None:
                result["partition"] = partition
        yield WorkerResult(rank, self.num_workers, address, time.perf_counter() - started, result)


def _fetch_partition(args: dict, rank: int, num_workers: int, all_gather: Callable[[str], list],
                     own_dir: str | os.PathLike) -> dict:
    """Fetch and convert this rank's categories; point ``args`` at them; share the slices' row counts.

    Runs in each rank (a barrier task, or a torch process). Every worker reads only its own slice
    (``input_options["shard"] = None``), and all must run the same number of steps, so the workers
    share their row counts through ``all_gather`` (text in, every rank's text out, in rank order:
    ``allGather`` of the barrier, or a gloo group's) and train on the smallest slice's
    (``rows_per_worker`` in the returned record). ``own_dir``: this rank's output folder; the slice is
    converted under ``partition_dir``, else ``cache_dir``, else ``<own_dir>/data``.
    """

    spec = dict(args["partition_board"])
    # the board's name is part of its cache path: a stable name lets a relaunched task (and the other
    # tasks on the same machine) reuse what was fetched, and the conversion of the same files
    name = "spark-partition-" + hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]
    board = boards.board_from_spec(spec, name=name)        # built here, in the task: nothing is registered
    started = time.perf_counter()
    data_map = pipeline.imagenet_partition(rank, num_workers, board=board, parallel=args.get("partition_parallel"))
    fetch_seconds = time.perf_counter() - started
    base = args.get("partition_dir") or args.get("cache_dir") or os.path.join(os.fspath(own_dir), "data")
    target = os.path.join(os.fspath(base), f"partition-{rank}-of-{num_workers}")
    options = dict(split="train", classes=data_map["classes"], progress=False, parallel=args.get("parallel"))
    try:
        converted = pipeline.convert(data_map, target, **options)        # a relaunch reuses a finished one
    except pipeline.DatasetExistsError:       # the board changed since: this folder is ours to redo
        log.warning("%s holds an older conversion of partition %d; converting again", target, rank)
        converted = pipeline.convert(data_map, target, overwrite=True, **options)
    counts = [int(item) for item in all_gather(str(converted.rows))]
    args.update(data=converted.url, input_options={**(args.get("input_options") or {}), "shard": None})
    return {"index": rank, "of": num_workers, "categories": list(data_map["categories"]),
            "rows": converted.rows, "rows_per_worker": counts, "url": converted.url,
            "fetch_seconds": fetch_seconds, "convert_seconds": converted.seconds}


def _train_from_args(args: dict, *, per_worker_rows: int | None = None, callbacks=()) -> dict:
    """``train(**args)`` under a MultiWorkerMirroredStrategy; returns the JSON-able summary.

    ``per_worker_rows``: when each worker reads its own slice, the smallest slice's rows; it sets
    the steps per epoch every worker runs (unless ``steps_per_epoch`` is given). ``callbacks`` are
    added to the fit's own.
    """
    from .fit import train
    from .multiworker import cluster_size, read_tf_config
    from .strategy import make_strategy

    strategy_args = args.pop("strategy_args", {}) or {}
    strategy = make_strategy("multiworker", **strategy_args)
    if per_worker_rows is not None and not args.get("steps_per_epoch"):
        # each worker reads its own slice: a step takes batch_size rows per local replica from it
        local_replicas = max(strategy.num_replicas_in_sync // cluster_size(read_tf_config()), 1)
        args["steps_per_epoch"] = _partition_steps(per_worker_rows, int(args.get("batch_size", 32)), local_replicas)
    model_name = args.pop("model_name", "alexnet")
    if callbacks:
        args["callbacks"] = [*(args.get("callbacks") or []), *callbacks]
    return train(model_name, strategy=strategy, **args).summary()


def _partition_steps(smallest: int, batch_size: int, replicas: int = 1) -> int:
    """Steps per epoch when each worker reads its own slice: the smallest slice's full batches, a batch
    being `batch_size` rows per local replica."""
    steps = smallest // (batch_size * replicas)
    if steps < 1:
        raise InvalidTrainingInput(f"the smallest worker partition has {smallest} rows, fewer than one batch of "
                                   f"{batch_size} x {replicas} replica(s); lower batch_size")
    return steps


def _partition_board_spec(board) -> dict:
    """What an executor needs to open the partition board itself: ``{"kind": ..., options}``.

    Resolved by ``boards.resolve_board``: an http(s) URL is a url board (its data.txt, else
    ``_pins.yaml``); a dict is used as is (``kind`` plus ``board_register``
    options such as ``url``, ``cache``, ``bucket``); a ``Board`` gives its own ``spec``, and a
    registered name the spec of the board it names. The spec goes to the executors in the task
    (secrets included, as the executors need them to sign in) and is never written to disk.
    """

    if isinstance(board, dict):     # used as is (built in each task, not here), its kind checked against the table
        kind = board.get("kind")
        if not kind:
            raise SparkTrainError(f"a partition_board dict needs a 'kind' (one of {boards.constructors.kinds_text()}) "
                                  "and the options board_register takes")
        if kind not in boards.KINDS and not boards.constructors.is_http_url(kind):
            raise SparkTrainError(f"partition_board kind {kind!r} is unknown; use one of "
                                  f"{boards.constructors.kinds_text()}")
        return dict(board)
    if not isinstance(board, (str, boards.Board)):
        raise SparkTrainError(f"partition_board must be an http(s) URL, a Board, a registered board name or a spec "
                              f"dict, not {type(board).__name__}")
    try:
        board = boards.resolve_board(board)   # the one resolver: an http(s) URL is a url board
    except boards.BoardNotRegistered as e:
        raise SparkTrainError(f"partition_board {board!r} is not a registered board, an http(s) URL or a "
                              f"board spec dict (registered: {', '.join(sorted(boards.board_names()))})") from e
    return {k: (os.fspath(v) if isinstance(v, os.PathLike) else v) for k, v in board.spec.items()}


def _check_args(train_fn_or_args, num_workers, framework: str = "tensorflow") -> Callable | dict:
    if not isinstance(num_workers, int) or num_workers < 1:
        raise SparkTrainError(f"num_workers must be a positive integer, got {num_workers!r}")
    if framework not in FRAMEWORKS:
        raise SparkTrainError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    if callable(train_fn_or_args):
        return train_fn_or_args
    if not isinstance(train_fn_or_args, dict):
        raise SparkTrainError("train_fn_or_args must be a function fn(rank, num_workers) or a dict of train() args")
    args = dict(train_fn_or_args)
    if args.get("partition_board") is not None:
        if args.get("data") is not None:
            raise SparkTrainError("give either data (one dataset sharded across workers) or partition_board "
                                  "(each worker fetches its own categories), not both")
        args["partition_board"] = _partition_board_spec(args["partition_board"])
    elif args.get("data") is None:
        raise SparkTrainError("spark_train needs data (a Parquet URL every executor can read) or partition_board")
    FitOptions.pick(args)   # the fit's own checks, on the driver before any executor starts (training/runs.py)
    if not args.get("output_dir"):
        # chosen once, here: every rank and every relaunch must write (and append metrics) to the same place
        args["output_dir"] = os.path.abspath(default_output_dir(args.get("model_name", "alexnet")))
    return args


def spark_train(train_fn_or_args: Callable[[int, int], Any] | dict, num_workers: int, spark=None, *,
                env: dict | None = None, max_restarts: int = 0, probe: bool = True,
                slots_timeout: float = 120.0, progress: Callable[[str], None] | bool = True,
                framework: str = "tensorflow", torch_launcher: str = "auto") -> SparkTrainResult:
    """Run ``num_workers`` training workers as one Spark barrier stage; return every rank's result.

    ``train_fn_or_args``: a function ``fn(rank, num_workers)`` run in each task with ``TF_CONFIG``
    set (it builds its own ``make_strategy("multiworker")``), or a dict of ``train()`` arguments
    (``model_name``, ``data``, ``validation_data``, ``epochs``, ... and optional ``strategy_args``
    for ``make_strategy``); ``data`` is read as one shard per task. Instead of ``data``,
    ``partition_board`` (a data.txt URL, a registered board name or ``{"kind": ..., options}``)
    makes each task fetch ``imagenet_partition(rank, num_workers)`` from that board and train on
    its own slice (``partition_parallel``: parallel fetches; ``partition_dir``: where each executor
    converts, default ``<output_dir>[/workers/rank<N>]/data``). Paths must be visible to every
    executor (shared storage on a real cluster).

    ``spark``: a session (``spark_session(master)`` sets one up right); None starts
    ``local_spark_session(num_workers)`` and stops it at the end. ``env``: environment variables
    for the tasks. ``max_restarts``: relaunch the stage up to this many times when it fails (a
    worker died, a node was lost); with ``checkpoint_dir`` in the args each relaunch resumes from
    the last finished epoch. ``probe``: check first that the executors import pinstorm and
    TensorFlow. ``slots_timeout``: seconds to wait for executors to register. ``progress``: where
    rank 0's per-epoch lines go while a ``train()`` dict runs (``True``: standard error, a function:
    called with each line, ``False``: nowhere); see ``training.spark_progress``.

    Returns a ``SparkTrainResult`` (indexable like the list of ``WorkerResult``, rank 0 first, plus
    ``restarts``, ``attempts``, ``seconds_lost``). Raises ``SparkTrainError`` listing every
    attempt's cause when all ``max_restarts + 1`` attempts failed.

    ``framework="torch"``: the stage is ``TorchDistributor(num_processes=num_workers,
    local_mode=False, use_gpu=False)``; a dict holds ``train_torch`` arguments (``model_name``,
    ``data``, ..., ``backend``), a function ``fn(rank, num_workers)`` runs in each torch process
    with the process group already made (``init_distributed``). Every rank's result comes home
    through rank 0. ``partition_board`` works as above: each rank fetches and converts its slice after
    the process group is made, and the ranks share their row counts through a gloo group of their
    own (its timeout: ``PARTITION_WAIT``, as long as the slowest fetch may take). ``torch_launcher``: ``"auto"``
    (TorchDistributor where the pyarrow its PySpark needs is installed, else pinstorm's barrier stage),
    ``"torch-distributor"`` or ``"barrier"``.

    Args:
        train_fn_or_args: A function ``fn(rank, num_workers)`` run in each task, or a dict of `train`
            (``framework="torch"``: `train_torch`) arguments, optionally with ``strategy_args``,
            ``partition_board``, ``partition_parallel`` and ``partition_dir`` as above.
        num_workers: Training workers (Spark tasks, or torch processes), gang-scheduled together.
        spark: A SparkSession, or None to start ``local_spark_session(num_workers)`` and stop it at the end.
        env: Environment variables for the tasks.
        max_restarts: Relaunch a failed stage up to this many times.
        probe: First check that the executors import pinstorm and the framework.
        slots_timeout: Seconds to wait for executors to register.
        progress: Where rank 0's per-epoch lines go: True (standard error), a function called with
            each line, or False (nowhere).
        framework: ``"tensorflow"`` (``TF_CONFIG`` and ``make_strategy("multiworker")``) or ``"torch"``.
        torch_launcher: With ``framework="torch"``: ``"auto"``, ``"torch-distributor"`` or ``"barrier"``.

    Returns:
        A ``SparkTrainResult``: the list of ``WorkerResult``, rank 0 first, plus ``restarts``,
        ``attempts`` and ``seconds_lost``.

    Raises:
        SparkTrainError: All ``max_restarts + 1`` attempts failed (the message lists every cause).
    """
    train_fn_or_args = _check_args(train_fn_or_args, num_workers, framework)
    launcher = _chosen_launcher(torch_launcher) if framework == "torch" else None
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise SparkTrainError(f"max_restarts must be a non-negative integer, got {max_restarts!r}")
    if max_restarts and isinstance(train_fn_or_args, dict) and not train_fn_or_args.get("checkpoint_dir"):
        log.warning("spark_train: max_restarts=%d without checkpoint_dir: a relaunch starts again from epoch 0",
                    max_restarts)
    own_session = spark is None
    if own_session:
        spark = local_spark_session(num_workers)
    stack = contextlib.ExitStack()
    try:
        wait_for_slots(spark, num_workers, slots_timeout)
        modules = TORCH_MODULES if framework == "torch" else REQUIRED_MODULES
        executors = probe_executors(spark, num_workers, modules) if probe else []
        listener = _progress_listener(spark, progress) if isinstance(train_fn_or_args, dict) else None
        if listener is not None:
            stack.enter_context(listener)
        task = _BarrierTask(train_fn_or_args, num_workers, {"TF_USE_LEGACY_KERAS": "1", **(env or {})},
                            progress=(listener.address, listener.token) if listener else None)
        attempts: list[Attempt] = []
        for number in range(1, max_restarts + 2):
            if number > 1:
                wait_for_slots(spark, num_workers, slots_timeout)
            started = time.monotonic()
            try:
                if framework == "torch":
                    results = _run_torch_stage(spark, train_fn_or_args, num_workers, number, dict(env or {}),
                                               task.progress, launcher)
                else:
                    results = _run_stage(spark, task, num_workers, number)
            except SparkTrainError:
                raise
            except Exception as exc:  # noqa: BLE001 - py4j wraps the executors' errors; keep the useful lines
                cause = spark_error_message(exc)
                attempts.append(Attempt(number, time.monotonic() - started, cause))
                if number <= max_restarts:
                    log.warning("spark_train: attempt %d of %d failed after %.1f s (%s); relaunching the barrier "
                                "stage", number, max_restarts + 1, attempts[-1].seconds, cause)
                continue
            attempts.append(Attempt(number, time.monotonic() - started))
            outcome = SparkTrainResult(sorted(results, key=lambda result: result.rank), attempts, executors)
            if outcome.restarts:
                log.warning("spark_train: finished after %d restart(s), resumed at epoch %d; %.1f s in failed "
                            "attempts, ~%.1f s of work lost", outcome.restarts, outcome.resumed_from_epoch,
                            outcome.failed_seconds, outcome.seconds_lost)
            return outcome
        if len(attempts) == 1:
            raise SparkTrainError(f"the barrier training stage failed: {attempts[0].error}")
        listing = "\n".join(f"  attempt {a.number} ({a.seconds:.1f} s): {a.error}" for a in attempts)
        raise SparkTrainError(f"the barrier training stage failed {len(attempts)} times "
                              f"(max_restarts={max_restarts}):\n{listing}")
    finally:
        stack.close()
        if own_session:
            spark.stop()


def _progress_listener(spark, progress):
    """The driver's end of rank 0's progress lines, on the address executors reach the driver at."""
    if progress is False or progress is None:
        return None
    from .spark_progress import ProgressListener

    echo = progress if callable(progress) else (lambda line: print(line, file=sys.stderr, flush=True))
    host = spark.sparkContext.getConf().get("spark.driver.host") or socket.gethostname()
    return ProgressListener(host, echo)


def _run_stage(spark, task: _BarrierTask, num_workers: int, number: int) -> list[WorkerResult]:
    sc = spark.sparkContext
    sc.setJobDescription(f"pinstorm: barrier training, {num_workers} workers, attempt {number}")
    try:
        rdd = sc.parallelize(range(num_workers), num_workers)
        return rdd.barrier().mapPartitions(task).collect()
    finally:
        sc.setJobDescription(None)


# --------------------------------------------------------------------------- framework="torch"

TORCH_LAUNCHERS = ("auto", "torch-distributor", "barrier")


def torch_launcher(requested: str = "auto") -> str:
    """``"torch-distributor"`` when Spark's TorchDistributor can run here (its ``mapInArrow`` needs the
    pyarrow PySpark asks for: PySpark's own check decides), else ``"barrier"``; an explicit choice is
    returned as it is."""
    if requested not in TORCH_LAUNCHERS:
        raise SparkTrainError(f"torch_launcher must be one of {TORCH_LAUNCHERS}, got {requested!r}")
    if requested != "auto":
        return requested
    return "torch-distributor" if arrow_problem() is None else "barrier"


def arrow_problem() -> str | None:
    """Why PySpark's Arrow stages (``mapInArrow``) cannot run here, in PySpark's words, or None."""
    from pyspark.sql.pandas.utils import require_minimum_pyarrow_version

    try:
        require_minimum_pyarrow_version()
    except Exception as error:   # PySpark 4: PySparkImportError; 3.5: ImportError
        return str(error).strip() or type(error).__name__
    return None


def _run_torch_stage(spark, train_fn_or_args, num_workers: int, number: int, env: dict,
                     progress: tuple[str, str] | None, launcher: str) -> list[WorkerResult]:
    """One launch of ``num_workers`` torch ranks, each running ``_torch_rank``; rank 0 returns them all."""
    sc = spark.sparkContext
    sc.setJobDescription(f"pinstorm: torch training ({launcher}), {num_workers} processes, attempt {number}")
    try:
        if launcher == "torch-distributor":
            from pyspark.ml.torch.distributor import TorchDistributor

            distributor = TorchDistributor(num_processes=num_workers, local_mode=False, use_gpu=False)
            gathered = distributor.run(_torch_rank, train_fn_or_args, num_workers, env, progress)
        else:
            task = _TorchBarrierTask(train_fn_or_args, num_workers, env, progress)
            gathered = next(out for out in sc.parallelize(range(num_workers), num_workers).barrier()
                            .mapPartitions(task).collect() if out)
    finally:
        sc.setJobDescription(None)
    return [WorkerResult(**entry) for entry in json.loads(gathered)]


def _chosen_launcher(requested: str) -> str:
    launcher = torch_launcher(requested)
    if requested == "auto" and launcher == "barrier":
        log.warning("spark_train: Spark's TorchDistributor cannot run here (%s); the torch ranks run in pinstorm's "
                    "own barrier stage instead", arrow_problem())
    return launcher


class _TorchBarrierTask:
    """A barrier task as one torch rank: the environment torchrun would set, then ``_torch_rank``."""

    def __init__(self, train_fn_or_args, num_workers: int, env: dict, progress):
        self.train_fn_or_args, self.num_workers, self.env, self.progress = train_fn_or_args, num_workers, env, progress

    def __call__(self, _partition):
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        rank = context.partitionId()
        hosts = [info.address.rsplit(":", 1)[0] for info in context.getTaskInfos()]
        port = str(_bind_free_port(hosts[0])) if rank == 0 else ""
        port = context.allGather(port)[0]
        local = [r for r, host in enumerate(hosts) if host == hosts[rank]]
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(self.num_workers), "MASTER_ADDR": hosts[0],
                           "MASTER_PORT": port, "LOCAL_RANK": str(local.index(rank)),
                           "LOCAL_WORLD_SIZE": str(len(local))})
        yield _torch_rank(self.train_fn_or_args, self.num_workers, self.env, self.progress)


# how long a torch rank waits for the others to fetch and convert their slices (a day: ImageNet-sized
# slices over a slow link); the barrier stage's own allGather waits as long as Spark lets it
PARTITION_WAIT = 24 * 3600.0


def _torch_partition(args: dict, rank: int, num_workers: int) -> dict:
    """`_fetch_partition` in a torch rank: the row counts go through a gloo group made for them, whose
    timeout outlasts the fetches (the default group's would end a rank waiting for a slower one), and
    the steps per epoch become the smallest slice's full batches (unless ``steps_per_epoch`` is set)."""
    from datetime import timedelta
    from pathlib import Path

    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=PARTITION_WAIT))

    def all_gather(text: str) -> list:
        everyone: list = [None] * num_workers
        dist.all_gather_object(everyone, text, group=group)
        return everyone

    output = Path(args["output_dir"])
    own_dir = output if rank == 0 else output / "workers" / f"rank{rank}"      # where train_torch writes
    partition = _fetch_partition(args, rank, num_workers, all_gather, own_dir)
    dist.destroy_process_group(group)
    if not args.get("steps_per_epoch"):
        args["steps_per_epoch"] = _partition_steps(min(partition["rows_per_worker"]), int(args.get("batch_size", 32)))
    return partition


def _torch_rank(train_fn_or_args, num_workers: int, env: dict, progress: tuple[str, str] | None) -> str:
    """What each torch process runs (a module-level function: executors import it, nothing is shipped by
    value). Makes the group, trains, and gathers every rank's ``WorkerResult`` fields as JSON on rank 0."""
    import torch.distributed as dist

    from .torch_fit import init_distributed, train_torch

    os.environ.update(env)
    rank = int(os.environ["RANK"])
    started = time.perf_counter()
    args = None if callable(train_fn_or_args) else dict(train_fn_or_args)
    options = {key: args.pop(key) for key in ("backend", "probe_timeout", "fallback") if args and key in args}
    init_distributed(options.get("backend", "auto"), probe_timeout=options.get("probe_timeout", 60.0),
                     fallback=options.get("fallback", True))
    try:
        if args is None:
            result = train_fn_or_args(rank, num_workers)
        else:
            partition = _torch_partition(args, rank, num_workers) if args.get("partition_board") else None
            for key in PARTITION_KEYS:
                args.pop(key, None)
            if rank == 0 and progress:
                args["callbacks"] = [*(args.get("callbacks") or []), _torch_epoch_reporter(*progress, args)]
            model_name = args.pop("model_name", "alexnet")
            result = train_torch(model_name, **options, **args).summary()
            if partition is not None:
                result["partition"] = partition
        mine = {"rank": rank, "num_workers": num_workers, "address": f"{socket.gethostname()} pid {os.getpid()}",
                "seconds": time.perf_counter() - started, "result": result}
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, json.dumps(mine, default=str))   # JSON text between our own ranks
    finally:
        dist.destroy_process_group()
    _end_without_teardown()
    return json.dumps([json.loads(entry) for entry in everyone]) if rank == 0 else ""


def _end_without_teardown() -> None:
    """In a rank that torchrun started (TorchDistributor starts each rank with torchrun), once its work is
    done: the process ends at exit with ``os._exit``, skipping the interpreter's and C++'s teardown.
    torch's teardown in that process was seen to abort ("terminate called without an active exception",
    SIGABRT) now and then (1 of 34 runs of the docs example in a loop here, and in CI), after
    the run had finished, every group destroyed and no Python thread but the main one left.
    torchrun then reports the rank as failed, and the other ranks' torchrun waits out its 300 s exit
    barrier before the stage fails. What TorchDistributor's wrapper does after this returns (it writes
    the result file) still runs. Streams and logging are flushed first, and an exception that no code
    handled still ends the process with 1. Not in any other process (a Spark worker running the barrier
    launcher, a notebook): those end as their owner decides."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return

    def leave() -> None:
        failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)   # an unhandled error
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1 if failed else 0)

    atexit.register(leave)


def _torch_epoch_reporter(address: str, token: str, args: dict):
    """A train_torch callback for rank 0: one line per epoch to the driver's ProgressListener."""
    from .spark_progress import epoch_line, send_line

    last = [time.perf_counter()]

    def report(epoch, logs):
        now = time.perf_counter()
        send_line(address, token, epoch_line(epoch, args.get("epochs"), logs, now - last[0]))
        last[0] = now

    return report
