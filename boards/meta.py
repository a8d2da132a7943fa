"""The pins 1.x metadata of one pin version (its `data.txt`), version names and file hashes.

Kept byte-compatible with pins-python and R pins 1.x so users keep their boards: a version folder
holds the files plus a YAML `data.txt` with `api_version: 1`, `file`, `file_size`, `pin_hash`, `type`,
`title`, `description`, `created` and `user`. A `data.txt` without `api_version` is a legacy (v0) pin
whose `path` lists the files.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import struct
from pathlib import Path
from typing import Any, Iterable

import xxhash
import yaml

from .errors import MalformedMetadata
from .index import dump_yaml, load_yaml as _load_untrusted

API_VERSION = 1
TIME_FORMAT = "%Y%m%dT%H%M%SZ"
VERSION_RE = re.compile(r"^(\d{8}T\d{6}Z)-([0-9a-f]{5})$")
# Extra data.txt field (other clients ignore it): the xxh64 of each file of a multi-file pin, in
# `file` order, so a failed check names the file that differs.
FILE_HASH_FIELD = "pinstorm_file_hash"


def hash_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """xxhash64 of a file's bytes, as pins-python and R pins 1.x compute `pin_hash` for one file."""
    return _hash_file(path, xxhash.xxh64, chunk)


def hash_file128(path: str | Path, chunk: int = 1 << 20) -> str:
    """XXH3 128-bit of a file's bytes (`rlang::hash_file`), for pins that record 32-hex file hashes."""
    return _hash_file(path, xxhash.xxh3_128, chunk)


def _hash_file(path: str | Path, algo, chunk: int) -> str:
    h = algo()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def r_hash_strings(values: list[str]) -> str:
    """`rlang::hash(<character vector>)`: XXH3 128-bit of R's binary serialization (version 3)
    of the vector, header skipped, as R pins 1.x combines the file hashes of a multi-file pin.

    The serialization of a plain character vector is: STRSXP flags, length, then per element the
    CHARSXP flags (ASCII or UTF-8 mark), byte length and bytes; little-endian 32-bit integers.
    """
    out = [struct.pack("<ii", 0x10, len(values))]
    for v in values:
        raw = v.encode("utf-8")
        flags = 0x00040009 if v.isascii() else 0x00008009
        out.append(struct.pack("<ii", flags, len(raw)) + raw)
    return xxhash.xxh3_128(b"".join(out)).hexdigest()


def joined_hash(values: list[str]) -> str:
    """pins-python's (and pinstorm before 0.2's) multi-file hash: xxh64 of the joined hex hashes."""
    return xxhash.xxh64("".join(values).encode()).hexdigest()


def combine_hashes(hashes: list[str]) -> str:
    """The `pin_hash` pinstorm writes: the file's hash for one file, R pins 1.x's scheme for several
    (so R's `pin_download(hash=)` accepts pinstorm's pins)."""
    return hashes[0] if len(hashes) == 1 else r_hash_strings(hashes)


def hash_files(paths: Iterable[str | Path]) -> str:
    """The `pin_hash` of a pin's files (see `combine_hashes`)."""
    return combine_hashes([hash_file(p) for p in paths])


def hash_matches(pin_hash: str, paths: list[Path], file_hashes: list[str] | None = None) -> bool | None:
    """Whether `paths` hash to `pin_hash` under the scheme its writer used, told apart by length:
    16 hex = xxh64 (one file; several: pins-python's joined hash), 32 hex = R (one file: XXH3-128
    of the file; several: `rlang::hash` of the xxh64 or XXH3-128 file hashes). None when the scheme
    is unknown (no hash, or another length): nothing can be recomputed.
    `file_hashes`: the files' xxh64 hashes when already computed."""
    pin_hash = (pin_hash or "").lower()
    if len(pin_hash) not in (16, 32) or not paths:
        return None
    hashes = file_hashes if file_hashes is not None else [hash_file(p) for p in paths]
    if len(pin_hash) == 16:
        return (hashes[0] if len(paths) == 1 else joined_hash(hashes)) == pin_hash
    if len(paths) > 1 and r_hash_strings(hashes) == pin_hash:
        return True
    hashes128 = [hash_file128(p) for p in paths]
    return (hashes128[0] if len(paths) == 1 else r_hash_strings(hashes128)) == pin_hash


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)


def format_created(when: _dt.datetime) -> str:
    return when.astimezone(_dt.timezone.utc).strftime(TIME_FORMAT)


def version_name(created: str, pin_hash: str) -> str:
    """`YYYYmmddTHHMMSSZ-<first 5 hex of the hash>`, the pins 1.x version folder name."""
    return f"{created}-{pin_hash[:5]}"


def parse_version(version: str) -> tuple[str, str] | None:
    """(created, hash prefix) of a pins 1.x version name, or None for other folder names."""
    m = VERSION_RE.match(version)
    return (m.group(1), m.group(2)) if m else None


