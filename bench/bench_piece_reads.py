"""Benchmark: reading one cached row group piece with pyarrow, through `part_pieces.PieceSource`.

A part cached by row group is read from its footer and one piece file per row group (`part_pieces`); pyarrow
reads it through `PieceSource`, a Python file object. pyarrow reads a column chunk with one ``read``; the
piece is now mapped into memory and that read gets a view of it (`VIEW_BYTES`), where `io.RawIOBase.read`
copied it twice (into a bytearray, then into bytes). Measured per row group, median of `--rounds` interleaved
rounds, CPU of this process: the piece through `PieceSource` as it is, the same with ``read`` as
`io.RawIOBase` does it (the copies, as before), and pyarrow reading the whole part file from its path.

Writes bench/results/piece_reads.json and .png. `--quick`: fewer reads.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PINSTORM_PROGRESS", "0")

RESULTS = ROOT / "bench" / "results"


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    from pinstorm.boards.safety.parquet_limits import BoundedParquetFile
    from pinstorm.pipeline import convert
    from pinstorm.pipeline.part_pieces import TAIL, PieceSource, footer_span, row_group_spans
    from pinstorm.pipeline.samples import make_imagenet_size_tree
    from pinstorm.pipeline.verify import CHECKSUMMED

    class CopyingPieceSource(PieceSource):
        """`PieceSource` with `io.RawIOBase`'s own ``read``: into a bytearray, then bytes (the code before)."""

        def read(self, size: int = -1):
            return io.RawIOBase.read(self, size)

    reads = 6 if args.quick else 30
    with tempfile.TemporaryDirectory(prefix="pinstorm-bench-piece-") as work:
        tree = make_imagenet_size_tree(Path(work) / "tree", classes=4, per_class=80, seed=0)
        convert(tree, str(Path(work) / "ds"), partitions=1, min_row_groups=2, seed=0, progress=False)
        (part,) = sorted(Path(work, "ds").glob("part-*.parquet"))
        size, data = part.stat().st_size, part.read_bytes()
        start, end = footer_span(data[-TAIL:], size, str(part))
        footer = data[start:end]
        spans = row_group_spans(footer, size, str(part))
        piece = Path(work) / "piece"
        piece.write_bytes(data[spans[0][0]:spans[0][1]])
        del data

        def through(kind):
            source = kind(size, str(part))
            source.add_bytes(size - len(footer), footer)
            handle = BoundedParquetFile(source, str(part), size=size)

            def one() -> int:
                source.add_file(*spans[0], piece)
                rows = handle.read_row_group(0, columns=list(CHECKSUMMED)).num_rows
                source.let_go()
                return rows
            return one

        local = BoundedParquetFile(str(part), str(part))
        ways = {"piece, mapped (now)": through(PieceSource), "piece, copied (before)": through(CopyingPieceSource),
                "whole part file from its path": lambda: local.read_row_group(0, columns=list(CHECKSUMMED)).num_rows}
        samples: dict[str, list[float]] = {way: [] for way in ways}
        for fn in ways.values():
            fn()   # first reads: untimed
        for round_ in range(args.rounds):
            order = list(ways)[round_ % len(ways):] + list(ways)[:round_ % len(ways)]
            for way in order:
                cpu = _cpu()
                for _ in range(reads):
                    ways[way]()
                samples[way].append(1000 * (_cpu() - cpu) / reads)
        rows = ways["whole part file from its path"]()
    medians = {way: round(statistics.median(v), 2) for way, v in samples.items()}
    report = {
        "benchmark": "piece_reads",
        "what": "one row group (image and label columns) read by pyarrow 14 through PieceSource from its cached "
                "piece file: mapped views (now) against RawIOBase's copying read (before) and the part file read "
                "from its path; CPU ms per row group",
        "config": {"row_group_bytes": spans[0][1] - spans[0][0], "rows": rows, "reads_per_round": reads,
                   "rounds": args.rounds, "quick": args.quick},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "cpu_ms_per_row_group": medians,
        "rounds": {way: [round(v, 2) for v in values] for way, values in samples.items()},
        "copied_vs_mapped": round(medians["piece, copied (before)"] / medians["piece, mapped (now)"], 2),
    }
    for way, value in medians.items():
        print(f"  {way:32s} {value:6.2f} ms CPU a row group of {report['config']['row_group_bytes'] / 1e6:.1f} MB")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "piece_reads.json").write_text(json.dumps(report, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (way, value) in enumerate(medians.items()):
        ax.bar(i, value, 0.6, color=["#2a7ab9", "#9ecae1", "#888888"][i])
        ax.plot([i] * len(samples[way]), samples[way], "k.")
    ax.set_xticks(range(len(medians)), list(medians), fontsize=8)
    ax.set_ylabel("CPU ms per row group")
    ax.set_title(f"a {report['config']['row_group_bytes'] / 1e6:.1f} MB row group ({rows} JPEGs) read by pyarrow; "
                 f"median of {args.rounds} interleaved rounds", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out / "piece_reads.png", dpi=110)
    print(f"wrote {args.out / 'piece_reads.json'} and .png")
    return report


if __name__ == "__main__":
    main()
