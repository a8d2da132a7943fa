"""Benchmark: what `repartition` costs against `tar cf` of the same tree + a plain copy of the tar.

Issue 36 found publishing ~30x slower than `tar` at 1,000 categories x 40 small JPEGs (19-25 s against
0.7 s). This measures, per tree size (10, 100 and 1,000 categories of `--per-class` JPEGs of
100-160 px, ~3-9 KB each, as the issue's run had):

1. `repartition(tree, local folder board)`: one zip pin per category + the categories pin, the
   default parallelism (`parallel=None`: worker processes from `PROCESS_MIN_IMAGES` images on, see
   `pinstorm.pipeline.repartition`), a fresh board each round; and with each of `--parallel`'s counts,
   which is how the default was chosen.
2. The baseline: `tar cf` of the same folder, then a plain copy of the tar into a folder (what
   "publishing" costs with no board at all).
3. The layout floor: the board `repartition` wrote (its folders, and files of the same sizes) written
   again with bare system calls, in one process. A pin is a folder with a version folder holding a zip
   and `data.txt`, and R 0.4.5's `r-legacy/data.txt` (docs/boards.md): on a disk where creating a file
   in a new folder is slow (this VM's ext4) that shape alone can cost more than `tar` of the tree, and
   `repartition / floor` is what pinstorm's own work adds.

Rounds are interleaved (size by size, each round starting one run further into the list), each measurement
starts after an `os.sync()` (no writeback of the previous one's files while it runs), and the median is
reported: seconds, ms per image, and ratios as the median of each round's ratio (repartition / (tar +
copy), before / after); also CPU seconds (this process and its children, workers and `tar` included),
steadier than wall time on a shared machine. Goals (issue 36):
the ratio within 3x, and ms per image flat from 10 to 1,000 categories.

`--against REV` also times `repartition` of commit REV (see bench/baseline.py) on the same trees,
one subprocess per size and round, right after this code's runs of that size, so "before" and "after"
come from the same run and minutes apart at most.

Writes bench/results/repartition.json and bench/results/repartition.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

# Nothing a measurement writes is deleted before the run ends. On ext4 without a journal (this VM's
# disk), allocating an inode skips every inode deleted in the last minute or more (the kernel's
# `recently_deleted` check), so creating files right after deleting thousands costs ~5x: deleting each
# board before the next measurement made every run pay for the one before it (a pin's folders and
# files took 1.6 s at 1,000 categories that way, 0.1-0.4 s without), and tar, which creates 2 files,
# not at all. A user publishing a tree pays this only after deleting thousands of files.
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


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def time_repartition(tree: Path, work: Path, tag: str, parallel: int | None = None,
                     layout: list | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `repartition` of `tree` into a fresh local folder board; the board's
    tree is appended to `layout` when it is given empty (see `board_tree`)."""
    from pinstorm.boards import board_folder
    from pinstorm.pipeline import repartition

    folder, cache = work / f"board-{tag}", work / f"cache-{tag}"
    board = board_folder(folder, cache=cache, name=f"b{tag}")
    os.sync()  # no writeback of the previous measurement's files during this one
    cpu, start = cpu_seconds(), time.perf_counter()
    repartition(tree, board, parallel=parallel, progress=False)
    took, used = time.perf_counter() - start, cpu_seconds() - cpu
    if layout is not None and not layout:
        layout += board_tree(folder)
    return took, used  # kept until the run ends (see the note on RESULTS)


def board_tree(folder: Path) -> list[tuple[str, int | None]]:
    """The board's folders (size None) and files (size in bytes), relative, parents first."""
    found = []
    for parent, dirs, files in os.walk(folder):
        rel = os.path.relpath(parent, folder)
        found += [(os.path.normpath(os.path.join(rel, d)), None) for d in sorted(dirs)]
        found += [(os.path.normpath(os.path.join(rel, f)), os.path.getsize(os.path.join(parent, f)))
                  for f in sorted(files)]
    return sorted(found, key=lambda entry: entry[0].split(os.sep))  # pin by pin, as repartition writes


