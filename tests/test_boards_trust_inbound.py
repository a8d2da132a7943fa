"""A board served by someone else cannot make pinstorm write outside its cache, follow other hosts,
expand bombs or switch extraction on past the limits (issue 8, cases 1-5), against real HTTP
servers on 127.0.0.1. Property tests (hypothesis) cover names, paths, data.txt and archives."""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import tarfile
import threading
import time
import zipfile
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pinstorm import boards
from pinstorm.boards import index
from pinstorm.boards.safety import paths
from pinstorm.boards.safety.archive import ExtractLimits, extract
from pinstorm.boards.backends.datatxt_board import DatatxtBoard
from pinstorm.boards.errors import (ArchiveTooLarge, DownloadError, LimitExceeded, MalformedMetadata,
                                    UnsafeArchive, UnsafePath)
from pinstorm.boards.serve import RangeRequestHandler


def _files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


@pytest.fixture
def served(tmp_path):
    """An empty folder served over HTTP: (folder, url)."""
    folder = tmp_path / "served"
    folder.mkdir()
    with boards.serve_board(folder) as url:
        yield folder, url


# ---- 1. legacy per-pin `path:` entries cannot write outside the cache ------------------------
@pytest.mark.parametrize("kind", ["absolute", "climb", "home", "inner-climb", "backslash"])
def test_legacy_path_entries_cannot_escape_the_cache(served, tmp_path, monkeypatch, kind):
    folder, url = served
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    target = {"absolute": str(tmp_path / "outside.txt"), "climb": "../../../../../outside.txt",
              "home": "~/outside.txt", "inner-climb": "ok/../../../outside.txt",
              "backslash": "..\\..\\..\\outside.txt"}[kind]
    (folder / "outside.txt").write_text("the server's bytes")  # what a careless client would fetch
    (folder / "data.txt").write_text("- path: evil/\n  name: evil\n")
    (folder / "evil").mkdir()
    (folder / "evil" / "data.txt").write_text(yaml.safe_dump({"path": ["fine.txt", target]}))
    (folder / "evil" / "fine.txt").write_text("fine")
    web = boards.board_register(url, name="web")
    with pytest.raises(UnsafePath) as refused:
        web.pin_get("evil")
    message = str(refused.value)
    assert "'evil'" in message and target.replace("\\", "\\\\") in message and url in message
    cache = tmp_path / "cache"
    assert not (tmp_path / "outside.txt").exists() and not (home / "outside.txt").exists()
    assert not list(tmp_path.rglob("outside.txt*")) or all(p.is_relative_to(folder) for p in tmp_path.rglob("outside.txt*"))
    # nothing at all was written for the pin: no file, no .http.json, no .lock
    assert _files_under(cache / "web" / "evil") == set()


def test_legacy_pin_with_safe_nested_paths_still_works(served):
    folder, url = served
    (folder / "data.txt").write_text("- path: pics/\n  name: pics\n")
    (folder / "pics" / "sub").mkdir(parents=True)
    (folder / "pics" / "data.txt").write_text("path:\n- a.png\n- sub/b.png\n")
    (folder / "pics" / "a.png").write_bytes(b"A")
    (folder / "pics" / "sub" / "b.png").write_bytes(b"B")
    got = boards.board_register(url, name="web").pin_get("pics")
    assert sorted(Path(p).read_bytes() for p in got) == [b"A", b"B"]


def test_version_file_names_cannot_escape(served, tmp_path):
    folder, url = served
    src = boards.board_register("local", name="src", path=folder)
    src.pin({"v": 1}, "obj")
    version = src.pin_versions("obj")["version"].iloc[-1]
    meta_path = folder / "obj" / version / "data.txt"
    meta = yaml.safe_load(meta_path.read_text())
    for bad in ["~/x.json", "a\\..\\..\\x.json", "data.txt"]:
        meta["file"] = bad
        meta_path.write_text(yaml.safe_dump(meta))
        with pytest.raises(UnsafePath, match="obj"):
            DatatxtBoard(f"w{abs(hash(bad))}", url, cache=tmp_path / "c").pin_get("obj")
    assert _files_under(tmp_path / "c") <= {p for p in _files_under(tmp_path / "c") if "/_urls/" in f"/{p}"}


