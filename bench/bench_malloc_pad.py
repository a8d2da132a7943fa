"""Benchmark: `make_dataset` with and without glibc's heap pad (`pipeline.malloc_pad`), against plain tf.data.

    python bench/bench_malloc_pad.py [--classes 1000] [--per-class 40] [--rounds 5]
    python bench/bench_malloc_pad.py --tabular [--rows 500000] [--rounds 4]

TensorFlow's ``from_generator`` kernel fixes glibc's mmap threshold at 128 KiB for the whole process, so that
every buffer of an image's size a heap cannot serve from its top is mapped and faulted in afresh. Each run
here is one epoch in a fresh process (the first iteration of a process, as a training job's is), over the
same small JPEGs as `bench/bench_small_images.py` (120x160, to 112 px, training crops and flips): CPU of
the process an image, minor page faults an image, peak RSS; `make_dataset` padded (the default) and not
(``PINSTORM_MALLOC_TOP_PAD=0``), and plain tf.data (``list_files`` -> ``read_file`` -> ``decode_jpeg`` ->
resize) with the same pad set and not (``mallopt`` in that process). Interleaved rounds, medians.

Writes bench/results/malloc_pad.json and .png.

``--tabular``: the Spark converter's tf reader (`make_columns_dataset`, also ``from_generator``) over a tabular
DataFrame stored by `make_spark_converter` (local[2]; ``features`` array<float> of 32, ``label``, ``ts``; row
groups of 4 MiB, as `bench/bench_tabular_reader.py`): two epochs in batches of 256 in a fresh process, padded
and not; CPU and minor page faults per 1,000 rows, peak RSS. Writes bench/results/malloc_pad_tabular.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))

# One epoch in this process: its CPU and minor faults an image, and its peak RSS.
_RUN = r"""
import json, os, resource, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
kind, url, pattern, images = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
from pinstorm.tensorflow_quiet import tensorflow
tf = tensorflow()
if kind == "plain tf.data":
    from pinstorm.pipeline.malloc_pad import pad_heaps
    pad_heaps()   # as make_dataset would (nothing where PINSTORM_MALLOC_TOP_PAD=0)
    batches = tf.data.Dataset.list_files(pattern, seed=1).map(
        lambda f: tf.image.resize(tf.io.decode_jpeg(tf.io.read_file(f), channels=3), (112, 112)) / 255.0,
        num_parallel_calls=tf.data.AUTOTUNE).batch(64).prefetch(2)
else:
    from pinstorm.pipeline import make_dataset
    batches = make_dataset(url, batch_size=64, image_size=(112, 112), training=True, num_epochs=1, seed=1)
usage = resource.getrusage(resource.RUSAGE_SELF)
started, faults = time.process_time(), usage.ru_minflt
for _ in batches:
    pass
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_ms_per_image": (time.process_time() - started) / images * 1e3,
                  "faults_per_image": (usage.ru_minflt - faults) / images, "peak_rss_mb": usage.ru_maxrss / 1024}))
"""

# Two epochs of the Spark converter's tf reader over a tabular dataset, in this process.
_TABULAR_RUN = r"""
import json, os, resource, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from pinstorm.pipeline.columns_reader import ColumnBatches, make_columns_dataset
from pinstorm.pipeline import malloc_pad
dataset = make_columns_dataset(ColumnBatches(sys.argv[1], batch_size=256, seed=1, num_epochs=2))
usage = resource.getrusage(resource.RUSAGE_SELF)
started, faults = time.process_time(), usage.ru_minflt
rows = sum(int(batch.label.shape[0]) for batch in dataset)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_ms_per_1000_rows": (time.process_time() - started) / rows * 1e6,
                  "faults_per_1000_rows": (usage.ru_minflt - faults) / rows * 1e3, "peak_rss_mb": usage.ru_maxrss / 1024,
                  "pad": malloc_pad._applied}))
"""

KINDS = {   # name: (reader, PINSTORM_MALLOC_TOP_PAD)
    "make_dataset": ("make_dataset", ""),
    "make_dataset unpadded": ("make_dataset", "0"),
    "plain tf.data": ("plain tf.data", ""),
    "plain tf.data unpadded": ("plain tf.data", "0"),
}


def one_run(kind: str, url: str, pattern: str, images: int) -> dict:
    reader, pad = KINDS[kind]
    env = {**os.environ, "PINSTORM_MALLOC_TOP_PAD": pad} if pad else {
        k: v for k, v in os.environ.items() if k != "PINSTORM_MALLOC_TOP_PAD"}
    run = subprocess.run([sys.executable, "-c", _RUN, reader, url, pattern, str(images)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def medians(runs: dict[str, list[dict]], keys, label=lambda kind: kind) -> list[dict]:
    """One row a kind: the median of each of `keys` over its runs, and the runs themselves."""
    rows = []
    for kind, samples in runs.items():
        row = {"reader": label(kind)}
        for key in keys:
            values = [sample[key] for sample in samples]
            row[key] = round(statistics.median(values), 4)
            row[f"{key}_runs"] = [round(v, 4) for v in values]
        rows.append(row)
    return rows


def write_report(report: dict, out: Path, name: str, panels, suptitle: str, figsize) -> None:
    """`report` as out/name.json and, with matplotlib, out/name.png: a bar a reader for each (key, title) of
    `panels`, each run a dot."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "results"}))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = report["results"]
    colours = ["#4c72b0", "#c44e52", "#dd8452", "#e5ae38"][:len(rows)]
    figure, axes = plt.subplots(1, len(panels), figsize=figsize)
    for axis, (key, title) in zip(axes, panels):
        axis.bar(range(len(rows)), [row[key] for row in rows], color=colours)
        for i, row in enumerate(rows):
            axis.scatter([i] * len(row[f"{key}_runs"]), row[f"{key}_runs"], color="black", s=6, zorder=3)
        axis.set_xticks(range(len(rows)), [row["reader"] for row in rows], fontsize=7, rotation=15)
        axis.set_title(title, fontsize=9)
    figure.suptitle(suptitle, fontsize=9)
    figure.tight_layout()
    figure.savefig(out / f"{name}.png", dpi=110)


