"""serve_board as an attacker meets it (issue 17, case 8): only regular files inside its folder, correct
answers on one keep-alive connection, idle connections timed out, connections bounded. And (issue 31)
slow clients: heads and responses have deadlines, slow or idle clients cannot lock others out, and
malformed requests get a status and one log line, never a traceback.

Every request goes over a real socket to a real server on 127.0.0.1; clients carry a timeout, so a
server that blocks (a FIFO) or miscounts a body (keep-alive) fails the test instead of hanging it.
"""

from __future__ import annotations

import http.client
import os
import select
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
        talked.settimeout(CLIENT_TIMEOUT)
        talked.sendall(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")  # one request, then silence
        first = talked.recv(65536)  # answered before the crowd comes (at the limit, it replaces waiters)
        clients = [talked] + [socket.create_connection(("127.0.0.1", port)) for _ in range(199)]
        try:
            for s in clients:
                s.settimeout(CLIENT_TIMEOUT)  # a server that never hangs up fails here, not hangs
                answer = first if s is talked else b""
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


# ---- issue 31: slow clients, capacity, malformed requests ------------------------------------------
def _small_folder(tmp_path):
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "a.txt").write_text("public")
    return folder


def _raw(port: int, request: bytes) -> bytes:
    """Everything the server sends back for `request` on a fresh connection, until it closes it."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(CLIENT_TIMEOUT)  # a server that never closes fails the test here
        s.sendall(request)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


class _SlowLoris:
    """A client that sends its request head one header line at a time, as long as the server lets it."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n")
        self.opened, self.dropped_at, self.answer = time.monotonic(), None, b""

    def poll(self) -> bool:
        """One more header line; False once the server has dropped the connection."""
        if self.dropped_at is None:
            try:
                while select.select([self.sock], [], [], 0)[0]:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        raise ConnectionResetError("closed by the server")
                    self.answer += chunk
                self.sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                self.dropped_at = time.monotonic()
        return self.dropped_at is None

    def close(self) -> None:
        self.sock.close()


def test_slow_loris_heads_are_cut_off_at_the_header_deadline(tmp_path, capfd):
    """Per-read timeouts never fire on a head sent a line every 0.4 s; the head's deadline does."""
    with boards.serve_board(_small_folder(tmp_path), header_timeout=1.5) as url:
        port = _port(url)
        keep_alive = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT)
        keep_alive.request("GET", "/a.txt")
        assert keep_alive.getresponse().read() == b"public"
        slow = [_SlowLoris(port) for _ in range(5)]
        try:
            deadline = time.monotonic() + 40  # the deadline is 1.5 s: generous for a loaded machine
            while any([c.poll() for c in slow]) and time.monotonic() < deadline:
                assert _get(port, "/a.txt") == (200, b"public")  # well-behaved clients are served meanwhile
                time.sleep(0.4)
            for c in slow:
                assert c.dropped_at is not None, "a head trickling in was never cut off"
                assert c.dropped_at - c.opened < 20, "cut off, but long after its 1.5 s deadline"
                assert c.answer == b"" or c.answer.startswith(b"HTTP/1.1 408"), c.answer[:100]
            # between requests a connection keeps the idle timeout (30 s), not the head's deadline
            keep_alive.request("GET", "/a.txt")
            assert keep_alive.getresponse().read() == b"public"
        finally:
            keep_alive.close()
            for c in slow:
                c.close()
    assert capfd.readouterr().err == ""  # timeouts are not logged


def test_a_server_full_of_slow_clients_still_serves_new_ones(tmp_path):
    """At the limit a new connection replaces the one waiting longest for its head, not a 503."""
    with boards.serve_board(_small_folder(tmp_path), max_connections=16) as url:
        port = _port(url)
        slow = [_SlowLoris(port) for _ in range(16)]
        try:
            deadline = time.monotonic() + 60
            while len(_handler_threads()) < 16 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(_handler_threads()) >= 16  # the server is full of slow clients
            for _ in range(5):
                time.sleep(0.5)  # their threads have read all they sent: they wait on their clients
                assert _get(port, "/a.txt") == (200, b"public")
                # the slow clients send a line more, and come back as soon as they are dropped
                slow = [c if c.poll() else (c.close(), _SlowLoris(port))[1] for c in slow]
            assert len(_handler_threads()) <= 2 * 16  # replaced connections end: threads stay bounded
        finally:
            for c in slow:
                c.close()


