"""A Kaggle-API look-alike on 127.0.0.1, enough for the official `kaggle` / `kagglesdk` client.

The client POSTs JSON to `{base}/v1/{service}/{method}`; downloads answer with a 302 to a file URL
that this server also serves (as Kaggle redirects to signed storage URLs). Implemented calls:

* `security.OAuthService/IntrospectToken` (access-token sign-in)
* `datasets.DatasetApiService/ListDatasets`, `GetDataset`, `DownloadDataset` (302 to a zip)
* `competitions.CompetitionApiService/ListCompetitions`, `ListDataFiles`, `DownloadDataFile` (302),
  `DownloadDataFiles` (302 to a zip of all files)

Every API call must carry valid credentials (Basic `username:key`, or a Bearer token registered with
`add_token`), else 401; unknown datasets and competitions give 404, as Kaggle does. File URLs need
no credentials (signed URLs). `calls` and `file_downloads` record traffic so tests can assert what
went over the wire.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import email.utils
import hashlib
import io
import json
import re
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import quote, unquote

from .lifecycle import LocalServer, serve_in_thread

USERNAME = "pinstorm-tester"
KEY = "0123456789abcdef0123456789abcdef"


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in sorted(files.items()):
            zf.writestr(name, data)
    return buf.getvalue()


@dataclass
class Dataset:
    owner: str
    slug: str
    title: str
    subtitle: str = ""
    versions: list[tuple[dt.datetime, bytes]] = field(default_factory=list)  # (updated, zip bytes)

    @property
    def ref(self) -> str:
        return f"{self.owner}/{self.slug}"

    def to_api(self, base: str) -> dict:
        updated, data = self.versions[-1]
        return {"id": abs(hash(self.ref)) % 10**6, "ref": self.ref, "title": self.title,
                "subtitle": self.subtitle, "url": f"{base}/datasets/{self.ref}", "ownerName": self.owner,
                "ownerRef": self.owner, "lastUpdated": _iso(updated), "totalBytes": len(data),
                "currentVersionNumber": len(self.versions), "downloadCount": 0, "voteCount": 0}


@dataclass
class Competition:
    name: str
    title: str
    description: str = ""
    files: dict[str, tuple[dt.datetime, bytes]] = field(default_factory=dict)

    def to_api(self, base: str) -> dict:
        # Kaggle's list call returns the competition's web URL as `ref`
        return {"id": abs(hash(self.name)) % 10**6, "ref": f"{base}/competitions/{self.name}",
                "title": self.title, "description": self.description,
                "url": f"{base}/competitions/{self.name}", "category": "Playground", "reward": "Kudos",
                "deadline": _iso(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))}


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # parallel clients open many connections at once
    daemon_threads = True


class KaggleServer(LocalServer):
    """The fake Kaggle API; `endpoint` is the base URL to give a Kaggle board (`endpoint=`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, username: str = USERNAME, key: str = KEY):
        self.credentials = {username: key}
        self.tokens: dict[str, str] = {}
        self.datasets: dict[str, Dataset] = {}
        self.competitions: dict[str, Competition] = {}
        self.calls: list[str] = []  # "service/method" of every API call
        self.file_downloads: list[str] = []  # paths of every file served
        self.file_ranges: list[tuple[str, str | None]] = []  # (path, Range header) of every file request
        self.cut_downloads = 0  # how many of the next file bodies to cut in half (a dropped connection)
        self.lock = threading.Lock()
        owner = self

        class Handler(_Handler):
            server_state = owner

        self._httpd = _Server((host, port), Handler)
        self.endpoint = f"http://{host}:{self._httpd.server_address[1]}"
        self._thread: threading.Thread | None = None

    # -- content ----------------------------------------------------------------------------
    def add_dataset(self, ref: str, files: dict[str, bytes], *, title: str | None = None,
                    subtitle: str = "", updated: dt.datetime | None = None) -> int:
        """Add a dataset, or a new version of it; returns the version number."""
        owner, slug = ref.split("/")
        with self.lock:
            ds = self.datasets.setdefault(ref, Dataset(owner, slug, title or slug))
            if title:
                ds.title = title
            ds.subtitle = subtitle or ds.subtitle
            ds.versions.append((updated or dt.datetime.now(dt.timezone.utc), zip_bytes(files)))
            return len(ds.versions)

    def add_competition(self, name: str, files: dict[str, bytes], *, title: str | None = None,
                        description: str = "", created: dt.datetime | None = None) -> None:
        """Add a competition, or replace/add some of its data files."""
        when = created or dt.datetime.now(dt.timezone.utc)
        with self.lock:
            comp = self.competitions.setdefault(name, Competition(name, title or name, description))
            for fname, data in files.items():
                comp.files[fname] = (when, data)

    def add_token(self, token: str, username: str = USERNAME) -> None:
        self.tokens[token] = username

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "KaggleServer":
        self._thread = serve_in_thread(self._httpd, "kaggle-server")
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._httpd.shutdown()
            self._httpd.server_close()

    def kaggle_json(self) -> dict:
        """The content of a kaggle.json that this server accepts."""
        username, key = next(iter(self.credentials.items()))
        return {"username": username, "key": key}