def tabular(rows: int, rounds: int, out: Path) -> int:
    """The ``--tabular`` run (module docstring)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pinstorm.pipeline import make_spark_converter
    from pinstorm.pipeline.spark_converter import spark_session_for

    spark = spark_session_for("local[2]", "pinstorm-bench-malloc-pad")
    frame = spark.range(rows).selectExpr("transform(sequence(1, 32), i -> cast(id + i as float)) as features",
                                         "cast(id % 10 as int) as label", "timestamp_seconds(id) as ts").repartition(2)
    runs: dict[str, list[dict]] = {"padded": [], "unpadded": []}
    with tempfile.TemporaryDirectory() as cache:
        converter = make_spark_converter(frame, cache_url=cache, row_group_bytes=4 * 2**20)
        for round_ in range(rounds):
            kinds = ["padded", "unpadded"][::1 if round_ % 2 == 0 else -1]
            for kind in kinds:
                env = {k: v for k, v in os.environ.items() if k != "PINSTORM_MALLOC_TOP_PAD"}
                if kind == "unpadded":
                    env["PINSTORM_MALLOC_TOP_PAD"] = "0"
                run = subprocess.run([sys.executable, "-c", _TABULAR_RUN, converter.cache_dir_url], env=env,
                                     capture_output=True, text=True, check=True)
                runs[kind].append(json.loads(run.stdout.strip().splitlines()[-1]))
                print(round_, kind, runs[kind][-1], flush=True)
        row_groups = converter.info["row_groups"]
        converter.delete()
    spark.stop()
    results = medians(runs, ("cpu_ms_per_1000_rows", "faults_per_1000_rows", "peak_rss_mb"),
                      lambda kind: f"make_tf_dataset {kind}")
    report = {
        "benchmark": "malloc_pad_tabular",
        "what": "two epochs of the Spark converter's tf reader over a tabular dataset in a fresh process, with glibc's "
                "heap pad (default) and without",
        "config": {"rows": rows, "features": 32, "row_group_bytes": 4 * 2**20, "row_groups": row_groups,
                   "batch_size": 256, "epochs": 2, "rounds": rounds},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "results": results,
        "padded_vs_unpadded": round(results[0]["cpu_ms_per_1000_rows"] / results[1]["cpu_ms_per_1000_rows"], 3),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    write_report(report, out, "malloc_pad_tabular",
                 (("cpu_ms_per_1000_rows", "CPU ms per 1,000 rows"),
                  ("faults_per_1000_rows", "minor page faults per 1,000 rows")),
                 f"{rows:,} tabular rows x 2 epochs, {os.cpu_count()} CPUs, median of {rounds} interleaved rounds",
                 (8, 3.5))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classes", type=int, default=1_000)
    ap.add_argument("--per-class", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--tabular", action="store_true", help="the Spark converter's tf reader over a tabular dataset")
    ap.add_argument("--rows", type=int, default=500_000, help="--tabular: rows of the DataFrame")
    args = ap.parse_args(argv)
    if args.tabular:
        return tabular(args.rows, args.rounds, args.out)
    import gpu_check  # its photo-like JPEG generator
    from pinstorm.pipeline import convert, scan

    work = Path(tempfile.mkdtemp(prefix="pinstorm-bench-pad-"))
    gpu_check.make_tree(work / "tree", classes=args.classes, per_class=args.per_class, size=(120, 160),
                        workers=os.cpu_count() or 1)
    converted = convert(scan(work / "tree"), str(work / "ds"), progress=False)
    pattern = str(work / "tree" / "ILSVRC" / "Data" / "CLS-LOC" / "train" / "*" / "*.JPEG")
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for round_ in range(args.rounds):
        kinds = list(KINDS)
        for kind in kinds[round_ % len(kinds):] + kinds[:round_ % len(kinds)]:
            runs[kind].append(one_run(kind, converted.url, pattern, converted.rows))
            print(round_, kind, runs[kind][-1], flush=True)
    rows = medians(runs, ("cpu_ms_per_image", "faults_per_image", "peak_rss_mb"))
    cost = {row["reader"]: row["cpu_ms_per_image"] for row in rows}
    report = {
        "benchmark": "malloc_pad",
        "what": "one epoch in a fresh process: make_dataset with glibc's heap pad (default) and without, plain "
                "tf.data with and without",
        "config": {"classes": args.classes, "per_class": args.per_class, "images": converted.rows,
                   "image": [120, 160], "target": 112, "rounds": args.rounds},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "results": rows,
        "padded_vs_unpadded": round(cost["make_dataset"] / cost["make_dataset unpadded"], 3),
        "make_dataset_vs_plain": round(cost["make_dataset"] / cost["plain tf.data"], 3),
        "unpadded_make_dataset_vs_plain_unpadded": round(cost["make_dataset unpadded"]
                                                         / cost["plain tf.data unpadded"], 3),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    write_report(report, args.out, "malloc_pad",
                 (("cpu_ms_per_image", "CPU ms an image (one epoch, fresh process)"),
                  ("faults_per_image", "minor page faults an image")),
                 f"{converted.rows:,} small JPEGs (120x160 -> 112 px), {os.cpu_count()} CPUs, median of "
                 f"{args.rounds} interleaved rounds (dots: each run)", (11, 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
