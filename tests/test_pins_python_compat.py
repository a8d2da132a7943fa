"""pins-python's observable behaviour on pinstorm's boards (issue 33): its constructor arguments,
`board()` / `board_deparse`, its errors, pickles only on request, `versioned=False`, pruning, search
and metadata shapes. tests/test_pins_python_suite.py runs pins-python's own tests; these pin the
pinstorm side, pickles above all."""

from __future__ import annotations

import datetime as dt
import os
import time

import pandas as pd
import pytest

from pinstorm import boards
from pinstorm.errors import PinstormError


@pytest.fixture(autouse=True)
def no_pickle_env(monkeypatch):
    monkeypatch.delenv("PINS_ALLOW_PICKLE_READ", raising=False)


def test_a_pins_python_first_line_works(tmp_path):
    board = boards.board_folder(str(tmp_path / "b"), allow_pickle_read=False)
    assert board.allow_pickle_read is False and board.versioned is True and board.board == str(tmp_path / "b")
    board.pin_write({"a": 1}, "x", type="json")
    assert board.pin_read("x") == {"a": 1}
    for make in (boards.board_temp, boards.board_local):
        assert make(True, True).allow_pickle_read is True


def test_pickles_are_refused_by_default_and_read_only_on_request(tmp_path, monkeypatch):
    board = boards.board_folder(tmp_path / "b")
    obj = {"a": 1, "b": [2, 3]}
    meta = board.pin_write(obj, "model", type="joblib", title="a model")
    assert meta.type == "joblib" and meta.file == "model.joblib"
    with pytest.raises(boards.PinsInsecureReadError, match="joblib") as caught:
        board.pin_read("model")
    assert isinstance(caught.value, boards.PinsError) and isinstance(caught.value, PinstormError)
    # pin_get never unpickles either: the file's path comes back
    assert board.pin_get("model") == [str(tmp_path / "b" / "model" / meta.version.version / "model.joblib")]
    assert boards.board_folder(tmp_path / "b", allow_pickle_read=True).pin_read("model") == obj
    monkeypatch.setenv("PINS_ALLOW_PICKLE_READ", "1")
    assert boards.board_folder(tmp_path / "b").pin_read("model") == obj
    with pytest.raises(boards.PinsInsecureReadError):  # the board's own False wins over the variable
        boards.board_folder(tmp_path / "b", allow_pickle_read=False).pin_read("model")
    monkeypatch.setenv("PINS_ALLOW_PICKLE_READ", "0")
    with pytest.raises(boards.PinsInsecureReadError):
        boards.board_folder(tmp_path / "b").pin_read("model")
    df = pd.DataFrame({"x": [1, 2]})
    board.pin_write(df, "frame", type="joblib")
    assert boards.board_folder(tmp_path / "b", allow_pickle_read=True).pin_read("frame").equals(df)


def test_errors_are_pins_pythons_and_pinstorms(tmp_path):
    board = boards.board_folder(tmp_path / "b")
    assert boards.PinsError is boards.BoardError
    with pytest.raises(NotImplementedError, match="MY_TYPE"):
        board.pin_write(object(), "x", type="MY_TYPE")
    with pytest.raises(NotImplementedError):
        board.pin_write(object(), "x")
    (tmp_path / "f.csv").write_text("x\n1\n")
    with pytest.raises(NotImplementedError, match="pin_upload"):
        board.pin_write(tmp_path / "f.csv", "x", type="file")
    board.pin_upload(tmp_path / "f.csv", "f")
    with pytest.raises(NotImplementedError):
        board.pin_read("f")
    with pytest.raises(boards.PinsError, match="does not exist"):
        board.pin_meta("nope")
    with pytest.raises(ValueError, match="reserved for internal use"):
        board.pin_write([1], "_pins.yaml", type="json")
    with pytest.raises(ValueError, match="Invalid pin name"):
        board.path_to_pin("/x")
    with pytest.warns(DeprecationWarning):
        assert board.pin_write(pd.DataFrame({"x": [1]}), "fe", type="feather").type == "arrow"


