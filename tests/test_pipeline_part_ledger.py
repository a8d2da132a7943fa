"""The part cache's ledger (`pipeline.part_ledger`): the journal every process reads incrementally instead
of scanning the cache under its lock. Real files in a real folder; the streaming tests use it end to end."""

from __future__ import annotations

import os

import pytest

from pinstorm.pipeline import part_ledger
from pinstorm.pipeline.part_cache import _KEY
from pinstorm.pipeline.part_ledger import Ledger


def _cache(tmp_path, files: dict[str, int]):
    """A cache root holding `files` ({"folder/name": size}), each older than the next."""
    root = tmp_path / "parts"
    for age, (key, size) in enumerate(files.items()):
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    root.mkdir(exist_ok=True)
    return root


def test_a_missing_ledger_is_written_from_the_folders_oldest_first(tmp_path):
    root = _cache(tmp_path, {"ds-1/part-0.parquet": 5, "ds-1/part-1.parquet+3": 7, "ds-2/part-0.parquet": 11})
    (root / "ds-1" / "part-0.parquet.lock").touch()   # locks and downloads in flight are not files of the cache
    (root / "ds-1" / "part-2.parquet.tmp-123-host-abcdef12").write_bytes(b"y" * 100)
    ledger = Ledger(root, _KEY)
    ledger.sync()
    assert list(ledger.entries) == ["ds-1/part-0.parquet", "ds-1/part-1.parquet+3", "ds-2/part-0.parquet"]
    assert ledger.used == 23 and (root / ".ledger").is_file()


def test_every_process_sees_the_others_changes_by_reading_only_what_is_new(tmp_path):
    root = _cache(tmp_path, {"ds-1/a": 5, "ds-1/b": 7})
    one, two = Ledger(root, _KEY), Ledger(root, _KEY)
    one.sync()
    two.sync()
    one.add("ds-1/c", 3)
    one.use("ds-1/a")
    two.sync()
    assert list(two.entries) == ["ds-1/b", "ds-1/c", "ds-1/a"] and two.used == 15
    two.remove("ds-1/b")
    offset = one._offset
    one.sync()
    assert one._offset > offset and list(one.entries) == ["ds-1/c", "ds-1/a"] and one.used == 8


def test_lines_that_do_not_parse_or_name_a_path_outside_the_cache_are_ignored(tmp_path):
    root = _cache(tmp_path, {"ds-1/a": 5})
    ledger = Ledger(root, _KEY)
    ledger.sync()
    with open(root / ".ledger", "a") as journal:
        journal.write("+ ../../etc/passwd 1\n+ ds-1/../../x 1\n+ ds-1/b notanumber\n? ds-1/a\n+ ds-1/a.lock 9\n"
                      "garbage\n+ ds-1/c 4\n+ ds-1/half")   # the last line is not whole yet
    ledger.sync()
    assert dict(ledger.entries) == {"ds-1/a": 5, "ds-1/c": 4} and ledger.used == 9


def test_the_journal_is_written_again_from_the_folders_once_it_is_long(tmp_path, monkeypatch):
    monkeypatch.setattr(part_ledger, "COMPACT_AFTER", 10)
    root = _cache(tmp_path, {"ds-1/a": 5, "ds-1/b": 7})
    ledger, other = Ledger(root, _KEY), Ledger(root, _KEY)
    ledger.sync()
    other.sync()
    ledger.add("ds-1/gone", 50)   # counted, then never there: forgotten when the journal is written again
    for _ in range(20):
        ledger.use("ds-1/a")
    os.utime(root / "ds-1" / "a")   # used last: the folders say so too
    ledger.sync()
    assert (root / ".ledger").read_text().count("\n") == 3   # the header and the two files
    assert list(ledger.entries) == ["ds-1/b", "ds-1/a"] and ledger.used == 12
    other.sync()   # another process notices the journal was replaced and reads it whole
    assert list(other.entries) == ["ds-1/b", "ds-1/a"] and other.used == 12


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_ledger_deleted_or_cut_short_is_read_again(tmp_path, damage):
    root = _cache(tmp_path, {"ds-1/a": 5, "ds-1/b": 7})
    ledger = Ledger(root, _KEY)
    ledger.sync()
    ledger.add("ds-1/c", 3)
    if damage == "deleted":
        (root / ".ledger").unlink()
    else:
        (root / ".ledger").write_text("")
    ledger.sync()
    assert dict(ledger.entries) == {"ds-1/a": 5, "ds-1/b": 7}   # from the folders: c was never there
