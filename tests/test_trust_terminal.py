"""What a board says reaches a terminal only as text (issue 31, item 4): pin names, descriptions,
titles, index fields and file names carrying ESC sequences, OSC 8 hyperlinks, CR, newlines, C1
controls (CSI) and bidi overrides are printed escaped, one item per line, by the installed `pinstorm`
console script running in a real pseudo-terminal against a real data.txt board on 127.0.0.1.

A pseudo-terminal, not a pipe: on a pipe click strips ANSI sequences itself, so only a terminal shows
what a user's terminal would receive."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pinstorm import boards
from pinstorm.boards import display, index

termios = pytest.importorskip("termios")  # pseudo-terminals: POSIX only

# Each is a way remote text could drive a terminal or fake its lines.
HOSTILE = {
    "sgr": "red\x1b[31mALERT\x1b[0m",
    "osc8": "\x1b]8;;http://evil.example/\x1b\\click me\x1b]8;;\x1b\\",
    "cr": "innocent\rOVERWRITTEN",
    "nl": "first\nfake line",
    "csi": "c1\x9b2Jcleared",
    "bidi": "report\u202eexe.txt\u2066x\u2069",
}
# Bytes that must never come out of pinstorm from remote text (the UTF-8 of C1 CSI and of the bidi
# controls included); the terminal is set to send "\n" as is, so every CR read here is pinstorm's.
FORBIDDEN = [b"\x1b", b"\r", b"\x07", b"\xc2\x9b", b"\xe2\x80\xae", b"\xe2\x81\xa6", b"\xe2\x81\xa9"]


def _exe() -> str:
    return shutil.which("pinstorm", path=str(Path(sys.executable).parent)) or "pinstorm"


def _in_terminal(*args: str, env: dict) -> tuple[int, bytes]:
    """Run `pinstorm args` with stdin, stdout and stderr on a fresh pseudo-terminal; (exit code, bytes)."""
    import pty

    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # no "\n" -> "\r\n": a CR read back was written by pinstorm
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    proc = subprocess.Popen([_exe(), *args], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:  # EIO: every writer of the terminal is gone
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, bytes(out)


def _assert_inert(out: bytes) -> str:
    for raw in FORBIDDEN:
        assert raw not in out, f"{raw!r} reached the terminal: {out!r}"
    text = out.decode("utf-8")
    assert all(c.isprintable() or c == "\n" for c in text), repr(text)
    return text


@pytest.fixture
def hostile_board(tmp_path):
    """A data.txt board on 127.0.0.1 whose pin names, descriptions, titles, an index field (name and
    value) and file names are hostile, registered as `web` for the console script: (env, file names)."""
    folder = tmp_path / "served"
    src = boards.board_folder(folder, name="src", cache=tmp_path / "src-cache")
    files = tmp_path / "files"
    files.mkdir()
    names = []
    for key, text in HOSTILE.items():
        name = f"{key}-{text}".replace("/", "_").replace("\x1b\\", "\x07")  # OSC 8 ended by BEL: no '\\'
        (files / name).write_bytes(key.encode())
        names.append(name)
    src.pin_upload([str(files / n) for n in names], "evilfiles", description=HOSTILE["osc8"],
                   title=HOSTILE["bidi"])
    src.pin_upload([str(files / names[0])], "gone")  # its file then vanishes: a 404 naming the file's URL
    for lost in folder.glob(f"gone/*/{names[0]}"):
        lost.unlink()
    entries = index.parse_index((folder / "data.txt").read_text())
    template = entries[0]
    for key, text in HOSTILE.items():  # names no writer of pinstorm accepts, but a board may list
        entries.append({**template, "name": f"{key}:{text}", "description": text, "title": text})
    entries[0][f"field\x1b[8m{HOSTILE['cr']}"] = HOSTILE["nl"]  # an index field shown by find --extended
    (folder / "data.txt").write_text(index.dump_index(entries))
    env = dict(os.environ)
    env.update(PINSTORM_CONFIG=str(tmp_path / "cfg.yaml"), PINSTORM_BOARD=str(tmp_path / "board"),
               PINSTORM_CACHE=str(tmp_path / "cache"), PINSTORM_PROGRESS="0", COLUMNS="200")
    with boards.serve_board(folder) as url:
        r = subprocess.run([_exe(), "board", "register", url, "--name", "web"], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        yield env, names


def test_find_list_and_get_print_remote_text_escaped_one_item_per_line(hostile_board):
    env, files = hostile_board
    pins = sorted(["evilfiles", "gone", *(f"{k}:{t}" for k, t in HOSTILE.items())])

    code, out = _in_terminal("list", "--board", "web", env=env)
    assert code == 0, out
    assert _assert_inert(out).splitlines() == [display.escape(p) for p in pins]

    code, out = _in_terminal("find", env=env)  # every board, the hostile one included
    text = _assert_inert(out)
    assert code == 0, out
    rows = text.splitlines()
    assert len(rows) == 1 + len(pins)  # the header, then one line per pin
    for key, value in HOSTILE.items():
        assert sum(display.escape(f"{key}:{value}") in row for row in rows) == 1

    code, out = _in_terminal("find", "--extended", "--board", "web", env=env)
    text = _assert_inert(out)
    assert code == 0, out
    assert len(text.splitlines()) == 1 + len(pins)
    assert display.escape(f"field\x1b[8m{HOSTILE['cr']}") in text.splitlines()[0]  # a remote column name

    code, out = _in_terminal("get", "evilfiles", env=env)  # board-less: found on `web`
    text = _assert_inert(out)
    assert code == 0, out
    lines = text.splitlines()
    assert len(lines) == len(files)  # a file name with a newline is still one path
    assert sorted(Path(line).name for line in lines) == sorted(display.escape(n) for n in files)
    assert all(line.startswith(env["PINSTORM_CACHE"]) for line in lines)


def test_json_output_is_ascii_and_reads_back_as_the_remote_text(hostile_board):
    env, files = hostile_board
    code, out = _in_terminal("find", "--json", "--board", "web", env=env)
    assert code == 0, out
    _assert_inert(out)
    assert out.isascii()
    found = {row["name"]: row for row in json.loads(out)}
    for key, value in HOSTILE.items():
        assert found[f"{key}:{value}"]["description"] == value  # escaped for the terminal, intact for jq
    code, out = _in_terminal("list", "--json", "--board", "web", env=env)
    assert code == 0 and out.isascii() and f"nl:{HOSTILE['nl']}" in json.loads(out)
    code, out = _in_terminal("info", "evilfiles", "--board", "web", env=env)
    assert code == 0 and out.isascii()
    assert sorted(json.loads(out)["file"]) == sorted(files)


def test_errors_and_warnings_quoting_remote_text_are_escaped(hostile_board, tmp_path):
    env, _ = hostile_board
    code, out = _in_terminal("get", f"cr:{HOSTILE['cr']}", "--board", "web", env=env)  # quoted in the error
    text = _assert_inert(out)
    assert code == 1 and len(text.strip().splitlines()) == 1 and "InvalidPinName" in text
    code, out = _in_terminal("get", "gone", "--board", "web", env=env)  # the error quotes the file's URL
    text = _assert_inert(out)
    assert code == 1 and len(text.strip().splitlines()) == 1 and "404" in text
    assert display.escape(HOSTILE["sgr"]) in text
    # a board whose index is not YAML: libyaml quotes the offending line in its message
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "data.txt").write_bytes(b"- path: x/\n  name: \x1b]8;;http://evil\x1b\\\\ok\n  : [\n")
    with boards.serve_board(bad) as url:
        r = subprocess.run([_exe(), "board", "register", url, "--name", "broken", "--no-check"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        code, out = _in_terminal("list", "--board", "broken", env=env)
        text = _assert_inert(out)
        assert code == 1 and len(text.strip().splitlines()) == 1 and f"{url}/data.txt" in text
        code, out = _in_terminal("find", env=env)  # the broken board is skipped with a warning, one line
        text = _assert_inert(out)
        assert code == 0 and "evilfiles" in text
        warning = [line for line in text.splitlines() if line.startswith("warning:")]
        assert len(warning) == 1 and "'broken'" in warning[0] and f"{url}/data.txt" in warning[0]
