"""Benchmark: `board serve` under a slow-loris attack, against the same load without it.

The server (`serve_board` with its default limits) runs in its own process on 127.0.0.1 and serves
one small file. Two runs, each on a fresh server, interleaved and repeated:

* `without slow clients`: 200 well-behaved clients at once, each doing `rounds` GETs of the file,
  every GET on a fresh connection (`Connection: close`), one after another;
* `with slow clients`: the same, while 128 slow-loris clients (another process) hold connections:
  each sends a request line, then a header line a second and never ends its head; when the server
  drops it (the head's deadline, or replaced at the connection limit) it reconnects at once. Their
  starts are spread over the head deadline, so during the load some are always being cut off.

For each: the well-behaved clients' success rate (a 200 with the whole body within 30 s), their
latency p50 / p99 (connect to last byte; pooled over the repeats), and the ratio p99(with slow) /
p99(without). Goal: 100% success, ratio within 2x. At the default `max_connections` (128) the slow
clients fill the server and every newcomer must replace one; the same pair of runs at 512 (room for
everyone: does more capacity help?) is reported alongside. Loopback only, bounded in count and time (every request has a 30 s timeout,
every run a watchdog); it stops by itself.

Writes bench/results/serve_load.json and .png. `--quick`: 3 rounds, one repeat, no comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
BODY = bytes(range(256)) * 4  # the small file: 1 KiB
REQUEST_TIMEOUT = 30.0
RUN_WATCHDOG = 600.0


# ---- the server, in its own process (so it does not share the clients' GIL) ------------------------
def _server_main(folder: str, max_connections: int, queue, stop) -> None:
    from pinstorm.boards import serve

    with serve.serve_board(folder, max_connections=max_connections) as url:
        queue.put(url)
        stop.wait(RUN_WATCHDOG)


# ---- slow-loris clients, in their own process ----------------------------------------------------
async def _slow_client(i: int, port: int, interval: float, start_after: float, stop, stats: dict) -> None:
    await asyncio.sleep(start_after)
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            stats["connect errors"] += 1
            await asyncio.sleep(0.05)
            continue
        stats["connections"] += 1
        try:
            writer.write(b"GET /small.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(reader.read(65536), interval)
                except asyncio.TimeoutError:
                    writer.write(b"X-Slow-%d: 1\r\n" % i)
                    await writer.drain()
                    continue
                stats[f"answered {data[9:12].decode() or 'nothing'}"] += 1  # 408, 503, or a hang-up
                break
        except OSError:
            stats["dropped"] += 1
        finally:
            writer.close()


def _slow_main(port: int, count: int, interval: float, spread: float, ready, stop, queue) -> None:
    import collections

    async def run() -> dict:
        stats: dict = collections.defaultdict(int)
        tasks = [asyncio.create_task(_slow_client(i, port, interval, i * spread / count, stop, stats))
                 for i in range(count)]
        while stats["connections"] < count and not stop.is_set():
            await asyncio.sleep(0.05)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return dict(stats)

    queue.put(asyncio.run(run()))


# ---- well-behaved clients ------------------------------------------------------------------------
async def _get(port: int) -> tuple[bool, float, str]:
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), REQUEST_TIMEOUT)
        try:
            writer.write(b"GET /small.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            left = REQUEST_TIMEOUT - (time.perf_counter() - start)
            data = await asyncio.wait_for(reader.read(), max(left, 0.001))  # to the server's close
        finally:
            writer.close()
    except (OSError, asyncio.TimeoutError) as error:
        return False, time.perf_counter() - start, type(error).__name__
    status = data[9:12].decode("ascii", "replace") or "closed unanswered"
    return status == "200" and data.endswith(b"\r\n\r\n" + BODY), time.perf_counter() - start, status


async def _load(port: int, clients: int, rounds: int) -> list[tuple[bool, float, str]]:
    async def client() -> list[tuple[bool, float, str]]:
        return [await _get(port) for _ in range(rounds)]

    results = await asyncio.gather(*(client() for _ in range(clients)))
    return [r for per_client in results for r in per_client]


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run(folder: Path, slow: int, clients: int, rounds: int, interval: float, spread: float,
        max_connections: int) -> dict:
    """One run on a fresh server: the well-behaved clients' results, and the slow clients' events."""
    ctx = multiprocessing.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_server_main, args=(str(folder), max_connections, queue, stop), daemon=True)
    server.start()
    slow_process = None
    slow_stats: dict = {}
    try:
        url = queue.get(timeout=120)
        port = int(url.rsplit(":", 1)[1])
        if slow:
            ready, slow_stop, slow_queue = ctx.Event(), ctx.Event(), ctx.Queue()
            slow_process = ctx.Process(target=_slow_main, daemon=True,
                                       args=(port, slow, interval, spread, ready, slow_stop, slow_queue))
            slow_process.start()
            assert ready.wait(120 + spread), "the slow clients never all connected"
            time.sleep(2 * interval)  # every slow client is mid-head
        asyncio.run(_load(port, min(clients, 20), 1))  # warm-up, untimed
        start = time.perf_counter()
        results = asyncio.run(asyncio.wait_for(_load(port, clients, rounds), RUN_WATCHDOG))
        seconds = time.perf_counter() - start
        if slow_process is not None:
            slow_stop.set()
            slow_stats = slow_queue.get(timeout=60)
            slow_process.join(timeout=30)
    finally:
        stop.set()
        server.join(timeout=30)
        for process in (server, slow_process):
            if process is not None and process.is_alive():
                process.terminate()
    return {"results": results, "seconds": seconds, "slow_client_events": slow_stats}


def summarize(label: str, max_connections: int, slow: int, runs: list[dict]) -> dict:
    """Pooled over the repeats: success rate, latency percentiles, and a 200-point latency CDF."""
    results = [r for one in runs for r in one["results"]]
    latencies = sorted(seconds for _, seconds, _ in results)
    statuses: dict = {}
    for _, _, status in results:
        statuses[status] = statuses.get(status, 0) + 1
    ok = sum(1 for good, _, _ in results if good)
    per_run_p99 = [1000 * _percentile(sorted(s for _, s, _ in one["results"]), 0.99) for one in runs]
    row = {"run": label, "max_connections": max_connections, "slow_clients": slow, "repeats": len(runs),
           "requests": len(results), "ok": ok, "success_rate": ok / len(results),
           "p50_ms": 1000 * _percentile(latencies, 0.50), "p90_ms": 1000 * _percentile(latencies, 0.90),
           "p99_ms": 1000 * _percentile(latencies, 0.99), "max_ms": 1000 * latencies[-1],
           "p99_ms_per_repeat": [round(x, 1) for x in per_run_p99],
           "requests_per_s": len(results) / sum(one["seconds"] for one in runs), "statuses": statuses,
           "slow_client_events_per_repeat": [one["slow_client_events"] for one in runs] if slow else [],
           "cdf_ms": [round(1000 * _percentile(latencies, q / 200), 2) for q in range(201)]}
    print(f"  {label:22s} max_connections={max_connections:<4d} {ok}/{len(results)} ok "
          f"({100 * row['success_rate']:.1f}%), p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms "
          f"(per repeat {row['p99_ms_per_repeat']}), max {row['max_ms']:.0f} ms, {row['requests_per_s']:.0f} req/s",
          flush=True)
    return row


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(13, 4.6))
    default = report["config"]["max_connections"]
    for row in rows:
        color = "#e39b2d" if row["slow_clients"] else "#2a7ab9"
        style = "-" if row["max_connections"] == default else ":"
        cdf.plot(row["cdf_ms"], [q / 200 for q in range(201)], color=color, ls=style,
                 label=f"{row['run']}, max_connections={row['max_connections']} ({100 * row['success_rate']:.1f}% ok)")
    cdf.set_xscale("log")
    cdf.set_xlabel("latency of one GET on a fresh connection, ms (log)")
    cdf.set_ylabel("fraction of requests")
    cdf.axhline(0.99, color="#999999", lw=0.8, ls=":")
    cdf.legend(loc="lower right", fontsize=7)
    cdf.set_title("well-behaved clients' latency (pooled over repeats)", fontsize=9)
    labels = [f"{row['run']}\nmax_connections={row['max_connections']}" for row in rows]
    x = list(range(len(rows)))
    p50 = [row["p50_ms"] for row in rows]
    p99 = [row["p99_ms"] for row in rows]
    bars.bar([i - 0.2 for i in x], p50, width=0.4, label="p50", color="#88b04b")
    bars.bar([i + 0.2 for i in x], p99, width=0.4, label="p99", color="#c0504d")
    for i in x:
        bars.text(i - 0.2, p50[i], f"{p50[i]:.0f}", ha="center", va="bottom", fontsize=8)
        bars.text(i + 0.2, p99[i], f"{p99[i]:.0f}", ha="center", va="bottom", fontsize=8)
    bars.set_xticks(x, labels, fontsize=7)
    bars.set_ylabel("ms")
    bars.legend(fontsize=8)
    ratios = ", ".join(f"{r:.2f}x at {c}" for c, r in report["p99_ratio_by_max_connections"].items())
    bars.set_title(f"p99 with / without slow clients: {ratios} (goal <= 2x)", fontsize=9)
    c = report["config"]
    fig.suptitle(f"board serve on 127.0.0.1: {c['clients']} clients x {c['rounds']} GETs of 1 KiB (x{c['repeats']} "
                 f"repeats), with and without {c['slow_clients']} slow-loris clients ({report['machine']['cpus']} CPUs)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 rounds, one repeat, no comparison")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--slow", type=int, default=128, help="slow-loris clients in the second run")
    ap.add_argument("--rounds", type=int, default=None, help="GETs per client per run (default 10)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats of each run (default 3)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between a slow client's header lines")
    ap.add_argument("--max-connections", type=int, default=None, help="the server's limit (default: its own)")
    ap.add_argument("--compare-max-connections", type=int, default=512, help="also run at this limit (0: no)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 10)
    repeats = args.repeats or (1 if args.quick else 3)

    from pinstorm.boards import serve

    max_connections = args.max_connections or serve.MAX_CONNECTIONS
    capacities = [max_connections]
    if not args.quick and args.compare_max_connections and args.compare_max_connections != max_connections:
        capacities.append(args.compare_max_connections)
    spread = serve.HEADER_TIMEOUT  # slow clients' starts, so their deadlines fall all through the load
    rows = []
    with tempfile.TemporaryDirectory(prefix="pinstorm-bench-serve-") as tmp:
        folder = Path(tmp)
        (folder / "small.bin").write_bytes(BODY)
        print(f"{args.clients} clients x {rounds} GETs, {args.slow} slow clients, {repeats} repeat(s), "
              f"max_connections {capacities}", flush=True)
        for capacity in capacities:
            runs: dict = {0: [], args.slow: []}
            for _ in range(repeats):  # interleaved: a load that changes over time hits both alike
                for slow in runs:
                    runs[slow].append(run(folder, slow, args.clients, rounds, args.interval, spread, capacity))
            rows += [summarize("without slow clients", capacity, 0, runs[0]),
                     summarize("with slow clients", capacity, args.slow, runs[args.slow])]
    ratios = {}
    for capacity in capacities:
        without, with_slow = (r for r in rows if r["max_connections"] == capacity)
        ratios[capacity] = with_slow["p99_ms"] / without["p99_ms"]
    main_rows = [r for r in rows if r["max_connections"] == max_connections]
    report = {
        "benchmark": "serve_load",
        "what": "well-behaved clients (a fresh connection per GET of a 1 KiB file) against board serve, with and "
                "without slow-loris clients holding connections (a header line a second, reconnecting when dropped)",
        "config": {"clients": args.clients, "rounds": rounds, "repeats": repeats, "slow_clients": args.slow,
                   "slow_interval_s": args.interval, "slow_start_spread_s": spread,
                   "max_connections": max_connections, "compared_max_connections": capacities[1:],
                   "header_timeout_s": serve.HEADER_TIMEOUT, "idle_timeout_s": serve.IDLE_TIMEOUT,
                   "request_timeout_s": REQUEST_TIMEOUT, "quick": args.quick},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "goal": "100% success in both runs; p99 with slow clients within 2x of p99 without",
        "p99_ratio": ratios[max_connections],
        "p99_ratio_by_max_connections": ratios,
        "goal_met": all(r["success_rate"] == 1.0 for r in main_rows) and ratios[max_connections] <= 2.0,
        "results": rows,
    }
    print(f"p99 with / without slow clients: {', '.join(f'{r:.2f}x at {c}' for c, r in ratios.items())}; "
          f"goal met (max_connections={max_connections}): {report['goal_met']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_load.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "serve_load.png")
    print(f"wrote {args.out / 'serve_load.json'} and .png")
    return report


if __name__ == "__main__":
    main()
