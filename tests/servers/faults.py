"""A fault-injecting HTTP proxy: forwards to a real server, except where a rule says to fail.

Put it between a client and moto, the GCS emulator, the Kaggle server or a static file server to
see what the client does with a 500, a 403, a 404 or a truncated body, without changing the server.
Rules match by HTTP method and a regular expression on the path (with query); a rule may fire a
limited number of times. A truncated body is sent the hard way: the full Content-Length header, half
the bytes, then the connection is closed.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import urlsplit

from .lifecycle import LocalServer, serve_in_thread

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class Rule:
    pattern: re.Pattern
    method: str | None
    action: str  # "status", "truncate" or "delay"
    status: int = 500
    body: bytes = b""
    content_type: str = "text/plain"
    times: int | None = None  # None: forever
    seconds: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and bool(self.pattern.search(path)) \
            and (self.times is None or self.times > 0)


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # parallel clients open many connections at once
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """Quiet: a proxy thread still relaying when its test has stopped the proxy (its sockets shut)
        would otherwise print socketserver's dashed traceback into whatever test runs next."""


class FaultProxy(LocalServer):
    """Forward to `upstream` (`http://host:port`); `endpoint` is the proxy's own base URL."""

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0):
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname, parts.port or 80
        self.rules: list[Rule] = []
        self.log: list[tuple[str, str, int]] = []  # (method, path, status sent)
        self.ranges: list[tuple[str, str | None]] = []  # (path, Range / x-ms-range or None) of every GET
        self.connections: set = set()  # open client sockets, closed by stop() (keep-alive outlives shutdown)
        self.inflight = 0  # requests being answered right now
        self.max_inflight = 0  # the most answered at once since the last clear()
        self._lock = threading.Lock()
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        self._httpd = _Server((host, port), Handler)
        self.endpoint = f"http://{host}:{self._httpd.server_address[1]}"
        self._thread: threading.Thread | None = None

    # -- rules ------------------------------------------------------------------------------
    def fail(self, pattern: str, status: int, *, method: str | None = None, body: bytes | str = b"",
             content_type: str = "text/plain", times: int | None = None) -> Rule:
        """Answer requests matching `pattern` with `status` (and `body`) instead of forwarding."""
        rule = Rule(re.compile(pattern), method, "status", status,
                    body.encode() if isinstance(body, str) else body, content_type, times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def truncate(self, pattern: str, *, method: str | None = "GET", times: int | None = None) -> Rule:
        """Forward, but cut matching response bodies in half and close the connection."""
        rule = Rule(re.compile(pattern), method, "truncate", times=times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def delay(self, pattern: str, seconds: float, *, method: str | None = None, times: int | None = None) -> Rule:
        """Forward matching requests after `seconds` (a slow link, to see requests overlap)."""
        rule = Rule(re.compile(pattern), method, "delay", times=times, seconds=seconds)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self.log.clear()
            self.max_inflight = self.inflight

    def _match(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, path):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
        return None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "FaultProxy":
        self._thread = serve_in_thread(self._httpd, "fault-proxy")
        return self

    def stop(self) -> None:
        """Stop listening and drop open connections: from now on, connections are refused."""
        with contextlib.suppress(Exception):
            self._httpd.shutdown()
            self._httpd.server_close()
        with self._lock:
            open_sockets = list(self.connections)
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _ProxyHandler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid a 40 ms stall each

    def log_message(self, format: str, *args) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.owner._lock:
            self.owner.connections.add(self.connection)

    def finish(self) -> None:
        with self.owner._lock:
            self.owner.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        owner = self.owner
        with owner._lock:
            owner.inflight += 1
            owner.max_inflight = max(owner.max_inflight, owner.inflight)
        self._counted = True
        try:
            self._answer()
        finally:
            self._answering()

    def _answering(self) -> None:
        """No longer in flight, from the moment the answer starts to go out: a client that waits for one
        answer before it asks again can then never be seen with two requests in flight, however late
        this thread runs after its last write."""
        if self._counted:
            self._counted = False
            with self.owner._lock:
                self.owner.inflight -= 1

    def _answer(self) -> None:
        body = self._read_body()
        if self.command == "GET":
            # Azure's clients send their range as x-ms-range
            self.owner.ranges.append((self.path, self.headers.get("Range") or self.headers.get("x-ms-range")))
        rule = self.owner._match(self.command, self.path)
        if rule is not None and rule.action == "delay":
            time.sleep(rule.seconds)
        if rule is not None and rule.action == "status":
            self._answering()
            self._log(rule.status)
            self.send_response(rule.status)
            self.send_header("Content-Type", rule.content_type)
            self.send_header("Content-Length", str(len(rule.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(rule.body)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or self.command in {"POST", "PUT", "PATCH"}:
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(self.owner.upstream_host, self.owner.upstream_port, timeout=60)
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        except OSError as e:
            self._answering()
            self.send_error(502, f"upstream unreachable: {e}")
            return
        finally:
            conn.close()
        self._answering()
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
                self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
            self._log(resp.status)
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(payload)))
        if rule is not None and rule.action == "truncate" and len(payload) > 1:
            self.send_header("Connection", "close")
            self._log(-resp.status)
            self.end_headers()
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._log(resp.status)
        self.end_headers()
        self.wfile.write(payload)

    def _log(self, status: int) -> None:
        """Logged before the answer goes out: once a client holds its answer the log shows it, so a
        test's clear() after one request never catches that request's entry arriving late."""
        self.owner.log.append((self.command, self.path, status))

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _handle


def serve(upstream: str) -> Iterator[FaultProxy]:
    with FaultProxy(upstream) as proxy:
        yield proxy
