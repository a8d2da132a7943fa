"""Azure Blob boards against Azurite (the Azure Storage emulator) on 127.0.0.1, and a fault-injecting
proxy in front of it: the guarantees of the S3 board (conditional index writes, verified reads,
ranged resumes, secrets never saved).

Azurite is installed by `.ci/install-azurite` (run by `make test`); without it these tests skip,
except under CI, where they fail (tests/servers/azurite.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytest.importorskip("adlfs", reason="the azure extra is not installed (pip install 'pinstorm[azure]')")

from pinstorm import boards  # noqa: E402
from pinstorm.boards.errors import (BoardError, CredentialsError, DownloadError, IntegrityError,  # noqa: E402
                                    PinNotFound)
from servers import azurite, faults  # noqa: E402

azurite_server = pytest.fixture(scope="module", name="azurite_server")(azurite.serve)
SECRET_KEY = azurite.KEY


@pytest.fixture(autouse=True)
def no_azure_environment(monkeypatch):
    """Only the credentials a test passes exist: none of adlfs's AZURE_STORAGE_* variables."""
    for var in [v for v in os.environ if v.startswith("AZURE_")]:
        monkeypatch.delenv(var)


@pytest.fixture
def container():
    return f"pins-{uuid.uuid4().hex[:10]}"


def _images(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"img{i}.jpg").write_bytes(bytes([i]) * (1000 + i))
    return folder


def test_round_trip_pin_find_get_versions_remove(azurite_server, container, tmp_path):
    board = boards.board_register("azure", name="cloud", container=container, path="team/boards",
                                  create_bucket=True, cache=tmp_path / "cache", **azurite_server.storage_options())
    assert board.kind == "azure" and board.storage.root == f"{container}/team/boards"
    df = pd.DataFrame({"wnid": ["n01440764", "n01443537"], "label": ["tench", "goldfish"]})
    boards.pin(df, "categories", board="cloud", description="ImageNet categories")
    pd.testing.assert_frame_equal(boards.pin_get("categories", board="cloud"), df)

    folder = _images(tmp_path / "n01440764")
    boards.pin(folder, "n01440764", board="cloud")
    paths = boards.pin_get("n01440764", board="cloud")
    assert sorted(Path(p).name for p in paths) == ["img0.jpg", "img1.jpg", "img2.jpg"]
    assert all(Path(p).read_bytes() == (folder / Path(p).name).read_bytes() for p in paths)
    assert all(str(tmp_path / "cache") in p for p in paths)

    assert list(boards.pin_find("imagenet", board="cloud")["name"]) == ["categories"]
    assert set(boards.pin_find("", board="cloud")["name"]) == {"categories", "n01440764"}

    # the pins 1.x layout and the root index, at the blob names pins-python's board_azure reads
    fs = board.storage.fs
    assert fs.exists(f"{container}/team/boards/data.txt")
    version = boards.pin_versions("categories", board="cloud")["version"].iloc[-1]
    assert fs.exists(f"{container}/team/boards/categories/{version}/data.txt")
    assert fs.exists(f"{container}/team/boards/categories/{version}/categories.parquet")

    df2 = pd.concat([df, pd.DataFrame({"wnid": ["n01484850"], "label": ["great white shark"]})])
    boards.pin(df2.reset_index(drop=True), "categories", board="cloud")
    versions = boards.pin_versions("categories", board="cloud")
    assert len(versions) == 2
    assert len(boards.pin_get("categories", board="cloud")) == 3
    assert len(boards.pin_get("categories", board="cloud", version=versions["version"][0])) == 2

    boards.pin_remove("categories", board="cloud")
    assert list(boards.pin_find("", board="cloud")["name"]) == ["n01440764"]
    with pytest.raises(PinNotFound):
        board.pin_get("categories")
    index = yaml.safe_load(fs.cat_file(f"{container}/team/boards/data.txt"))
    assert [e["name"] for e in index] == ["n01440764"]


def test_board_azure_takes_pins_python_arguments_and_a_second_writer_is_seen_at_once(azurite_server, container,
                                                                                      tmp_path):
    opts = azurite_server.storage_options()
    writer = boards.board_azure(f"{container}/shared", create_bucket=True, cache=tmp_path / "w", **opts)
    reader = boards.board_azure(f"abfs://{container}/shared", True, tmp_path / "r", None, **opts)  # positional
    assert writer.storage.fs is not reader.storage.fs and reader.storage.root == f"{container}/shared"
    writer.pin({"epoch": 1}, "state")
    assert reader.pin_get("state") == {"epoch": 1}
    writer.pin({"epoch": 2}, "state")
    assert len(reader.pin_versions("state")) == 2  # no stale listing
    assert reader.pin_get("state") == {"epoch": 2}
    assert list((tmp_path / "r").iterdir())  # the cache given by position
    unversioned = boards.board_azure(f"{container}/shared", versioned=False, cache=tmp_path / "u", **opts)
    unversioned.pin({"epoch": 3}, "other")
    unversioned.pin({"epoch": 4}, "other")
    assert len(reader.pin_versions("other")) == 1 and reader.pin_get("other") == {"epoch": 4}


