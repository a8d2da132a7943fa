"""Benchmark: what one category pin costs as a board grows to ImageNet (1,000) and ImageNet-21k (21,841).

Every category holds 3 JPEGs of ~0.6 KB, so the time is board overhead, not data. Per board size N:

1. `repartition` of N categories into a fresh board (one batch): ms per pin. Flat is the goal: the
   ratio of ms/pin at N to ms/pin at the smallest N stays near 1.
2. Baseline, same run, same board: 10 more categories pinned one `pin()` at a time, outside a batch
   (what a user's loop does; each call publishes the index): ms per pin.
3. The root data.txt: bytes, parse time on pinstorm's JSON fast path, and with the bounded YAML loader
   every reader used before (the baseline).
4. On the largest local board, served over HTTP as a data.txt board with an empty cache: the first
   `pin_find` (fetch + parse), a second one (cached, revalidated), and `imagenet_partition(0, 16)`.
5. S3 (moto) and GCS (the emulator) on 127.0.0.1: repartition ms/pin at 30 -> 300 categories, and the
   server's own floor at that size: one raw one-object write, timed right after (the GCS emulator
   rewrites the metadata of every object it holds on each write, so its floor grows with what it stores).
6. A dataset of 1,000 categories converted into 10, 100 and 1,000 parts: `convert` per part, and the
   start-up of `dataset_info`, `verify_dataset` and `make_dataset` (to its first batch) per part.
7. 4 processes repartitioning disjoint quarters of 1,000 categories into one local board, against one
   process doing all 1,000 (no livelock in index reconciliation: the 4 finish no slower).

Writes bench/results/scale.json and bench/results/scale.png. `--quick`: local up to 1,000, buckets up
to 100. The full run goes to 21,841 (about 10 minutes on 2 cores). `--against REV` also runs the same
measurements (local up to 300 pins, where the old quadratic cost is still affordable) on commit REV,
in the same run, and reports ms/pin of both (see bench/baseline.py).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the test servers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline.py


def make_tree(root: Path, count: int, start: int = 0) -> Path:
    """An ILSVRC-shaped tree of `count` categories (wnids n<start>..), 3 tiny JPEGs each."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "JPEG")
    jpeg = buf.getvalue()
    for i in range(start, start + count):
        folder = root / "train" / f"n{i:08d}"
        folder.mkdir(parents=True)
        for j in range(3):
            (folder / f"n{i:08d}_{j}.JPEG").write_bytes(jpeg)
    return root


def measure_board(board, work: Path, count: int, singles: int = 10) -> dict:
    """Repartition `count` categories into `board`, then pin `singles` more one at a time."""
    from pinstorm import boards
    from pinstorm.pipeline import repartition

    tree = make_tree(work / f"tree-{count}", count)
    start = time.perf_counter()
    repartition(tree, board, progress=False)
    batched = time.perf_counter() - start
    extra = make_tree(work / f"extra-{count}", singles, start=count)
    files = {c.name: sorted(c.iterdir()) for c in (extra / "train").iterdir()}
    start = time.perf_counter()
    for wnid, paths in sorted(files.items()):
        boards.pin(paths, name=wnid, board=board, zip=True, description=wnid)
    single = time.perf_counter() - start
    return {"pins": count, "repartition_s": round(batched, 3), "ms_per_pin": round(1000 * batched / count, 2),
            "unbatched_ms_per_pin": round(1000 * single / singles, 2)}


def index_costs(text: bytes) -> dict:
    from pinstorm.boards import index

    start = time.perf_counter()
    fast = index.parse_index(text)
    fast_s = time.perf_counter() - start
    start = time.perf_counter()
    index.load_yaml(text, source="bench")  # the bounded YAML loader: what every reader used before
    yaml_s = time.perf_counter() - start
    return {"index_bytes": len(text), "entries": len(fast), "parse_fast_s": round(fast_s, 4),
            "parse_yaml_s": round(yaml_s, 4)}


def local_curve(sizes: list[int], work: Path) -> list[dict]:
    from pinstorm.boards.backends.fs_board import local_board

    rows = []
    for n in sizes:
        folder = work / f"board-{n}"
        board = local_board(f"b{n}", folder, cache=work / f"cache-{n}")
        row = measure_board(board, work, n)
        row.update(index_costs((folder / "data.txt").read_bytes()))
        rows.append(row)
        print(f"local {n:>6} pins: {row['ms_per_pin']:7.2f} ms/pin batched, {row['unbatched_ms_per_pin']:7.2f} "
              f"unbatched; index {row['index_bytes'] / 1e6:.2f} MB parsed in {row['parse_fast_s']:.3f} s "
              f"(YAML loader {row['parse_yaml_s']:.2f} s)", flush=True)
    return rows


