"""Benchmark: large files, as the first step of an ImageNet run needs them (a ~155 GB archive).

1. `pin()` of one large file on a local board against a plain `shutil.copyfile` of it (the floor),
   same run, median of 3; and the most a private TMPDIR held meanwhile (sampled every 10 ms).
2. A download cut halfway (the connection drops) and fetched again, over HTTP: bytes sent by the
   server in all, against the file's size. Resuming sends the file once in all (half, then the
   other half); starting over would send 1.5x.

Writes bench/results/large_files.json and .png. `--quick`: 64 MB instead of 512 MB. `--against REV`
also runs both measurements on commit REV in the same run (bench/baseline.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the fault-injecting proxy
sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline.py


def _random_file(path: Path, size: int) -> Path:
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
    return path


class _TmpWatch:
    """The most bytes a folder held while the block ran."""

    def __init__(self, folder: Path):
        self.folder, self.peak, self._stop = folder, 0, threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            held = sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file() and not p.is_symlink())
            self.peak = max(self.peak, held)

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def pin_versus_copy(work: Path, size: int, repeat: int = 3) -> dict:
    from pinstorm.boards.backends.fs_board import local_board

    src = _random_file(work / "big.bin", size)
    copies, pins = [], []
    tmpdir = work / "tmpdir"  # a private TMPDIR, so the watch sees only what pin() puts there
    tmpdir.mkdir()
    saved, tempfile.tempdir = tempfile.tempdir, str(tmpdir)
    with _TmpWatch(tmpdir) as watch:
        for i in range(repeat):
            start = time.perf_counter()
            shutil.copyfile(src, work / f"copy{i}.bin")
            copies.append(time.perf_counter() - start)
            (work / f"copy{i}.bin").unlink()
            board = local_board(f"b{i}", work / f"board{i}", cache=work / f"cache{i}")
            start = time.perf_counter()
            board.pin(src, "big")
            pins.append(time.perf_counter() - start)
            shutil.rmtree(work / f"board{i}")
    tempfile.tempdir = saved
    copy_s, pin_s = statistics.median(copies), statistics.median(pins)
    out = {"bytes": size, "copy_s": round(copy_s, 3), "pin_s": round(pin_s, 3), "pin_vs_copy": round(pin_s / copy_s, 2),
           "peak_tmpdir_bytes": watch.peak}
    print(f"pin {size >> 20} MB: {pin_s:.2f} s against a plain copy {copy_s:.2f} s = {out['pin_vs_copy']}x; "
          f"TMPDIR peak {watch.peak:,} bytes", flush=True)
    return out


def resume_after_a_cut(work: Path, size: int) -> dict:
    from pinstorm import boards
    from pinstorm.boards.errors import DownloadError
    from servers.faults import FaultProxy

    src = _random_file(work / "resume.bin", size)
    board = boards.board_register("local", name="src", path=work / "served")
    board.pin(src, "big")
    sent: list[int] = []
    with boards.serve_board(work / "served") as url, FaultProxy(url) as proxy:
        proxy.truncate(r"/resume\.bin$", times=1)
        web = boards.board_register("datatxt", name="web", url=proxy.endpoint, cache=work / "web-cache")
        start = time.perf_counter()
        try:
            web.pin_get("big")
        except DownloadError:
            pass
        partial = [p for p in (work / "web-cache").rglob("resume.bin")]
        sent.append(size // 2)  # the proxy cut the body in half
        have = partial[0].stat().st_size if partial else 0
        web.pin_get("big")
        elapsed = time.perf_counter() - start
        ranges = [r for p, r in proxy.ranges if p.endswith("/resume.bin")]
    resumed = ranges[-1] == f"bytes={have}-"
    total = size // 2 + (size - have if resumed else size)
    out = {"bytes": size, "resumed_from": have, "range_header": ranges[-1], "bytes_sent": total,
           "sent_vs_size": round(total / size, 2), "restart_would_send": round((size // 2 + size) / size, 2),
           "seconds": round(elapsed, 2)}
    print(f"cut at {have:,} of {size:,} bytes, resumed with {ranges[-1]!r}: {total / size:.2f}x the file sent "
          f"(starting over: {out['restart_would_send']}x)", flush=True)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    p, old = result["pin"], result.get("baseline")
    names, values, colors = ["plain copy", "pin()"], [p["copy_s"], p["pin_s"]], ["#999", "#3a7"]
    if old:
        names.append(f"pin() at {old['rev']}")
        values.append(old["pin"]["pin_s"])
        colors.append("#c33")
    left.bar(names, values, color=colors)
    left.set(ylabel="seconds", title=f"Pinning {p['bytes'] >> 20} MB on a local board")
    r = result["resume"]
    right.bar(["resumed", "started over"], [r["sent_vs_size"], r["restart_would_send"]], color=["#3a7", "#999"])
    right.set(ylabel="bytes sent / file size", title="A download cut halfway, fetched again")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="64 MB instead of 512 MB")
    ap.add_argument("--against", metavar="REV", help="also measure commit REV in this run")
    ap.add_argument("--json-out", help=argparse.SUPPRESS)  # bench/baseline.py: results there, no plot
    args = ap.parse_args(argv)
    os.environ.setdefault("PINSTORM_PROGRESS", "0")
    size = (64 if args.quick else 512) << 20
    with tempfile.TemporaryDirectory(prefix="pinstorm-bench-large-", dir=str(Path(__file__).parent)) as tmp:
        work = Path(tmp)
        os.environ["PINSTORM_CONFIG"] = str(work / "config.yaml")
        os.environ["PINSTORM_CACHE"] = str(work / "cache")
        result = {"pin": pin_versus_copy(work, size), "resume": resume_after_a_cut(work, size), "quick": args.quick}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
        return result
    if args.against:
        from baseline import run_against

        print(f"--- the same on {args.against} ---", flush=True)
        result["baseline"] = {"rev": args.against,
                              **run_against(args.against, Path(__file__).resolve(), ["--quick"] if args.quick else [])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "large_files.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / "large_files.png")
    return result


if __name__ == "__main__":
    main()