class _ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class _Handler(BaseHTTPRequestHandler):
    server_state: KaggleServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid a 40 ms stall each

    def log_message(self, format: str, *args) -> None:
        pass

    # -- plumbing ---------------------------------------------------------------------------
    def _base(self) -> str:
        return f"http://{self.headers.get('Host')}"  # through a proxy, links keep pointing at the proxy

    def _send(self, status: int, body: bytes, content_type: str, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _redirect(self, path: str) -> None:
        self._send(302, b"", "text/plain", {"Location": self._base() + path})

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization", "")
        state = self.server_state
        if auth.startswith("Basic "):
            try:
                user, _, key = base64.b64decode(auth[6:]).decode().partition(":")
            except ValueError:
                return False
            return state.credentials.get(user) == key
        if auth.startswith("Bearer "):
            return auth[7:] in state.tokens
        return False

    # -- API --------------------------------------------------------------------------------
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        m = re.match(r"^/v1/([\w.]+)/(\w+)$", self.path.split("?")[0])
        if not m:
            return self._json(404, {"code": 404, "message": f"no such API path {self.path}"})
        call = f"{m.group(1)}/{m.group(2)}"
        with self.server_state.lock:
            self.server_state.calls.append(call)
        try:
            body = json.loads(raw or b"{}")
            if call == "security.OAuthService/IntrospectToken":
                user = self.server_state.tokens.get(body.get("token", ""))
                return self._json(200, {"active": True, "username": user} if user else {"active": False})
            if not self._authorized():
                raise _ApiError(401, "Unauthenticated: missing or invalid credentials")
            handler = getattr(self, "api_" + m.group(2), None)
            if handler is None:
                raise _ApiError(404, f"method {call} is not implemented by this test server")
            handler(body)
        except _ApiError as e:
            self._json(e.status, {"code": e.status, "message": e.message})

    def _dataset(self, body: dict) -> Dataset:
        ref = f"{body.get('ownerSlug', '')}/{body.get('datasetSlug', '')}"
        ds = self.server_state.datasets.get(ref)
        if ds is None:
            raise _ApiError(404, f"Dataset {ref} not found")
        return ds

    def _competition(self, body: dict) -> Competition:
        comp = self.server_state.competitions.get(body.get("competitionName", ""))
        if comp is None:
            raise _ApiError(404, f"Competition {body.get('competitionName')!r} not found")
        return comp

    @staticmethod
    def _page(items: list, body: dict) -> list:
        size = int(body.get("pageSize") or 20)
        page = int(body.get("page") or 1)
        return items[(page - 1) * size: page * size]

    def api_ListDatasets(self, body: dict) -> None:
        needle = (body.get("search") or "").lower()
        found = [d for _, d in sorted(self.server_state.datasets.items())
                 if needle in f"{d.ref} {d.title} {d.subtitle}".lower()]
        self._json(200, {"datasets": [d.to_api(self._base()) for d in self._page(found, body)]})

    def api_GetDataset(self, body: dict) -> None:
        self._json(200, self._dataset(body).to_api(self._base()))

    def api_DownloadDataset(self, body: dict) -> None:
        ds = self._dataset(body)
        version = int(body.get("datasetVersionNumber") or len(ds.versions))
        if not 1 <= version <= len(ds.versions):
            raise _ApiError(404, f"Dataset {ds.ref} has no version {version}")
        self._redirect(f"/files/datasets/{ds.ref}/{version}/{quote(ds.slug)}.zip")

    def api_ListCompetitions(self, body: dict) -> None:
        needle = (body.get("search") or "").lower()
        found = [c for _, c in sorted(self.server_state.competitions.items())
                 if needle in f"{c.name} {c.title} {c.description}".lower()]
        self._json(200, {"competitions": [c.to_api(self._base()) for c in self._page(found, body)]})

    def api_ListDataFiles(self, body: dict) -> None:
        comp = self._competition(body)
        names = sorted(comp.files)
        size = int(body.get("pageSize") or 20)
        start = int(body.get("pageToken") or 0)
        page = names[start: start + size]
        out = {"files": [{"ref": n, "name": n, "totalBytes": len(comp.files[n][1]),
                          "creationDate": _iso(comp.files[n][0])} for n in page]}
        if start + size < len(names):
            out["nextPageToken"] = str(start + size)
        self._json(200, out)

    def api_DownloadDataFile(self, body: dict) -> None:
        comp = self._competition(body)
        name = body.get("fileName", "")
        if name not in comp.files:
            raise _ApiError(404, f"Competition {comp.name} has no file {name!r}")
        self._redirect(f"/files/competitions/{comp.name}/{quote(name)}")

    def api_DownloadDataFiles(self, body: dict) -> None:
        comp = self._competition(body)
        self._redirect(f"/files/competitions/{comp.name}.zip")

    # -- files (the redirect targets) -------------------------------------------------------
    def do_GET(self) -> None:
        path = unquote(self.path.split("?")[0])
        state = self.server_state
        data: bytes | None = None
        when = dt.datetime.now(dt.timezone.utc)
        if m := re.match(r"^/files/datasets/([^/]+)/([^/]+)/(\d+)/[^/]+\.zip$", path):
            ds = state.datasets.get(f"{m.group(1)}/{m.group(2)}")
            v = int(m.group(3))
            if ds and 1 <= v <= len(ds.versions):
                when, data = ds.versions[v - 1]
        elif m := re.match(r"^/files/competitions/([^/]+)\.zip$", path):
            comp = state.competitions.get(m.group(1))
            if comp:
                data = zip_bytes({n: d for n, (_, d) in comp.files.items()})
        elif m := re.match(r"^/files/competitions/([^/]+)/(.+)$", path):
            comp = state.competitions.get(m.group(1))
            if comp and m.group(2) in comp.files:
                when, data = comp.files[m.group(2)]
        if data is None:
            return self._send(404, b"not found", "text/plain")
        with state.lock:
            state.file_downloads.append(path)
            state.file_ranges.append((path, self.headers.get("Range")))
            cut = state.cut_downloads > 0 and self.command == "GET"
            if cut:
                state.cut_downloads -= 1
        # like Kaggle's file hosts: ranges, a validator the client's resume checks, a last-modified time
        headers = {"Last-Modified": email.utils.format_datetime(when.astimezone(dt.timezone.utc), usegmt=True),
                   "ETag": '"%s"' % hashlib.sha1(data).hexdigest(), "Accept-Ranges": "bytes"}
        status, body = 200, data
        if (m := re.match(r"^bytes=(\d+)-$", self.headers.get("Range", ""))) and int(m.group(1)) < len(data):
            start = int(m.group(1))
            status, body = 206, data[start:]
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if cut:  # the connection drops mid-body: full Content-Length, half the bytes, then closed
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(status, body, "application/octet-stream", headers)

    do_HEAD = do_GET


def serve() -> Iterator[KaggleServer]:
    """Generator for a pytest fixture: a started server, stopped afterwards."""
    with KaggleServer() as server:
        yield server
