"""Azure Blob Storage: `AzureStorage`, a `BucketStorage` on adlfs with ETag-conditional index writes.

A container (or a folder in one) holds exactly the local board's layout (`<pin>/<version>/{data.txt,
files}` plus the root `data.txt` index), as S3 and GCS boards do; pins-python's `board_azure` and R's
`board_azure` read the same layout. Credentials are adlfs's (and so Azure's): `connection_string`,
`account_name` with `account_key`, `sas_token` or `credential`, `anon=True`, or the
`AZURE_STORAGE_*` environment variables, else Azure's default credential chain. They are never saved
(`secrets.public` drops them from the config file), never in messages, cache names or lineage.

The root index is written like S3's: with `If-Match: <ETag>` when one was read, with
`If-None-Match: *` when there was none, so a writer that lost the race gets 412 / 409 and reconciles
again (`fs_board.IndexConflict`) instead of overwriting another writer's entry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pinstorm.extras import require

from .. import index as board_index
from ..cache import Cache
from .cloud import BucketStorage, _check_bucket, _root, _secrets
from ..errors import BoardError, CredentialsError
from .fs_board import IndexConflict

# connection-string fields that are credentials (the rest, endpoints and the account name, are not)
_SECRET_FIELDS = ("accountkey", "sharedaccesssignature")


class AzureStorage(BucketStorage):
    """A container of an Azure storage account through adlfs; `bucket` is the container."""

    bucket_word = "container"

    def _blob_client(self, path: str) -> Any:
        container, blob, _ = self.fs.split_path(path)
        return self.fs.service_client.get_blob_client(container, blob)

    def read_index_bytes(self, path: str) -> tuple[bytes, str | None]:
        """The body and ETag of the index, from one GET (so the token matches the bytes)."""
        from azure.core.exceptions import ResourceNotFoundError
        from fsspec.asyn import sync

        async def get() -> tuple[bytes, str | None]:
            client = self._blob_client(path)
            try:
                # at most cap + 1 bytes: a bucket is written by others too, and what is parsed is bounded
                download = await client.download_blob(offset=0, length=board_index.MAX_INDEX_BYTES + 1)
            except ResourceNotFoundError as e:
                raise FileNotFoundError(path) from e
            except Exception as e:  # noqa: BLE001 - a blob of 0 bytes refuses a ranged GET (416)
                if getattr(e, "status_code", None) != 416:
                    raise
                download = await client.download_blob()
            return bytes(await download.readall()), download.properties.etag

        result: tuple[bytes, str | None] = sync(self.fs.loop, get)
        return result

    def write_index_text(self, path: str, text: str, token: str | None, existed: bool) -> None:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError
        from azure.storage.blob import ContentSettings
        from fsspec.asyn import sync

        if existed and token:
            condition: dict[str, Any] = {"overwrite": True, "etag": token,
                                         "match_condition": MatchConditions.IfNotModified}
        elif not existed:
            condition = {"overwrite": False}  # If-None-Match: *
        else:
            condition = {"overwrite": True}

        async def put() -> None:
            await self._blob_client(path).upload_blob(
                text.encode(), content_settings=ContentSettings(content_type="text/yaml"), **condition)

        try:
            sync(self.fs.loop, put)
        except (ResourceModifiedError, ResourceExistsError) as e:  # 412 ConditionNotMet / 409 BlobAlreadyExists
            raise IndexConflict() from e
        self.fresh(path)

    def _credentials_hint(self) -> str:
        return ("Give connection_string=, account_name= with account_key= / sas_token= / credential=, or "
                "set AZURE_STORAGE_CONNECTION_STRING (or the other AZURE_STORAGE_* variables)")

    def _no_bucket(self) -> BoardError:
        return BoardError(f"azure board {self.name!r}: container {self.bucket!r} does not exist"
                          f"{' at ' + self.endpoint if self.endpoint else ''}; create it, or register "
                          "the board with create_bucket=True")


def _endpoint(options: dict[str, Any]) -> str | None:
    """The account's blob endpoint, for messages: from the connection string, else the account name."""
    conn = options.get("connection_string")
    if isinstance(conn, str):
        fields = _connection_fields(conn)
        if fields.get("blobendpoint"):
            return fields["blobendpoint"].rstrip("/")
        if fields.get("accountname"):
            suffix = fields.get("endpointsuffix", "core.windows.net")
            return f"{fields.get('defaultendpointsprotocol', 'https')}://{fields['accountname']}.blob.{suffix}"
    if options.get("account_host"):
        return f"https://{options['account_host']}"
    if options.get("account_name"):
        return f"https://{options['account_name']}.blob.core.windows.net"
    return None


def _connection_fields(conn: str) -> dict[str, str]:
    fields = {}
    for part in conn.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def azure_storage(name: str, container: str, path: str = "", cache: str | Path | Cache | None = None,
                  create_bucket: bool = False, **storage_options: Any) -> AzureStorage:
    """Storage in `abfs://container/path` through adlfs.

    Options go to `adlfs.AzureBlobFileSystem`: `account_name`, `account_key`, `connection_string`,
    `sas_token`, `credential`, `anon`, `account_host`, ... (and the `AZURE_STORAGE_*` variables
    adlfs reads when an option is not given).
    """
    adlfs = require("adlfs", "azure", "an Azure Blob board")

    _check_bucket("azure", name, container)
    options = dict(storage_options)
    options["use_listings_cache"] = False
    options.setdefault("skip_instance_cache", True)  # the board's own client: credentials never shared
    conn = options.get("connection_string") or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    hidden = list(_secrets(storage_options))
    if isinstance(conn, str):  # its key and signature on their own too: a library may quote just those
        fields = _connection_fields(conn)
        hidden += [conn] + [fields[f] for f in _SECRET_FIELDS if fields.get(f)]
    try:
        fs = adlfs.AzureBlobFileSystem(**options)
    except Exception as e:  # a malformed connection string or missing credentials fail right here
        reason = " ".join(str(e).split())[:300]
        for value in sorted(hidden, key=len, reverse=True):
            if isinstance(value, str) and len(value) >= 4:
                reason = reason.replace(value, "***")
        raise CredentialsError(f"azure board {name!r} (container {container!r}): cannot set up the Azure client "
                               f"({type(e).__name__}: {reason})") from e
    board = AzureStorage(name, fs, _root(container, path), kind="azure", bucket=container,
                         endpoint=_endpoint({**options, "connection_string": conn}), secrets=tuple(hidden),
                         cache=cache)
    if create_bucket:
        board.ensure_bucket()
    return board
