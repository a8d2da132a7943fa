"""How the readers' epoch planning and resume state grow from 10 to 21,841 categories (ImageNet-21k).

Both readers (`make_dataset`, `make_torch_loader`) plan an epoch from the row counts alone
(`pipeline.positions`): the epoch's row-group order, then the sample IDs through a seeded shuffle
buffer (`stream_ids`); `planned_rows` hands out each row in that order with a bool per row of
bookkeeping; a resume state (`state_dict`) carries a packed bitmap of consumed rows, and resuming on
another layout (`consumed_by`) recomputes what every old stream had received. None of it reads images,
so the shapes here are generated: one row group per category, ImageNet's ~1,281 rows per category
(12.8 k rows at 10 categories, 1.28 M at 1,000) and ~650 at 21,841 (14.2 M rows, ImageNet-21k).

Each shape runs in a fresh process (its peak memory is its own). Reported per shape: seconds and
microseconds per row (or per row group) of each step, the state's JSON size and the peak resident
memory. Writes bench/results/epoch_plan.json and bench/results/epoch_plan.png.

    .venv/bin/python bench/bench_epoch_plan.py [--quick]    # --quick: without the 14.2 M-row shape
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((10, 1281), (1000, 1281), (21841, 650))   # (categories = row groups, rows per row group)


def make_info(groups: int, rows_per_group: int) -> dict:
    """The metadata `pipeline.positions` plans from: 16 row groups per part, ~110 KB per row."""
    rows = [rows_per_group] * groups
    files = {f"part-{p:05d}.parquet": {"row_groups": min(16, groups - 16 * p), "bytes": 110_000 * rows_per_group * 16}
             for p in range((groups + 15) // 16)}
    return {"rows": sum(rows), "row_groups": groups, "row_group_rows": rows, "files": files,
            "bytes": 110_000 * sum(rows)}


class _Location:
    url = "generated://epoch-plan"


class PlannedSource:
    """What `planned_rows` reads from: row groups of empty stand-in bytes (the planning is measured, not
    reading; `epochs.EpochSource` supplies real ones)."""

    def __init__(self, info: dict, seed: int = 7, shard=None):
        self.info, self.base_seed, self.shard, self.location = info, seed, shard, _Location()
        self.where = self.location.url

    def row_groups(self, order):
        import numpy as np

        for g in order:
            rows = self.info["row_group_rows"][g]
            yield g, ([b""] * rows, np.zeros(rows, dtype=np.int32))


def _timed(fn):
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def measure(groups: int, rows_per_group: int) -> dict:
    """Every step at one shape, in this process."""
    import itertools

    import numpy as np

    from pinstorm.pipeline.epochs import epoch_order, epoch_seed, shard_row_groups
    from pinstorm.pipeline.positions import (Position, consumed_by, info_digest, planned_rows, resume_position,
                                             state_dict, stream_ids, stream_length)

    info = make_info(groups, rows_per_group)
    rows, every = info["rows"], list(range(groups))
    seed = epoch_seed(7, 0)
    out: dict = {"row_groups": groups, "rows": rows}

    def ids(**kw):
        return stream_ids(info, kw.pop("groups", every), seed=seed, shuffle_buffer=None, **kw)

    for name, kw in (("stream_ids_shuffled", dict(shuffle=True)), ("stream_ids_in_order", dict(shuffle=False)),
                     ("stream_ids_one_of_2_shards", dict(shuffle=True, groups=shard_row_groups(info, (0, 2)))),
                     ("stream_ids_one_of_2_workers", dict(shuffle=True, split=(0, 2)))):
        out[name], count = _timed(lambda: sum(1 for _ in ids(**kw)))
        out[name + "_rows"] = count
    out["stream_length"], _ = _timed(lambda: stream_length(info, every, seed=seed, shuffle=True))

    source = PlannedSource(info)
    order = epoch_order(every, seed, True)
    out["planned_rows_whole_epoch"], delivered = _timed(lambda: sum(1 for _ in planned_rows(
        source, ids(shuffle=True), order, skip=0, consumed=None, where="bench", epoch=0)))
    assert delivered == rows

    half = rows // 2
    position = Position({0: (0, half)})
    consumed = np.zeros(rows, dtype=bool)
    consumed[: rows // 4] = True                         # a layout change earlier in this epoch
    position.consumed = {0: consumed}
    out["state_dict"], state = _timed(lambda: state_dict(source, position, shuffle=True, shuffle_buffer=None,
                                                         num_workers=0, streams=1))
    text = json.dumps(state)
    out["state_json_bytes"] = len(text)
    out["resume_same_layout"], _ = _timed(lambda: resume_position(json.loads(text), PlannedSource(info), shuffle=True,
                                                                  shuffle_buffer=None, num_workers=0, streams=1))
    two = []
    for index in range(2):   # 2 ranks, each halfway through its shard: resumed by 1
        shard_source = PlannedSource(info, shard=(index, 2))
        two.append(state_dict(shard_source, Position({0: (0, len(shard_row_groups(info, (index, 2)))
                                                             * rows_per_group // 2)}),
                              shuffle=True, shuffle_buffer=None, num_workers=0, streams=1))
    out["consumed_by_2_ranks_to_1"], resumed = _timed(lambda: consumed_by(two, info, 1))
    out["consumed_by_rows_skipped"] = int(resumed.consumed[0].sum())
    out["info_digest"], _ = _timed(lambda: info_digest(info))
    out["skip_half_an_epoch"], _ = _timed(lambda: sum(1 for _ in itertools.islice(
        planned_rows(source, ids(shuffle=True), order, skip=half, consumed=None, where="bench", epoch=0), 1)))
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


PER_ROW = ("stream_ids_shuffled", "stream_ids_in_order", "planned_rows_whole_epoch", "state_dict",
           "resume_same_layout", "consumed_by_2_ranks_to_1", "skip_half_an_epoch")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="without the 14.2 M-row shape")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--one", nargs=2, type=int, help=argparse.SUPPRESS)   # one shape's own process
    args = parser.parse_args(argv)
    if args.one:
        print("SHAPE" + json.dumps(measure(*args.one)))
        return 0
    shapes = SHAPES[:2] if args.quick else SHAPES
    points = []
    for groups, per_group in shapes:
        done = subprocess.run([sys.executable, __file__, "--one", str(groups), str(per_group)], capture_output=True,
                              text=True, check=True)
        point = json.loads(done.stdout.rsplit("SHAPE", 1)[1])
        point["us_per_row"] = {k: round(1e6 * point[k] / point["rows"], 3) for k in PER_ROW}
        point["us_per_row_group"] = {"info_digest": round(1e6 * point["info_digest"] / groups, 3),
                                     "stream_length": round(1e6 * point["stream_length"] / groups, 3)}
        points.append(point)
        print(f"{groups:>6} categories, {point['rows']:>10,} rows: " + ", ".join(
            f"{k} {v:.2f} us" for k, v in point["us_per_row"].items()) + f"; state {point['state_json_bytes']:,} B, "
            f"peak {point['peak_rss_mb']} MB", flush=True)
    first, last = points[0], points[-1]
    growth = {k: round(last["us_per_row"][k] / first["us_per_row"][k], 2) for k in PER_ROW}
    results = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                           "load_average": round(os.getloadavg()[0], 2)},
               "shapes": points, "per_row_growth_first_to_last": growth}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "epoch_plan.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "epoch_plan.png")
    print("per-row cost, largest shape / smallest:", growth)
    print(f"wrote {args.out / 'epoch_plan.json'} and {args.out / 'epoch_plan.png'}")
    return 0


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = results["shapes"]
    rows = [p["rows"] for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in PER_ROW:
        left.loglog(rows, [p[name] for p in points], marker="o", label=name)
        right.semilogx(rows, [p["us_per_row"][name] for p in points], marker="o", label=name)
    left.set_xlabel("rows (10, 1,000, 21,841 categories)")
    left.set_ylabel("seconds")
    left.set_title("total time", fontsize=10)
    right.set_xlabel("rows")
    right.set_ylabel("microseconds per row")
    right.set_title("per row: flat is the goal", fontsize=10)
    right.set_ylim(bottom=0)
    left.legend(fontsize=7)
    fig.suptitle("epoch planning and resume state (pipeline.positions), one process per shape", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
