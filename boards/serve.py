"""A static HTTP server for a board folder that honours Range, ETag and Cache-Control.

The standard library's handler ignores Range, which makes fsspec's HTTP filesystem fetch whole files
for ranged reads; this one answers `bytes=a-b` with 206. It is how a local board is shared with other
machines (or test processes) as a read-only `datatxt` board with no credentials.

A client that hangs up mid-transfer (a cancelled download, a reader that got what it needed) is
normal traffic, not a server error: it ends that one response quietly instead of printing a
ConnectionResetError / BrokenPipeError traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
import sys
import threading
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
# what a client hanging up looks like from the server side
_CLIENT_GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, socket.timeout)


class RangeRequestHandler(SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler plus single-range requests, ETags and a max-age."""

    max_age = 0
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out separately: Nagle would stall ~40 ms

    def log_message(self, format: str, *args) -> None:  # quiet: tests and demos serve thousands of files
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except _CLIENT_GONE:
            self.close_connection = True

    def send_head(self):
        path = self.translate_path(self.path)
        if os.path.isdir(path) or not os.path.isfile(path):
            return super().send_head()
        stat = os.stat(path)
        etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
        if self.headers.get("If-None-Match") == etag:
            self.send_response(HTTPStatus.NOT_MODIFIED)
            self.send_header("ETag", etag)
            self.send_header("Cache-Control", f"max-age={self.max_age}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        size = stat.st_size
        start, end = 0, size - 1
        m = _RANGE.match(self.headers.get("Range", "").strip())
        if m and (m.group(1) or m.group(2)):
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:  # suffix range: the last N bytes
                start = max(0, size - int(m.group(2)))
            if start >= size or start > end:
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            self.send_response(HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            self.send_response(HTTPStatus.OK)
        f = open(path, "rb")
        f.seek(start)
        self._remaining = end - start + 1
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Length", str(self._remaining))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Cache-Control", f"max-age={self.max_age}")
        self.end_headers()
        return f

    def copyfile(self, source, outputfile) -> None:
        remaining = getattr(self, "_remaining", None)
        if remaining is None:
            return super().copyfile(source, outputfile)
        while remaining > 0:
            block = source.read(min(1 << 20, remaining))
            if not block:
                break
            outputfile.write(block)
            remaining -= len(block)


class _BoardHTTPServer(ThreadingHTTPServer):
    request_queue_size = 128  # the default 5 makes the 6th parallel client wait ~1 s to connect

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._open: set = set()  # client sockets: keep-alive connections outlive shutdown() otherwise
        self._open_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        with self._open_lock:
            self._open.add(request)
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
def serve_board(path: str | os.PathLike, host: str = "127.0.0.1", port: int = 0,
                max_age: int = 0) -> Iterator[str]:
    """Serve folder `path` over HTTP in a background thread; yields the base URL (no trailing /)."""
    root = Path(path).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"cannot serve {str(path)!r}: not a folder")
    handler = functools.partial(type("Handler", (RangeRequestHandler,), {"max_age": max_age}), directory=str(root))
    server = _BoardHTTPServer((host, port), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name=f"serve-board-{root.name}", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        server.close_connections()
