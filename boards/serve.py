"""A static HTTP server for a board folder that honours Range, ETag and Cache-Control.

The standard library's handler ignores Range, which makes fsspec's HTTP filesystem fetch whole files
for ranged reads; this one answers `bytes=a-b` with 206. It is how a local board is shared with other
machines (or test processes) as a read-only `datatxt` board with no credentials.

It serves what is *inside* its folder and nothing else, since a shared folder is often a working
folder that holds links and odd files nobody meant to publish:

* a path is resolved (symlinks included) and must stay inside the folder; it is then opened one
  component at a time from the folder's descriptor with ``O_NOFOLLOW``, so a link swapped in after
  the check is refused rather than followed;
* only regular files and folders are served: FIFOs, sockets and devices are refused from ``lstat``
  before opening (opening a FIFO blocks, a device never ends), and again from ``fstat`` of the opened
  descriptor (opened ``O_NONBLOCK``), which is the object actually read;
* a file is sent for exactly the size ``fstat`` gave (Content-Length); a file that shrinks meanwhile
  ends the connection instead of leaving the client waiting.

It also bounds what one client can take, since a shared board is often reachable by many:

* per-read timeouts never fire on a client that sends a byte now and then, so every read or write
  waits only what is left of a deadline for the whole exchange: a request head (request line and
  headers, at most `max_head_bytes`) must arrive within `header_timeout` of its first byte; an idle
  connection gets `idle_timeout` for the first byte of its next request; a response must go out at
  `min_send_rate` on average after a grace of `idle_timeout`. Each connection's thread enforces its
  own deadlines, so no timer or reaper thread is needed;
* at most `max_connections` are open at once (a thread each). At the limit a new connection
  replaces the one that has waited longest for a request head with all its input read (a slow or
  idle client), so such clients cannot lock others out; only when every connection is mid-response
  or has input unread is it answered 503;
* request bodies are never read (only GET and HEAD are served): a request that declares one is
  answered and its connection closed.

Malformed requests (a NUL in the path, a bad request line, an oversized head, a bad Content-Length)
get their 4xx, an unexpected exception a 500, each with one line on stderr (control characters
escaped, no traceback). Normal traffic, timeouts and hang-ups (a cancelled download, a reader that
got what it needed) are not logged: a flood of them would flood the log.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import html
import io
import os
import re
import select
import socket
import stat
import sys
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

from .errors import AddressInUse

_RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # the blank line that ends a request head (bare LF tolerated)
_DIGITS = re.compile(r"[0-9]+")
# what a client hanging up (or missing a deadline) looks like from the server side
_CLIENT_GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, socket.timeout)
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
# a log line shows control characters (and anything not ASCII) escaped: a request cannot forge lines
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
IDLE_TIMEOUT = 30.0
HEADER_TIMEOUT = 10.0
MAX_HEAD_BYTES = 64 * 1024
MIN_SEND_RATE = 32 * 1024  # bytes/s, on average over a response, after a grace of idle_timeout
MAX_CONNECTIONS = 128
_LINGER_SECONDS, _LINGER_BYTES = 2.0, 1 << 20
_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def _escaped(text: str, limit: int = 300) -> str:
    text = text if len(text) <= limit else text[:limit] + "..."
    return text.translate(_ESCAPES).encode("ascii", "backslashreplace").decode("ascii")


def _position(digits: str) -> int:
    """A byte position of any length: `int()` refuses 4,301+ digits, and 19+ are past any file anyway."""
    digits = digits.lstrip("0")
    return int(digits or "0") if len(digits) <= 18 else 1 << 62


class _Refused(Exception):
    """Internal: the request names something this server does not serve (never leaves the handler)."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def _served_kind(mode: int) -> bool:
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


