"""One way to name a board: `boards.resolve_board` is the only place a board argument becomes a `Board`,
and `constructors.KINDS` the only list of kinds (the registry, the CLI and error messages read it)."""

from __future__ import annotations

import re
import shutil

import pytest
from click.testing import CliRunner

from extras_support import needs
from pinstorm import boards
from pinstorm.boards import constructors, registry
from pinstorm.boards.errors import BoardError, BoardNotRegistered, ReadOnlyBoard


def test_every_form_resolves_by_the_documented_rules(tmp_path, http_board):
    _, _, url = http_board
    team = boards.board_register("local", name="team", path=tmp_path / "team")
    assert boards.resolve_board(team) is team                              # a Board: as it is
    assert boards.resolve_board("team") is team                            # a registered name
    assert boards.resolve_board("board://team") is team                    # board://NAME
    assert boards.resolve_board("board://team/") is team
    assert boards.resolve_board(None) is boards.resolve_board("local")     # None: the default board
    assert boards.resolve_board(None).name == "local"
    web = boards.resolve_board(url)                                        # an http(s) URL: a url board, unregistered
    assert web.kind == "url" and web.spec == {"kind": "url", "url": url} and web.name not in boards.board_names()
    spec = boards.resolve_board({"kind": "folder", "path": str(tmp_path / "team")})  # a spec dict
    assert spec.kind in ("folder", "local") and spec.describe() == team.describe()
    with pytest.raises(BoardNotRegistered, match="'nope' is not registered"):
        boards.resolve_board("nope")
    with pytest.raises(BoardNotRegistered):
        boards.resolve_board("board://nope")
    with pytest.raises(BoardError, match="board://<board-name>"):
        boards.resolve_board("board://team/pin")
    with pytest.raises(BoardError, match="not int"):
        boards.resolve_board(3)  # type: ignore[arg-type]


def test_every_entry_point_resolves_the_same_way(tmp_path, http_board):
    board, _, url = http_board
    board.pin({"v": 1}, "obj")
    team = boards.board_register("local", name="team", path=tmp_path / "team")
    team.pin({"t": 2}, "tobj")
    assert boards.board_get("team") is boards.resolve_board("team")          # the registry
    assert boards.board_get(url).spec == boards.resolve_board(url).spec
    for form in ("team", "board://team", team, {"kind": "folder", "path": str(tmp_path / "team")}):
        assert boards.pin_get("tobj", board=form) == {"t": 2}                 # the module-level API
        assert boards.pin_exists("tobj", board=form)
    for form in (url, "src", "board://src", {"kind": "url", "url": url}):
        assert boards.pin_get("obj", board=form) == {"v": 1}
    with pytest.raises(BoardNotRegistered):
        boards.pin_get("obj", board="nope")


@needs("pipeline")
def test_board_urls_in_the_pipeline_name_boards_as_the_resolver_does(tmp_path):
    from pinstorm import pipeline
    from pinstorm.pipeline.storage import BOARD_SCHEME, parse_board_url

    assert BOARD_SCHEME == registry.BOARD_SCHEME
    name, pin = parse_board_url("board://team/ds")
    team = boards.board_register("local", name="team", path=tmp_path / "team")
    assert boards.resolve_board(name) is team and pin == "ds"
    with pytest.raises(BoardNotRegistered):                              # the same error as the resolver's
        pipeline.dataset_info("board://nope/ds")


@needs("spark")   # profiling is training's, and spark_train needs pyspark
def test_profiling_and_spark_resolve_http_urls_as_url_boards(tmp_path):
    from pinstorm.training.profiling import ProfileError, _cold_board
    from pinstorm.training.spark import _partition_board_spec

    url = "http://127.0.0.1:1/team"
    assert _partition_board_spec(url) == boards.resolve_board(url).spec == {"kind": "url", "url": url}
    team = boards.board_register("local", name="team", path=tmp_path / "team")
    forms = ((url, boards.resolve_board(url)), ("board://team", team), (None, boards.resolve_board(None)))
    for form, expected in forms:
        clone, cache = _cold_board(form)
        shutil.rmtree(cache, ignore_errors=True)
        assert (clone.kind, clone.describe()) == (expected.kind, expected.describe())
    with pytest.raises(ProfileError, match="not registered"):
        _cold_board("nope")


def test_the_kind_table_is_the_one_list_of_kinds():
    assert list(boards.KINDS) == ["local", "folder", "url", "datatxt", "s3", "gcs", "gcloud", "azure", "kaggle"]
    assert registry.KINDS is constructors.KINDS
    with pytest.raises(BoardError) as caught:
        boards.board_register("ftp", name="x")
    assert constructors.kinds_text() in str(caught.value)
    with pytest.raises(BoardError, match="needs a bucket"):
        boards.board_from_spec({"kind": "s3"})
    for kind, row in boards.KINDS.items():
        assert row.description and callable(row.make), kind


def test_the_cli_offers_exactly_the_table_s_kinds(tmp_path, monkeypatch):
    from pinstorm.cli import cli

    result = CliRunner().invoke(cli, ["board", "register", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    listed = re.findall(r"^\s{2,}([a-z0-9]+)\s{2,}\S", result.output.split("Kinds:", 1)[1].split("Options:")[0], re.M)
    assert listed == list(boards.KINDS)
    result = CliRunner().invoke(cli, ["board", "register", "ftp", "--no-check"])
    assert result.exit_code == 2 and constructors.kinds_text() in result.output
    result = CliRunner().invoke(cli, ["board", "register", "url", "--no-check"])
    assert result.exit_code == 2 and "needs --url URL" in result.output


def test_maintenance_is_an_explicit_interface(tmp_path, http_board):
    _, _, url = http_board
    folder = boards.board_folder(tmp_path / "f")
    folder.pin({"a": 1}, "a")
    assert isinstance(folder.maintenance, boards.Maintenance)
    assert folder.rebuild_index() == 1 and folder.sweep_temporaries(older_than=0) == 0
    assert set(folder.stored_versions()) == {"a"}
    web = boards.resolve_board(url)
    assert web.maintenance is None
    with pytest.raises(ReadOnlyBoard, match="no index of its own"):
        web.rebuild_index()
    with pytest.raises(AttributeError):  # no forwarding of unknown names to the storage
        folder.root  # noqa: B018
    assert folder.storage.root and folder.board == str(tmp_path / "f")  # pins-python's board.board
