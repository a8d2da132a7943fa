"""pins-python (the `pins` package, 0.9) and pinstorm read each other's boards.

- pins-python reads a board pinstorm wrote: `board_folder` on the folder, and `board_url` over HTTP
  with the pin paths pinstorm's `_pins.yaml` lists (pins-python 0.9 takes the mapping, not the file);
- pinstorm reads a board pins-python wrote: as a local folder, and over HTTP through a `_pins.yaml`
  (pins-python writes none; pinstorm's `write_board_manifest` adds it), verifying pins-python's
  multi-file hash (xxh64 of the joined file hashes) on the way;
- pinstorm boards answer to pins-python's method names (`pin_write`, `pin_read`, `pin_upload`,
  `pin_download`, `pin_meta`, `pin_search`, `pin_versions_prune`, ...).
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pinstorm import boards
from pinstorm.boards.errors import IntegrityError

pins = pytest.importorskip("pins")

FRAME = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})


@pytest.fixture(autouse=True)
def pins_python_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PINS_CACHE_DIR", str(tmp_path / "pins-python-cache"))
    monkeypatch.setenv("PINS_DATA_DIR", str(tmp_path / "pins-python-data"))


def _files_text(paths) -> list[str]:
    return [Path(p).read_text() for p in sorted(paths)]


def test_pins_python_reads_pinstorm_folder_and_url(http_board, tmp_path):
    board, folder, url = http_board
    src = tmp_path / "src"
    src.mkdir()
    (src / "one.txt").write_text("one\n")
    (src / "two.txt").write_text("two\n")
    board.pin(FRAME, "frame_parquet", description="parquet")
    board.pin(FRAME, "frame_csv", type="csv")
    board.pin(FRAME, "frame_arrow", type="arrow")
    board.pin({"k": [1, 2]}, "obj_json", metadata={"owner": "ml"})
    board.pin([src / "one.txt", src / "two.txt"], "two_files")
    board.pin(src / "one.txt", "one_file")
    board.pin([src / "one.txt", src / "two.txt"], "zipped", zip=True)
    board.pin({"k": [3]}, "obj_json", metadata={"owner": "ml"})

    local = pins.board_folder(str(folder), allow_pickle_read=False)
    manifest = yaml.safe_load((folder / "_pins.yaml").read_text())
    web = pins.board_url(url + "/", {name: paths[-1] for name, paths in manifest.items()})
    for theirs in (local, web):
        pd.testing.assert_frame_equal(theirs.pin_read("frame_parquet"), FRAME)
        pd.testing.assert_frame_equal(theirs.pin_read("frame_csv"), FRAME)
        pd.testing.assert_frame_equal(theirs.pin_read("frame_arrow"), FRAME)
        assert theirs.pin_read("obj_json") == {"k": [3]}
        assert theirs.pin_meta("obj_json").user == {"owner": "ml"}
    assert _files_text(local.pin_download("one_file")) == ["one\n"]
    assert _files_text(local.pin_download("two_files")) == ["one\n", "two\n"]
    assert [Path(p).name for p in local.pin_download("zipped")] == ["zipped.zip"]
    with pytest.raises(NotImplementedError):  # pins-python 0.9's board_url downloads raw URLs, not pins
        web.pin_download("one_file")
    assert len(local.pin_versions("obj_json")) == 2
    assert local.pin_read("obj_json", version=local.pin_versions("obj_json")["version"][0]) == {"k": [1, 2]}


def test_pinstorm_reads_pins_python_board(tmp_path):
    folder = tmp_path / "py-board"
    theirs = pins.board_folder(str(folder), versioned=True)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("aaa\n")
    (src / "b.txt").write_text("bbb\n")
    theirs.pin_write(FRAME, "df_csv", type="csv", title="csv", metadata={"k": "v"})
    theirs.pin_write(FRAME, "df_parquet", type="parquet", title="parquet")
    theirs.pin_write(FRAME, "df_arrow", type="arrow", title="arrow")
    theirs.pin_write({"x": 0}, "js", type="json", title="json")
    time.sleep(1.1)  # pins-python names versions by the second: keep the two apart
    theirs.pin_write({"x": 1}, "js", type="json", title="json")
    theirs.pin_upload([str(src / "a.txt"), str(src / "b.txt")], "files2", title="two files")
    theirs.pin_upload(str(src / "a.txt"), "file1", title="one file")
    multi = theirs.pin_meta("files2")
    assert len(multi.pin_hash) == 16  # pins-python: xxh64 of the joined hashes

    local = boards.board_register("local", name="py-local", path=folder)
    pd.testing.assert_frame_equal(local.pin_get("df_csv"), FRAME)
    pd.testing.assert_frame_equal(local.pin_get("df_parquet"), FRAME)
    pd.testing.assert_frame_equal(local.pin_get("df_arrow"), FRAME)
    assert local.pin_get("js") == {"x": 1}
    assert len(local.list_versions("js")) == 2
    assert local.pin_get("js", version=local.list_versions("js")[0]) == {"x": 0}
    assert _files_text(local.pin_get("files2")) == ["aaa\n", "bbb\n"]
    assert _files_text(local.pin_get("file1")) == ["aaa\n"]
    assert local.pin_meta("df_csv").user == {"k": "v"}

    written = boards.write_board_manifest(local)  # what R's write_board_manifest() writes
    assert sorted(written) == ["df_arrow", "df_csv", "df_parquet", "file1", "files2", "js"]
    with boards.serve_board(folder) as url:
        web = boards.board_register(url, name="py-web", cache=tmp_path / "cache")
        pd.testing.assert_frame_equal(web.pin_get("df_parquet"), FRAME)
        assert web.pin_get("js") == {"x": 1}
        assert _files_text(web.pin_get("files2")) == ["aaa\n", "bbb\n"]  # verified: joined-hash scheme
        assert _files_text(web.pin_get("file1")) == ["aaa\n"]
        pd.testing.assert_frame_equal(web.pin_get("df_csv"), FRAME)
        assert web.pin_meta("df_csv").user == {"k": "v"}
        version = web.list_versions("files2")[-1]
        (folder / "files2" / version / "b.txt").write_text("BBB\n")
        fresh = boards.board_register(url, name="py-web-fresh", cache=tmp_path / "cache2")
        with pytest.raises(IntegrityError):
            fresh.pin_get("files2")


def test_pins_python_method_names_on_pinstorm_boards(tmp_path):
    board = boards.board_register("local", name="mine", path=tmp_path / "mine")
    meta = board.pin_write(FRAME, "frame", type="csv", title="Frame", description="numbers",
                           metadata={"k": 1}, tags=["demo", "tabular"])
    assert (meta.name, meta.type, meta.title, meta.user, meta.tags) == ("frame", "csv", "Frame", {"k": 1},
                                                                         ["demo", "tabular"])
    pd.testing.assert_frame_equal(board.pin_read("frame"), FRAME)
    pd.testing.assert_frame_equal(board.pin_read("frame", hash=meta.pin_hash), FRAME)
    with pytest.raises(IntegrityError, match="pin_hash"):
        board.pin_read("frame", hash="0" * 16)
    src = tmp_path / "f.txt"
    src.write_text("payload\n")
    up = board.pin_upload(str(src), "upload", title="a file")
    assert up.type == "file" and up.file == "f.txt"  # one file: a string, as pins-python's
    assert _files_text(board.pin_download("upload")) == ["payload\n"]
    with pytest.raises(boards.BoardError, match="pin_download"):
        board.pin_read("upload")
    assert board.pin_list() == ["frame", "upload"] and board.pin_exists("frame")
    found = board.pin_search("TABULAR")  # tags are searched too
    assert found["name"].tolist() == ["frame"] and found["meta"][0].tags == ["demo", "tabular"]  # pins-python's columns
    assert boards.pin_search("a file", board="mine")["name"].tolist() == ["upload"]
    # module-level names, as pins-python users call them on a board object
    boards.pin_write({"v": 1}, "obj", board="mine", type="json")
    assert boards.pin_read("obj", board="mine") == {"v": 1}
    assert boards.pin_meta("obj", board="mine").type == "json"
    # `urls` (R pins 1.2+ writes them) come back as a list, like tags
    version = board.list_versions("obj")[-1]
    data_txt = tmp_path / "mine" / "obj" / version / "data.txt"
    data_txt.write_text(data_txt.read_text() + "urls: https://example.org/obj.json\n")
    assert board.pin_meta("obj").urls == ["https://example.org/obj.json"] and board.pin_meta("obj").tags is None


def test_versions_prune_and_delete(tmp_path):
    board = boards.board_register("local", name="v", path=tmp_path / "v")
    for i in range(4):
        board.pin_write({"i": i}, "obj", type="json")
    versions = board.list_versions("obj")
    assert len(versions) == 4
    with pytest.raises(ValueError):
        board.pin_versions_prune("obj")
    assert board.pin_versions_prune("obj", days=365) == []  # all created just now
    assert board.pin_versions_prune("obj", n=2, grace=0) == versions[:2]  # grace=0: all are seconds old
    assert board.list_versions("obj") == versions[2:]
    board.pin_version_delete("obj", versions[2])
    assert board.list_versions("obj") == versions[3:]
    assert board.pin_versions_prune("obj", n=1) == []  # the newest version is never deleted
    assert board.pin_versions_prune("obj", days=0) == []
    board.pin_write({"i": 9}, "obj", type="json")
    with pytest.raises(boards.PinsVersionError):  # two versions: pins-python refuses an unversioned write
        board.pin_write({"i": 10}, "obj", type="json", versioned=False)
    assert len(board.list_versions("obj")) == 2
    board.pin_versions_prune("obj", n=1)
    board.pin_write({"i": 10}, "obj", type="json", versioned=False)  # one version: replaced by the new one
    assert len(board.list_versions("obj")) == 1 and board.pin_read("obj") == {"i": 10}
    versions = board.list_versions("obj")
    manifest = yaml.safe_load((tmp_path / "v" / "_pins.yaml").read_text())
    assert manifest == {"obj": [f"obj/{versions[0]}/"]}  # kept current on every write and delete


def test_cache_prune(tmp_path, http_board):
    import os
    import time

    board, folder, url = http_board
    board.pin({"a": 1}, "old")
    board.pin({"b": 2}, "new")
    web = boards.board_register(url, name="web", cache=tmp_path / "prune-cache")
    web.pin_get("old")
    web.pin_get("new")
    old_dir = web.cache.version_dir("web", "old", web.list_versions("old")[-1])
    long_ago = time.time() - 40 * 86400
    os.utime(old_dir / "data.txt", (long_ago, long_ago))
    assert boards.cache_prune(days=30, cache=tmp_path / "prune-cache", dry_run=True) == [str(old_dir)]
    assert old_dir.is_dir()
    assert boards.cache_prune(days=30, cache=tmp_path / "prune-cache") == [str(old_dir)]
    assert not old_dir.exists()
    assert web.pin_get("new") == {"b": 2} and web.pin_get("old") == {"a": 1}  # fetched again
