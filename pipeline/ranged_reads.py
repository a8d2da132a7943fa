"""How the part cache reads a byte range of a remote file: through the dataset's fsspec filesystem or, on S3,
by one plain GET of a presigned URL.

Why: a ranged read through s3fs (aiobotocore on fsspec's event-loop thread) costs the reading process ~23 ms
of CPU for an 8.8 MB part; a GET of the same range by a presigned URL, read with urllib3 straight into the
cache file, ~7 ms, writing and checksumming included (`bench/bench_ranged_reads.py`, moto, same run). On a
node whose cores decode JPEGs that is ~0.2 ms an ImageNet image, a tenth of its decode.

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
    memory (`in_memory`): the cache asks for a block at a time (`part_cache.BLOCK`)."""

    name = "fsspec"
    in_memory = True

    def __init__(self, fs):
        self.fs = fs

    def read(self, path: str, start: int, end: int, take: Take) -> None:
        """Hand bytes `start`..`end` of `path` to `take`."""
        take(memoryview(self.fs.cat_file(path, start=start, end=end)))


class PresignedS3Reads:
    """Ranged GETs of presigned URLs with urllib3, read into the caller's `take` a buffer at a time; see the
    module's docstring for when this is used and what falls back to s3fs. Nothing is held in memory, so the
    cache asks for a whole part in one GET: a GET has a fixed cost, on both ends (for an
    8.8 MB part read in 8 MB blocks through s3fs, ~12.5 ms of the reader's CPU and ~10.5 of moto's; in one
    presigned GET, ~6.5 and ~5.5)."""

    name = "presigned"
    in_memory = False

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

        url = self.fs.sign(path, expiration=SIGNED_SECONDS)
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
            buffer = bytearray(BUFFER)
            view = memoryview(buffer)
            while True:
                count = response.readinto(buffer)
                if not count:
                    break
                take(view[:count])
            done = True
        except urllib3.exceptions.HTTPError as error:
            raise RangeReadError(f"presigned GET cut: {type(error).__name__}") from None
        finally:
            if done:
                response.release_conn()
            else:
                response.close()
        return None


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
    """How ranged reads of files on `fs` are made: `PresignedS3Reads` where they can be (module docstring),
    else `FsspecReads`. `sample_path`: a file of the dataset, signed once to see the endpoint.

    Args:
        fs: The dataset's fsspec filesystem.
        sample_path: A path on `fs` (not read).
    """
    if os.environ.get("PINSTORM_PRESIGNED_READS", "1") == "0" or not _is_plain_s3(fs):
        return FsspecReads(fs)
    try:
        url = fs.sign(sample_path, expiration=SIGNED_SECONDS)
    except Exception as error:   # no credentials to sign with, an old s3fs: s3fs reads as before
        log.debug("no presigned reads (%s)", type(error).__name__)
        return FsspecReads(fs)
    if _proxied(url):
        return FsspecReads(fs)
    return PresignedS3Reads(fs, _ca_bundle(fs))
