"""Streaming reads through the bounded part cache (`pipeline.part_cache`): against moto S3, the
Range-honouring board server and the fault proxy. Bytes are counted server-side (the proxy's log of
ranged GETs) or by the cache's own counters; no timing is asserted."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("s3fs")

from servers.faults import FaultProxy  # noqa: E402
from servers.s3 import S3Server  # noqa: E402

from pinstorm.pipeline import part_cache, ranged_reads  # noqa: E402
from pinstorm.pipeline.part_cache import CacheFullError, PartCache  # noqa: E402
from pinstorm.pipeline.verify import CorruptPartError  # noqa: E402

PARTS = 6


@pytest.fixture(autouse=True)
def fresh_counters():
    part_cache.reset_counters()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """(local folder, info) of a tiny dataset in 6 parts of one row group each."""
    from pinstorm.pipeline import convert, make_digits_tree, scan
    from pinstorm.pipeline.metadata import read_info
    from pinstorm.pipeline.storage import resolve

    base = tmp_path_factory.mktemp("streaming")
    tree = make_digits_tree(base / "tree", image_size=32, per_class=6, seed=0)
    convert(scan(tree), base / "ds", partitions=PARTS, min_row_groups=PARTS, seed=0, progress=False)
    info = read_info(resolve(base / "ds"))
    assert len(info["files"]) == PARTS and all(e["row_groups"] == 1 for e in info["files"].values())
    return str(base / "ds"), info


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        import s3fs
        fs = s3fs.S3FileSystem(**server.storage_options())
        fs.mkdir("bkt")
        server.fs = fs
        yield server


@pytest.fixture(scope="module")
def one_part(tmp_path_factory):
    """(local folder, info, row group spans, footer bytes) of the same images in one part of 8 row groups, as
    `convert`'s defaults lay a dataset out: a cache smaller than the part streams it by row group."""
    import pyarrow.parquet as pq

    from pinstorm.pipeline import convert, make_digits_tree, scan
    from pinstorm.pipeline.metadata import read_info
    from pinstorm.pipeline.storage import resolve

    base = tmp_path_factory.mktemp("one-part")
    tree = make_digits_tree(base / "tree", image_size=32, per_class=6, seed=0)
    convert(scan(tree), base / "ds", partitions=1, min_row_groups=8, seed=0, progress=False)
    info = read_info(resolve(base / "ds"))
    (name, entry), = info["files"].items()
    assert entry["row_groups"] == 8
    meta = pq.ParquetFile(base / "ds" / name).metadata
    spans = []
    for rg in range(meta.num_row_groups):
        chunks = [meta.row_group(rg).column(c) for c in range(meta.num_columns)]
        starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in chunks]
        spans.append((min(starts), max(s + c.total_compressed_size for s, c in zip(starts, chunks))))
    tail = (base / "ds" / name).read_bytes()[-8:]
    return str(base / "ds"), info, spans, int.from_bytes(tail[:4], "little") + 8


def _uploaded(s3, local, info, request):
    """(s3 URL through a fault proxy, its storage options, the proxy, the dataset's part bytes)."""
    prefix = re.sub(r"[^a-z0-9]", "-", request.node.name.lower())[:50]
    s3.fs.put(local + "/", f"bkt/{prefix}/", recursive=True)
    part_cache.reset_counters()
    with FaultProxy(s3.endpoint) as proxy:
        yield f"s3://bkt/{prefix}", s3.storage_options(proxy.endpoint), proxy, sum(
            e["bytes"] for e in info["files"].values())


@pytest.fixture
def remote(s3, dataset, request):
    yield from _uploaded(s3, *dataset, request)


@pytest.fixture
def remote_one(s3, one_part, request):
    yield from _uploaded(s3, *one_part[:2], request)


def _asked(proxy) -> list[tuple[str, str | None]]:
    """(path, Range header) of each GET the proxy saw, the query (a presigned URL's signature) left out."""
    return [(path.split("?", 1)[0], header) for path, header in proxy.ranges]


def _part_bytes(proxy) -> int:
    """Part bytes the server was asked for (ranged GETs of part files)."""
    total = 0
    for path, header in _asked(proxy):
        if path.rsplit("/", 1)[-1].startswith("part-") and header:
            start, end = header.split("=")[1].split("-")
            total += int(end) - int(start) + 1
    return total


def _rows(url, *, epochs=2, shuffle=True, **kw):
    """(label, xxh3 of the JPEG) of every row of `epochs` epochs, in order, read by the framework-free
    `EpochSource` that both loaders read through (so this runs without torch or TensorFlow too)."""
    import xxhash

    from pinstorm.pipeline.epochs import open_epochs

    source = open_epochs(url, None, shuffle=shuffle, seed=3, **kw)
    return [(int(label), xxhash.xxh3_64(bytes(image)).hexdigest())
            for epoch in range(epochs) for images, labels in source(epoch) for image, label in zip(images, labels)]


def _ids(url, *, epochs=2, state_after=None, state=None, **kw):
    pytest.importorskip("torch")
    from pinstorm.pipeline import make_torch_loader

    loader = make_torch_loader(url, batch_size=8, image_size=16, seed=3, num_epochs=epochs, return_ids=True, **kw)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for batch, (_, labels, ids) in enumerate(loader):
        out += list(zip(ids.tolist(), labels.tolist()))
        if state_after is not None and batch + 1 == state_after:
            return out, loader.state_dict()
    return out


def _cache_bytes(root: Path) -> int:
    """The bytes of the cached files under `root`, after checking the cache's ledger counts exactly them."""
    from pinstorm.pipeline.part_cache import _KEY
    from pinstorm.pipeline.part_ledger import Ledger

    files = {f"{d.name}/{f.name}": f.stat().st_size for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")
             for f in d.iterdir() if f.name.startswith("part-") and not f.name.endswith(".lock")}
    ledger = Ledger(root, _KEY)
    ledger.sync()
    assert dict(ledger.entries) == files and ledger.used == sum(files.values())
    return sum(files.values())


def test_a_dataset_four_times_the_cache_streams_the_same_rows_within_the_limit(dataset, remote, isolated_pinstorm):
    local, _ = dataset
    url, options, proxy, total = remote
    limit = total // 4 + 1024   # a bit over one part: the reader holds one, fetches the next when room frees
    expected = _rows(local)
    assert _rows(url, storage_options=options, stream=True, cache_limit=limit) == expected
    counters = part_cache.COUNTERS
    assert counters.peak_bytes <= limit and counters.evicted > 0
    assert _cache_bytes(isolated_pinstorm / "cache" / "parts") <= limit
    # one fetch of each part per epoch: the plan reads each part once, and eviction never took one still needed
    assert _part_bytes(proxy) == counters.fetched_bytes == 2 * total


