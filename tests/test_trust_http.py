"""Issue 17, cases 5, 6, 7 and the config part of 10, against real servers on 127.0.0.1:
bounded transfers (endless and stalled bodies), credentials that stay on their origin across
redirects, secrets that are never saved, never in a file name and never printed, and a full
config disk that is one clear error."""

from __future__ import annotations

import base64
import contextlib
import errno
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pinstorm import boards
from pinstorm.boards import registry
from pinstorm.boards.errors import BoardError, DownloadError, LimitExceeded

from disk_support import small_disk  # noqa: F401 - fixture

PASSWORD = "pa55-S3CRET-word"
API_KEY = "k3y-S3CRET-value"
TOKEN = "t0k3n-S3CRET-query"


class Site:
    """A threaded HTTP server on 127.0.0.1 serving a folder, except for paths given a handler;
    it records every request's path and headers."""

    def __init__(self, folder: Path | None = None):
        self.folder, self.routes, self.seen = folder, {}, []
        self.release = threading.Event()  # ends handlers that stall on purpose
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                site.seen.append((self.path, dict(self.headers)))
                path = urlsplit(self.path).path
                if path in site.routes:
                    with contextlib.suppress(OSError):
                        site.routes[path](self)
                    return
                file = (site.folder / path.lstrip("/")) if site.folder else None
                if file is None or not file.is_file():
                    self.send_error(404)
                    return
                body = file.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def headers_for(self, path_part: str) -> list[dict]:
        return [{k.lower(): v for k, v in h.items()} for p, h in self.seen if path_part in p]


@pytest.fixture
def pinned(tmp_path):
    """(folder, file path inside it) of a board holding pin 'blob': one 100-byte file."""
    folder = tmp_path / "served"
    src = boards.board_register("local", name="src", path=folder)
    data = tmp_path / "blob.bin"
    data.write_bytes(bytes(range(100)))
    src.pin(str(data), "blob")
    version = src.pin_versions("blob")["version"].iloc[-1]
    return folder, f"/blob/{version}/blob.bin"


def _endless(handler):
    handler.send_response(200)  # HTTP/1.0: no Content-Length, the body ends when the server closes
    handler.end_headers()
    block = b"\0" * 65536
    while True:
        handler.wfile.write(block)


def _endless_chunked(handler):
    handler.protocol_version = "HTTP/1.1"  # chunked transfer encoding: a body that announces no end
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"10000\r\n" + b"\0" * 65536 + b"\r\n"
    while True:
        handler.wfile.write(chunk)


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ---- case 5: endless and stalled bodies ----------------------------------------------------------

@pytest.mark.parametrize("endless", [_endless, _endless_chunked], ids=["until-close", "chunked"])
def test_an_endless_body_stops_at_the_declared_size(pinned, tmp_path, endless):
    folder, file_path = pinned
    with Site(folder) as site:
        site.routes[file_path] = endless
        web = boards.board_register(site.url, name="web")
        with pytest.raises(LimitExceeded) as info:
            web.pin_get("blob")
    message = str(info.value)
    assert "pin 'blob'" in message and "'blob.bin'" in message and site.url + file_path in message
    assert "declares 100 bytes" in message
    assert _tree_bytes(tmp_path / "cache") < 1 << 20  # nothing half-written stays, nothing near the GB


def test_a_body_announcing_more_than_declared_is_refused_before_reading(pinned):
    folder, file_path = pinned

    def huge(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(10 ** 12))
        handler.end_headers()
        handler.wfile.write(b"\0" * 1000)

    with Site(folder) as site:
        site.routes[file_path] = huge
        with pytest.raises(LimitExceeded, match="announces 1,000,000,000,000 bytes"):
            boards.board_register(site.url, name="web").pin_get("blob")


@pytest.mark.parametrize("mode", ["trickle", "silent"])
def test_a_stalled_body_ends_at_the_overall_deadline(pinned, mode):
    folder, file_path = pinned
    with Site(folder) as site:
        def stall(handler):
            handler.send_response(200)
            handler.send_header("Content-Length", "100")
            handler.end_headers()
            for _ in range(100):  # one byte every 0.1 s keeps every read under its timeout: 10 s in all
                if site.release.wait(0.1):
                    return
                if mode == "trickle":
                    handler.wfile.write(b"x")
                    handler.wfile.flush()

        site.routes[file_path] = stall
        web = boards.board_register(site.url, name="web", deadline=0.5, min_rate=1e9)
        with pytest.raises(DownloadError, match=r"did not finish within 0\.5 s") as info:
            web.pin_get("blob")
    assert "pin 'blob'" in str(info.value) and "of 100 bytes arrived" in str(info.value)


