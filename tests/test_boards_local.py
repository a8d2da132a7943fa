"""The local board: pin / get / find / info / versions / remove, in the pins 1.x layout."""

from __future__ import annotations


import pandas as pd
import pins
import pytest
import yaml

from pinstorm import boards
from pinstorm.boards.errors import BoardError, InvalidPinName, PinNotFound, VersionNotFound


def test_dataframe_round_trip_parquet_and_csv(tmp_path):
    df = pd.DataFrame({"id": [1, 2, 3], "name": ["a", "b", "c"]})
    assert boards.pin(df, "table", description="Three rows").equals(df)
    assert boards.pin_get("table").equals(df)
    boards.pin(df, "table_csv", type="csv")
    pd.testing.assert_frame_equal(boards.pin_get("table_csv"), df)
    meta = yaml.safe_load((next((tmp_path / "board" / "table_csv").iterdir()) / "data.txt").read_text())
    assert meta["type"] == "csv" and meta["file"] == "table_csv.csv" and meta["api_version"] == 1


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_arrow_reads_a_dataframe_pin_from_its_own_file(kind, monkeypatch):
    """Never through a Python file object: Arrow reads one on its IO threads, and such a read holding
    the GIL while the interpreter finalizes aborts the process after its work is done (a writer of a
    repartition aborted so in CI: "terminate called without an active exception")."""
    import pyarrow as pa
    import pyarrow.feather
    import pyarrow.parquet

    module = pyarrow.parquet if kind == "parquet" else pyarrow.feather
    handed: list = []

    def spy(read):
        def reading(source, *args, **kwargs):
            handed.append((source, kwargs.get("pre_buffer")))
            return read(source, *args, **kwargs)
        return reading

    # pandas calls read_table, or (pandas 2 without its string dtype) feather's read_feather
    for name in ("read_table", "read_feather"):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, spy(getattr(module, name)))
    df = pd.DataFrame({"id": ["n01", "n02"], "images": [3, 4]})
    assert boards.pin(df, "cats", type=kind).equals(df)
    assert boards.pin_get("cats").equals(df)
    assert len(handed) >= 2 and all(isinstance(source, pa.NativeFile) for source, _ in handed), handed
    assert kind == "arrow" or {pre for _, pre in handed} == {False}   # no reads left running on IO threads


