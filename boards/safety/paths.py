"""Containment: paths and URLs named by remote metadata stay where they belong.

A board's metadata (the root data.txt, a version's data.txt, a legacy pin's `path:` list, a Kaggle
file listing) comes from whoever serves it. Every file name taken from it is checked here before
anything touches the disk: it must be a relative path whose resolved location stays inside the
folder it is meant for (absolute paths, `..`, a leading `~`, drive letters, backslashes and NUL are
refused), it must not name the version's own metadata file once normalised (`./data.txt`,
`data.txt/`, `DATA.TXT`, `data.txt.`: `reserved`), and a version name must be one plain path
segment. Every URL taken from it must be
http(s) on the board's own origin unless the board was registered to allow other origins; other
schemes (`file://`, fsspec protocols such as `s3://` or `memory://`) are never followed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from urllib.parse import urljoin, urlsplit

from ..errors import UnsafePath

_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=@,-]*$")
_MAX_SEGMENT = 200
# Files pinstorm itself keeps in a version folder: a pin file of that name would be overwritten by
# (or would overwrite) the version's metadata, on the board and in the cache.
RESERVED_FILES = frozenset({"data.txt"})
_RESERVED_STEMS = tuple({f.split(".", 1)[0] for f in RESERVED_FILES})  # in any name `reserved` is true of


def _where(pin: str | None, board: str | None) -> str:
    parts = []
    if pin:
        parts.append(f"pin {pin!r}")
    if board:
        parts.append(f"board {board}")
    return (" (" + " of ".join(parts) + ")") if parts else ""


def check_relative(name: object, *, what: str = "file", pin: str | None = None,
                   board: str | None = None) -> str:
    """`name` if it is a safe relative POSIX path (its form only; see `contained` for the disk)."""
    where = _where(pin, board)
    if not isinstance(name, str) or not name or name.strip() != name:
        raise UnsafePath(f"{what} name {name!r}{where} is empty, not a string or padded with spaces")
    if "\x00" in name or "\\" in name:
        raise UnsafePath(f"{what} name {name!r}{where} contains a NUL or a backslash")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or "://" in name:
        raise UnsafePath(f"{what} name {name!r}{where} is absolute; only paths inside the pin are allowed")
    parts = PurePosixPath(name).parts
    if any(p == ".." for p in name.split("/")):
        raise UnsafePath(f"{what} name {name!r}{where} climbs out of its folder ('..')")
    if parts and parts[0].startswith("~"):
        raise UnsafePath(f"{what} name {name!r}{where} points into a home folder ('~')")
    if not parts or all(p == "." for p in parts):
        raise UnsafePath(f"{what} name {name!r}{where} names no file")
    if what == "file" and reserved(name):
        raise UnsafePath(f"{what} name {name!r}{where} lands on data.txt once normalised (paths compared as "
                         "disks compare them: './', '/', case, trailing dots); that name is reserved for the "
                         "pin's metadata")
    return name


def normalise(name: str) -> str:
    """`name` as the path it lands on, lexically: backslashes as '/', empty and '.' parts dropped,
    '..' applied (`./a//b/` -> `a/b`, `a/../data.txt` -> `data.txt`). Not a safety check by itself."""
    out: list[str] = []
    for part in name.replace("\\", "/").split("/"):
        if part == "..":
            if out:
                out.pop()
        elif part not in ("", "."):
            out.append(part)
    return "/".join(out)


def reserved(name: str) -> bool:
    """Whether pin file `name` lands on a file pinstorm keeps in the version folder (`data.txt`),
    once normalised (`normalise`) and as the disks that hold boards and caches compare names:
    case-insensitively (macOS, Windows), without trailing dots and spaces and NTFS stream suffixes
    (Windows). One rule for every platform, so a board means the same everywhere."""
    if name.isascii() and not any(stem in name.lower() for stem in _RESERVED_STEMS):
        return False  # the common case, quick: normalising only drops parts, and ASCII casefolds as it lowers
    normal = normalise(name)
    if not normal or "/" in normal:
        return False
    return normal.split(":", 1)[0].rstrip(" .").casefold() in RESERVED_FILES


def contained(root: str | os.PathLike, name: object, *, what: str = "file", pin: str | None = None,
              board: str | None = None) -> Path:
    """`root / name`, resolved (symlinks too), refusing anything that lands outside `root`."""
    check_relative(name, what=what, pin=pin, board=board)
    base = Path(root).resolve()
    target = (base / str(name)).resolve()
    if target == base or not target.is_relative_to(base):
        raise UnsafePath(f"{what} name {name!r}{_where(pin, board)} resolves to {str(target)!r}, outside "
                         f"{str(base)!r}")
    return base / str(name)


def check_segment(name: object, *, what: str = "version", pin: str | None = None,
                  board: str | None = None) -> str:
    """`name` if it is one plain path segment (a version folder name): no '/', no dots-only, short."""
    if not isinstance(name, str) or not _SEGMENT.match(name) or len(name) > _MAX_SEGMENT or ".." in name:
        raise UnsafePath(f"{what} {name!r}{_where(pin, board)} is not a plain folder name (letters, digits and "
                         "'._-', not starting with '.', no '/' or '..')")
    return name


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of `url`; UnsafePath for an unparsable authority such as `//:a`."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:  # urllib parses the port lazily and raises a bare ValueError
        raise UnsafePath(f"URL {url!r} has an invalid host or port: {e}") from None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def resolve_url(base: str, ref: object, *, allow: bool | list[str] | tuple[str, ...] = False,
                what: str = "path", pin: str | None = None, board: str | None = None) -> str:
    """`ref` (relative to `base`, or absolute) as an absolute http(s) URL that the board may follow.

    Same origin as `base` (scheme, host, port) is always allowed; another origin only when `allow`
    is True (any http(s) origin) or lists it (`"https://cdn.example.org"`). Any other scheme is
    refused whatever `allow` says.
    """
    where = _where(pin, board)
    if not isinstance(ref, str) or not ref or "\x00" in ref or "\\" in ref:
        raise UnsafePath(f"{what} {ref!r}{where} is not a usable URL path")
    scheme = urlsplit(ref).scheme.lower()
    if scheme and scheme not in ("http", "https"):
        raise UnsafePath(f"{what} {ref!r}{where} uses the {scheme!r} scheme; only http(s) URLs are followed")
    url = urljoin(base if base.endswith("/") else base + "/", ref if scheme or ref.startswith("//")
                  else ref.lstrip("/"))
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        raise UnsafePath(f"{what} {ref!r}{where} does not resolve to an http(s) URL")
    if origin(url) == origin(base) or allow is True:
        return url
    allowed = {origin(a.rstrip("/") + "/") for a in (allow or [])} if not isinstance(allow, bool) else set()
    if origin(url) in allowed:
        return url
    o = origin(url)
    raise UnsafePath(f"{what} {ref!r}{where} points to another host ({o[0]}://{o[1]}:{o[2]}); register the "
                     "board with allow_external=True (or a list of allowed origins) to follow it")


def url_file_name(url: str) -> str:
    """The file name a URL pin is stored under: the URL path's last segment, made one safe segment
    (`..`, `.`, empty or odd characters become a plain name; never a path)."""
    last = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._+=@,%-]", "_", last).lstrip(".")[:_MAX_SEGMENT]
    return name if name and name != "data.txt" else "download"
