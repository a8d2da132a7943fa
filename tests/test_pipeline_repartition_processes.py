"""`repartition` into a local folder shares the categories among worker processes (issue 36: zipping and
hashing hold the GIL, so threads were slower than one): the pins are the same bytes as one process
writes, every pin is listed, an error comes back with its own type, and a killed worker is named and
leaves nothing a repair does not clean."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml

from pinstorm import boards
from pinstorm.boards.tempnames import is_temporary
from pinstorm.pipeline import repartition, scan
from pinstorm.pipeline.repartition import (CATEGORIES_PIN, PROCESS_MIN_IMAGES, RepartitionWorkerDied,
                                           default_parallel)

pytest_plugins = ["conftest_pipeline"]


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if is_temporary(p.name)]


def _indexed(folder: Path) -> set[str]:
    """The pins the board's own data.txt index lists (what R and pins-python read), as written."""
    return {e["name"] for e in yaml.safe_load((folder / "data.txt").read_text())}


def _stored(board, names) -> dict[str, tuple[str, list[str]]]:
    """{pin: (pin_hash, files)} of each pin's newest version."""
    return {n: (m.pin_hash, list(m.file)) for n in names for m in [board.pin_meta(n)]}


def test_processes_store_the_same_pins_as_one_process(tmp_path, digits_root, digits_layout):
    one = boards.board_folder(tmp_path / "one", cache=tmp_path / "cache-one", name="one")
    many = boards.board_folder(tmp_path / "many", cache=tmp_path / "cache-many", name="many")
    expected = repartition(digits_root, one, parallel=1, progress=False)
    got = repartition(digits_root, many, parallel=3, progress=False)
    assert got.equals(expected)
    # same zips, byte for byte (the version names differ only by their time)
    assert _stored(many, digits_layout.classes) == _stored(one, digits_layout.classes)
    # every worker's batch is indexed: the data.txt lists every category, read as a new reader would
    fresh = boards.board_folder(tmp_path / "many", cache=tmp_path / "cache-fresh", name="fresh")
    assert set(fresh.pin_find("")["name"]) == {CATEGORIES_PIN, *digits_layout.classes}
    # the workers handed their pins to the parent's batch, which indexed them all in one update
    assert _indexed(tmp_path / "many") == {CATEGORIES_PIN, *digits_layout.classes}
    assert not _temporaries(tmp_path / "many")
    wnid = digits_layout.classes[1]
    source = {Path(p).name: Path(p).read_bytes() for p, w in digits_layout.train if w == wnid}
    assert {Path(p).name: Path(p).read_bytes() for p in fresh.pin_get(wnid, extract=True)} == source


def test_the_progress_bar_counts_every_category_the_workers_pinned(tmp_path, digits_root, digits_layout, monkeypatch):
    import contextlib
    import importlib

    module = importlib.import_module("pinstorm.pipeline.repartition")   # the package's name is the function
    counted = []

    @contextlib.contextmanager
    def bar(label, total, unit, enabled):
        counted.append(0)
        yield lambda n: counted.__setitem__(-1, counted[-1] + n)

    monkeypatch.setattr(module, "progress_bar", bar)
    monkeypatch.setattr(module, "PROGRESS_EVERY", 0.0)   # a report a category, as for a slow one
    repartition(digits_root, boards.board_folder(tmp_path / "a", name="a"), parallel=2, progress=False)
    monkeypatch.setattr(module, "PROGRESS_EVERY", 3600.0)   # one report a worker, at its end
    repartition(digits_root, boards.board_folder(tmp_path / "b", name="b"), parallel=2, progress=False)
    assert counted == [len(digits_layout.classes)] * 2


def test_a_worker_error_comes_back_with_its_type_and_what_was_stored_is_listed(tmp_path, digits_root):
    tree = shutil.copytree(digits_root, tmp_path / "tree")
    layout = scan(tree)
    lost = sorted(p for p, w in layout.train if w == layout.classes[4])[0]
    os.unlink(lost)   # scanned, then gone: the worker pinning that category fails
    board = boards.board_folder(tmp_path / "board", cache=tmp_path / "cache", name="err")
    with pytest.raises(FileNotFoundError, match="no such file"):
        repartition(layout, board, parallel=2, progress=False)
    listed = set(boards.board_folder(tmp_path / "board", cache=tmp_path / "c2", name="r").pin_find("")["name"])
    on_disk = {p.parent.parent.name for p in (tmp_path / "board").glob("*/*/data.txt")}
    assert listed == on_disk and layout.classes[4] not in listed and CATEGORIES_PIN not in listed
    assert _indexed(tmp_path / "board") == on_disk   # indexed as the batch closed on the error
    assert not _temporaries(tmp_path / "board")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_killed_worker_is_named_and_a_repair_lists_what_it_stored(tmp_path, digits_root, digits_layout):
    tree = shutil.copytree(digits_root, tmp_path / "tree")
    stuck = digits_layout.classes[-1]
    folder = tree / Path(next(p for p, w in digits_layout.train if w == stuck)).parent.relative_to(digits_root)
    os.mkfifo(folder / f"{stuck}_stuck.JPEG")   # reading it waits for a writer that never comes
    board = boards.board_folder(tmp_path / "board", cache=tmp_path / "cache", name="killed")
    outcome: dict = {}

    def run() -> None:
        try:
            repartition(tree, board, parallel=2, progress=False)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = e

    before = set(multiprocessing.active_children())
    runner = threading.Thread(target=run)
    runner.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:   # the other worker pins the rest and ends; one stays, stuck
            workers = [p for p in multiprocessing.active_children() if p not in before]
            pinned = {p.parent.parent.name for p in (tmp_path / "board").glob("*/*/data.txt")}
            if len(workers) == 1 and pinned >= set(digits_layout.classes) - {stuck}:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the workers never reached the stuck category")
        os.kill(workers[0].pid, signal.SIGKILL)
        runner.join(60)
    finally:
        for p in multiprocessing.active_children():
            if p not in before:
                p.kill()
    assert not runner.is_alive()
    assert isinstance(outcome.get("error"), RepartitionWorkerDied)
    assert "exit code -9" in str(outcome["error"]) and "board repair" in str(outcome["error"])
    board.rebuild_index()   # `pinstorm board repair`: lists the pins, removes what the killed worker left
    assert not _temporaries(tmp_path / "board")
    fresh = boards.board_folder(tmp_path / "board", cache=tmp_path / "c2", name="fresh")
    assert set(fresh.pin_find("")["name"]) == set(digits_layout.classes) - {stuck}


def test_one_process_below_the_measured_size(tmp_path):
    board = boards.board_folder(tmp_path / "b", name="small")
    assert default_parallel(board, images=PROCESS_MIN_IMAGES - 1) == 1
    assert default_parallel(board, images=PROCESS_MIN_IMAGES) >= 1
