"""Benchmark: what one download's room costs the part cache as the files it holds grow (10 -> 21,841).

Every download reserves its bytes under the machine-wide lock, evicting least recently used files when the
cache is full. Before `pipeline.part_ledger`, each reservation scanned every cached file (a listing and a
stat each); now each process reads only the journal lines written since it last looked. Measured with the
cache full (each reservation evicts one file), median of 200 reservations, against a scan of the same
folder in the same run (what every reservation cost before).

Writes bench/results/part_ledger.json and .png. `--quick`: up to 4,096 files.
"""

from __future__ import annotations

import argparse
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
RESULTS = ROOT / "bench" / "results"
SIZE = 1000   # bytes a cached file (the accounting does not read them)


def full_cache(root: Path, files: int):
    """A `PartCache` at its limit over `files` cached files of one dataset folder."""
    from pinstorm.pipeline.part_cache import PartCache

    folder = root / "ds-0123456789abcdef"
    folder.mkdir(parents=True)
    for i in range(files):
        (folder / f"part-00000.parquet+{i}").write_bytes(b"x" * SIZE)
    cache = object.__new__(PartCache)   # the accounting alone: no dataset, no source
    cache.root, cache.folder, cache.limit = root, folder, files * SIZE
    cache._forget()
    return cache


def measure(files: int, work: Path, reservations: int) -> dict:
    from pinstorm.pipeline.part_ledger import Ledger
    from pinstorm.pipeline.part_cache import _KEY

    root = work / f"cache-{files}"
    cache = full_cache(root, files)
    with cache._lock():
        cache._synced()   # the journal written from the folder once
    times = []
    for i in range(reservations):
        name = f"part-00000.parquet+{files + i}"
        start = time.perf_counter()
        reservation = cache._reserve(name, SIZE, wait=False)   # evicts the oldest file
        times.append(time.perf_counter() - start)
        assert reservation is not None
        with cache._lock():   # the download lands: entered in the ledger, renamed into place
            cache._synced().add(cache._key(name), SIZE)
            (cache.folder / name).write_bytes(b"x" * SIZE)
        cache.release(reservation)
    scans = []
    for _ in range(5):
        start = time.perf_counter()
        Ledger(root, _KEY).rebuild()   # the folder scan every reservation did before
        scans.append(time.perf_counter() - start)
    shutil.rmtree(root)
    row = {"files": files, "reserve_ms": round(statistics.median(times) * 1e3, 3),
           "scan_ms": round(statistics.median(scans) * 1e3, 3)}
    row["scan_vs_reserve"] = round(row["scan_ms"] / row["reserve_ms"], 1)
    print(f"  {files:>6,} files: a reservation {row['reserve_ms']:.2f} ms; a scan of the folder {row['scan_ms']:.1f} ms",
          flush=True)
    return row


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([r["files"] for r in rows], [r["scan_ms"] for r in rows], "o-", color="#888888",
            label="scan of every cached file (each reservation, before)")
    ax.plot([r["files"] for r in rows], [r["reserve_ms"] for r in rows], "o-", color="#2a7ab9",
            label="reservation with the ledger (evicting one file)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("files in the part cache")
    ax.set_ylabel("ms, under the machine-wide lock (median)")
    ax.set_title(f"part cache accounting by cached files ({os.cpu_count()} CPUs)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    counts = [10, 256, 4096] if args.quick else [10, 1000, 4096, 21841]
    work = Path(tempfile.mkdtemp(prefix="pinstorm-bench-ledger-"))
    try:
        rows = [measure(n, work, 50 if args.quick else 200) for n in counts]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"benchmark": "part_ledger",
              "what": "one reservation of a full part cache (evicting one file) by cached files, against a scan of "
                      "the same folder (what each reservation did before the ledger), same run",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform()},
              "results": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "part_ledger.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "part_ledger.png")
    print(f"wrote {args.out / 'part_ledger.json'} and .png")
    return report


if __name__ == "__main__":
    main()
