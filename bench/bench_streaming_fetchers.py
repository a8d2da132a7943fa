"""Benchmark: downloads in flight per reader of the part cache, against a server's time to first byte.

An object store answers each ranged GET after tens of ms; one download after another leaves the link idle
for that long each time, and a `make_dataset` reader is one stream. The same dataset (ImageNet-size JPEGs
in parts of one row group) is served over HTTP with Range by a server in its own process that waits
`--latency-ms` before each response, and read through the part cache (rows alone: read and verified,
nothing decoded; cache = the dataset / 4, cold) with `part_cache.FETCHERS` = 1 (one download at a time,
the rule before) and 2, 4, 8, interleaved rounds, median. Also at no added latency, where the extra
fetchers must cost nothing. Interleaved with them, the default count under the cache's lock as it was
before `part_cache.machine_lock` (`filelock_alone`: a `FileLock` per call, so a reader and its fetchers in
one process took turns by polling every 50 ms): the before/after of queueing threads on a thread lock.

Writes bench/results/streaming_fetchers.json and .png. `--quick`: 160 images, one round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PINSTORM_PROGRESS", "0")

RESULTS = ROOT / "bench" / "results"
COUNTS = (1, 2, 4, 8)


@contextlib.contextmanager
def filelock_alone(path):
    """The part cache's lock before `machine_lock`: a new `FileLock` each call, every waiter (a thread of
    this process or another process) polling at filelock's default 50 ms. The baseline, for benches only."""
    from filelock import FileLock

    with FileLock(os.fspath(path)):
        yield


@contextlib.contextmanager
def lock_rule(kind: str):
    """The part cache with its lock (`"queued"`, today's) or with `filelock_alone` (`"filelock"`)."""
    from pinstorm.pipeline import part_cache

    kept = part_cache.machine_lock
    if kind == "filelock":
        part_cache.machine_lock = filelock_alone
    try:
        yield
    finally:
        part_cache.machine_lock = kept


def read_rows(url: str, limit: int, cache: Path, fetchers: int, lock: str = "queued") -> float:
    """MB/s of one cold epoch of rows through the cache with `fetchers` downloads in flight, under `lock`
    (`lock_rule`)."""
    from pinstorm.pipeline import part_cache
    from pinstorm.pipeline.epochs import open_epochs

    shutil.rmtree(cache, ignore_errors=True)
    os.environ["PINSTORM_CACHE"] = str(cache)
    part_cache.FETCHERS = fetchers
    part_cache.reset_counters()
    with lock_rule(lock):
        source = open_epochs(url, None, shuffle=True, seed=0, stream=True, cache_limit=limit)
        start = time.perf_counter()
        rows = sum(len(labels) for _, labels in source(0))
        seconds = time.perf_counter() - start
    assert rows == source.info.rows
    return part_cache.COUNTERS.fetched_bytes / 1e6 / seconds


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (latency, rows), color in zip(report["results"].items(), ("#2a7ab9", "#e39b2d")):
        ax.plot([r["fetchers"] for r in rows], [r["mb_per_s"] for r in rows], "o-", color=color,
                label=f"{latency} ms to first byte")
        before = report.get("lock_before", {}).get(latency)
        if before:
            ax.plot([before["fetchers"]], [before["mb_per_s"]], "x", color=color, ms=9,
                    label=f"{latency} ms, the lock before (filelock alone)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(COUNTS, [str(c) for c in COUNTS])
    ax.set_xlabel("downloads in flight per reader (part_cache.FETCHERS)")
    ax.set_ylabel("MB/s, rows alone (median)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    cfg = report["config"]
    ax.set_title(f"one reader through the part cache, HTTP: {cfg['parts']} parts of {cfg['part_mb']:.1f} MB "
                 f"({os.cpu_count()} CPUs)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--latency-ms", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    per_class, rounds = (16, 1) if args.quick else (48, args.rounds or 3)

    from bench_parallel_fetch import ChildServer
    from pinstorm.pipeline import convert
    from pinstorm.pipeline.metadata import read_info
    from pinstorm.pipeline.samples import make_imagenet_size_tree
    from pinstorm.pipeline.storage import resolve

    from pinstorm.pipeline import part_cache

    work = Path(tempfile.mkdtemp(prefix="pinstorm-bench-fetchers-"))
    results, lock_before, default = {}, {}, part_cache.FETCHERS
    try:
        tree = make_imagenet_size_tree(work / "tree", classes=10, per_class=per_class, seed=0)
        parts = 32 if not args.quick else 8
        convert(tree, str(work / "site" / "ds"), partitions=parts, min_row_groups=parts, seed=0, progress=False)
        info = read_info(resolve(str(work / "site" / "ds")))
        dataset_bytes = sum(e["bytes"] for e in info["files"].values())
        limit = dataset_bytes // 4
        for latency in (0, args.latency_ms):
            with ChildServer("http", work / "site", latency_ms=latency) as base:
                runs = {n: [] for n in COUNTS}
                before = []   # the default count under the lock as it was (`filelock_alone`)
                for _ in range(rounds):
                    for n in COUNTS:
                        runs[n].append(read_rows(f"{base}/ds", limit, work / "cache", n))
                    before.append(read_rows(f"{base}/ds", limit, work / "cache", default, "filelock"))
                rows = [{"fetchers": n, "mb_per_s": round(statistics.median(runs[n]), 1),
                         "runs": [round(r, 1) for r in runs[n]]} for n in COUNTS]
                for row in rows:
                    row["vs_one"] = round(row["mb_per_s"] / rows[0]["mb_per_s"], 2)
                results[str(int(latency))] = rows
                now = next(r["mb_per_s"] for r in rows if r["fetchers"] == default)
                lock_before[str(int(latency))] = {
                    "fetchers": default, "mb_per_s": round(statistics.median(before), 1),
                    "runs": [round(r, 1) for r in before],
                    "machine_lock_vs_filelock_alone": round(now / statistics.median(before), 2)}
                print(f"latency {latency:.0f} ms: " + ", ".join(f"{r['fetchers']} in flight {r['mb_per_s']:.0f} MB/s "
                                                              f"({r['vs_one']:.2f}x)" for r in rows)
                      + f"; {default} in flight under filelock alone {statistics.median(before):.0f} MB/s "
                        f"(machine_lock {lock_before[str(int(latency))]['machine_lock_vs_filelock_alone']:.2f}x)",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "streaming_fetchers",
        "what": "one reader's rows through the part cache (cold, cache = dataset / 4) from an HTTP server with "
                "Range, by downloads in flight, at no added latency and with a time to first byte",
        "config": {"images": info["rows"], "parts": parts, "part_mb": dataset_bytes / parts / 1e6,
                   "dataset_bytes": dataset_bytes, "cache_limit": limit, "rounds": rounds,
                   "latency_ms": args.latency_ms, "quick": args.quick},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "results": results,
        "lock_before": lock_before,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "streaming_fetchers.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "streaming_fetchers.png")
    print(f"wrote {args.out / 'streaming_fetchers.json'} and .png")
    return report


if __name__ == "__main__":
    main()