def http_reads(folder: Path, work: Path) -> dict:
    """The largest board served over HTTP, read as a data.txt board from an empty cache."""
    from pinstorm import boards
    from pinstorm.pipeline import imagenet_partition

    with boards.serve_board(folder) as url:
        web = boards.board_register(url, name="web", cache=work / "http-cache")
        start = time.perf_counter()
        found = web.pin_find("n0000")
        first = time.perf_counter() - start
        start = time.perf_counter()
        web.pin_find("n0000")
        second = time.perf_counter() - start
        start = time.perf_counter()
        part = imagenet_partition(0, 16, web)
        partition = time.perf_counter() - start
    out = {"pins_found": len(found), "first_find_s": round(first, 3), "cached_find_s": round(second, 4),
           "partition_0_of_16_s": round(partition, 3), "partition_images": len(part["image"])}
    print(f"http: first pin_find {first:.2f} s, cached {second:.3f} s, imagenet_partition(0, 16) {partition:.2f} s",
          flush=True)
    return out


def interop_reads(folder: Path, work: Path) -> dict:
    """The largest board over HTTP, read by pins-python and (where installed) R pins 0.4.5 and 1.1.0."""
    import pins
    import yaml

    from pinstorm import boards

    out: dict = {}
    with boards.serve_board(folder) as url:
        start = time.perf_counter()
        manifest = yaml.safe_load((folder / "_pins.yaml").read_text())
        web = pins.board_url(url + "/", {name: paths[-1] for name, paths in manifest.items()})
        table = web.pin_read("categories")
        out["pins_python"] = {"pins": len(manifest), "categories_rows": len(table),
                              "seconds": round(time.perf_counter() - start, 2)}
        os.environ.setdefault("PINSTORM_R_TIMEOUT", "1800")  # read when r_support is imported
        try:
            from r_support import RPins, missing_reason
        except ImportError:
            return out
        # R 0.4.5's own pin_find is quadratic in the entries (1.6 s at 1,000, 15 s at 4,000, whatever the
        # YAML layout), so at ImageNet-21k it is timed on a named pin_get
        for version, code in (("0.4.5", 'board_register_datatxt(url, name = "big")\n'
                                        'list(files = length(pin_get("n00000000", board = "big", extract = TRUE)))'),
                              ("1.1.0", 'b <- board_url(paste0(url, "/"))\n'
                                        'list(pins = length(pin_list(b)), type = pin_meta(b, "n00000000")$type)')):
            if missing_reason(version):
                out[f"r_{version}"] = {"skipped": missing_reason(version)}
                continue
            start = time.perf_counter()
            got = RPins(version, work / f"r-home-{version}").run(code, url=url)
            out[f"r_{version}"] = {**got, "seconds": round(time.perf_counter() - start, 2)}
    print(f"interop on the largest board: {json.dumps(out)}", flush=True)
    return out


def bucket_curve(kind: str, sizes: list[int], work: Path) -> list[dict]:
    import uuid

    from pinstorm import boards

    if kind == "s3":
        from servers.s3 import S3Server as Server
    else:
        from servers.gcs import GcsServer as Server
    rows = []
    with Server() as server:
        if kind == "gcs":  # the emulator prints a traceback whenever a client closes a connection early
            server._server._api._httpd.handle_error = lambda *args: None
        for n in sizes:
            bucket = f"scale-{uuid.uuid4().hex[:8]}"
            board = boards.board_register(kind, name=f"{kind}{n}", bucket=bucket, create_bucket=True,
                                          cache=work / f"{kind}-cache-{n}", **server.storage_options())
            row = measure_board(board, work / kind, n, singles=5)
            start = time.perf_counter()
            for i in range(20):  # the server's own cost of one write at this size, nothing of pinstorm's
                board.fs.pipe_file(f"{bucket}/floor/{i}", b"x")
            row["raw_write_ms"] = round(1000 * (time.perf_counter() - start) / 20, 2)
            row["ms_per_pin_in_raw_writes"] = round(row["ms_per_pin"] / row["raw_write_ms"], 1)
            rows.append(row)
            print(f"{kind} {n:>5} pins: {row['ms_per_pin']:7.2f} ms/pin batched, {row['unbatched_ms_per_pin']:7.2f} "
                  f"unbatched; one raw write {row['raw_write_ms']} ms ({row['ms_per_pin_in_raw_writes']} per pin)",
                  flush=True)
    return rows


