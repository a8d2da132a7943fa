"""The root data.txt index loses nothing: concurrent writer processes on S3 (moto), GCS (emulator) and
Azure Blob (Azurite),
and writers killed between storing a version and updating the index."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

from pinstorm import boards
from servers import azurite, gcs, s3

s3_server = pytest.fixture(scope="module", name="s3_server")(s3.serve)
gcs_server = pytest.fixture(scope="module", name="gcs_server")(gcs.serve)
azure_server = pytest.fixture(scope="module", name="azure_server")(azurite.serve)
NO_ADLFS = importlib.util.find_spec("adlfs") is None

WRITERS, PINS_EACH = 4, 3

WRITER = textwrap.dedent("""
    import json, os, sys, time
    from pinstorm import boards
    options = json.loads(sys.argv[1])
    board = boards.board_register(options.pop("kind"), name="shared", **options)
    worker, go = int(sys.argv[2]), sys.argv[3]
    board.stored_versions()  # connect before the start line, so all writers start together
    while not os.path.exists(go):
        time.sleep(0.005)
    for i in range(%d):
        board.pin({"worker": worker, "i": i}, f"w{worker}-p{i}", description=f"from worker {worker}")
""" % PINS_EACH)

# stores a version, then dies (SIGKILL) where the index update would start
CRASHER = textwrap.dedent("""
    import json, os, signal, sys
    from pinstorm import boards
    from pinstorm.boards.backends.fs_board import FsStorage
    options = json.loads(sys.argv[1])
    board = boards.board_register(options.pop("kind"), name="shared", **options)
    FsStorage._update_index = lambda self, *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    board.pin({"lost": True}, sys.argv[2])
""")


def _options(kind: str, server, bucket: str, tmp_path: Path) -> dict:
    if kind == "local":
        return {"kind": "local", "path": str(tmp_path / "board-shared")}
    return {"kind": kind, "bucket": bucket, "path": "team", "cache": str(tmp_path / "cache"),
            **server.storage_options()}


@pytest.fixture(params=["s3", "gcs", pytest.param("azure", marks=pytest.mark.skipif(
    NO_ADLFS, reason="the azure extra is not installed (pip install 'pinstorm[azure]')"))])
def cloud(request, tmp_path, monkeypatch):
    """(options for a fresh bucket board, the board) on moto's S3, the GCS emulator or Azurite."""
    kind = request.param
    server = request.getfixturevalue(f"{kind}_server")
    if kind == "s3":  # the writers' credentials come from their environment (never from argv)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.SECRET)
    if kind == "azure":  # likewise: adlfs reads the connection string from the environment
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", server.connection_string())
    bucket = f"idx-{uuid.uuid4().hex[:10]}"
    options = _options(kind, server, bucket, tmp_path)
    board = boards.board_register(**{"board" if k == "kind" else k: v for k, v in options.items()},
                                  name="shared", create_bucket=True)
    options = {k: v for k, v in options.items() if k not in ("key", "secret", "connection_string")}
    return options, board


def _index(board) -> dict[str, dict]:
    text = board.storage.fs.cat_file(f"{board.storage.root}/data.txt")
    return {e["name"]: e for e in yaml.safe_load(text)}


def _run(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.mark.slow
@pytest.mark.once   # the local-folder race (test_boards_concurrency.py) runs in every environment
def test_concurrent_writer_processes_lose_no_index_entry(cloud, tmp_path):
    options, board = cloud
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, json.dumps(options), str(w), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(WRITERS)]
    time.sleep(0.5)  # most writers have imported and connected by now; the rest join late
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    expected = {f"w{w}-p{i}" for w in range(WRITERS) for i in range(PINS_EACH)}
    index = _index(board)
    assert set(index) == expected
    for name, e in index.items():  # each entry points at the stored version, with its metadata
        worker = int(name[1:].split("-")[0])
        assert e["versions"] == board.list_versions(name) and e["description"] == f"from worker {worker}"
    # and readers that only have HTTP see every pin
    assert set(board.pin_find("")["name"]) == expected
    # R 1.x's manifest converged the same way
    manifest = yaml.safe_load(board.storage.fs.cat_file(f"{board.storage.root}/_pins.yaml"))
    assert {k: [p.split("/")[1] for p in v] for k, v in manifest.items()} == \
        {name: board.list_versions(name) for name in expected}


def test_a_writer_killed_before_the_index_update_is_repaired_by_the_next_write(cloud):
    options, board = cloud
    board.pin({"a": 1}, "first")
    r = _run(CRASHER, json.dumps(options), "orphan", check=False)
    assert r.returncode == -9
    assert set(_index(board)) == {"first"}  # the version is stored but invisible over HTTP
    assert board.list_versions("orphan")
    board.pin({"b": 2}, "second")  # any later write repairs the index
    assert set(_index(board)) == {"first", "orphan", "second"}
    r = _run(CRASHER, json.dumps(options), "orphan2", check=False)
    assert r.returncode == -9 and "orphan2" not in _index(board)
    assert board.rebuild_index() == 4
    index = _index(board)
    assert set(index) == {"first", "orphan", "orphan2", "second"}
    assert index["orphan2"]["versions"] == board.list_versions("orphan2")


