"""The Kaggle board, driving the real `kaggle` / `kagglesdk` client against a local Kaggle-API server.

The server (tests/servers/kaggle.py) answers the POST JSON calls the client makes and redirects
downloads to files it serves; a fault proxy in front of it produces 500s, 403s and truncated bodies.
No test reads the machine's ~/.kaggle: HOME and KAGGLE_CONFIG_DIR point into tmp_path.
"""

from __future__ import annotations

import io
import os
import json
import warnings
import zipfile
from pathlib import Path

import pytest
from extras_support import needs

from pinstorm import boards
from pinstorm.boards.cache import StaleCacheWarning
from pinstorm.boards.errors import CredentialsError, DownloadError, InvalidPinName, PinNotFound, ReadOnlyBoard
from pinstorm.boards import board_kaggle
from pinstorm.boards.parallel import PinFetchError
from servers import faults, kaggle

kaggle_server = pytest.fixture(scope="module", name="kaggle_server")(kaggle.serve)
DIGITS = {"digits.csv": b"pixel0,label\n0,3\n16,7\n", "images/0.png": b"\x89PNG fake 0", "README.md": b"# digits"}
TITANIC = {"train.csv": b"PassengerId,Survived\n1,0\n2,1\n", "test.csv": b"PassengerId\n3\n",
           "extra.zip": None}

pytestmark = needs("kaggle")   # the Kaggle client needs Python 3.11+ (pinstorm.extras.PYTHON_RANGE)


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture(scope="module", autouse=True)
def content(kaggle_server):
    kaggle_server.add_dataset("alice/mnist-digits", DIGITS, title="MNIST digits", subtitle="handwritten digits")
    kaggle_server.add_dataset("bob/imagenet-categories", {"categories.csv": b"wnid\nn01440764\n"},
                              title="ImageNet categories", subtitle="the 1000 synsets")
    files = dict(TITANIC, **{"extra.zip": _zip({"cabins.csv": b"cabin\nC85\n"})})
    kaggle_server.add_competition("titanic", files, title="Titanic - Machine Learning from Disaster")
    kaggle_server.add_competition("digit-recognizer", {"train.csv": b"label\n1\n"}, title="Digit Recognizer")


@pytest.fixture(autouse=True)
def kaggle_home(tmp_path, monkeypatch):
    """An empty home and Kaggle config folder; no Kaggle variables from the machine."""
    home = tmp_path / "home"
    (home / ".kaggle").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(home / ".kaggle"))
    for var in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_API_TOKEN", "KAGGLE_API_ENVIRONMENT",
                "KAGGLE_KERNEL_RUN_TYPE", "PINSTORM_KAGGLE_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    # importing `kaggle` signs in with whatever credentials exist (a token would be checked against
    # api.kaggle.com): import it now, with none
    from pinstorm.boards.backends.kaggle_board import _kaggle_api_class

    _kaggle_api_class()
    return home


@pytest.fixture
def token_file(kaggle_server, tmp_path):
    path = tmp_path / "secrets" / "kaggle.json"
    path.parent.mkdir()
    path.write_text(json.dumps(kaggle_server.kaggle_json()))
    return path


@pytest.fixture
def board(kaggle_server, token_file, tmp_path):
    return boards.board_register("kaggle", name="kaggle", token=str(token_file), endpoint=kaggle_server.endpoint,
                                 cache=tmp_path / "cache", retries=0)


def test_find_searches_datasets_and_competitions(board, kaggle_server):
    found = boards.pin_find("digit", board="kaggle")
    assert list(found["name"]) == ["alice/mnist-digits", "c/digit-recognizer"]
    assert list(found["board"]) == ["kaggle", "kaggle"]
    assert found["description"][0] == "handwritten digits"
    extended = board.pin_find("imagenet", extended=True)
    assert list(extended["name"]) == ["bob/imagenet-categories"] and extended["kind"][0] == "dataset"
    assert "datasets.DatasetApiService/ListDatasets" in kaggle_server.calls
    assert "competitions.CompetitionApiService/ListCompetitions" in kaggle_server.calls


