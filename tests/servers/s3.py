"""An S3 server on 127.0.0.1: moto's `ThreadedMotoServer` on a free port.

moto keeps buckets in memory per process and accepts any access key; `S3Server.storage_options`
gives what an s3 board (or s3fs) needs to reach it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Iterator

from moto.server import ThreadedMotoServer

from .lifecycle import LocalServer

KEY = "testing-key"
SECRET = "testing-secret"


class S3Server(LocalServer):
    """moto in server mode; `endpoint` is `http://127.0.0.1:PORT`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        self._server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
        self.endpoint: str | None = None

    def start(self) -> "S3Server":
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._server.stop()

    def storage_options(self, endpoint: str | None = None) -> dict:
        """Options for `board_register("s3", ...)` / `s3fs.S3FileSystem` pointing here (or at a proxy)."""
        return {"endpoint_url": endpoint or self.endpoint, "key": KEY, "secret": SECRET}


def make_public(fs, bucket: str, prefix: str = "") -> None:
    """Let anyone read `bucket/prefix*` without signing (how a board is shared as a plain URL)."""
    resource = f"arn:aws:s3:::{bucket}/{prefix.strip('/') + '/' if prefix.strip('/') else ''}*"
    policy = {"Version": "2012-10-17", "Statement": [
        {"Sid": "PublicRead", "Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject"],
         "Resource": [resource]}]}
    fs.call_s3("put_bucket_policy", Bucket=bucket, Policy=json.dumps(policy))


def serve() -> Iterator[S3Server]:
    """Generator for a pytest fixture: a started server, stopped afterwards."""
    with S3Server() as server:
        yield server