# ---- 5. version names, other hosts, other schemes --------------------------------------------
@pytest.mark.parametrize("versions", [[".."], ["../other"], ["."], ["a/b"], [".hidden"]])
def test_version_values_escaping_are_refused(served, tmp_path, versions):
    folder, url = served
    src = boards.board_register("local", name="src", path=folder)
    src.pin({"secret": "other pin"}, "other")
    src.pin({"v": 1}, "obj")
    entries = index.parse_index((folder / "data.txt").read_text())
    for e in entries:
        if e["name"] == "obj":
            e["versions"] = versions
            e["version"] = versions[-1]
    (folder / "data.txt").write_text(index.dump_index(entries))
    web = boards.board_register(url, name="web")
    web.pin_get("other")  # another pin in the cache: '..' must not reach it
    with pytest.raises(UnsafePath, match=r"'obj'.*not a plain folder name"):
        web.pin_get("obj")


def test_absolute_urls_to_other_hosts_need_allow_external(tmp_path):
    other = tmp_path / "other"
    boards.board_register("local", name="o", path=other).pin({"from": "elsewhere"}, "far")
    version = boards.pin_versions("far", board="o")["version"].iloc[-1]
    home = tmp_path / "home-board"
    home.mkdir()
    with boards.serve_board(other) as other_url, boards.serve_board(home) as url:
        (home / "data.txt").write_text(f"- path: {other_url}/far/{version}/\n  name: far\n  version: {version}\n")
        strict = boards.board_register(url, name="strict")
        with pytest.raises(UnsafePath, match=r"'far'.*another host.*allow_external"):
            strict.pin_get("far")
        assert not (tmp_path / "cache" / "strict" / "far").exists()
        assert boards.board_register(url, name="open", allow_external=True).pin_get("far") == {"from": "elsewhere"}
        assert boards.board_register(url, name="listed", allow_external=[other_url]).pin_get("far") == \
            {"from": "elsewhere"}
        for scheme_path in ["file:///etc/", "memory://x/", "s3://bucket/far/"]:
            (home / "data.txt").write_text(f"- path: {scheme_path}{version}/\n  name: far\n  version: {version}\n")
            with pytest.raises(UnsafePath, match="scheme|http"):
                boards.board_register(url, name=f"s{len(scheme_path)}", allow_external=True).pin_get("far")


def test_board_headers_go_to_its_own_origin_only(tmp_path):
    seen: list[tuple[str, str | None]] = []

    class Recording(RangeRequestHandler):
        def send_head(self):
            seen.append((self.path, self.headers.get("Authorization")))
            return super().send_head()

    other = tmp_path / "other"
    boards.board_register("local", name="o", path=other).pin({"x": 1}, "far")
    version = boards.pin_versions("far", board="o")["version"].iloc[-1]
    with _server(other, Recording) as other_url, _server(tmp_path / "home", Recording, mkdir=True) as url:
        (tmp_path / "home" / "data.txt").write_text(f"- path: {other_url}/far/{version}/\n  name: far\n")
        web = boards.board_register(url, name="web", allow_external=True, headers={"Authorization": "Bearer s3cret"})
        assert web.pin_get("far") == {"x": 1}
    assert ("/data.txt", "Bearer s3cret") in seen
    assert [a for p, a in seen if p.startswith("/far/")] == [None, None]  # data.txt + file, no token


# ---- 3. YAML bombs and size caps -----------------------------------------------------------------
def _alias_bomb(levels: int = 9) -> str:
    text = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n"
    return text


def test_yaml_alias_bomb_in_an_index_is_refused_fast(served):
    folder, url = served
    bomb = "- path: x/\n  name: x\n  description:\n" + "".join(f"    {line}\n" for line in _alias_bomb().splitlines())
    assert len(bomb) < 1200
    (folder / "data.txt").write_text(bomb)
    with pytest.raises(LimitExceeded, match="alias"):
        boards.board_register(url, name="web").pin_find("")


def test_yaml_alias_bomb_in_a_version_data_txt_is_refused(served):
    folder, url = served
    src = boards.board_register("local", name="src", path=folder)
    src.pin({"v": 1}, "obj")
    version = src.pin_versions("obj")["version"].iloc[-1]
    meta_path = folder / "obj" / version / "data.txt"
    meta_path.write_text(meta_path.read_text() + "bomb:\n" + "".join(f"  {x}\n" for x in _alias_bomb().splitlines()))
    with pytest.raises(LimitExceeded, match="alias"):
        boards.board_register(url, name="web").pin_get("obj")


