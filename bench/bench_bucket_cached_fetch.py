"""Benchmark: `pin_get_many` of pins already in the cache, on an S3 board, as the pins grow (10 -> 1,000).

A slice of ImageNet already fetched (`imagenet_partition` run again, a second epoch's `convert
board://...`) used to cost one listing request a pin on a bucket board: 1,000 listings for 1,000
categories. Now the bucket board lists itself once for the call where its index says that is cheaper
(`BucketStorage.hold_index`). Measured on moto's S3 server in its own process (optionally with an
added latency a request, as a real bucket has), through a counting proxy: seconds and requests of a
warm `pin_get_many` of every pin, against the code of commit `--against` (default HEAD~1) on the same
server and pins in the same run, rounds interleaved, medians reported.

Writes bench/results/bucket_cached_fetch.json and .png (`--name`: another name). Kept runs:
`bucket_cached_fetch` (one listing, against a listing a pin) and `bucket_cached_fetch_cached_here`
(`--against` the commit before pins found in the cache were served in the calling thread, not 16).
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
sys.path.insert(0, str(ROOT / "tests"))  # the test servers (not ROOT: a baseline run imports its own pinstorm)
sys.path.insert(0, str(ROOT / "bench"))  # baseline.py
RESULTS = ROOT / "bench" / "results"
BUCKET = "cached-fetch"


def make_pins(endpoint: str, sizes: list[int], work: Path) -> None:
    """`max(sizes)` zipped pins of one small JPEG each, one board folder per size (`n<size>`)."""
    from pinstorm import boards
    from servers.s3 import KEY, SECRET

    src = work / "x.JPEG"
    for n in sizes:
        board = boards.board_s3(f"{BUCKET}/n{n}", endpoint_url=endpoint, key=KEY, secret=SECRET, create_bucket=True,
                                cache=work / "writer-cache", name=f"writer{n}")
        with board.batch():
            for i in range(n):
                src.write_bytes(b"\xff\xd8" + i.to_bytes(4, "big") * 200)
                board.store([src], name=f"n{i:08d}", zip=True)


def measure(endpoint: str, n: int, cache: Path) -> dict:
    """Seconds and requests of a warm `pin_get_many` of the `n` pins (the cache filled first, untimed)."""
    from pinstorm import boards
    from pinstorm.boards.parallel import pin_get_many
    from servers.faults import FaultProxy
    from servers.s3 import KEY, SECRET

    names = [f"n{i:08d}" for i in range(n)]
    with FaultProxy(endpoint) as proxy:
        board = boards.board_s3(f"{BUCKET}/n{n}", endpoint_url=proxy.endpoint, key=KEY, secret=SECRET,
                                cache=cache, name=f"reader{n}")
        pin_get_many(names, board=board)   # into the cache
        proxy.clear()
        start = time.perf_counter()
        got = pin_get_many(names, board=board)
        took = time.perf_counter() - start
        assert list(got) == names and all(len(paths) == 1 for paths in got.values())
        return {"seconds": took, "requests": len(proxy.log),
                "listings": sum(1 for m, p, _ in proxy.log if "list-type" in p)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="added to every request by the server")
    ap.add_argument("--against", default="HEAD~1", help="commit whose code is the baseline ('' for none)")
    ap.add_argument("--name", default="bucket_cached_fetch",
                    help="results as bench/results/NAME.json and .png (a run against another commit kept apart)")
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)  # a baseline subprocess: measure on this server
    ap.add_argument("--json-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("PINSTORM_PROGRESS", "0")
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="pinstorm-bench-cached-fetch-"))
    os.environ["PINSTORM_CONFIG"] = str(work / "config.yaml")
    try:
        if args.endpoint:
            out = {n: measure(args.endpoint, n, work / f"cache-{n}") for n in sizes}
            Path(args.json_out).write_text(json.dumps(out))
            return out
        from bench_parallel_fetch import ChildServer

        times: dict[int, dict[str, list]] = {n: {"after": [], "before": []} for n in sizes}
        with ChildServer("s3", latency_ms=args.latency_ms) as endpoint:
            start = time.perf_counter()
            make_pins(endpoint, sizes, work)
            print(f"pins stored in {time.perf_counter() - start:.1f} s", flush=True)
            for r in range(args.rounds):
                for n in sizes:
                    after = measure(endpoint, n, work / f"cache-{n}-{r}")
                    times[n]["after"].append(after)
                    line = f"round {r + 1}: {n} pins: {after['seconds']:.3f} s, {after['requests']} requests"
                    if args.against:
                        from baseline import run_against

                        before = run_against(args.against, Path(__file__).resolve(),
                                             ["--sizes", str(n), "--endpoint", endpoint])[str(n)]
                        times[n]["before"].append(before)
                        line += f"; {args.against}: {before['seconds']:.3f} s, {before['requests']} requests"
                    print(line, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for n in sizes:
        row: dict = {"pins": n}
        for label in ("after", "before"):
            runs = times[n][label]
            if runs:
                seconds = statistics.median(x["seconds"] for x in runs)
                row.update({f"{label}_s": round(seconds, 4), f"{label}_ms_per_pin": round(1000 * seconds / n, 3),
                            f"{label}_requests": statistics.median(x["requests"] for x in runs),
                            f"{label}_listings": statistics.median(x["listings"] for x in runs)})
        if times[n]["before"]:
            row["before_vs_after"] = round(statistics.median(
                b["seconds"] / a["seconds"] for a, b in zip(times[n]["after"], times[n]["before"])), 2)
        rows.append(row)
    result = {"benchmark": "bucket_cached_fetch", "against": args.against or None, "rounds": args.rounds,
              "latency_ms": args.latency_ms,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "what": "warm pin_get_many of every pin of an S3 board (moto, own process), seconds and requests",
              "results": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / f"{args.name}.png")
    print(json.dumps(rows, indent=2))
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    n = [r["pins"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(n, [r["after_ms_per_pin"] for r in rows], "o-", label="one listing of the board")
    right.plot(n, [r["after_requests"] for r in rows], "o-", label="one listing of the board")
    if all("before_s" in r for r in rows):
        left.plot(n, [r["before_ms_per_pin"] for r in rows], "x:", color="#c33",
                  label=f"a listing a pin ({result['against']})")
        right.plot(n, [r["before_requests"] for r in rows], "x:", color="#c33",
                   label=f"a listing a pin ({result['against']})")
    left.set(xscale="log", yscale="log", xlabel="cached pins fetched", ylabel="ms per pin",
             title=f"pin_get_many of cached pins, moto S3 (+{result['latency_ms']:g} ms a request)")
    right.set(xscale="log", yscale="log", xlabel="cached pins fetched", ylabel="requests", title="requests a call")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
