"""How the part cache reads a byte range of a remote file: through the dataset's fsspec filesystem; on S3, by
one plain GET of a presigned URL; on an HTTP board, by one GET through the board's own client.

Why: through s3fs (aiobotocore on fsspec's event-loop thread, each read whole in memory, so in 8 MiB blocks)
an 8.8 MB part costs the reading process ~17 ms of CPU and moto ~15; one GET of a presigned URL, read with
urllib3 straight into the cache file, ~7 and ~8.5, writing and checksumming included (32 MB: ~47 and ~48
against ~23.5 and ~22; `bench/bench_ranged_reads.py`, same run). Where the readers' cores also decode JPEGs,
that is what streaming costs beyond a local read.

The presigned path is taken only where it does what s3fs would: no request options it would have to copy
(requester pays, SSE-C keys: `s3_additional_kwargs`, `requester_pays`), no client settings of its own
(`client_kwargs` beyond the endpoint and region, `config_kwargs`: `verify`, proxies, ...), no proxy from
the environment for the endpoint, and the CA bundle botocore would use. Any answer but the range asked for
(a 403, a redirect, a 503) is asked again of s3fs, which retries, raises its usual error or succeeds; when
it succeeds after an answer a client error (3xx/4xx), presigned reads stop for that filesystem. A
presigned URL is a credential for its lifetime (`SIGNED_SECONDS`): it goes only to the endpoint it was
signed for (no redirect is followed) and is never put in a message (errors name the exception's type, not
its text, which holds the URL); urllib3's own debug lines get the boards' redacting filter.
"""

from __future__ import annotations

import os
import threading
from typing import Callable
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from pinstorm.boards.safety import secrets

from .errors import PipelineError

BLOCK = 8 << 20               # bytes per read where a read comes back whole, in memory (`FsspecReads`)
SIGNED_SECONDS = 900          # a presigned URL's lifetime: signed per read (~0.5 ms), used at once
CONNECT_SECONDS, READ_SECONDS = 60, 60   # botocore's defaults
BUFFER = 1 << 20              # bytes handed to the cache file per read from the socket
# s3fs client options the presigned path reproduces: the endpoint (in the URL) and the region (in the signature)
_PLAIN_CLIENT_OPTIONS = frozenset({"endpoint_url", "region_name"})

Take = Callable[[memoryview], None]   # receives the range's bytes in order, block by block

log = secrets.logger("pinstorm.pipeline.ranged_reads")
secrets.logger("urllib3.connectionpool")   # its debug lines carry each URL: the signature masked there too


class RangeReadError(PipelineError, OSError):
    """A ranged read cut short or refused on the way (the part cache resumes it from the byte reached)."""


class FsspecReads:
    """Ranged reads through the filesystem's own ``cat_file``: every backend. A read comes back whole, in
    memory, so a range is read `BLOCK` bytes at a time."""

    def __init__(self, fs):
        self.fs = fs

    def read(self, path: str, start: int, end: int, take: Take) -> None:
        """Hand bytes `start`..`end` of `path` to `take`, a block at a time (a failure keeps the blocks handed
        over; a block that comes back short ends the read)."""
        for at in range(start, end, BLOCK):
            data = self.fs.cat_file(path, start=at, end=min(end, at + BLOCK))
            take(memoryview(data))
            if len(data) < min(end, at + BLOCK) - at:
                return


class BoardReads:
    """Ranged reads of a pin's files on an HTTP board (`storage.PinVersionFiles.read_into`): one GET through the
    board's client (its headers to its origin only) for a whole part, handed over a block at a time."""

    def __init__(self, fs):
        self.fs = fs

    def read(self, path: str, start: int, end: int, take: Take) -> None:
        """Hand bytes `start`..`end` of `path` to `take`."""
        self.fs.read_into(path, start, end, take)


