"""pin_get_many: many pins at once, over real boards (a local folder, HTTP, moto's S3)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from pinstorm import boards
from pinstorm.boards import parallel
from pinstorm.boards.errors import IntegrityError, PinNotFound
from pinstorm.boards.parallel import PinFetchError, pin_get_many
from servers import faults, s3


def _pin_partition(board, tmp_path: Path, n: int, files: int = 3) -> dict[str, dict[str, bytes]]:
    """n zipped pins of small files; returns {pin: {file name: bytes}}."""
    expected = {}
    for i in range(n):
        name = f"n{i:08d}"
        folder = tmp_path / "src" / name
        folder.mkdir(parents=True)
        content = {f"{name}_{j}.JPEG": bytes([i, j]) * (500 + 37 * j) for j in range(files)}
        for fname, data in content.items():
            (folder / fname).write_bytes(data)
        board.pin(folder, name, zip=True, description=f"category {i}")
        expected[name] = content
    return expected


def _check(result: dict, expected: dict) -> None:
    assert list(result) == list(expected)
    for name, paths in result.items():
        assert {Path(p).name: Path(p).read_bytes() for p in paths} == expected[name]


def test_many_pins_come_back_extracted_in_the_order_asked(tmp_path):
    local = boards.board_get("local")
    expected = _pin_partition(local, tmp_path, 12)
    names = list(reversed(expected))
    result = pin_get_many(names)  # board=None: the default local board
    _check(result, {n: expected[n] for n in names})
    assert boards.pin_get(names[:3]) == {n: result[n] for n in names[:3]}  # the API accepts a list too
    assert pin_get_many(names[:2] + names[:2], parallel=1) == {n: result[n] for n in names[:2]}
    assert pin_get_many([]) == {}


def test_a_failing_pin_does_not_stop_the_others_and_all_failures_are_reported(http_board, tmp_path):
    source, folder, url = http_board
    expected = _pin_partition(source, tmp_path, 5)
    corrupt = next(iter(expected))  # damage one pin on the server: its size no longer matches data.txt
    stored = next((folder / corrupt).glob("*/*.zip"))
    stored.write_bytes(stored.read_bytes()[:100])
    remote = boards.board_register("datatxt", name="remote", url=url, cache=tmp_path / "cache")
    names = list(expected) + ["n-missing"]

    with pytest.raises(PinFetchError) as failed:
        pin_get_many(names, board="remote", parallel=3)
    err = failed.value
    assert set(err.errors) == {corrupt, "n-missing"}
    assert isinstance(err.errors[corrupt], IntegrityError) and isinstance(err.errors["n-missing"], PinNotFound)
    assert f"{corrupt}: IntegrityError" in str(err) and "n-missing: PinNotFound" in str(err)
    _check(err.results, {n: expected[n] for n in names if n in expected and n != corrupt})
    assert not list((tmp_path / "cache" / "remote" / corrupt).glob("*/*.zip"))  # nothing half-stored

    returned = pin_get_many(names, board=remote, errors="return")
    assert list(returned) == names
    assert isinstance(returned[corrupt], IntegrityError) and isinstance(returned["n-missing"], PinNotFound)
    assert returned[names[1]] == err.results[names[1]]


def test_threads_overlap_transfers_and_parallel_1_does_not(http_board, tmp_path):
    source, _, url = http_board
    names = list(_pin_partition(source, tmp_path, 6, files=1))
    with faults.FaultProxy(url) as slow_link:
        slow_link.delay(r"\.zip$", 0.15, method="GET")
        one_by_one = boards.board_register("datatxt", name="seq", url=slow_link.endpoint, cache=tmp_path / "c1")
        pin_get_many(names, board=one_by_one, parallel=1)
        assert slow_link.max_inflight == 1
        slow_link.clear()
        slow_link.delay(r"\.zip$", 0.15, method="GET")
        threaded = boards.board_register("datatxt", name="par", url=slow_link.endpoint, cache=tmp_path / "c2")
        pin_get_many(names, board=threaded, parallel=4)
        assert slow_link.max_inflight >= 2
        assert sum(1 for m, p, _ in slow_link.log if p.endswith(".zip")) == len(names)


@pytest.mark.timeout(180)
def test_processes_fetch_from_s3_after_the_parent_used_it(tmp_path):
    """s3fs keeps an event loop thread; a forked child inheriting it hangs. Workers must not fork it."""
    with s3.S3Server() as server:
        board = boards.board_register("s3", name="bucket", bucket="partition", create_bucket=True,
                                      cache=tmp_path / "parent-cache", **server.storage_options())
        expected = _pin_partition(board, tmp_path, 4)
        threaded = pin_get_many(list(expected), board="bucket", parallel="threads:2")  # the loop is live now
        _check(threaded, expected)
        fresh = boards.board_register("s3", name="bucket2", bucket="partition", cache=tmp_path / "child-cache",
                                      **server.storage_options())
        fresh.pin_find()  # this filesystem instance has run requests in the parent too
        in_processes = pin_get_many(list(expected) + ["absent"], board=fresh, parallel="processes:2",
                                    errors="return")
        assert isinstance(in_processes.pop("absent"), PinNotFound)
        _check(in_processes, expected)
        assert all(str(tmp_path / "child-cache") in p for paths in in_processes.values() for p in paths)


def test_one_progress_bar_counts_every_pin(monkeypatch, tmp_path):
    bars = []

    @contextlib.contextmanager
    def recording_bar(description, total, unit="bytes"):
        bar = {"description": description, "total": total, "unit": unit, "advanced": 0}
        bars.append(bar)

        def advance(n):
            bar["advanced"] += n

        yield advance

    monkeypatch.setattr(parallel, "progress_bar", recording_bar)
    local = boards.board_get("local")
    names = list(_pin_partition(local, tmp_path, 5, files=1)) + ["nope"]
    pin_get_many(names, errors="return", parallel=3)
    assert bars == [{"description": "pins from local", "total": 6, "unit": "pins", "advanced": 6}]


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="list of pin names"):
        pin_get_many("one-name")
    with pytest.raises(ValueError, match="errors must be"):
        pin_get_many(["a"], errors="ignore")
    for bad in ("fast", "processes:many", -2):
        with pytest.raises(ValueError, match="parallel"):
            pin_get_many(["a"], parallel=bad)
    assert parallel._plan(None, 100) == ("threads", parallel.DEFAULT_THREADS)
    assert parallel._plan(None, 3) == ("threads", 3)
    assert parallel._plan("processes:2", 10) == ("processes", 2)
    assert parallel._plan(1, 10) == ("threads", 1)


def test_pin_get_of_a_list_keeps_its_options_and_finds_each_pin_on_its_board(tmp_path):
    """`pin_get([...])` is `pin_get` for each name: the same options, the same search across boards."""
    boards.pin({"a": 1}, "on-local")  # the default board
    other = boards.board_register("local", name="other", path=tmp_path / "other")
    other.pin({"b": 2}, "on-other")
    got = boards.pin_get(["on-local", "on-other"], files=True)
    assert list(got) == ["on-local", "on-other"] and all(Path(p[0]).is_file() for p in got.values())
    assert boards.pin_get(["on-local", "on-other"], download=False) == {"on-local": {"a": 1}, "on-other": {"b": 2}}
    with pytest.raises(ValueError, match="one pin"):
        boards.pin_get(["on-local", "on-other"], version="2020")


def _listings(proxy) -> int:
    return sum(1 for method, path, _ in proxy.log if method == "GET" and ("list-type" in path or "prefix=" in path))


@pytest.mark.timeout(180)
def test_cached_pins_on_a_bucket_cost_one_listing_not_one_a_pin(tmp_path):
    """1,000 cached categories on S3 were 1,000 listings; where the index says one listing of the whole
    board is cheaper, `pin_get_many` lists it once and takes every pin's versions from it."""
    with s3.S3Server() as server, faults.FaultProxy(server.endpoint) as proxy:
        board = boards.board_register("s3", name="bucket", bucket="many-pins", create_bucket=True,
                                      cache=tmp_path / "cache", **server.storage_options(proxy.endpoint))
        expected = _pin_partition(board, tmp_path, 12, files=1)
        names = list(expected)
        _check(pin_get_many(names, board="bucket"), expected)     # fetched into the cache
        proxy.clear()
        _check(pin_get_many(names, board="bucket"), expected)     # cached: the index and one listing
        assert _listings(proxy) == 1 and len(proxy.log) == 2, proxy.log
        # a version stored by another writer since: listed, so the next call fetches it
        other = boards.board_register("s3", name="other", bucket="many-pins", cache=tmp_path / "c2",
                                      **server.storage_options())
        (tmp_path / "new.JPEG").write_bytes(b"\xff\xd8 newer")
        other.pin([tmp_path / "new.JPEG"], names[3], zip=True)
        expected[names[3]] = {"new.JPEG": b"\xff\xd8 newer"}
        _check(pin_get_many(names, board="bucket"), expected)
        # one pin of twelve: its own listing is as cheap as the board's, so it is listed alone
        proxy.clear()
        pin_get_many(names[:1], board="bucket")
        assert [p for m, p, _ in proxy.log if "list-type" in p] == [
            f"/many-pins?list-type=2&prefix={names[0]}%2F&delimiter=&encoding-type=url"]
        # the board's listing fails: each pin is listed on its own, as before
        proxy.clear()
        proxy.fail(r"list-type=2&prefix=&", 403, method="GET")
        _check(pin_get_many(names[:4], board="bucket"), {n: expected[n] for n in names[:4]})
        assert _listings(proxy) == 1 + 4


