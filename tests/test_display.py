"""How boards and pin metadata show in a terminal (`repr`) and a notebook (`_repr_html_`): what they
tell, that hostile values are escaped, that a failing board is shown rather than raised, and that a
board of ImageNet-21k size reads only the metadata of the pins it shows."""

from __future__ import annotations

import contextlib
import html
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from pinstorm import boards
from pinstorm.boards import display, index
from pinstorm.boards.metadata import PinMetadata

HOSTILE = "<script>alert('x')</script> & \"quotes\"\x1b[2J\nfake: line"

# data.txt files opened while `_recording` holds a list (an audit hook cannot be removed, so it stays
# installed for the session and does nothing between recordings)
_recording: list[list[str]] = []


def _audit(event: str, args: tuple) -> None:
    if _recording and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.endswith("data.txt"):
            _recording[-1].append(path)


sys.addaudithook(_audit)


def _opened_during(show) -> tuple[str, list[str]]:
    _recording.append([])
    try:
        return show(), _recording[-1]
    finally:
        _recording.pop()


@contextlib.contextmanager
def _closed_port():
    """A port bound here but never listened on: connecting to it is refused, and no other process can
    take it while the test runs (a port merely found free could be)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_a_local_board_shows_what_it_is_and_its_pins(tmp_path):
    board = boards.board_folder(tmp_path / "board", name="nb", cache=tmp_path / "cache")
    board.pin_write({"a": 1}, "alpha", type="json")
    board.pin_write({"a": 2}, "alpha", type="json")
    board.pin_upload([str(_file(tmp_path, "blob.bin", 2500))], "blob")
    text = repr(board)
    assert text.splitlines()[0] == "<Board 'nb' (folder, read-write)>"
    assert f"location: {tmp_path / 'board'}" in text and f"cache:    {tmp_path / 'cache'}" in text
    assert "pins:     2\n" in text and "more" not in text
    rows = {line.split()[0]: line.split() for line in text.splitlines()[-2:]}
    assert rows["alpha"][1] == board.list_versions("alpha")[-1] and rows["alpha"][2] == "2"
    assert rows["blob"][2:5] == ["1", "2.5", "kB"] and rows["blob"][-1] == "UTC"
    page = board._repr_html_()
    assert page.startswith("<div><table>") and "<script" not in page and "<link" not in page
    assert "<td style='text-align:left'>alpha</td>" in page and "read-write" in page


def _file(folder: Path, name: str, size: int) -> Path:
    path = folder / name
    path.write_bytes(b"x" * size)
    return path


def test_an_empty_temporary_board_shows_no_table():
    board = boards.board_temp(name="scratch")
    text = repr(board)
    assert text.splitlines()[0] == "<Board 'scratch' (folder, read-write)>" and "pins:     0" in text
    assert "latest version" not in text and "latest version" not in board._repr_html_()


def test_a_datatxt_board_over_http_shows_twenty_pins_and_how_many_more_without_its_secrets(http_board):
    source, folder, url = http_board
    with source.batch():
        for i in range(23):
            source.pin({"i": i}, f"cat{i:02d}", description=f"category {i}")
    port = url.rsplit(":", 1)[1]
    web = boards.board_datatxt(f"http://reader:hunter2pw@127.0.0.1:{port}/?token=tok-s3cret", name="web")
    assert web.pin_get("cat05") == {"i": 5}  # the credentials are accepted and the board works
    text = repr(web)
    assert text.splitlines()[0] == "<Board 'web' (datatxt, read-only)>"
    assert "pins:     23 (first 20 shown)" in text and text.endswith("  ... and 3 more")
    assert [line.split()[0] for line in text.splitlines() if line.startswith("  cat")] == \
        [f"cat{i:02d}" for i in range(20)]
    page = web._repr_html_()
    assert "... and 3 more" in page and page.count("<tr><td") == 20
    for shown in (text, page):
        assert "hunter2pw" not in shown and "tok-s3cret" not in shown
        assert f"127.0.0.1:{port}" in shown


def test_a_board_that_cannot_be_listed_shows_why_in_one_line():
    with _closed_port() as port:  # nothing listens there: the board is offline
        board = boards.board_datatxt(f"http://me:pa55word@127.0.0.1:{port}/?token=tok-s3cret", name="gone")
        text = repr(board)
        pins = [line for line in text.splitlines() if line.startswith("  pins:")]
        assert len(pins) == 1 and pins[0].startswith("  pins:     not listed (DownloadError: ")
        page = board._repr_html_()
    assert "not listed (DownloadError: " in page
    for shown in (text, page):
        assert "pa55word" not in shown and "tok-s3cret" not in shown


def test_one_unreadable_pin_is_shown_as_such_and_hides_nothing(tmp_path):
    board = boards.board_folder(tmp_path / "board", name="nb")
    board.pin_write({"a": 1}, "alpha", type="json")
    board.pin_write({"b": 2}, "beta", type="json")
    version = board.list_versions("alpha")[-1]
    (tmp_path / "board" / "alpha" / version / "data.txt").write_text("file: [unclosed\n")
    text = repr(board)
    alpha = next(line for line in text.splitlines() if line.startswith("  alpha"))
    assert alpha.split()[1] == "MalformedMetadata:" and len(alpha) < 200
    beta = next(line for line in text.splitlines() if line.startswith("  beta"))
    assert beta.split()[1] == board.list_versions("beta")[-1]


def test_a_version_named_by_a_hostile_index_is_checked_before_anything_is_read(tmp_path):
    board = boards.board_folder(tmp_path / "board", name="nb")
    board.pin_write({"a": 1}, "alpha", type="json")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "data.txt").write_text("file: x.json\nfile_size: 1\npin_hash: ab\ntype: json\n")
    entries = [{**e, "versions": ["../../outside"]} for e in board.list_entries()]
    (tmp_path / "board" / "data.txt").write_text(index.dump_index(entries))
    text, opened = _opened_during(lambda: repr(board))
    alpha = next(line for line in text.splitlines() if line.startswith("  alpha"))
    assert alpha.split()[1] == "UnsafePath:" and not any("outside" in p for p in opened)


def test_hostile_metadata_is_escaped_in_html_and_in_text(tmp_path):
    board = boards.board_folder(tmp_path / "board", name="nb")
    meta = board.pin_write({"a": 1}, "evil", type="json", title=HOSTILE, description=HOSTILE,
                           metadata={"<img src=x onerror=alert(1)>": HOSTILE, "n": 3})
    page = meta._repr_html_()
    assert "<script" not in page and "<img" not in page and "\x1b" not in page
    assert html.escape(HOSTILE.split("\x1b")[0]) in page
    text = repr(meta)
    assert "\x1b" not in text and "fake: line" in text
    assert not any(line.startswith("fake:") for line in text.splitlines())  # no line forged by the title
    assert "\\x1b[2J\\nfake: line" in text


@pytest.mark.parametrize("raw, shown", [
    ("\x1b[31m", "\\x1b[31m"), ("\x1b]8;;http://evil\x1b\\", "\\x1b]8;;http://evil\\x1b\\"), ("a\rb", "a\\rb"),
    ("a\nb", "a\\nb"), ("\x07\x00\x7f", "\\x07\\x00\\x7f"), ("\x9b2J", "\\x9b2J"), ("\x85", "\\x85"),
    ("x\u202eexe", "x\\u202eexe"), ("\u2066\u2069\u200b\ufeff", "\\u2066\\u2069\\u200b\\ufeff"),
    ("\u2028\u2029", "\\u2028\\u2029"), ("\ud800", "\\ud800"), ("\U000e0041", "\\U000e0041"),
    ("tench é … 犬", "tench é … 犬"),
])
def test_one_escaping_rule_leaves_only_printable_text(raw, shown):
    assert display.escape(raw) == shown and display.clean(raw) == shown
    assert display.escape(raw).isprintable()
    if "\n" not in raw:  # escape_lines keeps the line breaks of text pinstorm lays out itself
        assert display.escape_lines(f"{raw}\n{raw}") == f"{shown}\n{shown}"


def test_metadata_shows_size_files_user_fields_and_version(tmp_path):
    board = boards.board_folder(tmp_path / "board", name="nb")
    files = [str(_file(tmp_path, f"part{i}.bin", 1000)) for i in range(7)]
    meta = board.pin_upload(files, "parts", title="seven parts", description="split",
                            metadata={f"k{i}": i for i in range(6)})
    text = repr(meta)
    assert text.splitlines()[0] == f"<PinMetadata 'parts' version {meta['version']}>"
    shown = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in text.splitlines()[1:]}
    assert shown["title"] == "seven parts" and shown["description"] == "split" and shown["board"] == "nb"
    assert shown["size"] == "7 files, 7.0 kB" and shown["hash"] == meta["pin_hash"]
    assert shown["files"] == "part0.bin, part1.bin, part2.bin, part3.bin, part4.bin ... and 2 more"
    assert shown["user"] == "6 fields: k0=0, k1=1, k2=2, k3=3, k4=4 ... and 1 more"
    assert shown["created"].endswith(" UTC") and shown["created"][:4] == meta["created"][:4]
    assert "<th style='text-align:left'>size</th><td style='text-align:left'>7 files, 7.0 kB</td>" \
        in meta._repr_html_()


def test_metadata_missing_fields_still_shows():
    empty = PinMetadata()
    assert repr(empty) == "<PinMetadata '' version >\n  size:        0 files, 0 B"
    assert empty._repr_html_().startswith("<table>")


def _imagenet_sized_board(root: Path, count: int) -> tuple[str, list[str]]:
    """A board of `count` one-version pins as pinstorm writes them: one real pin's data.txt copied
    (its file is left out: showing a board never opens pin files) and a root index listing every pin."""
    board = boards.board_folder(root, name="seed")
    board.pin_write({"seed": True}, "seed", type="json")
    version = board.list_versions("seed")[-1]
    seed_entry = board.list_entries()[0]
    data_txt = (root / "seed" / version / "data.txt").read_bytes()
    names = [f"n{i:08d}" for i in range(count)]
    entries = []
    for name in names:
        folder = root / name / version
        folder.mkdir(parents=True)
        (folder / "data.txt").write_bytes(data_txt)
        entries.append({**seed_entry, "name": name, "path": f"{name}/{version}/"})
    shutil.rmtree(root / "seed")
    (root / "data.txt").write_text(index.dump_index(entries))
    return version, names


def test_a_board_of_21841_pins_reads_only_the_metadata_it_shows(tmp_path):
    version, names = _imagenet_sized_board(tmp_path / "big", 21841)
    board = boards.board_folder(tmp_path / "big", name="imagenet21k")
    text, opened = _opened_during(lambda: repr(board))
    assert "pins:     21841 (first 20 shown)" in text and text.endswith("  ... and 21821 more")
    version_files = sorted(p for p in opened if p != str(tmp_path / "big" / "data.txt"))
    assert version_files == [str(tmp_path / "big" / n / version / "data.txt") for n in names[:20]]
    page, opened = _opened_during(board._repr_html_)  # again: what was parsed may be reused, never more read
    assert page.count("<tr><td") == 20 and set(opened) <= {str(tmp_path / "big" / "data.txt"), *version_files}


@pytest.mark.parametrize("count, shown", [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1_536_000, "1.5 MB"),
                                          (3.2e12, "3.2 TB"), (5e15, "5.0 PB")])
def test_sizes_read_as_people_read_them(count, shown):
    assert display.human_size(count) == shown
