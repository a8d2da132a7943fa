"""An Azure Blob server on 127.0.0.1: Azurite, the Azure Storage emulator, in memory, on a free port.

`.ci/install-azurite` (run by `make test`) installs it with npm into `.venv/azurite`; `$PINSTORM_AZURITE`
names another `azurite-blob` executable. Azurite is started with `--blobPort 0`, so the system picks a
free port and Azurite prints it ("successfully listens on http://127.0.0.1:PORT"): no port is guessed.

The account is declared through `AZURITE_ACCOUNTS` with a key of our own (with azure-storage-blob
12.31 Azurite's well-known default key fails to sign). `AzuriteServer.storage_options()` gives the
connection string an azure board (or adlfs) needs, pointing here or at a proxy in front of Azurite.

When Azurite is missing, `require_azurite()` skips the calling test, except under CI (`CI` set),
where it fails: CI must never pass by silently not testing the Azure board.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

from .lifecycle import LocalServer

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "pinstormtest"
KEY = base64.b64encode(b"pinstorm-azurite-test-account-key-0123456789").decode()
START_TIMEOUT = float(os.environ.get("PINSTORM_AZURITE_TIMEOUT", "60"))
_LISTENING = re.compile(r"Blob service (?:is )?successfully listens on (http://\S+)")


def executable() -> str | None:
    """The `azurite-blob` to run: `$PINSTORM_AZURITE`, else `.venv/azurite`'s, else one on PATH."""
    given = os.environ.get("PINSTORM_AZURITE")
    if given:
        return given if os.access(given, os.X_OK) else None
    local = ROOT / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if os.access(local, os.X_OK):
        return str(local)
    return shutil.which("azurite-blob")


def missing_reason() -> str | None:
    """Why Azurite cannot run here, or None when it can."""
    if executable() is None:
        return "Azurite is not installed (run .ci/install-azurite, which `make test` runs: npm install azurite@3)"
    if shutil.which("node") is None:
        return "Node.js is not installed (Azurite runs on it)"
    return None


def require_azurite() -> None:
    """Skip the calling test when Azurite is missing, or fail under CI."""
    import pytest

    reason = missing_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and the Azure board tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def connection_string(endpoint: str, account: str = ACCOUNT, key: str = KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
            f"BlobEndpoint={endpoint}/{account};")


class AzuriteServer(LocalServer):
    """azurite-blob in memory; `endpoint` is `http://127.0.0.1:PORT` (the account is a path under it)."""

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self.endpoint: str | None = None
        self._process: subprocess.Popen | None = None
        self._folder: tempfile.TemporaryDirectory | None = None
        self.output: list[str] = []  # what Azurite printed (its last lines are in a failed start's message)

    def start(self) -> "AzuriteServer":
        binary = executable()
        if binary is None:
            raise RuntimeError(missing_reason())
        self._folder = tempfile.TemporaryDirectory(prefix="azurite-")  # its working folder: nothing of it stays behind
        env = dict(os.environ, AZURITE_ACCOUNTS=f"{ACCOUNT}:{KEY}")
        self._process = subprocess.Popen(
            [binary, "--blobHost", self.host, "--blobPort", "0", "--inMemoryPersistence", "--extentMemoryLimit",
             "512", "--skipApiVersionCheck", "--disableTelemetry"],
            cwd=self._folder.name, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        found: list[str] = []
        ready = threading.Event()

        def read() -> None:  # keeps draining after start, so a chatty Azurite never blocks on a full pipe
            assert self._process is not None and self._process.stdout is not None
            for line in self._process.stdout:
                self.output.append(line.rstrip())
                del self.output[:-200]
                match = _LISTENING.search(line)
                if match and not found:
                    found.append(match.group(1).rstrip("/"))
                    ready.set()
            ready.set()  # exited

        threading.Thread(target=read, name="azurite-output", daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.wait(0.1) and time.monotonic() < deadline:
            pass
        if not found:
            tail = "\n".join(self.output[-15:])
            self.stop()
            raise RuntimeError(f"Azurite did not start within {START_TIMEOUT:.0f} s:\n{tail}")
        self.endpoint = found[0]
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if self._folder is not None:
            with contextlib.suppress(Exception):
                self._folder.cleanup()
            self._folder = None

    def connection_string(self, endpoint: str | None = None) -> str:
        """The account's connection string, for this server or a proxy (`endpoint`) in front of it."""
        return connection_string(endpoint or self.endpoint)

    def storage_options(self, endpoint: str | None = None) -> dict:
        """Options for `board_register("azure", ...)` / `board_azure` / adlfs pointing here (or at a proxy)."""
        return {"connection_string": self.connection_string(endpoint)}


def serve() -> Iterator[AzuriteServer]:
    """Generator for a pytest fixture: a started server (or a skip / CI failure without Azurite)."""
    require_azurite()
    with AzuriteServer() as server:
        yield server