@pytest.mark.timeout(180)
def test_a_cold_pin_on_s3_costs_two_requests(tmp_path):
    """Its data.txt and its zip: s3fs asked each small file's size first (a HEAD) before reading it."""
    with s3.S3Server() as server, faults.FaultProxy(server.endpoint) as proxy:
        board = boards.board_register("s3", name="cold", bucket="cold-pins", create_bucket=True,
                                      cache=tmp_path / "cache", **server.storage_options(proxy.endpoint))
        expected = _pin_partition(board, tmp_path, 6, files=1)
        reader = boards.board_register("s3", name="reader", bucket="cold-pins", cache=tmp_path / "reader",
                                       **server.storage_options(proxy.endpoint))
        proxy.clear()
        _check(pin_get_many(list(expected), board=reader), expected)
        assert not [entry for entry in proxy.log if entry[0] == "HEAD"], proxy.log
        assert len(proxy.log) == 2 + 2 * len(expected), proxy.log   # the index, one listing, 2 a pin


def _threads_serving(board, monkeypatch) -> dict[str, str]:
    """{pin: name of the thread whose `pin_get` served it}, recorded as `pin_get_many` runs."""
    import threading

    served: dict[str, str] = {}
    pin_get = type(board).pin_get

    def recording(self, name, *args, **kwargs):
        served[name] = threading.current_thread().name
        return pin_get(self, name, *args, **kwargs)

    monkeypatch.setattr(type(board), "pin_get", recording)
    return served