def test_a_few_aliases_are_still_fine():
    assert index.load_yaml("a: &x [1, 2]\nb: *x\n", source="t") == {"a": [1, 2], "b": [1, 2]}
    with pytest.raises(MalformedMetadata, match="recursive"):
        index.load_yaml("&a [*a]", source="t")


def test_index_size_is_capped_per_board(served):
    folder, url = served
    src = boards.board_register("local", name="src", path=folder)
    src.pin({"v": 1}, "obj", description="x" * 5000)
    with pytest.raises(LimitExceeded, match="1000-byte cap"):
        boards.board_register(url, name="small", max_index_bytes=1000).pin_get("obj")
    assert boards.board_register(url, name="big").pin_get("obj") == {"v": 1}  # the default cap is 16 MiB
    assert index.MAX_INDEX_BYTES == 16 << 20


def test_a_parsed_index_is_reused_by_the_next_process(served, tmp_path, monkeypatch):
    folder, url = served
    src = boards.board_register("local", name="src", path=folder)
    for i in range(3):
        src.pin({"i": i}, f"p{i}")
    first = DatatxtBoard("web", url, cache=tmp_path / "c")
    assert len(first.list_entries()) == 3
    second = DatatxtBoard("web", url, cache=tmp_path / "c")  # a fresh board: what another process has

    def no_parsing(*args, **kwargs):
        raise AssertionError("the index was parsed again")

    monkeypatch.setattr(index, "parse_index", no_parsing)
    assert [e["name"] for e in second.list_entries()] == ["p0", "p1", "p2"]
    monkeypatch.undo()
    src.pin({"i": 9}, "p9")  # the index changes: parsed again, once
    assert len(second.list_entries()) == 4


# ---- 4. archive bombs ------------------------------------------------------------------------------
ZEROS = 8 << 20
SMALL = ExtractLimits(max_bytes=None, max_ratio=50, ratio_floor=1 << 20)


def _bomb(path: Path, kind: str, size: int = ZEROS) -> Path:
    block = bytes(1 << 20)
    if kind == "zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("zeros.bin", "w") as out:
            for _ in range(size >> 20):
                out.write(block)
    elif kind in ("tar", "tar.gz"):
        data = io.BytesIO(bytes(size))
        info = tarfile.TarInfo("zeros.bin")
        info.size = size
        with tarfile.open(path, "w:gz" if kind == "tar.gz" else "w") as tf:
            tf.addfile(info, data)
    else:
        with gzip.open(path, "wb") as out:
            for _ in range(size >> 20):
                out.write(block)
    return path


@pytest.mark.parametrize("kind", ["zip", "tar.gz", "gz"])
def test_compression_bombs_stop_at_the_ratio(tmp_path, kind):
    bomb = _bomb(tmp_path / f"bomb.{kind}", kind)
    assert bomb.stat().st_size < ZEROS / 100
    with pytest.raises(ArchiveTooLarge, match="max_ratio"):
        extract(bomb, tmp_path / "out", limits=SMALL)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == [bomb.name]  # nothing half-extracted left
    assert len(extract(bomb, tmp_path / "out", limits={"max_ratio": None})) == 1  # raised per call: fine


@pytest.mark.parametrize("kind", ["zip", "tar", "tar.gz", "gz"])
def test_total_bytes_are_capped_on_what_is_written(tmp_path, kind):
    bomb = _bomb(tmp_path / f"big.{kind}", kind, size=3 << 20)
    with pytest.raises(ArchiveTooLarge, match="max_bytes"):
        extract(bomb, tmp_path / "out", limits={"max_bytes": 2 << 20, "max_ratio": None})
    assert sorted(p.name for p in tmp_path.iterdir()) == [bomb.name]
    assert extract(bomb, tmp_path / "ok", limits={"max_bytes": 4 << 20, "max_ratio": None})[0].stat().st_size == 3 << 20