def test_dataset_is_downloaded_extracted_cached_and_refreshed_on_a_new_version(board, kaggle_server, tmp_path):
    ref = "alice/versioned"
    kaggle_server.add_dataset(ref, {"a.csv": b"x\n1\n", "sub/b.txt": b"bee"}, title="Versioned")
    paths = boards.pin_get(ref, board="kaggle")
    assert sorted(Path(p).relative_to(Path(paths[0]).parent).as_posix() for p in paths) == ["a.csv", "sub/b.txt"]
    assert all(str(tmp_path / "cache") in p for p in paths)
    assert Path(paths[0]).read_bytes() == b"x\n1\n"
    served = len(kaggle_server.file_downloads)

    assert boards.pin_get(ref, board="kaggle") == paths  # Kaggle reports no newer version: cache reused
    assert len(kaggle_server.file_downloads) == served

    kaggle_server.add_dataset(ref, {"a.csv": b"x\n2\n"})
    newer = boards.pin_get(ref, board="kaggle")
    assert [Path(p).name for p in newer] == ["a.csv"] and Path(newer[0]).read_bytes() == b"x\n2\n"
    assert len(kaggle_server.file_downloads) == served + 1
    assert list(boards.pin_versions(ref, board="kaggle")["version"]) == ["000001", "000002"]
    assert boards.pin_get(ref, board="kaggle", version="1") == paths  # older versions stay reachable
    raw = board.pin_get(ref, extract=False)
    assert [Path(p).name for p in raw] == ["versioned.zip"]
    info = board.pin_info(ref)
    assert info["kaggle_version"] == 2 and info["title"] == "Versioned"


def test_competition_files_are_downloaded_one_by_one(board, kaggle_server):
    paths = board.pin_get("c/titanic")
    names = sorted(Path(p).name for p in paths)
    assert names == ["cabins.csv", "test.csv", "train.csv"]  # extra.zip is extracted
    assert Path([p for p in paths if p.endswith("train.csv")][0]).read_bytes() == TITANIC["train.csv"]
    assert kaggle_server.calls.count("competitions.CompetitionApiService/DownloadDataFile") >= 3
    info = board.pin_info("c/titanic")
    assert info["file"] == ["extra.zip", "test.csv", "train.csv"] and info["kaggle_competition"] == "titanic"
    before = len(kaggle_server.file_downloads)
    assert board.pin_get("c/titanic") == paths
    assert len(kaggle_server.file_downloads) == before


@pytest.mark.parametrize("source", ["config_dir", "env_key", "env_token", "token_file_json", "token_file_plain"])
def test_credentials_from_the_clients_chain_or_a_token_file(source, kaggle_server, kaggle_home, tmp_path,
                                                            monkeypatch):
    creds = kaggle_server.kaggle_json()
    options = {}
    if source == "config_dir":
        (kaggle_home / ".kaggle" / "kaggle.json").write_text(json.dumps(creds))
    elif source == "env_key":
        monkeypatch.setenv("KAGGLE_USERNAME", creds["username"])
        monkeypatch.setenv("KAGGLE_KEY", creds["key"])
    elif source == "env_token":
        kaggle_server.add_token("access-token-123")
        monkeypatch.setenv("KAGGLE_API_TOKEN", "access-token-123")
    elif source == "token_file_json":
        (tmp_path / "k.json").write_text(json.dumps(creds))
        options["token"] = tmp_path / "k.json"
    else:
        kaggle_server.add_token("access-token-456")
        (tmp_path / "access_token").write_text("access-token-456\n")
        options["token"] = tmp_path / "access_token"
    monkeypatch.setenv("PINSTORM_KAGGLE_ENDPOINT", kaggle_server.endpoint)  # the documented env route
    calls = len(kaggle_server.calls)
    board = boards.board_register("kaggle", name=f"k-{source}", cache=tmp_path / "cache", **options)
    assert board.storage.endpoint == kaggle_server.endpoint
    assert Path(board.pin_get("alice/mnist-digits")[0]).exists()
    if source == "env_token":
        assert "security.OAuthService/IntrospectToken" in kaggle_server.calls[calls:]


