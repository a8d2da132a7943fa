"""Kaggle datasets and competitions as a read-only board, through the official `kaggle` client.

Pin names are Kaggle's own: `owner/dataset` for a dataset, `c/<competition>` for a competition's
data files. `pin_get` downloads into the pinstorm cache (extracting archives by default, as R pins
did) and reuses the cached copy while Kaggle reports no newer version: a dataset's versions are its
Kaggle version numbers (`000001`, `000002`, ...; `version=3` works too), a competition's version is
named after its newest file's date and a hash of its file list.

Everything goes through `kaggle.api.KaggleApi` and `kagglesdk` (sign-in, requests, redirects,
resumable downloads). The client has no setting for its base URL; `endpoint=` (or
`$PINSTORM_KAGGLE_ENDPOINT`) sets it on the client's own HTTP-client object, for mirrors, proxies
and tests. Credentials follow the client's chain (`KAGGLE_API_TOKEN`, `~/.kaggle/access_token`,
`kaggle.json` in `$KAGGLE_CONFIG_DIR` / `~/.kaggle` / `~/.config/kaggle`, `KAGGLE_USERNAME` +
`KAGGLE_KEY`) unless `token=` names a kaggle.json or access-token file. Where the client would print
help and `exit(1)`, this board raises `CredentialsError`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import xxhash

from .board import FIND_COLUMNS, Board
from .cache import Cache
from .errors import (BoardError, CredentialsError, DownloadError, InvalidPinName, PinNotFound, ReadOnlyBoard,
                     VersionNotFound)
from .meta import TIME_FORMAT, PinMeta

ENV_ENDPOINT = "PINSTORM_KAGGLE_ENDPOINT"
PRODUCTION = "https://api.kaggle.com"
COMPETITION_PREFIX = "c"
_OWNER = re.compile(r"^[A-Za-z0-9]+(?:[_-][A-Za-z0-9]+)*$")  # Kaggle allows '_' in owner slugs only
_SLUG = re.compile(r"^[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*$")
_MAX_SLUG = 100
_INFO_TTL = 60.0  # seconds a GetDataset / ListDataFiles answer is reused between list_versions and read_meta

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


def _utc(t: dt.datetime | None) -> dt.datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t.astimezone(dt.timezone.utc)


def _dataset_version(n: int) -> str:
    return f"{int(n):06d}"  # zero-padded so that cached versions sort by number


class KaggleBoard(Board):
    """Kaggle as a board: find, get and cache datasets (`owner/dataset`) and competitions (`c/name`)."""

    kind = "kaggle"
    read_only = True

    def __init__(self, name: str = "kaggle", token: str | os.PathLike | None = None, endpoint: str | None = None,
                 cache: str | Path | Cache | None = None, versions: bool = True, retries: int = 2,
                 page_size: int = 20):
        super().__init__(name, cache=cache, versions=versions)
        endpoint = endpoint or os.environ.get(ENV_ENDPOINT) or None
        if endpoint is not None:
            endpoint = str(endpoint).rstrip("/")
            if not endpoint.startswith(("http://", "https://")):
                raise BoardError(f"kaggle board {name!r}: endpoint must be an http(s) URL, got {endpoint!r}")
            endpoint = endpoint[: -len("/v1")] if endpoint.endswith("/v1") else endpoint
        self.endpoint = endpoint
        self.token = Path(token).expanduser() if token else None
        if self.token is not None and not self.token.is_file():
            raise CredentialsError(f"kaggle board {name!r}: token file {str(self.token)!r} does not exist "
                                   "(expected a kaggle.json with username and key, or an access-token file)")
        self.retries = int(retries)
        self.page_size = int(page_size)
        self._api = None
        self._lock = threading.RLock()
        self._info: dict[str, tuple[float, Any]] = {}

    def describe(self) -> str:
        return f"kaggle ({self.endpoint or PRODUCTION})"

    def __getstate__(self) -> dict:  # picklable for process pools: sign in again on the other side
        state = dict(self.__dict__)
        state.update(_api=None, _lock=None, _info={})
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # ---- names ----------------------------------------------------------------------------
    def check_name(self, name: str) -> str:
        if not isinstance(name, str) or name.count("/") != 1:
            raise InvalidPinName(f"Kaggle pin names are 'owner/dataset' or 'c/competition', got {name!r}")
        owner, slug = name.split("/")
        if not (_OWNER.match(owner) and _SLUG.match(slug)) or len(owner) > _MAX_SLUG or len(slug) > _MAX_SLUG:
            raise InvalidPinName(f"Kaggle pin name {name!r}: owner and slug must be letters and digits joined "
                                 "by single '-' (owners may also use '_'), e.g. 'owner/my-dataset' or 'c/titanic'")
        return name

    @staticmethod
    def _competition(name: str) -> str | None:
        owner, slug = name.split("/")
        return slug if owner == COMPETITION_PREFIX else None

    # ---- the official client --------------------------------------------------------------
    def _kaggle(self):
        """The signed-in `KaggleApi`, created on first use (so a cached pin loads offline)."""
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

        base = self.endpoint or PRODUCTION
        if isinstance(e, BoardError):
            return e
        if isinstance(e, requests.HTTPError):
            response = getattr(e, "response", None)
            status = getattr(response, "status_code", None)
            url = getattr(response, "url", None) or base
            detail = str(e).splitlines()[0][:200] if str(e) else ""
            if status in (401, 403):
                hint = (" (for a competition, also accept its rules on kaggle.com)"
                        if name and self._competition(name) else "")
                return CredentialsError(f"kaggle board {self.name!r}: HTTP {status} from {url} while trying to "
                                        f"{action}: Kaggle refused the credentials{hint}: {detail}")
            if status == 404 and "/v1/" not in str(url):  # the file behind Kaggle's redirect is gone
                return DownloadError(f"kaggle board {self.name!r}: HTTP 404 from {url} while trying to {action} "
                                     "(the file Kaggle redirected to is missing)", url=url, status=404)
            if status == 404:
                what = (f"competition {self._competition(name)!r}" if name and self._competition(name)
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
                                 f"(truncated or broken body): {type(e).__name__}: {str(e)[:200]}", url=base)
        return DownloadError(f"kaggle board {self.name!r}: {action} failed: {type(e).__name__}: {str(e)[:200]}",
                             url=base)

    def _call(self, action: str, name: str | None, fn: Callable[[Any], Any], *, raw_api: bool = False) -> Any:
        """Run `fn(client)` with a fresh kagglesdk client (or `fn(api)`), translating the client's errors."""
        try:
            api = self._kaggle()
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

    # ---- Kaggle facts ---------------------------------------------------------------------
    def _remember(self, name: str, value: Any) -> Any:
        self._info[name] = (time.monotonic(), value)
        return value

    def _recall(self, name: str) -> Any | None:
        hit = self._info.get(name)
        return hit[1] if hit and time.monotonic() - hit[0] < _INFO_TTL else None

    def _dataset(self, name: str):
        from kagglesdk.datasets.types.dataset_api_service import ApiGetDatasetRequest

        owner, slug = name.split("/")

        def get(client):
            request = ApiGetDatasetRequest()
            request.owner_slug, request.dataset_slug = owner, slug
            return client.datasets.dataset_api_client.get_dataset(request)

        return self._remember(name, self._call(f"look up dataset {name!r}", name, get))

    def _competition_files(self, name: str) -> list:
        from kagglesdk.competitions.types.competition_api_service import ApiListDataFilesRequest

        competition = self._competition(name)

        def list_all(client):
            files, token = [], None
            while True:
                request = ApiListDataFilesRequest()
                request.competition_name = competition
                request.page_size = 200
                if token:
                    request.page_token = token
                response = client.competitions.competition_api_client.list_data_files(request)
                files += list(response.files)
                token = response.next_page_token
                if not token:
                    return files

        files = self._call(f"list the files of competition {competition!r}", name, list_all)
        if not files:
            raise PinNotFound(f"kaggle board {self.name!r}: competition {competition!r} has no data files")
        return self._remember(name, files)

    @staticmethod
    def _files_version(files: list) -> str:
        newest = max((_utc(f.creation_date) for f in files if f.creation_date), default=None)
        stamp = (newest or dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)).strftime(TIME_FORMAT)
        listing = json.dumps(sorted((f.name, f.total_bytes, str(f.creation_date)) for f in files))
        return f"{stamp}-{xxhash.xxh64(listing.encode()).hexdigest()[:5]}"

    # ---- primitives -----------------------------------------------------------------------
    def list_versions(self, name: str) -> list[str]:
        name = self.check_name(name)
        if self._competition(name):
            return [self._files_version(self._competition_files(name))]
        dataset = self._dataset(name)
        latest = dataset.current_version_number or 1
        return [_dataset_version(i) for i in range(1, latest + 1)]

    def resolve_version(self, name: str, version: Any, versions: list[str]) -> str:
        if version is not None and not self._competition(name) and str(version).lstrip("v").isdigit():
            version = _dataset_version(int(str(version).lstrip("v")))
        return super().resolve_version(name, version, versions)

    def read_meta(self, name: str, version: str) -> PinMeta:
        name = self.check_name(name)
        if self._competition(name):
            files = self._recall(name) or self._competition_files(name)
            current = self._files_version(files)
            if version != current:
                raise VersionNotFound(f"kaggle board {self.name!r}: competition {name!r} now has files version "
                                      f"{current}; {version} is no longer downloadable")
            meta = PinMeta(file=[f.name for f in files], file_size=[int(f.total_bytes) for f in files],
                           pin_hash="", type="file", title=f"Kaggle competition {self._competition(name)}",
                           description=f"data files of the Kaggle competition {self._competition(name)}",
                           created=version.split("-")[0])
            meta.extra.update(kaggle_ref=name, kaggle_competition=self._competition(name))
        else:
            dataset = self._recall(name) or self._dataset(name)
            owner, slug = name.split("/")
            number = int(version)
            latest = dataset.current_version_number or 1
            updated = _utc(dataset.last_updated) if number == latest else None
            meta = PinMeta(file=[f"{slug}.zip"], file_size=[], pin_hash="", type="file",
                           title=dataset.title or slug, description=dataset.subtitle or "",
                           created=updated.strftime(TIME_FORMAT) if updated else None)
            meta.extra.update(kaggle_ref=name, kaggle_version=number)
            if dataset.url:
                meta.extra["kaggle_url"] = dataset.url
        meta.name, meta.version = name, version
        return meta

    def download_file(self, name: str, version: str, file: str, dest: Path) -> None:
        competition = self._competition(name)
        if competition:
            from kagglesdk.competitions.types.competition_api_service import ApiDownloadDataFileRequest

            request = ApiDownloadDataFileRequest()
            request.competition_name, request.file_name = competition, file

            def ask(client):
                return client.competitions.competition_api_client.download_data_file(request)
        else:
            from kagglesdk.datasets.types.dataset_api_service import ApiDownloadDatasetRequest

            owner, slug = name.split("/")
            request = ApiDownloadDatasetRequest()
            request.owner_slug, request.dataset_slug = owner, slug
            request.dataset_version_number = int(version)

            def ask(client):
                return client.datasets.dataset_api_client.download_dataset(request)

        def transfer(api):
            with api.build_kaggle_client() as client:
                response = ask(client)  # the client follows Kaggle's 302 to the file
                try:
                    api.download_file(response, str(dest), client.http_client(), quiet=True, resume=False,
                                      max_retries=self.retries)
                finally:
                    response.close()

        self._call(f"download {file!r} of {name!r} version {version}", name, transfer, raw_api=True)

    def default_extract(self, meta: PinMeta) -> bool:
        return True  # Kaggle ships zips; R pins extracted them by default

    # ---- user-facing overrides ------------------------------------------------------------
    def list_entries(self) -> list[dict]:
        return self._search("")

    def _search(self, text: str) -> list[dict]:
        def find(api):
            datasets = api.dataset_list(search=text or None) or []
            competitions = api.competitions_list(search=text or None, page_size=self.page_size)
            return datasets, list(getattr(competitions, "competitions", None) or [])

        datasets, competitions = self._call(f"search for {text!r}", None, find, raw_api=True)
        entries = []
        for d in datasets:
            entries.append({"name": d.ref, "title": d.title or d.ref, "description": d.subtitle or d.title or "",
                            "type": "files", "kind": "dataset", "url": d.url,
                            "last_updated": _utc(d.last_updated), "total_bytes": d.total_bytes,
                            "version": _dataset_version(d.current_version_number or 1)})
        for c in competitions:
            slug = (c.ref or c.url or "").rstrip("/").split("/")[-1]
            if not slug:
                continue
            entries.append({"name": f"{COMPETITION_PREFIX}/{slug}", "title": c.title or slug,
                            "description": c.title or c.description or "", "type": "files",
                            "kind": "competition", "url": c.url, "deadline": _utc(c.deadline),
                            "category": c.category, "reward": c.reward})
        return entries

    def pin_find(self, text: str = "", name: str | None = None, extended: bool = False) -> pd.DataFrame:
        """Kaggle's own search over datasets and competitions (first page of each)."""
        rows = []
        for e in self._search(text or ""):
            if name is not None and e["name"] != name:
                continue
            row = {"name": e["name"], "description": e["description"], "type": e["type"], "board": self.name}
            if extended:
                row.update({k: v for k, v in e.items() if k not in row})
            rows.append(row)
        df = pd.DataFrame(rows)
        return df if extended and rows else df.reindex(columns=FIND_COLUMNS)

    def pin(self, x: Any, name: str | None = None, *args, **kwargs) -> Any:
        raise ReadOnlyBoard(f"kaggle board {self.name!r} is read-only: cannot pin {name!r}; publish datasets "
                            "with `kaggle datasets create` / `kaggle datasets version`")

    def pin_remove(self, name: str, version: str | None = None) -> None:
        raise ReadOnlyBoard(f"kaggle board {self.name!r} is read-only: cannot remove {name!r}; delete datasets "
                            "on kaggle.com")
