"""Text and HTML views of boards and pin metadata, for terminals (`repr`) and notebooks (`_repr_html_`).

A repr runs whenever a notebook shows a value, so these views are cheap and never raise: a board
lists its index once and reads the metadata of the first `PIN_ROWS` pins only (a remote board pays
one request per pin shown, an ImageNet board of 21,841 pins reads 20), and a listing that fails
(offline, refused) is shown as one line instead of an exception. Everything shown comes from a
board someone else may write, so values are cut to a length, control characters are escaped in text
and every value is `html.escape`d in HTML; locations and errors are shown with secrets masked.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, TypeVar

from .safety import paths, secrets
from .meta import TIME_FORMAT, PinMeta

PIN_ROWS = 20  # pins whose details a board view reads and shows
META_FILES = 5  # files a metadata view names
USER_FIELDS = 5  # user metadata fields a metadata view names
MAX_VALUE = 120  # characters of one shown value (a description, a title, an error)
PIN_COLUMNS = ("name", "latest version", "versions", "size", "created")
T = TypeVar("T")


class _Cache(Protocol):
    @property
    def root(self) -> Path: ...


class ShownBoard(Protocol):
    """What a view needs of a board (`Board` has it; a protocol keeps display.py free of board.py)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def spec(self) -> dict[str, Any]: ...
    @property
    def cache(self) -> _Cache: ...
    def describe(self) -> str: ...
    def check_name(self, name: str) -> str: ...
    def list_entries(self) -> list[dict[str, Any]]: ...
    def list_versions(self, name: str) -> list[str]: ...
    def read_meta(self, name: str, version: str) -> PinMeta: ...


@dataclasses.dataclass
class PinRow:
    """One shown pin; `error` replaces the details that could not be read."""

    name: str
    latest: str = ""
    versions: int | None = None
    size: int | None = None
    created: str = ""
    error: str = ""

    def cells(self) -> tuple[str, str, str, str, str]:
        if self.error:
            return self.name, self.error, "", "", ""
        return (self.name, self.latest, "" if self.versions is None else str(self.versions),
                "" if self.size is None else human_size(self.size), self.created)


@dataclasses.dataclass
class BoardView:
    """A board as shown: identity, where it is, and the first pins (or why they could not be listed)."""

    name: str
    kind: str
    location: str
    read_only: bool | None
    cache: str
    count: int | None = None
    rows: list[PinRow] = dataclasses.field(default_factory=list)
    error: str = ""

    @property
    def more(self) -> int:
        return (self.count or 0) - len(self.rows)

    def pins_line(self) -> str:
        if self.error:
            return f"not listed ({self.error})"
        shown = f" (first {len(self.rows)} shown)" if self.more > 0 else ""
        return f"{self.count}{shown}"

    def access(self) -> str:
        return "unknown access" if self.read_only is None else "read-only" if self.read_only else "read-write"


# ---- reading, bounded and failure-proof -----------------------------------------------------
def view_board(board: ShownBoard, limit: int = PIN_ROWS) -> BoardView:
    """The board's view: one listing of its index, then the latest metadata of `limit` pins."""
    scrub = _secret_values(board)
    read_only: bool | None = _attempt(lambda: bool(board.read_only), None)
    view = BoardView(name=clean(_attempt(lambda: board.name, "?")), kind=clean(_attempt(lambda: board.kind, "?")),
                     location=clean(secrets.redact_text(_attempt(board.describe, "?"), scrub), MAX_VALUE * 2),
                     read_only=read_only, cache=clean(_attempt(lambda: str(board.cache.root), "?"), MAX_VALUE * 2))
    try:
        entries = board.list_entries()
    except Exception as e:  # a repr must not raise: offline, refused, malformed -- shown instead
        view.error = one_line(e, scrub)
        return view
    view.count = len(entries)
    view.rows = [_pin_row(board, entry, scrub) for entry in entries[:limit]]
    return view


