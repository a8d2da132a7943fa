"""Benchmark: what the boards layer costs over touching the bytes directly.

1. A cached `pin_get` + read, against opening the cached file directly (the floor).
2. A cold download through a datatxt board over HTTP, against a plain fsspec copy of the same bytes
   from the same server (the floor), both from a Range-honouring server on 127.0.0.1.

Writes bench/results/boards.json and bench/results/boards.png. Ratios are the point: absolute times
vary with the machine. `--quick` uses smaller files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fsspec

RESULTS = Path(__file__).parent / "results"


def _best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--against", metavar="REV", help="also measure commit REV in this run (bench/baseline.py)")
    ap.add_argument("--json-out", help=argparse.SUPPRESS)  # bench/baseline.py: results there, no plot
    args = ap.parse_args(argv)
    size_mb = 16 if args.quick else 256
    small_files = 50 if args.quick else 200
    repeat = 3 if args.quick else 5
    work = Path(tempfile.mkdtemp(prefix="pinstorm-bench-boards-"))
    os.environ.update(PINSTORM_CONFIG=str(work / "cfg.yaml"), PINSTORM_BOARD=str(work / "board"),
                      PINSTORM_CACHE=str(work / "cache"), PINSTORM_PROGRESS="0")
    from pinstorm import boards
    blob = work / "blob.bin"
    blob.write_bytes(os.urandom(size_mb << 20))
    folder = work / "served"
    src = boards.board_register("local", name="src", path=folder)
    src.pin(blob, "blob")
    many = work / "many"
    many.mkdir()
    for i in range(small_files):
        (many / f"{i:04d}.JPEG").write_bytes(os.urandom(100_000))
    src.pin(many, "many", zip=True)
    results: dict = {"size_mb": size_mb, "small_files": small_files, "repeat": repeat}

    with boards.serve_board(folder) as url:
        # -- 2. cold downloads: board vs plain fsspec copy --------------------------------
        version = src.pin_versions("blob")["version"].iloc[-1]
        http = fsspec.filesystem("http", skip_instance_cache=True)
        counter = iter(range(10_000))

        def board_download():
            b = boards.board_register("datatxt", name=f"web{next(counter)}", url=url, cache=work / "cold")
            return b.pin_get("blob")

        def plain_copy():
            http.get_file(f"{url}/blob/{version}/blob.bin", str(work / f"plain-{next(counter)}.bin"))

        plain_copy()  # warm the server's page cache
        results["download_board_s"], _ = _best(board_download, repeat)
        results["download_fsspec_s"], _ = _best(plain_copy, repeat)
        results["download_ratio"] = results["download_fsspec_s"] / results["download_board_s"]

        zversion = src.pin_versions("many")["version"].iloc[-1]

        def board_zip():
            b = boards.board_register("datatxt", name=f"webz{next(counter)}", url=url, cache=work / "coldz")
            return b.pin_get("many")

        def plain_zip():
            dest = work / f"plainz-{next(counter)}.zip"
            http.get_file(f"{url}/many/{zversion}/many.zip", str(dest))
            import zipfile

            with zipfile.ZipFile(dest) as zf:
                zf.extractall(work / f"plainz-x-{next(counter)}")

        results["zip_fetch_extract_board_s"], _ = _best(board_zip, repeat)
        results["zip_fetch_extract_fsspec_s"], _ = _best(plain_zip, repeat)
        results["zip_fetch_extract_ratio"] = results["zip_fetch_extract_fsspec_s"] / results["zip_fetch_extract_board_s"]

        # -- 1. cached reads: pin_get + read vs direct read ------------------------------------
        web = boards.board_register("datatxt", name="warm", url=url, cache=work / "warm")
        cached_path = web.pin_get("blob")[0]

        def via_pin_get():
            with open(web.pin_get("blob")[0], "rb") as f:
                while f.read(1 << 22):
                    pass

        def direct():
            with open(cached_path, "rb") as f:
                while f.read(1 << 22):
                    pass

        results["cached_pin_get_read_s"], _ = _best(via_pin_get, repeat * 2)
        results["cached_direct_read_s"], _ = _best(direct, repeat * 2)
        results["cached_ratio"] = results["cached_direct_read_s"] / results["cached_pin_get_read_s"]
        trusting = boards.board_register("datatxt", name="trusting", url=url, cache=work / "warm",
                                         index_max_age=60)

        def via_trusting_pin_get():
            with open(trusting.pin_get("blob")[0], "rb") as f:
                while f.read(1 << 22):
                    pass

        results["cached_trusting_pin_get_read_s"], _ = _best(via_trusting_pin_get, repeat * 2)
        results["cached_trusting_ratio"] = results["cached_direct_read_s"] / results["cached_trusting_pin_get_read_s"]
        results["cached_pin_get_index_max_age_60_s"], _ = _best(lambda: trusting.pin_get("blob"), repeat * 4)
        results["cached_pin_get_revalidating_s"], _ = _best(lambda: web.pin_get("blob"), repeat * 4)
        results["offline_pin_get_s"], _ = _best(lambda: web.pin_get("blob", download=False), repeat * 4)
        results["local_board_pin_get_s"], _ = _best(lambda: src.pin_get("blob"), repeat * 4)

    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
        return results
    if args.against:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from baseline import run_against

        old = run_against(args.against, Path(__file__).resolve(), ["--quick"] if args.quick else [])
        results["baseline"] = {"rev": args.against, **old}
        results["after_vs_before"] = {k: round(results[k] / old[k], 2) for k in (
            "cached_pin_get_revalidating_s", "cached_pin_get_index_max_age_60_s", "local_board_pin_get_s",
            "offline_pin_get_s", "download_board_s", "zip_fetch_extract_board_s") if old.get(k)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "boards.json").write_text(json.dumps(results, indent=2))
    _plot(results)
    print(json.dumps(results, indent=2))
    return results


def _plot(r: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"download {r['size_mb']} MB", f"fetch+extract {r['small_files']} files",
              f"cached read {r['size_mb']} MB\n(index revalidated)", f"cached read {r['size_mb']} MB\n(index_max_age=60)"]
    board = [r["download_board_s"], r["zip_fetch_extract_board_s"], r["cached_pin_get_read_s"],
             r["cached_trusting_pin_get_read_s"]]
    floor = [r["download_fsspec_s"], r["zip_fetch_extract_fsspec_s"], r["cached_direct_read_s"],
             r["cached_direct_read_s"]]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], floor, 0.4, label="plain fsspec / direct open (floor)")
    ax.bar([i + 0.2 for i in x], board, 0.4, label="through pinstorm board")
    for i, (f, b) in enumerate(zip(floor, board)):
        ax.text(i + 0.2, b, f"{f / b:.2f}x", ha="center", va="bottom")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("seconds (best of runs)")
    ax.set_title("boards: cost over the raw transfer (label: floor/board speed ratio)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "boards.png", dpi=110)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
