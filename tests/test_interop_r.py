"""The real R pins clients and pinstorm, both ways, over a real HTTP server on 127.0.0.1.

- R pins 0.4.5 (legacy: `board_register_datatxt`, `pin_find`, `pin_get`) reads a board pinstorm
  wrote, through the `r-legacy` view of each version (see `boards/legacy_view.py`);
- R pins 1.1.0 reads it as `board_folder()` and as `board_url()` through `_pins.yaml`, recomputes
  pinstorm's multi-file `pin_hash`, and sees user metadata and tags;
- pinstorm reads boards R wrote: legacy boards with their versions, `table` pins as DataFrames,
  offline from the cache; pins 1.x boards over HTTP through `_pins.yaml`, hashes verified.

Each direction batches its R checks into one Rscript call (R starts in about a second).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pinstorm import boards
from pinstorm.boards.cache import StaleCacheWarning
from pinstorm.boards.errors import IntegrityError
from r_support import r045, r110  # noqa: F401 - fixtures

FRAME = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})


@pytest.fixture
def pinstorm_board(http_board, tmp_path):
    """A pinstorm board holding one pin of every kind, served over HTTP: (board, folder, url, pins)."""
    board, folder, url = http_board
    src = tmp_path / "src"
    src.mkdir()
    (src / "one.txt").write_text("one\n")
    (src / "two.txt").write_text("two\n")
    board.pin(FRAME, "frame_csv", type="csv", description="a csv frame")
    board.pin(FRAME, "frame_parquet", description="a parquet frame")
    board.pin(FRAME, "frame_arrow", type="arrow")
    board.pin({"k": [1, 2]}, "obj_json", metadata={"owner": "ml"})
    board.pin(src / "one.txt", "one_file")
    board.pin([src / "one.txt", src / "two.txt"], "two_files", description="two text files")
    board.pin([src / "one.txt", src / "two.txt"], "zipped", zip=True)
    board.pin(FRAME.head(2), "frame_csv", type="csv", description="a csv frame, second version")
    return board, folder, url


# ---- pinstorm writes, R reads ----------------------------------------------------------------------

def test_r_legacy_reads_every_pin_pinstorm_wrote(pinstorm_board, r045):
    board, folder, url = pinstorm_board
    out = r045.run(r"""
board_register_datatxt(url, name = "ps")
base <- function(x) I(sort(basename(as.character(x))))
text <- function(x) I(unname(sapply(sort(as.character(x)), function(f) paste(readLines(f), collapse = ""))))
list(
  find = I(sort(pin_find(board = "ps")$name)),
  csv = try_r(pin_get("frame_csv", board = "ps")),
  csv_class = try_r(class(pin_get("frame_csv", board = "ps"))),
  parquet = try_r(base(pin_get("frame_parquet", board = "ps"))),
  arrow = try_r(base(pin_get("frame_arrow", board = "ps"))),
  json = try_r(base(pin_get("obj_json", board = "ps"))),
  one = try_r(text(pin_get("one_file", board = "ps"))),
  two = try_r(base(pin_get("two_files", board = "ps"))),
  two_text = try_r(text(pin_get("two_files", board = "ps", files = TRUE))),
  zipped = try_r(base(pin_get("zipped", board = "ps", extract = TRUE))),
  zipped_text = try_r(text(pin_get("zipped", board = "ps", extract = TRUE)))
)
""", url=url)
    assert out["find"] == sorted(["frame_arrow", "frame_csv", "frame_parquet", "obj_json", "one_file", "two_files",
                                  "zipped"])
    assert out["csv"] == {"a": [1, 2], "b": ["x", "y"]}  # the latest version, as a data frame
    assert "data.frame" in out["csv_class"]
    assert out["parquet"] == ["frame_parquet.parquet"]  # R legacy cannot read parquet: the file
    assert out["arrow"] == ["frame_arrow.arrow"]
    assert out["json"] == ["obj_json.json"]
    assert out["one"] == ["one"]
    assert out["two"] == ["one.txt", "two.txt"]
    assert out["two_text"] == ["one", "two"]
    assert out["zipped"] == ["one.txt", "two.txt"]
    assert out["zipped_text"] == ["one", "two"]


def test_r_1x_reads_pinstorm_as_folder_and_url_board(pinstorm_board, r110):
    board, folder, url = pinstorm_board
    manifest = yaml.safe_load((folder / "_pins.yaml").read_text())
    assert sorted(manifest) == ["frame_arrow", "frame_csv", "frame_parquet", "obj_json", "one_file", "two_files",
                                "zipped"]
    assert len(manifest["frame_csv"]) == 2  # kept current on every pin
    two = board.read_meta("two_files", board.list_versions("two_files")[-1])
    out = r110.run(r"""
