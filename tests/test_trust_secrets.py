"""No credential leaves the machine: a run trained with every kind of secret (URL userinfo, secret
storage options, headers, session tokens) is pinned, profiled and reported, and not one byte of the
secrets is found on the board, in the output folders, in the JSON summaries, in the logs or on the
terminal. The datasets are served by real servers that refuse a request without those credentials
(moto's S3, and an HTTP server that checks Basic auth and an API-key header)."""

from __future__ import annotations

import base64
import functools
import json
import logging
import threading
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from pinstorm.boards.safety import secrets
from pinstorm.boards.serve import RangeRequestHandler
from training_support import NO_FLIP, TINY

pytest_plugins = ["conftest_training"]

pytestmark = pytest.mark.slow


def _secret(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


def _leaks(roots: list[Path], texts: list[str], secrets_: list[str]) -> list[str]:
    """Every file under `roots` and every text that holds one of `secrets_` (raw, or URL- or base64-encoded)."""
    from urllib.parse import quote

    forms = {s for s in secrets_} | {quote(s, safe="") for s in secrets_} | {base64.b64encode(s.encode()).decode()
                                                                           for s in secrets_}
    found = []
    for root in roots:
        for path in (p for p in Path(root).rglob("*") if p.is_file()):
            data = path.read_bytes()
            if path.suffix == ".zip":   # tensorboard.zip: look inside too
                import zipfile

                with zipfile.ZipFile(path) as archive:
                    data += b"".join(archive.read(n) for n in archive.namelist())
            found += [f"{path}: {f[:12]}..." for f in forms if f.encode() in data]
    for i, text in enumerate(texts):
        found += [f"text {i}: {f[:12]}..." for f in forms if f in text]
    return found


@pytest.fixture
def digits_site(tmp_path):
    """The digits converted into a served folder: (folder holding `ds`, rows)."""
    from pinstorm.pipeline import convert, make_digits_tree, scan

    layout = scan(make_digits_tree(tmp_path / "tree", image_size=32, per_class=10, seed=0))
    result = convert(layout, str(tmp_path / "site" / "ds"), split="train", min_row_groups=2, progress=False)
    return tmp_path / "site", result.rows


@pytest.fixture
def guarded_http(digits_site):
    """The site behind an HTTP server that answers 401 unless Basic auth and an API-key header are right."""
    user, password, api_key, bearer = "alice", _secret("PASSWORD"), _secret("APIKEY"), _secret("BEARER")
    basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Guarded(RangeRequestHandler):
        def send_head(self):
            if self.headers.get("Authorization") != basic or self.headers.get("X-Api-Key") != api_key \
                    or self.headers.get("X-Session") != bearer:
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return super().send_head()

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Guarded, directory=str(digits_site[0])))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield {"url": f"http://{user}:{password}@127.0.0.1:{server.server_address[1]}/ds",
               "storage_options": {"headers": {"X-Api-Key": api_key, "X-Session": bearer}},
               "secrets": [password, api_key, bearer]}
    finally:
        server.shutdown()
        server.server_close()


def test_a_run_on_an_http_dataset_with_userinfo_and_header_secrets_writes_none_of_them(
        two_cpu_devices, guarded_http, board, tmp_path, capfd, caplog):
    from pinstorm import boards
    from pinstorm.training import experiment_lineage, make_strategy, profile, train

    caplog.set_level(logging.DEBUG, logger="pinstorm")
    options = {**NO_FLIP, "storage_options": guarded_http["storage_options"]}
    user_token = _secret("LINEAGE-TOKEN")
    result = train("alexnet", guarded_http["url"], strategy=make_strategy("mirrored", devices=2), epochs=1,
                   steps_per_epoch=2, input_options=options, verbose=0, seed=0, output_dir=tmp_path / "run",
                   pin=f"{board}/http-run", lineage={"note": "ok", "api_token": user_token}, **TINY)
    report = profile(guarded_http["url"], model_name="alexnet", model_kwargs=TINY["model_kwargs"], image_size=32,
                     batch_size=8, steps=2, max_rows=40, input_options=options, output_dir=tmp_path / "profile",
                     strategy=make_strategy("one-device"))
    lineage = experiment_lineage(f"{board}/http-run")
    found = boards.pin_find("http-run", board=board)

    # what was read is still said, without the credentials
    assert lineage["data"]["url"].startswith("http://alice:***@127.0.0.1:") and lineage["data"]["rows"] > 0
    assert lineage["arguments"]["input_options"]["storage_options"]["headers"] == {"X-Api-Key": "***",
                                                                                     "X-Session": "***"}
    assert lineage["lineage"] == {"note": "ok", "api_token": "***"}
    assert "alice:***@" in found["description"][0]
    assert json.loads(Path(report.json_path).read_text())["settings"]["dataset"].startswith("http://alice:***@")

    out, err = capfd.readouterr()
    texts = [out, err, caplog.text, json.dumps(result.summary()), json.dumps(report.summary()), repr(found),
             json.dumps(result.experiment, default=str)]
    assert _leaks([tmp_path / "board", tmp_path / "run", tmp_path / "profile", tmp_path / "cache"], texts,
                  guarded_http["secrets"] + [user_token]) == []


