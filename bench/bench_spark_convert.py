"""Benchmark: converting an image tree on Spark with 1 and 2 executors, and `make_spark_converter`'s
first and cached calls.

A real Spark standalone cluster (master + 2 one-core workers on 127.0.0.1, the test suite's helper)
converts the same ILSVRC-shaped tree of ImageNet-size JPEGs (~500x375, ~110 KB,
`make_imagenet_size_tree`) with ``convert(..., spark=session, parallel=1)``: one session limited to
one executor core (``spark.cores.max=1``), then one with both. Each executor reads, checks and writes
its own parts (one thread each, so one core is one executor's work). The one-machine ``convert``
with 1 and 2 threads runs beside, for reference. The ratio (2-executor img/s over 1-executor img/s)
says how close to linear the design scales; on a 2-core machine the driver, the JVMs and the two
executors share those cores, so 2.0 is out of reach here.

Then `make_spark_converter` on a ``binaryFile`` DataFrame of the same tree (label from the class
folder in the path): the first call (materialise) and a second call with the same DataFrame (reuse).
Writes bench/results/spark_convert.json and .png. Needs Java. ``--quick``: a small tree.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))          # the standalone-cluster helper of the test suite
os.environ.setdefault("PINSTORM_PROGRESS", "0")

RESULTS = Path(__file__).parent / "results"


def _session(master: str, cores: int):
    from pinstorm.training.spark_session import spark_session, wait_for_slots

    spark = spark_session(master, app_name=f"pinstorm-bench-convert-{cores}",
                          conf={"spark.cores.max": str(cores), "spark.python.worker.reuse": "true"})
    wait_for_slots(spark, cores)
    # executors up and their Python workers warm (pinstorm imported), so the runs time the conversion itself
    spark.sparkContext.parallelize(range(cores), cores).map(
        lambda x: __import__("pinstorm.pipeline.convert") and x).collect()
    started = time.monotonic()
    spark.sparkContext.parallelize(range(cores), cores).map(lambda x: x).collect()
    return spark, time.monotonic() - started      # and one tiny job's time: Spark's fixed cost per job


def _convert(layout, output: Path, partitions: int, **options) -> dict:
    from pinstorm.pipeline import convert

    started = time.monotonic()
    result = convert(layout, output, partitions=partitions, parallel=1 if "spark" in options else options.pop(
        "threads"), min_row_groups=partitions * 2, progress=False, **options)
    seconds = time.monotonic() - started
    return {"seconds": seconds, "rows": result.rows, "images_per_second": result.rows / seconds,
            "bytes": result.bytes}


def _converter_calls(spark, train_dir: Path, cache: Path) -> dict:
    from pyspark.sql import functions as F

    from pinstorm.pipeline import make_spark_converter

    df = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(str(train_dir))
          .select(F.col("content").alias("image"),
                  F.regexp_extract("path", r"/(n[0-9]+)/[^/]+$", 1).alias("label")).repartition(2))
    calls = []
    for _ in range(2):
        started = time.monotonic()
        converter = make_spark_converter(df, cache_url=cache)
        calls.append({"seconds": time.monotonic() - started, "rows": len(converter), "url": converter.cache_dir_url})
    converter.delete()
    first, cached = calls
    return {"first_seconds": first["seconds"], "cached_seconds": cached["seconds"], "rows": first["rows"],
            "reused": first["url"] == cached["url"], "first_images_per_second": first["rows"] / first["seconds"]}


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["convert, 1 thread", "convert, 2 threads", "Spark, 1 executor", "Spark, 2 executors"]
    values = [report["one_machine"]["1"]["images_per_second"], report["one_machine"]["2"]["images_per_second"],
              report["spark"]["1"]["images_per_second"], report["spark"]["2"]["images_per_second"]]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3), gridspec_kw={"width_ratios": [3, 2]})
    left.barh(labels, values, color=["#8c8c8c", "#8c8c8c", "#4c72b0", "#4c72b0"])
    left.set_xlabel("images / s (read, checked, written)")
    left.set_title(f"{report['rows']} ImageNet-size JPEGs, {report['partitions']} parts: 2/1 executors = "
                   f"{report['executor_ratio']:.2f}x", fontsize=9)
    conv = report["converter"]
    right.bar(["first call", "cached call"], [conv["first_seconds"], conv["cached_seconds"]], color="#55a868")
    right.set_ylabel("seconds")
    right.set_title(f"make_spark_converter, {conv['rows']} rows", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="a small tree: 4 classes x 60 images, 4 parts")
    options = parser.parse_args()
    if options.quick:
        options.classes, options.per_class, options.partitions = 4, 60, 4

    from servers.spark_standalone import StandaloneCluster

    from pinstorm.pipeline import make_imagenet_size_tree, scan

    with tempfile.TemporaryDirectory(prefix="pinstorm-bench-spark-convert-") as tmp:
        workdir = Path(tmp)
        root = make_imagenet_size_tree(workdir / "tree", classes=options.classes, per_class=options.per_class)
        layout = scan(root)
        rows = len(layout.items("train"))
        one_machine = {str(threads): _convert(layout, workdir / f"local-{threads}", options.partitions, threads=threads)
                       for threads in (1, 2)}
        spark_runs = {}
        with StandaloneCluster(workers=2, cores=1) as cluster:
            for cores in (1, 2):
                spark, overhead = _session(cluster.master_url, cores)
                try:
                    spark_runs[str(cores)] = _convert(layout, workdir / f"spark-{cores}", options.partitions,
                                                      spark=spark)
                    spark_runs[str(cores)]["empty_job_seconds"] = overhead
                    if cores == 2:
                        converter = _converter_calls(spark, Path(layout.train[0][0]).parents[1], workdir / "cache")
                finally:
                    spark.stop()
    report = {
        "what": "convert(spark=...) on a standalone cluster of 2 one-core workers, 1 vs 2 executors; "
                "make_spark_converter first and cached calls",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()},
        "rows": rows, "partitions": options.partitions, "quick": options.quick,
        "one_machine": one_machine, "spark": spark_runs,
        "executor_ratio": spark_runs["2"]["images_per_second"] / spark_runs["1"]["images_per_second"],
        "converter": converter,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spark_convert.json").write_text(json.dumps(report, indent=2))
    _plot(report, RESULTS / "spark_convert.png")
    print(json.dumps({"rows": rows, "one_machine_img_s": {k: round(v["images_per_second"]) for k, v in
                                                          one_machine.items()},
                      "spark_img_s": {k: round(v["images_per_second"]) for k, v in spark_runs.items()},
                      "executor_ratio": round(report["executor_ratio"], 2),
                      "converter_first_s": round(converter["first_seconds"], 2),
                      "converter_cached_s": round(converter["cached_seconds"], 3)}, indent=1))


if __name__ == "__main__":
    main()