def test_repair_command_and_stale_entries(tmp_path):
    """`pinstorm board repair` on a local board: lists crashed writers' pins, drops entries of pins
    removed behind the board's back, keeps hand-written entries of other tools."""
    options = _options("local", None, "", tmp_path)
    board = boards.board_register("local", name="shared", path=options["path"], persist=True)
    board.pin({"a": 1}, "kept")
    board.pin({"a": 2}, "deleted")
    assert _run(CRASHER, json.dumps(options), "orphan", check=False).returncode == -9
    import shutil

    shutil.rmtree(Path(options["path"]) / "deleted")
    index_file = Path(options["path"]) / "data.txt"
    entries = yaml.safe_load(index_file.read_text())
    entries.append({"path": "https://example.org/legacy.csv", "name": "legacy", "type": "table"})
    index_file.write_text(yaml.safe_dump(entries))
    env = dict(os.environ)
    exe = Path(sys.executable).parent / "pinstorm"
    r = subprocess.run([str(exe), "board", "repair", "shared"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "lists 2 pin(s)" in r.stdout
    index = {e["name"]: e for e in yaml.safe_load(index_file.read_text())}
    assert set(index) == {"kept", "orphan", "legacy"}
    assert index["legacy"]["path"] == "https://example.org/legacy.csv"


def test_s3_index_writes_are_conditional(s3_server, tmp_path):
    """On S3 a writer that read an older index cannot overwrite a newer one (If-Match), and a writer
    that saw no index cannot overwrite one created since (If-None-Match)."""
    from pinstorm.boards.backends.fs_board import IndexConflict
    from pinstorm.boards.index import INDEX_FILE, dump_index

    bucket = f"cond-{uuid.uuid4().hex[:10]}"
    one = boards.board_register("s3", name="one", bucket=bucket, create_bucket=True, **s3_server.storage_options())
    two = boards.board_register("s3", name="two", bucket=bucket, **s3_server.storage_options())
    entries, token = one.storage._read_index()
    assert entries is None and token is None
    two.pin({"a": 1}, "a")
    with pytest.raises(IndexConflict):
        one.storage.write_index_text(one.storage.path(INDEX_FILE), dump_index([]), None, existed=False)
    entries, token = one.storage._read_index()
    two.pin({"b": 1}, "b")
    with pytest.raises(IndexConflict):
        one.storage.write_index_text(one.storage.path(INDEX_FILE), dump_index(entries), token, existed=True)
    assert set(_index(one)) == {"a", "b"}


def test_unfinished_bucket_versions_are_removed_only_when_old(cloud):
    """A writer killed mid-upload leaves files without a data.txt (object stores have no temporary
    names): repair removes them once they are old enough never to belong to a live writer."""
    options, board = cloud
    board.pin({"a": 1}, "done")
    orphan = f"{board.storage.root}/done/20200101T000000Z-abcde"
    board.storage.fs.pipe_file(f"{orphan}/part.bin", b"half an upload")
    assert board.sweep_temporaries() == 0 and board.storage.fs.exists(f"{orphan}/part.bin")  # recent: kept
    assert board.sweep_temporaries(older_than=0) == 1
    board.storage._fresh()
    assert not board.storage.fs.exists(f"{orphan}/part.bin")
    assert board.pin_get("done") == {"a": 1} and board.rebuild_index() == 1


def test_an_unreadable_index_is_rebuilt_by_the_next_write(tmp_path):
    board = boards.board_register("local", name="b", path=tmp_path / "b")
    board.pin({"a": 1}, "a")
    (tmp_path / "b" / "data.txt").write_text("- [unclosed\n")
    with pytest.warns(UserWarning, match="rebuilding an unreadable"):
        board.pin({"b": 1}, "b")
    assert set(_index(board)) == {"a", "b"}


def test_repair_command_on_a_bucket_board(cloud, tmp_path):
    """`pinstorm board repair` in another process, with the registration it persisted (credentials
    from the environment, never from the config file)."""
    options, board = cloud
    kind = options.pop("kind")
    boards.board_register(kind, name="saved", persist=True, **options)
    board.pin({"a": 1}, "first")
    r = _run(CRASHER, json.dumps({"kind": kind, **options}), "orphan", check=False)
    assert r.returncode == -9 and "orphan" not in _index(board)
    exe = Path(sys.executable).parent / "pinstorm"
    r = subprocess.run([str(exe), "board", "repair", "saved"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "lists 2 pin(s)" in r.stdout and set(_index(board)) == {"first", "orphan"}


def test_an_oversized_bucket_index_is_refused_then_rebuilt(cloud, monkeypatch):
    """A bucket is written by others too: a huge data.txt is neither read whole nor parsed."""
    from pinstorm.boards import LimitExceeded, index

    _, board = cloud
    board.pin({"a": 1}, "small")
    monkeypatch.setattr(index, "MAX_INDEX_BYTES", 4096)
    board.storage.fs.pipe_file(f"{board.storage.root}/data.txt", b"- name: x\n  description: '" + b"y" * 8192 + b"'\n")
    with pytest.raises(LimitExceeded, match="data.txt is larger than the 4096-byte cap"):
        board.storage.read_index()
    board.pin({"b": 2}, "other")  # the next write rebuilds the derived index from the listing
    assert set(_index(board)) == {"small", "other"}


def test_a_large_bucket_index_is_read_whole(cloud, recwarn):
    """S3's body arrives in pieces: reading only the first (~200 entries' worth) made every larger index
    look damaged, so each write rebuilt it from every pin's data.txt, and readers saw it fail."""
    from pinstorm.boards import index

    _, board = cloud
    board.pin({"a": 1}, "small")
    entries = [{"path": f"p{i:05d}/v/", "name": f"p{i:05d}", "description": "d" * 200, "type": "file"}
               for i in range(5000)]   # ~1.4 MB
    board.storage.fs.pipe_file(f"{board.storage.root}/data.txt", index.dump_index(entries).encode())
    assert [e["name"] for e in board.storage.read_index()] == [e["name"] for e in entries]
    assert not [w for w in recwarn if "unreadable" in str(w.message)]
