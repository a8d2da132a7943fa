"""Benchmark: what `repartition` costs against `tar cf` of the same tree + a plain copy of the tar.

Issue 36 found publishing ~30x slower than `tar` at 1,000 categories x 40 small JPEGs (19-25 s against
0.7 s). This measures, per tree size (10, 100 and 1,000 categories of `--per-class` JPEGs of
100-160 px, ~3-9 KB each, as the issue's run had):

1. `repartition(tree, local folder board)`: one zip pin per category + the categories pin, the
   board's default thread count (`parallel=None`), a fresh board each round.
2. The baseline: `tar cf` of the same folder, then a plain copy of the tar into a folder (what
   "publishing" costs with no board at all).

Rounds are interleaved (size by size, repartition then tar, then the next round), each measurement
starts after an `os.sync()` (no writeback of the previous one's files while it runs), and the median is
reported: seconds, ms per image, and repartition / (tar + copy). Goals (issue 36): the ratio within
3x, and ms per image flat from 10 to 1,000 categories.

`--against REV` also times `repartition` of commit REV (see bench/baseline.py) on the same trees,
one subprocess per round between this code's rounds, so "before" and "after" come from the same run.

Writes bench/results/repartition.json and bench/results/repartition.png.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline.py


def jpeg_pool(count: int = 256, seed: int = 0) -> list[bytes]:
    """`count` distinct small JPEGs, 100-160 px a side: smooth colour fields with a little noise."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(count):
        w, h = (int(v) for v in rng.integers(100, 161, size=2))
        coarse = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
        pixels = np.asarray(coarse, dtype=np.float32) + rng.normal(0, 6, (h, w, 3))
        buf = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=85)
        pool.append(buf.getvalue())
    return pool


def make_tree(root: Path, categories: int, per_class: int, pool: list[bytes]) -> Path:
    """An ILSVRC-shaped train tree (root/train/<wnid>/<wnid>_<j>.JPEG) of `categories` x `per_class` JPEGs."""
    rng = random.Random(categories)
    for i in range(categories):
        wnid = f"n{i:08d}"
        folder = root / "train" / wnid
        folder.mkdir(parents=True)
        for j in range(per_class):
            (folder / f"{wnid}_{j}.JPEG").write_bytes(rng.choice(pool))
    return root


def tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def time_repartition(tree: Path, work: Path, tag: str, parallel: int | None = None) -> float:
    from pinstorm.boards import board_folder
    from pinstorm.pipeline import repartition

    folder, cache = work / f"board-{tag}", work / f"cache-{tag}"
    board = board_folder(folder, cache=cache, name=f"b{tag}")
    os.sync()  # no writeback of the previous measurement's files during this one
    start = time.perf_counter()
    repartition(tree, board, parallel=parallel, progress=False)
    took = time.perf_counter() - start
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return took


def time_tar_copy(tree: Path, work: Path, tag: str) -> tuple[float, float]:
    """(seconds of `tar cf`, seconds of tar + a plain copy of the tar into a folder)."""
    tar, dest = work / f"tree-{tag}.tar", work / f"copy-{tag}"
    dest.mkdir()
    os.sync()
    start = time.perf_counter()
    subprocess.run(["tar", "cf", str(tar), "-C", str(tree), "train"], check=True)
    tarred = time.perf_counter() - start
    shutil.copyfile(tar, dest / tar.name)
    both = time.perf_counter() - start
    tar.unlink()
    shutil.rmtree(dest)
    return tarred, both


