"""`pinstorm repartition | fetch | convert | inspect` through click, as a user types them."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from pinstorm import boards
from pinstorm.cli import cli
from pinstorm.pipeline import dataset_info

pytest_plugins = ["conftest_pipeline"]


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def test_convert_then_inspect(digits_root, tmp_path, monkeypatch):
    code, out = run("convert", digits_root, tmp_path / "train", "--partitions", 2, "--min-row-groups", 4)
    assert code == 0, out
    assert "re-encoded 3" in out and "skipped 2" in out and "truncated" in out
    code, out = run("convert", digits_root, tmp_path / "val", "--split", "val", "--classes-from", tmp_path / "train")
    assert code == 0, out
    assert dataset_info(tmp_path / "val")["classes"] == dataset_info(tmp_path / "train")["classes"]

    monkeypatch.chdir(tmp_path)
    code, out = run("inspect", tmp_path / "train")
    assert code == 0, out
    rows = dataset_info(tmp_path / "train")["rows"]
    assert f"rows        {rows} (train)" in out and "4 in 2 part file(s)" in out
    sheet = tmp_path / "train-contact-sheet.png"
    assert sheet.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and sheet.stat().st_size > 10_000
    code, out = run("inspect", tmp_path / "val", "--no-sheet", "--json")
    assert code == 0 and '"split": "val"' in out and not (tmp_path / "val-contact-sheet.png").exists()

    code, out = run("verify", tmp_path / "train", "--decode")
    assert code == 0 and f"4 row groups, {rows} rows: all checksums match, every image decodes" in out, out
    part = tmp_path / "train" / "part-00001.parquet"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    code, out = run("verify", tmp_path / "train")
    assert code == 1 and "CorruptPartError" in out and "part-00001.parquet row group" in out, out


def test_clear_errors_and_exit_codes(digits_root, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    code, out = run("convert", digits_root, tmp_path / "notes")
    assert code == 1 and "DatasetExistsError" in out and "did not write" in out
    code, out = run("inspect", tmp_path / "nothing")
    assert code == 1 and "no such dataset" in out
    code, out = run("convert", digits_root, tmp_path / "x", "--partition", "0/2")
    assert code == 2 and "board://" in out


def test_repartition_and_convert_a_board_slice(digits_root, tmp_path):
    boards.board_register("local", name="inet", path=tmp_path / "board")
    code, out = run("repartition", digits_root, "--board", "inet", "--parallel", 2)
    assert code == 0 and "pinned 10 categories" in out, out
    code, out = run("convert", "board://inet", "board://inet/slice-1", "--partition", "1/2")
    assert code == 0, out
    info = dataset_info("board://inet/slice-1")
    assert info["num_classes"] == 10 and info["rows"] > 0
    assert sum(r > 0 for r in info["class_rows"]) == 5
    assert Path(info["url"][len("file://"):]).is_dir()

    code, out = run("fetch", "inet", "--partition", "0/2")   # the first half, into the cache, not converted
    assert code == 0 and "5 categories" in out and "into the cache" in out, out
    code, out = run("fetch", "inet", "--partition", "1/2", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["categories"]) == 5 and len(data["classes"]) == 10
    assert len(data["image"]) == len(data["category"]) > 0 and all(Path(p).is_file() for p in data["image"])
    assert set(data["category"]) == set(data["categories"])


def test_storage_options_flag_reaches_a_bucket_and_never_prints_a_value(digits_root, tmp_path, monkeypatch):
    """``--storage-option KEY=VALUE`` (repeatable; booleans, dotted keys nest): the output in moto's S3 and the
    tree read back from it; no value is printed, neither of a malformed pair nor inside a library's error."""
    import s3fs
    from servers.s3 import KEY, SECRET, S3Server

    from pinstorm.pipeline.cli import _storage_options

    assert _storage_options(("endpoint-url=http://h:9", "anon=false", "client_kwargs.region_name=eu",
                             "client_kwargs.verify=true")) == {
        "endpoint_url": "http://h:9", "anon": False, "client_kwargs": {"region_name": "eu", "verify": True}}
    with S3Server() as server:
        flags = [f for key, value in server.storage_options().items()
                 for f in ("--storage-option", f"{key}={value}")]
        s3fs.S3FileSystem(**server.storage_options()).mkdir("cli")
        code, out = run("convert", digits_root, "s3://cli/train", "--min-row-groups", 4, *flags)
        assert code == 0 and "s3://cli/train: " in out, out
        assert KEY not in out and SECRET not in out
        info = dataset_info("s3://cli/train", storage_options=server.storage_options())
        assert info["rows"] > 0 and info["row_groups"] == 4
        # the same flags read a tree in the bucket (and --classes-from a dataset there)
        s3fs.S3FileSystem(**server.storage_options()).put(str(digits_root) + "/", "cli/tree", recursive=True)
        code, out = run("convert", "s3://cli/tree", tmp_path / "from-bucket", "--min-row-groups", 4,
                        "--classes-from", "s3://cli/train", *flags)
        assert code == 0, out
        assert dataset_info(tmp_path / "from-bucket")["rows"] == info["rows"]
        code, out = run("convert", "s3://cli/tree", tmp_path / "no", "--storage-option", "hunter2-typed-alone")
        assert code == 2 and "--storage-option" in out and "hunter2" not in out, out

    def quoting(*args, **kwargs):
        raise OSError(f"signature mismatch for key {kwargs['storage_options']['secret']}")

    import importlib

    monkeypatch.setattr(importlib.import_module("pinstorm.pipeline.convert"), "convert", quoting)
    code, out = run("convert", digits_root, "s3://cli/x", "--storage-option", "secret=s3cr3t-v4lue")
    assert code == 1 and "OSError: signature mismatch for key ***" in out and "s3cr3t" not in out, out
