"""A full disk never half-publishes a pin: `pin()` either stores and lists the version, or leaves the
board exactly as it was, with one error naming the pin, the path and the free space (issue 17, case 10).
Tested on a real, small tmpfs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from pinstorm import boards
from pinstorm.boards.errors import DiskFull, PinNotFound
from disk_support import small_disk  # noqa: F401 - fixture


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and not p.name.endswith(".lock")}


def _fill(disk: Path, leave: int) -> None:
    """Write a filler file so that about `leave` bytes stay free."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def test_a_pin_that_does_not_fit_leaves_the_board_as_it_was(tmp_path, small_disk):
    disk = small_disk(tmp_path / "disk", "2m")
    board = boards.board_register("local", name="full", path=disk / "board")
    board.pin({"kept": True}, "kept")
    before = _snapshot(disk / "board")
    _fill(disk, 256 << 10)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20))
    with pytest.raises(DiskFull) as info:
        board.pin(big, "big")
    message = str(info.value)
    assert "pin 'big'" in message and str(disk / "board") in message and "bytes free" in message
    assert _snapshot(disk / "board") == before  # no version, no folder, no temporary left
    with pytest.raises(PinNotFound):
        board.list_versions("big")


def test_a_version_whose_index_cannot_be_written_is_taken_back(tmp_path, small_disk):
    """The version's files fit, the rewrite of the board's index does not: the version must not stay
    live and unlisted (before: listed by pin_get, missing from data.txt until a repair)."""
    disk = small_disk(tmp_path / "disk", "8m")
    board = boards.board_register("local", name="full", path=disk / "board")
    with board.batch():  # a board whose index is large enough that rewriting it needs room
        for i in range(150):
            board.pin({"i": i}, f"cat{i:05d}", description="x" * 2500)
    index_size = (disk / "board" / "data.txt").stat().st_size
    assert index_size > 256 << 10
    before = _snapshot(disk / "board")
    _fill(disk, 96 << 10)  # room for the new version, not for a second copy of data.txt
    with pytest.raises(DiskFull, match="pin 'new'"):
        board.pin({"new": True}, "new")
    assert _snapshot(disk / "board") == before
    with pytest.raises(PinNotFound):
        board.list_versions("new")
    (disk / "filler").unlink()
    board.pin({"new": True}, "new")  # with room again, it goes through and is listed
    listed = {e["name"] for e in yaml.safe_load((disk / "board" / "data.txt").read_text())}
    assert "new" in listed and len(listed) == 151
