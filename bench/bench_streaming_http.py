"""Benchmark: a dataset pin streamed from an HTTP data.txt board (`board://`, stream=True), cache = dataset / 4.

A converted dataset of ImageNet-size JPEGs (`samples.make_imagenet_size_tree`, ~110 KB each; parts of one row
group) is pinned to a folder board, served over HTTP by `pinstorm board serve`'s server in its own process, and
registered as a data.txt board. Rows alone (read and verified, nothing decoded: what the server and the cache
deliver) are read for 2 epochs, in interleaved rounds (median reported), three ways:

* from local disk (the dataset folder; no cache);
* ``board://web/ds`` with stream=True: the pin's files from its metadata, ranged reads through the board's client;
* the same version folder as a plain ``https://`` fsspec URL with stream=True (fsspec's HTTP filesystem): the
  HTTP streaming that existed before, the baseline for the board's client;
* ``board://web/ds`` again with ``PINSTORM_RANGED_READS=fsspec``: the board's ranged reads in 8 MiB blocks
  held in memory, as before `pipeline.ranged_reads` (one GET a part, handed to the cache file as it arrives).

Each round reads the ways in another order.

Also: part bytes fetched per epoch against the dataset's bytes, the cache's peak against its limit, and a
dataset that fits (cache_limit = 2 x the dataset): part fetches in epoch 2 (must be 0).

Writes bench/results/streaming_http.json and .png. `--quick`: 64 images in 8 parts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PINSTORM_PROGRESS", "0")

RESULTS = ROOT / "bench" / "results"
EPOCHS = 2
BEFORE = "board://, 8 MiB reads in memory (before)"
SERVER = "import sys\nfrom pinstorm import boards\nwith boards.serve_board(sys.argv[1]) as url:\n" \
         "    print(url, flush=True)\n    sys.stdin.read()\n"


def read_epochs(url: str, **kw) -> dict:
    """Rows/s over `EPOCHS` epochs from a cold part cache, and the cache's counters per epoch."""
    from pinstorm.pipeline import part_cache
    from pinstorm.pipeline.epochs import open_epochs

    shutil.rmtree(Path(os.environ["PINSTORM_CACHE"]) / "parts", ignore_errors=True)
    part_cache.reset_counters()
    start = time.perf_counter()
    source = open_epochs(url, None, shuffle=True, seed=0, **kw)
    rows, epochs, peak = 0, [], 0
    for epoch in range(EPOCHS):
        part_cache.reset_counters()
        rows += sum(len(labels) for _, labels in source(epoch))
        counters = part_cache.COUNTERS
        epochs.append({"fetched_bytes": counters.fetched_bytes, "fetches": counters.fetches})
        peak = max(peak, counters.peak_bytes)
    return {"rows_per_s": rows / (time.perf_counter() - start), "epochs": epochs, "peak_bytes": peak}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ways = list(report["rows_per_s"])
    ax = axes[0]
    for i, way in enumerate(ways):
        ax.bar(i, report["rows_per_s"][way]["median"], 0.6, color=["#888888", "#2a7ab9", "#e39b2d", "#9ecae1"][i % 4])
        ax.plot([i] * len(report["rows_per_s"][way]["rounds"]), report["rows_per_s"][way]["rounds"], "k.")
    ax.set_xticks(range(len(ways)), [w.replace(", ", ",\n") for w in ways], fontsize=7)
    ax.set_ylabel("rows/s (read and verified, no decode)")
    ax.set_title(f"median of {report['config']['rounds']} interleaved rounds")
    ax = axes[1]
    board = report["board"]
    ax.bar([0, 1], [e["fetched_bytes"] / report["config"]["dataset_bytes"] for e in board["epochs"]], 0.5,
           color="#2a7ab9")
    ax.bar(2, board["peak_bytes"] / report["config"]["cache_limit"], 0.5, color="#e39b2d")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks([0, 1, 2], ["epoch 1 fetched\n/ dataset", "epoch 2 fetched\n/ dataset", "peak cache\n/ limit"])
    ax.set_title(f"board://, cache = dataset / 4; a dataset that fits: epoch 2 fetched "
                 f"{report['fits']['epoch2_fetches']} parts", fontsize=9)
    fig.suptitle(f"stream=True from an HTTP data.txt board: {report['config']['images']} JPEGs, "
                 f"{report['config']['dataset_bytes'] / 1e6:.1f} MB in {report['config']['parts']} parts "
                 f"({report['machine']['cpus']} CPUs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-streaming-http-"))
    os.environ["PINSTORM_CACHE"] = str(work / "cache")
    os.environ["PINSTORM_CONFIG"] = str(work / "boards.yaml")
    from pinstorm import boards
    from pinstorm.pipeline import convert, make_imagenet_size_tree, scan
    from pinstorm.pipeline.metadata import read_info
    from pinstorm.pipeline.storage import resolve

    classes, per_class, parts = (4, 16, 8) if args.quick else (8, 40, 16)
    server = None
    try:
        tree = make_imagenet_size_tree(work / "tree", classes=classes, per_class=per_class)
        local = work / "ds"
        convert(scan(tree), local, partitions=parts, min_row_groups=parts, seed=0, progress=False)
        info = read_info(resolve(local))
        dataset_bytes = sum(e["bytes"] for e in info.files.values())
        limit = dataset_bytes // 4
        folder = work / "board"
        boards.board_register("local", name="src", path=folder).pin(sorted(str(p) for p in local.iterdir()),
                                                                    name="ds", type="files")
        (version,) = [p.name for p in (folder / "ds").iterdir() if p.is_dir()]
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(folder)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        base = server.stdout.readline().strip()
        boards.board_register("datatxt", name="web", url=base)
        ways = {"local disk": (str(local), {}),
                "https:// (fsspec HTTP)": (f"{base}/ds/{version}", {"stream": True, "cache_limit": limit}),
                "board:// (data.txt board)": ("board://web/ds", {"stream": True, "cache_limit": limit}),
                BEFORE: ("board://web/ds", {"stream": True, "cache_limit": limit})}
        rounds: dict[str, list[float]] = {way: [] for way in ways}
        board = None
        for r in range(args.rounds):
            order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
            for way in order:
                url, kw = ways[way]
                os.environ["PINSTORM_RANGED_READS"] = "fsspec" if way == BEFORE else "auto"
                got = read_epochs(url, **kw)
                rounds[way].append(round(got["rows_per_s"], 1))
                if way == "board:// (data.txt board)":
                    board = got
            os.environ["PINSTORM_RANGED_READS"] = "auto"
            print(f"  round {r + 1}: " + ", ".join(f"{w} {rounds[w][-1]:.0f} rows/s" for w in ways), flush=True)
        fits = read_epochs("board://web/ds", stream=True, cache_limit=2 * dataset_bytes)
        # the second read of a dataset that fits, warm (read_epochs empties the cache first, so read here)
        from pinstorm.pipeline import part_cache
        from pinstorm.pipeline.epochs import open_epochs
        source = open_epochs("board://web/ds", None, shuffle=True, seed=0, stream=True, cache_limit=2 * dataset_bytes)
        part_cache.reset_counters()
        sum(len(labels) for _, labels in source(0))
        sum(len(labels) for _, labels in source(1))
        fits["epoch2_fetches"] = fits["epochs"][1]["fetches"]
        fits["warm_run_fetches"] = part_cache.COUNTERS.fetches
    finally:
        if server is not None:
            server.stdin.close()
            server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    medians = {way: statistics.median(v) for way, v in rounds.items()}
    report = {
        "benchmark": "streaming_http",
        "what": "rows alone (read, verified, no decode), 2 epochs, cold part cache each run: local disk, a board:// "
                "pin on an HTTP data.txt board with stream=True, the same version folder as an https:// fsspec URL "
                "with stream=True; cache_limit = dataset / 4; server in its own process on loopback",
        "config": {"images": info.rows, "parts": len(info.files), "dataset_bytes": dataset_bytes,
                   "cache_limit": limit, "epochs": EPOCHS, "rounds": args.rounds, "quick": args.quick},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "rows_per_s": {way: {"median": medians[way], "rounds": rounds[way]} for way in rounds},
        "board_vs_local": round(medians["board:// (data.txt board)"] / medians["local disk"], 3),
        "board_vs_fsspec_https": round(medians["board:// (data.txt board)"] / medians["https:// (fsspec HTTP)"], 3),
        "board_vs_board_in_memory_reads": round(medians["board:// (data.txt board)"] / medians[BEFORE], 3),
        "board": {"epochs": board["epochs"], "peak_bytes": board["peak_bytes"],
                  "fetched_per_epoch_vs_dataset": [round(e["fetched_bytes"] / dataset_bytes, 3)
                                                   for e in board["epochs"]]},
        "fits": {"cache_limit": 2 * dataset_bytes, "epochs": fits["epochs"], "epoch2_fetches": fits["epoch2_fetches"],
                 "warm_run_fetches": fits["warm_run_fetches"]},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "streaming_http.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "streaming_http.png")
    print(json.dumps({k: report[k] for k in ("rows_per_s", "board_vs_local", "board_vs_fsspec_https",
                                             "board_vs_board_in_memory_reads", "board")},
                     indent=1))
    print(f"wrote {args.out / 'streaming_http.json'} and .png")
    return report


if __name__ == "__main__":
    main()
