"""Benchmark: what one ranged read of a part costs the reading process, through s3fs and by a presigned GET.

The part cache (`pipeline.part_cache`) downloads each part by ranged reads (of `ranged_reads.BLOCK` bytes where a
read comes back in memory, else one read a part), writes them to the cache file and feeds them to the part's
xxh3 as they arrive. This does the same for parts of
2.2 MB (the streaming bench's default), 8.8 MB (its ``--per-class 256``) and 32 MB (ImageNet's row groups)
on moto's S3 server (its own process), with the two readers of `pipeline.ranged_reads`: `FsspecReads` (s3fs,
aiobotocore on fsspec's event-loop thread) and `PresignedS3Reads` (urllib3, read into the file a buffer at
a time). Measured per part, median of `--rounds` interleaved rounds: CPU of this process (every thread),
CPU of the server, wall time.

Writes bench/results/ranged_reads.json and .png. `--quick`: fewer reads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

RESULTS = ROOT / "bench" / "results"
BUCKET = "ranged-reads"
BEFORE = "presigned, readinto"   # the presigned reader's body loop before `_copy_body` (`readinto_reads`)
SIZES = {"2.2 MB": 2_200_000, "8.8 MB": 8_800_000, "32 MB": 32_000_000}


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _server_cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def download(reads, path: str, size: int, target: Path) -> str:
    """What `PartCache._fetch` does with a part: ranged reads into a file, hashed on the way."""
    import xxhash

    digest = xxhash.xxh3_128()
    with open(target, "wb") as out:
        def take(data: memoryview) -> None:
            out.write(data)
            digest.update(data)

        reads.read(path, 0, size, take)
    return digest.hexdigest()


def readinto_reads(fs):
    """The presigned reader as it was before `PresignedS3Reads._copy_body`: the body read with urllib3's
    ``readinto`` into one reused buffer (the baseline of ``presigned``, same run)."""
    from pinstorm.pipeline.ranged_reads import BUFFER, PresignedS3Reads, _ca_bundle

    class ReadintoReads(PresignedS3Reads):
        @staticmethod
        def _copy_body(response, take) -> None:
            buffer = bytearray(BUFFER)
            view = memoryview(buffer)
            while count := response.readinto(buffer):
                take(view[:count])

    return ReadintoReads(fs, _ca_bundle(fs))


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    labels = list(SIZES)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "client_cpu_ms_per_mb", "reader's CPU per MB (all its threads)"),
                           (axes[1], "wall_ms_per_mb", "wall time per MB (one read at a time)")):
        for offset, (reader, color) in zip((-0.27, 0, 0.27), (("s3fs", "#9ecae1"), (BEFORE, "#6baed6"),
                                                               ("presigned", "#2a7ab9"))):
            values = [next(r[key] for r in rows if r["size"] == label and r["reader"] == reader) for label in labels]
            ax.bar([i + offset for i in range(len(labels))], values, 0.27, color=color, label=reader)
        ax.set_xticks(range(len(labels)), [f"parts of {label}" for label in labels])
        ax.set_ylabel("ms per MB")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"a part's download into the cache (write + xxh3 included), moto S3 on the same "
                 f"{os.cpu_count()} CPUs; median of {report['config']['rounds']} interleaved rounds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer reads per size")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    import s3fs
    import xxhash

    from bench_parallel_fetch import ChildServer
    from pinstorm.pipeline.ranged_reads import FsspecReads, PresignedS3Reads, reads_for
    from tests.servers.s3 import KEY, SECRET

    mb_per_run = 40 if args.quick else 180   # each (size, reader) run reads about this many MB
    rows = []
    server = ChildServer("s3")
    with tempfile.TemporaryDirectory(prefix="pinstorm-bench-ranged-") as work, server as endpoint:
        server_pid = server.process.pid
        fs = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=endpoint, key=KEY, secret=SECRET)
        fs.mkdir(BUCKET)
        readers = {"s3fs": FsspecReads(fs), BEFORE: readinto_reads(fs), "presigned": reads_for(fs, f"{BUCKET}/probe")}
        assert isinstance(readers["presigned"], PresignedS3Reads), "moto's endpoint should be read presigned"
        target = Path(work) / "part"
        samples: dict[tuple[str, str], list[dict]] = {}
        for label, size in SIZES.items():
            data = os.urandom(size)
            fs.pipe_file(f"{BUCKET}/{label}", data)
            expected = xxhash.xxh3_128(data).hexdigest()
            count = max(3, round(mb_per_run * 1e6 / size))
            for reader in readers.values():   # first connections, imports: untimed
                assert download(reader, f"{BUCKET}/{label}", size, target) == expected
            for round_ in range(args.rounds):
                order = list(readers) if round_ % 2 == 0 else list(readers)[::-1]
                for name in order:
                    cpu, server, wall = _cpu(), _server_cpu(server_pid), time.perf_counter()
                    for _ in range(count):
                        download(readers[name], f"{BUCKET}/{label}", size, target)
                    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
                    server = _server_cpu(server_pid) - server
                    samples.setdefault((label, name), []).append(
                        {"client_cpu_ms": 1000 * cpu / count, "server_cpu_ms": 1000 * server / count,
                         "wall_ms": 1000 * wall / count})
            for name in readers:
                runs = samples[(label, name)]
                row = {"size": label, "bytes": size, "reader": name, "reads_per_run": count}
                for key in ("client_cpu_ms", "server_cpu_ms", "wall_ms"):
                    row[key] = round(statistics.median(r[key] for r in runs), 2)
                    row[key.replace("_ms", "_ms_per_mb")] = round(row[key] / (size / 1e6), 3)
                row["client_cpu_ms_runs"] = [round(r["client_cpu_ms"], 2) for r in runs]
                rows.append(row)
            s3fs_row, before_row, signed_row = rows[-3], rows[-2], rows[-1]
            print(f"  {label:7s} per part: reader CPU {s3fs_row['client_cpu_ms']:.1f} ms through s3fs, "
                  f"{before_row['client_cpu_ms']:.1f} presigned readinto, "
                  f"{signed_row['client_cpu_ms']:.1f} presigned ({s3fs_row['client_cpu_ms'] / signed_row['client_cpu_ms']:.1f}x); "
                  f"server {s3fs_row['server_cpu_ms']:.1f} / {signed_row['server_cpu_ms']:.1f}; wall "
                  f"{s3fs_row['wall_ms']:.1f} / {signed_row['wall_ms']:.1f} ms", flush=True)
    report = {
        "benchmark": "ranged_reads",
        "what": "one part downloaded as the part cache does (ranged reads, written to a file, "
                "xxh3 on the way) from moto S3: through s3fs against a presigned GET read with urllib3 (its body by read(n), and by readinto as before)",
        "config": {"sizes": SIZES, "rounds": args.rounds, "quick": args.quick},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "results": rows,
        "s3fs_vs_presigned_client_cpu": {label: round(
            next(r["client_cpu_ms"] for r in rows if r["size"] == label and r["reader"] == "s3fs")
            / next(r["client_cpu_ms"] for r in rows if r["size"] == label and r["reader"] == "presigned"), 2)
            for label in SIZES},
        "readinto_vs_read_client_cpu": {label: round(
            next(r["client_cpu_ms"] for r in rows if r["size"] == label and r["reader"] == BEFORE)
            / next(r["client_cpu_ms"] for r in rows if r["size"] == label and r["reader"] == "presigned"), 2)
            for label in SIZES},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ranged_reads.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "ranged_reads.png")
    print(f"wrote {args.out / 'ranged_reads.json'} and .png")
    return report


if __name__ == "__main__":
    main()
