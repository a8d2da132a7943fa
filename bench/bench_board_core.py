"""Benchmark: what the board core costs per call, now and at an older commit in the same run.

The redesign (one Board over a Storage protocol, issue 18) must cost nothing on the hot paths:

1. a cached `pin_get` of a small JSON pin on a local board (verified by its stamp, read in place);
2. a cached `pin_get` through a data.txt board over HTTP (revalidating the index with the server);
3. one unbatched `pin()` of a small new pin onto a local board that already holds N pins.

Each is the median of many calls; the point is the ratio to the baseline commit (`--against REV`,
see bench/baseline.py), measured minutes apart on the same machine. Only the legacy API
(`board_register`, `pin`, `pin_get`) is used, so the same code runs on old and new commits.
Writes bench/results/board_core.json and .png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).parent))


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(quick: bool) -> dict:
    from pinstorm import boards

    repeat = 50 if quick else 300
    sizes = [10, 300] if quick else [10, 1000]
    out: dict = {"repeat": repeat}
    with tempfile.TemporaryDirectory(prefix="pinstorm-bench-core-") as tmp:
        work = Path(tmp)
        local = boards.board_register("local", name="core", path=work / "board", cache=work / "cache")
        local.pin({"a": 1}, "small")
        local.pin_get("small")
        out["cached_pin_get_local_ms"] = 1000 * _median(lambda: local.pin_get("small"), repeat)

        with boards.serve_board(work / "board") as url:  # pinstorm's own HTTP server, on 127.0.0.1
            web = boards.board_register("datatxt", name="web", url=url, cache=work / "web-cache")
            web.pin_get("small")
            out["cached_pin_get_http_ms"] = 1000 * _median(lambda: web.pin_get("small"), repeat)

        for n in sizes:
            board = boards.board_register("local", name=f"b{n}", path=work / f"b{n}", cache=work / f"c{n}")
            with boards.batch(board):
                for i in range(n):
                    board.pin({"i": i}, f"p{i:05d}")
            counter = iter(range(10**9))
            # a new pin each call: two versions of one pin in one second would wait for the next second
            out[f"pin_into_{n}_ms"] = 1000 * _median(lambda: board.pin({"x": 1}, f"fresh{next(counter)}"),
                                                     max(5, repeat // 10))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--against", metavar="REV", help="also measure commit REV in this run (bench/baseline.py)")
    ap.add_argument("--json-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    result = measure(args.quick)
    print(json.dumps(result, indent=2), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
        return result
    if args.against:
        from baseline import run_against

        print(f"--- the same on {args.against} ---", flush=True)
        base = run_against(args.against, Path(__file__).resolve(), ["--quick"] if args.quick else [])
        result["baseline"] = {"rev": args.against, **base}
        result["ratio_now_to_baseline"] = {k: round(v / base[k], 3) for k, v in result.items()
                                           if k.endswith("_ms") and base.get(k)}
        print(json.dumps(result["ratio_now_to_baseline"], indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "board_core.json").write_text(json.dumps(result, indent=2))
    _plot(result)
    return result


def _plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in result if k.endswith("_ms")]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    x = range(len(keys))
    ax.bar([i - 0.2 for i in x], [result[k] for k in keys], width=0.4, label="now")
    if "baseline" in result:
        ax.bar([i + 0.2 for i in x], [result["baseline"].get(k, 0) for k in keys], width=0.4,
               label=f"baseline {result['baseline']['rev']}")
    ax.set_xticks(list(x), [k.removesuffix("_ms").replace("_", " ") for k in keys], rotation=15, fontsize=8)
    ax.set_ylabel("ms per call (median)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "board_core.png", dpi=120)


if __name__ == "__main__":
    main()
