"""What users get back about a version: `PinMetadata` (R's `pin_meta()` list and pins-python's
`Meta` in one object) and `VersionInfo` (a version name that also reads as pins-python's `Version`).

`meta["version"]` is the version's name, as in R; `meta.version.version`, `meta.version.created`
and `meta.version.hash` work as in pins-python, because the name is a `str` that carries them.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from .meta import TIME_FORMAT, parse_version


class VersionInfo(str):
    """A version name (`20240101T000000Z-ab12c`) with pins-python's `Version` attributes: `created`
    is the name's time as a naive datetime (UTC, as pins-python parses it), `hash` the name's
    five-character hash suffix, or the whole pin hash on the metadata `pin_write` returns (both as
    pins-python's)."""

    full_hash: str = ""

    @classmethod
    def of(cls, name: str, pin_hash: str | None = None) -> "VersionInfo":
        """The `VersionInfo` of a version name.

        Args:
            name: The version name.
            pin_hash: The version's whole pin hash, kept as `hash` when it starts with the name's suffix.
        """
        out = cls(name)
        parsed = parse_version(name)
        if pin_hash and parsed and str(pin_hash).startswith(parsed[1]):
            out.full_hash = str(pin_hash)
        return out

    @property
    def version(self) -> str:
        return str(self)

    @property
    def created(self) -> _dt.datetime | None:
        """When the version was created (UTC, naive as pins-python's), from its name; None for a
        hand-made folder name."""
        parsed = parse_version(self)
        return _dt.datetime.strptime(parsed[0], TIME_FORMAT) if parsed else None

    @property
    def hash(self) -> str:
        if self.full_hash:
            return self.full_hash
        parsed = parse_version(self)
        return parsed[1] if parsed else ""

    def to_dict(self) -> dict[str, Any]:
        return {"version": str(self), "created": self.created, "hash": self.hash}


def version_time(version: str) -> float | None:
    """Epoch seconds of the time in a version's name; None when the name holds no time."""
    created = VersionInfo(version).created
    return created.replace(tzinfo=_dt.timezone.utc).timestamp() if created else None


def created_timestamp(value: Any) -> Any:
    """A data.txt `created` value as a pandas timestamp (NaT when it is not pins' format)."""
    import pandas as pd  # loads when a DataFrame is made (see drivers.py)

    try:
        return pd.to_datetime(str(value), format=TIME_FORMAT, utc=True)
    except (ValueError, TypeError):
        return pd.NaT


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, (str, int, float)) else list(value)


class PinMetadata(dict[str, Any]):
    """A version's metadata as R's `pin_meta()` gives it: every data.txt field (`title`,
    `description`, `created`, `pin_hash`, `file`, `file_size`, `type`, `api_version`, `user`, `tags`,
    `urls`, and any other) plus `name`, `version`, `board` and `local`. Fields read as keys or
    attributes (`meta["user"]`, `meta.user`), so R and pins-python habits both work; `meta.version`
    is a `VersionInfo` and `meta.to_dict()` a plain dict, as pins-python's `Meta` has them."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    # pins-python's: a `Meta` that pin_write returns carries the whole pin hash as `version.hash`; one
    # read back (pin_meta) has the version name's five characters
    _fresh: bool = False

    @property
    def version(self) -> VersionInfo:
        return VersionInfo.of(self.get("version") or "", self.get("pin_hash") if self._fresh else None)

    @property
    def local(self) -> dict[str, Any]:
        """Where this version is on this machine: `dir` (None until fetched), `version`, `board`."""
        return dict(self.get("local") or {})

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                for k, v in self.items()}

    def __repr__(self) -> str:
        from .display import meta_text

        return meta_text(self)

    def _repr_html_(self) -> str:
        from .display import meta_html

        return meta_html(self)
