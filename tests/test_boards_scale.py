"""Boards at ImageNet size: batches publish the indexes once, a crash inside a batch is repaired,
concurrent batch writers lose nothing, and the JSON-line index reads the same in every YAML reader.

How cost grows with the number of pins is measured in bench/bench_scale.py, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from extras_support import needs
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pinstorm import boards
from pinstorm.boards import index, manifest
from servers import gcs, s3

s3_server = pytest.fixture(scope="module", name="s3_server")(s3.serve)
gcs_server = pytest.fixture(scope="module", name="gcs_server")(gcs.serve)


def _index(board) -> dict[str, dict]:
    return {e["name"]: e for e in yaml.safe_load(board.storage.fs.cat_file(f"{board.storage.root}/data.txt")) or []}


def _manifest(board) -> dict[str, list[str]]:
    return yaml.safe_load(board.storage.fs.cat_file(f"{board.storage.root}/_pins.yaml")) or {}


def _make(kind: str, tmp_path: Path, request, name: str = "big"):
    """A fresh board of `kind` and the options another process needs to open it."""
    if kind == "local":
        options = {"kind": "local", "path": str(tmp_path / "board")}
        return boards.board_register("local", name=name, path=options["path"]), options
    server = request.getfixturevalue(f"{kind}_server")
    bucket = f"scale-{uuid.uuid4().hex[:10]}"
    options = {"kind": kind, "bucket": bucket, "path": "team", "cache": str(tmp_path / "cache"),
               **server.storage_options()}
    board = boards.board_register(kind, name=name, bucket=bucket, path="team", create_bucket=True,
                                  cache=tmp_path / "cache", **server.storage_options())
    return board, options


@pytest.mark.parametrize("kind", ["local", "s3", "gcs"])
def test_a_batch_publishes_the_indexes_once_with_every_pin(kind, tmp_path, request):
    board, _ = _make(kind, tmp_path, request)
    board.pin({"before": True}, "before")
    with boards.batch(board):
        for i in range(12):
            board.pin({"i": i}, f"cat{i:02d}", description=f"category {i}")
        assert set(_index(board)) == {"before"}  # nothing published yet: one publish at the end
        assert board.pin_get("cat03") == {"i": 3}  # but every version is stored and readable
    listed = _index(board)
    assert set(listed) == {"before"} | {f"cat{i:02d}" for i in range(12)}
    for name, entry in listed.items():
        versions = board.list_versions(name)
        assert entry["versions"] == versions and entry["path"] == f"{name}/{versions[-1]}/r-legacy"
        # the R legacy view was stored with the version, where the index points
        view = yaml.safe_load(board.storage.fs.cat_file(f"{board.storage.root}/{entry['path']}/data.txt"))
        assert view["path"] == [f"../{name}.json"]
    assert {k: [p.split("/")[1] for p in v] for k, v in _manifest(board).items()} == \
        {name: board.list_versions(name) for name in listed}


def test_a_batch_closed_by_an_error_still_lists_what_it_stored(tmp_path):
    board = boards.board_register("local", name="b", path=tmp_path / "board")
    with pytest.raises(RuntimeError, match="halfway"):
        with board.batch():
            board.pin({"a": 1}, "a")
            board.pin({"b": 2}, "b")
            raise RuntimeError("halfway")
    assert set(_index(board)) == {"a", "b"}
    with board.batch():  # nested batches publish when the outermost closes
        with board.batch():
            board.pin({"c": 3}, "c")
        assert "c" not in _index(board)
    assert set(_index(board)) == {"a", "b", "c"}


# Pins inside a batch, then dies (SIGKILL) before the batch can publish.
KILLED_IN_BATCH = textwrap.dedent("""
    import json, os, signal, sys
    from pinstorm import boards
    options = json.loads(sys.argv[1])
    board = boards.board_register(options.pop("kind"), name="big", **options)
    with board.batch():
        for i in range(int(sys.argv[2])):
            board.pin({"i": i}, f"orphan{i}")
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_writer_killed_inside_a_batch_is_repaired_by_the_next_write_and_by_board_repair(
        kind, tmp_path, request, monkeypatch):
    board, options = _make(kind, tmp_path, request)
    if kind == "s3":  # the child's credentials come from its environment, never argv
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.SECRET)
        options = {k: v for k, v in options.items() if k not in ("key", "secret")}
    board.pin({"first": 1}, "first")
    r = subprocess.run([sys.executable, "-c", KILLED_IN_BATCH, json.dumps(options), "5"], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == -9, r.stderr
    assert set(_index(board)) == {"first"}  # stored, not yet listed
    board.pin({"next": 1}, "next")  # any later write lists what the killed batch stored
    assert set(_index(board)) == {"first", "next"} | {f"orphan{i}" for i in range(5)}
    r = subprocess.run([sys.executable, "-c", KILLED_IN_BATCH, json.dumps(options), "3"], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == -9, r.stderr
    # `pinstorm board repair` (what a user runs after a crash) lists them too
    from click.testing import CliRunner

    from pinstorm.cli import cli

    result = CliRunner().invoke(cli, ["board", "repair", "big"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert set(_index(board)) == {"first", "next"} | {f"orphan{i}" for i in range(5)}
    assert all(_index(board)[f"orphan{i}"]["versions"] == board.list_versions(f"orphan{i}") for i in range(3))


# One of several processes that each repartition their own slice of the categories into one board.
REPARTITION_SLICE = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from pinstorm import boards
    from pinstorm.pipeline import repartition
    options, tree, go = json.loads(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    board = boards.board_register(options.pop("kind"), name="big", **options)
    while not go.exists():
        time.sleep(0.005)
    repartition(tree, board, progress=False)
""")


def _tree(root: Path, wnids: list[str]) -> Path:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 200, 10)).save(buf, "JPEG")
    for wnid in wnids:
        folder = root / "train" / wnid
        folder.mkdir(parents=True)
        for j in range(2):
            (folder / f"{wnid}_{j}.JPEG").write_bytes(buf.getvalue())
    return root


@pytest.mark.slow
@needs("pipeline")
@pytest.mark.parametrize("kind,writers,each", [("local", 4, 60), pytest.param("s3", 8, 6, marks=pytest.mark.once),
                                               pytest.param("gcs", 8, 6, marks=pytest.mark.once)])
def test_processes_repartitioning_disjoint_slices_leave_every_category_listed_over_http(
        kind, writers, each, tmp_path, request, monkeypatch):
    """No livelock and no lost entry when many batch writers publish to one board at once, and the
    result is complete for a reader that only has plain HTTP (a data.txt board)."""
    board, options = _make(kind, tmp_path, request)
    if kind == "s3":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.SECRET)
        options = {k: v for k, v in options.items() if k not in ("key", "secret")}
    wnids = [f"n{i:08d}" for i in range(writers * each)]
    go = tmp_path / "go"
    procs = []
    for w in range(writers):
        tree = _tree(tmp_path / f"tree{w}", wnids[w * each:(w + 1) * each])
        procs.append(subprocess.Popen([sys.executable, "-c", REPARTITION_SLICE, json.dumps(options), str(tree),
                                       str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    time.sleep(0.5)
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    expected = set(wnids) | {"categories"}
    assert set(_index(board)) == expected
    assert set(_manifest(board)) == expected
    assert len(board.list_versions("categories")) == writers  # each slice pinned its own list
    if kind == "local":
        with boards.serve_board(board.storage.root) as url:
            web = boards.board_register(url, name="web", cache=tmp_path / "web-cache")
            assert set(web.pin_find("")["name"]) == expected
            assert sorted(Path(p).name for p in web.pin_get(wnids[-1])) == [f"{wnids[-1]}_{j}.JPEG" for j in range(2)]
    else:
        if kind == "s3":
            s3.make_public(board.storage.fs, options["bucket"], "team")
        url = f"{request.getfixturevalue(f'{kind}_server').endpoint}/{options['bucket']}/team"
        web = boards.board_register("datatxt", name="web", url=url, cache=tmp_path / "web-cache")
        assert set(web.pin_find("")["name"]) == expected


# ---- the index format ----------------------------------------------------------------------------

# text that JSON leaves raw but YAML reads as a line break or refuses: NEL, LS, PS, BOM, DEL, C1
_awkward = st.text(alphabet=st.sampled_from(list("aé😀 :#'\"\\-{}[],&*!|>%@`\t") +
                                            ["\x85", "\u2028", "\u2029", "\ufeff", "\x7f", "\x9f", "\n", "\r"]),
                   max_size=24)
_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), _awkward),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(_awkward, inner, max_size=3)), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(st.fixed_dictionaries(
    {"path": _awkward.filter(str.strip), "name": _awkward.filter(bool)},
    optional={"description": _awkward, "title": st.none() | _awkward, "versions": st.lists(_awkward, max_size=3),
              "user": _values}), max_size=6, unique_by=lambda e: e["name"]))
def test_property_the_json_line_index_reads_the_same_in_every_yaml_reader(entries):
    text = index.dump_index(entries)
    fast = index.parse_index(text)
    for loader in (yaml.SafeLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        assert index.parse_index(index.dump_yaml(yaml.load(text, Loader=loader))) == fast  # noqa: S506
        assert yaml.load(text, Loader=loader) == [  # noqa: S506 - what R and other readers get
            {**e, "path": e["path"]} for e in sorted(entries, key=lambda e: e["name"])]
    assert [e["name"] for e in fast] == sorted(e["name"] for e in entries)


def test_an_index_with_a_float_or_another_tools_format_goes_through_the_yaml_loader():
    entries = [{"path": "a", "name": "a", "score": 0.5}, {"path": "b", "name": "b", "n": 10**20}]
    text = index.dump_index(entries)
    assert "score: 0.5" in text  # block YAML: JSON's 1e-05 would be a string in YAML 1.1
    assert index.parse_index(text)[0]["score"] == 0.5
    r_written = "- path: iris\n  name: iris\n  rows: 150\n"
    assert index.parse_index(r_written) == [{"path": "iris", "name": "iris", "rows": 150, "type": "files",
                                             "description": ""}]


@settings(max_examples=300, deadline=None)
@given(names=st.lists(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,140}", fullmatch=True), min_size=1, max_size=5,
                      unique=True))
def test_property_the_manifest_is_what_yaml_writes(names):
    stored = {n: ["20260101T000000Z-abcde", "v.1"] for n in names}
    text = manifest.dump_manifest(manifest.make_manifest(stored))
    assert text == index.dump_yaml(manifest.make_manifest(stored))  # libyaml's bytes, as R's yaml writes
    assert manifest.parse_manifest(text) == manifest.make_manifest(stored)