def test_a_corrupted_blob_is_refused_and_never_cached(azurite_server, container, tmp_path):
    writer = boards.board_azure(container, create_bucket=True, cache=tmp_path / "w",
                                **azurite_server.storage_options())
    data = os.urandom(300_000)
    (tmp_path / "big.bin").write_bytes(data)
    writer.pin(tmp_path / "big.bin", "big")
    version = writer.pin_versions("big")["version"].iloc[-1]
    blob = f"{container}/big/{version}/big.bin"
    writer.storage.fs.pipe_file(blob, data[:1000] + bytes(256) + data[1256:])  # same size, other bytes
    reader = boards.board_azure(container, cache=tmp_path / "cache", **azurite_server.storage_options())
    with pytest.raises(IntegrityError, match="big"):
        reader.pin_get("big")
    cached = [p for p in (tmp_path / "cache").rglob("big.bin")]
    assert not [p for p in cached if not any(part.startswith(".") for part in p.parts[-3:])]  # none served
    writer.storage.fs.pipe_file(blob, data)
    assert Path(reader.pin_get("big")[0]).read_bytes() == data


# Dies (SIGKILL) with part of the file written, as a killed process or a lost machine would.
KILLED_DOWNLOAD = textwrap.dedent("""
    import json, os, signal, sys
    from pinstorm import boards
    from pinstorm.boards.backends.fs_board import FsStorage
    options = json.loads(sys.argv[1])
    board = boards.board_register(options.pop("kind"), name="container", **options)
    def first_bytes_then_die(self, name, version, file, dest, offset=0):
        with self.fs.open(self._path(name, version, file), "rb") as src, open(dest, "wb") as out:
            out.write(src.read(int(sys.argv[2])))
            out.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    FsStorage.download_file = first_bytes_then_die
    board.pin_get("big")
""")


