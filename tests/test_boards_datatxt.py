"""The read-only data.txt board over a real HTTP server on 127.0.0.1 (Range-honouring)."""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import requests

from pinstorm import boards
from pinstorm.boards.cache import StaleCacheWarning
from pinstorm.boards.errors import DownloadError, MalformedMetadata, PinNotFound, ReadOnlyBoard


def test_server_honours_range_and_etag(http_board):
    board, folder, url = http_board
    (folder / "blob.bin").write_bytes(bytes(range(256)) * 4)
    r = requests.get(f"{url}/blob.bin", headers={"Range": "bytes=10-19"})
    assert r.status_code == 206 and r.content == bytes(range(10, 20))
    assert r.headers["Content-Range"] == "bytes 10-19/1024"
    assert requests.get(f"{url}/blob.bin", headers={"Range": "bytes=-4"}).content == bytes(range(252, 256))
    etag = requests.get(f"{url}/blob.bin").headers["ETag"]
    assert requests.get(f"{url}/blob.bin", headers={"If-None-Match": etag}).status_code == 304
    import fsspec

    with fsspec.open(f"{url}/blob.bin", "rb", block_size=16) as f:  # fsspec random access works
        f.seek(1000)
        assert f.read(4) == bytes(range(232, 236))


def test_board_written_locally_reads_back_over_http(http_board, tmp_path):
    board, folder, url = http_board
    df = pd.DataFrame({"wnid": ["n01", "n02"], "count": [3, 4]})
    board.pin(df, "categories", description="ImageNet categories")
    imgs = tmp_path / "n01"
    imgs.mkdir()
    for i in range(3):
        (imgs / f"n01_{i}.JPEG").write_bytes(b"\xff\xd8" + bytes([i]) * 50)
    board.pin(imgs, "n01", zip=True, description="tench")
    web = boards.board_register("datatxt", name="web", url=url)
    assert set(boards.pin_find("", board="web")["name"]) == {"categories", "n01"}
    found = boards.pin_find("TENCH")  # searches every registered board
    assert sorted(zip(found["name"], found["board"])) == [("n01", "src"), ("n01", "web")]
    pd.testing.assert_frame_equal(boards.pin_get("categories", board="web"), df)
    files = boards.pin_get("n01", board="web")
    assert sorted(p.rsplit("/", 1)[1] for p in files) == [f"n01_{i}.JPEG" for i in range(3)]
    assert all(str(tmp_path / "cache") in p for p in files)
    assert boards.pin_versions("n01", board="web").shape[0] == 1
    assert boards.pin_info("n01", board="web")["description"] == "tench"
    with pytest.raises(ReadOnlyBoard):
        web.pin({"a": 1}, "x")
    with pytest.raises(PinNotFound, match="nope"):
        boards.pin_get("nope", board="web")
    # an http URL registers a datatxt board too
    assert boards.board_register(url + "/data.txt", name="web2").pin_get("categories").equals(df)


def test_offline_serves_cache_with_warning(tmp_path):
    folder = tmp_path / "served"
    board = boards.board_register("local", name="src", path=folder)
    board.pin({"v": 1}, "obj")
    with boards.serve_board(folder) as url:
        web = boards.board_register("datatxt", name="web", url=url)
        assert web.pin_get("obj") == {"v": 1}
    # the server is gone: the cached index and version are served, with a warning
    with pytest.warns(StaleCacheWarning, match="cannot reach"):
        assert web.pin_get("obj") == {"v": 1}
    assert web.pin_get("obj", download=False) == {"v": 1}  # explicitly offline: no warning needed
    fresh = boards.board_register("datatxt", name="never-seen", url=url)
    with pytest.raises(DownloadError, match="cannot reach"):
        fresh.pin_get("obj")


def test_new_versions_are_seen_after_revalidation(http_board):
    board, folder, url = http_board
    board.pin({"v": 1}, "obj")
    web = boards.board_register("datatxt", name="web", url=url)
    assert web.pin_get("obj") == {"v": 1}
    board.pin({"v": 2}, "obj")
    assert web.pin_get("obj") == {"v": 2}
    assert web.pin_versions("obj").shape[0] == 2
    assert web.pin_get("obj", version=web.pin_versions("obj")["version"].iloc[0]) == {"v": 1}