def test_a_normal_download_still_works_with_a_tight_rate(pinned):
    folder, _ = pinned
    with Site(folder) as site:
        web = boards.board_register(site.url, name="web", deadline=5, min_rate=1000)
        assert Path(web.pin_get("blob")[0]).read_bytes() == bytes(range(100))


def test_a_url_without_declared_size_stops_before_the_disk_is_full(tmp_path, small_disk):
    disk = small_disk(tmp_path / "small-disk", "1m")
    with Site() as site:
        site.routes["/endless.bin"] = _endless
        cache = boards.Cache(disk)
        with pytest.raises(LimitExceeded, match="bytes free") as info:
            cache.fetch_url(f"{site.url}/endless.bin", disk / "web" / "endless.bin")
    assert str(disk) in str(info.value)
    assert _tree_bytes(disk) == 0  # the temporary is gone: the disk is as free as before


# ---- case 6: credentials stay on their origin, redirects included ---------------------------------

def test_credentials_go_to_the_board_origin_only_even_across_redirects(pinned):
    folder, file_path = pinned
    with Site(folder) as home, Site(folder) as other:
        def redirect(handler):
            handler.send_response(302)
            handler.send_header("Location", other.url + file_path)
            handler.send_header("Content-Length", "0")
            handler.end_headers()

        home.routes[file_path] = redirect
        host = home.url.split("://", 1)[1]
        web = boards.board_register(f"http://reader:{PASSWORD}@{host}/?token={TOKEN}", name="web",
                                    headers=[("X-Api-Key", API_KEY), ("User-Agent", "pinstorm-test")])
        assert Path(web.pin_get("blob")[0]).read_bytes() == bytes(range(100))
    at_home = home.headers_for("/")
    assert at_home and all(h.get("x-api-key") == API_KEY for h in at_home)
    expected = "Basic " + base64.b64encode(f"reader:{PASSWORD}".encode()).decode()
    assert all(h.get("authorization") == expected for h in at_home)
    assert all(f"token={TOKEN}" in p for p, _ in home.seen)
    away = other.headers_for(file_path)
    assert away, "the redirect was followed"
    assert all("x-api-key" not in h and "authorization" not in h for h in away)
    assert all(TOKEN not in p for p, _ in other.seen)
    assert all(h.get("user-agent") != "pinstorm-test" for h in away)  # configured headers: all stay home


# ---- case 7: secrets are never saved, never in a file name, never printed ---------------------------

def _board_list_output() -> str:
    from pinstorm.cli import cli

    result = CliRunner().invoke(cli, ["board", "list"])
    assert result.exit_code == 0, result.output
    return result.output


def test_secrets_in_any_form_are_never_saved_named_or_printed(pinned, tmp_path):
    folder, _ = pinned
    with Site(folder) as site:
        host = site.url.split("://", 1)[1]
        secret_url = f"http://reader:{PASSWORD}@{host}/?token={TOKEN}"
        with pytest.warns(UserWarning, match="not saved"):
            web = boards.board_register(secret_url, persist=True,
                                        headers=[("X-Api-Key", API_KEY), ("Accept", "*/*")])
            boards.board_register(
                "s3", name="bucket", bucket="some-bucket", persist=True,
                endpoint_url=f"http://AKIAEXAMPLE:{PASSWORD}@127.0.0.1:9/",
                config_kwargs={"proxies": {"https": f"http://proxyuser:{PASSWORD}@127.0.0.1:3128"}},
                client_kwargs={"endpoint_url": f"http://127.0.0.1:9/?X-Amz-Security-Token={TOKEN}"})
        assert Path(web.pin_get("blob")[0]).read_bytes() == bytes(range(100))
        assert PASSWORD not in web.name and PASSWORD not in web.describe() and TOKEN not in web.describe()
        in_process = _board_list_output()
        config = (tmp_path / "config" / "boards.yaml").read_text()

    for secret in (PASSWORD, TOKEN, API_KEY):
        assert secret not in config
        assert secret not in in_process
    saved = yaml.safe_load(config)["boards"]
    assert saved[web.name]["kind"] == site.url + "/"
    assert saved[web.name]["headers"] == [["Accept", "*/*"]]
    assert saved["bucket"]["endpoint_url"] == "http://127.0.0.1:9/"
    assert saved["bucket"]["config_kwargs"]["proxies"]["https"] == "http://127.0.0.1:3128"
    assert "***" in in_process and "reader:***@" in in_process

    cache = tmp_path / "cache"
    names = [str(p.relative_to(cache)) for p in cache.rglob("*")]
    assert names and not any(PASSWORD in n or TOKEN in n or "reader" in n for n in names)
    for p in cache.rglob("*"):
        if p.is_file():
            text = p.read_bytes()
            assert PASSWORD.encode() not in text and TOKEN.encode() not in text and API_KEY.encode() not in text, p

    registry._loaded_from = None  # as a new process would: only the config file
    registry._specs.clear()
    registry._boards.clear()
    fresh = _board_list_output()
    assert PASSWORD not in fresh and TOKEN not in fresh and web.name in fresh