class PresignedS3Reads:
    """Ranged GETs of presigned URLs with urllib3, read into the caller's `take` a buffer at a time; see the
    module's docstring for when this is used and what falls back to s3fs. Nothing is held in memory, so a
    whole part comes in one GET: a GET has a fixed cost, on both ends."""

    def __init__(self, fs, ca_bundle: str):
        import urllib3

        self.fs, self.fallback = fs, FsspecReads(fs)
        self.usable = True
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=16, cert_reqs="CERT_REQUIRED", ca_certs=ca_bundle)
        self._timeout = urllib3.Timeout(connect=CONNECT_SECONDS, read=READ_SECONDS)
        self._lock = threading.Lock()

    def read(self, path: str, start: int, end: int, take: Take) -> None:
        """Hand bytes `start`..`end` of `path` to `take`; `RangeReadError` when the connection failed or was
        cut (bytes handed over so far stand)."""
        if not self.usable:
            return self.fallback.read(path, start, end, take)
        import urllib3

        try:
            url = self.fs.sign(path, expiration=SIGNED_SECONDS)
        except Exception:   # credentials gone stale: s3fs says what is wrong, or refreshes them
            return self.fallback.read(path, start, end, take)
        try:
            response = self._pool.request("GET", url, headers={"Range": f"bytes={start}-{end - 1}"},
                                          preload_content=False, decode_content=False, redirect=False,
                                          retries=False, timeout=self._timeout)
        except urllib3.exceptions.HTTPError as error:   # its text holds the URL: the type only
            raise RangeReadError(f"presigned GET failed: {type(error).__name__}") from None
        done = False
        try:
            if response.status != 206 or \
                    not response.headers.get("Content-Range", "").startswith(f"bytes {start}-"):
                status = response.status
                response.close()
                self.fallback.read(path, start, end, take)   # s3fs's retries and errors, or its bytes
                if 300 <= status < 500:
                    with self._lock:
                        if self.usable:
                            self.usable = False
                            log.info("%s: presigned ranged GETs answered HTTP %d where s3fs succeeds; reading "
                                     "through s3fs from now on", secrets.strip_url(self.fs.unstrip_protocol(path)),
                                     status)
                return None
            self._copy_body(response, take)
            done = True
        except urllib3.exceptions.HTTPError as error:
            raise RangeReadError(f"presigned GET cut: {type(error).__name__}") from None
        finally:
            if done:
                response.release_conn()
            else:
                response.close()
        return None

    @staticmethod
    def _copy_body(response, take: Take) -> None:
        """Hand `response`'s body to `take`, `BUFFER` bytes at a time. ``read(n)`` rather than ``readinto``:
        urllib3 2's ``readinto`` is ``read`` plus a copy into the caller's buffer: a whole download (written and
        hashed) cost 1.23-1.36x the reader's CPU on parts of 8.8 and 32 MB (`bench/bench_ranged_reads.py`, which
        keeps the ``readinto`` loop as its same-run baseline)."""
        while block := response.read(BUFFER):
            take(memoryview(block))


def _is_plain_s3(fs) -> bool:
    """An s3fs filesystem without options the presigned path would have to copy (module docstring)."""
    if type(fs).__module__.split(".")[0] != "s3fs" or not callable(getattr(fs, "sign", None)):
        return False
    if getattr(fs, "s3_additional_kwargs", None) or getattr(fs, "req_kw", None) or \
            getattr(fs, "config_kwargs", None):
        return False
    return set(getattr(fs, "client_kwargs", None) or {}) <= _PLAIN_CLIENT_OPTIONS


def _proxied(url: str) -> bool:
    """Whether the environment routes `url` through a proxy (botocore would; urllib3's pool does not)."""
    parts = urlsplit(url)
    return parts.scheme in getproxies() and not proxy_bypass(parts.hostname or "")


def _ca_bundle(fs) -> str:
    """The CA bundle botocore would verify the endpoint with: ``AWS_CA_BUNDLE`` or the profile's
    ``ca_bundle``, else its default (certifi's)."""
    from botocore.httpsession import get_cert_path

    session = getattr(fs, "session", None)
    configured = session.get_config_variable("ca_bundle") if session is not None else None
    return configured or get_cert_path(True)


def reads_for(fs, sample_path: str):
    """How ranged reads of files on `fs` are made: `BoardReads` for a pin on an HTTP board, `PresignedS3Reads`
    where they can be (module docstring), else `FsspecReads` (always, with ``PINSTORM_RANGED_READS=fsspec``). `sample_path`: a file of the dataset, signed once to see the endpoint.

    Args:
        fs: The dataset's fsspec filesystem.
        sample_path: A path on `fs` (not read).
    """
    if os.environ.get("PINSTORM_RANGED_READS", "auto") == "fsspec":   # every read as before `ranged_reads`
        return FsspecReads(fs)
    if callable(getattr(fs, "read_into", None)):   # a pin on an HTTP board
        return BoardReads(fs)
    if not _is_plain_s3(fs):
        return FsspecReads(fs)
    try:
        url = fs.sign(sample_path, expiration=SIGNED_SECONDS)
    except Exception as error:   # no credentials to sign with, an old s3fs: s3fs reads as before
        log.debug("no presigned reads (%s)", type(error).__name__)
        return FsspecReads(fs)
    if _proxied(url):
        return FsspecReads(fs)
    return PresignedS3Reads(fs, _ca_bundle(fs))