def test_a_dataset_that_fits_is_read_locally_from_the_second_epoch(dataset, remote):
    local, _ = dataset
    url, options, proxy, total = remote
    first = _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=10 * total)
    assert _part_bytes(proxy) == total
    proxy.ranges.clear()
    assert _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=10 * total) == first
    assert _part_bytes(proxy) == 0 and part_cache.COUNTERS.hits >= PARTS


def test_make_dataset_streams_the_same_rows_as_a_local_read(dataset, remote):
    pytest.importorskip("tensorflow")
    from pinstorm.pipeline import make_dataset

    local, _ = dataset
    url, options, proxy, total = remote

    def rows(where, **kw):
        ds = make_dataset(where, batch_size=8, image_size=16, seed=5, num_epochs=2, return_ids=True, **kw)
        return [(int(i), int(y)) for _, labels, ids in ds for i, y in zip(ids.numpy(), labels.numpy())]

    assert rows(url, storage_options=options, stream=True, cache_limit=total // 3) == rows(local)
    assert part_cache.COUNTERS.peak_bytes <= total // 3


def test_a_resumed_loader_continues_exactly_with_the_cache_cold_or_warm(dataset, remote, isolated_pinstorm):
    local, _ = dataset
    url, options, proxy, total = remote
    whole = _ids(local, epochs=1)
    kw = dict(storage_options=options, stream=True, cache_limit=total // 2, epochs=1)
    head, state = _ids(url, state_after=2, **kw)
    assert head == whole[:16]
    assert _ids(url, state=state, **kw) == whole[16:]   # warm: the parts it held may still be there
    import shutil
    shutil.rmtree(isolated_pinstorm / "cache" / "parts")
    assert _ids(url, state=state, **kw) == whole[16:]   # cold


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_torch_loader_with_workers_shares_the_cache(dataset, remote, context):
    """Forked workers too: s3fs made before the fork refuses to run in the child, so each worker makes its own."""
    local, _ = dataset
    url, options, proxy, total = remote
    kw = dict(epochs=1, num_workers=2, multiprocessing_context=context)
    assert _ids(url, storage_options=options, stream=True, cache_limit=10 * total, **kw) == _ids(local, **kw)
    assert _part_bytes(proxy) == total


_READER = textwrap.dedent("""
    import json, sys
    from pinstorm.pipeline import part_cache
    from pinstorm.pipeline.epochs import open_epochs
    url, endpoint, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    options = {"endpoint_url": endpoint, "key": "testing-key", "secret": "testing-secret"}
    source = open_epochs(url, None, shuffle=True, seed=3, storage_options=options, stream=True, cache_limit=limit)
    ids = [int(label) for _, labels in source(0) for label in labels]
    print(json.dumps({"ids": ids, "fetched": part_cache.COUNTERS.fetched_bytes}))
""")


def _reader(url, endpoint, limit, env):
    return subprocess.Popen([sys.executable, "-c", _READER, url, endpoint, str(limit)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _three_ranks(url, options, proxy, cache: Path, limit: int, **env) -> list[dict]:
    """What 3 local ranks sharing `cache` read of one epoch ({"ids", "fetched"} each), their downloads slowed so
    that they overlap and the ranks wait on one another's."""
    import json

    proxy.delay(r"/part-\d+\.parquet(\?|$)", 0.2, method="GET")
    env = {**os.environ, "PINSTORM_CACHE": str(cache), "LOCAL_WORLD_SIZE": "3", **env}
    ranks = [_reader(url, options["endpoint_url"], limit, env) for _ in range(3)]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=300)
        assert rank.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0]["ids"] == results[1]["ids"] == results[2]["ids"] and len(results[0]["ids"]) == 50
    return results


def test_local_ranks_fetch_each_part_once(dataset, remote, isolated_pinstorm):
    url, options, proxy, total = remote
    results = _three_ranks(url, options, proxy, isolated_pinstorm / "cache", 10 * total)
    assert _part_bytes(proxy) == total == sum(r["fetched"] for r in results)


def test_a_rank_killed_mid_download_leaves_nothing_another_uses(dataset, remote, isolated_pinstorm):
    url, options, proxy, total = remote
    local, _ = dataset
    proxy.delay(r"/part-\d+\.parquet(\?|$)", 30, method="GET", times=1)
    env = {**os.environ, "PINSTORM_CACHE": str(isolated_pinstorm / "cache")}
    victim = _reader(url, options["endpoint_url"], 10 * total, env)
    parts = isolated_pinstorm / "cache" / "parts"
    deadline = time.monotonic() + 120
    while not any(".tmp-" in f.name for f in parts.glob("*/*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(victim.pid, signal.SIGKILL)
    victim.communicate()
    leftovers = [f for f in parts.glob("*/*") if ".tmp-" in f.name]
    assert leftovers   # what the killed rank was writing
    assert _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=total // 2) == _rows(local, epochs=1)
    assert not any(f.exists() for f in leftovers)   # swept, never renamed into place
    assert not list((parts / ".reserved").iterdir()) and not list((parts / ".holds").iterdir())


def test_a_part_just_fetched_is_counted_once(dataset, remote, isolated_pinstorm, monkeypatch):
    """The download's reservation goes when the part enters the ledger, in one locked step: counted twice,
    even for a moment, another reader short of room evicted a part fetched ahead (fetched again later; a
    CI run caught it as one row group fetched three times in two epochs)."""
    from pinstorm.pipeline.storage import resolve

    url, options, proxy, total = remote
    _, info = dataset
    name = sorted(info["files"])[0]
    cache = PartCache(resolve(url, options), info, limit=total)
    counted = []
    hold = PartCache._hold

    def counting(self, *args, **kwargs):   # the moment the part is in place, before the lock is let go
        counted.append(self._state()[1])
        return hold(self, *args, **kwargs)

    monkeypatch.setattr(PartCache, "_hold", counting)
    path, held = cache.acquire(name)
    assert counted == [info["files"][name]["bytes"]] == [path.stat().st_size]
    cache.release(held)


def test_eviction_never_takes_a_held_part(dataset, remote, isolated_pinstorm, monkeypatch):
    from pinstorm.pipeline.storage import resolve

    url, options, proxy, total = remote
    _, info = dataset
    names = sorted(info["files"])
    cache = PartCache(resolve(url, options), info, limit=max(e["bytes"] for e in info["files"].values()) + 100)
    path, hold = cache.acquire(names[0])
    assert cache.acquire(names[1], wait=False) is None   # no room: the only part is held
    assert path.is_file()
    cache.release(hold)
    path1, hold1 = cache.acquire(names[1], wait=False)
    assert path1.is_file() and not path.exists()   # let go, so evicted
    cache.release(hold1)
    # a part only fetched ahead gives way to a reader waiting for its next part, never to a prefetch
    ahead_path, ahead = cache.acquire(names[2], kind="ahead")
    assert cache.acquire(names[3], wait=False) is None and ahead_path.is_file()
    path3, hold3 = cache.acquire(names[3], wait=True)
    assert path3.is_file() and not ahead_path.exists() and cache.upgrade(names[2], ahead) is None
    monkeypatch.setattr(part_cache, "WAIT_SECONDS", 0.3)
    with pytest.raises(CacheFullError, match=r"no room for .*held by readers"):
        cache.acquire(names[4], wait=True)   # a part being read is never evicted
    assert path3.is_file()


def test_a_part_that_fails_its_checksum_is_fetched_again_once_then_named(dataset, remote, s3):
    url, options, proxy, total = remote
    _, info = dataset
    name = sorted(info["files"])[2]
    key = url[len("s3://"):] + "/" + name
    data = bytearray(s3.fs.cat_file(key))
    data[len(data) // 3] ^= 0xFF   # same size, so the listing's size check passes
    s3.fs.pipe_file(key, bytes(data))
    with pytest.raises(CorruptPartError, match=re.escape(name) + ".*after fetching it twice"):
        _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=10 * total, shuffle=False)
    assert part_cache.COUNTERS.refetched == 1
    assert sum(1 for path, header in _asked(proxy) if path.endswith(name) and header) == 2


def _signed(proxy) -> list[str]:
    """The part GETs the proxy saw that carried a presigned URL's signature (`ranged_reads`)."""
    return [path for path, header in proxy.ranges if "/part-" in path and "Signature=" in path]   # SigV4 or V2


def test_s3_parts_come_by_presigned_ranged_gets_unless_s3fs_has_options_they_would_miss(dataset, remote,
                                                                                      isolated_pinstorm):
    """A presigned GET costs the reader a third of s3fs's CPU (`ranged_reads`); an s3fs with request or client
    options of its own (here a client config) keeps reading through s3fs, which applies them."""
    import shutil

    local, _ = dataset
    url, options, proxy, total = remote
    expected = _rows(local, epochs=1)
    assert _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=10 * total) == expected
    assert len(_signed(proxy)) == PARTS and _part_bytes(proxy) == total
    shutil.rmtree(isolated_pinstorm / "cache" / "parts")
    proxy.ranges.clear()
    configured = {**options, "config_kwargs": {"retries": {"max_attempts": 2}}}
    assert _rows(url, epochs=1, storage_options=configured, stream=True, cache_limit=10 * total) == expected
    assert _signed(proxy) == [] and _part_bytes(proxy) == total


def test_presigned_reads_fall_back_to_s3fs_and_never_log_the_url(dataset, remote, monkeypatch, caplog):
    """A cut body resumes by another presigned GET; a 503 is asked again of s3fs (its retries) and presigned
    reads go on; a 403 where s3fs succeeds stops them. No log line carries the signed URL."""
    import logging

    local, info = dataset
    url, options, proxy, total = remote
    names = sorted(info["files"])
    monkeypatch.setattr(ranged_reads, "BLOCK", 4096)   # several ranged reads per part
    proxy.truncate(re.escape(names[0]) + r"\?.*Signature=", times=1)
    proxy.fail(re.escape(names[1]) + r"\?.*Signature=", 503, method="GET", times=1)
    proxy.fail(re.escape(names[3]) + r"\?.*Signature=", 403, method="GET")
    with caplog.at_level(logging.DEBUG, logger="pinstorm"), caplog.at_level(logging.DEBUG, logger="urllib3"):
        got = _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=10 * total, shuffle=False)
    assert got == _rows(local, epochs=1, shuffle=False)
    assert part_cache.COUNTERS.resumed == 1 and part_cache.COUNTERS.refetched == 0
    signed = [path.split("?", 1)[0].rsplit("/", 1)[-1] for path in _signed(proxy)]
    assert set(names[:4]) <= set(signed) and signed.count(names[3]) == 1
    assert _part_bytes(proxy) > total   # the 503 and the 403 asked the same range again of s3fs
    assert not re.search(r"Signature=(?!\*\*\*)", caplog.text)   # urllib3's debug lines: masked
    assert options["key"] not in caplog.text and options["secret"] not in caplog.text
    assert "presigned ranged GETs answered HTTP 403" in caplog.text
    assert re.search(r'"GET /bkt/\S+/part-\S+\?\S*Signature=\*\*\*', caplog.text)   # they were logged


def test_presigned_reads_follow_the_environment_botocore_reads(remote, monkeypatch, tmp_path):
    """A proxy for the endpoint (botocore would use it; urllib3's pool would not): s3fs reads. A CA bundle
    named by AWS_CA_BUNDLE: the presigned reads verify with it."""
    import s3fs

    from pinstorm.pipeline.ranged_reads import FsspecReads, PresignedS3Reads, reads_for

    url, options, proxy, total = remote

    def reads():
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        return reads_for(fs, url[len("s3://"):] + "/part-00000.parquet")

    assert isinstance(reads(), PresignedS3Reads)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert isinstance(reads(), FsspecReads)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert isinstance(reads(), PresignedS3Reads)
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    chosen = reads()
    assert isinstance(chosen, PresignedS3Reads) and chosen._pool.connection_pool_kw["ca_certs"] == str(bundle)


def test_a_client_error_where_s3fs_succeeds_ends_presigned_reads(dataset, remote):
    """Read one at a time (the loader's fetchers overlap): after the 403, the next part goes by s3fs."""
    from pinstorm.pipeline.ranged_reads import PresignedS3Reads, reads_for
    from pinstorm.pipeline.storage import resolve

    local, info = dataset
    url, options, proxy, total = remote
    names = sorted(info["files"])
    location = resolve(url, options)
    reads = reads_for(location.fs, location.join(names[0]))
    assert isinstance(reads, PresignedS3Reads)
    proxy.fail(re.escape(names[0]) + r"\?.*Signature=", 403, method="GET")
    for name in names[:3]:
        got = bytearray()
        reads.read(location.join(name), 0, info["files"][name]["bytes"], got.extend)
        assert bytes(got) == (Path(local) / name).read_bytes()
    assert [p.split("?", 1)[0].rsplit("/", 1)[-1] for p in _signed(proxy)] == names[:1]
    assert not reads.usable


def test_a_dropped_connection_resumes_with_a_ranged_read(dataset, tmp_path, monkeypatch):
    """Over HTTP (fsspec's HTTP filesystem does not retry a body cut short; s3fs retries the same range itself)."""
    from pinstorm import boards
    import shutil

    local, info = dataset
    shutil.copytree(local, tmp_path / "site" / "ds")
    monkeypatch.setattr(ranged_reads, "BLOCK", 4096)   # several ranged reads per part
    name = sorted(info["files"])[1]
    part_cache.reset_counters()
    with boards.serve_board(tmp_path / "site") as base, FaultProxy(base) as proxy:
        proxy.truncate(re.escape(name) + "$", times=1)
        got = _rows(f"{proxy.endpoint}/ds", epochs=1, stream=True, cache_limit=10**6)
    assert got == _rows(local, epochs=1)
    assert part_cache.COUNTERS.resumed == 1 and part_cache.COUNTERS.fetches == PARTS
    assert part_cache.COUNTERS.refetched == 0   # the checksum taken across the resumed reads matched
    starts = [int(h.split("=")[1].split("-")[0]) for p, h in _asked(proxy) if p.endswith(name) and h]
    assert len(starts) == len(set(starts)) + 1 and starts == sorted(starts)   # the cut block asked again, once
    assert [p for p, h in _asked(proxy) if p.endswith(name) and not h] == []   # never the whole file


def test_a_connection_that_keeps_failing_names_the_part(dataset, tmp_path):
    from pinstorm import boards
    from pinstorm.pipeline.part_cache import PartFetchError
    import shutil

    local, info = dataset
    shutil.copytree(local, tmp_path / "site" / "ds")
    name = sorted(info["files"])[0]
    with boards.serve_board(tmp_path / "site") as base, FaultProxy(base) as proxy:
        proxy.fail(re.escape(name) + "$", 503, method="GET")
        with pytest.raises(PartFetchError, match=re.escape(name) + r": download stopped at byte 0 .* after 2 resumed"):
            _rows(f"{proxy.endpoint}/ds", epochs=1, stream=True, cache_limit=10**6, shuffle=False)
    parts = tmp_path / "cache" / "parts"
    assert not [f for f in parts.glob("*/*") if ".tmp-" in f.name or f.name == name]   # nothing half-written kept


def test_a_full_disk_is_named_before_a_byte_is_written(dataset, remote, isolated_pinstorm, monkeypatch):
    from pinstorm.boards.safety import diskspace

    url, options, proxy, total = remote
    monkeypatch.setattr(diskspace, "free_bytes", lambda folder: (1000, 10**9))
    with pytest.raises(CacheFullError) as failure:
        _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=10 * total)
    message = str(failure.value)
    assert str(isolated_pinstorm / "cache" / "parts") in message and f"limit {10 * total:,} bytes" in message
    assert _part_bytes(proxy) == 0
    assert not [f for f in (isolated_pinstorm / "cache" / "parts").glob("*/part-*") if not f.name.endswith(".lock")]


def test_a_part_larger_than_the_limit_is_refused_at_once(dataset, remote):
    url, options, proxy, total = remote
    with pytest.raises(CacheFullError, match=r"limit 1,000 bytes\): part s3://.*/part-\d+\.parquet of [\d,]+ "
                       r"bytes \(one row group\) does not fit; raise cache_limit"):
        _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=1000)