def test_default_limits_stop_a_real_zip_bomb(tmp_path):
    bomb = _bomb(tmp_path / "bomb.zip", "zip", size=128 << 20)  # ~128 KB holding 128 MiB of zeros
    with pytest.raises(ArchiveTooLarge, match="200:1"):
        extract(bomb, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.zip"]


def test_remote_zipped_flag_cannot_switch_extraction_past_the_limits(served, tmp_path):
    folder, url = served
    bomb = _bomb(tmp_path / "bomb.zip", "zip")
    src = boards.board_register("local", name="src", path=folder)
    src.pin(bomb, "bomb")
    version = src.pin_versions("bomb")["version"].iloc[-1]
    meta_path = folder / "bomb" / version / "data.txt"
    meta_path.write_text(meta_path.read_text() + "pinstorm_zipped: true\n")  # the server asks for extraction
    web = boards.board_register(url, name="web", max_extract_bytes=4 << 20)
    with pytest.raises(ArchiveTooLarge, match="max_bytes"):
        web.pin_get("bomb")  # extract=None follows the flag, within the board's limits
    pin_cache = tmp_path / "cache" / "web" / "bomb"
    assert not [p for p in pin_cache.rglob("*") if "extracted" in p.as_posix() and p.is_file()]
    assert len(web.pin_get("bomb", extract_limits={"max_bytes": 16 << 20})) == 1  # raised for one call
    assert web.pin_get("bomb", extract=False)[0].endswith("bomb.zip")


# ---- URL pins and the URL cache ----------------------------------------------------------------------
def test_url_cache_paths_stay_inside_and_never_collide(tmp_path):
    cache = boards.Cache(tmp_path / "c")
    a = cache.url_path("b", "http://h/x?v=1")
    b = cache.url_path("b", "http://h/x?v=2")
    assert a != b and a.parent == b.parent == tmp_path / "c" / "b" / "_urls"
    assert cache.url_path("b", "http://h/a/b") != cache.url_path("b", "http://h/a_b")
    for url in ["..", "http://h/..", "http://h/../../..", "http://h/" + "x" * 5000]:
        p = cache.url_path("b", url)
        assert p.parent == tmp_path / "c" / "b" / "_urls" and not p.name.startswith(".")


# ---- Cache-Control: no-store / no-cache ---------------------------------------------------------------
@contextlib.contextmanager
def _server(folder: Path, handler: type, *, mkdir: bool = False):
    if mkdir:
        folder.mkdir(parents=True, exist_ok=True)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _handler(cache_control: str, log: list):
    class Handler(RangeRequestHandler):
        def send_head(self):
            log.append((self.path, self.headers.get("If-None-Match")))
            return super().send_head()

        def send_header(self, key, value):
            super().send_header(key, cache_control if key == "Cache-Control" else value)

    return Handler


def test_no_cache_revalidates_despite_max_age(tmp_path):
    folder = tmp_path / "served"
    boards.board_register("local", name="src", path=folder).pin({"v": 1}, "obj")
    log: list = []
    with _server(folder, _handler("no-cache, max-age=600", log)) as url:
        web = DatatxtBoard("web", url, cache=tmp_path / "c")
        web.list_entries()
        web.list_entries()
    index_requests = [etag for path, etag in log if path == "/data.txt"]
    assert len(index_requests) == 2 and index_requests[0] is None and index_requests[1]  # conditional


def test_no_store_keeps_no_validators_and_serves_no_stale_copy(tmp_path):
    folder = tmp_path / "served"
    boards.board_register("local", name="src", path=folder).pin({"v": 1}, "obj")
    log: list = []
    with _server(folder, _handler("no-store", log)) as url:
        web = DatatxtBoard("web", url, cache=tmp_path / "c")
        assert web.pin_get("obj") == {"v": 1}
        web.list_entries()
        assert [etag for path, etag in log if path == "/data.txt"] == [None, None]  # never conditional
        assert not list((tmp_path / "c").rglob("*.http.json"))
    with pytest.raises(DownloadError, match="cannot reach"):
        DatatxtBoard("web", url, cache=tmp_path / "c").list_entries()


def test_one_http_client_and_pickling(served, tmp_path):
    import pickle

    folder, url = served
    boards.board_register("local", name="src", path=folder).pin({"v": 1}, "obj")
    web = DatatxtBoard("web", url, cache=tmp_path / "c")
    assert not hasattr(web.storage, "fs")  # no second (fsspec) HTTP stack
    assert web.storage.session.get_adapter(url).max_retries.total == 2
    copy = pickle.loads(pickle.dumps(web))
    assert copy.pin_get("obj") == {"v": 1} and copy.storage.session is not web.storage.session


# ---- property tests ----------------------------------------------------------------------------------
_texts = st.lists(st.sampled_from(list("ab./\\~:-_ \x00") + ["..", "C:", "%2e"]), max_size=12).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_texts)
def test_property_contained_never_leaves_its_root(tmp_path, name):
    root = tmp_path / "root"
    try:
        p = paths.contained(root, name)
    except UnsafePath:
        return
    assert p.resolve().is_relative_to(root.resolve()) and p.resolve() != root.resolve()