def test_missing_and_bad_credentials_are_clear_errors_not_exits(kaggle_server, tmp_path, monkeypatch):
    nobody = board_kaggle(name="nobody", endpoint=kaggle_server.endpoint, cache=tmp_path / "c1")
    with pytest.raises(CredentialsError, match="no Kaggle credentials found.*KAGGLE_API_TOKEN.*kaggle.json"):
        nobody.pin_get("alice/mnist-digits")

    monkeypatch.setenv("KAGGLE_USERNAME", "pinstorm-tester")
    monkeypatch.setenv("KAGGLE_KEY", "wrong-key-0000")
    wrong = board_kaggle(name="wrong", endpoint=kaggle_server.endpoint, cache=tmp_path / "c2", retries=0)
    with pytest.raises(CredentialsError, match="'wrong'.*HTTP 401.*refused the credentials") as refused:
        wrong.pin_get("alice/mnist-digits")
    assert "wrong-key-0000" not in str(refused.value)

    with pytest.raises(CredentialsError, match="does not exist"):
        board_kaggle(token=tmp_path / "absent.json", endpoint=kaggle_server.endpoint)
    (tmp_path / "broken.json").write_text('{"username": "x"}')
    broken = board_kaggle(token=tmp_path / "broken.json", endpoint=kaggle_server.endpoint, cache=tmp_path / "c3")
    with pytest.raises(CredentialsError, match="username.*key"):
        broken.pin_find("x")


def test_http_failures_map_to_clear_errors_and_never_leave_partial_files(kaggle_server, token_file, tmp_path):
    with faults.FaultProxy(kaggle_server.endpoint) as proxy:
        board = board_kaggle(name="flaky", token=token_file, endpoint=proxy.endpoint, cache=tmp_path / "cache",
                            retries=0)
        with pytest.raises(PinNotFound, match="alice/no-such-data.*404"):
            board.pin_get("alice/no-such-data")
        with pytest.raises(PinNotFound, match="competition 'no-such-contest'"):
            board.pin_get("c/no-such-contest")

        proxy.fail("GetDataset", 500, content_type="application/json", body='{"code": 500, "message": "oops"}')
        with pytest.raises(DownloadError, match="HTTP 500.*GetDataset") as e500:
            board.pin_get("alice/mnist-digits")
        assert e500.value.status == 500

        proxy.clear()
        proxy.fail("DownloadDataFile", 403, content_type="application/json",
                   body='{"code": 403, "message": "rules not accepted"}')
        with pytest.raises(CredentialsError, match="403.*accept its rules"):
            board.pin_get("c/titanic")

        proxy.clear()
        proxy.truncate(r"/files/datasets/")
        with pytest.raises(DownloadError, match="truncated|broken"):
            board.pin_get("alice/mnist-digits")
        pin_cache = tmp_path / "cache" / "flaky" / "alice_mnist-digits"
        # no version folder a reader could be served (a hidden `.<version>.partial` resumes next time)
        assert not [p for p in pin_cache.iterdir() if p.is_dir() and not p.name.startswith(".")]

        proxy.fail(r"/files/competitions/titanic/train\.csv", 404, method="GET")
        with pytest.raises(DownloadError, match="404.*train.csv.*redirected to is missing") as gone:
            board.pin_get("c/titanic")
        assert gone.value.status == 404

        proxy.clear()
        good = board.pin_get("alice/mnist-digits")
        assert sorted(Path(p).name for p in good) == ["0.png", "README.md", "digits.csv"]
    # the proxy is gone: connection refused. The cached copy is served, with a warning.
    with pytest.warns(StaleCacheWarning, match="flaky"):
        assert board.pin_get("alice/mnist-digits") == good
    with pytest.raises(DownloadError, match="cannot reach"):
        board.pin_get("bob/imagenet-categories")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert board.pin_get("alice/mnist-digits", download=False) == good


def test_names_are_checked_and_the_board_is_read_only(board):
    for bad in ["mnist", "a/b/c", "../etc", "alice/../x", "alice/data set", "alice/my_data", "c/", "/x"]:
        with pytest.raises(InvalidPinName):
            board.pin_get(bad)
    assert board.check_name("alice/mnist-digits") == "alice/mnist-digits"
    assert board.check_name("some_owner/data-2") == "some_owner/data-2"
    with pytest.raises(ReadOnlyBoard, match="read-only.*kaggle datasets"):
        boards.pin({"a": 1}, "alice/new", board="kaggle")
    with pytest.raises(ReadOnlyBoard):
        boards.pin_remove("alice/mnist-digits", board="kaggle")


def test_many_kaggle_pins_in_parallel_report_each_failure(board):
    with pytest.raises(PinFetchError) as failed:
        boards.pin_get_many(["alice/mnist-digits", "c/titanic", "alice/missing", "bob/imagenet-categories"],
                            board="kaggle")
    assert set(failed.value.results) == {"alice/mnist-digits", "c/titanic", "bob/imagenet-categories"}
    assert list(failed.value.errors) == ["alice/missing"]
    assert isinstance(failed.value.errors["alice/missing"], PinNotFound)
    assert "alice/missing: PinNotFound" in str(failed.value)