@dataclasses.dataclass
class PinMeta:
    """One version's metadata. `file` and `file_size` are always lists here (YAML may hold scalars)."""

    file: list[str]
    file_size: list[int]
    pin_hash: str
    type: str
    title: str | None = None
    description: str | None = None
    created: str | None = None
    user: dict = dataclasses.field(default_factory=dict)
    api_version: int = API_VERSION
    name: str | None = None  # not stored: filled in when read from a board
    version: str | None = None  # not stored: filled in when read from a board
    extra: dict = dataclasses.field(default_factory=dict)  # unknown fields, kept on round trips

    @classmethod
    def from_files(cls, files: list[Path], *, type: str, title: str | None, description: str | None,
                   user: dict | None = None, created: _dt.datetime | None = None) -> "PinMeta":
        hashes = [hash_file(f) for f in files]
        meta = cls(
            file=[Path(f).name for f in files],
            file_size=[Path(f).stat().st_size for f in files],
            pin_hash=combine_hashes(hashes),
            type=type,
            title=title,
            description=description,
            created=format_created(created or utc_now()),
            user=dict(user or {}),
        )
        if len(hashes) > 1:
            meta.extra[FILE_HASH_FIELD] = hashes
        return meta

    def file_hashes(self) -> list[str] | None:
        """The per-file xxh64 hashes recorded by pinstorm (None when absent or malformed)."""
        hashes = self.extra.get(FILE_HASH_FIELD)
        if len(self.file) == 1 and len(self.pin_hash) == 16:
            return [self.pin_hash]
        if isinstance(hashes, list) and len(hashes) == len(self.file) and all(isinstance(h, str) for h in hashes):
            return hashes
        return None

    @property
    def version_name(self) -> str:
        return version_name(self.created or format_created(utc_now()), self.pin_hash)

    def to_dict(self) -> dict[str, Any]:
        single = len(self.file) == 1
        if self.api_version == 0:  # legacy pins keep their legacy shape (no sizes, no hash)
            legacy = {"path": self.file[0] if single else list(self.file), "type": self.type,
                      "description": self.description, "title": self.title, "user": dict(self.user)}
            return {**legacy, **self.extra}
        out: dict[str, Any] = {
            "api_version": self.api_version,
            "created": self.created,
            "description": self.description,
            "file": self.file[0] if single else list(self.file),
            "file_size": (self.file_size[0] if single else list(self.file_size)) if self.file_size else None,
            "pin_hash": self.pin_hash,
            "title": self.title,
            "type": self.type,
            "user": dict(self.user),
        }
        out.update(self.extra)
        return out

    def to_yaml(self) -> str:
        return dump_yaml(self.to_dict(), sort_keys=True)

    @classmethod
    def from_yaml(cls, text: str | bytes, *, source: str = "data.txt") -> "PinMeta":
        """Parse a version's data.txt (pins 1.x, or legacy v0 with `path`), never evaluating tags."""
        try:
            raw = _load_untrusted(text, source=source)  # bounded aliases, inert tags (index.py)
        except yaml.YAMLError as e:
            raise MalformedMetadata(f"{source}: not valid YAML ({e})") from e
        if not isinstance(raw, dict):
            raise MalformedMetadata(f"{source}: expected a mapping of fields, got {type(raw).__name__}")
        return cls.from_dict(raw, source=source)

    @classmethod
    def from_dict(cls, raw: dict, *, source: str = "data.txt") -> "PinMeta":
        raw = dict(raw)
        if "api_version" not in raw:  # legacy v0 pin: `path` names the files
            files = raw.pop("path", None)
            if files is None:
                raise MalformedMetadata(f"{source}: a legacy data.txt must list its files under 'path'")
            if isinstance(files, dict):
                raise MalformedMetadata(f"{source}: 'path' must name a file or list files, got a mapping")
            files = files if isinstance(files, list) else [files]
            return cls(file=[str(f) for f in files], file_size=[], pin_hash="", api_version=0,
                       type=str(raw.pop("type", "files")), title=raw.pop("title", None),
                       description=raw.pop("description", None), created=raw.pop("created", None),
                       user=raw.pop("user", None) or {}, extra=raw)
        missing = [k for k in ("file", "type") if raw.get(k) in (None, "", [])]
        if missing:
            raise MalformedMetadata(f"{source}: missing required field(s) {', '.join(missing)}")
        files = raw.pop("file")
        if isinstance(files, dict):
            raise MalformedMetadata(f"{source}: 'file' must name a file or list files, got a mapping")
        files = [files] if isinstance(files, str) else [str(f) for f in files] if isinstance(files, list) \
            else [str(files)]
        sizes = raw.pop("file_size", None)
        sizes = [] if sizes is None else [_count(s, "file_size", source) for s in
                                          (sizes if isinstance(sizes, list) else [sizes])]
        if sizes and len(sizes) != len(files):
            raise MalformedMetadata(f"{source}: {len(files)} files but {len(sizes)} file sizes")
        for f in files:
            p = Path(f)
            if p.is_absolute() or ".." in p.parts:
                raise MalformedMetadata(f"{source}: file name {f!r} points outside the version folder")
        created = raw.pop("created", None)
        return cls(
            file=files,
            file_size=sizes,
            pin_hash=str(raw.pop("pin_hash", "") or ""),
            type=str(raw.pop("type")),
            title=raw.pop("title", None),
            description=raw.pop("description", None),
            created=str(created) if created is not None else None,
            user=raw.pop("user", None) or {},
            api_version=_count(raw.pop("api_version"), "api_version", source),
            extra=raw,
        )


_DIGITS = re.compile(r"[0-9]{1,19}")


def _count(value: Any, field: str, source: str) -> int:
    """A byte count or version number from a data.txt: a whole number in [0, 2**63), else
    MalformedMetadata naming the file (never a bare ValueError, whatever a board wrote)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        shown = f"(an integer of {value.bit_length()} bits)" if isinstance(value, int) and value.bit_length() > 64 \
            else repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
        raise MalformedMetadata(f"{source}: {field} {shown} is not a whole number of 0 to 2**63 - 1")
    return value