@settings(max_examples=300, deadline=None)
@given(name=_texts)
def test_property_segments_are_single_and_not_dots(name):
    try:
        seg = paths.check_segment(name)
    except UnsafePath:
        return
    assert "/" not in seg and "\\" not in seg and not seg.startswith(".") and ".." not in seg


@settings(max_examples=200, deadline=None)
@example(ref="//:a")  # an unparsable port once escaped as a bare ValueError
@given(ref=st.one_of(_texts, st.sampled_from(["//evil:1/x", "http://evil/x", "file:///etc/passwd", "memory://a",
                                              "HTTP://127.0.0.1:9/x", "s3://b/k", "/abs/x", "../../x"])))
def test_property_urls_stay_on_the_board_origin(ref):
    base = "http://127.0.0.1:9/board"
    try:
        url = paths.resolve_url(base, ref)
    except UnsafePath:
        return
    assert paths.origin(url) == paths.origin(base)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=20))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                       max_leaves=20)
_entries = st.lists(st.fixed_dictionaries({"path": st.text(min_size=1, max_size=20).filter(str.strip),
                                           "name": st.text(min_size=1, max_size=20)},
                                          optional={"description": st.text(max_size=40), "extra": _values}),
                    max_size=5, unique_by=lambda e: e["name"])


@settings(max_examples=150, deadline=None)
@given(entries=_entries)
def test_property_index_round_trips_without_aliases(entries):
    for e in entries:
        e["shared"] = e.get("extra")  # the same object twice: a dumper would emit an alias
    text = index.dump_index(entries)
    assert "&id" not in text and "*id" not in text
    parsed = {e["name"]: e for e in index.parse_index(text)}
    for e in entries:
        assert parsed[e["name"]]["path"] == str(e["path"])
        assert parsed[e["name"]].get("extra") == e.get("extra")


@settings(max_examples=150, deadline=None)
@given(text=st.lists(st.sampled_from(list("- :&*[]{}!,'\"\n\tab1") + ["path: ", "&a ", "*a", "!!python/"]),
                    max_size=40).map("".join))
def test_property_untrusted_yaml_fails_only_with_board_errors(text):
    try:
        index.parse_index(text, source="fuzz", max_bytes=1000)
    except (MalformedMetadata, LimitExceeded):
        pass


@pytest.mark.filterwarnings("ignore:Duplicate name")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=st.lists(st.tuples(st.sampled_from(["a", "b/c", "../x", "/abs", "a/../../y", "d/", "..",
                                                   "e\\..\\..\\z", "f"]), st.binary(max_size=64)),
                        min_size=1, max_size=4),
       kind=st.sampled_from(["zip", "tar"]))
def test_property_archives_extract_inside_or_not_at_all(tmp_path, members, kind):
    work = tmp_path / f"w{time.monotonic_ns()}"
    work.mkdir()
    path = work / f"a.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in members:
                zf.writestr(name, data)
    else:
        with tarfile.open(path, "w") as tf:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    dest = work / "out"
    try:
        files = extract(path, dest, limits={"max_bytes": 1 << 16})
    except (UnsafeArchive, OSError):
        assert not dest.exists()
        assert sorted(p.name for p in work.iterdir()) == [path.name]
        return
    for f in files:
        assert f.resolve().is_relative_to(dest.resolve())
    assert sorted(p.name for p in work.iterdir()) == [path.name, "out"]


