"""Benchmark: fetch + extract a partition of many small zipped pins, one at a time vs in parallel.

A partition of an ImageNet-like data set (default 64 pins, each a zip of ~1 MB of JPEGs made from
scikit-learn's sample photos) is served two ways, each server in its own process so it does not
share the client's GIL: a local board folder over HTTP (the Range-honouring handler of
`boards.serve`, read as a `datatxt` board; once with `max-age=60` on its files, once with
`max-age=0`) and an S3 bucket (moto's server, read as an `s3` board). For each, from a cold cache:

* `sequential`      pin_get_many(parallel=1): one pin after another (= a pin_get loop)
* `threads:N`       pin_get_many(parallel=N)
* `processes:2`     pin_get_many(parallel="processes:2") (forkserver workers, board pickled)
* `raw fsspec copy` the same zip files with one parallel fsspec `get` (transfer only: no metadata,
                    no verification, no extraction) - the floor for moving these bytes
* `pins-python`     (HTTP only) pins-python's `board_url(...).pin_download` loop over the same files
                    (download only, no extraction)

Writes bench/results/parallel_fetch.json and .png. `--quick` runs a small partition once.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PINSTORM_PROGRESS", "0")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

RESULTS = ROOT / "bench" / "results"
BUCKET = "imagenet-partition"


# ---- data -------------------------------------------------------------------------------------
def make_partition(folder: Path, pins: int, images: int, seed: int = 0) -> list[str]:
    """`pins` category folders of `images` noisy JPEG crops (~75 KB each) of real photos."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_image

    photos = [load_sample_image("china.jpg"), load_sample_image("flower.jpg")]
    rng = np.random.default_rng(seed)
    names = []
    for p in range(pins):
        wnid = f"n{1440764 + p:08d}"
        out = folder / wnid
        out.mkdir(parents=True)
        for i in range(images):
            photo = photos[(p + i) % 2]
            y, x = rng.integers(0, photo.shape[0] - 300), rng.integers(0, photo.shape[1] - 400)
            crop = photo[y:y + 300, x:x + 400].astype(np.int16) + rng.normal(0, 8, (300, 400, 3)).astype(np.int16)
            Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)).save(out / f"{wnid}_{i}.JPEG", quality=90)
        names.append(wnid)
    return names


# ---- servers in their own processes -----------------------------------------------------------
def _server_main(kind: str, folder: str, max_age: int, latency: float, queue, stop) -> None:
    if kind == "s3":
        from tests.servers.s3 import S3Server

        with S3Server() as server:
            queue.put(server.endpoint)
            stop.wait()
    else:
        import functools
        import threading
        from http.server import ThreadingHTTPServer

        from pinstorm.boards.serve import RangeRequestHandler

        # boards.serve_board's handler (Range, ETag, max-age), with two socket settings every
        # production web server has and serve_board (as of this writing) lacks:
        # * a listen backlog of 128: the default of 5 drops the SYNs of a parallel client's 6th+
        #   connection, which then waits the kernel's 1 s retransmit (16 parallel GETs: 1.2 s, not 0.02 s);
        # * TCP_NODELAY: headers and body go out in two writes, and Nagle + the client's delayed ACK
        #   stall each small response ~40 ms (a data.txt GET: 43 ms instead of <1 ms).
        class Server(ThreadingHTTPServer):
            request_queue_size = 128
            daemon_threads = True

            def handle_error(self, request, client_address):  # clients closing idle connections
                if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
                    super().handle_error(request, client_address)

        class Handler(RangeRequestHandler):
            disable_nagle_algorithm = True

            def send_head(self):
                time.sleep(latency)  # a remote store's time to first byte
                return super().send_head()

        Handler.max_age = max_age
        handler = Handler
        server = Server(("127.0.0.1", 0), functools.partial(handler, directory=folder))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        queue.put(f"http://127.0.0.1:{server.server_address[1]}")
        stop.wait()
        server.shutdown()


class ChildServer:
    def __init__(self, kind: str, folder: Path | None = None, max_age: int = 0, latency_ms: float = 0):
        ctx = multiprocessing.get_context("spawn")
        self.queue, self.stop_event = ctx.Queue(), ctx.Event()
        self.process = ctx.Process(target=_server_main, daemon=True,
                                   args=(kind, str(folder or ""), max_age, latency_ms / 1000, self.queue,
                                         self.stop_event))

    def __enter__(self) -> str:
        self.process.start()
        return self.queue.get(timeout=120)

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.terminate()


