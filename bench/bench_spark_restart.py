"""Benchmark: what a worker that dies mid-fit costs ``spark_train(..., max_restarts=1)``.

A real Spark standalone cluster (master + 2 one-core workers on 127.0.0.1, the test suite's
helper) runs the seed's flow: each barrier task fetches its half of the digits categories from a
board served over HTTP, converts it and trains AlexNet (1/8 width, 32 px) under
MultiWorkerMirroredStrategy with BackupAndRestore. The baseline is the same run without a failure,
in the same session. Then one task's Python process is killed (SIGKILL) once the chief has finished
``--kill-after`` epochs; the stage is relaunched and resumes from the backup.

Measured: wall time of each run, the extra time the failure cost (killed run - baseline), and
``SparkTrainResult.seconds_lost`` (spark_train's own estimate of the work thrown away) next to it.
Writes bench/results/spark_restart.json and .png. Needs Java.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))          # the standalone-cluster helper of the test suite
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PINSTORM_PROGRESS", "0")

RESULTS = Path(__file__).parent / "results"


def _board(workdir: Path, per_class: int):
    from pinstorm import boards, pipeline

    layout = pipeline.scan(pipeline.make_digits_tree(workdir / "tree", image_size=32, per_class=per_class, seed=0))
    boards.board_register("local", name="bench-src", path=workdir / "served")
    pipeline.repartition(layout, "bench-src", progress=False)
    val = pipeline.convert(layout, str(workdir / "val"), split="val", classes=layout.classes, progress=False)
    return layout, val.url


def _completed_epochs(metrics_csv: Path) -> int:
    try:
        with open(metrics_csv) as handle:
            return sum(1 for _ in csv.DictReader(handle))
    except OSError:
        return 0


def _killer(cluster, metrics_csv: Path, after: int, stop: threading.Event, killed: list) -> None:
    while not stop.is_set() and _completed_epochs(metrics_csv) < after:
        time.sleep(0.05)
    pids = cluster.python_task_pids()
    if not stop.is_set() and pids:
        os.kill(pids[-1], signal.SIGKILL)
        killed.append(time.monotonic())


def _run(spark, args, *, cluster=None, kill_after=None) -> dict:
    from pinstorm.training.spark import spark_train

    stop, killed = threading.Event(), []
    if cluster is not None:
        thread = threading.Thread(target=_killer, args=(cluster, Path(args["output_dir"]) / "metrics.csv", kill_after,
                                                        stop, killed), daemon=True)
        thread.start()
    started = time.monotonic()
    try:
        result = spark_train(args, 2, spark, max_restarts=1)
    finally:
        stop.set()
    seconds = time.monotonic() - started
    chief = result[0].result
    return {"seconds": seconds, "restarts": result.restarts, "killed": bool(killed),
            "attempts": [{"seconds": a.seconds, "error": a.error} for a in result.attempts],
            "failed_seconds": result.failed_seconds, "seconds_lost_estimate": result.seconds_lost,
            "resumed_from_epoch": result.resumed_from_epoch, "fit_seconds": chief["seconds"],
            "epochs_run": len(chief["epochs"]), "val_accuracy": chief["val_metrics"].get("accuracy")}


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clean, killed = report["baseline"], report["killed"]
    figure, axis = plt.subplots(figsize=(7, 2.8))
    axis.barh(["no failure (baseline)"], [clean["seconds"]], color="#4c72b0", label="successful attempt")
    failed = killed["failed_seconds"]
    axis.barh(["worker killed"], [failed], color="#c44e52", label="failed attempt")
    axis.barh(["worker killed"], [killed["seconds"] - failed], left=[failed], color="#4c72b0")
    axis.axvline(clean["seconds"], color="#333", linewidth=0.8, linestyle="--")
    axis.set_xlabel("seconds (wall, spark_train call)")
    axis.set_title(f"spark_train, 2 workers, {report['epochs']} epochs: kill after epoch {report['kill_after']}; "
                   f"extra {report['extra_seconds']:.0f} s, estimate {killed['seconds_lost_estimate']:.0f} s",
                   fontsize=9)
    axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--kill-after", type=int, default=2, help="kill once the chief finished this many epochs")
    parser.add_argument("--per-class", type=int, default=20)
    options = parser.parse_args()

    from servers.spark_standalone import StandaloneCluster

    from pinstorm.training.spark import spark_session

    with tempfile.TemporaryDirectory(prefix="pinstorm-bench-spark-") as tmp:
        workdir = Path(tmp)
        os.environ.update(PINSTORM_CACHE=str(workdir / "cache"), PINSTORM_CONFIG=str(workdir / "boards.yaml"))
        layout, val_url = _board(workdir, options.per_class)
        from pinstorm import boards

        with boards.serve_board(workdir / "served") as url, StandaloneCluster(workers=2, cores=1) as cluster:
            spark = spark_session(cluster.master_url, app_name="pinstorm-bench-spark-restart")
            try:
                common = dict(model_name="alexnet", partition_board={"kind": "datatxt", "url": url},
                              validation_data=val_url, epochs=options.epochs, batch_size=8, image_size=32,
                              model_kwargs={"width": 0.125}, input_options={"flip": False}, seed=0, verbose=0)
                baseline = _run(spark, dict(common, output_dir=str(workdir / "clean"),
                                            checkpoint_dir=str(workdir / "clean-backup")))
                killed = _run(spark, dict(common, output_dir=str(workdir / "killed"),
                                          checkpoint_dir=str(workdir / "killed-backup")),
                              cluster=cluster, kill_after=options.kill_after)
            finally:
                spark.stop()
    report = {
        "what": "spark_train partition flow on a standalone cluster, 2 one-core workers, one task killed mid-fit",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average": os.getloadavg()},
        "epochs": options.epochs, "kill_after": options.kill_after, "train_rows": len(layout.items("train")),
        "baseline": baseline, "killed": killed,
        "extra_seconds": killed["seconds"] - baseline["seconds"],
        "ratio_to_baseline": killed["seconds"] / baseline["seconds"],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spark_restart.json").write_text(json.dumps(report, indent=2))
    _plot(report, RESULTS / "spark_restart.png")
    print(json.dumps({k: report[k] for k in ("extra_seconds", "ratio_to_baseline")}, indent=2))
    print(f"baseline {baseline['seconds']:.1f} s; killed run {killed['seconds']:.1f} s "
          f"(failed attempt {killed['failed_seconds']:.1f} s, resumed at epoch {killed['resumed_from_epoch']}, "
          f"estimate lost {killed['seconds_lost_estimate']:.1f} s)")


if __name__ == "__main__":
    main()
