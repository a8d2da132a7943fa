"""A Google Cloud Storage server on 127.0.0.1: `gcp-storage-emulator`, in memory, on a free port.

gcsfs reaches it with `endpoint_url=` and `token="anon"`. The emulator also serves objects at
`/<bucket>/<key>` without credentials (as public GCS objects are), which is how a bucket board is
read back as a plain `datatxt` board in tests.

Import note: gcsfs probes a gRPC endpoint for ~60 s per bucket unless
`GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` is set before gcsfs is imported; importing this module
sets that default (as `boards.backends.cloud` does).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from gcp_storage_emulator.server import create_server  # noqa: E402

from .lifecycle import LocalServer

PROJECT = "pinstorm-test"


class GcsServer(LocalServer):
    """gcp-storage-emulator in memory; `endpoint` is `http://127.0.0.1:PORT`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, default_bucket: str | None = None):
        for logger in ("gcp_storage_emulator", "api.object", "api.bucket"):  # "Resource not found" on every 404
            logging.getLogger(logger).setLevel(logging.CRITICAL)
        self._host = host
        self._server = create_server(host, port, in_memory=True, default_bucket=default_bucket)
        self.endpoint: str | None = None

    def start(self) -> "GcsServer":
        self._server.start()
        # the emulator does not report a port chosen by the OS; its HTTP server holds it
        port = self._server._api._httpd.server_address[1]
        self.endpoint = f"http://{self._host}:{port}"
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._server.stop()

    def storage_options(self, endpoint: str | None = None) -> dict:
        """Options for `board_register("gcs", ...)` pointing here (or at a proxy in front of it)."""
        return {"endpoint_url": endpoint or self.endpoint, "token": "anon", "project": PROJECT}


def serve() -> Iterator[GcsServer]:
    """Generator for a pytest fixture: a started server, stopped afterwards."""
    with GcsServer() as server:
        yield server