# ---- measurements -----------------------------------------------------------------------------
def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def check_result(result: dict, names: list[str], images: int) -> None:
    assert list(result) == names, "pins missing from the result"
    for name, paths in result.items():
        assert len(paths) == images and all(Path(p).is_file() for p in paths), f"{name}: incomplete extraction"


def run_scenarios(server: str, make_board, names: list[str], images: int, zip_urls: list[str], raw_fs,
                  scratch: Path, repeats: int, modes: list[str], pins_python) -> list[dict]:
    from pinstorm.boards.parallel import pin_get_many

    rows = []
    warm = scratch.with_name("warm-up")
    pin_get_many(names[:2], board=make_board(warm), parallel=1)  # imports, first connections: untimed
    shutil.rmtree(warm, ignore_errors=True)

    def record(method: str, fn) -> None:
        times = []
        for r in range(repeats):
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            times.append(timed(lambda: fn(scratch)))
        rows.append({"server": server, "method": method, "seconds": min(times), "all_seconds": times})
        print(f"  {server:22s} {method:16s} {min(times):7.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times)})",
              flush=True)

    for mode in modes:
        parallel = 1 if mode == "sequential" else mode

        def fetch(cache: Path, parallel=parallel) -> None:
            board = make_board(cache)
            check_result(pin_get_many(names, board=board, parallel=parallel), names, images)

        record(mode, fetch)

    def raw_copy(cache: Path) -> None:
        # every transfer at once on fsspec's event loop (fs.get(list, list) would first expand each
        # path with extra requests, which is not the cost of moving the bytes)
        from fsspec.asyn import _run_coros_in_chunks, sync

        targets = [str(cache / f"{i}.zip") for i in range(len(zip_urls))]
        coros = [raw_fs._get_file(u, t) for u, t in zip(zip_urls, targets)]
        sync(raw_fs.loop, _run_coros_in_chunks, coros, batch_size=32)
        assert all(Path(t).stat().st_size > 0 for t in targets)

    if raw_fs is not None:
        record("raw fsspec copy", raw_copy)
    if pins_python is not None:
        record("pins-python", pins_python)
    return rows


