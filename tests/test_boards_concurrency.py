"""Many processes at once: no version or index entry lost, one download per pin."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import textwrap
import time
from pathlib import Path
from http.server import ThreadingHTTPServer

import yaml

from pinstorm import boards
from pinstorm.boards.serve import RangeRequestHandler

WRITER = textwrap.dedent("""
    import sys
    from pinstorm import boards
    board = boards.board_register("local", name="shared", path=sys.argv[1])
    worker = int(sys.argv[2])
    for i in range(3):
        board.pin({"worker": worker, "i": i}, "common")          # versions of one pin
        board.pin({"worker": worker, "i": i}, f"own-{worker}-{i}")  # different pins
""")

READER = textwrap.dedent("""
    import sys
    from pinstorm import boards
    board = boards.board_register("datatxt", name="web", url=sys.argv[1], cache=sys.argv[2])
    print(len(board.pin_get("big")))
""")


def _run_all(args_list, timeout=240):
    procs = [subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for args in args_list]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_eight_processes_pin_to_one_board(tmp_path):
    root = tmp_path / "shared"
    _run_all([[WRITER, str(root), str(w)] for w in range(8)])
    board = boards.board_register("local", name="shared", path=root)
    # every write made a version: 8 workers x 3 distinct contents of "common"
    values = set()
    for v in board.pin_versions("common")["version"]:
        got = board.pin_get("common", version=v)
        values.add((got["worker"], got["i"]))
    assert values == {(w, i) for w in range(8) for i in range(3)}
    index = {e["name"]: e for e in yaml.safe_load((root / "data.txt").read_text())}
    assert set(index) == {"common"} | {f"own-{w}-{i}" for w in range(8) for i in range(3)}
    assert len(index["common"]["versions"]) == 24
    assert not [p for p in root.rglob("*") if ".tmp-" in p.name]


def test_many_processes_download_a_pin_once(tmp_path):
    folder = tmp_path / "served"
    src = tmp_path / "big"
    src.mkdir()
    for i in range(4):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 200_000)
    boards.board_register("local", name="src", path=folder).pin(src, "big", zip=True)
    hits: list[str] = []

    class Counting(RangeRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Counting, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        outs = _run_all([[READER, url, str(tmp_path / "cache")] for _ in range(8)])
    finally:
        server.shutdown()
        server.server_close()
    assert [o.strip() for o in outs] == ["4"] * 8
    zip_gets = [h for h in hits if h.endswith("big.zip")]
    assert len(zip_gets) == 1, zip_gets


# ---- no garbage: what a killed process leaves is removed by the next call ------------------------
KILLED_PIN = textwrap.dedent("""
    import shutil, sys, time
    from pinstorm import boards
    real = shutil.copyfile
    def pausing_copy(src, dst, *args, **kwargs):  # pause inside the board's temporary version folder
        out = real(src, dst, *args, **kwargs)
        if ".tmp-" in str(dst):
            open(sys.argv[3], "w").close()
            time.sleep(600)
        return out
    shutil.copyfile = pausing_copy
    boards.board_register("local", name="b", path=sys.argv[1]).pin(sys.argv[2], "big")
""")

KILLED_GET = textwrap.dedent("""
    import sys, time
    from pinstorm import boards
    from pinstorm.boards.backends.datatxt_board import DatatxtStorage
    real = DatatxtStorage.download_file
    def pausing_download(self, *args, **kwargs):  # pause after the first file landed in the cache's partial folder
        real(self, *args, **kwargs)
        open(sys.argv[3], "w").close()
        time.sleep(600)
    DatatxtStorage.download_file = pausing_download
    boards.board_register("datatxt", name="web", url=sys.argv[1], cache=sys.argv[2]).pin_get("big")
""")


def _kill_when_ready(script: str, *args: str, marker, env) -> None:
    p = subprocess.Popen([sys.executable, "-c", script, *args, str(marker)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert p.poll() is None, p.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the child never reached the pause"
            time.sleep(0.02)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait()  # reaped: its pid is gone, as after any crash


def _garbage(*folders) -> list:
    return [p for f in folders for p in f.rglob("*")
            if ".tmp-" in p.name or p.name.startswith("pinstorm-stage-") or p.name.endswith(".partial")]


def test_kill_9_mid_pin_and_mid_download_leaves_nothing_after_the_next_call(tmp_path, monkeypatch):
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    env = dict(os.environ)
    src = tmp_path / "big"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(os.urandom(300_000))
    root, cache = tmp_path / "board", tmp_path / "webcache"

    _kill_when_ready(KILLED_PIN, str(root), str(src), marker=tmp_path / "m1", env=env)
    left = _garbage(root, tmpdir)
    assert any(".tmp-" in p.name for p in left)  # the half-written version, inside the board's pin folder
    assert not any(p.name.startswith("pinstorm-stage-") for p in left)  # a local board stages on itself, not in TMPDIR
    board = boards.board_register("local", name="b", path=root)
    board.pin(src, "big")  # the retry succeeds and removes what the killed writer left
    assert _garbage(root, tmpdir) == []

    with boards.serve_board(root) as url:
        _kill_when_ready(KILLED_GET, url, str(cache), marker=tmp_path / "m2", env=env)
        assert any(p.name.endswith(".partial") for p in _garbage(cache))  # resumable, until the next call
        web = boards.board_register("datatxt", name="web", url=url, cache=cache)
        got = web.pin_get("big")
    assert sorted(Path(p).read_bytes() for p in got) == sorted(p.read_bytes() for p in src.iterdir())
    assert _garbage(cache, tmpdir) == []


def test_a_live_writers_temporaries_are_left_alone(tmp_path):
    from pinstorm.boards.tempnames import sweep, tmp_name

    folder = tmp_path / "pin"
    folder.mkdir()
    live = Path(tmp_name(folder / "20260101T000000Z-abcde"))  # this process: alive
    live.mkdir()
    dead = folder / "20260101T000000Z-abcde.tmp-999999999-otherhost-1a2b3c4d"  # another host, recent
    dead.mkdir()
    assert sweep(folder) == [] and live.exists() and dead.exists()
