"""Benchmark: what resuming a tabular reader mid-epoch costs, against reading the epoch from its start.

`make_spark_converter` (local[2]) stores a tabular DataFrame (``features`` array<float> of `--width`,
``label`` int) in row groups of ~4 MiB; then, in interleaved rounds, `ColumnBatches` reads:

* ``fresh`` (the baseline): one whole epoch from its start;
* ``resumed@50%`` / ``resumed@90%``: a new reader given the state taken after half (nine tenths) of the
  epoch's batches, reading the rest of that epoch.

A resumed reader computes the rows to skip from the row counts and the seed and does not read the row
groups they came from, so its time should be about the fraction left (0.5, 0.1) of the fresh epoch's,
plus opening the dataset; reading and discarding them would cost the whole epoch. Reported: the median
over rounds of resumed seconds / fresh seconds in the same round, and seconds to the first batch.
Writes bench/results/tabular_resume.json and .png. ``--quick``: fewer rows and rounds.
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
POINTS = (0.5, 0.9)


def measure(rows: int, width: int, rounds: int, batch_size: int) -> dict:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pinstorm.pipeline import ColumnBatches, make_spark_converter
    from pinstorm.pipeline.spark_converter import spark_session_for

    spark = spark_session_for("local[2]", "pinstorm-bench-tabular-resume")
    df = spark.range(rows).selectExpr(f"transform(sequence(1, {width}), i -> cast(id + i as float)) as features",
                                      "cast(id % 10 as int) as label").repartition(2)
    with tempfile.TemporaryDirectory() as cache:
        converter = make_spark_converter(df, cache_url=cache, row_group_bytes=4 * 2**20)
        url = converter.cache_dir_url
        batches = len(ColumnBatches(url, batch_size=batch_size, seed=1))
        states = {f"resumed@{int(p * 100)}%": ColumnBatches(url, batch_size=batch_size, seed=1)
                  .state(int(batches * p)) for p in POINTS}

        def reader(state):
            def read():
                started = time.perf_counter()
                it = iter(ColumnBatches(url, batch_size=batch_size, seed=1, state=state))
                first = next(it)
                to_first = time.perf_counter() - started
                return len(first["label"]) + sum(len(b["label"]) for b in it), to_first
            return read

        readers = {"fresh": reader(None), **{name: reader(state) for name, state in states.items()}}
        expected = {"fresh": rows, **{name: rows - state["streams"][0][1] for name, state in states.items()}}
        timings = {name: [] for name in readers}
        first_batch = {name: [] for name in readers}
        for read in readers.values():               # warm-up, untimed: imports, the page cache
            read()
        for _ in range(rounds):
            for name, read in readers.items():      # interleaved: each round times every reader
                started = time.perf_counter()
                got, to_first = read()
                timings[name].append(time.perf_counter() - started)
                first_batch[name].append(to_first)
                assert got == expected[name], (name, got, expected[name])
        row_groups = converter.info.row_groups
        converter.delete()
    spark.stop()
    base = timings["fresh"]
    return {
        "rows": rows, "width": width, "batch_size": batch_size, "rounds": rounds, "row_groups": row_groups,
        "rows_read": expected,
        "median_seconds": {n: statistics.median(t) for n, t in timings.items()},
        "time_ratio_to_fresh": {n: statistics.median(s / b for b, s in zip(base, t)) for n, t in timings.items()},
        "median_seconds_to_first_batch": {n: statistics.median(t) for n, t in first_batch.items()},
        "seconds": timings,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["median_seconds"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bars = ax.bar(names, [results["median_seconds"][n] for n in names], color="#4477aa")
    for bar, name in zip(bars, names):
        ax.annotate(f"{results['time_ratio_to_fresh'][name]:.2f}x", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("seconds to the epoch's end (median)")
    ax.set_title(f"resuming an epoch of {results['rows']:,} rows, {results['row_groups']} row groups", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 20_000, 3
    results = measure(args.rows, args.width, args.rounds, args.batch_size)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tabular_resume.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "tabular_resume.png")
    print(json.dumps({k: results[k] for k in ("median_seconds", "time_ratio_to_fresh",
                                              "median_seconds_to_first_batch", "row_groups")}, indent=1))
    print(f"wrote {args.out / 'tabular_resume.json'} and {args.out / 'tabular_resume.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