def _pin_row(board: ShownBoard, entry: Mapping[str, Any], scrub: tuple[str, ...]) -> PinRow:
    name = str(entry.get("name") or "")
    row = PinRow(name=clean(name, 60))
    try:
        board.check_name(name)  # what an index lists is untrusted: only checked names and versions are read
        latest = _latest_listed(entry)
        if latest is None:  # the index does not say: ask the board (a request on a remote one)
            versions = board.list_versions(name)
            latest, row.versions = versions[-1], len(versions)
        else:
            latest = paths.check_segment(latest, pin=name)
            row.versions = len(entry["versions"]) if isinstance(entry.get("versions"), list) else None
        row.latest = clean(latest, 60)
        meta = board.read_meta(name, latest)
        row.size = sum(int(s) for s in meta.file_size if isinstance(s, (int, float)))
        row.created = human_time(meta.created)
    except Exception as e:  # one unreadable pin must not hide the others, nor break the repr
        row.error = one_line(e, scrub)
    return row


def _latest_listed(entry: Mapping[str, Any]) -> str | None:
    """The latest version as the index entry gives it (pinstorm's indexes list every version)."""
    listed = entry.get("versions")
    if isinstance(listed, list) and listed:
        return str(listed[-1])
    return str(entry["version"]) if entry.get("version") else None


def _secret_values(board: ShownBoard) -> tuple[str, ...]:
    none: tuple[str, ...] = ()
    return _attempt(lambda: secrets.secret_values(board.spec), none)


def _attempt(read: Callable[[], T], default: T) -> T:
    """`read()`, or `default` when it raises (a view shows what it can)."""
    try:
        return read()
    except Exception:
        return default


