"""`_pins.yaml` (pins 1.x board manifest): R's exact format, untrusted-input checks, the URL board
that reads it, and the R legacy view's paths. The real R clients are in test_interop_r.py."""

from __future__ import annotations

import pandas as pd
import pytest

from pinstorm import boards
from pinstorm.boards.errors import MalformedMetadata, UnsafePath
from pinstorm.boards.legacy_view import legacy_manifest, pin_folder
from pinstorm.boards.manifest import dump_manifest, make_manifest, parse_manifest
from pinstorm.boards.meta import PinMeta

# written by R pins 1.1.0's write_board_manifest() (yaml::write_yaml) for this board
R_MANIFEST = """df_csv:
- df_csv/20261122T001445Z-05a32/
js:
- js/20261122T001445Z-40712/
- js/20261122T001446Z-afc64/
"""


def test_manifest_text_is_what_r_writes():
    stored = {"js": ["20261122T001445Z-40712", "20261122T001446Z-afc64"], "df_csv": ["20261122T001445Z-05a32"]}
    assert dump_manifest(make_manifest(stored)) == R_MANIFEST
    assert parse_manifest(R_MANIFEST) == make_manifest(stored)
    assert parse_manifest("") == {} and dump_manifest({}) == "{}\n"


@pytest.mark.parametrize("text, error", [
    ("- a\n- b\n", MalformedMetadata),                       # not a mapping
    ("x: 3\n", MalformedMetadata),                           # not version paths
    ("x:\n- ../etc/20261122T001445Z-05a32/\n", UnsafePath),  # climbs out of the board
    ("x:\n- /etc/20261122T001445Z-05a32/\n", UnsafePath),    # absolute
    ("x:\n- http://evil.example/x/v/\n", UnsafePath),        # another host
    ("x:\n- x/../../v/\n", UnsafePath),
    ("x:\n- x/..\n", UnsafePath),                            # no plain version folder
    ("x: !!python/object/apply:os.system [echo hi]\n", UnsafePath),  # the tag stays an inert string
    ("a: &a [x/v1/, x/v1/]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n", MalformedMetadata),
])
def test_hostile_manifests_are_refused(text, error):
    with pytest.raises(error):
        parse_manifest(text, source="http://127.0.0.1/_pins.yaml")


def test_manifest_size_is_capped():
    text = "x:\n" + "".join(f"- x/20261122T0014{i % 60:02d}Z-{i:05x}/\n" for i in range(2000))
    assert len(parse_manifest(text)["x"]) == 2000
    with pytest.raises(boards.BoardError, match="1024"):
        parse_manifest(text, max_bytes=1024)


def test_url_board_prefers_data_txt_and_falls_back_to_manifest(http_board, tmp_path):
    board, folder, url = http_board
    board.pin(pd.DataFrame({"a": [1]}), "frame")
    web = boards.board_register(url, name="web")
    assert web.kind == "url" and web.pin_find()["name"].tolist() == ["frame"]
    assert web.describe() == url  # it has a data.txt
    (folder / "data.txt").unlink()
    bare = boards.board_register(url, name="bare", cache=tmp_path / "c2")
    pd.testing.assert_frame_equal(bare.pin_get("frame"), pd.DataFrame({"a": [1]}))
    assert bare.describe() == f"{url}/_pins.yaml"
    explicit = boards.board_register("url", name="explicit", url=f"{url}/_pins.yaml", cache=tmp_path / "c3")
    assert explicit.pin_versions("frame").shape[0] == 1
    (folder / "_pins.yaml").write_text("frame:\n- ../outside/20261122T001445Z-05a32/\n")
    hostile = boards.board_register(url, name="hostile", cache=tmp_path / "c4")
    with pytest.raises(UnsafePath):
        hostile.pin_get("frame")


def test_manifest_kept_current_on_pin_and_remove(tmp_path):
    board = boards.board_register("local", name="b", path=tmp_path / "b")
    board.pin({"a": 1}, "one")
    board.pin({"a": 2}, "one")
    board.pin({"b": 1}, "two")
    versions = board.list_versions("one")
    manifest = parse_manifest((tmp_path / "b" / "_pins.yaml").read_text())
    assert manifest == {"one": [f"one/{v}/" for v in versions], "two": [f"two/{board.list_versions('two')[0]}/"]}
    board.pin_remove("two")
    assert parse_manifest((tmp_path / "b" / "_pins.yaml").read_text()) == {"one": [f"one/{v}/" for v in versions]}


def test_legacy_view_paths():
    csv = PinMeta(file=["iris.csv"], file_size=[10], pin_hash="", type="csv", description="d")
    assert legacy_manifest(csv)["path"] == ["../iris.csv#/data.csv"] and legacy_manifest(csv)["type"] == "table"
    files = PinMeta(file=["a b.txt", "sub/c#1.txt"], file_size=[1, 1], pin_hash="", type="file")
    assert legacy_manifest(files)["path"] == ["../a%20b.txt", "../sub/c%231.txt"]
    assert legacy_manifest(files)["type"] == "files"
    v = "20261122T001445Z-05a32"
    for path in (f"x/{v}/", f"x/{v}/r-legacy", f"x/{v}", "x"):
        assert pin_folder({"path": path, "version": v, "versions": [v]}) == "x"
    assert pin_folder({"path": f"https://h/b/x/{v}/r-legacy", "version": v}) == "https://h/b/x"


def test_index_from_an_older_pinstorm_gains_the_r_legacy_view(tmp_path):
    import shutil

    import yaml

    board = boards.board_register("local", name="old", path=tmp_path / "old")
    board.pin({"a": 1}, "one")
    version = board.list_versions("one")[-1]
    index_file = tmp_path / "old" / "data.txt"
    entries = yaml.safe_load(index_file.read_text())
    entries[0]["path"] = f"one/{version}/"  # what pinstorm wrote before the view existed
    index_file.write_text(yaml.safe_dump(entries))
    shutil.rmtree(tmp_path / "old" / "one" / version / "r-legacy")
    assert board.rebuild_index() == 1  # `pinstorm board repair` (or the next write) migrates it
    assert yaml.safe_load(index_file.read_text())[0]["path"] == f"one/{version}/r-legacy"
    assert (tmp_path / "old" / "one" / version / "r-legacy" / "data.txt").is_file()


def test_r_legacy_versions_are_read_and_checked(tmp_path):
    """A hand-made R legacy board (`versions = TRUE` layout); a version path that climbs out is refused."""
    root = tmp_path / "legacy"
    (root / "tab" / "_versions" / "abc123").mkdir(parents=True)
    (root / "data.txt").write_text("- path: tab\n  name: tab\n  type: table\n")
    (root / "tab" / "data.csv").write_text("a\n2\n")
    (root / "tab" / "data.txt").write_text("path: [data.csv]\ntype: table\nversions: [_versions/abc123]\n")
    (root / "tab" / "_versions" / "abc123" / "data.csv").write_text("a\n1\n")
    (root / "tab" / "_versions" / "abc123" / "data.txt").write_text("path: [data.csv]\ntype: table\n")
    with boards.serve_board(root) as url:
        web = boards.board_register(url, name="leg", cache=tmp_path / "cache")
        assert web.list_versions("tab") == ["abc123", "legacy"]
        assert web.pin_get("tab")["a"].tolist() == [2]
        assert web.pin_get("tab", version="abc")["a"].tolist() == [1]
        (root / "tab" / "data.txt").write_text("path: [data.csv]\ntype: table\nversions: [../../outside]\n")
        with pytest.raises(UnsafePath):
            boards.board_register(url, name="leg2", cache=tmp_path / "cache2").list_versions("tab")