b <- board_folder(folder)
u <- board_url(paste0(url, "/"))
files_text <- function(x) I(unname(sapply(sort(x), function(f) paste(readLines(f), collapse = ""))))
res <- list()
for (kind in c("folder", "url")) {
  bd <- if (kind == "folder") b else u
  res[[kind]] <- list(
    list = I(sort(pin_list(bd))),
    csv = try_r(as.data.frame(pin_read(bd, "frame_csv"))),
    json = try_r(pin_read(bd, "obj_json")),
    one = try_r(files_text(pin_download(bd, "one_file"))),
    two = try_r(files_text(pin_download(bd, "two_files", hash = two_hash))),
    zip = try_r(I(basename(pin_download(bd, "zipped")))),
    parquet = try_r(pin_read(bd, "frame_parquet")),
    arrow = try_r(pin_read(bd, "frame_arrow")),
    meta_user = try_r(pin_meta(bd, "obj_json")$user),
    versions = try_r(nrow(pin_versions(bd, "frame_csv")))
  )
}
res$recomputed_hash <- pins:::pin_hash(pin_download(b, "two_files"))
res$search <- try_r(I(sort(pin_search(b, "two")$name)))  # R 1.1.0 searches names and titles
res
""", url=url, folder=str(folder), two_hash=two.pin_hash)
    for kind in ("folder", "url"):
        got = out[kind]
        assert got["list"] == sorted(manifest), kind
        assert got["csv"] == {"a": [1, 2], "b": ["x", "y"]}, kind
        assert got["json"] == {"k": [1, 2]}, kind
        assert got["one"] == ["one"], kind
        assert got["two"] == ["one", "two"], kind  # pin_download(hash = pinstorm's pin_hash) accepted
        assert got["zip"] == ["zipped.zip"], kind
        assert "error" in got["parquet"], kind  # R pins 1.1.0 has no parquet reader (1.2+ has)
        assert "error" in got["arrow"], kind  # arrow needs the R arrow package, which Debian lacks
        assert got["meta_user"] == {"owner": "ml"}, kind
        assert got["versions"] == (2 if kind == "folder" else 2), kind
    assert out["recomputed_hash"] == two.pin_hash  # R's rlang::hash scheme for several files
    assert out["search"] == ["two_files"]


def test_r_1x_sees_tags_and_metadata_from_pin_write(http_board, r110):
    board, folder, url = http_board
    board.pin_write(FRAME, "tagged", type="csv", title="Tagged", description="with tags",
                    metadata={"source": "unit"}, tags=["alpha", "beta"])
    out = r110.run(r"""
m <- pin_meta(board_url(paste0(url, "/")), "tagged")
list(title = m$title, description = m$description, user = m$user, tags = I(m$tags), type = m$type)
""", url=url)
    assert out == {"title": "Tagged", "description": "with tags", "user": {"source": "unit"},
                   "tags": ["alpha", "beta"], "type": "csv"}


# ---- R writes, pinstorm reads ----------------------------------------------------------------------

def test_pinstorm_reads_r_legacy_board_with_versions_and_offline(tmp_path, r045):
    cache_root = tmp_path / "r-boards"
    out = r045.run(r"""
board_register_local(name = "leg", cache = root, versions = TRUE)
pin(data.frame(a = 1:2, b = c("p", "q")), "tab", board = "leg", description = "a table")
pin(data.frame(a = 1:3, b = c("p", "q", "r")), "tab", board = "leg")
writeLines("alpha", file.path(tempdir(), "alpha.txt"))
writeLines("beta", file.path(tempdir(), "beta.txt"))
pin(file.path(tempdir(), "alpha.txt"), "afile", board = "leg", description = "one file")
pin(file.path(tempdir(), c("alpha.txt", "beta.txt")), "zipped", board = "leg", zip = TRUE)
pin(list(a = 1), "robj", board = "leg")
list(versions = I(pin_versions("tab", board = "leg")$version))
""", root=str(cache_root))
    assert len(out["versions"]) == 2
    served = cache_root / "leg"
    with boards.serve_board(served) as url:
        web = boards.board_register(url, name="rleg", cache=tmp_path / "cache")
        assert sorted(boards.pin_find(board="rleg")["name"]) == ["afile", "robj", "tab", "zipped"]
        assert [Path(p).name for p in web.pin_get("robj")] == ["data.rds"]  # an R object: only R reads it
        pd.testing.assert_frame_equal(web.pin_get("tab"), pd.DataFrame({"a": [1, 2, 3], "b": ["p", "q", "r"]}))
        versions = list(web.pin_versions("tab")["version"])
        assert len(versions) == 3 and versions[-1] == "legacy"
        # R shows short versions, newest first; a prefix selects one, oldest first here
        assert [v[:7] for v in versions[:2]] == list(reversed(out["versions"]))
        old = web.pin_get("tab", version=out["versions"][1])
        pd.testing.assert_frame_equal(old, pd.DataFrame({"a": [1, 2], "b": ["p", "q"]}))
        assert [Path(p).read_text() for p in web.pin_get("afile")] == ["alpha\n"]
        extracted = web.pin_get("zipped", extract=True)
        assert sorted(Path(p).name for p in extracted) == ["alpha.txt", "beta.txt"]
        # registered the R way (board_register_datatxt), the versions are there too
        explicit = boards.board_register("datatxt", name="rleg-datatxt", url=url, cache=tmp_path / "cache2")
        assert explicit.kind == "datatxt" and list(explicit.pin_versions("tab")["version"]) == versions
    # the server is gone: everything already fetched still comes back, with a warning
    offline = web
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pd.testing.assert_frame_equal(offline.pin_get("tab"), pd.DataFrame({"a": [1, 2, 3], "b": ["p", "q", "r"]}))
        assert [Path(p).read_text() for p in offline.pin_get("afile")] == ["alpha\n"]
        pd.testing.assert_frame_equal(offline.pin_get("tab", version=out["versions"][1]),
                                      pd.DataFrame({"a": [1, 2], "b": ["p", "q"]}))
    assert any(issubclass(w.category, StaleCacheWarning) for w in caught)


@pytest.fixture
def r1_board(tmp_path, r110):
    """A board R pins 1.1.0 wrote (with its manifest), and what R reported about it."""
    folder = tmp_path / "r1-board"
    out = r110.run(r"""