def test_file_folder_and_json_pins(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.txt").write_text("B")
    paths = boards.pin(src, "folder")
    assert sorted(p.split("/")[-1] for p in paths) == ["a.txt", "b.txt"]
    assert all(p.startswith("/") for p in paths)
    single = boards.pin(src / "a.txt", "single")
    assert open(single[0]).read() == "A"
    assert boards.pin({"classes": [1, 2]}, "obj") == {"classes": [1, 2]}
    assert boards.pin_get("obj") == {"classes": [1, 2]}
    # a pinned copy is independent of later edits to the source
    (src / "a.txt").write_text("changed")
    assert open(boards.pin_get("single")[0]).read() == "A"


def test_zip_pins_extract_by_default_and_on_request(tmp_path):
    src = tmp_path / "imgs"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.JPEG").write_bytes(bytes([i]) * 100)
    got = boards.pin(src, "cat", zip=True)
    assert sorted(p.rsplit("/", 1)[1] for p in got) == ["0.JPEG", "1.JPEG", "2.JPEG"]
    raw = boards.pin_get("cat", extract=False)
    assert len(raw) == 1 and raw[0].endswith("cat.zip")
    assert boards.pin_get("cat", extract=True) == got


def test_versions_prefix_and_identical_content(tmp_path):
    f = tmp_path / "v.txt"
    f.write_text("one")
    boards.pin(f, "v")
    boards.pin(f, "v")  # identical content: no new version
    assert len(boards.pin_versions("v")) == 1
    f.write_text("two")
    boards.pin(f, "v")
    versions = boards.pin_versions("v")
    assert len(versions) == 2 and list(versions.columns) == ["version", "created", "hash"]
    first = versions["version"].iloc[0]
    assert open(boards.pin_get("v", version=first[:17])[0]).read() == "one"
    assert open(boards.pin_get("v")[0]).read() == "two"
    with pytest.raises(VersionNotFound, match="no version"):
        boards.pin_get("v", version="19990101")
    with pytest.raises(VersionNotFound, match="ambiguous"):
        boards.pin_get("v", version="20")
    boards.pin_remove("v", version=first)
    assert list(boards.pin_versions("v")["version"]) == [versions["version"].iloc[1]]


def test_unversioned_board_keeps_only_latest(tmp_path):
    b = boards.board_register("local", name="flat", path=tmp_path / "flat", versions=False)
    f = tmp_path / "x.txt"
    for text in ("1", "2"):
        f.write_text(text)
        b.pin(f, "x")
    assert len(b.pin_versions("x")) == 1 and open(b.pin_get("x")[0]).read() == "2"


def test_find_info_remove_and_index(tmp_path):
    boards.pin(pd.DataFrame({"a": [1]}), "cats", description="Pictures of Cats")
    boards.pin({"x": 1}, "dogs", description="dogs")
    found = boards.pin_find("CAT")
    assert list(found.columns) == ["name", "description", "type", "board"]
    assert list(found["name"]) == ["cats"] and found["board"].iloc[0] == "local"
    info = boards.pin_info("cats")
    assert info["type"] == "parquet" and info["description"] == "Pictures of Cats" and info["versions"] == 1
    index = yaml.safe_load((tmp_path / "board" / "data.txt").read_text())
    assert {e["name"] for e in index} == {"cats", "dogs"}
    # each entry points inside its pin's folder (at the latest version's R legacy view)
    assert all(e["path"] == f"{e['name']}/{e['version']}/r-legacy" for e in index)
    boards.pin_remove("cats")
    assert boards.pin_find("cat").empty
    assert {e["name"] for e in yaml.safe_load((tmp_path / "board" / "data.txt").read_text())} == {"dogs"}
    with pytest.raises(PinNotFound, match="cats"):
        boards.pin_get("cats")


@pytest.mark.parametrize("bad", ["a/b", "../x", "..", "", "con", "a b", "x\\y", "-lead", "trail."])
def test_unsafe_pin_names_are_refused(bad, tmp_path):
    with pytest.raises(InvalidPinName):
        boards.pin({"a": 1}, bad)
    assert not (tmp_path / "board").exists() or not any((tmp_path / "board").glob("*/*/data.txt"))


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        boards.pin(tmp_path / "missing", "m")
    with pytest.raises(BoardError, match="JSON-able"):
        boards.pin(object(), "o")
    with pytest.raises(boards.BoardNotRegistered, match="nope"):
        boards.pin_get("x", board="nope")
    with pytest.raises(boards.BoardError, match="unknown board kind"):
        boards.board_register("ftp", name="f")


def test_malformed_version_data_txt_is_reported(tmp_path):
    boards.pin({"a": 1}, "p")
    data_txt = next((tmp_path / "board" / "p").iterdir()) / "data.txt"
    data_txt.write_text("api_version: 1\nfile: [unclosed\n")
    with pytest.raises(boards.MalformedMetadata, match="data.txt"):
        boards.pin_get("p")


def test_registry_persistence_and_default_board(tmp_path):
    assert boards.board_list()[0] == "local"
    boards.board_register("local", name="keep", path=tmp_path / "keep", persist=True)
    boards.board_register("local", name="temp", path=tmp_path / "temp")
    from pinstorm.boards import registry

    registry._boards.clear(); registry._specs.clear(); registry._loaded_from = None  # a new process
    assert "keep" in boards.board_list() and "temp" not in boards.board_list()
    boards.board_deregister("keep")
    registry._boards.clear(); registry._specs.clear(); registry._loaded_from = None
    assert "keep" not in boards.board_list()


def test_pin_get_without_board_searches_registered_boards(tmp_path):
    other = boards.board_register("local", name="other", path=tmp_path / "other")
    other.pin({"v": 1}, "elsewhere")
    assert boards.pin_get("elsewhere") == {"v": 1}


def test_pins_python_reads_what_pinstorm_writes_and_back(tmp_path):
    df = pd.DataFrame({"x": [1.5, 2.5], "y": ["u", "v"]})
    boards.pin(df, "from_pinstorm")
    boards.pin(df, "csv_pinstorm", type="csv")
    boards.pin({"k": [1, 2]}, "json_pinstorm")
    f = tmp_path / "f.bin"
    f.write_bytes(b"\x00\x01")
    boards.pin(f, "file_pinstorm")
    theirs = pins.board_folder(str(tmp_path / "board"), allow_pickle_read=False)
    pd.testing.assert_frame_equal(theirs.pin_read("from_pinstorm"), df)
    pd.testing.assert_frame_equal(theirs.pin_read("csv_pinstorm"), df)
    assert theirs.pin_read("json_pinstorm") == {"k": [1, 2]}
    assert open(theirs.pin_download("file_pinstorm")[0], "rb").read() == b"\x00\x01"
    # and pinstorm reads what pins-python writes
    theirs.pin_write(df, "from_pins", type="parquet")
    theirs.pin_write(df, "csv_pins", type="csv")
    theirs.pin_write({"a": 1}, "json_pins", type="json")
    theirs.pin_upload(str(f), "file_pins")
    pd.testing.assert_frame_equal(boards.pin_get("from_pins"), df)
    pd.testing.assert_frame_equal(boards.pin_get("csv_pins"), df)
    assert boards.pin_get("json_pins") == {"a": 1}
    assert open(boards.pin_get("file_pins")[0], "rb").read() == b"\x00\x01"
    assert set(boards.pin_find("pins")["name"]) >= {"from_pins", "csv_pins"}  # no index: derived
    assert boards.pin_versions("from_pins").shape[0] == 1
    (tmp_path / "board" / "data.txt").write_text("[]")  # keep the check honest: index alone isn't used for get
    assert boards.pin_get("json_pinstorm") == {"k": [1, 2]}


@pytest.mark.slow
def test_concurrent_registrations_from_processes_all_persist(tmp_path):
    import stat
    import subprocess
    import sys

    script = ("import sys; from pinstorm import boards; "
              "boards.board_register('local', name=f'b{sys.argv[1]}', path=sys.argv[2], persist=True)")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i), str(tmp_path / f"b{i}")],
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    path = tmp_path / "config" / "boards.yaml"
    assert set(yaml.safe_load(path.read_text())["boards"]) == {f"b{i}" for i in range(4)}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_local_board_reads_offline_without_a_cached_copy(tmp_path):
    """`download=False` (`pinstorm get --offline`) on a board on local disk serves its own folder:
    there is nothing to download, so the cache being empty is no reason to fail."""
    board = boards.board_register("local", name="offline", path=tmp_path / "b", cache=tmp_path / "empty-cache")
    board.pin({"a": 1}, "obj")
    fresh = boards.board_register("local", name="offline2", path=tmp_path / "b", cache=tmp_path / "other-cache")
    assert fresh.pin_get("obj", download=False) == {"a": 1}