def test_board_pickles_for_worker_processes_and_signs_in_again(board, kaggle_server):
    import pickle

    board.pin_find("digits")  # signed in, with a lock and a client object that cannot be pickled
    copy = pickle.loads(pickle.dumps(board))
    assert copy.storage._api is None and copy.storage.endpoint == board.storage.endpoint and copy.cache.root == board.cache.root
    assert copy.pin_get("bob/imagenet-categories")[0].endswith("categories.csv")


@pytest.mark.parametrize("evil", ["../../x.txt", "ABSOLUTE", "~/x.txt", "a/../../../x.txt", "data.txt"])
def test_competition_file_names_cannot_escape_the_cache(board, kaggle_server, tmp_path, evil):
    from pinstorm.boards.errors import UnsafePath

    if evil == "ABSOLUTE":
        evil = str(tmp_path / "outside" / "x.txt")
    slug = f"evil-{abs(hash(evil)) % 10**6}"
    kaggle_server.add_competition(slug, {"fine.csv": b"a\n1\n", evil: b"pwned"})
    served = len(kaggle_server.file_downloads)
    with pytest.raises(UnsafePath, match=rf"'c/{slug}'.*{kaggle_server.endpoint}"):
        board.pin_get(f"c/{slug}")
    assert len(kaggle_server.file_downloads) == served  # refused before any download
    assert not (tmp_path / "outside").exists() and not (tmp_path / "x.txt").exists()
    assert not [p for p in tmp_path.rglob("x.txt*") if p.is_file()]
    pin_cache = tmp_path / "cache" / "kaggle" / f"c_{slug}"
    assert not pin_cache.exists() or not [p for p in pin_cache.rglob("*") if p.is_file()]


def test_kaggle_archives_extract_within_the_boards_limits(kaggle_server, token_file, tmp_path):
    from pinstorm.boards.errors import ArchiveTooLarge

    kaggle_server.add_dataset("alice/zeros", {"zeros.bin": bytes(6 << 20)}, title="zeros")
    tight = board_kaggle(name="tight", token=token_file, endpoint=kaggle_server.endpoint, cache=tmp_path / "cache",
                        retries=0, max_extract_bytes=1 << 20)
    with pytest.raises(ArchiveTooLarge, match="max_bytes"):
        tight.pin_get("alice/zeros")  # Kaggle boards extract by default: within the limits
    assert Path(tight.pin_get("alice/zeros", extract_limits={"max_bytes": 8 << 20})[0]).stat().st_size == 6 << 20


def test_client_adapter_is_separate_from_the_board(board):
    from pinstorm.boards.backends import kaggle_client

    assert isinstance(board.storage._client, kaggle_client.KaggleClient)
    assert kaggle_client.competition_of("c/titanic") == "titanic" and kaggle_client.competition_of("a/b") is None
    with pytest.raises(boards.BoardError, match="http"):
        kaggle_client.normalise_endpoint("ftp://x", "k")
    assert kaggle_client.normalise_endpoint("http://h:1/v1/", "k") == "http://h:1"


def test_an_interrupted_download_resumes_where_it_stopped(kaggle_server, token_file, tmp_path):
    """The dropped connection of a long Kaggle download costs only the bytes not yet received: the next
    pin_get asks for the rest (the official client's Range resume, guarded by the file's ETag)."""
    big = os.urandom(3 << 20)  # random bytes: the zip stores them as they are
    kaggle_server.add_dataset("carol/big-archive", {"big.bin": big}, title="a big archive")
    board = board_kaggle(name="resume", token=token_file, endpoint=kaggle_server.endpoint, cache=tmp_path / "cache",
                        retries=0)
    first = len(kaggle_server.file_ranges)
    kaggle_server.cut_downloads = 1
    with pytest.raises(DownloadError):
        board.pin_get("carol/big-archive")
    [partial] = [p for p in (tmp_path / "cache").rglob("*.partial")]  # hidden, never served
    [kept] = [p for p in partial.iterdir() if p.suffix == ".zip"]
    have = kept.stat().st_size
    assert 0 < have
    files = board.pin_get("carol/big-archive")
    assert [Path(f).read_bytes() for f in files if Path(f).name == "big.bin"] == [big]
    ranges = [r for _, r in kaggle_server.file_ranges[first:]]
    assert ranges[0] is None and f"bytes={have}-" in ranges[1:]
    assert not [p for p in (tmp_path / "cache").rglob("*.partial")]
