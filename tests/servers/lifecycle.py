"""What every test server shares: `with Server() as s:` starts it and always stops it."""

from __future__ import annotations

import threading
from http.server import HTTPServer


class LocalServer:
    """A server on 127.0.0.1 with `start()` (returns self) and `stop()`, usable as a context manager."""

    def start(self):
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_in_thread(httpd: HTTPServer, name: str) -> threading.Thread:
    """Run `httpd.serve_forever` in a daemon thread, so a stuck test never keeps the process alive."""
    thread = threading.Thread(target=httpd.serve_forever, name=name, daemon=True)
    thread.start()
    return thread
