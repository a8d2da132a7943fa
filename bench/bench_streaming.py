"""Benchmark: a dataset 4x larger than the part cache, streamed from S3 (moto) by 1 and 4 local ranks.

A converted dataset of ImageNet-size JPEGs (`samples.make_imagenet_size_tree`, ~110 KB each; parts of one
row group) is uploaded to moto's S3 server (its own process). Each rank is a process reading its shard with
`make_torch_loader(..., stream=True, cache_limit=dataset / 4)`, all ranks sharing one cache folder, for 2
epochs; the same ranks then read the same dataset from local disk (no cache). Measured:

* peak cache bytes: the cache folder polled every few ms by this process (parts and downloads in flight),
  and the largest total the cache's own accounting saw (parts + reservations); both must stay <= the limit;
* part bytes fetched per epoch (the cache's counters, summed over ranks), against the dataset's bytes;
* images/s of all ranks together (images / wall time of the epoch), streamed against local disk, and
  streamed with every ranged read through s3fs (``PINSTORM_RANGED_READS=fsspec``), as before
  `pipeline.ranged_reads`: `--rounds` interleaved rounds, each streamed run from a cold cache, the median kept;
* rows alone (read and verified, nothing decoded), in this process: what the server and the cache deliver;
* a dataset that fits (cache_limit = 2 x the dataset), one rank: part fetches in epoch 2 (must be 0).

Writes bench/results/streaming.json and .png (`--name`: another name). `--quick`: 160 images in 16 parts.
`--per-class 256`: parts of ~8.8 MB instead of ~2.2 MB, nearer ImageNet's 32 MB row groups: a fetch's fixed
cost (a request, a file, a ledger entry) then weighs 4x less an image (`streaming_8mb_parts.json`); with
`--parts 8 --ranks 1` too, parts of ~35 MB, ImageNet's row group size (`streaming_32mb_parts.json`; the cache
then holds two parts, so 4 ranks would each get less than one). `--content-checks`: also the same streamed
runs with each row group piece checked by reading its content again, as before `convert` recorded checksums
of row groups' bytes (a copy of the dataset without them; only parts cached by row group differ).
`--server-nice 19`: the S3 server at the lowest CPU priority, so that it takes only the cycles the readers
leave, nearer an object store on other machines than a server sharing these cores at equal weight.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PINSTORM_PROGRESS", "0")

RESULTS = ROOT / "bench" / "results"
BUCKET = "streaming"
EPOCHS = 2


# ---- one rank (a subprocess) -------------------------------------------------------------------
def rank_main(spec: dict) -> None:
    import torch  # noqa: F401 (imported before the clock starts)

    from pinstorm.pipeline import make_torch_loader, part_cache

    rank, ranks = spec["rank"], spec["ranks"]
    loader = make_torch_loader(spec["url"], batch_size=32, image_size=spec["image_size"], seed=0, num_epochs=1,
                               shard=(rank, ranks) if ranks > 1 else None, storage_options=spec["options"],
                               stream=spec["stream"], cache_limit=spec["limit"])
    Path(spec["ready"]).touch()
    while not Path(spec["go"]).exists():
        time.sleep(0.005)
    epochs = []
    for epoch in range(EPOCHS):
        part_cache.reset_counters()
        loader.dataset.set_epoch(epoch)
        start, images, cpu = time.time(), 0, _cpu_seconds()
        for batch, _ in loader:
            images += len(batch)
        counters = part_cache.COUNTERS
        epochs.append({"start": start, "end": time.time(), "images": images, "cpu": _cpu_seconds() - cpu,
                       "fetched_bytes": counters.fetched_bytes,
                       "fetches": counters.fetches, "hits": counters.hits, "evicted": counters.evicted,
                       "peak_bytes": counters.peak_bytes})
    print(json.dumps(epochs))


def _cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its children that ended (DataLoader workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _server_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def run_ranks(url: str, ranks: int, *, stream: bool, limit: int | None, options: dict, cache: Path, work: Path,
              image_size: int, server_pid: int | None = None, presigned: bool = True) -> dict:
    """Start `ranks` rank processes, release them together, poll the cache folder; per-epoch totals, and the
    CPU seconds the ranks and the server (`server_pid`, over both epochs) spent."""
    go = work / f"go-{time.monotonic_ns()}"
    specs = [{"rank": r, "ranks": ranks, "url": url, "stream": stream, "limit": limit, "options": options,
              "ready": str(work / f"ready-{go.name}-{r}"), "go": str(go), "image_size": image_size}
             for r in range(ranks)]
    env = {**os.environ, "PINSTORM_CACHE": str(cache), "LOCAL_WORLD_SIZE": str(ranks), "OMP_NUM_THREADS": "1",
           "PINSTORM_RANGED_READS": "auto" if presigned else "fsspec"}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", json.dumps(s)], env=env, stdout=subprocess.PIPE,
                              text=True) for s in specs]
    while not all(Path(s["ready"]).exists() for s in specs):
        if any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError("a rank failed to start")
        time.sleep(0.01)
    peak, stop = [0], threading.Event()

    def poll() -> None:
        parts = cache / "parts"
        while not stop.is_set():
            total = 0
            for folder in (parts.iterdir() if parts.is_dir() else ()):
                if folder.is_dir() and not folder.name.startswith("."):
                    for f in folder.iterdir():
                        if not f.name.endswith(".lock"):
                            try:
                                total += f.stat().st_size
                            except FileNotFoundError:
                                pass
            peak[0] = max(peak[0], total)
            time.sleep(0.003)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    server_cpu = _server_cpu(server_pid)
    go.touch()
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode:
            raise RuntimeError(f"a rank failed ({p.returncode})")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    server_cpu = _server_cpu(server_pid) - server_cpu
    stop.set()
    watcher.join()
    epochs = []
    for e in range(EPOCHS):
        rows = [o[e] for o in outs]
        seconds = max(r["end"] for r in rows) - min(r["start"] for r in rows)
        epochs.append({"epoch": e, "images": sum(r["images"] for r in rows), "seconds": round(seconds, 3),
                       "img_per_s": round(sum(r["images"] for r in rows) / seconds, 1),
                       "fetched_bytes": sum(r["fetched_bytes"] for r in rows),
                       "fetches": sum(r["fetches"] for r in rows), "hits": sum(r["hits"] for r in rows),
                       "evicted": sum(r["evicted"] for r in rows),
                       "cpu_ms_per_img": round(1000 * sum(r["cpu"] for r in rows) / sum(r["images"] for r in rows), 3),
                       "accounted_peak_bytes": max(r["peak_bytes"] for r in rows)})
    images = sum(e["images"] for e in epochs)
    return {"epochs": epochs, "polled_peak_bytes": peak[0], "server_cpu_ms_per_img": round(1000 * server_cpu / images, 3)}


# ---- the benchmark ---------------------------------------------------------------------------------
def cpu_bound(row: dict) -> dict:
    """Where the cores bound streamed / local: when reading from local disk keeps every core busy, streaming
    can reach at most local CPU / (streamed readers' CPU + the server's) an image, or, with the object store
    on other machines, local CPU / streamed readers' CPU."""
    local, streamed = row["reader_cpu_ms_per_img"]["local"], row["reader_cpu_ms_per_img"]["streamed"]
    return {"local_cores_busy": round(local * row["local_img_per_s"] / 1000 / (os.cpu_count() or 1), 3),
            "cpu_bound_vs_local": round(local / (streamed + row["server_cpu_ms_per_img"]), 3),
            "cpu_bound_vs_local_server_elsewhere": round(local / streamed, 3)}


