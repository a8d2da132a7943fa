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
  ends the connection instead of leaving the client waiting;
* each connection may be idle `idle_timeout` seconds per read or write; at most `max_connections`
  are served at once, others get 503 at once (a thread per connection, so bounded threads).

A client that hangs up mid-transfer (a cancelled download, a reader that got what it needed) is
normal traffic, not a server error: it ends that one response quietly instead of printing a
ConnectionResetError / BrokenPipeError traceback.
"""

from __future__ import annotations

import contextlib
import functools
import html
import io
import os
import re
import socket
import stat
import sys
import threading
import urllib.parse
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
# what a client hanging up looks like from the server side
_CLIENT_GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, socket.timeout)
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
IDLE_TIMEOUT = 30.0
MAX_CONNECTIONS = 128


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


class RangeRequestHandler(SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler, contained (see the module doc), plus single ranges, ETags, a max-age."""

    max_age = 0
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out separately: Nagle would stall ~40 ms
    timeout = IDLE_TIMEOUT  # per socket read/write: an idle keep-alive connection is closed after it

    def log_message(self, format: str, *args) -> None:  # quiet: tests and demos serve thousands of files
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except _CLIENT_GONE:
            self.close_connection = True

    def send_head(self):
        self._remaining = None  # per request: a keep-alive connection reuses this handler
        root = os.path.realpath(self.directory)
        path = self.translate_path(self.path)
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
        if m and (m.group(1) or m.group(2)):
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:  # suffix range: the last N bytes
                start = max(0, size - int(m.group(2)))
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


class _BoardHTTPServer(ThreadingHTTPServer):
    request_queue_size = 128  # the default 5 makes the 6th parallel client wait ~1 s to connect
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._open: set[Any] = set()  # client sockets: keep-alive connections outlive shutdown() otherwise
        self._open_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        with self._open_lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open.add(request)
        if full:  # answered from the accepting thread, without blocking it
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Hang up on every client still connected: after this, the server is really gone."""
        with self._open_lock:
            still_open = list(self._open)
        for sock in still_open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], _CLIENT_GONE):
            return  # the client went away: nothing to report
        super().handle_error(request, client_address)


@contextlib.contextmanager
def serve_board(path: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0, max_age: int = 0,
                idle_timeout: float = IDLE_TIMEOUT, max_connections: int = MAX_CONNECTIONS) -> Iterator[str]:
    """Serve folder `path` over HTTP in a background thread; yields the base URL (no trailing /).

    Only regular files and folders inside `path` are served (symlinks resolved and contained).
    A connection idle for `idle_timeout` seconds is closed; beyond `max_connections` open at once,
    new ones are answered 503.
    """
    root = Path(path).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"cannot serve {str(path)!r}: not a folder")
    handler_class = type("Handler", (RangeRequestHandler,), {"max_age": max_age, "timeout": idle_timeout})
    server = _BoardHTTPServer((host, port), functools.partial(handler_class, directory=str(root)))
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