def test_messages_never_show_url_credentials(tmp_path):
    with Site() as site:
        port = int(site.url.rsplit(":", 1)[1])
    dead = f"http://reader:{PASSWORD}@127.0.0.1:{port}/board?token={TOKEN}"  # nobody listens there now
    with pytest.raises(DownloadError) as info:
        boards.board_register(dead, name="dead").pin_find("")
    assert PASSWORD not in str(info.value) and TOKEN not in str(info.value)
    with pytest.raises(DownloadError) as info:
        boards.Cache(tmp_path / "c").fetch_url(dead + "/x.bin", tmp_path / "c" / "x.bin")
    assert PASSWORD not in str(info.value) and TOKEN not in str(info.value)


# ---- case 10 (config part): a full config disk ----------------------------------------------------



def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC


def test_a_full_config_disk_is_one_clear_error(tmp_path, monkeypatch, small_disk):
    disk = small_disk(tmp_path / "config-disk", "256k")
    config = disk / "pinstorm" / "boards.yaml"
    monkeypatch.setenv("PINSTORM_CONFIG", str(config))
    boards.board_register("local", name="first", path=str(tmp_path / "b1"), persist=True)
    before = config.read_text()
    _fill(disk)

    from pinstorm.cli import cli

    result = CliRunner().invoke(cli, ["board", "register", "local", "--name", "second", "--path",
                                      str(tmp_path / "b2")])
    assert result.exit_code == 1
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert f"cannot save the board config {config}" in result.output
    assert "no space left" in result.output and "bytes free" in result.output
    with pytest.raises(BoardError, match="no space left"):
        boards.board_register("local", name="third", path=str(tmp_path / "b3"), persist=True)
    assert config.read_text() == before  # the old config is intact
    assert [p.name for p in config.parent.iterdir() if p.name.startswith(".boards.yaml.")] \
        in ([], [".boards.yaml.lock"])  # no half-written temporary


# ---- the one rule, as a property ------------------------------------------------------------------

_word = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.~", min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(user=_word, password=_word.map(lambda s: "S3CR3T" + s), token=_word.map(lambda s: "T0K3N" + s),
       param=st.sampled_from(["token", "access_token", "sig", "X-Amz-Signature", "api_key", "X-Goog-Credential"]),
       path=_word, where=st.sampled_from(["url", "endpoint_url", "proxy"]))
def test_no_url_secret_survives_saving_naming_or_printing(user, password, token, param, path, where):
    from pinstorm.boards.safety import secrets

    url = f"https://{quote(user, safe='')}:{quote(password, safe='')}@host.example:8443/{path}?a=1&{param}={token}"
    clean, auth, query = secrets.split_url(url)
    assert auth == (user, password) and query == {param: token}
    kept, dropped = secrets.public({where: url, "nested": {"proxies": {"https": url}}})
    shown = secrets.redact_text(f"cannot reach {url}: boom", secrets.secret_values({where: url}))
    for text in (clean, yaml.safe_dump(kept), shown, str(boards.Cache("/tmp/x").url_path("b", url))):
        assert "S3CR3T" not in text and "T0K3N" not in text, text
    assert f"{where} (URL credentials)" in dropped
    assert clean.startswith("https://host.example:8443/") and "a=1" in clean


def test_a_pinned_url_keeps_no_credentials_in_its_data_txt_or_name(tmp_path):
    served = tmp_path / "site"
    served.mkdir()
    (served / "notes.txt").write_text("hello")
    board = boards.board_register("local", name="mine", path=tmp_path / "board")
    with boards.serve_board(served) as url:
        secret_url = url.replace("http://", f"http://user:{PASSWORD}@") + f"/notes.txt?token={TOKEN}"
        [path] = board.pin(secret_url)  # the name comes from the URL's path, never its userinfo
    assert Path(path).read_text() == "hello"
    meta = (tmp_path / "board" / "notes").rglob("data.txt")
    for text in [p.read_text() for p in meta]:
        assert PASSWORD not in text and TOKEN not in text
    assert board.pin_info("notes")["source_url"].endswith("/notes.txt")