def _renice(pid: int, niceness: int) -> None:
    """Every thread of process `pid` at `niceness` (Linux sets it per thread; threads started later inherit
    their starter's)."""
    import psutil

    for thread in psutil.Process(pid).threads():
        os.setpriority(os.PRIO_PROCESS, thread.id, niceness)


def _upload_without_byte_checksums(local: Path, copy: Path, fs) -> str:
    """A copy of the dataset at `local` whose metadata lacks the checksums of its row groups' bytes, as
    an older pinstorm wrote it, uploaded next to it; its URL."""
    from pinstorm.pipeline.metadata import read_info, write_common_metadata
    from pinstorm.pipeline.storage import resolve

    shutil.copytree(local, copy)
    info = read_info(resolve(str(copy))).to_dict()
    for entry in info["files"].values():
        entry.pop("row_group_bytes_xxh3", None)
    write_common_metadata(resolve(str(copy)), info, {n: e["row_groups"] for n, e in info["files"].items()})
    fs.put(str(copy) + "/", f"{BUCKET}/{copy.name}/", recursive=True)
    return f"s3://{BUCKET}/{copy.name}"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    labels = [f"{r['ranks']} rank{'s' if r['ranks'] > 1 else ''}" for r in rows]
    ax = axes[0]
    for i, r in enumerate(rows):
        ax.bar(i - 0.27, r["local_img_per_s"], 0.27, color="#888888", label="local disk" if i == 0 else None)
        ax.bar(i, r["stream_img_per_s"], 0.27, color="#2a7ab9", label="streamed (epoch 2)" if i == 0 else None)
        ax.text(i, r["stream_img_per_s"], f"{r['stream_vs_local']:.2f}x", ha="center", va="bottom", fontsize=8)
        if "cpu_bound_vs_local" in r:   # the most these cores allow (`cpu_bound`)
            ax.plot([i - 0.13, i + 0.13], [r["cpu_bound_vs_local"] * r["local_img_per_s"]] * 2, "k-", lw=2,
                    label="CPU bound: local CPU / (streamed + server CPU)" if i == 0 else None)
        if "s3fs_reads_img_per_s" in r:
            ax.bar(i + 0.27, r["s3fs_reads_img_per_s"], 0.27, color="#9ecae1",
                   label="streamed, reads through s3fs" if i == 0 else None)
        if "content_checks_img_per_s" in r:
            ax.bar(i + 0.54, r["content_checks_img_per_s"], 0.27, color="#e39b2d",
                   label="streamed, row groups checked by content" if i == 0 else None)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("images/s, all ranks")
    ax.set_title("throughput (cache = dataset / 4)")
    ax.set_ylim(0, 1.6 * max(r["local_img_per_s"] for r in rows))
    ax.legend(fontsize=6, loc="upper left")
    ax = axes[1]
    for i, r in enumerate(rows):
        for e, ratio in enumerate(r["fetched_per_epoch_vs_dataset"]):
            ax.bar(i + (e - 0.5) * 0.4, ratio, 0.4, color=["#2a7ab9", "#e39b2d"][e],
                   label=f"epoch {e + 1}" if i == 0 else None)
    ax.axhline(1.05, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("part bytes fetched / dataset bytes")
    ax.set_title("bytes fetched per epoch (goal <= 1.05)")
    ax.legend(fontsize=8)
    ax = axes[2]
    for i, r in enumerate(rows):
        ax.bar(i, r["polled_peak_bytes"] / r["cache_limit"], 0.5, color="#2a7ab9")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("peak cache bytes / cache_limit")
    ax.set_title("peak cache size (must be <= 1)")
    fits = report["fits"]
    fig.suptitle(f"stream=True from moto S3: {report['config']['images']} JPEGs, rows alone "
                 f"{report['read_only']['streamed']['mb_per_s']:.0f} MB/s streamed, "
                 f"{report['read_only']['local']['mb_per_s']:.0f} local; "
                 f"{report['config']['dataset_bytes'] / 1e6:.1f} MB in {report['config']['parts']} parts; a dataset "
                 f"that fits: epoch 2 fetched {fits['epoch2_fetches']} parts ({os.cpu_count()} CPUs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="160 images in 16 parts")
    ap.add_argument("--rank", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--per-class", type=int, default=None, help="images per class (10 classes)")
    ap.add_argument("--parts", type=int, default=None)
    ap.add_argument("--image-size", type=int, default=224, help="the loader's output size")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the run of median images/s is kept")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default="streaming", help="the results' file name, without .json")
    ap.add_argument("--ranks", default="1,4", help="local rank counts to run, comma-separated")
    ap.add_argument("--server-nice", type=int, default=0, help="the S3 server's niceness (every thread)")
    ap.add_argument("--content-checks", action="store_true",
                    help="also stream a copy without row groups' byte checksums (row groups checked by content)")
    args = ap.parse_args(argv)
    if args.rank is not None:
        rank_main(json.loads(args.rank))
        return {}
    per_class = args.per_class or (16 if args.quick else 64)
    parts = args.parts or (16 if args.quick else 32)

    import s3fs

    from bench_parallel_fetch import ChildServer
    from pinstorm.pipeline import convert
    from pinstorm.pipeline.epochs import open_epochs
    from pinstorm.pipeline.metadata import read_info
    from pinstorm.pipeline.samples import make_imagenet_size_tree
    from pinstorm.pipeline.storage import resolve
    from tests.servers.s3 import KEY, SECRET

    work = Path(tempfile.mkdtemp(prefix="pinstorm-bench-streaming-"))
    try:
        t0 = time.perf_counter()
        tree = make_imagenet_size_tree(work / "tree", classes=10, per_class=per_class, seed=0)
        local = work / "ds"
        convert(tree, str(local), partitions=parts, min_row_groups=parts, seed=0, progress=False)
        info = read_info(resolve(str(local)))
        dataset_bytes = sum(e["bytes"] for e in info["files"].values())
        limit = dataset_bytes // 4
        print(f"dataset: {info['rows']} images, {dataset_bytes / 1e6:.1f} MB in {len(info['files'])} parts; "
              f"cache_limit {limit / 1e6:.2f} MB (built in {time.perf_counter() - t0:.1f} s)", flush=True)
        server = ChildServer("s3")
        with server as endpoint:
            if args.server_nice:
                _renice(server.process.pid, args.server_nice)
            options = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET}
            fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
            fs.mkdir(BUCKET)
            fs.put(str(local) + "/", f"{BUCKET}/ds/", recursive=True)
            url = f"s3://{BUCKET}/ds"
            kinds = ["local", "streamed", "s3fs"]
            urls = {"streamed": url, "s3fs": url}
            if args.content_checks:   # as a dataset written before row groups' byte checksums
                kinds.append("content")
                urls["content"] = _upload_without_byte_checksums(local, work / "ds-content", fs)
            rows = []
            for ranks in [int(r) for r in args.ranks.split(",")]:
                cache = work / f"cache-{ranks}"
                runs: dict[str, list] = {kind: [] for kind in kinds}
                for round_ in range(args.rounds):   # interleaved, each round in another order (no kind always
                    # first after another); each streamed run starts with the cache cold
                    for kind in kinds[round_ % len(kinds):] + kinds[:round_ % len(kinds)]:
                        if kind == "local":
                            runs["local"].append(run_ranks(str(local), ranks, stream=False, limit=None, options=None,
                                                           cache=cache, work=work, image_size=args.image_size))
                            continue
                        shutil.rmtree(cache, ignore_errors=True)
                        runs[kind].append(run_ranks(
                            urls[kind], ranks, stream=True, limit=limit, options=options, cache=cache, work=work,
                            image_size=args.image_size, server_pid=server.process.pid,
                            presigned=kind == "streamed"))
                shutil.rmtree(cache, ignore_errors=True)

                def rate(run):
                    return max(e["img_per_s"] for e in run["epochs"]) if not run["epochs"][0]["fetches"] \
                        else run["epochs"][-1]["img_per_s"]

                def median_run(kind):   # the run of median images/s (epoch 2 streamed, the best epoch local)
                    return sorted(runs[kind], key=rate)[len(runs[kind]) // 2]

                base, streamed, before = median_run("local"), median_run("streamed"), median_run("s3fs")
                local_rate = rate(base)
                row = {"ranks": ranks, "cache_limit": limit, "dataset_bytes": dataset_bytes,
                       "polled_peak_bytes": streamed["polled_peak_bytes"],
                       "accounted_peak_bytes": max(e["accounted_peak_bytes"] for e in streamed["epochs"]),
                       "fetched_per_epoch_vs_dataset": [round(e["fetched_bytes"] / dataset_bytes, 3)
                                                        for e in streamed["epochs"]],
                       "local_img_per_s": local_rate, "stream_img_per_s": streamed["epochs"][-1]["img_per_s"],
                       "stream_epochs": streamed["epochs"], "local_epochs": base["epochs"]}
                row["stream_vs_local"] = round(row["stream_img_per_s"] / local_rate, 3)
                row["rounds_img_per_s"] = {kind: [rate(run) for run in runs[kind]] for kind in runs}
                # the same streamed runs with every ranged read through s3fs: the before/after of `ranged_reads`
                row["s3fs_reads_img_per_s"] = rate(before)
                row["presigned_vs_s3fs_reads"] = round(row["stream_img_per_s"] / rate(before), 3)
                row["s3fs_reads_reader_cpu_ms_per_img"] = before["epochs"][-1]["cpu_ms_per_img"]
                row["s3fs_reads_server_cpu_ms_per_img"] = before["server_cpu_ms_per_img"]
                # where the time goes on a machine with few cores: the readers' own CPU an image, local and
                # streamed (epoch 2), and the S3 server's, which shares the cores here and not in production
                row["reader_cpu_ms_per_img"] = {"local": base["epochs"][-1]["cpu_ms_per_img"],
                                                "streamed": streamed["epochs"][-1]["cpu_ms_per_img"]}
                row["server_cpu_ms_per_img"] = streamed["server_cpu_ms_per_img"]
                row.update(cpu_bound(row))
                if args.content_checks:   # the same streamed runs, row group pieces checked by reading them again
                    content = median_run("content")
                    row["content_checks_img_per_s"] = rate(content)
                    row["byte_vs_content_checks"] = round(row["stream_img_per_s"] / rate(content), 3)
                    row["content_checks_reader_cpu_ms_per_img"] = content["epochs"][-1]["cpu_ms_per_img"]
                    print(f"  {ranks} rank(s): row groups checked by content {rate(content):.0f} img/s "
                          f"({row['byte_vs_content_checks']:.2f}x), reader CPU ms/img "
                          f"{row['content_checks_reader_cpu_ms_per_img']}", flush=True)
                rows.append(row)
                print(f"  {ranks} rank(s): peak cache {row['polled_peak_bytes'] / 1e6:.2f} MB of "
                      f"{limit / 1e6:.2f}; fetched/dataset per epoch {row['fetched_per_epoch_vs_dataset']}; "
                      f"{row['stream_img_per_s']:.0f} img/s streamed vs {local_rate:.0f} local "
                      f"({row['stream_vs_local']:.2f}x; reads through s3fs {rate(before):.0f} img/s, "
                      f"{row['presigned_vs_s3fs_reads']:.2f}x); reader CPU ms/img {row['reader_cpu_ms_per_img']}, "
                      f"server {row['server_cpu_ms_per_img']}", flush=True)
            # the rows alone (read and verified, nothing decoded): what the cache and the server can deliver
            read_only = {}
            streamed_kw = dict(stream=True, cache_limit=limit, storage_options=options)
            for label, where, kw in (("local", str(local), {}), ("streamed", url, streamed_kw)) + (
                    (("streamed_content_checks", urls["content"], streamed_kw),) if args.content_checks else ()):
                shutil.rmtree(work / "cache-read-only", ignore_errors=True)
                os.environ["PINSTORM_CACHE"] = str(work / "cache-read-only")
                source = open_epochs(where, None, shuffle=True, seed=0, **kw)
                start = time.perf_counter()
                rows_read = sum(len(labels) for e in range(EPOCHS) for _, labels in source(e))
                seconds = time.perf_counter() - start
                read_only[label] = {"rows_per_s": round(rows_read / seconds, 1),
                                    "mb_per_s": round(EPOCHS * dataset_bytes / 1e6 / seconds, 1)}
            print(f"  rows only (no decode): {read_only}", flush=True)
            cache = work / "cache-fits"
            fits_run = run_ranks(url, 1, stream=True, limit=2 * dataset_bytes, options=options, cache=cache, work=work,
                                 image_size=args.image_size)
            fits = {"cache_limit": 2 * dataset_bytes, "epochs": fits_run["epochs"],
                    "epoch2_fetches": fits_run["epochs"][1]["fetches"],
                    "epoch2_fetched_bytes": fits_run["epochs"][1]["fetched_bytes"]}
            print(f"  a dataset that fits: epoch 1 fetched {fits_run['epochs'][0]['fetches']} parts, epoch 2 "
                  f"{fits['epoch2_fetches']} ({fits['epoch2_fetched_bytes']} bytes)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "streaming",
        "what": "make_torch_loader(stream=True) from moto S3 with cache_limit = dataset / 4, 2 epochs, 1 and 4 "
                "local ranks sharing one cache (sharded), against the same ranks reading local disk",
        "config": {"images": info["rows"], "parts": len(info["files"]), "dataset_bytes": dataset_bytes,
                   "cache_limit": limit, "epochs": EPOCHS, "image_size": args.image_size, "quick": args.quick,
                   "rounds": args.rounds, "content_checks": args.content_checks,
                   "server_nice": args.server_nice},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "results": rows,
        "read_only": read_only,
        "fits": fits,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / f"{args.name}.png")
    print(f"wrote {args.out / args.name}.json and .png")
    return report


if __name__ == "__main__":
    main()