def _inside(root: str, real: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def open_contained(root: str, path: str) -> tuple[int, os.stat_result]:
    """A descriptor and its fstat for `path`, a regular file or folder inside the real folder `root`.

    Raises `_Refused` (404 outside the folder or missing, 403 for FIFOs, sockets and devices).
    """
    real = os.path.realpath(path)
    if not _inside(root, real):
        raise _Refused(HTTPStatus.NOT_FOUND, "File not found")  # a link out: as if it were not there
    rel = os.path.relpath(real, root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in ([] if rel == "." else rel.split(os.sep)):
            if not _served_kind(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                raise _Refused(HTTPStatus.FORBIDDEN, "Not a regular file")
            child = os.open(part, _OPEN_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        info = os.fstat(fd)
        if not _served_kind(info.st_mode):
            raise _Refused(HTTPStatus.FORBIDDEN, "Not a regular file")
        return fd, info
    except _Refused:
        os.close(fd)
        raise
    except OSError:  # missing, not a folder, or a link swapped in after the check (ELOOP)
        os.close(fd)
        raise _Refused(HTTPStatus.NOT_FOUND, "File not found") from None


class _PacedWriter:
    """The connection's output: a response must go out at `min_rate` on average after `grace` seconds.

    A per-write timeout cannot stop a client that reads a little just often enough; so each write
    waits only until the deadline the bytes sent so far have earned (`grace` + bytes / `min_rate`
    from the start of the response), and never more than `grace` on its own. `sendall`'s timeout
    bounds the whole call, not each chunk of it.
    """

    closed = False

    def __init__(self, sock: socket.socket, grace: float, min_rate: float):
        self._sock, self._grace, self._min_rate = sock, grace, min_rate
        self.begin()

    def begin(self) -> None:
        """A new response starts: its deadline counts from now."""
        self._start, self.sent = time.monotonic(), 0

    def write(self, data) -> int:
        size = len(data)
        self.sent += size
        left = min(self._grace, self._start + self._grace + self.sent / self._min_rate - time.monotonic())
        if left <= 0:
            raise socket.timeout("the client reads slower than the minimum send rate")
        self._sock.settimeout(left)
        self._sock.sendall(data)
        return size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class RangeRequestHandler(SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler, contained and bounded (see the module doc), plus ranges, ETags, a max-age.

    It also works under a plain `ThreadingHTTPServer` (with its deadlines, without the capacity policy).
    """

    max_age = 0
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # a request line without a version still gets a status line
    disable_nagle_algorithm = True  # headers and body go out separately: Nagle would stall ~40 ms
    timeout = IDLE_TIMEOUT  # for the first byte of a request, and the grace of a response
    header_timeout = HEADER_TIMEOUT
    max_head_bytes = MAX_HEAD_BYTES
    min_send_rate = MIN_SEND_RATE
    _unread_input = False  # the client sent (or declared) input nobody read: linger before closing
    _close_after = False  # announce `Connection: close` in the current response
    _in_send_error = False

    def setup(self) -> None:
        """The socket itself, not a buffered file: reads must stop at a deadline, not per chunk."""
        self.connection = self.request
        if self.disable_nagle_algorithm:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.rfile = io.BytesIO()  # per request: the head already read (parse_request reads headers here)
        self.wfile = _PacedWriter(self.connection, self.timeout or IDLE_TIMEOUT, self.min_send_rate)
        self._pending = bytearray()  # bytes read past the last head: the next pipelined request

    def log_message(self, format: str, *args) -> None:  # quiet: tests and demos serve thousands of files
        pass

    def log_error(self, format: str, *args) -> None:
        """One line on stderr, escaped (`send_error` writes its own, with the detail, instead)."""
        if self._in_send_error:
            return
        request = getattr(self, "requestline", "")
        sys.stderr.write(f"{self.address_string()} - - [{self.log_date_time_string()}] "
                         f"\"{_escaped(request, 200)}\" {_escaped(format % args)}\n")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """A refusal with the standard reason phrase; the detail goes to the log line and the page."""
        self.log_error("%d %s", code, explain or message or HTTPStatus(code).phrase)
        self._in_send_error, self._close_after = True, False  # it announces `Connection: close` itself
        try:
            super().send_error(code, None, explain if code < 500 else None)
        finally:
            self._in_send_error = False

    def end_headers(self) -> None:
        if self._close_after:
            self._close_after = False
            self.send_header("Connection", "close")
        super().end_headers()

    def handle_expect_100(self) -> bool:
        return True  # no `100 Continue`: this server never reads a body, so it does not invite one

    def handle(self) -> None:
        self.close_connection = True
        try:
            self.handle_one_request()
            while not self.close_connection:
                self.handle_one_request()
        except _CLIENT_GONE:
            self.close_connection = True
        if self._unread_input:
            self._linger()

    def handle_one_request(self) -> None:
        self.close_connection = True
        head = self._read_head()
        if head is None:
            return
        begin = getattr(self.server, "_begin_response", None)
        if begin is not None and not begin(self.connection):
            return  # replaced by a newer connection while its head arrived
        try:
            self._answer(head)
        finally:
            end = getattr(self.server, "_end_response", None)
            if end is not None:
                end(self.connection)

    def _answer(self, head: bytes) -> None:
        line_end = head.index(b"\n") + 1
        self.raw_requestline, self.rfile = head[:line_end], io.BytesIO(head[line_end:])
        self.wfile.begin()
        self._headers_buffer: list[bytes] = []
        try:
            if not self.parse_request() or not self._check_body():
                return
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(HTTPStatus.NOT_IMPLEMENTED, explain=f"method {self.command!r} (only GET, HEAD)")
                return
            method()
        except _CLIENT_GONE:
            raise
        except Exception as error:  # a bug or an unforeseen input: a 500 and one line, not a traceback
            self.close_connection = True
            detail = f"{type(error).__name__}: {error}"
            if self.wfile.sent:  # the response has begun: it can only be cut short
                self.log_error("500 %s (response cut short)", detail)
            else:
                self._headers_buffer = []
                self.send_error(HTTPStatus.INTERNAL_SERVER_ERROR, explain=detail)

    def _read_head(self) -> bytes | None:
        """The next request head, read within its deadline and size; None: close the connection.

        Empty lines before it are skipped (RFC 9112 2.2). A head too large is refused (414 when its
        request line is, else 431); one that misses its deadline gets a quiet 408.
        """
        buf, sock = self._pending, self.connection
        deadline = time.monotonic() + (self.timeout or IDLE_TIMEOUT)
        started, scan = False, 0
        while True:
            if not started:
                stripped = len(buf) - len(buf.lstrip(b"\r\n"))
                del buf[:stripped]
                if buf:
                    started, deadline = True, time.monotonic() + self.header_timeout
            if started:
                end = _HEAD_END.search(buf, scan)
                if end is not None and end.end() <= self.max_head_bytes:
                    head = bytes(buf[:end.end()])
                    del buf[:end.end()]
                    return head
                if end is not None or len(buf) > self.max_head_bytes:
                    return self._head_too_large(bytes(buf[:self.max_head_bytes]))
                scan = max(0, len(buf) - 3)
            left = deadline - time.monotonic()
            if left <= 0:
                if started:
                    with contextlib.suppress(OSError):
                        sock.setblocking(False)
                        sock.send(_TIMED_OUT)
                return None
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                return None
            buf += chunk

    def _head_too_large(self, start: bytes) -> None:
        line_end = start.find(b"\n")
        self.requestline = str(start[:200 if line_end < 0 else min(line_end, 200)], "iso-8859-1").rstrip("\r")
        self.request_version, self.command = "HTTP/1.1", ""
        self._unread_input = True  # the rest of that head
        self.wfile.begin()
        self._headers_buffer = []
        if line_end < 0:
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG, explain=f"request line over {self.max_head_bytes} bytes")
        else:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                            explain=f"request head over {self.max_head_bytes} bytes")
        return None

    def _check_body(self) -> bool:
        """False (after a 400) for an unreadable Content-Length; a declared body closes the connection."""
        lengths = {value.strip() for value in self.headers.get_all("Content-Length", [])}
        if len(lengths) > 1 or any(not _DIGITS.fullmatch(value) for value in lengths):
            self.send_error(HTTPStatus.BAD_REQUEST, explain=f"Content-Length {sorted(lengths)!r}")
            return False
        if self.headers.get("Transfer-Encoding") is not None or any(v.lstrip("0") for v in lengths):
            self._unread_input = self._close_after = True
        return True

    def _linger(self) -> None:
        """Drop what the client still sends (the body nobody read) for a moment, then let it close.

        Closing a socket with unread data sends a reset, which can destroy the answer before the
        client reads it. Bounded in time and bytes.
        """
        sock = self.connection
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
            deadline, received = time.monotonic() + _LINGER_SECONDS, 0
            while received < _LINGER_BYTES and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += len(chunk)

    def send_head(self):
        self._remaining = None  # per request: a keep-alive connection reuses this handler
        root = os.path.realpath(self.directory)
        path = self.translate_path(self.path)
        try:
            if "\0" in path:
                raise ValueError("NUL in the path")
            os.fsencode(path)  # a lone surrogate from %ed%a0%80 names no file
        except ValueError as error:  # UnicodeError included
            self.send_error(HTTPStatus.BAD_REQUEST, explain=f"bad path: {error}")
            return None
        try:
            fd, info = open_contained(root, path)
        except _Refused as refused:
            return self._not_served(refused.status, str(refused))
        if stat.S_ISDIR(info.st_mode):
            try:
                return self._send_folder(root, fd, path)
            finally:
                os.close(fd)
        if path.endswith("/"):  # a file named as a folder
            os.close(fd)
            return self._not_served(HTTPStatus.NOT_FOUND, "File not found")
        return self._send_file(fd, info, path)

    def _not_served(self, status: HTTPStatus, message: str):
        """A short plain-text refusal that keeps the connection open (`send_error` closes it)."""
        body = f"{int(status)} {message}\n".encode()
        self.send_response(status, message)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self._remaining = len(body)
        return io.BytesIO(body)

    def _send_folder(self, root: str, fd: int, path: str):
        parts = urllib.parse.urlsplit(self.path)
        if not parts.path.endswith("/"):  # redirect to the folder URL, as the standard handler does
            self.send_response(HTTPStatus.MOVED_PERMANENTLY)
            self.send_header("Location", urllib.parse.urlunsplit(parts._replace(path=parts.path + "/")))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        for index in ("index.html", "index.htm"):
            with contextlib.suppress(_Refused):
                index_fd, index_info = open_contained(root, os.path.join(path, index))
                if stat.S_ISREG(index_info.st_mode):
                    return self._send_file(index_fd, index_info, index)
                os.close(index_fd)
        body = self._listing(root, fd, path)
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self._remaining = len(body)
        return io.BytesIO(body)

    def _listing(self, root: str, fd: int, path: str) -> bytes:
        """The folder's HTML listing, naming only what this server would serve."""
        names = []
        for name in sorted(os.listdir(fd), key=str.lower):
            try:
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    target = os.path.realpath(os.path.join(path, name))
                    mode = os.stat(target).st_mode if _inside(root, target) else 0
            except OSError:
                continue
            if _served_kind(mode):
                names.append(name + "/" if stat.S_ISDIR(mode) else name)
        title = html.escape(urllib.parse.unquote(urllib.parse.urlsplit(self.path).path), quote=False)
        items = "".join(f'<li><a href="{urllib.parse.quote(n, errors="surrogatepass")}">'
                        f"{html.escape(n, quote=False)}</a></li>\n" for n in names)
        page = (f'<!DOCTYPE HTML>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
                f"<title>Directory listing for {title}</title>\n</head>\n<body>\n"
                f"<h1>Directory listing for {title}</h1>\n<hr>\n<ul>\n{items}</ul>\n<hr>\n</body>\n</html>\n")
        return page.encode("utf-8", "surrogateescape")

    def _send_file(self, fd: int, info: os.stat_result, path: str):
        """Headers for the regular file open at `fd` (sized by its fstat); returns it to be copied, or None."""
        f = os.fdopen(fd, "rb")
        try:
            return self._file_head(f, info, path)
        except BaseException:
            f.close()
            raise

    def _file_head(self, f, info: os.stat_result, path: str):
        etag = f'"{info.st_size:x}-{info.st_mtime_ns:x}"'
        if self.headers.get("If-None-Match") == etag:
            f.close()
            self.send_response(HTTPStatus.NOT_MODIFIED)
            self.send_header("ETag", etag)
            self.send_header("Cache-Control", f"max-age={self.max_age}")
            self.end_headers()
            return None
        size = info.st_size
        start, end = 0, size - 1
        m = _RANGE.match(self.headers.get("Range", "").strip())
        if m and (m.group(1) or m.group(2)):  # positions of any length (RFC 9110 14.1.1: 1*DIGIT)
            if m.group(1):
                start = _position(m.group(1))
                end = min(_position(m.group(2)), size - 1) if m.group(2) else size - 1
            else:  # suffix range: the last N bytes
                start = max(0, size - _position(m.group(2)))
            if start >= size or start > end:
                f.close()
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            self.send_response(HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            self.send_response(HTTPStatus.OK)
        f.seek(start)
        self._remaining = max(0, end - start + 1)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Length", str(self._remaining))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Cache-Control", f"max-age={self.max_age}")
        self.end_headers()
        return f

    def copyfile(self, source, outputfile) -> None:
        """Exactly the announced Content-Length: never more; if the file shrank, hang up rather than stall."""
        remaining = getattr(self, "_remaining", None)
        if remaining is None:
            return super().copyfile(source, outputfile)
        while remaining > 0:
            block = source.read(min(1 << 20, remaining))
            if not block:
                self.close_connection = True
                break
            outputfile.write(block)
            remaining -= len(block)



class _Connection:
    """What the capacity policy knows of an open connection."""

    __slots__ = ("waiting_since", "responding")

    def __init__(self) -> None:
        self.waiting_since, self.responding = time.monotonic(), False


class _BoardHTTPServer(ThreadingHTTPServer):
    # listen backlog (capped by the kernel's somaxconn): a full one drops SYNs, which cost a 1 s retransmit;
    # at 128, 200 clients connecting at once had p99 1.04 s instead of ~0.2 s (bench/bench_serve_load.py)
    request_queue_size = 1024
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # client sockets: keep-alive connections outlive shutdown() otherwise; and the capacity policy
        self._open: dict[Any, _Connection] = {}
        self._open_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        """Serve a new connection, replacing the one waiting longest for a head if at the limit."""
        victim = None
        with self._open_lock:
            if len(self._open) >= self.max_connections:
                victim = self._replaceable()
                if victim is not None:
                    del self._open[victim]
            full = len(self._open) >= self.max_connections
            if not full:
                self._open[request] = _Connection()
        if victim is not None:  # its thread sees the connection end and closes it
            with contextlib.suppress(OSError):
                victim.shutdown(socket.SHUT_RDWR)
        if full:  # every connection is busy: answered from the accepting thread, without blocking it
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(_BUSY)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _replaceable(self) -> Any | None:
        """The connection waiting longest for a request head with nothing unread (a slow or idle client).

        One with input not read yet is skipped: under load a client's whole head can sit in the
        socket until its thread runs, and that client is no slower than the newcomer. One poll().
        """
        waiting = [(c.waiting_since, s) for s, c in self._open.items() if not c.responding]
        if not waiting:
            return None
        poller = select.poll()
        for _, sock in waiting:
            poller.register(sock, select.POLLIN)
        pending = {fd for fd, _ in poller.poll(0)}
        idle = [(since, id(sock), sock) for since, sock in waiting if sock.fileno() not in pending]
        return min(idle)[2] if idle else None

    def _begin_response(self, request) -> bool:
        """Mark the connection mid-response (not to be replaced); False if it was replaced already."""
        with self._open_lock:
            connection = self._open.get(request)
            if connection is not None:
                connection.responding = True
            return connection is not None

    def _end_response(self, request) -> None:
        with self._open_lock:
            connection = self._open.get(request)
            if connection is not None:
                connection.responding, connection.waiting_since = False, time.monotonic()

    def shutdown_request(self, request) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Hang up on every client still connected: after this, the server is really gone."""
        with self._open_lock:
            still_open = list(self._open)
        for sock in still_open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request, client_address) -> None:
        """One line, no traceback: the handler answers what it can; this is what escaped it."""
        error = sys.exc_info()[1]
        if isinstance(error, _CLIENT_GONE):
            return  # the client went away: nothing to report
        sys.stderr.write(f"{client_address[0] if client_address else '-'} - - serve_board: connection failed: "
                         f"{_escaped(f'{type(error).__name__}: {error}')}\n")


@contextlib.contextmanager
def serve_board(path: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0, max_age: int = 0,
                idle_timeout: float = IDLE_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                header_timeout: float = HEADER_TIMEOUT, max_head_bytes: int = MAX_HEAD_BYTES,
                min_send_rate: float = MIN_SEND_RATE) -> Iterator[str]:
    """Serve folder `path` over HTTP in a background thread; yields the base URL (no trailing /).

    Only regular files and folders inside `path` are served (symlinks resolved and contained).
    A request head must arrive within `header_timeout` seconds of its first byte and fit in
    `max_head_bytes`; a connection waits `idle_timeout` for the next request; a response must go out
    at `min_send_rate` bytes/s on average after `idle_timeout`. Beyond `max_connections`, a new
    connection replaces the one waiting longest for a request, or gets 503 if all are busy.

    Args:
        path: The folder to serve (a board's folder).
        host: The address to listen on (the default: this machine only).
        port: The port (0: any free one; the URL yielded names it).
        max_age: The ``Cache-Control: max-age`` of responses, in seconds.
        idle_timeout: Seconds a connection may wait for its next request.
        max_connections: Connections held at once.
        header_timeout: Seconds a request head may take to arrive, from its first byte.
        max_head_bytes: The largest request head accepted.
        min_send_rate: Bytes per second a response must average after `idle_timeout`.

    Yields:
        The base URL, e.g. ``http://127.0.0.1:PORT``; the server stops when the context ends.

    Raises:
        FileNotFoundError: `path` is not a folder.
        AddressInUse: Another process holds `port`.
    """
    root = Path(path).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"cannot serve {str(path)!r}: not a folder")
    handler_class = type("Handler", (RangeRequestHandler,), {
        "max_age": max_age, "timeout": idle_timeout, "header_timeout": header_timeout,
        "max_head_bytes": max_head_bytes, "min_send_rate": min_send_rate})
    try:
        server = _BoardHTTPServer((host, port), functools.partial(handler_class, directory=str(root)))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        refusal = AddressInUse(f"cannot serve {str(root)!r} on {host}:{port}: another process holds that port; "
                               "choose another port, or 0 for any free one")
        refusal.errno = errno.EADDRINUSE
        raise refusal from None
    server.daemon_threads = True
    server.max_connections = max_connections
    thread = threading.Thread(target=server.serve_forever, name=f"serve-board-{root.name}", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.close_connections()
        server.server_close()