# ---- formatting -------------------------------------------------------------------------------
def escape(value: object) -> str:
    """`value` as one line a terminal only shows: the one escaping rule for everything pinstorm prints.

    Every character that is not printable is written as its Python escape (`\\x1b`, `\\n`, `\\x9b`,
    `\\u202e`): C0 controls (ESC, so no colour, cursor move, title or OSC 8 hyperlink; CR and LF, so no
    overwritten or faked lines), DEL, C1 controls (`\\x9b` is CSI on its own), Unicode format
    characters (bidi overrides and isolates U+202A-202E, U+2066-2069, zero-width ones), line and
    paragraph separators, other spaces than ' ', lone surrogates (which could not even be encoded)
    and unassigned code points."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def escape_lines(text: object) -> str:
    """Text laid out in lines by pinstorm (a summary, a report) with each line escaped: its line
    breaks stay, any other control character is shown as an escape."""
    return "\n".join(escape(line) for line in str(text).split("\n"))


def clean(value: object, limit: int = MAX_VALUE) -> str:
    """`value` as one printable line of at most `limit` characters (`escape`d, so a hostile title
    cannot move a terminal's cursor or fake lines)."""
    text = escape(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(error: BaseException, scrub: tuple[str, ...] = ()) -> str:
    """An exception as one short line, secrets masked."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return clean(secrets.redact_text(text, scrub))


def human_size(count: int | float) -> str:
    """Bytes as people read them: 512 B, 1.5 kB, 3.2 GB (powers of 1000, as file managers do)."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} PB"


def human_time(created: object) -> str:
    """A pins `created` value (`20240101T000000Z`) as `2024-01-01 00:00:00 UTC`; other text as it is."""
    if created is None or created == "":
        return ""
    try:
        when = _dt.datetime.strptime(str(created), TIME_FORMAT)
    except ValueError:
        return clean(created, 40)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _table_html(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fields_html(caption: str, fields: list[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
                   f"<td style='text-align:left'>{html.escape(text)}</td></tr>" for label, text in fields)
    return f"<table><caption>{html.escape(caption)}</caption>{rows}</table>"


def _columns_text(header: tuple[str, ...], rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]


# ---- boards -----------------------------------------------------------------------------------
_BODY = ("location", "cache", "pins")  # the text view's lines under its `<Board name (kind, access)>` head


def _board_fields(view: BoardView) -> list[tuple[str, str]]:
    return [("board", view.name), ("kind", view.kind), ("location", view.location), ("access", view.access()),
            ("cache", view.cache), ("pins", view.pins_line())]


def board_text(board: ShownBoard, limit: int = PIN_ROWS) -> str:
    """The terminal view: what the board is, where, and a table of its first pins."""
    try:
        view = view_board(board, limit)
        lines = [f"<Board {view.name!r} ({view.kind}, {view.access()})>"]
        lines += [f"  {label + ':':<9} {text}" for label, text in _board_fields(view) if label in _BODY]
        if view.rows:
            lines += _columns_text(PIN_COLUMNS, [r.cells() for r in view.rows])
        if view.more > 0:
            lines.append(f"  ... and {view.more} more")
        return "\n".join(lines)
    except Exception as e:  # the last resort: a repr that raises hides the board from its user
        return f"<Board (not shown: {one_line(e, _secret_values(board))})>"


def board_html(board: ShownBoard, limit: int = PIN_ROWS) -> str:
    """The notebook view: the board's fields, then its first pins as a table."""
    try:
        view = view_board(board, limit)
        parts = [_fields_html("pinstorm board", _board_fields(view))]
        if view.rows:
            parts.append(_table_html(PIN_COLUMNS, [r.cells() for r in view.rows]))
        if view.more > 0:
            parts.append(f"<p>... and {view.more} more</p>")
        return "<div>" + "".join(parts) + "</div>"
    except Exception as e:
        return f"<p>pinstorm board (not shown: {html.escape(one_line(e, _secret_values(board)))})</p>"


# ---- metadata ---------------------------------------------------------------------------------
def meta_fields(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, text) pairs of a version's metadata, every value cleaned and cut."""
    files = _as_list(meta.get("file"))
    sizes = [s for s in _as_list(meta.get("file_size")) if isinstance(s, (int, float))]
    shown_files = ", ".join(clean(f, 60) for f in files[:META_FILES])
    if len(files) > META_FILES:
        shown_files += f" ... and {len(files) - META_FILES} more"
    fields = [("name", clean(meta.get("name") or "")), ("title", clean(meta.get("title") or "")),
              ("type", clean(meta.get("type") or "")), ("version", clean(meta.get("version") or "")),
              ("created", human_time(meta.get("created"))), ("hash", clean(meta.get("pin_hash") or "")),
              ("size", f"{len(files)} file{'' if len(files) == 1 else 's'}, {human_size(sum(sizes))}"),
              ("files", shown_files), ("description", clean(meta.get("description") or "")),
              ("user", _user_summary(meta.get("user"))),
              ("tags", clean(", ".join(map(str, _as_list(meta.get("tags")))))),
              ("board", clean(meta.get("board") or "")), ("local", clean(_local_dir(meta), MAX_VALUE * 2))]
    return [(label, text) for label, text in fields if text or label in ("name", "version")]


def _local_dir(meta: Mapping[str, Any]) -> str:
    local = meta.get("local")
    return str(local.get("dir") or "") if isinstance(local, Mapping) else ""


def _user_summary(user: object) -> str:
    if not isinstance(user, Mapping) or not user:
        return ""
    shown = ", ".join(f"{clean(k, 30)}={clean(_short(v), 40)}" for k, v in list(user.items())[:USER_FIELDS])
    more = f" ... and {len(user) - USER_FIELDS} more" if len(user) > USER_FIELDS else ""
    return f"{len(user)} field{'' if len(user) == 1 else 's'}: {shown}{more}"


def _short(value: object) -> str:
    """A user field's value in a few characters: scalars as they are, containers by their length."""
    if isinstance(value, Mapping):
        return f"{{{len(value)} keys}}"
    if isinstance(value, (list, tuple)):
        return f"[{len(value)} items]"
    return str(value)


def _as_list(value: object) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def meta_text(meta: Mapping[str, Any]) -> str:
    """The terminal view of a version's metadata."""
    try:
        fields = meta_fields(meta)
        shown = dict(fields)
        lines = [f"<PinMetadata {shown.get('name', '')!r} version {shown.get('version', '')}>"]
        lines += [f"  {label + ':':<12} {text}" for label, text in fields if label not in ("name", "version")]
        return "\n".join(lines)
    except Exception as e:
        return f"<PinMetadata (not shown: {one_line(e)})>"


def meta_html(meta: Mapping[str, Any]) -> str:
    """The notebook view of a version's metadata: a two-column table, every value escaped."""
    try:
        return _fields_html("pinstorm pin metadata", meta_fields(meta))
    except Exception as e:
        return f"<p>pinstorm pin metadata (not shown: {html.escape(one_line(e))})</p>"


__all__ = ["PIN_ROWS", "BoardView", "PinRow", "board_html", "board_text", "clean", "escape", "escape_lines",
           "human_size", "human_time", "meta_fields", "meta_html", "meta_text", "view_board"]
