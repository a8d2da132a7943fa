"""serve_board: a client that hangs up mid-transfer is normal traffic, not a traceback."""

from __future__ import annotations

import errno
import socket
import struct
import threading
import time

from pinstorm import boards


def _handler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "process_request" in t.name]


def test_clients_dropping_mid_transfer_print_no_traceback(tmp_path, capfd):
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "big.bin").write_bytes(b"x" * (8 << 20))
    with boards.serve_board(folder) as url:
        port = int(url.rsplit(":", 1)[1])
        for reset in (True, False):  # an abortive close (RST) and an orderly one
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            if reset:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        deadline = time.monotonic() + 30
        while _handler_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _handler_threads(), "the server kept writing to clients that were gone"
        # and it still serves
        import requests

        assert requests.get(f"{url}/big.bin", headers={"Range": "bytes=0-9"}, timeout=30).content == b"x" * 10
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err and "BrokenPipe" not in err, err


def test_the_serve_command_sets_max_age_and_its_limits(tmp_path):
    """`pinstorm board serve --max-age 60`: readers may keep data.txt a minute (docs/cloud.md's advice)."""
    import re
    import shutil
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path as _Path

    (tmp_path / "data.txt").write_text("[]\n")
    script = shutil.which("pinstorm", path=str(_Path(sys.executable).parent))
    server = subprocess.Popen([script, "board", "serve", str(tmp_path), "--port", "0", "--max-age", "60",
                               "--max-connections", "8", "--header-timeout", "5"], stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"at (http://\S+)", server.stdout.readline()).group(1)
        with urllib.request.urlopen(f"{url}/data.txt", timeout=30) as response:
            assert response.headers["Cache-Control"] == "max-age=60" and response.read() == b"[]\n"
    finally:
        server.terminate()
        server.wait(30)


def test_a_port_another_process_holds_is_named_in_one_line(tmp_path):
    """`pinstorm board serve --port P` where P is taken: one line naming the address and the way out."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path as _Path

    import pytest

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(boards.AddressInUse, match=f"127.0.0.1:{port}: another process holds that port") as caught:
            with boards.serve_board(tmp_path, port=port):
                pass
        assert isinstance(caught.value, OSError) and caught.value.errno == errno.EADDRINUSE   # caught as before
        script = shutil.which("pinstorm", path=str(_Path(sys.executable).parent))
        done = subprocess.run([script, "board", "serve", str(tmp_path), "--port", str(port)], capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "or 0 for any free one" in done.stderr
    assert "Errno" not in done.stderr and "Traceback" not in done.stderr