b <- board_folder(folder, versioned = TRUE)
pin_write(b, data.frame(a = 1:3, b = c("x", "y", "z")), "df_csv", type = "csv",
          description = "from R", metadata = list(k = "v"))
pin_write(b, list(x = 1L), "js", type = "json")
Sys.sleep(1)
pin_write(b, list(x = 2L), "js", type = "json")
pin_write(b, data.frame(a = 1), "an_rds", type = "rds")
writeLines("hello", file.path(tempdir(), "f1.txt")); writeLines("world", file.path(tempdir(), "f2.txt"))
pin_upload(b, file.path(tempdir(), c("f1.txt", "f2.txt")), "up2")
pin_upload(b, file.path(tempdir(), "f1.txt"), "up1")
write_board_manifest(b)
list(hash = pin_meta(b, "up2")$pin_hash, js = I(pin_versions(b, "js")$version))
""", folder=str(folder))
    return folder, out


def test_pinstorm_reads_r_1x_board_over_http_through_manifest(r1_board, tmp_path):
    folder, out = r1_board
    assert len(out["hash"]) == 32  # R's 128-bit hash of the two files' hashes
    with boards.serve_board(folder) as url:
        web = boards.board_register(url, name="r1", cache=tmp_path / "cache")  # no data.txt: _pins.yaml
        assert boards.pin_find(board="r1")["name"].tolist() == ["an_rds", "df_csv", "js", "up1", "up2"]
        assert web.describe().endswith("/_pins.yaml")
        pd.testing.assert_frame_equal(web.pin_get("df_csv"), FRAME)
        assert web.pin_get("js") == {"x": 2}  # R writes JSON with auto_unbox
        assert list(web.pin_versions("js")["version"]) == out["js"]
        assert web.pin_get("js", version=out["js"][0]) == {"x": 1}
        files = web.pin_get("up2")  # downloaded, then verified against R's multi-file hash
        assert [Path(p).read_text() for p in files] == ["hello\n", "world\n"]
        assert [Path(p).read_text() for p in web.pin_get("up1")] == ["hello\n"]
        meta = web.pin_meta("df_csv")
        assert (meta.user, meta.description, meta.urls) == ({"k": "v"}, "from R", None)  # 1.1.0 has no urls
        assert web.pin_get("an_rds")[0].endswith(".rds")  # rds: only R reads it; the file comes back
        # the same board as a local folder
        local = boards.board_register("local", name="r1-local", path=folder)
        pd.testing.assert_frame_equal(local.pin_get("df_csv"), FRAME)
        # a file changed on the server after R pinned it is refused (R's hash scheme)
        version = web.list_versions("up2")[-1]
        (folder / "up2" / version / "f2.txt").write_text("WORLD\n")
        fresh = boards.board_register(url, name="r1-fresh", cache=tmp_path / "cache2")
        with pytest.raises(IntegrityError):
            fresh.pin_get("up2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert web.pin_get("js") == {"x": 2}  # offline, from the cache
    assert any(issubclass(w.category, StaleCacheWarning) for w in caught)


def test_r_1x_reads_what_pinstorm_pin_writes_and_prunes(http_board, r110, tmp_path):
    board, folder, url = http_board
    for i in range(3):
        board.pin_write({"i": i}, "counter", type="json")
    board.pin_versions_prune("counter", n=1, grace=0)  # grace=0: the versions are seconds old
    board.pin_write(FRAME, "gone", type="csv")
    board.pin_remove("gone")
    out = r110.run(r"""