def test_a_one_part_dataset_larger_than_the_cache_streams_by_row_group(one_part, remote_one, isolated_pinstorm):
    local, _, spans, footer = one_part
    url, options, proxy, total = remote_one
    limit = total // 3   # a third of the one part: each row group is its own piece
    assert _rows(url, storage_options=options, stream=True, cache_limit=limit) == _rows(local)
    counters = part_cache.COUNTERS
    assert counters.peak_bytes <= limit and counters.evicted > 0
    assert _cache_bytes(isolated_pinstorm / "cache" / "parts") <= limit
    # each row group at most once an epoch, whatever the shuffled order (epoch 2 may find the last few of epoch 1
    # in place); the footer once, after the 8 bytes that size it
    groups = sum(end - start for start, end in spans)
    assert _part_bytes(proxy) == counters.fetched_bytes
    assert 2 * groups - limit <= counters.fetched_bytes - footer - 8 <= 2 * groups


def test_a_resumed_loader_over_row_group_pieces_continues_exactly(one_part, remote_one, isolated_pinstorm):
    import shutil

    local = one_part[0]
    url, options, proxy, total = remote_one
    whole = _ids(local, epochs=2)
    kw = dict(storage_options=options, stream=True, cache_limit=total // 3)
    head, state = _ids(url, state_after=9, epochs=2, **kw)   # into the second epoch
    assert state["epoch"] == 1 and head == whole[:len(head)]
    # num_epochs counts from the state's epoch: the rest of the second
    assert _ids(url, state=state, epochs=1, **kw) == whole[len(head):]   # warm
    shutil.rmtree(isolated_pinstorm / "cache" / "parts")
    assert _ids(url, state=state, epochs=1, **kw) == whole[len(head):]   # cold


def test_spawned_loader_workers_stream_row_group_pieces(one_part, remote_one):
    """Each worker gets the cache pickled without what its parent learnt (footers, open parts) and reads its
    own row groups of the one part."""
    local = one_part[0]
    url, options, proxy, total = remote_one
    kw = dict(epochs=1, num_workers=2, multiprocessing_context="spawn")
    assert _ids(url, storage_options=options, stream=True, cache_limit=total // 3, **kw) == _ids(local, **kw)


def test_local_ranks_fetch_each_row_group_once(one_part, remote_one, isolated_pinstorm):
    _, _, spans, footer = one_part
    url, options, proxy, total = remote_one
    results = _three_ranks(url, options, proxy, isolated_pinstorm / "cache", 10 * total,
                           PINSTORM_PART_CACHE_WHOLE_PART="0")   # by row group though the part would fit
    once = sum(end - start for start, end in spans) + footer
    assert sum(r["fetched"] for r in results) == _part_bytes(proxy)
    assert once + 8 <= _part_bytes(proxy) <= once + 3 * 8   # each rank may size the footer before one fetched it


def _span_digests(data: bytes) -> list[str]:
    """The xxh3-128 of each row group's bytes of the Parquet file `data`, found from its footer here."""
    import xxhash

    from pinstorm.pipeline.part_pieces import row_group_spans

    footer = int.from_bytes(data[-8:-4], "little") + 8
    return [xxhash.xxh3_128(data[start:end]).hexdigest()
            for start, end in row_group_spans(data[-footer:], len(data), "test")]


def test_convert_records_each_row_groups_bytes_checksum_local_and_remote(one_part, s3, tmp_path):
    """Hashed as the part is read back (a local folder) or as it is written (S3): both give the checksums of
    the exact bytes a part cache fetches for each row group."""
    from pinstorm.pipeline import convert, make_digits_tree, scan
    from pinstorm.pipeline.metadata import read_info
    from pinstorm.pipeline.storage import resolve

    local, info, _, _ = one_part
    name, = info["files"]
    assert info["files"][name]["row_group_bytes_xxh3"] == _span_digests((Path(local) / name).read_bytes())
    tree = make_digits_tree(tmp_path / "tree", image_size=32, per_class=6, seed=0)
    convert(scan(tree), "s3://bkt/written-remotely", partitions=2, min_row_groups=6, seed=0, progress=False,
            storage_options=s3.storage_options())
    remote = read_info(resolve("s3://bkt/written-remotely", s3.storage_options()))["files"]
    assert len(remote) == 2
    for part, entry in remote.items():
        assert entry["row_group_bytes_xxh3"] == _span_digests(s3.fs.cat_file(f"bkt/written-remotely/{part}"))


def test_a_sink_records_no_row_group_checksums_when_a_writer_buffers_across_row_groups():
    """Spans that do not start where a row group was begun (a writer that held bytes back): no checksums, and
    a part cache checks those row groups by their content instead."""
    import io

    from pinstorm.pipeline.convert import HashingSink

    sink = HashingSink(io.BytesIO())
    sink.write(b"PAR1")
    sink.cut()
    sink.write(b"a" * 10)
    sink.write(b"meta")
    sink.cut()
    sink.write(b"b" * 5)
    sink.cut()
    import xxhash
    assert sink.span_digests([(4, 14), (18, 23)]) == [xxhash.xxh3_128(b"a" * 10).hexdigest(),
                                                       xxhash.xxh3_128(b"b" * 5).hexdigest()]
    assert sink.span_digests([(4, 14), (14, 23)]) is None   # starts where no row group began
    assert sink.span_digests([(4, 12), (18, 23)]) is None   # ends where no write ended


def test_a_row_group_piece_is_checked_by_the_checksum_of_its_bytes_not_read_again(one_part, remote_one,
                                                                                  monkeypatch):
    def read_again(*args):
        raise AssertionError("a row group piece read to check its content")

    monkeypatch.setattr(PartCache, "_check_row_group", read_again)
    local = one_part[0]
    url, options, proxy, total = remote_one
    assert _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=total // 3) == \
        _rows(local, epochs=1)


@pytest.mark.parametrize("column", ["image", "width"])
@pytest.mark.parametrize("recorded", [True, False], ids=["bytes-checksums", "content-checksums"])
def test_a_row_group_piece_that_fails_its_checksum_is_fetched_again_once_then_named(one_part, remote_one, s3, column,
                                                                                    recorded):
    """Checked by the checksum of its bytes, any column; in a dataset from before those, by the content
    checksum (images and labels) and other columns' page CRCs (pyarrow >= 15)."""
    import pyarrow.parquet as pq

    from pinstorm.pipeline.metadata import read_info, write_common_metadata
    from pinstorm.pipeline.storage import resolve
    from pinstorm.pipeline.verify import PAGE_CRC

    if column != "image" and not PAGE_CRC and not recorded:
        pytest.skip("pyarrow < 15 does not check page CRCs")
    local, info, spans, _ = one_part
    url, options, proxy, total = remote_one
    name, = info["files"]
    if not recorded:   # as an older pinstorm wrote it
        location = resolve(url, s3.storage_options())
        older = read_info(location).to_dict()
        older["files"][name].pop("row_group_bytes_xxh3")
        write_common_metadata(location, older, {name: older["files"][name]["row_groups"]})
    group = pq.ParquetFile(Path(local) / name).metadata.row_group(2)
    chunk = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == column)
    key = url[len("s3://"):] + "/" + name
    data = bytearray(s3.fs.cat_file(key))
    start, end = spans[2]
    data[chunk.data_page_offset + chunk.total_compressed_size - 2] ^= 0xFF   # in row group 2's column, same size
    s3.fs.pipe_file(key, bytes(data))
    with pytest.raises(CorruptPartError, match=re.escape(name) + r" row group 2: .*after fetching it twice"):
        _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=total // 3, shuffle=False)
    assert part_cache.COUNTERS.refetched == 1
    asked = [header for path, header in _asked(proxy) if path.endswith(name) and header]
    assert asked.count(f"bytes={start}-{end - 1}") == 2   # the piece's own range, twice; never the whole part


def test_a_shuffled_epoch_over_parts_cached_by_row_group_reads_each_row_group_once(s3, request, monkeypatch,
                                                                                    tmp_path):
    """Two parts of 4 row groups, the epoch's order switching parts at almost every row group."""
    from pinstorm.pipeline import convert, make_digits_tree, scan
    from pinstorm.pipeline.metadata import read_info
    from pinstorm.pipeline.storage import resolve

    tree = make_digits_tree(tmp_path / "tree", image_size=32, per_class=6, seed=0)
    convert(scan(tree), tmp_path / "ds", partitions=2, min_row_groups=8, seed=0, progress=False)
    info = read_info(resolve(tmp_path / "ds"))
    monkeypatch.setattr(part_cache, "WHOLE_PART_BYTES", 0)   # by row group though each part would fit
    for url, options, proxy, total in _uploaded(s3, str(tmp_path / "ds"), info, request):
        assert _rows(url, storage_options=options, stream=True, cache_limit=10 * total) == _rows(tmp_path / "ds")
        counters = part_cache.COUNTERS
        assert counters.fetches == 8 + 2 and counters.hits >= 8   # 8 row groups and 2 footers; epoch 2 in place
        assert _part_bytes(proxy) == counters.fetched_bytes < total + 2 * 8


def test_a_row_group_larger_than_the_limit_is_refused_before_it_is_fetched(one_part, remote_one):
    _, _, spans, footer = one_part
    url, options, proxy, total = remote_one
    largest = max(end - start for start, end in spans)
    assert footer < largest
    with pytest.raises(CacheFullError, match=r"part-\d+\.parquet row group \d+ of [\d,]+ bytes does not fit; "
                                             r"raise cache_limit"):
        _rows(url, epochs=1, storage_options=options, stream=True, cache_limit=largest - 1)
    assert _part_bytes(proxy) == footer + 8   # the footer only


def test_a_piece_source_serves_only_the_pieces_in_hand(tmp_path):
    from pinstorm.pipeline.part_pieces import PieceSource

    (tmp_path / "group").write_bytes(b"0123456789")
    source = PieceSource(100, "s3://bkt/ds/part-0.parquet")
    source.add_bytes(90, b"F" * 10)
    source.add_file(20, 30, tmp_path / "group")
    source.seek(25)
    assert source.read(100) == b"56789"   # a read stops at the piece's end
    source.seek(-4, 2)
    assert source.read(4) == b"FFFF"
    source.seek(85)
    assert source.read(100) == bytes(5) + b"F" * 10  # pyarrow's tail read: what is not footer reads as zeros
    source.seek(40)
    with pytest.raises(OSError, match=r"part-0\.parquet: byte 40 is outside"):
        source.read(1)
    with pytest.raises(CorruptPartError, match="wrong size"):
        source.add_file(20, 31, tmp_path / "group")


_LOCKED_ADD = """
import sys, time
from pathlib import Path
from pinstorm.pipeline.part_cache import machine_lock

counter, lock = Path(sys.argv[1]), Path(sys.argv[2])
for _ in range(int(sys.argv[3])):
    with machine_lock(lock):
        value = int(counter.read_text())
        time.sleep(0.0005)   # a read-modify-write that interleaves unless the lock holds
        counter.write_text(str(value + 1))
"""


def test_the_machine_lock_excludes_threads_and_processes_alike(tmp_path):
    """The cache's lock: one thread of this process at a time (a thread lock in front of the file lock), and
    one process at a time (the file lock): no update under it is lost."""
    import threading

    from pinstorm.pipeline.part_cache import machine_lock

    counter, lock = tmp_path / "counter", tmp_path / ".lock"
    counter.write_text("0")

    def add(times):
        for _ in range(times):
            with machine_lock(lock):
                value = int(counter.read_text())
                time.sleep(0.0005)
                counter.write_text(str(value + 1))

    other = subprocess.Popen([sys.executable, "-c", _LOCKED_ADD, str(counter), str(lock), "60"])
    threads = [threading.Thread(target=add, args=(40,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert other.wait(timeout=120) == 0
    assert int(counter.read_text()) == 3 * 40 + 60


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_a_thread_holds_the_machine_lock_can_take_it(tmp_path):
    """A DataLoader worker is forked while a prefetch thread may hold the lock: the child's copy of the
    thread lock would be held for ever; the child starts with its own."""
    import threading

    from pinstorm.pipeline.part_cache import machine_lock

    lock, held, done = tmp_path / ".lock", threading.Event(), threading.Event()

    def hold():
        with machine_lock(lock):
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    pid = os.fork()
    if pid == 0:   # the child: waits for the parent's file lock (the parent lets go below), then takes it
        code = 1
        signal.alarm(20)   # a lock held for ever ends the child with SIGALRM
        try:
            with machine_lock(lock):
                code = 0
        finally:
            os._exit(code)
    done.set()
    holder.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_parts_kept_open_are_bounded_by_count_and_by_their_footers():
    from types import SimpleNamespace

    from pinstorm.pipeline.verify import OpenParts

    closed = []

    def opener(part):   # footers of 6 MiB: two fit the 16 MiB kept open, a third does not
        return SimpleNamespace(part=part, metadata=SimpleNamespace(serialized_size=6 << 20),
                               close=lambda: closed.append(part))

    opened = OpenParts(opener)
    for part in ("a", "b", "a", "c"):
        assert opened.get(part).part == part
    assert closed == ["b"] and list(opened.open) == ["a", "c"]   # the least recently used went
    opened.close()
    assert sorted(closed) == ["a", "b", "c"]


def test_streams_over_http_from_the_board_server(dataset, tmp_path):
    from pinstorm import boards
    import shutil

    local, info = dataset
    shutil.copytree(local, tmp_path / "site" / "ds")
    with boards.serve_board(tmp_path / "site") as base:
        got = _rows(f"{base}/ds", epochs=1, stream=True, cache_limit=sum(e["bytes"] for e in info["files"].values()))
    assert got == _rows(local, epochs=1) and part_cache.COUNTERS.fetches == PARTS


def test_streams_an_s3_board_pin_without_fetching_it_whole(dataset, s3, isolated_pinstorm):
    from pinstorm import boards

    local, info = dataset
    board = boards.board_register("s3", name="bigs3", bucket="streamboard", create_bucket=True, **s3.storage_options())
    files = sorted(str(p) for p in Path(local).iterdir())
    board.pin(files, name="ds", type="files")
    import shutil
    shutil.rmtree(isolated_pinstorm / "cache" / "bigs3")   # pin() fetched its own copy
    part_cache.reset_counters()
    got = _rows("board://bigs3/ds", epochs=1, stream=True, cache_limit=10**6)
    assert got == _rows(local, epochs=1) and part_cache.COUNTERS.fetches == PARTS
    fetched = [p.name for p in (isolated_pinstorm / "cache" / "bigs3").rglob("part-*")]
    assert not fetched   # the pin was not fetched whole


def test_the_options_and_the_command_line_flags():
    from pinstorm.pipeline.options import ReaderOptionError, ReaderOptions
    from pinstorm.training import cli

    for bad in (0, -1, 1.5, True, "10G"):
        with pytest.raises(ReaderOptionError, match="cache_limit"):
            ReaderOptions(cache_limit=bad)
    assert cli.reader_options(False, None, True, 2**30) == {"stream": True, "cache_limit": 2**30}
    assert cli._byte_size(None, None, "1.5G") == 3 * 2**29 and cli._byte_size(None, None, "20GiB") == 20 * 2**30
    import click
    with pytest.raises(click.BadParameter):
        cli._byte_size(None, None, "lots")


def test_stream_needs_the_pyarrow_engine(dataset):
    pytest.importorskip("tensorflow")
    from pinstorm.pipeline import make_dataset
    from pinstorm.pipeline.options import ReaderOptionError

    with pytest.raises(ReaderOptionError, match="stream=True needs engine='pyarrow'"):
        make_dataset(dataset[0], batch_size=8, image_size=16, engine="petastorm", stream=True)


def test_train_torch_streams_through_input_options(dataset, remote, tmp_path):
    pytest.importorskip("torch")
    from pinstorm.training import train_torch

    url, options, proxy, total = remote
    result = train_torch("alexnet", url, url, epochs=1, batch_size=8, image_size=32, model_kwargs={"width": 0.125},
                         output_dir=str(tmp_path / "run"),
                         input_options={"stream": True, "cache_limit": total // 2, "storage_options": options})
    assert result.output_dir
    assert _part_bytes(proxy) == part_cache.COUNTERS.fetched_bytes >= total   # train and validation read streamed
    assert part_cache.COUNTERS.peak_bytes <= total // 2


def test_streams_from_gcs_and_a_gcs_board_pin(dataset, isolated_pinstorm):
    pytest.importorskip("gcsfs")
    import uuid

    import gcsfs
    from servers import gcs

    from pinstorm import boards

    local, info = dataset
    with gcs.GcsServer() as server:
        bucket = f"stream-{uuid.uuid4().hex[:8]}"
        fs = gcsfs.GCSFileSystem(**server.storage_options())
        fs.mkdir(bucket)
        fs.put(local + "/", f"{bucket}/ds/", recursive=True)
        got = _rows(f"gs://{bucket}/ds", epochs=1, stream=True, cache_limit=30_000,
                    storage_options=server.storage_options())
        assert got == _rows(local, epochs=1) and part_cache.COUNTERS.fetches == PARTS
        board = boards.board_register("gcs", name="g", bucket=bucket, path="board", **server.storage_options())
        board.pin(sorted(str(p) for p in Path(local).iterdir()), name="ds", type="files")
        part_cache.reset_counters()
        assert _rows("board://g/ds", epochs=1, stream=True, cache_limit=30_000) == got
        assert part_cache.COUNTERS.fetches == PARTS


# ---- HTTP boards: data.txt and URL boards stream a pin's parts through the board's own client -----------

API_KEY = "k3y-S3CRET-streaming"


def _recording(proxy, redirect: dict | None = None) -> list:
    """The (path, lower-cased headers) of every request `proxy` answers; paths matching a key of `redirect`
    are answered with a 302 to the value + path instead."""
    seen, base = [], proxy._httpd.RequestHandlerClass

    class Recording(base):
        def _answer(self):
            seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            for pattern, target in (redirect or {}).items():
                if re.search(pattern, self.path):
                    self.owner.ranges.append((self.path, self.headers.get("Range")))
                    self.send_response(302)
                    self.send_header("Location", target + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            super()._answer()

    proxy._httpd.RequestHandlerClass = Recording
    return seen


@pytest.fixture(params=["datatxt", "url"])
def http_pin(dataset, tmp_path, request):
    """(board:// URL of the dataset pinned to a folder board served over HTTP behind a fault proxy and
    registered as a data.txt board or a URL board reading its _pins.yaml, the proxy, the served version
    folder, the dataset's part bytes, the requests the proxy saw)."""
    from pinstorm import boards

    local, info = dataset
    folder = tmp_path / "served"
    boards.board_register("local", name="src", path=folder).pin(
        sorted(str(p) for p in Path(local).iterdir()), name="ds", type="files")
    (version,) = [p for p in (folder / "ds").iterdir() if p.is_dir()]
    with boards.serve_board(folder) as base, FaultProxy(base) as proxy:
        seen = _recording(proxy)
        if request.param == "datatxt":
            boards.board_register("datatxt", name="web", url=proxy.endpoint, headers={"X-Api-Key": API_KEY})
        else:
            boards.board_register(proxy.endpoint, name="web", index="manifest", headers={"X-Api-Key": API_KEY})
        part_cache.reset_counters()
        yield "board://web/ds", proxy, version, sum(e["bytes"] for e in info["files"].values()), seen


def test_an_http_board_pin_streams_the_same_rows_within_the_limit(dataset, http_pin, isolated_pinstorm):
    local, info = dataset
    url, proxy, version, total, seen = http_pin
    limit = total // 4 + 1024
    assert _rows(url, stream=True, cache_limit=limit) == _rows(local)
    counters = part_cache.COUNTERS
    assert counters.peak_bytes <= limit and counters.evicted > 0
    assert _cache_bytes(isolated_pinstorm / "cache" / "parts") <= limit
    assert _part_bytes(proxy) == counters.fetched_bytes == 2 * total
    parts = [(p, h) for p, h in _asked(proxy) if "/part-" in p]
    assert parts and all(h for _, h in parts)   # ranged reads only: no part fetched whole
    # the files come from the pin's metadata: nothing asked of the version folder itself (no listing)
    asked = {p.split("?")[0] for p, _ in seen}
    assert not [p for p in asked if p.rstrip("/").endswith(version.name)]
    assert {p.rsplit("/", 1)[-1] for p in asked if version.name in p} <= set(info["files"]) | {"_common_metadata",
                                                                                                "data.txt"}
    assert not list((isolated_pinstorm / "cache").glob("web/**/part-*"))   # the pin was not fetched whole
    assert all(h.get("x-api-key") == API_KEY for _, h in seen)   # the board's headers, on its origin


def test_an_http_board_pin_of_one_part_streams_by_row_group(one_part, tmp_path, isolated_pinstorm):
    from pinstorm import boards

    local, info, spans, footer = one_part
    folder = tmp_path / "served"
    boards.board_register("local", name="src", path=folder).pin(
        sorted(str(p) for p in Path(local).iterdir()), name="ds", type="files")
    total = sum(e["bytes"] for e in info["files"].values())
    with boards.serve_board(folder) as base, FaultProxy(base) as proxy:
        boards.board_register("datatxt", name="web", url=proxy.endpoint)
        part_cache.reset_counters()
        assert _rows("board://web/ds", stream=True, cache_limit=total // 3) == _rows(local)
    groups = sum(end - start for start, end in spans)
    assert _part_bytes(proxy) == part_cache.COUNTERS.fetched_bytes <= 2 * groups + footer + 8
    assert part_cache.COUNTERS.peak_bytes <= total // 3


def test_an_http_board_pin_part_that_fails_its_checksum_is_fetched_again_once_then_named(dataset, http_pin):
    url, proxy, version, total, _ = http_pin
    _, info = dataset
    name = sorted(info["files"])[2]
    data = bytearray((version / name).read_bytes())
    data[len(data) // 3] ^= 0xFF   # same size: the metadata's size still matches
    (version / name).write_bytes(bytes(data))
    with pytest.raises(CorruptPartError, match=re.escape(name) + ".*after fetching it twice"):
        _rows(url, epochs=1, stream=True, cache_limit=10 * total, shuffle=False)
    assert part_cache.COUNTERS.refetched == 1
    assert sum(1 for path, header in _asked(proxy) if path.endswith(name) and header) == 2


def test_an_http_board_pin_resumes_a_dropped_connection_with_a_ranged_read(dataset, http_pin, monkeypatch):
    local, info = dataset
    url, proxy, version, total, _ = http_pin
    monkeypatch.setattr(ranged_reads, "BLOCK", 4096)   # several ranged reads per part
    name = sorted(info["files"])[1]
    proxy.truncate(re.escape(name) + "$", times=1)
    assert _rows(url, epochs=1, stream=True, cache_limit=10**6) == _rows(local, epochs=1)
    assert part_cache.COUNTERS.resumed == 1 and part_cache.COUNTERS.fetches == PARTS
    assert part_cache.COUNTERS.refetched == 0   # the checksum taken across the resumed reads matched
    starts = [int(h.split("=")[1].split("-")[0]) for p, h in _asked(proxy) if p.endswith(name) and h]
    assert len(starts) == 2 and starts == sorted(starts)   # the cut GET, then the rest from the byte reached
    assert [p for p, h in _asked(proxy) if p.endswith(name) and not h] == []   # never the whole file
    # one GET a part through the board's client, handed to the cache file as it arrives: no 4 KiB blocks
    others = [n for n in info["files"] if n != name]
    assert sorted(p.rsplit("/", 1)[-1] for p, h in _asked(proxy) if "/part-" in p and h and not p.endswith(name)) \
        == sorted(others)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_torch_loader_with_workers_streams_an_http_board_pin(dataset, http_pin, context, isolated_pinstorm):
    """Forked workers make their own HTTP session; spawned ones get the board's storage pickled."""
    local, _ = dataset
    url, proxy, version, total, _ = http_pin
    kw = dict(epochs=1, num_workers=2, multiprocessing_context=context)
    assert _ids(url, stream=True, cache_limit=total // 2, **kw) == _ids(local, **kw)
    assert 0 < _cache_bytes(isolated_pinstorm / "cache" / "parts") <= total // 2
    assert all(h for p, h in _asked(proxy) if "/part-" in p)


def test_make_dataset_streams_an_http_board_pin(dataset, http_pin):
    pytest.importorskip("tensorflow")
    from pinstorm.pipeline import make_dataset

    local, _ = dataset
    url, proxy, version, total, _ = http_pin

    def rows(where, **kw):
        ds = make_dataset(where, batch_size=8, image_size=16, seed=5, num_epochs=2, return_ids=True, **kw)
        return [(int(i), int(y)) for _, labels, ids in ds for i, y in zip(ids.numpy(), labels.numpy())]

    assert rows(url, stream=True, cache_limit=total // 3) == rows(local)
    assert part_cache.COUNTERS.peak_bytes <= total // 3 and _part_bytes(proxy) == 2 * total


def test_the_board_credentials_stay_on_its_origin_when_a_part_redirects(dataset, tmp_path):
    """A part answered with a redirect to another origin: followed without the board's headers."""
    from pinstorm import boards

    local, info = dataset
    folder = tmp_path / "served"
    boards.board_register("local", name="src", path=folder).pin(
        sorted(str(p) for p in Path(local).iterdir()), name="ds", type="files")
    name = sorted(info["files"])[0]
    with boards.serve_board(folder) as base, FaultProxy(base) as home, FaultProxy(base) as away:
        at_home = _recording(home, redirect={re.escape(name) + "$": away.endpoint})
        elsewhere = _recording(away)
        boards.board_register("datatxt", name="web", url=home.endpoint, headers={"X-Api-Key": API_KEY})
        assert _rows("board://web/ds", epochs=1, stream=True, cache_limit=10**6) == _rows(local, epochs=1)
    assert at_home and all(h.get("x-api-key") == API_KEY for _, h in at_home)
    assert [p for p, _ in elsewhere] and all(p.endswith(name) for p, _ in elsewhere)   # the redirect was followed
    assert all("x-api-key" not in h and h.get("range") for _, h in elsewhere)


def test_a_kaggle_board_pin_is_refused_with_stream(monkeypatch, tmp_path):
    from pinstorm import boards
    from pinstorm.pipeline.errors import InvalidPipelineInput

    for var in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_API_TOKEN", "PINSTORM_KAGGLE_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    boards.board_register("kaggle", name="k", endpoint="http://127.0.0.1:9", cache=tmp_path / "kc", retries=0)
    with pytest.raises(InvalidPipelineInput, match=r"board://k/ds: a kaggle board cannot stream parts; read it with "
                                                   r"stream=False"):
        _rows("board://k/ds", epochs=1, stream=True, cache_limit=10**6)


_HTTP_READER = textwrap.dedent("""
    import json, sys
    from pinstorm import boards
    from pinstorm.pipeline import part_cache
    from pinstorm.pipeline.epochs import open_epochs
    boards.board_register("datatxt", name="web", url=sys.argv[1])
    source = open_epochs("board://web/ds", None, shuffle=True, seed=3, stream=True, cache_limit=int(sys.argv[2]))
    ids = [int(label) for _, labels in source(0) for label in labels]
    print(json.dumps({"ids": ids, "fetched": part_cache.COUNTERS.fetched_bytes}))
""")


def test_local_ranks_fetch_each_part_of_an_http_board_pin_once(dataset, tmp_path, isolated_pinstorm):
    import json

    from pinstorm import boards

    local, info = dataset
    total = sum(e["bytes"] for e in info["files"].values())
    folder = tmp_path / "served"
    boards.board_register("local", name="src", path=folder).pin(
        sorted(str(p) for p in Path(local).iterdir()), name="ds", type="files")
    env = {**os.environ, "PINSTORM_CACHE": str(isolated_pinstorm / "cache"), "LOCAL_WORLD_SIZE": "3"}
    with boards.serve_board(folder) as base, FaultProxy(base) as proxy:
        proxy.delay(r"/part-\d+\.parquet(\?|$)", 0.2, method="GET")   # downloads overlap: ranks wait on one another's
        ranks = [subprocess.Popen([sys.executable, "-c", _HTTP_READER, proxy.endpoint, str(10 * total)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        results = []
        for rank in ranks:
            out, err = rank.communicate(timeout=300)
            assert rank.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0]["ids"] == results[1]["ids"] == results[2]["ids"] and len(results[0]["ids"]) == 50
    assert _part_bytes(proxy) == total == sum(r["fetched"] for r in results)


def test_an_http_board_version_naming_a_file_outside_its_folder_is_refused(dataset, http_pin):
    from pinstorm.boards.errors import MalformedMetadata

    url, proxy, version, total, seen = http_pin
    meta = version / "data.txt"
    text = meta.read_text()
    assert "_common_metadata" in text
    meta.write_text(text.replace("_common_metadata", "../../_common_metadata", 1))
    seen.clear()
    with pytest.raises(MalformedMetadata, match=r"'\.\./\.\./_common_metadata' points outside the version folder"):
        _rows(url, epochs=1, stream=True, cache_limit=10**6)
    assert not [p for p, _ in seen if "_common_metadata" in p or "/part-" in p]   # nothing fetched
