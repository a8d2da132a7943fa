"""One pins-python script, run on pins-python and on pinstorm, observes the same results.

The script uses only pins-python's API (constructors, `pin_write` returning a `Meta`, `created=`,
`force_identical_write=`, `pin_read`, `pin_meta`, `pin_versions` as a DataFrame and as objects,
`pin_exists`, `pin_list`, `pin_search`, `pin_upload`/`pin_download`, `pin_version_delete`,
`pin_versions_prune`, `pin_delete`). Where pinstorm deliberately differs (docs/boards.md,
"pins-python's API"), the script avoids the difference: it waits a second between two versions of one
pin, because pins-python cannot store two in one second.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pandas as pd
import pytest

from pinstorm import boards

pins = pytest.importorskip("pins")


@pytest.fixture(autouse=True)
def pins_python_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PINS_CACHE_DIR", str(tmp_path / "pins-python-cache"))
    monkeypatch.setenv("PINS_DATA_DIR", str(tmp_path / "pins-python-data"))


def script(P, folder: Path) -> dict:
    """What a pins-python user's script sees; `P` is `pins` or `pinstorm.boards`."""
    seen: dict = {}
    board = P.board_folder(str(folder / "board"))
    meta = board.pin_write({"a": 1}, "obj", type="json", title="first")
    seen["meta"] = (meta.name, meta.type, meta.title, len(meta.version.version), meta.version.hash == meta.pin_hash,
                    isinstance(meta.local, dict), meta.to_dict()["title"])
    seen["read"] = board.pin_read("obj")
    again = board.pin_write({"a": 1}, "obj", type="json", title="first")  # identical: nothing stored
    seen["identical"] = (again.version.version == meta.version.version, len(board.pin_versions("obj")))
    time.sleep(1.1)
    board.pin_write({"a": 1}, "obj", type="json", title="first", force_identical_write=True)
    seen["forced"] = len(board.pin_versions("obj"))
    old = board.pin_write({"a": 2}, "old", type="json", created=dt.datetime(2020, 1, 2, 3, 4, 5))
    seen["created"] = (old.version.version.split("-")[0], str(old.created))
    versions = board.pin_versions("obj")
    seen["versions_df"] = (sorted(versions.columns), len(versions), list(versions["version"]) ==
                           sorted(versions["version"]))
    objects = board.pin_versions("obj", as_df=False)
    seen["versions_objects"] = [v.version for v in objects] == list(versions["version"])
    seen["exists"] = (board.pin_exists("obj"), board.pin_exists("nope"))
    seen["list"] = sorted(board.pin_list())
    seen["search"] = sorted(board.pin_search("obj")["name"])
    seen["search_meta"] = [m.name for m in board.pin_search("old", as_df=False)]
    upload = folder / "notes.txt"
    upload.write_text("hello")
    board.pin_upload(str(upload), "up")
    seen["download"] = [Path(p).read_text() for p in board.pin_download("up")]
    board.pin_version_delete("obj", versions["version"].iloc[0])
    seen["after_version_delete"] = len(board.pin_versions("obj"))
    time.sleep(1.1)
    for i in range(2):
        board.pin_write({"i": i}, "many", type="json")
        time.sleep(1.1)
    board.pin_versions_prune("many", n=1) if P is pins else board.pin_versions_prune("many", n=1, grace=0)
    seen["pruned"] = len(board.pin_versions("many"))
    board.pin_delete(["old", "many"])
    seen["after_delete"] = sorted(board.pin_list())
    frame = pd.DataFrame({"x": [1, 2], "y": ["a", "b"]})
    for kind in ("csv", "parquet", "arrow"):
        board.pin_write(frame, f"frame-{kind}", type=kind)
        seen[kind] = (board.pin_read(f"frame-{kind}").to_dict("list"), board.pin_meta(f"frame-{kind}").type)
    return seen


@pytest.mark.slow
def test_the_same_pins_python_script_sees_the_same_results(tmp_path):
    theirs = script(pins, tmp_path / "pins-python")
    ours = script(boards, tmp_path / "pinstorm")
    assert ours == theirs


def test_pinstorm_reads_what_the_script_wrote_with_pins_python_and_back(tmp_path):
    """The board each wrote is the other's to read: same names, versions and values."""
    theirs = pins.board_folder(str(tmp_path / "b"))
    theirs.pin_write({"v": 1}, "shared", type="json")
    ours = boards.board_folder(tmp_path / "b")
    assert ours.pin_read("shared") == {"v": 1}
    assert list(ours.pin_versions("shared")["version"]) == list(theirs.pin_versions("shared")["version"])
    time.sleep(1.1)
    ours.pin_write({"v": 2}, "shared", type="json")
    assert theirs.pin_read("shared") == {"v": 2}


def test_a_board_passed_first_as_in_r_gets_a_message_that_says_so(tmp_path):
    board = boards.board_folder(tmp_path / "b")
    with pytest.raises(TypeError, match="the board goes last"):
        boards.pin_write(board, {"a": 1}, "name")
    with pytest.raises(TypeError, match="the board goes last"):
        boards.pin_read(board, "name")