def test_a_download_killed_midway_resumes_with_a_ranged_read(azurite_server, container, tmp_path, monkeypatch):
    writer = boards.board_azure(container, create_bucket=True, cache=tmp_path / "w",
                                **azurite_server.storage_options())
    data = os.urandom(6 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    writer.pin(tmp_path / "big.bin", "big")
    cache = tmp_path / "cache"
    with faults.FaultProxy(azurite_server.endpoint) as proxy:
        # the credentials come from the environment, never from argv
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_server.connection_string(proxy.endpoint))
        options = {"kind": "azure", "container": container, "cache": str(cache)}
        r = subprocess.run([sys.executable, "-c", KILLED_DOWNLOAD, json.dumps(options), str(2 << 20)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == -9, r.stderr
        [partial] = list(cache.rglob("*.partial"))
        assert (partial / "big.bin").stat().st_size == 2 << 20
        proxy.ranges.clear()
        board = boards.board_register("azure", name="container", container=container, cache=cache)
        assert Path(board.pin_get("big")[0]).read_bytes() == data  # and verified end to end
        starts = [int(r.split("=")[1].split("-")[0]) for p, r in proxy.ranges if "/big.bin" in p and r]
        assert starts and min(starts) == 2 << 20  # nothing before the cut was fetched again
        assert not [p for p, r in proxy.ranges if "/big.bin" in p and not r]  # never the whole file
    assert not list(cache.rglob("*.partial"))


WRITERS, PINS_EACH = 8, 2

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


@pytest.mark.slow
@pytest.mark.once   # the local-folder race (test_boards_concurrency.py) runs in every environment
def test_eight_concurrent_writer_processes_lose_no_index_entry(azurite_server, container, tmp_path, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_server.connection_string())
    options = {"kind": "azure", "container": container, "path": "team", "cache": str(tmp_path / "cache")}
    board = boards.board_register("azure", name="shared", container=container, path="team", create_bucket=True)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, json.dumps(options), str(w), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(WRITERS)]
    time.sleep(0.5)  # most writers have imported and connected by now; the rest join late
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    expected = {f"w{w}-p{i}" for w in range(WRITERS) for i in range(PINS_EACH)}
    index = {e["name"]: e for e in yaml.safe_load(board.storage.fs.cat_file(f"{container}/team/data.txt"))}
    assert set(index) == expected
    for name, e in index.items():  # each entry points at the stored version, with its metadata
        assert e["versions"] == board.list_versions(name)
        assert e["description"] == f"from worker {int(name[1:].split('-')[0])}"
    manifest = yaml.safe_load(board.storage.fs.cat_file(f"{container}/team/_pins.yaml"))
    assert set(manifest) == expected


def test_index_writes_are_conditional(azurite_server, container):
    """A writer that read an older index cannot overwrite a newer one (If-Match: ETag), and a writer
    that saw no index cannot overwrite one created since (If-None-Match: *)."""
    from pinstorm.boards.backends.fs_board import IndexConflict
    from pinstorm.boards.index import INDEX_FILE, dump_index

    one = boards.board_azure(container, create_bucket=True, **azurite_server.storage_options()).storage
    two = boards.board_azure(container, **azurite_server.storage_options())
    entries, token = one._read_index()
    assert entries is None and token is None
    two.pin({"a": 1}, "a")
    with pytest.raises(IndexConflict):
        one.write_index_text(one.path(INDEX_FILE), dump_index([]), None, existed=False)
    entries, token = one._read_index()
    assert [e["name"] for e in entries] == ["a"] and token
    two.pin({"b": 1}, "b")
    with pytest.raises(IndexConflict):
        one.write_index_text(one.path(INDEX_FILE), dump_index(entries), token, existed=True)
    assert {e["name"] for e in one._read_index()[0]} == {"a", "b"}
    entries, token = one._read_index()  # with the current ETag the write goes through
    one.write_index_text(one.path(INDEX_FILE), dump_index(entries), token, existed=True)
    assert one._read_index()[1] != token


def test_secrets_are_never_saved_shown_or_put_in_messages(azurite_server, container, tmp_path):
    conn = azurite_server.connection_string()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b = boards.board_register("azure", name="persisted", container=container, create_bucket=True,
                                  persist=True, connection_string=conn)
        boards.board_register("azure", name="by-key", container=container, persist=True, account_name="acct",
                              account_key=SECRET_KEY, sas_token="sv=2024&sig=" + SECRET_KEY[:20])
    b.pin({"works": True}, "p")  # the secret still works in this process
    text = (tmp_path / "config" / "boards.yaml").read_text()
    assert SECRET_KEY not in text and SECRET_KEY[:20] not in text and "AccountKey" not in text
    saved = yaml.safe_load(text)["boards"]
    assert saved["persisted"] == {"kind": "azure", "container": container, "create_bucket": True}
    assert saved["by-key"] == {"kind": "azure", "container": container, "account_name": "acct"}
    assert boards.board_get("persisted").pin_get("p") == {"works": True}
    dropped = " ".join(str(w.message) for w in caught)
    assert "connection_string" in dropped and "account_key" in dropped and "sas_token" in dropped
    assert SECRET_KEY not in dropped

    # a key the server refuses: named as a credentials problem, the key nowhere in the message
    wrong = azurite.connection_string(azurite_server.endpoint, key=SECRET_KEY[::-1])
    refused = boards.board_azure(container, name="refused", cache=tmp_path / "c", connection_string=wrong)
    with pytest.raises(CredentialsError, match=f"refused.*{container}") as denied:
        refused.pin_find()
    assert SECRET_KEY[::-1] not in str(denied.value) and "AccountKey=" not in str(denied.value)
    # a malformed connection string is refused at once, without echoing it
    with pytest.raises(CredentialsError, match="malformed") as bad:
        boards.board_azure(container, name="malformed", connection_string="AccountKey=" + SECRET_KEY)
    assert SECRET_KEY not in str(bad.value)


def test_a_missing_container_and_a_bad_container_name_are_explained(azurite_server, tmp_path):
    with pytest.raises(BoardError, match="bucket must be a bucket name"):
        boards.board_register("azure", name="bad", container="Upper_Case!", **azurite_server.storage_options())
    missing = boards.board_azure(f"absent-{uuid.uuid4().hex[:8]}", name="nocontainer", cache=tmp_path / "c",
                                 **azurite_server.storage_options())
    with pytest.raises(BoardError, match="container .* does not exist.*create_bucket=True"):
        missing.pin({"a": 1}, "x")
    with pytest.raises(BoardError, match="does not exist"):  # not an empty listing: there is no board
        missing.pin_find()


def test_server_errors_are_clear_and_the_cache_never_holds_a_partial_version(azurite_server, container, tmp_path):
    writer = boards.board_azure(container, create_bucket=True, cache=tmp_path / "w",
                                **azurite_server.storage_options())
    writer.pin(pd.DataFrame({"a": [1, 2]}), "small")
    with faults.FaultProxy(azurite_server.endpoint) as proxy:
        board = boards.board_azure(container, name="via-proxy", cache=tmp_path / "cache",
                                   **azurite_server.storage_options(proxy.endpoint))
        proxy.fail(r"comp=list", 403, content_type="application/xml",
                   body="<?xml version='1.0'?><Error><Code>AuthorizationFailure</Code>"
                        "<Message>This request is not authorized</Message></Error>")
        with pytest.raises(CredentialsError, match=f"via-proxy.*container '{container}'"):
            board.pin_find()
        proxy.clear()
        version = writer.pin_versions("small")["version"].iloc[-1]
        writer.storage.fs.rm(f"{container}/small/{version}/small.parquet")
        with pytest.raises(DownloadError, match="missing") as e404:
            board.pin_get("small")
        assert e404.value.status == 404
        assert not [p for p in (tmp_path / "cache").rglob("small.parquet")]


def test_cli_registers_an_azure_board_without_saving_its_secret(azurite_server, container, tmp_path):
    env = dict(os.environ, PINSTORM_CONFIG=str(tmp_path / "cfg.yaml"), PINSTORM_CACHE=str(tmp_path / "cache"),
               AZURE_STORAGE_CONNECTION_STRING=azurite_server.connection_string())
    exe = shutil.which("pinstorm", path=str(Path(sys.executable).parent)) or "pinstorm"

    def pinstorm(*args, ok=True):
        r = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)
        assert (r.returncode == 0) == ok, r.stderr
        return r

    r = pinstorm("board", "register", "azure", "--name", "az", "--path", "team", ok=False)
    assert "needs --bucket CONTAINER" in r.stderr
    r = pinstorm("board", "register", "azure", "--name", "az", "--bucket", container, "--path", "team", ok=False)
    assert "does not answer" in r.stderr and "does not exist" in r.stderr  # no container yet
    r = pinstorm("board", "register", "azure", "--name", "az", "--bucket", container, "--path", "team",
                 "--option", "create_bucket=true", "--option", f"account_key={SECRET_KEY}")
    assert "registered board 'az' (azure: azure://" in r.stdout and SECRET_KEY not in r.stdout + r.stderr
    saved = yaml.safe_load((tmp_path / "cfg.yaml").read_text())["boards"]["az"]
    assert saved["kind"] == "azure" and saved["bucket"] == container and saved["path"] == "team"
    assert SECRET_KEY not in (tmp_path / "cfg.yaml").read_text()
    listing = pinstorm("board", "list").stdout
    assert "az" in listing and "azure" in listing and SECRET_KEY not in listing

    src = tmp_path / "notes.txt"
    src.write_text("tench and goldfish")
    pinstorm("pin", str(src), "--name", "notes", "--board", "az")
    [path] = pinstorm("get", "notes", "--board", "az").stdout.split()
    assert Path(path).read_text() == "tench and goldfish"
    fs = boards.board_azure(container, **azurite_server.storage_options()).storage.fs
    assert fs.exists(f"{container}/team/notes") and fs.exists(f"{container}/team/data.txt")


def test_a_connection_string_is_masked_in_logs_records_and_messages():
    """What pinstorm writes about a run (lineage, reports, logs) never holds the account key, whether the
    connection string is an option or only quoted in a library's message."""
    import logging

    from pinstorm.boards.safety import secrets

    conn = azurite.connection_string("http://127.0.0.1:9")  # nothing listens there: no request is made
    board = boards.board_azure("lineage-container/run", name="runs", connection_string=conn)
    assert board.spec["connection_string"] == conn  # this process keeps it, to build the board again
    record = secrets.scrub({"board": board.spec, "note": f"written with {conn}"})
    assert SECRET_KEY not in json.dumps(record) and record["board"]["container"] == "lineage-container"
    assert SECRET_KEY not in secrets.redact_text(f"ValueError: bad {conn}")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, r: logging.LogRecord) -> None:
            seen.append(r.getMessage())

    log = secrets.logger("pinstorm.test.azure")
    log.addHandler(Keep())
    log.setLevel(logging.INFO)
    log.info("connecting with %s", conn)
    assert seen and SECRET_KEY not in seen[0] and "AccountName=pinstormtest" in seen[0]