u <- board_url(paste0(url, "/"))
list(list = I(pin_list(u)), value = pin_read(u, "counter"), versions = nrow(pin_versions(board_folder(folder), "counter")))
""", url=url, folder=str(folder))
    assert out == {"list": ["counter"], "value": {"i": 2}, "versions": 1}


# ---- pinstorm writes to a bucket, R reads it over HTTP ---------------------------------------------

@pytest.fixture(scope="module")
def s3_server():
    from servers import s3

    yield from s3.serve()


@pytest.mark.slow
def test_r_reads_a_board_pinstorm_wrote_to_s3(s3_server, tmp_path, monkeypatch, r045, r110):
    from servers import s3

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    bucket = "interop-r"
    writer = boards.board_register("s3", name="bucket", bucket=bucket, path="shared", create_bucket=True,
                                   cache=tmp_path / "w", **s3_server.storage_options())
    src = tmp_path / "src"
    src.mkdir()
    (src / "one.txt").write_text("one\n")
    (src / "two.txt").write_text("two\n")
    writer.pin(FRAME, "frame_csv", type="csv")
    writer.pin([src / "one.txt", src / "two.txt"], "two_files")
    writer.pin([src / "one.txt", src / "two.txt"], "zipped", zip=True)
    s3.make_public(writer.storage.fs, bucket, "shared")
    url = f"{s3_server.endpoint}/{bucket}/shared"
    legacy = r045.run(r"""
board_register_datatxt(url, name = "s3")
list(find = I(sort(pin_find(board = "s3")$name)), csv = pin_get("frame_csv", board = "s3"),
     two = I(sort(basename(pin_get("two_files", board = "s3")))),
     zipped = I(sort(basename(pin_get("zipped", board = "s3", extract = TRUE)))))
""", url=url)
    assert legacy == {"find": ["frame_csv", "two_files", "zipped"], "csv": {"a": [1, 2, 3], "b": ["x", "y", "z"]},
                      "two": ["one.txt", "two.txt"], "zipped": ["one.txt", "two.txt"]}
    # each URL once: R 1.1.0 revalidates with a non-RFC `If-Modified-Since: ... UTC`, which moto answers
    # with HTTP 500 (S3 itself ignores a date it cannot parse)
    two_hash = writer.read_meta("two_files", writer.list_versions("two_files")[-1]).pin_hash
    modern = r110.run(r"""
u <- board_url(paste0(url, "/"))
list(list = I(sort(pin_list(u))), csv = as.data.frame(pin_read(u, "frame_csv")),
     two = I(sort(basename(pin_download(u, "two_files", hash = two_hash)))))
""", url=url, two_hash=two_hash)
    assert modern == {"list": ["frame_csv", "two_files", "zipped"], "csv": {"a": [1, 2, 3], "b": ["x", "y", "z"]},
                      "two": ["one.txt", "two.txt"]}


@pytest.fixture(scope="module")
def gcs_server():
    from servers import gcs

    yield from gcs.serve()


@pytest.mark.slow
def test_r_reads_a_board_pinstorm_wrote_to_gcs(gcs_server, tmp_path, r045, r110):
    writer = boards.board_register("gcs", name="gbucket", bucket="interop-r", path="shared", create_bucket=True,
                                   cache=tmp_path / "w", **gcs_server.storage_options())
    src = tmp_path / "src"
    src.mkdir()
    (src / "one.txt").write_text("one\n")
    (src / "two.txt").write_text("two\n")
    writer.pin(FRAME, "frame_csv", type="csv")
    writer.pin([src / "one.txt", src / "two.txt"], "zipped", zip=True)
    url = f"{gcs_server.endpoint}/interop-r/shared"  # the emulator serves objects publicly, as GCS can
    legacy = r045.run(r"""
board_register_datatxt(url, name = "gcs")
list(find = I(sort(pin_find(board = "gcs")$name)), csv = pin_get("frame_csv", board = "gcs"),
     zipped = I(sort(basename(pin_get("zipped", board = "gcs", extract = TRUE)))))
""", url=url)
    assert legacy == {"find": ["frame_csv", "zipped"], "csv": {"a": [1, 2, 3], "b": ["x", "y", "z"]},
                      "zipped": ["one.txt", "two.txt"]}
    modern = r110.run(r"""
u <- board_url(paste0(url, "/"))
list(list = I(sort(pin_list(u))), csv = as.data.frame(pin_read(u, "frame_csv")))
""", url=url)
    assert modern == {"list": ["frame_csv", "zipped"], "csv": {"a": [1, 2, 3], "b": ["x", "y", "z"]}}
