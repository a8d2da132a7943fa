"""S3 boards against moto's real S3 server on 127.0.0.1 (and a fault-injecting proxy in front of it)."""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path

import pandas as pd
import yaml
import pytest

from pinstorm import boards
from pinstorm.boards.cache import StaleCacheWarning
from pinstorm.boards.errors import BoardError, CredentialsError, DownloadError, PinNotFound
from servers import faults, s3

s3_server = pytest.fixture(scope="module", name="s3_server")(s3.serve)
SECRET = "s3cr3t-VALUE-never-shown"
# one attempt per request: the failure tests want the error, not botocore's back-off
FAST = {"config_kwargs": {"retries": {"max_attempts": 1}}}


@pytest.fixture(autouse=True)
def no_aws_credentials(tmp_path, monkeypatch):
    """Only the credentials a test passes exist: no environment, files or instance metadata."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def bucket():
    return f"pins-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def proxy(s3_server):
    with faults.FaultProxy(s3_server.endpoint) as p:
        yield p



def _images(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"img{i}.jpg").write_bytes(bytes([i]) * (1000 + i))
    return folder


def test_round_trip_pin_find_get_versions_remove(s3_server, bucket, tmp_path):
    board = boards.board_register("s3", name="cloud", bucket=bucket, path="team/boards", create_bucket=True,
                                  cache=tmp_path / "cache", **s3_server.storage_options())
    df = pd.DataFrame({"wnid": ["n01440764", "n01443537"], "label": ["tench", "goldfish"]})
    boards.pin(df, "categories", board="cloud", description="ImageNet categories")
    pd.testing.assert_frame_equal(boards.pin_get("categories", board="cloud"), df)

    folder = _images(tmp_path / "n01440764")
    boards.pin(folder, "n01440764", board="cloud")
    paths = boards.pin_get("n01440764", board="cloud")
    assert sorted(Path(p).name for p in paths) == ["img0.jpg", "img1.jpg", "img2.jpg"]
    assert all(Path(p).read_bytes() == (folder / Path(p).name).read_bytes() for p in paths)
    assert all(str(tmp_path / "cache") in p for p in paths)

    found = boards.pin_find("imagenet", board="cloud")
    assert list(found["name"]) == ["categories"] and found["board"][0] == "cloud"
    assert set(boards.pin_find("", board="cloud")["name"]) == {"categories", "n01440764"}

    # the pins 1.x layout and the root index, at the keys a datatxt reader expects
    fs = board.storage.fs
    assert fs.exists(f"{bucket}/team/boards/data.txt")
    version = boards.pin_versions("categories", board="cloud")["version"].iloc[-1]
    assert fs.exists(f"{bucket}/team/boards/categories/{version}/data.txt")
    assert fs.exists(f"{bucket}/team/boards/categories/{version}/categories.parquet")

    df2 = pd.concat([df, pd.DataFrame({"wnid": ["n01484850"], "label": ["great white shark"]})])
    boards.pin(df2.reset_index(drop=True), "categories", board="cloud")
    versions = boards.pin_versions("categories", board="cloud")
    assert len(versions) == 2
    assert len(boards.pin_get("categories", board="cloud")) == 3
    assert len(boards.pin_get("categories", board="cloud", version=versions["version"][0])) == 2
    assert boards.pin_info("categories", board="cloud")["versions"] == 2

    boards.pin_remove("categories", board="cloud")
    assert list(boards.pin_find("", board="cloud")["name"]) == ["n01440764"]
    with pytest.raises(PinNotFound):
        board.pin_get("categories")


def test_listings_are_never_stale_between_writers(s3_server, bucket, tmp_path):
    opts = s3_server.storage_options()
    # the writer stands for another process: its own s3fs instance and its own cache
    writer = boards.board_register("s3", name="writer", bucket=bucket, create_bucket=True,
                                   cache=tmp_path / "w", skip_instance_cache=True, **opts)
    reader = boards.board_register("s3", name="reader", bucket=bucket, cache=tmp_path / "r", **opts)
    assert writer.storage.fs is not reader.storage.fs
    writer.pin({"epoch": 1}, "state")
    assert reader.pin_get("state") == {"epoch": 1}
    assert len(reader.pin_versions("state")) == 1
    writer.pin({"epoch": 2}, "state")
    assert len(reader.pin_versions("state")) == 2  # seen at once, no stale listing
    assert reader.pin_get("state") == {"epoch": 2}
    writer.pin({"n": 1}, "other")
    assert set(reader.pin_find()["name"]) == {"state", "other"}
    writer.pin_remove("state")
    with pytest.raises(PinNotFound):
        reader.pin_versions("state")
    assert list(reader.pin_find()["name"]) == ["other"]


def test_bucket_written_with_credentials_reads_back_as_datatxt_over_http(s3_server, bucket, tmp_path):
    writer = boards.board_register("s3", name="publisher", bucket=bucket, path="shared", create_bucket=True,
                                   cache=tmp_path / "w", **s3_server.storage_options())
    df = pd.DataFrame({"wnid": ["n01440764"], "images": [1300]})
    writer.pin(df, "categories", description="categories shared by URL")
    writer.pin(_images(tmp_path / "imgs", 4), "n01440764", zip=True)
    s3.make_public(writer.storage.fs, bucket, "shared")  # what a publisher does once

    url = f"{s3_server.endpoint}/{bucket}/shared"
    public = boards.board_register("datatxt", name="public", url=url, cache=tmp_path / "r")
    assert set(public.pin_find()["name"]) == {"categories", "n01440764"}
    pd.testing.assert_frame_equal(public.pin_get("categories"), df)
    extracted = public.pin_get("n01440764")  # zipped by pinstorm: unzipped on the way in
    assert sorted(Path(p).name for p in extracted) == [f"img{i}.jpg" for i in range(4)]
    assert Path(extracted[2]).read_bytes() == bytes([2]) * 1002


def test_server_errors_are_clear_and_the_cache_never_holds_a_partial_file(s3_server, proxy, bucket, tmp_path):
    writer = boards.board_register("s3", name="w", bucket=bucket, create_bucket=True, cache=tmp_path / "w",
                                   **s3_server.storage_options())
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 2000)
    writer.pin(big, "big")
    writer.pin(pd.DataFrame({"a": [1, 2]}), "small")
    board = boards.board_register("s3", name="via-proxy", bucket=bucket, cache=tmp_path / "cache",
                                  **s3_server.storage_options(proxy.endpoint), **FAST)
    pin_cache = tmp_path / "cache" / "via-proxy" / "big"

    def cached_versions():
        # version folders a reader could be served; a hidden `.<version>.partial` is a resumable download
        return [p.name for p in pin_cache.iterdir() if p.is_dir() and not p.name.startswith(".")] \
            if pin_cache.exists() else []

    proxy.fail(r"/big\.bin", 500, method="GET", content_type="application/xml",
               body="<Error><Code>InternalError</Code><Message>disk on fire</Message></Error>")
    with pytest.raises(DownloadError) as e500:
        board.pin_get("big")
    assert e500.value.status == 500 and "via-proxy" in str(e500.value) and bucket in str(e500.value)
    assert cached_versions() == []

    proxy.clear()
    proxy.truncate(r"/big\.bin")
    with pytest.raises(DownloadError, match="(?i)payload|content length|truncat"):
        board.pin_get("big")
    assert cached_versions() == []
    assert any(status < 0 for _, _, status in proxy.log)  # the body really was cut

    proxy.clear()
    proxy.fail(r"list-type", 403, content_type="application/xml",
               body="<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>")
    with pytest.raises(CredentialsError, match=f"via-proxy.*{bucket}"):
        board.pin_get("big")

    proxy.clear()
    version = writer.pin_versions("big")["version"].iloc[-1]
    assert Path(board.pin_get("big")[0]).read_bytes() == big.read_bytes()
    assert cached_versions() == [version]

    writer.storage.fs.rm(f"{bucket}/small/{writer.pin_versions('small')['version'].iloc[-1]}/small.parquet")
    with pytest.raises(DownloadError, match="missing") as e404:
        board.pin_get("small")
    assert e404.value.status == 404

    proxy.stop()  # connection refused from now on
    with pytest.warns(StaleCacheWarning, match="via-proxy"):
        again = board.pin_get("big")
    assert Path(again[0]).read_bytes() == big.read_bytes()
    writer.pin({"x": 1}, "never-cached")
    with pytest.raises(DownloadError, match="connection failed"):
        board.pin_get("never-cached")


def test_missing_or_refused_credentials_are_named_never_echoed(s3_server, proxy, bucket, tmp_path):
    # no key anywhere: botocore cannot sign
    nobody = boards.board_register("s3", name="anonymous-ish", bucket=bucket, endpoint_url=s3_server.endpoint,
                                   cache=tmp_path / "c1", **FAST)
    with pytest.raises(CredentialsError, match="anonymous-ish.*" + bucket) as missing:
        nobody.pin_find()
    assert "Unable to locate credentials" in str(missing.value)

    # a server that quotes what it was sent: the message keeps the server's words, minus the secret
    proxy.fail("list-type", 403, method="GET", content_type="application/xml",
               body=f"<Error><Code>InvalidAccessKeyId</Code><Message>key {SECRET} unknown</Message></Error>")
    refused = boards.board_register("s3", name="refused", bucket=bucket, endpoint_url=proxy.endpoint,
                                    key="AKIDEXAMPLE", secret=SECRET, cache=tmp_path / "c2", **FAST)
    with pytest.raises(CredentialsError, match=r"refused.*key \*\*\* unknown") as denied:
        refused.pin_versions("anything")
    assert SECRET not in str(denied.value)


def test_bucket_argument_is_checked_and_missing_bucket_is_explained(s3_server, tmp_path):
    with pytest.raises(BoardError, match="bucket must be a bucket name"):
        boards.board_register("s3", name="bad", bucket="my-bucket/with/path", **s3_server.storage_options())
    missing = boards.board_register("s3", name="nobucket", bucket=f"absent-{uuid.uuid4().hex[:8]}",
                                    cache=tmp_path / "c", **s3_server.storage_options(), **FAST)
    with pytest.raises(BoardError, match="does not exist.*create_bucket=True"):
        missing.pin({"a": 1}, "x")
    with pytest.raises(BoardError, match="does not exist"):  # not an empty listing: there is no board
        missing.pin_find()


def test_secret_options_are_not_persisted(tmp_path, s3_server):
    import warnings

    from pinstorm import boards
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        boards.board_register("s3", name="persisted", bucket="persist-bucket", endpoint_url=s3_server.endpoint,
                              key="AKIAEXAMPLE", secret="very-secret-value", create_bucket=True, persist=True)
    assert any("secret options" in str(w.message) for w in caught)
    text = (tmp_path / "config" / "boards.yaml").read_text()
    assert "very-secret-value" not in text and "AKIAEXAMPLE" not in text and "persist-bucket" in text


def test_nested_secrets_and_auth_headers_never_reach_the_config_file(tmp_path, s3_server, bucket):
    import stat

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b = boards.board_register(
            "s3", name="nested", bucket=bucket, endpoint_url=s3_server.endpoint, create_bucket=True,
            persist=True, client_kwargs={"aws_access_key_id": s3.KEY, "aws_secret_access_key": SECRET,
                                         "aws_session_token": "session-" + SECRET, "verify": False},
            config_kwargs={"retries": {"max_attempts": 1}})
        boards.board_register("https://example.org/board/", name="web", persist=True,
                              headers={"Authorization": "Bearer " + SECRET, "X-Api-Key": SECRET,
                                       "User-Agent": "pinstorm-test"})
    b.pin({"works": True}, "p")  # the secrets still work in this process
    path = tmp_path / "config" / "boards.yaml"
    text = path.read_text()
    assert SECRET not in text and s3.KEY not in text and "Bearer" not in text
    saved = yaml.safe_load(text)["boards"]
    assert saved["nested"]["client_kwargs"] == {"verify": False}
    assert saved["nested"]["config_kwargs"] == {"retries": {"max_attempts": 1}}
    assert saved["web"]["headers"] == {"User-Agent": "pinstorm-test"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    dropped = " ".join(str(w.message) for w in caught)
    assert "client_kwargs.aws_secret_access_key" in dropped and "headers.Authorization" in dropped
    assert SECRET not in dropped


def test_a_failed_batch_index_names_the_board_and_a_failed_version_leaves_no_object(s3_server, proxy, bucket,
                                                                                     tmp_path):
    """The index write at the end of a batch fails: an error naming the board and the index, the pin stored and
    listed by the next write. A version whose data.txt cannot be written takes its uploaded files back, and the
    batch's own error is the one raised (the index failure after it is a warning, not a replacement)."""
    from pinstorm.boards.errors import IndexNotWritten

    board = boards.board_s3(f"{bucket}/b", create_bucket=True, cache=tmp_path / "cache",
                            **s3_server.storage_options(proxy.endpoint), **FAST)
    board.pin([1], "first")
    proxy.fail(rf"/{bucket}/b/data\.txt$", 500, method="PUT")
    with pytest.raises(IndexNotWritten, match=rf"s3 board .*s3://{bucket}/b.* stored, but its data.txt index could "
                                              r"not be written .*board repair") as caught:
        with board.batch():
            board.pin({"a": 1}, "listed-later")
    assert isinstance(caught.value, OSError) and s3.SECRET not in str(caught.value)

    proxy.rules.clear()
    proxy.fail(r"data\.txt$", 500, method="PUT")                    # every data.txt: the version's own too
    with pytest.raises(DownloadError, match="cannot write pin 'orphan'"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with board.batch():
            board.pin(_images(tmp_path / "imgs"), "orphan")
    assert not seen or all("data.txt index could not be written" in str(w.message) for w in seen)

    proxy.rules.clear()
    board.pin([2], "second")                                         # the next write lists what was stored
    names = set(boards.pin_find("", board=board)["name"])
    assert names == {"first", "listed-later", "second"}
    s3fs = board.storage.fs
    s3fs.invalidate_cache()
    assert not [k for k in s3fs.find(f"{bucket}/b") if "/orphan/" in k]   # nothing for `board repair` to find
