"""Benchmark: streaming parts of many row groups, cached by row group (`pipeline.part_pieces`).

`convert`'s defaults write one part file; a part cache smaller than it used to refuse it, and a shuffled
epoch over big parts of many row groups fetched a part again for each run of its row groups. Measured in
the same run, moto S3 in its own process, rows alone (read and verified, nothing decoded: what the cache
costs), 2 shuffled epochs, cache_limit = 0.3 x the dataset, median of interleaved rounds:

* the same images as 32 parts of one row group (the layout docs advised: the baseline), as one part of
  32 row groups (`convert`'s default layout), and as 4 parts of 8 row groups, by row group and cached
  whole (the rule before, forced): part bytes fetched per epoch / dataset bytes, peak cache / limit, MB/s,
  and the MB/s of bare ranged GETs of the same sizes from the same objects (moto reads a whole object for
  each ranged GET, so the one part of 32 row groups is slower to serve, cache or not);
* how a part's footer costs as its row groups grow (16 to 21,841, tiny rows): footer bytes and the time to
  parse it and derive every row group's byte range, per row group (must stay flat).

Writes bench/results/streaming_pieces.json and .png. `--quick`: fewer images, one round.
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
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PINSTORM_PROGRESS", "0")

RESULTS = ROOT / "bench" / "results"
EPOCHS = 2
GROUPS = 32
LAYOUTS = [   # (label, parts, cached whole)
    ("32 parts x 1 row group", 32, None),
    ("1 part x 32 row groups", 1, False),
    ("4 parts x 8, by row group", 4, False),
    ("4 parts x 8, whole (before)", 4, True),
]


def stream_rows(url: str, options: dict, limit: int, cache: Path, whole: bool | None) -> dict:
    """2 shuffled epochs of rows through a cold cache; the cache's counters and the rate."""
    from pinstorm.pipeline import part_cache
    from pinstorm.pipeline.epochs import open_epochs

    shutil.rmtree(cache, ignore_errors=True)
    os.environ["PINSTORM_CACHE"] = str(cache)
    before = part_cache.PartCache.whole
    if whole is not None:
        part_cache.PartCache.whole = lambda self, name: whole
    try:
        part_cache.reset_counters()
        source = open_epochs(url, None, shuffle=True, seed=0, storage_options=options, stream=True,
                             cache_limit=limit)
        start, fetched, rows = time.perf_counter(), [], 0
        for epoch in range(EPOCHS):
            at = part_cache.COUNTERS.fetched_bytes
            rows += sum(len(labels) for _, labels in source(epoch))
            fetched.append(part_cache.COUNTERS.fetched_bytes - at)
        seconds = time.perf_counter() - start
    finally:
        part_cache.PartCache.whole = before
    return {"seconds": seconds, "rows": rows, "fetched": fetched, "peak": part_cache.COUNTERS.peak_bytes,
            "fetches": part_cache.COUNTERS.fetches}


def bare_ranged_gets(fs, folder: str) -> float:
    """MB/s of plain ranged GETs of the row group sizes of `folder`'s parts, no cache: what the server gives
    (moto reads a whole object for each ranged GET, so its rate falls as the object grows; S3 does not)."""
    parts = sorted(p for p in fs.ls(folder) if p.rsplit("/", 1)[-1].startswith("part-"))
    size, per_part = fs.size(parts[0]), GROUPS // len(parts)
    step = size // per_part
    start, fetched = time.perf_counter(), 0
    for part in parts:
        for k in range(per_part):
            fetched += len(fs.cat_file(part, start=k * step, end=min(size, (k + 1) * step)))
    return fetched / 1e6 / (time.perf_counter() - start)


