"""GCS boards against gcp-storage-emulator on 127.0.0.1 (and a fault-injecting proxy in front of it).

gcsfs retries 5xx answers, broken connections and truncated bodies with back-off for ~30 s before
giving up, so those failures are exercised on S3 and Kaggle; here: 403, 404 and round trips.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest

from pinstorm import boards
from pinstorm.boards.errors import CredentialsError, DownloadError, PinNotFound
from servers import faults, gcs

gcs_server = pytest.fixture(scope="module", name="gcs_server")(gcs.serve)


@pytest.fixture
def bucket():
    return f"pins-{uuid.uuid4().hex[:10]}"



def test_round_trip_pin_find_get_versions_remove(gcs_server, bucket, tmp_path):
    board = boards.board_register("gcs", name="gcloud-board", bucket=bucket, path="boards/imagenet",
                                  create_bucket=True, cache=tmp_path / "cache", **gcs_server.storage_options())
    assert board.kind == "gcs" and board.storage.root == f"{bucket}/boards/imagenet"
    df = pd.DataFrame({"wnid": ["n01440764", "n01443537"], "label": ["tench", "goldfish"]})
    boards.pin(df, "categories", board="gcloud-board", description="ImageNet categories")
    pd.testing.assert_frame_equal(boards.pin_get("categories", board="gcloud-board"), df)

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i in range(3):
        (imgs / f"{i}.jpg").write_bytes(bytes([i + 1]) * 2048)
    boards.pin(imgs, "n01440764", board="gcloud-board", zip=True)
    extracted = boards.pin_get("n01440764", board="gcloud-board")
    assert sorted(Path(p).name for p in extracted) == ["0.jpg", "1.jpg", "2.jpg"]
    assert Path(extracted[1]).read_bytes() == bytes([2]) * 2048

    assert list(boards.pin_find("imagenet", board="gcloud-board")["name"]) == ["categories"]
    assert board.storage.fs.exists(f"{bucket}/boards/imagenet/data.txt")

    boards.pin(df.head(1), "categories", board="gcloud-board")
    assert len(boards.pin_versions("categories", board="gcloud-board")) == 2
    assert len(boards.pin_get("categories", board="gcloud-board")) == 1

    boards.pin_remove("categories", board="gcloud-board")
    assert list(boards.pin_find(board="gcloud-board")["name"]) == ["n01440764"]
    with pytest.raises(PinNotFound):
        board.pin_versions("categories")


def test_gcloud_alias_and_fresh_listings_between_writers(gcs_server, bucket, tmp_path):
    opts = gcs_server.storage_options()
    writer = boards.board_register("gcloud", name="writer", bucket=bucket, create_bucket=True,
                                   cache=tmp_path / "w", skip_instance_cache=True, **opts)
    reader = boards.board_register("gcs", name="reader", bucket=bucket, cache=tmp_path / "r", **opts)
    assert writer.kind == reader.kind == "gcs" and writer.storage.fs is not reader.storage.fs
    writer.pin({"epoch": 1}, "state")
    assert reader.pin_get("state") == {"epoch": 1}
    writer.pin({"epoch": 2}, "state")
    assert len(reader.pin_versions("state")) == 2
    assert reader.pin_get("state") == {"epoch": 2}
    writer.pin_remove("state")
    with pytest.raises(PinNotFound):
        reader.pin_get("state")


def test_bucket_reads_back_as_datatxt_over_plain_http(gcs_server, bucket, tmp_path):
    writer = boards.board_register("gcs", name="publisher", bucket=bucket, path="shared", create_bucket=True,
                                   cache=tmp_path / "w", **gcs_server.storage_options())
    df = pd.DataFrame({"wnid": ["n01440764"], "images": [1300]})
    writer.pin(df, "categories", description="categories shared by URL")
    # the emulator serves objects at /<bucket>/<key> without credentials, as GCS does for public objects
    public = boards.board_register("datatxt", name="public", url=f"{gcs_server.endpoint}/{bucket}/shared",
                                   cache=tmp_path / "r")
    assert list(public.pin_find()["name"]) == ["categories"]
    pd.testing.assert_frame_equal(public.pin_get("categories"), df)


def test_forbidden_and_missing_objects_are_clear(gcs_server, bucket, tmp_path):
    writer = boards.board_register("gcs", name="w", bucket=bucket, create_bucket=True, cache=tmp_path / "w",
                                   **gcs_server.storage_options())
    writer.pin(pd.DataFrame({"a": [1]}), "table")
    with faults.FaultProxy(gcs_server.endpoint) as proxy:
        board = boards.board_register("gcs", name="via-proxy", bucket=bucket, cache=tmp_path / "c",
                                      **gcs_server.storage_options(proxy.endpoint))
        proxy.fail(r"/o\?|/o$", 403, content_type="application/json",
                   body='{"error": {"code": 403, "message": "caller does not have storage.objects.list"}}')
        with pytest.raises(CredentialsError, match=f"via-proxy.*{bucket}.*storage.objects.list"):
            board.pin_get("table")
        proxy.clear()
        version = writer.pin_versions("table")["version"].iloc[-1]
        writer.storage.fs.rm(f"{bucket}/table/{version}/table.parquet")
        with pytest.raises(DownloadError, match="missing") as missing:
            board.pin_get("table")
        assert missing.value.status == 404
        assert not (tmp_path / "c" / "via-proxy" / "table" / version).exists()


def test_importing_boards_cloud_turns_off_the_gcsfs_grpc_probe_unless_set():
    code = "import os, pinstorm.boards.backends.cloud, gcsfs; print(os.environ['GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT'])"
    env = {k: v for k, v in os.environ.items() if k != "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "false", out.stderr
    env["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "true"
    out = subprocess.run([sys.executable, "-c", code.replace(", gcsfs", "")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "true", out.stderr  # the user's own choice stays


def test_cached_pins_cost_one_listing_of_the_board(gcs_server, bucket, tmp_path):
    """As on S3 (tests/test_boards_parallel.py): `pin_get_many` of cached pins lists the board once."""
    from pinstorm.boards.parallel import pin_get_many

    with faults.FaultProxy(gcs_server.endpoint) as proxy:
        board = boards.board_register("gcs", name="many", bucket=bucket, path="cats", create_bucket=True,
                                      cache=tmp_path / "cache", **gcs_server.storage_options(proxy.endpoint))
        names = [f"n{i:08d}" for i in range(8)]
        with board.batch():
            for i, name in enumerate(names):
                (tmp_path / f"{name}.JPEG").write_bytes(b"\xff\xd8" + bytes([i]) * 99)
                board.store([tmp_path / f"{name}.JPEG"], name, zip=True)
        first = pin_get_many(names, board="many")
        proxy.clear()
        assert pin_get_many(names, board="many") == first
        recursive = [p for m, p, _ in proxy.log if m == "GET" and "/o?delimiter=&" in p]
        # the index (gcsfs: its metadata, a folder probe, its bytes) and one listing, where 8 were before
        assert recursive == [f"/storage/v1/b/{bucket}/o?delimiter=&prefix=cats/&maxResults=1000"], proxy.log
        assert not [p for _, p, _ in proxy.log if "prefix=cats/n" in p], proxy.log   # no pin listed on its own
        assert len(proxy.log) < len(names), proxy.log