def test_an_unversioned_write_keeps_the_version_it_wrote_even_when_another_sorts_last(tmp_path):
    """A version folder another tool made (a name that sorts after pins' time-stamped ones) must not
    make `versioned=False` delete the version just written: with it the pin has two versions, so the
    write is refused (PinsVersionError, as pins-python) and nothing is deleted; on a pin of one
    version (the foreign one) the write replaces it."""
    board = boards.board_folder(tmp_path / "b")
    board.pin_write({"v": 1}, "obj", type="json")
    first = board.list_versions("obj")[0]
    foreign = tmp_path / "b" / "obj" / "zz-hand-made"
    foreign.mkdir()
    (foreign / "data.txt").write_text((tmp_path / "b" / "obj" / first / "data.txt").read_text())
    (foreign / "obj.json").write_text('{"v": 1}')
    with pytest.raises(boards.PinsVersionError):
        board.pin_write({"v": 2}, "obj", type="json", versioned=False)
    assert sorted(board.list_versions("obj")) == sorted([first, "zz-hand-made"])
    board.pin_version_delete("obj", first)
    meta = board.pin_write({"v": 2}, "obj", type="json", versioned=False)
    assert board.list_versions("obj") == [meta.version.version]
    assert board.pin_read("obj") == {"v": 2}