def run_rounds(trees: dict[int, Path], work: Path, rounds: int, against: str | None,
               threads: list[int]) -> dict[int, dict]:
    """Seconds per round: repartition (default threads), tar, tar + copy, `before` (REV), and at the
    largest size repartition with each of `threads` threads."""
    largest = max(trees)
    times: dict[int, dict[str, list[float]]] = {
        n: {"repartition": [], "tar": [], "tar_copy": [], "before": [],
            **{f"threads_{t}": [] for t in (threads if n == largest else [])}} for n in trees}
    for r in range(rounds):
        for n, tree in trees.items():
            times[n]["repartition"].append(time_repartition(tree, work, f"{n}-{r}"))
            for t in threads if n == largest else []:
                times[n][f"threads_{t}"].append(time_repartition(tree, work, f"{n}-{r}-t{t}", parallel=t))
            tarred, both = time_tar_copy(tree, work, f"{n}-{r}")
            times[n]["tar"].append(tarred)
            times[n]["tar_copy"].append(both)
            print(f"round {r + 1}: {n} categories: repartition {times[n]['repartition'][-1]:.2f} s, "
                  f"tar {tarred:.2f} s, tar + copy {both:.2f} s", flush=True)
        if against:
            from baseline import run_against

            old = run_against(against, Path(__file__).resolve(),
                              ["--only-repartition", "--rounds", "1", "--trees", str(work / "trees")])
            for n, row in old["sizes"].items():
                times[int(n)]["before"].append(row["repartition_s"])
            print(f"round {r + 1}, {against}: " + ", ".join(
                f"{n} categories {row['repartition_s']:.2f} s" for n, row in old["sizes"].items()), flush=True)
    return times


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="10,100,1000", help="categories per tree, comma-separated")
    ap.add_argument("--per-class", type=int, default=40, help="JPEGs per category")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2", help="at the largest size, also time these thread counts")
    ap.add_argument("--against", metavar="REV", help="also time repartition at commit REV, interleaved")
    ap.add_argument("--trees", help=argparse.SUPPRESS)  # reuse the trees of a parent run (--against)
    ap.add_argument("--only-repartition", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", help=argparse.SUPPRESS)  # bench/baseline.py: results there, no plot
    args = ap.parse_args(argv)
    os.environ.setdefault("PINSTORM_PROGRESS", "0")
    with tempfile.TemporaryDirectory(prefix="pinstorm-bench-repartition-") as tmp:
        work = Path(tmp)
        os.environ["PINSTORM_CONFIG"] = str(work / "config.yaml")
        os.environ["PINSTORM_CACHE"] = str(work / "cache")
        if args.trees:  # a baseline subprocess: time repartition only, on the parent's trees
            trees = {int(p.name.split("-")[1]): p for p in sorted(Path(args.trees).iterdir())}
            result = {"sizes": {n: {"repartition_s": round(time_repartition(t, work, str(n)), 3)}
                                for n, t in sorted(trees.items())}}
            Path(args.json_out).write_text(json.dumps(result))
            return result
        sizes = [int(n) for n in args.sizes.split(",")]
        start = time.perf_counter()
        pool = jpeg_pool()
        trees = {n: make_tree(work / "trees" / f"tree-{n}", n, args.per_class, pool) for n in sizes}
        print(f"trees generated in {time.perf_counter() - start:.1f} s", flush=True)
        threads = [int(t) for t in args.threads.split(",") if t]
        times = run_rounds(trees, work, args.rounds, args.against, threads)
        rows = []
        for n in sizes:
            images = n * args.per_class
            t = {k: statistics.median(v) for k, v in times[n].items() if v}
            row = {"categories": n, "images": images, "bytes": tree_bytes(trees[n]),
                   "repartition_s": round(t["repartition"], 3), "tar_s": round(t["tar"], 3),
                   "tar_copy_s": round(t["tar_copy"], 3),
                   "repartition_ms_per_image": round(1000 * t["repartition"] / images, 3),
                   "tar_copy_ms_per_image": round(1000 * t["tar_copy"] / images, 3),
                   "repartition_vs_tar_copy": round(t["repartition"] / t["tar_copy"], 2),
                   **{f"{k}_s": round(v, 3) for k, v in t.items() if k.startswith("threads_")},
                   "rounds": {k: [round(x, 3) for x in v] for k, v in times[n].items() if v}}
            if "before" in t:
                row.update(before_s=round(t["before"], 3),
                           before_ms_per_image=round(1000 * t["before"] / images, 3),
                           before_vs_tar_copy=round(t["before"] / t["tar_copy"], 2),
                           before_vs_after=round(t["before"] / t["repartition"], 2))
            rows.append(row)
    import importlib

    default = importlib.import_module("pinstorm.pipeline.repartition").PARALLEL.get("folder")
    result = {"per_class": args.per_class, "rounds": args.rounds, "cpus": os.cpu_count(), "default_threads": default,
              "against": args.against, "sizes": rows,
              "ms_per_image_vs_smallest": {r["categories"]: round(r["repartition_ms_per_image"]
                                                                  / rows[0]["repartition_ms_per_image"], 2)
                                           for r in rows}}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
        return result
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "repartition.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / "repartition.png")
    print(json.dumps([{k: r[k] for k in r if k != "rounds"} for r in rows], indent=2))
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["sizes"]
    n = [r["categories"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(n, [r["repartition_ms_per_image"] for r in rows], "o-", label="repartition")
    if all("before_ms_per_image" in r for r in rows):
        left.plot(n, [r["before_ms_per_image"] for r in rows], "x:", color="#c33",
                  label=f"repartition at {result['against']} (before)")
    left.plot(n, [r["tar_copy_ms_per_image"] for r in rows], "s--", label="tar cf + copy")
    left.set(xscale="log", yscale="log", xlabel="categories", ylabel="ms per image",
             title=f"Publishing a tree ({result['per_class']} JPEGs a category)")
    left.legend(fontsize=8)
    right.plot(n, [r["repartition_vs_tar_copy"] for r in rows], "o-", label="repartition / (tar + copy)")
    if all("before_vs_tar_copy" in r for r in rows):
        right.plot(n, [r["before_vs_tar_copy"] for r in rows], "x:", color="#c33", label="before")
    right.axhline(3, color="grey", lw=0.8, ls="--", label="goal: 3x")
    right.set(xscale="log", xlabel="categories", ylabel="x tar + copy", title="repartition against tar + copy")
    right.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