# ---- a colleague's bucket: legacy v0 data.txt on an S3 board (moto on 127.0.0.1) -------------------
def test_cloud_board_legacy_paths_cannot_escape_the_cache(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    from servers import s3

    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with s3.S3Server() as server:
        opts = dict(server.storage_options(), config_kwargs={"retries": {"max_attempts": 1}})
        writer = boards.board_register("s3", name="w", bucket="colleague", create_bucket=True,
                                       cache=tmp_path / "wc", **opts)
        writer.pin({"v": 1}, "obj")
        version = writer.pin_versions("obj")["version"].iloc[-1]
        root = f"{writer.storage.root}/obj/{version}"
        writer.storage.fs.pipe_file(f"{root}/x.txt", b"pwned")
        writer.storage.fs.pipe_file(f"{root}/data.txt", b"path: ../../../../x.txt\ntype: files\n")  # a v0 data.txt
        reader = boards.board_register("s3", name="r", bucket="colleague", cache=tmp_path / "rc", **opts)
        with pytest.raises(UnsafePath, match=r"'../../../../x.txt'.*'obj'"):
            reader.pin_get("obj", version=version)
    assert not [p for p in tmp_path.rglob("x.txt*") if p.is_file()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(_texts, st.text(max_size=12)))
def test_property_accepted_pin_names_and_url_file_names_are_one_segment(tmp_path, name):
    from pinstorm.boards.errors import InvalidPinName
    from pinstorm.boards.safety.names import check_pin_name

    cache = boards.Cache(tmp_path / "c")
    try:
        check_pin_name(name)
    except InvalidPinName:
        pass
    else:
        folder = cache.version_dir("b", name, "v1")
        assert folder.parent.parent == tmp_path / "c" / "b" and folder.resolve().is_relative_to(tmp_path / "c")
    file_name = paths.url_file_name(f"http://h/x/{name}")
    assert "/" not in file_name and not file_name.startswith(".") and file_name != "data.txt"
    assert paths.contained(tmp_path, file_name).parent == tmp_path.resolve()


def test_url_pin_file_names_are_single_safe_segments(served):
    folder, url = served
    (folder / "sub").mkdir()
    (folder / "sub" / ".profile").write_text("a,b\n1,2\n")
    got = boards.pin(f"{url}/sub/.profile", "dotted", type="csv")
    assert got.shape == (1, 2)
    assert [Path(p).name for p in boards.pin_get("dotted", files=True)] == ["profile"]


def test_size_cap_holds_without_content_length(tmp_path):
    from http.server import BaseHTTPRequestHandler

    class NoLength(BaseHTTPRequestHandler):  # HTTP/1.0, body until close: no size announced
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"- path: x/\n" * 1000)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NoLength)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        cache = boards.Cache(tmp_path / "c")
        with pytest.raises(LimitExceeded, match="1000-byte cap"):
            cache.fetch_url(f"{url}/data.txt", tmp_path / "c" / "x" / "data.txt", max_bytes=1000)
        assert _files_under(tmp_path / "c") <= {"x/data.txt.lock"}  # no body, no partial temporary
        web = DatatxtBoard("web", url, cache=tmp_path / "c", max_index_bytes=1000)
        with pytest.raises(LimitExceeded, match="1000-byte cap"):
            web.pin_find("")  # the index
        with pytest.raises(LimitExceeded, match="cap on metadata"):
            web.storage._get(f"{url}/x/v1/data.txt")  # a version's data.txt
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---- issue 31, item 6: a hostile or broken board never breaks an operation on another board --------
POISON = {  # an index entry each; the index stays valid YAML (or JSON flow lines)
    "long-int": "- path: big/\n  name: big\n  description: 'a pin'\n  versions:\n  - " + "9" * 5000 + "\n",
    "bad-date": "- path: big/\n  name: big\n  created: 2024-13-45\n  versions:\n  - 2024-99-99\n",
    "surrogate": '- {"path": "big/", "name": "big\\ud800", "description": "a lone \\udc00 surrogate"}\n',
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("poison", sorted(POISON))
def test_a_hostile_index_never_breaks_lookups_on_other_boards(tmp_path, poison):
    good = boards.board_register("local", name="zzz-good", path=tmp_path / "good")
    good.pin({"from": "the healthy board"}, "wanted")
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    (hostile / "data.txt").write_text(POISON[poison])
    with boards.serve_board(hostile) as url:
        boards.board_register(url, name="aaa-evil")  # searched before the healthy board
        for server in ("up", "down"):  # down: the hostile index comes from the cache
            with pytest.warns(UserWarning, match=rf"aaa-evil|{url}") if poison == "surrogate" else \
                    contextlib.nullcontext():
                found = boards.pin_find("")
            assert "wanted" in set(found["name"]), server
            assert boards.pin_get("wanted") == {"from": "the healthy board"}
            assert len(boards.pin_versions("wanted")) == 1
            assert boards.pin_info("wanted")["board"] == "zzz-good"
            assert boards.pin_meta("wanted")["board"] == "zzz-good"
            with pytest.raises(boards.BoardError) as refused:  # the hostile board's own pins: a named error
                boards.pin_get("big", board="aaa-evil")
            assert f"{url}/" in str(refused.value) and "data.txt" in str(refused.value)
            if poison == "surrogate":
                with pytest.raises(MalformedMetadata, match=r"lone surrogate"):
                    boards.pin_list(board="aaa-evil")
            else:
                assert boards.pin_list(board="aaa-evil") == ["big"]
            if server == "up":
                boards.board_get("aaa-evil").storage.index_max_age = 0
        # the server is down from here on
    with pytest.raises(boards.PinNotFound, match=r"no pin named 'absent'"):
        boards.pin_get("absent")


def test_a_board_whose_index_raises_anything_is_skipped_by_board_less_reads(tmp_path, monkeypatch):
    good = boards.board_register("local", name="zzz-good", path=tmp_path / "good")
    good.pin({"v": 1}, "wanted")
    broken = boards.board_register("local", name="aaa-broken", path=tmp_path / "broken")
    listed = type(broken.storage).list_entries

    def list_entries(self):  # an error no board class names: the lookup must still go on
        if self is broken.storage:
            raise RecursionError(f"{self.root}/data.txt nested too deeply")
        return listed(self)

    monkeypatch.setattr(type(broken.storage), "list_entries", list_entries)
    with pytest.warns(UserWarning, match=r"'aaa-broken' \(RecursionError: .*broken/data.txt"):
        assert boards.pin_get("wanted", board=None) == {"v": 1}
    with pytest.raises(boards.PinNotFound, match=r"could not read board\(s\) 'aaa-broken' \(RecursionError"):
        boards.pin_get("absent")


def test_long_integers_load_as_text_and_counts_are_checked_naming_the_file(served, tmp_path):
    assert index.load_yaml("a: " + "1" * 101 + "\nb: -" + "1" * 100 + "\nc: -0x_1f\n", source="s") == \
        {"a": "1" * 101, "b": -int("1" * 100), "c": -31}
    flow = index.parse_index('- {"path": "p/", "name": "p", "n": ' + "7" * 4500 + ', "m": 12}\n')
    assert flow[0]["n"] == "7" * 4500 and flow[0]["m"] == 12
    folder, url = served
    src = boards.board_register("local", name="src", path=folder)
    src.pin({"v": 1}, "obj")
    version = src.pin_versions("obj")["version"].iloc[-1]
    meta_path = folder / "obj" / version / "data.txt"
    meta = yaml.safe_load(meta_path.read_text())
    for size in ["9" * 5000, "-1", "{a: 1}", "1.5", "'²'"]:
        meta_path.write_text(yaml.safe_dump({**meta, "file_size": 0}).replace("file_size: 0", f"file_size: {size}"))
        with pytest.raises(MalformedMetadata, match=rf"{url}/obj/{version}/data.txt: file_size"):
            DatatxtBoard(f"w{abs(hash(size))}", url, cache=tmp_path / "c").pin_get("obj")


# ---- issue 31, item 7: a pin file cannot be the version's data.txt, however it is written -----------
@pytest.mark.parametrize("bad", ["./data.txt", "data.txt/", ".//data.txt", "DATA.TXT", "Data.Txt.",
                                 "data.txt::$DATA"])
def test_a_file_named_data_txt_however_written_is_refused(served, tmp_path, bad):
    folder, url = served
    src = boards.board_register("local", name="src", path=folder)
    src.pin({"v": 1}, "obj")
    version = src.pin_versions("obj")["version"].iloc[-1]
    meta_path = folder / "obj" / version / "data.txt"
    meta = yaml.safe_load(meta_path.read_text())
    meta_path.write_text(yaml.safe_dump({**meta, "file": bad}))
    with pytest.raises(UnsafePath, match=r"'obj'.*reserved for the pin's metadata") as refused:
        DatatxtBoard("w", url, cache=tmp_path / "c").pin_get("obj")
    assert f"{url}/obj/{version}/data.txt" in str(refused.value)
    assert not [p for p in _files_under(tmp_path / "c") if "/_urls/" not in f"/{p}"]  # nothing written


def test_dot_slash_data_txt_cannot_overwrite_the_cached_metadata(tmp_path):
    """The issue's case: `./data.txt` declared with 106 verified bytes; pinstorm used to write the
    version's metadata over them and return 133 bytes that no hash covered."""
    from http.server import BaseHTTPRequestHandler

    from pinstorm.boards.meta import PinMeta, hash_file

    payload = tmp_path / "payload"
    payload.write_bytes(b"p" * 106)
    meta = PinMeta(file=["./data.txt"], file_size=[106], pin_hash=hash_file(payload), type="file",
                   created="20240101T000000Z")
    version = meta.version_name
    bodies = {"/data.txt": index.dump_index([{"path": f"p/{version}/", "name": "p", "version": version,
                                              "versions": [version]}]).encode()}
    metadata_sent = []

    class Hostile(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path
            if path in (f"/p/{version}/data.txt", f"/p/{version}/./data.txt"):
                body = payload.read_bytes() if metadata_sent else meta.to_yaml().encode()
                metadata_sent.append(path)
            else:
                body = bodies.get(path, b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        with pytest.raises(UnsafePath, match=r"'\./data\.txt' \(pin 'p' of board .*reserved"):
            DatatxtBoard("web", url, cache=tmp_path / "c").pin_get("p", files=True)
        assert not (tmp_path / "c" / "web" / "p").exists()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_legacy_pins_and_duplicate_file_names_follow_the_same_rule(served, tmp_path):
    folder, url = served
    (folder / "data.txt").write_text("- path: evil/\n  name: evil\n")
    (folder / "evil").mkdir()
    (folder / "evil" / "data.txt").write_text(yaml.safe_dump({"path": ["fine.txt", "./data.txt"]}))
    (folder / "evil" / "fine.txt").write_text("fine")
    with pytest.raises(UnsafePath, match=r"'\./data\.txt'.*reserved"):
        boards.board_register(url, name="web").pin_get("evil")
    assert not (tmp_path / "cache" / "web" / "evil").exists() or \
        not any((tmp_path / "cache" / "web" / "evil").rglob("data.txt"))
    src = boards.board_register("local", name="src", path=folder)
    src.pin({"v": 1}, "obj")
    version = src.pin_versions("obj")["version"].iloc[-1]
    meta_path = folder / "obj" / version / "data.txt"
    meta = yaml.safe_load(meta_path.read_text())
    meta_path.write_text(yaml.safe_dump({**meta, "file": [meta["file"], "./" + meta["file"]],
                                         "file_size": [meta["file_size"]] * 2}))
    with pytest.raises(UnsafePath, match=r"name the same file"):
        DatatxtBoard("w2", url, cache=tmp_path / "c2").pin_get("obj")
    # the write side: the one path rule refuses it before anything lands in a cache folder
    with pytest.raises(UnsafePath, match="reserved"):
        paths.contained(tmp_path, "./data.txt")
    assert paths.contained(tmp_path, "sub/data.txt") == tmp_path.resolve() / "sub/data.txt"
    assert paths.check_relative("data.txt", what="version path") == "data.txt"  # the rule is for files


@pytest.mark.parametrize("name", ["data.txt", "DATA.TXT", "Data.Txt"])
def test_a_folder_whose_file_would_be_the_versions_data_txt_is_not_pinned(tmp_path, name):
    """On a case-insensitive disk DATA.TXT is the version's data.txt: pinning it would write the metadata over it."""
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "a.csv").write_text("a\n1\n")
    (folder / name).write_text("payload")
    with pytest.raises(boards.BoardError, match="would be the version's data.txt"):
        boards.pin(str(folder), "x")
    (folder / name).unlink()
    (folder / "sub").mkdir()
    (folder / "sub" / name).write_text("a file of the pin's own, below the version folder")
    boards.pin(str(folder), "x")
    assert sorted(Path(p).name for p in boards.pin_get("x", files=True)) == sorted(["a.csv", name])
