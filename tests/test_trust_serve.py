"""serve_board as an attacker meets it (issue 17, case 8): only regular files inside its folder, correct
answers on one keep-alive connection, idle connections timed out, connections bounded.

Every request goes over a real socket to a real server on 127.0.0.1; clients carry a timeout, so a
server that blocks (a FIFO) or miscounts a body (keep-alive) fails the test instead of hanging it.
"""

from __future__ import annotations

import http.client
import os
import socket
import stat
import threading
import time

import pytest

from pinstorm import boards
from pinstorm.boards import serve

CLIENT_TIMEOUT = 20


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _get(port: int, path: str, method: str = "GET", headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _handler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "process_request" in t.name]


def _wait_no_handler_threads(deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while _handler_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _handler_threads(), f"{len(_handler_threads())} connection thread(s) still open"


@pytest.fixture
def shared(tmp_path):
    """A served folder next to a private one, with links out, a FIFO and links that stay inside."""
    folder, private = tmp_path / "served", tmp_path / "private"
    (folder / "sub").mkdir(parents=True)
    private.mkdir()
    (private / "secret.txt").write_text("the victim's secret")
    (folder / "a.txt").write_text("public")
    (folder / "sub" / "b.txt").write_text("inner")
    (folder / "leak.txt").symlink_to(private / "secret.txt")
    (folder / "leak-relative.txt").symlink_to("../private/secret.txt")
    (folder / "leakdir").symlink_to(private)
    (folder / "zero").symlink_to("/dev/zero")
    (folder / "inside.txt").symlink_to("sub/b.txt")
    (folder / "subdir-link").symlink_to("sub")
    os.mkfifo(folder / "fifo")
    return folder


def test_serves_regular_files_inside_its_folder_only(shared):
    with boards.serve_board(shared) as url:
        port = _port(url)
        assert _get(port, "/a.txt") == (200, b"public")
        assert _get(port, "/inside.txt") == (200, b"inner")  # a link that stays inside: resolved and served
        assert _get(port, "/subdir-link/b.txt") == (200, b"inner")
        for path in ["/leak.txt", "/leak-relative.txt", "/leakdir/secret.txt", "/leakdir/", "/zero",
                     "/../private/secret.txt", "/%2e%2e/private/secret.txt", "/sub/..%2f..%2fprivate/secret.txt"]:
            for method in ("GET", "HEAD"):
                status, body = _get(port, path, method)
                assert status == 404 and b"secret" not in body and len(body) < 4096, (method, path, status)
        for method in ("GET", "HEAD"):  # a FIFO would block the thread forever; a client timeout fails this
            status, body = _get(port, "/fifo", method)
            assert status == 403, (method, status)
        status, listing = _get(port, "/")
        assert status == 200
        for shown in (b'"a.txt"', b'"sub/"', b'"inside.txt"', b'"subdir-link/"'):
            assert shown in listing, shown
        for hidden in (b"leak", b"zero", b"fifo"):  # what is not served is not listed either
            assert hidden not in listing, hidden
        _wait_no_handler_threads()  # and no thread is left stuck on the FIFO


def test_a_device_inside_the_folder_is_refused(tmp_path):
    folder = tmp_path / "served"
    folder.mkdir()
    try:
        os.mknod(folder / "zero", stat.S_IFCHR | 0o644, os.makedev(1, 5))  # what /dev/zero is
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    with boards.serve_board(folder) as url:
        status, body = _get(_port(url), "/zero")
        assert status == 403 and len(body) < 4096
        assert b"zero" not in _get(_port(url), "/")[1]


@pytest.mark.parametrize("swap_after", ["resolve", "lstat"])
def test_a_link_swapped_in_after_the_checks_is_not_followed(shared, tmp_path, monkeypatch, swap_after):
    """The attacker wins the race every time: the file becomes a link out right after a check of it."""
    swapped = []

    def swap():
        if not swapped:
            os.replace(shared / "race.txt", tmp_path / "moved.txt")
            (shared / "race.txt").symlink_to(tmp_path / "private" / "secret.txt")
            swapped.append(swap_after)

    real_realpath, real_stat = os.path.realpath, os.stat

    def realpath_then_swap(path, *args, **kwargs):
        resolved = real_realpath(path, *args, **kwargs)
        if str(path).endswith("/race.txt"):
            swap()
        return resolved

    def lstat_then_swap(path, *args, **kwargs):
        found = real_stat(path, *args, **kwargs)
        if path == "race.txt" and kwargs.get("follow_symlinks") is False:
            swap()
        return found

    (shared / "race.txt").write_text("harmless")
    with boards.serve_board(shared) as url:
        if swap_after == "resolve":
            monkeypatch.setattr(serve.os.path, "realpath", realpath_then_swap)
        else:
            monkeypatch.setattr(serve.os, "stat", lstat_then_swap)
        try:
            status, body = _get(_port(url), "/race.txt")
        finally:
            monkeypatch.undo()
    assert swapped == [swap_after]
    assert status in (403, 404) and b"secret" not in body, status
    if swap_after == "lstat":  # only O_NOFOLLOW on the open itself stops this one
        assert status == 404


def test_one_keep_alive_connection_gets_every_answer_right(tmp_path):
    folder = tmp_path / "served"
    (folder / "sub").mkdir(parents=True)
    data = bytes(range(256)) * 40  # 10,240 bytes: longer than the listing, so a stale length shows
    (folder / "big.bin").write_bytes(data)
    (folder / "sub" / "small.txt").write_text("xy")
    with boards.serve_board(folder) as url:
        conn = http.client.HTTPConnection("127.0.0.1", _port(url), timeout=CLIENT_TIMEOUT)
        conn.connect()
        sock = conn.sock

        def ask(method, path, **headers):
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()

        status, headers, body = ask("GET", "/big.bin")
        assert (status, body) == (200, data) and headers["Content-Length"] == str(len(data))
        etag = headers["ETag"]
        for _ in range(2):  # listing after a file: its own length, complete
            status, headers, body = ask("GET", "/")
            assert status == 200 and int(headers["Content-Length"]) == len(body) and body.endswith(b"</html>\n")
            assert b'"big.bin"' in body and b'"sub/"' in body
        status, headers, body = ask("HEAD", "/big.bin")
        assert status == 200 and headers["Content-Length"] == str(len(data)) and body == b""
        status, headers, body = ask("HEAD", "/sub/")
        listing_length = int(headers["Content-Length"])
        assert status == 200 and body == b""
        status, headers, body = ask("GET", "/sub/")
        assert len(body) == listing_length and b'"small.txt"' in body
        status, headers, body = ask("GET", "/big.bin", Range="bytes=10-19")
        assert (status, body, headers["Content-Range"]) == (206, data[10:20], f"bytes 10-19/{len(data)}")
        status, headers, body = ask("GET", "/big.bin", Range="bytes=-5")
        assert (status, body) == (206, data[-5:])
        status, headers, body = ask("GET", "/big.bin", Range=f"bytes={len(data) - 3}-")
        assert (status, body) == (206, data[-3:])
        status, headers, body = ask("GET", "/big.bin", Range=f"bytes=0-{10 * len(data)}")
        assert (status, body) == (206, data)
        status, headers, body = ask("GET", "/big.bin", Range=f"bytes={len(data)}-")
        assert (status, body, headers["Content-Range"]) == (416, b"", f"bytes */{len(data)}")
        status, headers, body = ask("GET", "/big.bin", **{"If-None-Match": etag})
        assert (status, body) == (304, b"")
        status, headers, body = ask("GET", "/missing")
        assert status == 404 and int(headers["Content-Length"]) == len(body)
        status, headers, body = ask("GET", "/sub")
        assert status == 301 and headers["Location"] == "/sub/" and body == b""
        status, headers, body = ask("GET", "/sub/small.txt")
        assert (status, body) == (200, b"xy")
        assert conn.sock is sock, "the server closed the keep-alive connection"
        conn.close()


def test_pipelined_requests_on_a_raw_socket(tmp_path):
    """Two requests sent at once: the listing that follows a file is framed by its own length."""
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "f.bin").write_bytes(b"z" * 5000)
    with boards.serve_board(folder) as url, socket.create_connection(("127.0.0.1", _port(url))) as s:
        s.settimeout(CLIENT_TIMEOUT)
        s.sendall(b"GET /f.bin HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"HEAD /f.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    rest = raw
    bodies = []
    for expect_body in (True, True, False):
        head, _, rest = rest.partition(b"\r\n\r\n")
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        body_length = length if expect_body else 0
        bodies.append((head.split(b"\r\n")[0], length, rest[:body_length]))
        rest = rest[body_length:]
    assert rest == b""
    assert bodies[0] == (b"HTTP/1.1 200 OK", 5000, b"z" * 5000)
    assert bodies[1][0] == b"HTTP/1.1 200 OK" and bodies[1][2].endswith(b"</html>\n") and len(bodies[1][2]) == \
        bodies[1][1] != 5000
    assert bodies[2][:2] == (b"HTTP/1.1 200 OK", 5000)


def test_idle_connections_are_timed_out(tmp_path):
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "a.txt").write_text("public")
    with boards.serve_board(folder, idle_timeout=0.5) as url:
        port = _port(url)
        talked = socket.create_connection(("127.0.0.1", port))
        talked.sendall(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")  # one request, then silence
        clients = [talked] + [socket.create_connection(("127.0.0.1", port)) for _ in range(199)]
        try:
            for s in clients:
                s.settimeout(CLIENT_TIMEOUT)  # a server that never hangs up fails here, not hangs
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
                if s is talked:
                    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"public"), answer
                else:  # closed unanswered after the idle timeout, or refused beyond the connection limit
                    assert answer == b"" or answer.startswith(b"HTTP/1.1 503"), answer[:100]
        finally:
            for s in clients:
                s.close()
        _wait_no_handler_threads()
        assert _get(port, "/a.txt") == (200, b"public")  # and it still serves


def test_connections_beyond_the_limit_get_503_until_one_closes(tmp_path):
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "a.txt").write_text("public")
    with boards.serve_board(folder, max_connections=4) as url:
        port = _port(url)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            for s in held:  # each is being served (a request answered) before the next opens
                s.settimeout(CLIENT_TIMEOUT)
                s.sendall(b"HEAD /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(4096).startswith(b"HTTP/1.1 200")
            status, _ = _get(port, "/a.txt")
            assert status == 503
        finally:
            held.pop().close()
        deadline = time.monotonic() + 60  # the freed slot is seen once its thread ends
        while (status := _get(port, "/a.txt")[0]) == 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == 200
        for s in held:
            s.close()