R_LEGACY_INDEX = """\
- path: iris/
  name: iris
  description: Fisher's iris as a table
  type: table
  rows: 3
  cols: 2
- path: files/readme.txt
  description: !expr system("touch /tmp/pinstorm-pwned")
- path: images
  name: images
  type: files
"""


def test_r_legacy_index_with_defaults_and_inert_tags(http_board):
    board, folder, url = http_board
    (folder / "data.txt").write_text(R_LEGACY_INDEX)
    (folder / "iris").mkdir()
    (folder / "iris" / "data.csv").write_text("a,b\n1,x\n2,y\n3,z\n")
    (folder / "iris" / "data.txt").write_text("path: data.csv\ntype: table\n")
    (folder / "files").mkdir()
    (folder / "files" / "readme.txt").write_text("hello")
    (folder / "images").mkdir()
    (folder / "images" / "data.txt").write_text("path:\n- a.png\n- b.png\n")
    (folder / "images" / "a.png").write_bytes(b"A")
    (folder / "images" / "b.png").write_bytes(b"B")
    web = boards.board_register(url, name="legacy")
    found = web.pin_find("")
    assert list(found["name"]) == ["iris", "readme.txt", "images"]
    assert found.set_index("name").loc["readme.txt", "type"] == "files"  # R's default
    assert "system(" in found.set_index("name").loc["readme.txt", "description"]  # a string, never run
    import os

    assert not os.path.exists("/tmp/pinstorm-pwned")
    assert web.pin_get("iris").shape == (3, 2)
    assert open(web.pin_get("readme.txt")[0]).read() == "hello"
    assert sorted(open(p).read() for p in web.pin_get("images")) == ["A", "B"]
    # legacy files are mutable: revalidated by ETag, so a change is picked up
    time.sleep(0.01)
    (folder / "files" / "readme.txt").write_text("hello again")
    assert open(web.pin_get("readme.txt")[0]).read() == "hello again"


def test_malformed_index_and_http_errors_are_clear(http_board):
    board, folder, url = http_board
    (folder / "data.txt").write_text("- path: [unclosed\n")
    with pytest.raises(MalformedMetadata, match="data.txt"):
        boards.board_register(url, name="bad").pin_find("")
    (folder / "data.txt").write_text("name: not-a-list\n")
    with pytest.raises(MalformedMetadata, match="list"):
        boards.board_register(url, name="bad2").pin_find("")
    with pytest.raises(DownloadError, match=r"HTTP 404 .*missing/(data.txt|_pins.yaml)"):
        boards.board_register(url + "/missing", name="bad3").pin_find("")


def test_archive_escaping_the_folder_is_refused(http_board, tmp_path):
    board, folder, url = http_board
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../../outside.txt", "pwned")
    board.pin(evil, "evil")
    web = boards.board_register(url, name="web")
    with pytest.raises(boards.UnsafeArchive, match="escapes"):
        web.pin_get("evil", extract=True)
    assert not (tmp_path / "outside.txt").exists()
    assert not list((tmp_path / "cache").rglob("outside.txt"))


def test_damaged_cache_is_repaired_with_cache_false(http_board):
    board, folder, url = http_board
    board.pin({"v": 1}, "obj")
    web = boards.board_register(url, name="web")
    path = web.pin_get("obj", files=True)[0]
    stat = os.stat(path)
    with open(path, "w") as f:
        f.write('{"v": 6}')  # the same size, different bytes: only the hash can tell
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime (else the cheap check sees it)
    assert web.pin_get("obj") == {"v": 6}  # trusted by default: no network work
    assert web.pin_get("obj", cache=False) == {"v": 1}


def test_pin_a_url_downloads_through_the_cache(http_board, tmp_path):
    board, folder, url = http_board
    (folder / "notes.csv").write_text("a,b\n1,2\n")
    got = boards.pin(f"{url}/notes.csv", "notes", type="csv")
    assert got.shape == (1, 2)
    assert boards.pin_info("notes")["source_url"] == f"{url}/notes.csv"
    with pytest.raises(DownloadError, match=r"HTTP 404 .*nothing.csv"):
        boards.pin(f"{url}/nothing.csv", "nothing")
    assert boards.pin_find("nothing").empty
    zipped = boards.pin(f"{url}/notes.csv", "zipped", zip=True)   # the download is zipped, not kept beside it
    assert [Path(p).read_text() for p in zipped] == ["a,b\n1,2\n"]
    assert boards.pin_info("zipped")["file"] == "zipped.zip"   # only the zip: the download went into it