def test_at_the_limit_idle_connections_are_replaced_and_503_comes_only_when_all_are_busy(tmp_path):
    folder = _small_folder(tmp_path)
    with open(folder / "big.bin", "wb") as f:
        f.truncate(64 << 20)  # sparse: more than socket buffers hold, so a client that does not read blocks it
    with boards.serve_board(folder, max_connections=4) as url:
        port = _port(url)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            for i, s in enumerate(idle):  # each answered, then idle on keep-alive
                s.settimeout(CLIENT_TIMEOUT)
                s.sendall(b"HEAD /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(4096).startswith(b"HTTP/1.1 200")
                if i == 0:   # the first starts waiting well before the others, even on a loaded machine
                    time.sleep(1.5)
            assert _get(port, "/a.txt") == (200, b"public")
            assert idle[0].recv(4096) == b""  # the connection idle longest made room
        finally:
            for s in idle:
                s.close()
        _wait_no_handler_threads()
        busy = []
        try:
            for _ in range(4):  # each mid-response: a big file to a client that does not read
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(CLIENT_TIMEOUT)
                s.connect(("127.0.0.1", port))
                s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(100).startswith(b"HTTP/1.1 200")
                busy.append(s)
            assert _get(port, "/a.txt")[0] == 503
            busy.pop().close()
            deadline = time.monotonic() + 60  # the freed slot is seen once its thread ends
            while (status := _get(port, "/a.txt")[0]) == 503 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert status == 200
        finally:
            for s in busy:
                s.close()


def test_a_slow_reader_is_cut_off_by_the_minimum_send_rate(tmp_path):
    """Reading a little just often enough beat the per-write timeout; the average rate does not."""
    folder = _small_folder(tmp_path)
    size = 64 << 20
    with open(folder / "big.bin", "wb") as f:
        f.truncate(size)
    with boards.serve_board(folder, idle_timeout=1.0, min_send_rate=32 << 20) as url:
        with socket.create_connection(("127.0.0.1", _port(url))) as s:
            s.settimeout(CLIENT_TIMEOUT)
            s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
            received, started = 0, time.monotonic()
            try:  # at most ~4 MiB/s: every 1 MiB write succeeds within the 1 s idle timeout
                while (chunk := s.recv(65536)) and time.monotonic() - started < 60:
                    received += len(chunk)
                    time.sleep(0.016)
            except ConnectionResetError:
                pass
    assert received < size, "a reader slower than the minimum rate got the whole file"


MALFORMED = {
    "%00 in the path": (b"GET /a%00.txt HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "a NUL byte in the path": (b"GET /a\x00.txt HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "a lone surrogate in the path": (b"GET /%ed%a0%80 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "a bad request line": (b"GET /\x1b[2J HTTP/1.1 more\r\nHost: x\r\n\r\n", 400),
    "a bad version": (b"GET /a.txt HTTP/x.y\r\nHost: x\r\n\r\n", 400),
    "a TLS hello": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
    "a bad Content-Length": (b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n", 400),
    "a head over 64 KiB": (b"GET /a.txt HTTP/1.1\r\n" + (b"X-Filler: " + b"y" * 1000 + b"\r\n") * 70 + b"\r\n", 431),
    "a request line over 64 KiB": (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_requests_get_a_status_and_one_log_line(tmp_path, capfd, case):
    request, status = MALFORMED[case]
    with boards.serve_board(_small_folder(tmp_path)) as url:
        port = _port(url)
        capfd.readouterr()
        answer = _raw(port, request)
        assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
        err = capfd.readouterr().err
        assert _get(port, "/a.txt") == (200, b"public")  # and it still serves
    lines = err.splitlines()
    assert len(lines) == 1 and f" {status} " in lines[0] and "Traceback" not in err, err[:2000]
    assert all(" " <= ch < "\x7f" for ch in lines[0]), lines[0]  # control characters escaped
    assert len(lines[0]) < 1000


def test_an_unexpected_exception_is_a_500_and_one_log_line(tmp_path, capfd, monkeypatch):
    def broken(self, *args):
        raise RuntimeError("boom\nforged log line\x1b[2J")

    monkeypatch.setattr(serve.RangeRequestHandler, "_file_head", broken)
    with boards.serve_board(_small_folder(tmp_path)) as url:
        capfd.readouterr()
        answer = _raw(_port(url), b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        err = capfd.readouterr().err
    assert answer.startswith(b"HTTP/1.1 500 ") and b"boom" not in answer, answer[:300]
    assert err.count("\n") == 1 and "RuntimeError: boom\\x0aforged log line\\x1b[2J" in err, err
    assert "Traceback" not in err


def test_a_range_of_thousands_of_digits_is_answered_per_rfc_9110(tmp_path, capfd):
    """RFC 9110 14.1.1: positions are 1*DIGIT. A first position past the end is unsatisfiable (416);
    a last position or a suffix length past it is clamped to the file (206)."""
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "d.bin").write_bytes(b"0123456789")
    huge = "9" * 5000  # int() refuses over 4,300 digits
    with boards.serve_board(folder) as url:
        conn = http.client.HTTPConnection("127.0.0.1", _port(url), timeout=CLIENT_TIMEOUT)
        try:
            for spec, status, body, content_range in [
                    (f"bytes={huge}-", 416, b"", "bytes */10"),
                    (f"bytes=0-{huge}", 206, b"0123456789", "bytes 0-9/10"),
                    (f"bytes=-{huge}", 206, b"0123456789", "bytes 0-9/10"),
                    (f"bytes={'0' * 5000}7-", 206, b"789", "bytes 7-9/10")]:
                conn.request("GET", "/d.bin", headers={"Range": spec})
                response = conn.getresponse()
                assert (response.status, response.read(), response.getheader("Content-Range")) == \
                    (status, body, content_range), spec[:20]
        finally:
            conn.close()
    assert capfd.readouterr().err == ""  # a valid if odd request: nothing to log


def test_a_request_declaring_a_body_is_answered_and_its_connection_closed(tmp_path):
    """The server reads no bodies: what follows the head is not taken for the next request."""
    with boards.serve_board(_small_folder(tmp_path)) as url:
        for request, status in [
                (b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", 200),
                (b"GET /a.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200),
                (b"POST /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", 501)]:
            answer = _raw(_port(url), request)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 %d " % status) and b"\r\nConnection: close" in head, answer[:300]
            if status == 200:
                assert body == b"public"