@pytest.mark.timeout(180)
def test_pins_the_held_index_finds_cached_are_served_in_the_calling_thread(tmp_path, monkeypatch):
    """Cached pins need no request once the board holds its listing: 16 threads taking turns on the GIL
    made each dearer, so they are served one after another in the caller's thread; a pin not cached yet
    still goes to the threads."""
    import threading

    with s3.S3Server() as server:
        writer = boards.board_register("s3", name="writer", bucket="cached-here", create_bucket=True,
                                       cache=tmp_path / "writer", **server.storage_options())
        expected = _pin_partition(writer, tmp_path, 10, files=1)
        names = list(expected)
        board = boards.board_register("s3", name="bucket", bucket="cached-here", cache=tmp_path / "cache",
                                      **server.storage_options())
        _check(pin_get_many(names[:6], board="bucket"), {n: expected[n] for n in names[:6]})   # 6 cached
        served = _threads_serving(board, monkeypatch)
        _check(pin_get_many(names, board="bucket"), expected)
        here = threading.current_thread().name
        # the cached ones here, then the first cold one alone (the board's one-time work), the rest in the pool
        assert [n for n in names if served[n] == here] == names[:7], served
        assert all(served[n].startswith("pin-get") for n in names[7:]), served


def test_an_http_board_serves_cached_pins_in_the_calling_thread_once_its_index_is_read(tmp_path, monkeypatch):
    import threading

    from pinstorm.boards.cache import StaleCacheWarning

    folder = tmp_path / "served"
    source = boards.board_register("local", name="src", path=folder)
    expected = _pin_partition(source, tmp_path, 6, files=1)
    names, here = list(expected), threading.current_thread().name
    with boards.serve_board(folder) as url:
        remote = boards.board_register("datatxt", name="remote", url=url, cache=tmp_path / "cache")
        _check(pin_get_many(names, board="remote"), expected)
        served = _threads_serving(remote, monkeypatch)
        _check(pin_get_many(names, board="remote"), expected)
        assert set(served.values()) == {here}
    # the server is gone: its index is tried once for the call, then the cached copy serves every pin here
    storage = type(remote.storage)
    tried, fetch_url = [], storage._fetch_url
    monkeypatch.setattr(storage, "_fetch_url", lambda self, u, *a, **k: tried.append(u) or fetch_url(self, u, *a, **k))
    served.clear()
    with pytest.warns(StaleCacheWarning):
        _check(pin_get_many(names, board="remote"), expected)
    assert tried == [f"{url}/data.txt"] and set(served.values()) == {here}


def test_pins_go_to_the_threads_when_the_held_index_cannot_be_read(tmp_path, monkeypatch):
    """A first failure to read the held index stops the search for cached pins in the calling thread:
    pin_get in the threads then says for each what is wrong (or serves its cache), not one request after
    another here."""
    folder = tmp_path / "served"
    source = boards.board_register("local", name="src", path=folder)
    expected = _pin_partition(source, tmp_path, 5, files=1)
    names = list(expected)
    with boards.serve_board(folder) as url:
        remote = boards.board_register("datatxt", name="remote", url=url, cache=tmp_path / "cache")
        _check(pin_get_many(names, board="remote"), expected)
        asked = []

        def unreadable(self, name):
            asked.append(name)
            raise OSError("index unreadable")

        monkeypatch.setattr(type(remote.storage), "versions_held", unreadable)
        served = _threads_serving(remote, monkeypatch)
        _check(pin_get_many(names, board="remote"), expected)
    assert asked == names[:1]
    assert sum(thread.startswith("pin-get") for thread in served.values()) == len(names) - 1   # all but the first


def test_an_index_finds_an_entry_by_name_as_a_scan_would():
    from pinstorm.boards.backends.datatxt_board import IndexEntries

    entries = IndexEntries([{"name": "a", "path": "a/1/"}, {"name": 7, "path": "x/"}, {"name": "a", "path": "a/2/"},
                            {"name": "b", "path": "b/"}])
    assert entries.named("a")["path"] == "a/1/"   # the first of a name, as a scan of the list finds it
    assert entries.named("b")["path"] == "b/" and entries.named("c") is None and entries.named("7") is None
    assert entries == list(entries)   # still the list every other caller reads