def dataset_startup(work: Path, parts_list: list[int], categories: int = 1000) -> list[dict]:
    """How convert and the readers' start-up grow with the number of parts (and row groups)."""
    from pinstorm import pipeline

    tree = make_tree(work / "dataset-tree", categories)
    layout = pipeline.scan(tree)
    pipeline.make_dataset  # noqa: B018 - TensorFlow is imported below, outside the timings
    import tensorflow  # noqa: F401

    rows = []
    for parts in parts_list:
        out = work / f"dataset-{parts}"
        start = time.perf_counter()
        pipeline.convert(layout, str(out), partitions=parts, min_row_groups=1, progress=False)
        convert_s = time.perf_counter() - start
        start = time.perf_counter()
        info = pipeline.dataset_info(str(out))
        info_s = time.perf_counter() - start
        start = time.perf_counter()
        pipeline.verify_dataset(str(out))
        verify_s = time.perf_counter() - start
        start = time.perf_counter()
        next(iter(pipeline.make_dataset(str(out), batch_size=32, image_size=(8, 8), training=False)))
        first_batch_s = time.perf_counter() - start
        row = {"parts": parts, "row_groups": info["row_groups"], "rows": info["rows"],
               "convert_ms_per_part": round(1000 * convert_s / parts, 2),
               "dataset_info_ms_per_part": round(1000 * info_s / parts, 3),
               "verify_ms_per_part": round(1000 * verify_s / parts, 2),
               "make_dataset_first_batch_s": round(first_batch_s, 3),
               "make_dataset_ms_per_part": round(1000 * first_batch_s / parts, 2)}
        rows.append(row)
        print(f"dataset {parts:>5} parts ({info['row_groups']} row groups): convert {row['convert_ms_per_part']} ms/part, "
              f"dataset_info {row['dataset_info_ms_per_part']} ms/part, verify {row['verify_ms_per_part']} ms/part, "
              f"make_dataset first batch {first_batch_s:.2f} s", flush=True)
    return rows


_SLICE = """
import sys
from pinstorm.boards.backends.fs_board import local_board
from pinstorm.pipeline import repartition
repartition(sys.argv[2], local_board("b", sys.argv[1], cache=sys.argv[3]), progress=False)
"""


