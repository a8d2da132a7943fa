"""Benchmark: reading a tabular Spark-converter dataset as petastorm's batches, against a plain pyarrow read.

`make_spark_converter` (local[2]) stores a tabular DataFrame (``features`` array<float> of `--width`,
``label`` int, ``ts`` timestamp) once; then, in interleaved rounds, one epoch is read by:

* ``pyarrow`` (the baseline): ``ParquetFile.iter_batches`` over every part, each column made the same
  numpy arrays (features ``[batch, width]``), no checks: the least a reader of these files does;
* ``columns``: `ColumnBatches` (what both framework readers iterate): row groups checked
  (`read_row_group`: content checksum over every column), shuffled, batched;
* ``torch``: `make_torch_dataloader` (dicts of tensors);
* ``tf``: `make_tf_dataset` (namedtuples of tensors, through ``from_generator``).

After one untimed warm-up round, rows per second (median of the rounds) and each reader's speed relative to the baseline: the median over
rounds of baseline seconds / reader seconds in the same round (1.0: as fast as pyarrow; 0.5: twice its time).
Writes bench/results/tabular_reader.json and .png. ``--quick``: fewer rows and rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _pyarrow_epoch(location, info, batch_size: int) -> int:
    import numpy as np
    import pyarrow.parquet as pq

    rows = 0
    for name in sorted(info["files"]):
        for batch in pq.ParquetFile(location.join(name)).iter_batches(batch_size=batch_size):
            features = batch.column("features")
            values = np.asarray(features.flatten()).reshape(len(batch), -1)
            batch.column("label").to_numpy()
            batch.column("ts").cast("int64").to_numpy()
            rows += len(values)   # labels and ts made too, as the readers make them
    return rows


def measure(rows: int, width: int, rounds: int, batch_size: int) -> dict:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pinstorm.pipeline import make_spark_converter
    from pinstorm.pipeline.columns_reader import ColumnBatches
    from pinstorm.pipeline.spark_converter import spark_session_for
    from pinstorm.pipeline.storage import resolve

    spark = spark_session_for("local[2]", "pinstorm-bench-tabular")
    df = spark.range(rows).selectExpr(f"transform(sequence(1, {width}), i -> cast(id + i as float)) as features",
                                      "cast(id % 10 as int) as label",
                                      "timestamp_seconds(id) as ts").repartition(2)
    with tempfile.TemporaryDirectory() as cache:
        started = time.monotonic()
        converter = make_spark_converter(df, cache_url=cache, row_group_bytes=4 * 2**20)
        write_seconds = time.monotonic() - started
        location = resolve(converter.cache_dir_url)
        info = converter.info

        def columns():
            return sum(len(b["label"]) for b in ColumnBatches(converter.cache_dir_url, batch_size=batch_size, seed=1))

        def torch():
            with converter.make_torch_dataloader(batch_size=batch_size, num_epochs=1, seed=1) as loader:
                return sum(len(b["label"]) for b in loader)

        def tf():
            with converter.make_tf_dataset(batch_size=batch_size, num_epochs=1, seed=1) as dataset:
                return sum(int(b.label.shape[0]) for b in dataset)

        readers = {"pyarrow": lambda: _pyarrow_epoch(location, info, batch_size), "columns": columns,
                   "torch": torch, "tf": tf}
        timings = {name: [] for name in readers}
        for read in readers.values():               # warm-up, untimed: imports, tf's graph, the page cache
            read()
        for _ in range(rounds):
            for name, read in readers.items():      # interleaved: each round times every reader
                started = time.perf_counter()
                assert read() == rows, name
                timings[name].append(time.perf_counter() - started)
        converter.delete()
    spark.stop()
    base = timings["pyarrow"]
    return {
        "rows": rows, "width": width, "batch_size": batch_size, "rounds": rounds,
        "row_groups": info["row_groups"], "bytes": info["bytes"], "write_seconds": write_seconds,
        "rows_per_second": {n: rows / statistics.median(t) for n, t in timings.items()},
        "ratio_to_pyarrow": {n: statistics.median(b / s for b, s in zip(base, t)) for n, t in timings.items()},
        "seconds": timings,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["rows_per_second"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bars = ax.bar(names, [results["rows_per_second"][n] / 1e3 for n in names], color="#4477aa")
    for bar, name in zip(bars, names):
        ax.annotate(f"{results['ratio_to_pyarrow'][name]:.2f}x", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("thousand rows / s (median)")
    ax.set_title(f"one epoch of {results['rows']:,} rows (features[{results['width']}], label, ts)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 20_000, 3
    results = measure(args.rows, args.width, args.rounds, args.batch_size)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tabular_reader.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "tabular_reader.png")
    print(json.dumps({k: results[k] for k in ("rows_per_second", "ratio_to_pyarrow", "row_groups")}, indent=1))
    print(f"wrote {args.out / 'tabular_reader.json'} and {args.out / 'tabular_reader.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