def pins_python_runner(base_url: str, names: list[str], versions: dict[str, str]):
    try:
        import pins
    except ImportError:
        return None

    def run(cache: Path) -> None:
        os.environ["PINS_CACHE_DIR"] = str(cache)  # board_url takes its cache folder from here only
        board = pins.board_url(base_url, {n: f"{n}/{versions[n]}/{n}.zip" for n in names})
        for n in names:
            assert Path(board.pin_download(n)[0]).is_file()

    return run


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(dict.fromkeys(r["server"] for r in rows))
    ncols = 2
    nrows = (len(servers) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(12, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(servers):]:
        ax.set_visible(False)
    for ax, server in zip(axes.flat, servers):
        sub = [r for r in rows if r["server"] == server]
        seq = next(r["seconds"] for r in sub if r["method"] == "sequential")
        labels = [r["method"] for r in sub]
        secs = [r["seconds"] for r in sub]
        colors = ["#888888" if m == "sequential" else "#2a7ab9" if m.startswith(("threads", "processes"))
                  else "#e39b2d" for m in labels]
        bars = ax.barh(labels[::-1], secs[::-1], color=colors[::-1])
        for bar, s in zip(bars, secs[::-1]):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {s:.2f}s ({seq / s:.1f}x)",
                    va="center", fontsize=8)
        ax.set_xlabel("seconds, cold cache (lower is better); (n x) = speed-up over sequential")
        ax.set_title(f"{server}")
        ax.set_xlim(0, max(secs) * 1.35)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 pins of 6 images, one run each")
    ap.add_argument("--pins", type=int, default=None)
    ap.add_argument("--images", type=int, default=None, help="JPEGs per pin (~75 KB each)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--latency-ms", type=float, default=20.0, help="time to first byte of the HTTP server")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    pins = args.pins or (16 if args.quick else 64)
    images = args.images or (6 if args.quick else 12)
    repeats = args.repeats or (1 if args.quick else 2)
    modes = ["sequential", "threads:4", "threads:8", "threads:16", "processes:2"]

    import fsspec
    import s3fs

    from pinstorm import boards
    from pinstorm.boards.backends.datatxt_board import DatatxtBoard
    from tests.servers.s3 import KEY, SECRET

    work = Path(tempfile.mkdtemp(prefix="pinstorm-bench-"))
    try:
        t0 = time.perf_counter()
        names = make_partition(work / "src", pins, images)
        source = boards.board_register("local", name="bench-src", path=work / "board")
        for n in names:
            source.pin(work / "src" / n, n, zip=True, description=f"ImageNet category {n}")
        versions = {n: source.pin_versions(n)["version"].iloc[-1] for n in names}
        zips = [work / "board" / n / versions[n] / f"{n}.zip" for n in names]
        total_bytes = sum(z.stat().st_size for z in zips)
        print(f"partition: {pins} pins x {images} JPEGs, {total_bytes / 1e6:.1f} MB zipped "
              f"(built in {time.perf_counter() - t0:.1f} s)", flush=True)
        rows: list[dict] = []

        def http_panel(label, latency_ms, max_age, modes, baselines, reps):
            with ChildServer("http", work / "board", max_age=max_age, latency_ms=latency_ms) as url:
                return run_scenarios(
                    label, lambda cache: DatatxtBoard("bench-http", url=url, cache=cache), names, images,
                    [f"{url}/{n}/{versions[n]}/{n}.zip" for n in names],
                    fsspec.filesystem("http", skip_instance_cache=True) if baselines else None,
                    work / "scratch", reps, modes, pins_python_runner(url, names, versions) if baselines else None)

        # a static server 20 ms away that lets clients keep its data.txt for a minute (GCS serves
        # public objects with max-age=3600); the same on localhost with no latency (the overhead
        # floor); and 20 ms away demanding revalidation of data.txt on every read (max-age=0)
        rows += http_panel(f"http {args.latency_ms:g} ms", args.latency_ms, 60, modes, True, repeats)
        rows += http_panel("http 0 ms", 0, 60, ["sequential", "threads:8"], True, repeats)
        rows += http_panel(f"http {args.latency_ms:g} ms, max-age=0", args.latency_ms, 0,
                           ["sequential", "threads:8"], False, 1)

        with ChildServer("s3") as endpoint:
            opts = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET}
            uploader = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
            uploader.mkdir(BUCKET)
            uploader.put(str(work / "board") + "/", f"{BUCKET}/boards/", recursive=True)
            rows += run_scenarios(
                "s3 (moto)", lambda cache: boards.board_register("s3", name="bench-s3", bucket=BUCKET, path="boards",
                                                          cache=cache, **opts),
                names, images, [f"{BUCKET}/boards/{n}/{versions[n]}/{n}.zip" for n in names],
                s3fs.S3FileSystem(skip_instance_cache=True, **opts), work / "scratch", repeats, modes, None)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for server in dict.fromkeys(r["server"] for r in rows):  # ratios within each server
        sub = [r for r in rows if r["server"] == server]
        seq = next(r["seconds"] for r in sub if r["method"] == "sequential")
        raw = next((r["seconds"] for r in sub if r["method"] == "raw fsspec copy"), None)
        for r in sub:
            r.update(mb_per_s=round(total_bytes / 1e6 / r["seconds"], 2), pins_per_s=round(pins / r["seconds"], 2),
                     speedup_vs_sequential=round(seq / r["seconds"], 2),
                     time_vs_raw_copy=round(r["seconds"] / raw, 2) if raw else None)
    report = {
        "benchmark": "parallel_fetch",
        "what": "cold-cache fetch + extract of a partition of zipped JPEG pins; baselines: sequential "
                "pin_get, one parallel fsspec get of the same zips (transfer only), pins-python board_url",
        "config": {"pins": pins, "images_per_pin": images, "zipped_bytes": total_bytes, "repeats": repeats,
                   "best_of": repeats, "quick": args.quick},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "results": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parallel_fetch.json").write_text(json.dumps(report, indent=2))
    plot(rows, args.out / "parallel_fetch.png",
         f"pin_get_many: {pins} zipped pins, {total_bytes / 1e6:.0f} MB, fetch + extract, cold cache "
         f"({os.cpu_count()} CPUs; best of {repeats})")
    print(f"wrote {args.out / 'parallel_fetch.json'} and .png")
    return report


if __name__ == "__main__":
    main()