@pytest.fixture(scope="module")
def s3_server():
    from servers import s3

    yield from s3.serve()


def test_a_run_on_s3_with_secret_storage_options_reads_with_them_and_writes_none_of_them(
        two_cpu_devices, s3_server, digits_site, board, tmp_path, monkeypatch, capfd, caplog):
    """No AWS variables, files or instance metadata: the dataset's info is read with the fit's own options."""
    import s3fs

    from pinstorm.pipeline import convert, make_digits_tree, scan
    from pinstorm.training import experiment_lineage, make_strategy, train

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    caplog.set_level(logging.DEBUG, logger="pinstorm")
    key, secret, token = _secret("AKIA"), _secret("S3SECRET"), _secret("SESSIONTOKEN")
    options = {"key": key, "secret": secret, "token": token, "client_kwargs": {"endpoint_url": s3_server.endpoint}}
    bucket = f"ds-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(**options).mkdir(bucket)
    layout = scan(make_digits_tree(tmp_path / "tree", image_size=32, per_class=10, seed=0))
    convert(layout, f"s3://{bucket}/ds", split="train", min_row_groups=2, progress=False, storage_options=options)

    result = train("alexnet", f"s3://{bucket}/ds", strategy=make_strategy("one-device"), epochs=1, steps_per_epoch=2,
                   input_options={**NO_FLIP, "storage_options": options}, verbose=0, seed=0,
                   output_dir=tmp_path / "run", pin=f"{board}/s3-run", **TINY)
    lineage = experiment_lineage(f"{board}/s3-run")
    assert lineage["data"]["rows"] > 0 and "info_error" not in lineage["data"]   # read with the fit's options
    assert lineage["arguments"]["input_options"]["storage_options"] == {
        "key": "***", "secret": "***", "token": "***", "client_kwargs": {"endpoint_url": s3_server.endpoint}}
    out, err = capfd.readouterr()
    texts = [out, err, caplog.text, json.dumps(result.summary())]
    assert _leaks([tmp_path / "board", tmp_path / "run", tmp_path / "cache"], texts, [key, secret, token]) == []


@pytest.mark.parametrize("value, expected", [
    ({"storage_options": {"key": "AKIA-1", "secret": "s3cret-1", "anon": False, "token": "anon"}},
     {"storage_options": {"key": "***", "secret": "***", "anon": False, "token": "anon"}}),
    ({"url": "https://bob:pw-123456@h/x?token=tok-123456&page=2"}, {"url": "https://bob:***@h/x?token=***&page=2"}),
    ({"headers": [["Authorization", "Bearer abcdef"], ["Accept", "*/*"]]},
     {"headers": [["Authorization", "***"], ["Accept", "*/*"]]}),
    ({"password": "hunter22", "info_error": "OSError: login hunter22 refused"},
     {"password": "***", "info_error": "OSError: login *** refused"}),
    (["s3://b/k", {"credentials": {"client_email": "x", "private_key": "-----BEGIN"}}],
     ["s3://b/k", {"credentials": "***"}]),
])
def test_scrub_is_the_one_rule_for_what_is_written(value, expected):
    assert secrets.scrub(value) == expected


def test_log_records_of_pinstorm_modules_lose_url_passwords(caplog):
    from pinstorm.training import fit   # noqa: F401  (its logger is made with the rule)

    caplog.set_level(logging.INFO)
    logging.getLogger("pinstorm.training").info("reading %s", "http://u:pass-99999@h/ds?sig=abcdef")
    assert "pass-99999" not in caplog.text and "abcdef" not in caplog.text and "u:***@h" in caplog.text