def test_versioned_false_follows_pins_python(tmp_path):
    board = boards.board_folder(tmp_path / "b")
    board.pin_write({"a": 1}, "p", type="json", created=dt.datetime.now() - dt.timedelta(minutes=1))
    board.pin_write({"a": 2}, "p", type="json", versioned=False)  # one version: replaced
    assert len(board.pin_versions("p")) == 1 and board.pin_read("p") == {"a": 2}
    board.pin_write({"a": 3}, "p", type="json")
    with pytest.raises(boards.PinsVersionError):  # several versions: refused, nothing deleted
        board.pin_write({"a": 4}, "p", type="json", versioned=False)
    assert len(board.pin_versions("p")) == 2
    unversioned = boards.board_folder(tmp_path / "u", versioned=False)
    unversioned.pin_write({"a": 1}, "p", type="json")
    unversioned.pin_write({"a": 2}, "p", type="json")
    assert len(unversioned.pin_versions("p")) == 1


def test_identical_write_message_prune_search_and_metadata_shapes(tmp_path, capfd):
    board = boards.board_folder(tmp_path / "b")
    now = dt.datetime.now()
    for days in (2, 1, 0):
        board.pin_write({"a": 1}, "p", type="json", title="t", created=now - dt.timedelta(days=days, minutes=1),
                        force_identical_write=True)
    board.pin_write({"a": 1}, "p", type="json", title="t")
    assert 'The hash of pin "p" has not changed. Your pin will not be stored.' in capfd.readouterr().err
    assert len(board.pin_versions_prune("p", days=1)) == 2  # no grace period by default, as pins-python
    assert len(board.pin_versions("p")) == 1
    meta = board.pin_meta("p")
    assert meta.file == "p.json" and isinstance(meta.file_size, int)
    assert meta.version.created.tzinfo is None and len(meta.version.hash) == 5
    assert board.pin_write({"b": 1}, "q1", type="json").version.hash == board.pin_meta("q1").pin_hash
    assert sorted(m.name for m in board.pin_search("[0-9]", as_df=False)) == ["q1"]
    assert list(board.pin_search("p").columns) == ["name", "type", "title", "created", "file_size", "meta"]


def test_board_dispatcher_deparse_and_environment(tmp_path, monkeypatch):
    board = boards.board("file", str(tmp_path / "b"), allow_pickle_read=True)
    assert boards.board_deparse(board) == f"board_folder({str(tmp_path / 'b')!r}, allow_pickle_read=True)"
    again = eval(boards.board_deparse(board), vars(boards))
    assert again.board == board.board and again.allow_pickle_read is True
    monkeypatch.delenv("PINSTORM_CACHE", raising=False)
    monkeypatch.delenv("PINSTORM_BOARD", raising=False)
    monkeypatch.setenv("PINS_CACHE_DIR", str(tmp_path / "pins-cache"))
    monkeypatch.setenv("PINS_DATA_DIR", str(tmp_path / "pins-data"))
    assert boards.board_local().board == str(tmp_path / "pins-data")
    assert boards.board_folder(tmp_path / "c").cache.root == tmp_path / "pins-cache"
    old = tmp_path / "pins-cache" / "b" / "p" / "20200101T000000Z-abcde"
    old.mkdir(parents=True)
    (old / "data.txt").write_text("x")
    then = time.time() - 40 * 86400
    os.utime(old / "data.txt", (then, then))
    assert boards.cache_prune(days=30, cache_root=tmp_path / "pins-cache", prompt=False) == [str(old)]
    assert boards.cache_info() == {"b": 0}  # prints the cache folder; bytes per board (the pruned one is empty)


def test_rds_pins_read_as_pins_python_reads_them(tmp_path):
    """pins-python's own example board (in its wheel) holds an R `.rds` pin: a DataFrame through rdata
    where it is installed, else pins-python's ModuleNotFoundError; pin_get returns the path either way."""
    import shutil
    from importlib import metadata

    try:
        example = metadata.distribution("pins").locate_file("pins/tests/pins-compat")
    except metadata.PackageNotFoundError:
        pytest.skip("pins-python is not installed (its example board ships in its wheel)")
    shutil.copytree(str(example), tmp_path / "b")
    board = boards.board_folder(tmp_path / "b")
    assert board.pin_meta("df_rds").type == "rds"
    try:
        import rdata  # noqa: F401
    except ImportError:
        with pytest.raises(ModuleNotFoundError, match="rdata"):
            board.pin_read("df_rds")
        assert str(board.pin_get("df_rds")[0]).endswith(".rds")
    else:
        assert isinstance(board.pin_read("df_rds"), pd.DataFrame)
