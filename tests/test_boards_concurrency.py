"""Many processes at once: no version or index entry lost, one download per pin."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import textwrap
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
