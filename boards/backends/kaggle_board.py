"""Kaggle datasets and competitions as a read-only board, through the official `kaggle` client.

Pin names are Kaggle's own: `owner/dataset` for a dataset, `c/<competition>` for a competition's
data files. `pin_get` downloads into the pinstorm cache (extracting archives by default, as R pins
did) and reuses the cached copy while Kaggle reports no newer version: a dataset's versions are its
Kaggle version numbers (`000001`, `000002`, ...; `version=3` works too), a competition's version is
named after its newest file's date and a hash of its file list.

Everything goes through the official client, wrapped by `kaggle_client.py` (endpoint, sign-in,
credential chain, error translation); this module only decides what to ask for and how Kaggle's
answers become pins. File names in Kaggle's listings come from the server, so each is checked to stay
inside the pin's cache folder before anything is downloaded (`paths.py`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

import xxhash

from pinstorm.extras import ensure

from ..safety import paths, secrets
from ..storage import StorageBase
from ..cache import Cache
from ..errors import CredentialsError, InvalidPinName, PinNotFound, ReadOnlyBoard, UnsafePath, VersionNotFound
from .kaggle_client import (COMPETITION_PREFIX, ENV_ENDPOINT, PRODUCTION, KaggleClient,  # noqa: F401
                            _kaggle_api_class, competition_of, normalise_endpoint)
from ..meta import TIME_FORMAT, PinMeta

_OWNER = re.compile(r"^[A-Za-z0-9]+(?:[_-][A-Za-z0-9]+)*$")  # Kaggle allows '_' in owner slugs only
_SLUG = re.compile(r"^[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*$")
_MAX_SLUG = 100
_INFO_TTL = 60.0  # seconds a GetDataset / ListDataFiles answer is reused between list_versions and read_meta


def _utc(t: dt.datetime | None) -> dt.datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t.astimezone(dt.timezone.utc)


def _dataset_version(n: int) -> str:
    return f"{int(n):06d}"  # zero-padded so that cached versions sort by number


class KaggleStorage(StorageBase):
    """Kaggle as a board: find, get and cache datasets (`owner/dataset`) and competitions (`c/name`)."""

    kind = "kaggle"
    read_only = True

    def __init__(self, name: str = "kaggle", token: str | os.PathLike | None = None, endpoint: str | None = None,
                 cache: str | Path | Cache | None = None, retries: int = 2, page_size: int = 20):
        ensure("kaggle", "kaggle", "a Kaggle board")
        super().__init__(name, cache=cache)
        self.endpoint = normalise_endpoint(endpoint, name)
        self.token = Path(token).expanduser() if token else None
        if self.token is not None and not self.token.is_file():
            raise CredentialsError(f"kaggle board {name!r}: token file {str(self.token)!r} does not exist "
                                   "(expected a kaggle.json with username and key, or an access-token file)")
        self.retries = int(retries)
        self.page_size = int(page_size)
        self._client = KaggleClient(name, endpoint=self.endpoint, token=self.token)
        self._info: dict[str, tuple[float, Any]] = {}

    def describe(self) -> str:
        return f"kaggle ({secrets.redact_url(self.endpoint or PRODUCTION)})"

    def __getstate__(self) -> dict:  # picklable for process pools: the client signs in again there
        state = dict(self.__dict__)
        state["_info"] = {}
        return state

    @property
    def _api(self):
        """The signed-in KaggleApi, or None before the first call."""
        return self._client._api

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
        return competition_of(name)

    def _call(self, action: str, name: str | None, fn: Callable[[Any], Any], *, raw_api: bool = False) -> Any:
        """Run `fn(client)` (or `fn(api)`) through the Kaggle adapter, which translates its errors."""
        return self._client.call(action, name, fn, raw_api=raw_api)

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
            where = f"{self.describe()} (ListDataFiles)"
            for f in files:  # names come from the server: each must stay inside the version folder
                paths.check_relative(f.name, pin=name, board=where)
                if f.name == "data.txt":
                    raise UnsafePath(f"file name 'data.txt' (pin {name!r} of board {where}) is reserved for the "
                                     "pin's metadata")
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

    def download_file(self, name: str, version: str, file: str, dest: Path, offset: int = 0) -> None:
        """The official client resumes a partial `dest` itself (a Range request, guarded by the file's
        ETag in a `.kaggle-partial` marker), so `offset` needs no handling here."""
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
                    api.download_file(response, str(dest), client.http_client(), quiet=True, resume=True,
                                      max_retries=self.retries)
                finally:
                    response.close()

        self._call(f"download {file!r} of {name!r} version {version}", name, transfer, raw_api=True)

    def default_extract(self, meta: PinMeta) -> bool:
        return True  # Kaggle ships zips; R pins extracted them by default

    # ---- listing and search ---------------------------------------------------------------
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

    def search(self, text: str) -> list[dict]:
        """Kaggle's own search over datasets and competitions (first page of each)."""
        return self._search(text or "")

    def refusal(self, action: str, name: str | None) -> ReadOnlyBoard:
        if action == "pin":
            return ReadOnlyBoard(f"kaggle board {self.name!r} is read-only: cannot pin {name!r}; publish datasets "
                                 "with `kaggle datasets create` / `kaggle datasets version`")
        return ReadOnlyBoard(f"kaggle board {self.name!r} is read-only: cannot {action} {name!r}; delete datasets "
                             "on kaggle.com")