def footer_costs(work: Path, counts: list[int]) -> list[dict]:
    """Footer bytes, and the time to parse it and derive every row group's span, for parts of `counts` row
    groups of one tiny row each (the same columns as a converted dataset)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pinstorm.pipeline.metadata import ARROW_SCHEMA
    from pinstorm.pipeline.part_pieces import TAIL, row_group_spans

    out = []
    for count in counts:
        path = work / f"footer-{count}.parquet"
        row = {"image": [b"\xff\xd8jpeg\xff\xd9"], "label": [1], "wnid": ["n0"], "filename": ["a.JPEG"],
               "height": [1], "width": [1]}
        table = pa.Table.from_pydict({f.name: row[f.name] for f in ARROW_SCHEMA}, schema=ARROW_SCHEMA)
        with pq.ParquetWriter(path, ARROW_SCHEMA) as writer:
            for _ in range(count):
                writer.write_table(table)
        data = path.read_bytes()
        length = int.from_bytes(data[-TAIL:-4], "little") + TAIL
        footer = data[-length:]
        times = []
        for _ in range(5):
            start = time.perf_counter()
            spans = row_group_spans(footer, len(data), str(path))
            times.append(time.perf_counter() - start)
        assert len(spans) == count
        seconds = statistics.median(times)
        out.append({"row_groups": count, "footer_bytes": length, "parse_seconds": round(seconds, 5),
                    "us_per_row_group": round(seconds / count * 1e6, 2)})
        print(f"  footer of {count:,} row groups: {length / 1e6:.2f} MB, parsed and spanned in {seconds * 1e3:.1f} ms "
              f"({seconds / count * 1e6:.1f} us a row group)", flush=True)
        path.unlink()
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    rows = report["layouts"]
    labels = [r["layout"].replace(" x ", " x\n").replace(", ", ",\n") for r in rows]
    ax = axes[0]
    for i, r in enumerate(rows):
        for e, ratio in enumerate(r["fetched_per_epoch_vs_dataset"]):
            ax.bar(i + (e - 0.5) * 0.4, ratio, 0.4, color=["#2a7ab9", "#e39b2d"][e],
                   label=f"epoch {e + 1}" if i == 0 else None)
            ax.text(i + (e - 0.5) * 0.4, ratio, f"{ratio:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.05, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("part bytes fetched / dataset bytes")
    ax.set_title("fetched per shuffled epoch (cache = 0.3 x dataset)")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.bar(range(len(rows)), [r["mb_per_s"] for r in rows], 0.6, color="#2a7ab9")
    for i, r in enumerate(rows):
        ax.plot([i - 0.3, i + 0.3], [r["bare_ranged_get_mb_per_s"]] * 2, color="k", lw=1.5,
                label="bare ranged GETs, no cache" if i == 0 else None)
        ax.text(i, r["mb_per_s"], f"{r['mb_per_s']:.0f}\n(peak {r['peak_vs_limit']:.2f} of limit)", ha="center",
                va="bottom", fontsize=7)
    ax.legend(fontsize=7)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("dataset MB/s, rows alone (median)")
    ax.set_title("rate through the cache from moto S3")
    ax = axes[2]
    costs = report["footers"]
    ax.plot([c["row_groups"] for c in costs], [c["us_per_row_group"] for c in costs], "o-", color="#2a7ab9")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("row groups in the part")
    ax.set_ylabel("us per row group")
    ax.set_title("footer parse + spans, per row group")
    fig.suptitle(f"parts cached by row group: {report['config']['images']} ImageNet-size JPEGs, "
                 f"{report['config']['dataset_bytes'] / 1e6:.0f} MB, {report['config']['rounds']} interleaved rounds "
                 f"({os.cpu_count()} CPUs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="64 images, one round, footers to 4,096 row groups")
    ap.add_argument("--per-class", type=int, default=None, help="images per class (10 classes)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    per_class = args.per_class or (8 if args.quick else 64)
    rounds = args.rounds or (1 if args.quick else 3)

    import s3fs

    from bench_parallel_fetch import ChildServer
    from pinstorm.pipeline import convert
    from pinstorm.pipeline.metadata import read_info
    from pinstorm.pipeline.samples import make_imagenet_size_tree
    from pinstorm.pipeline.storage import resolve
    from tests.servers.s3 import KEY, SECRET

    work = Path(tempfile.mkdtemp(prefix="pinstorm-bench-pieces-"))
    try:
        tree = make_imagenet_size_tree(work / "tree", classes=10, per_class=per_class, seed=0)
        made = {}
        for label, parts, _ in LAYOUTS:
            if parts not in made:
                convert(tree, str(work / f"ds-{parts}"), partitions=parts, min_row_groups=GROUPS, seed=0,
                        progress=False)
                made[parts] = read_info(resolve(str(work / f"ds-{parts}")))
        sizes = {parts: sum(e["bytes"] for e in info["files"].values()) for parts, info in made.items()}
        dataset_bytes = sizes[32]
        limit = int(0.3 * dataset_bytes)
        print(f"{made[32]['rows']} images, {dataset_bytes / 1e6:.1f} MB; cache_limit {limit / 1e6:.1f} MB", flush=True)
        runs = {label: [] for label, _, _ in LAYOUTS}
        with ChildServer("s3") as endpoint:
            options = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET}
            fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
            fs.mkdir("pieces")
            for parts in made:
                fs.put(str(work / f"ds-{parts}") + "/", f"pieces/ds-{parts}/", recursive=True)
            bare = {parts: [] for parts in made}
            for round_ in range(rounds):
                for parts in made:
                    bare[parts].append(bare_ranged_gets(fs, f"pieces/ds-{parts}"))
                for label, parts, whole in LAYOUTS:
                    got = stream_rows(f"s3://pieces/ds-{parts}", options, limit, work / "cache", whole)
                    runs[label].append(got)
                    print(f"  round {round_ + 1} {label}: fetched {[round(f / sizes[parts], 3) for f in got['fetched']]}"
                          f" x dataset, {sizes[parts] * EPOCHS / 1e6 / got['seconds']:.0f} MB/s", flush=True)
        layouts = []
        for label, parts, whole in LAYOUTS:
            got = runs[label]
            layouts.append({
                "layout": label, "parts": parts, "row_groups": GROUPS, "dataset_bytes": sizes[parts],
                "cached": "whole parts" if whole or parts == 32 else "by row group",
                "fetched_per_epoch_vs_dataset": [round(statistics.median(g["fetched"][e] for g in got) / sizes[parts], 3)
                                                 for e in range(EPOCHS)],
                "peak_vs_limit": round(max(g["peak"] for g in got) / limit, 3),
                "mb_per_s": round(statistics.median(sizes[parts] * EPOCHS / 1e6 / g["seconds"] for g in got), 1),
                "mb_per_s_runs": [round(sizes[parts] * EPOCHS / 1e6 / g["seconds"], 1) for g in got],
                "bare_ranged_get_mb_per_s": round(statistics.median(bare[parts]), 1),
                "fetches": [g["fetches"] for g in got]})
        footers = footer_costs(work, [16, 256, 4096] if args.quick else [16, 256, 4096, 21841])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "streaming_pieces",
        "what": "rows alone through the part cache from moto S3, 2 shuffled epochs, cache_limit = 0.3 x the dataset: "
                "parts of one row group (baseline), one part, 4 parts by row group and whole; footer cost by row groups",
        "config": {"images": made[32]["rows"], "dataset_bytes": dataset_bytes, "cache_limit": limit,
                   "row_groups": GROUPS, "epochs": EPOCHS, "rounds": rounds, "quick": args.quick},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "layouts": layouts,
        "footers": footers,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "streaming_pieces.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "streaming_pieces.png")
    print(f"wrote {args.out / 'streaming_pieces.json'} and .png")
    return report


if __name__ == "__main__":
    main()