def concurrent_writers(work: Path, categories: int = 1000, writers: int = 4) -> dict:
    """Wall time of one process repartitioning all categories, then of `writers` processes each
    repartitioning a disjoint slice into one board at once (every category must end up listed)."""
    import subprocess

    from pinstorm.boards.backends.fs_board import local_board

    def run(trees: list[Path], board: Path) -> float:
        start = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", _SLICE, str(board), str(t), str(work / "cw-cache")])
                 for t in trees]
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError("a repartition process failed")
        return time.perf_counter() - start

    whole = make_tree(work / "cw-all", categories)
    slices = [make_tree(work / f"cw-{w}", categories // writers, start=w * (categories // writers))
              for w in range(writers)]
    one = run([whole], work / "cw-board-1")
    many = run(slices, work / f"cw-board-{writers}")
    listed = len(local_board("check", work / f"cw-board-{writers}").pin_find(""))
    out = {"categories": categories, "writers": writers, "one_process_s": round(one, 2),
           "concurrent_s": round(many, 2), "concurrent_vs_one": round(many / one, 2), "listed": listed}
    print(f"{writers} processes x {categories // writers} categories: {many:.1f} s, one process x {categories}: "
          f"{one:.1f} s ({out['concurrent_vs_one']}x); {listed} pins listed", flush=True)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    local = result["local"]
    left.plot([r["pins"] for r in local], [r["ms_per_pin"] for r in local], "o-", label="local, repartition (batch)")
    left.plot([r["pins"] for r in local], [r["unbatched_ms_per_pin"] for r in local], "s--",
              label="local, one pin() at a time")
    for kind in ("s3", "gcs"):
        rows = result.get(kind) or []
        if rows:
            left.plot([r["pins"] for r in rows], [r["ms_per_pin"] for r in rows], "^-", label=f"{kind}, repartition")
    old = (result.get("baseline") or {}).get("local") or []
    if old:
        left.plot([r["pins"] for r in old], [r["ms_per_pin"] for r in old], "x:", color="#c33",
                  label=f"local, repartition at {result['baseline']['rev']} (before)")
    left.set(xscale="log", yscale="log", xlabel="pins on the board", ylabel="ms per pin",
             title="Cost of one category pin as the board grows")
    left.legend(fontsize=8)
    right.plot([r["pins"] for r in local], [r["parse_fast_s"] for r in local], "o-", label="JSON fast path")
    right.plot([r["pins"] for r in local], [r["parse_yaml_s"] for r in local], "s--", label="YAML loader (before)")
    right.set(xscale="log", yscale="log", xlabel="pins in data.txt", ylabel="seconds",
              title="Parsing the board index")
    right.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="local up to 1,000 pins, buckets up to 100")
    ap.add_argument("--no-buckets", action="store_true", help="skip S3 and GCS")
    ap.add_argument("--local-sizes", help="comma-separated board sizes, e.g. 10,100,300")
    ap.add_argument("--against", metavar="REV", help="also measure commit REV (local up to 300 pins) in this run")
    ap.add_argument("--json-out", help=argparse.SUPPRESS)  # bench/baseline.py: results there, no plot
    args = ap.parse_args(argv)
    os.environ.setdefault("PINSTORM_PROGRESS", "0")
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    local_sizes = [10, 100, 1000] if args.quick else [10, 100, 1000, 5000, 21841]
    if args.local_sizes:
        local_sizes = [int(n) for n in args.local_sizes.split(",")]
    bucket_sizes = [30, 100] if args.quick else [30, 100, 300]
    with tempfile.TemporaryDirectory(prefix="pinstorm-bench-scale-") as tmp:
        work = Path(tmp)
        os.environ["PINSTORM_CONFIG"] = str(work / "config.yaml")
        os.environ["PINSTORM_CACHE"] = str(work / "cache")
        result: dict = {"local": local_curve(local_sizes, work)}
        result["http"] = http_reads(work / f"board-{local_sizes[-1]}", work)
        if not args.json_out:
            result["interop"] = interop_reads(work / f"board-{local_sizes[-1]}", work)
        if not args.no_buckets:
            for kind in ("s3", "gcs"):
                result[kind] = bucket_curve(kind, bucket_sizes, work)
        if not args.json_out:  # the baseline run measures boards only
            result["dataset"] = dataset_startup(work, [10, 100, 1000])
            result["concurrent"] = concurrent_writers(work)
    base = result["local"][0]["ms_per_pin"]
    result["ratios"] = {
        "local_ms_per_pin_vs_smallest": {r["pins"]: round(r["ms_per_pin"] / base, 2) for r in result["local"]},
        "local_unbatched_vs_batched": {r["pins"]: round(r["unbatched_ms_per_pin"] / r["ms_per_pin"], 2)
                                       for r in result["local"]},
        "index_parse_yaml_vs_fast": {r["pins"]: round(r["parse_yaml_s"] / max(r["parse_fast_s"], 1e-6), 1)
                                     for r in result["local"]},
    }
    for kind in ("s3", "gcs"):
        rows = result.get(kind) or []
        if rows:
            result["ratios"][f"{kind}_ms_per_pin_vs_smallest"] = {
                r["pins"]: round(r["ms_per_pin"] / rows[0]["ms_per_pin"], 2) for r in rows}
            if all("ms_per_pin_in_raw_writes" in r for r in rows):  # net of the server's own growth
                result["ratios"][f"{kind}_pin_in_raw_writes_vs_smallest"] = {
                    r["pins"]: round(r["ms_per_pin_in_raw_writes"] / rows[0]["ms_per_pin_in_raw_writes"], 2)
                    for r in rows}
    if result.get("dataset"):
        first = result["dataset"][0]
        result["ratios"]["dataset_per_part_cost_vs_10_parts"] = {
            r["parts"]: {k: round(r[k] / max(first[k], 1e-9), 2) for k in
                         ("convert_ms_per_part", "dataset_info_ms_per_part", "verify_ms_per_part",
                          "make_dataset_ms_per_part")} for r in result["dataset"]}
    result["quick"] = args.quick
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
        return result
    if args.against:
        from baseline import run_against

        sizes = "10,100,300"  # the old cost per pin grows with the board: 1,000 pins took 10 minutes
        print(f"--- the same on {args.against} (local {sizes}) ---", flush=True)
        old = run_against(args.against, Path(__file__).resolve(),
                          ["--local-sizes", sizes, *(["--no-buckets"] if args.no_buckets else []),
                           *(["--quick"] if args.quick else [])])
        result["baseline"] = {"rev": args.against, **old}
        now = {r["pins"]: r for r in result["local"]}
        result["ratios"]["local_ms_per_pin_before_vs_after"] = {
            r["pins"]: round(r["ms_per_pin"] / now[r["pins"]]["ms_per_pin"], 1)
            for r in old["local"] if r["pins"] in now}
        for kind in ("s3", "gcs"):
            mine = {r["pins"]: r for r in result.get(kind) or []}
            if old.get(kind):
                result["ratios"][f"{kind}_ms_per_pin_before_vs_after"] = {
                    r["pins"]: round(r["ms_per_pin"] / mine[r["pins"]]["ms_per_pin"], 1)
                    for r in old[kind] if r["pins"] in mine}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / "scale.png")
    print(json.dumps(result["ratios"], indent=2))
    return result


if __name__ == "__main__":
    main()