def time_layout_floor(layout: list[tuple[str, int | None]], work: Path, tag: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of writing `layout` (a board's folders and files of the same sizes)
    with bare system calls, one process: what the board's shape alone costs on this disk, with none of
    pinstorm's work (reading images, zipping, hashing, YAML). A file of its own per pin in a folder of its
    own is what pins' layout asks for; on a disk slow to create a file in a new folder it costs more than
    `tar` of the whole tree."""
    dest = work / f"floor-{tag}"
    dest.mkdir()
    zeros = bytes(max((size or 0 for _, size in layout), default=0))
    os.sync()
    cpu, start = cpu_seconds(), time.perf_counter()
    for rel, size in layout:
        path = os.path.join(dest, rel)
        if size is None:
            os.mkdir(path)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, memoryview(zeros)[:size])
            finally:
                os.close(fd)
    return time.perf_counter() - start, cpu_seconds() - cpu


def time_tar_copy(tree: Path, work: Path, tag: str) -> tuple[float, float, float]:
    """(seconds of `tar cf`, seconds of tar + a plain copy of the tar into a folder, CPU seconds of both)."""
    tar, dest = work / f"tree-{tag}.tar", work / f"copy-{tag}"
    dest.mkdir()
    os.sync()
    cpu, start = cpu_seconds(), time.perf_counter()
    subprocess.run(["tar", "cf", str(tar), "-C", str(tree), "train"], check=True)
    tarred = time.perf_counter() - start
    shutil.copyfile(tar, dest / tar.name)
    both, used = time.perf_counter() - start, cpu_seconds() - cpu
    return tarred, both, used


def run_rounds(trees: dict[int, Path], work: Path, rounds: int, against: str | None,
               parallel: list[int]) -> dict[int, dict]:
    """Seconds per round: repartition (default parallelism) and its CPU seconds, the board's layout alone,
    repartition with each of `parallel`'s counts, tar, tar + copy and its CPU seconds, and `before` (REV).
    Each size starts with an untimed repartition (imports, the tree in the page cache, the layout to
    copy); each round starts one step further into the list of runs, so none is always first."""

    def record(key: str, took: float, used: float) -> None:
        times[n][key].append(took)
        times[n][f"{key}_cpu"].append(used)

    def default() -> None:
        record("repartition", *time_repartition(tree, work, f"{n}-{r}"))

    def floor() -> None:
        record("floor", *time_layout_floor(layouts[n], work, f"{n}-{r}"))

    def tar() -> None:
        tarred, both, used = time_tar_copy(tree, work, f"{n}-{r}")
        times[n]["tar"].append(tarred)
        record("tar_copy", both, used)

    def with_parallel(p: int):
        return lambda: record(f"parallel_{p}", *time_repartition(tree, work, f"{n}-{r}-p{p}", parallel=p))

    times: dict[int, dict[str, list[float]]] = {
        n: {"repartition": [], "repartition_cpu": [], "tar": [], "tar_copy": [], "tar_copy_cpu": [], "floor": [],
            "floor_cpu": [], "before": [], "before_cpu": [],
            **{f"parallel_{p}{cpu}": [] for p in parallel for cpu in ("", "_cpu")}} for n in trees}
    layouts: dict[int, list] = {n: [] for n in trees}  # each size's board, as the untimed run wrote it
    for n, tree in trees.items():
        time_repartition(tree, work, f"{n}-warm", layout=layouts[n])
    steps = [default, floor, *(with_parallel(p) for p in parallel), tar]
    for r in range(rounds):
        for n, tree in trees.items():
            for step in steps[r % len(steps):] + steps[:r % len(steps)]:
                step()
            line = (f"round {r + 1}: {n} categories: repartition {times[n]['repartition'][-1]:.2f} s "
                    f"({times[n]['repartition_cpu'][-1]:.2f} s CPU), its layout alone {times[n]['floor'][-1]:.2f} s, "
                    f"tar {times[n]['tar'][-1]:.2f} s, tar + copy {times[n]['tar_copy'][-1]:.2f} s")
            if against:  # right after this size's runs, so the pair sees the same load
                from baseline import run_against

                old = run_against(against, Path(__file__).resolve(),
                                  ["--only-repartition", "--sizes", str(n), "--trees", str(work / "trees"),
                                   "--work", str(work)])
                row = old["sizes"][str(n)]
                times[n]["before"].append(row["repartition_s"])
                times[n]["before_cpu"].append(row["repartition_cpu_s"])
                line += f", {against} {row['repartition_s']:.2f} s ({row['repartition_cpu_s']:.2f} s CPU)"
            print(line, flush=True)
    return times


def paired(times: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of a / b, each round's pair measured minutes apart at most."""
    return round(statistics.median(x / y for x, y in zip(times[a], times[b])), 2)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="10,100,1000", help="categories per tree, comma-separated")
    ap.add_argument("--per-class", type=int, default=40, help="JPEGs per category")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", default="1,2", help="also time repartition with these `parallel` counts")
    ap.add_argument("--against", metavar="REV", help="also time repartition at commit REV, interleaved")
    ap.add_argument("--work", help="folder for the trees, boards and tars (default: the system's temp folder); "
                                   "/dev/shm takes the disk's cost of creating files out")
    ap.add_argument("--name", default="repartition", help="results file name (bench/results/NAME.json)")
    ap.add_argument("--trees", help=argparse.SUPPRESS)  # reuse the trees of a parent run (--against)
    ap.add_argument("--only-repartition", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", help=argparse.SUPPRESS)  # bench/baseline.py: results there, no plot
    args = ap.parse_args(argv)
    os.environ.setdefault("PINSTORM_PROGRESS", "0")
    # a baseline subprocess leaves its files to the parent's folder, deleted when the whole run ends
    with (contextlib.nullcontext(tempfile.mkdtemp(prefix="baseline-", dir=args.work)) if args.trees else
          tempfile.TemporaryDirectory(prefix="pinstorm-bench-repartition-", dir=args.work)) as tmp:
        work = Path(tmp)
        os.environ["PINSTORM_CONFIG"] = str(work / "config.yaml")
        os.environ["PINSTORM_CACHE"] = str(work / "cache")
        if args.trees:  # a baseline subprocess: time repartition only, on the parent's trees
            wanted = {int(n) for n in args.sizes.split(",")}
            trees = {int(p.name.split("-")[1]): p for p in sorted(Path(args.trees).iterdir())
                     if int(p.name.split("-")[1]) in wanted}
            result = {"sizes": {n: dict(zip(("repartition_s", "repartition_cpu_s"),
                                            (round(x, 3) for x in time_repartition(t, work, str(n)))))
                                for n, t in sorted(trees.items())}}
            Path(args.json_out).write_text(json.dumps(result))
            return result
        sizes = [int(n) for n in args.sizes.split(",")]
        start = time.perf_counter()
        pool = jpeg_pool()
        trees = {n: make_tree(work / "trees" / f"tree-{n}", n, args.per_class, pool) for n in sizes}
        print(f"trees generated in {time.perf_counter() - start:.1f} s", flush=True)
        parallel = [int(p) for p in args.parallel.split(",") if p]
        times = run_rounds(trees, work, args.rounds, args.against, parallel)
        rows = []
        for n in sizes:
            images = n * args.per_class
            t = {k: statistics.median(v) for k, v in times[n].items() if v}
            row = {"categories": n, "images": images, "bytes": tree_bytes(trees[n]),
                   "repartition_s": round(t["repartition"], 3), "tar_s": round(t["tar"], 3),
                   "tar_copy_s": round(t["tar_copy"], 3),
                   "repartition_ms_per_image": round(1000 * t["repartition"] / images, 3),
                   "tar_copy_ms_per_image": round(1000 * t["tar_copy"] / images, 3),
                   "repartition_vs_tar_copy": paired(times[n], "repartition", "tar_copy"),
                   "layout_floor_s": round(t["floor"], 3), "layout_floor_cpu_s": round(t["floor_cpu"], 3),
                   "layout_floor_vs_tar_copy": paired(times[n], "floor", "tar_copy"),
                   "repartition_vs_layout_floor": paired(times[n], "repartition", "floor"),
                   "repartition_cpu_s": round(t["repartition_cpu"], 3), "tar_copy_cpu_s": round(t["tar_copy_cpu"], 3),
                   "repartition_cpu_vs_tar_copy_cpu": paired(times[n], "repartition_cpu", "tar_copy_cpu"),
                   "default_parallel": default_parallel(images),
                   **{f"{k}_s": round(v, 3) for k, v in t.items() if k.startswith("parallel_")},
                   "rounds": {k: [round(x, 3) for x in v] for k, v in times[n].items() if v}}
            if "before" in t:
                row.update(before_s=round(t["before"], 3), before_cpu_s=round(t["before_cpu"], 3),
                           before_ms_per_image=round(1000 * t["before"] / images, 3),
                           before_vs_tar_copy=paired(times[n], "before", "tar_copy"),
                           before_vs_after=paired(times[n], "before", "repartition"),
                           before_cpu_vs_after_cpu=paired(times[n], "before_cpu", "repartition_cpu"))
            rows.append(row)
    result = {"per_class": args.per_class, "rounds": args.rounds, "cpus": os.cpu_count(),
              "against": args.against, "work": args.work or tempfile.gettempdir(),
              "sizes": rows,
              "ms_per_image_vs_smallest": {r["categories"]: round(r["repartition_ms_per_image"]
                                                                  / rows[0]["repartition_ms_per_image"], 2)
                                           for r in rows}}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
        return result
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / f"{args.name}.png")
    print(json.dumps([{k: r[k] for k in r if k != "rounds"} for r in rows], indent=2))
    return result


def default_parallel(images: int) -> int:
    """What `repartition(parallel=None)` uses into a local folder for `images` images, here."""
    import importlib

    from pinstorm.boards import board_folder

    module = importlib.import_module("pinstorm.pipeline.repartition")
    with tempfile.TemporaryDirectory() as tmp:
        return module.default_parallel(board_folder(tmp, name="probe"), images=images)


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
    if all("parallel_1_s" in r for r in rows):
        left.plot(n, [1000 * r["parallel_1_s"] / r["images"] for r in rows], ".-", color="#888",
                  label="repartition, parallel=1")
    left.plot(n, [1000 * r["layout_floor_s"] / r["images"] for r in rows], "d-.", color="#a60",
              label="the board's folders and files alone (bare system calls)")
    left.plot(n, [r["tar_copy_ms_per_image"] for r in rows], "s--", label="tar cf + copy")
    left.set(xscale="log", yscale="log", xlabel="categories", ylabel="ms per image",
             title=f"Publishing a tree ({result['per_class']} JPEGs a category), in {result['work']}")
    left.legend(fontsize=8)
    right.plot(n, [r["repartition_vs_tar_copy"] for r in rows], "o-", label="repartition / (tar + copy)")
    if all("before_vs_tar_copy" in r for r in rows):
        right.plot(n, [r["before_vs_tar_copy"] for r in rows], "x:", color="#c33", label="before")
    right.plot(n, [r["repartition_cpu_vs_tar_copy_cpu"] for r in rows], "^--", color="#555",
               label="CPU seconds: repartition / (tar + copy)")
    right.plot(n, [r["layout_floor_vs_tar_copy"] for r in rows], "d-.", color="#a60",
               label="the board's layout alone / (tar + copy)")
    right.axhline(3, color="grey", lw=0.8, ls="--", label="goal: 3x")
    right.set(xscale="log", xlabel="categories", ylabel="x tar + copy", title="repartition against tar + copy")
    right.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
