"""The adapter between pinstorm and the official Kaggle client (`kaggle` + `kagglesdk`).

Everything Kaggle-specific that is not about pins lives here: the `KaggleApi` subclass whose HTTP
clients can point at another base URL (`endpoint=` / `$PINSTORM_KAGGLE_ENDPOINT`: mirrors, proxies,
tests), the client's rules for where kaggle.json lives (evaluated when a board signs in, not when
`kaggle` was imported), reading a `token=` file, and turning the client's `requests` errors and
`exit(1)` calls into pinstorm errors that name the board, the action and the URL. The board
(`kaggle_board.py`) only says what to ask for.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ..errors import BoardError, CredentialsError, DownloadError, PinNotFound
from ..safety.secrets import redact_text

ENV_ENDPOINT = "PINSTORM_KAGGLE_ENDPOINT"
PRODUCTION = "https://api.kaggle.com"
COMPETITION_PREFIX = "c"

_import_lock = threading.Lock()
_api_class: type | None = None


def _kaggle_api_class() -> type:
    """`KaggleApi` with a settable base URL.

    Importing `kaggle` signs in with the default credentials and prints help when there are none;
    that output is swallowed here (the board reports credentials problems itself).
    """
    global _api_class
    with _import_lock:
        if _api_class is not None:
            return _api_class
        with contextlib.redirect_stdout(io.StringIO()):
            from kaggle.api.kaggle_api_extended import KaggleApi
            from kagglesdk import KaggleEnv

        class EndpointKaggleApi(KaggleApi):
            """The official API object; only the base URL of the clients it builds can change."""

            endpoint: str | None = None

            def build_kaggle_client(self):
                client = super().build_kaggle_client()
                if self.endpoint:
                    http = client.http_client()
                    if not hasattr(http, "_endpoint"):
                        raise BoardError("this kagglesdk version has no endpoint attribute on its HTTP "
                                         "client; endpoint= is not supported with it")
                    http._endpoint = self.endpoint
                    http._env = KaggleEnv.PROD  # PROD's URL shape: {endpoint}/v1/{service}/{method}
                return client

        _api_class = EndpointKaggleApi
        return _api_class


def _kaggle_config_dir() -> str:
    """Where the client looks for kaggle.json, by its rules, evaluated now (not at its import)."""
    configured = os.environ.get("KAGGLE_CONFIG_DIR")
    if configured:
        return configured
    home = os.path.join(os.path.expanduser("~"), ".kaggle")
    if sys.platform.startswith("linux") and not os.path.exists(home):
        return os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"),
                            "kaggle")
    return home


def competition_of(name: str | None) -> str | None:
    """The competition slug of a pin name `c/<competition>`, else None."""
    if not name or "/" not in name:
        return None
    owner, slug = name.split("/", 1)
    return slug if owner == COMPETITION_PREFIX else None


def normalise_endpoint(endpoint: str | None, board: str) -> str | None:
    """`endpoint` (or `$PINSTORM_KAGGLE_ENDPOINT`) as a base URL without `/v1`, or None for Kaggle."""
    endpoint = endpoint or os.environ.get(ENV_ENDPOINT) or None
    if endpoint is None:
        return None
    endpoint = str(endpoint).rstrip("/")
    if not endpoint.startswith(("http://", "https://")):
        raise BoardError(f"kaggle board {board!r}: endpoint must be an http(s) URL, got {endpoint!r}")
    return endpoint[: -len("/v1")] if endpoint.endswith("/v1") else endpoint


class KaggleClient:
    """A signed-in `KaggleApi` for one board, created on first use (so cached pins load offline)."""

    def __init__(self, board: str, *, endpoint: str | None, token: Path | None):
        self.name, self.endpoint, self.token = board, endpoint, token
        self._api = None
        self._lock = threading.RLock()

    def __getstate__(self) -> dict:  # picklable for process pools: sign in again on the other side
        return {"name": self.name, "endpoint": self.endpoint, "token": self.token}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["name"], endpoint=state["endpoint"], token=state["token"])

    @property
    def signed_in(self) -> bool:
        return self._api is not None

    def api(self):
        with self._lock:
            if self._api is None:
                self._api = self._sign_in()
            return self._api

    def _sign_in(self):
        api = _kaggle_api_class()()
        api.endpoint = self.endpoint
        api.config_dir = _kaggle_config_dir()
        api.config = os.path.join(api.config_dir, api.config_file)
        if self.token is not None:
            api.config_values = self._read_token_file(api)
            return api
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                api.authenticate()
        except SystemExit as e:
            raise CredentialsError(
                f"kaggle board {self.name!r}: no Kaggle credentials found. Set KAGGLE_API_TOKEN (or save it "
                "to ~/.kaggle/access_token), or put kaggle.json in $KAGGLE_CONFIG_DIR, ~/.kaggle or "
                "~/.config/kaggle, or set KAGGLE_USERNAME and KAGGLE_KEY, or register the board with "
                "token='path/to/kaggle.json'") from e
        except Exception as e:  # token sign-in calls the server
            raise self._translate(e, "sign in", None) from e
        return api

    def _read_token_file(self, api) -> dict:
        text = self.token.read_text().strip()
        if not text:
            raise CredentialsError(f"kaggle board {self.name!r}: token file {str(self.token)!r} is empty")
        if text.startswith("{"):
            try:
                data = json.loads(text)
                return {api.CONFIG_NAME_USER: str(data["username"]), api.CONFIG_NAME_KEY: str(data["key"])}
            except (ValueError, KeyError, TypeError) as e:
                raise CredentialsError(f"kaggle board {self.name!r}: token file {str(self.token)!r} is not a "
                                       "kaggle.json with 'username' and 'key'") from e
        if any(c.isspace() for c in text):
            raise CredentialsError(f"kaggle board {self.name!r}: token file {str(self.token)!r} is neither a "
                                   "kaggle.json nor a single access token")
        return {api.CONFIG_NAME_TOKEN: text}

    def _translate(self, e: BaseException, action: str, name: str | None) -> Exception:
        import requests

        base = redact_text(self.endpoint or PRODUCTION)
        if isinstance(e, BoardError):
            return e
        if isinstance(e, requests.HTTPError):
            response = getattr(e, "response", None)
            status = getattr(response, "status_code", None)
            url = redact_text(getattr(response, "url", None) or base)  # a signed download URL carries a key
            detail = redact_text(str(e).splitlines()[0])[:200] if str(e) else ""
            if status in (401, 403):
                hint = (" (for a competition, also accept its rules on kaggle.com)"
                        if name and competition_of(name) else "")
                return CredentialsError(f"kaggle board {self.name!r}: HTTP {status} from {url} while trying to "
                                        f"{action}: Kaggle refused the credentials{hint}: {detail}")
            if status == 404 and "/v1/" not in str(url):  # the file behind Kaggle's redirect is gone
                return DownloadError(f"kaggle board {self.name!r}: HTTP 404 from {url} while trying to {action} "
                                     "(the file Kaggle redirected to is missing)", url=url, status=404)
            if status == 404:
                what = (f"competition {competition_of(name)!r}" if name and competition_of(name)
                        else f"dataset {name!r}" if name else "resource")
                return PinNotFound(f"kaggle board {self.name!r}: no {what} (HTTP 404 from {url}): {detail}")
            return DownloadError(f"kaggle board {self.name!r}: HTTP {status} from {url} while trying to "
                                 f"{action}: {detail}", url=url, status=status)
        if isinstance(e, (requests.ConnectionError, requests.Timeout)):
            return DownloadError(f"kaggle board {self.name!r}: cannot reach {base} to {action}: "
                                 f"{type(e).__name__}", url=base)
        if isinstance(e, (requests.RequestException, OSError)) or \
                (isinstance(e, ValueError) and "does not match expected size" in str(e)):
            return DownloadError(f"kaggle board {self.name!r}: transfer failed while trying to {action} "
                                 f"(truncated or broken body): {type(e).__name__}: {redact_text(str(e))[:200]}",
                                 url=base)
        return DownloadError(f"kaggle board {self.name!r}: {action} failed: {type(e).__name__}: "
                             f"{redact_text(str(e))[:200]}", url=base)

    def call(self, action: str, name: str | None, fn: Callable[[Any], Any], *, raw_api: bool = False) -> Any:
        """Run `fn(client)` with a fresh kagglesdk client (or `fn(api)`), translating the client's errors."""
        try:
            api = self.api()
            if raw_api:
                return fn(api)
            with api.build_kaggle_client() as client:
                return fn(client)
        except (BoardError, KeyboardInterrupt):
            raise
        except SystemExit as e:
            raise CredentialsError(f"kaggle board {self.name!r}: the Kaggle client gave up while trying to "
                                   f"{action} (exit {e.code})") from e
        except Exception as e:  # noqa: BLE001 - the client raises requests' errors and ValueError
            raise self._translate(e, action, name) from e

