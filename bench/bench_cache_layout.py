"""Benchmark: the cache's disk use for zipped category pins, and the per-pin cost of an already-cached fetch.

Issue 36 (items 5 and 6). A board made by `repartition` (one zip per category) is served over HTTP
(`boards.serve_board`, a data.txt board, as `pinstorm board serve` does) and fetched with
`imagenet_partition` through a fresh cache:

1. Disk: 100 categories x 40 JPEGs (~96-160 px, noise: ~2-9 KB each). The cache's bytes (files'
   sizes, and blocks as `du` counts them) after the fetch, split into archives, extracted files and
   the rest, against the tree's own bytes.
2. Per-pin cost of a second, already-cached `imagenet_partition` (what `convert board://...` pays
   before its first image) at 10, 100 and 1,000 categories of 3 tiny JPEGs, and the HTTP requests
   it makes (all of them: index revalidations and files).

`--against REV` runs the same measurements on commit REV in the same run (bench/baseline.py) and
writes both. Results: bench/results/cache_layout.json and .png (`--name`: another name). Kept runs:
`cache_layout` (the default counts), `cache_layout_21k` (10, 1,000 and 21,841 categories against the
commit before an index's entries were found by name rather than by a scan of the list).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline.py


def make_tree(root: Path, count: int, per_class: int, noise: bool) -> Path:
    from PIL import Image

    rng = random.Random(0)
    tiny = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(tiny, "JPEG")
    for i in range(count):
        folder = root / "train" / f"n{i:08d}"
        folder.mkdir(parents=True)
        for j in range(per_class):
            if noise:
                side = rng.randint(96, 160)
                img = Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3))
                buf = io.BytesIO()
                img.save(buf, "JPEG", quality=30)
                data = buf.getvalue()
            else:
                data = tiny.getvalue()
            (folder / f"n{i:08d}_{j}.JPEG").write_bytes(data)
    return root


def tree_bytes(root: Path) -> dict:
    files = [p for p in root.rglob("*") if p.is_file()]
    out = {"files": len(files), "bytes": 0, "blocks_bytes": 0, "archive_bytes": 0, "extracted_bytes": 0}
    for p in files:
        st = p.stat()
        out["bytes"] += st.st_size
        out["blocks_bytes"] += st.st_blocks * 512
        if p.suffix == ".zip":
            out["archive_bytes"] += st.st_size
        elif "_extracted" in p.parts and not p.name.startswith("."):
            out["extracted_bytes"] += st.st_size
    out["other_bytes"] = out["bytes"] - out["archive_bytes"] - out["extracted_bytes"]
    return out


class Counting:
    """Counts the requests a board's HTTP session sends."""

    def __init__(self, board):
        self.n = 0
        session = board.storage.session
        original = session.request

        def request(*a, **k):
            self.n += 1
            return original(*a, **k)

        session.request = request


def measure(work: Path, counts: list[int], disk_categories: int) -> dict:
    os.environ["PINSTORM_PROGRESS"] = "0"
    from pinstorm import boards
    from pinstorm.pipeline import imagenet_partition, repartition

    out: dict = {"disk": {}, "per_pin": []}
    # 1. disk
    tree = make_tree(work / "tree-disk", disk_categories, 40, noise=True)
    folder = work / "board-disk"
    repartition(tree, boards.board_folder(str(folder)), progress=False)
    with boards.serve_board(folder) as url:
        web = boards.board_register("datatxt", name="webdisk", url=url, cache=str(work / "cache-disk"))
        start = time.perf_counter()
        data = imagenet_partition(0, 1, web)
        out["disk"]["cold_fetch_s"] = round(time.perf_counter() - start, 3)
        out["disk"]["images"] = len(data["image"])
    out["disk"]["categories"] = disk_categories
    out["disk"]["tree"] = tree_bytes(tree / "train")
    out["disk"]["cache"] = tree_bytes(work / "cache-disk")
    out["disk"]["cache_over_tree"] = round(out["disk"]["cache"]["bytes"] / out["disk"]["tree"]["bytes"], 3)
    # 2. per-pin cost, already cached
    for n in counts:
        tree = make_tree(work / f"tree-{n}", n, 3, noise=False)
        folder = work / f"board-{n}"
        repartition(tree, boards.board_folder(str(folder)), progress=False)
        with boards.serve_board(folder) as url:
            web = boards.board_register("datatxt", name=f"web{n}", url=url, cache=str(work / f"cache-{n}"))
            imagenet_partition(0, 1, web)  # cold: download + extract
            counter = Counting(web)
            best = float("inf")
            for _ in range(3):
                before = counter.n
                start = time.perf_counter()
                imagenet_partition(0, 1, web)
                best = min(best, time.perf_counter() - start)
                requests = counter.n - before
        out["per_pin"].append({"pins": n, "warm_s": round(best, 4), "ms_per_pin": round(1000 * best / n, 3),
                               "requests": requests})
        print(f"  {n} pins cached: {best:.3f} s, {1000 * best / n:.2f} ms/pin, {requests} requests", flush=True)
    return out


def _plot(result: dict, name: str = "cache_layout") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [("this change", result["after"])] + ([("baseline " + result["against"], result["before"])]
                                                 if result.get("before") else [])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for label, r in runs:
        pins = [p["pins"] for p in r["per_pin"]]
        a.plot(pins, [p["ms_per_pin"] for p in r["per_pin"]], marker="o", label=label)
    a.set_xscale("log")
    a.set_xlabel("cached category pins")
    a.set_ylabel("ms per pin (already cached imagenet_partition)")
    a.set_ylim(bottom=0)
    a.legend()
    a.set_title("Per-pin cost of a cached fetch (data.txt board over HTTP)")
    names = [label for label, _ in runs]
    mib = 2 ** 20
    zips = [r["disk"]["cache"]["archive_bytes"] / mib for _, r in runs]
    extracted = [r["disk"]["cache"]["extracted_bytes"] / mib for _, r in runs]
    other = [r["disk"]["cache"]["other_bytes"] / mib for _, r in runs]
    b.bar(names, extracted, label="extracted files")
    b.bar(names, zips, bottom=extracted, label="zips")
    b.bar(names, other, bottom=[x + y for x, y in zip(extracted, zips)], label="metadata, stamps, manifests")
    b.axhline(result["after"]["disk"]["tree"]["bytes"] / mib, color="k", ls="--", label="the JPEG tree")
    b.set_ylabel("MiB in the cache")
    b.set_title(f"Cache after fetching {result['after']['disk']['categories']} zipped categories")
    b.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="10,100,1000")
    parser.add_argument("--disk-categories", type=int, default=100)
    parser.add_argument("--against", default=None, help="Also measure commit REV in the same run.")
    parser.add_argument("--name", default="cache_layout",
                        help="results as bench/results/NAME.json and .png (a run kept apart from the default's)")
    parser.add_argument("--json-out", default=None, help="(internal: the baseline run's output)")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    with tempfile.TemporaryDirectory(prefix="pinstorm-cache-layout-") as tmp:
        os.environ["PINSTORM_CONFIG"] = str(Path(tmp) / "config.yaml")
        after = measure(Path(tmp), counts, args.disk_categories)
    if args.json_out:  # the baseline's run: its numbers only
        Path(args.json_out).write_text(json.dumps(after))
        return after
    result = {"after": after, "against": args.against, "before": None,
              "machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d")}
    if args.against:
        from baseline import run_against

        result["before"] = run_against(args.against, Path(__file__).resolve(),
                                       ["--counts", args.counts, "--disk-categories", str(args.disk_categories)])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    _plot(result, args.name)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
