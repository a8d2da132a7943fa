"""The board and pin commands of the `pinstorm` command line (`pinstorm.cli` assembles the group).

Registrations made here persist in the user config file.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from . import api, registry
from .board import default_pin_name
from .display import escape

if TYPE_CHECKING:  # pandas loads when a DataFrame is made (see drivers.py)
    import pandas as pd

# What these commands print comes from boards anyone may write (pin names, descriptions, file names,
# index fields and their keys): every value goes through `display.escape`, the one rule, before it
# reaches the terminal (no ESC, CSI, OSC 8, CR or bidi override gets through, one item per line),
# and JSON is written ASCII-only, so JSON escapes those characters as \uXXXX.


def _json(value, **options) -> str:
    """JSON that is safe on a terminal: ASCII only (C0, DEL, C1, bidi and other non-ASCII characters
    as \\uXXXX escapes, lone surrogates included)."""
    return json.dumps(value, ensure_ascii=True, **options)


def _escaped_cell(value):
    if isinstance(value, (list, tuple)):  # as pandas shows a list: [a, b]
        return "[" + ", ".join(escape(v) for v in value) + "]"
    if isinstance(value, (str, dict, set)):
        return escape(value)
    return value


def _show(df: pd.DataFrame, as_json: bool = False) -> None:
    """A listing as a table, or with `--json` as a JSON list of records (for scripts and `jq`)."""
    if as_json:
        click.echo(_json(json.loads(df.to_json(orient="records", date_format="iso")), indent=1))
    elif df.empty:
        click.echo("(none)")
    else:
        import pandas as pd

        shown = df.map(_escaped_cell).rename(columns=escape)
        with pd.option_context("display.max_rows", 500, "display.max_colwidth", 80, "display.width", 200):
            click.echo(shown.to_string(index=False))


def _parse_options(pairs: tuple[str, ...]) -> dict:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        key, value = pair.split("=", 1)
        out[key.replace("-", "_")] = {"true": True, "false": False}.get(value.lower(), value)
    return out


def json_option(f):
    """`--json` on every listing: the same rows as JSON records."""
    return click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")(f)


def yes_option(f):
    """`--yes` on every command that deletes or replaces something."""
    return click.option("--yes", "-y", is_flag=True,
                        help="Do not ask for confirmation (required when stdin is not a terminal).")(f)


@click.group()
def board() -> None:
    """Register, list and remove boards (saved in the user config file)."""


def _register_help() -> str:
    """`board register`'s help, its list of kinds read from the kind table (`constructors.KINDS`)."""
    from .constructors import KINDS

    rows = "\n".join(f"  {kind:<8} {row.description}" for kind, row in KINDS.items())
    return ("Register a board: KIND is one of the kinds below, or an http(s) URL (a url board).\n\n"
            "The board must answer (its index or bucket can be listed; a local folder exists or can be made)\n"
            "unless --no-check. A name that is taken, including the default board `local`, is replaced only\n"
            "with --force (or when you say yes at the prompt).\n\n\b\nKinds:\n" + rows)


@board.command("register", help=_register_help())
@click.argument("kind")
@click.option("--name", help="Name to register under (default: the kind, or a slug of the URL).")
@click.option("--path", help="Folder of a local board, or prefix inside a bucket.")
@click.option("--url", help="URL of a datatxt board.")
@click.option("--bucket", help="Bucket of an s3 / gcs board (the container of an azure board).")
@click.option("--endpoint-url", help="Endpoint of an S3/GCS-compatible server or Kaggle mirror.")
@click.option("--cache", help="Cache folder for this board.")
@click.option("--no-versions", is_flag=True, help="Keep only the latest version of each pin.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Any other board option (e.g. create_bucket=true, index_max_age=300).")
@click.option("--force", "-f", is_flag=True, help="Replace a board already registered under this name.")
@click.option("--no-check", is_flag=True, help="Register without checking that the board answers.")
def board_register_cmd(kind, name, path, url, bucket, endpoint_url, cache, no_versions, options, force, no_check):
    from .constructors import KINDS, board_from_spec, default_board_name, is_http_url, kinds_text

    kind_name = kind.lower()
    if not is_http_url(kind) and kind_name not in KINDS:
        raise click.BadParameter(f"{kind!r} is not a board kind; use one of {kinds_text()}", param_hint="KIND")
    kind = kind if is_http_url(kind) else kind_name
    _require_options(kind_name, url=url, bucket=bucket)
    opts = {k: v for k, v in dict(path=path, url=url, bucket=bucket, endpoint_url=endpoint_url,
                                  cache=cache).items() if v is not None}
    if no_versions:
        opts["versions"] = False
    opts.update(_parse_options(options))
    name = name or default_board_name(kind)
    replaced = _replacing(name, force)
    if not no_check:
        _check_answers(lambda: board_from_spec({"kind": kind, **opts}, name=name), name)
    b = registry.board_register(kind, name=name, persist=True, **opts)
    click.echo(escape(f"registered board {b.name!r} ({b.kind}: {b.describe()})"
                      + (f"; it replaces {replaced}" if replaced else "")))


# The flags that give the options a kind requires (`KINDS[kind].required`).
_FLAGS = {"url": "--url URL", "bucket": "--bucket NAME"}


def _require_options(kind: str, **given) -> None:
    from .constructors import KINDS

    for key in KINDS[kind].required if kind in KINDS else ():
        if not given.get(key):
            flag = "--bucket CONTAINER" if kind == "azure" else _FLAGS.get(key, f"--option {key}=VALUE")
            raise click.UsageError(f"`board register {kind}` needs {flag}")


def _where(spec: dict) -> str:
    from .safety.secrets import redact_text, secret_values

    where = spec.get("url") or spec.get("path") or spec.get("bucket") or spec.get("container") or ""
    if not where and spec.get("kind") in (None, "local"):
        where = str(registry.default_local_path())
    kind = str(spec.get("kind") or "local")
    hidden = secret_values(spec)  # registrations of this process still hold their secrets
    return redact_text(f"{kind}: {where}" if where and where != kind else kind, hidden)


def _replacing(name: str, force: bool) -> str | None:
    """What registering `name` would replace (None: nothing); asks, or needs --force, first."""
    specs = registry.board_specs()
    if name not in specs and name != registry.DEFAULT_BOARD:
        return None
    old = f"board {name!r} ({_where(specs.get(name, {'kind': 'local'}))})"
    if force:
        return old
    if not sys.stdin.isatty():
        raise click.UsageError(f"{old} is already registered; add --force to replace it, or choose another --name")
    click.confirm(f"Replace {old}?", default=False, abort=True)
    return old


def _check_answers(make_board, name: str) -> None:
    """Registration fails for a board that does not answer: a typo in a URL, bucket or path shows
    now, not at the first `get`."""
    from .errors import BoardError

    try:
        make_board().pin_list()
    except Exception as e:  # noqa: BLE001 - whatever the storage raised, said as one line
        reason = str(e).rstrip(". ") or type(e).__name__
        raise BoardError(f"board {name!r} does not answer: {reason}; check the location, or register anyway "
                         "with --no-check") from e


@board.command("list")
@json_option
def board_list_cmd(as_json):
    """List registered boards (credentials in URLs and options shown as ***)."""
    from .safety.secrets import redact_text, secret_values

    rows = []
    for name, spec in registry.board_specs().items():
        where = spec.get("url") or spec.get("path") or spec.get("bucket") or spec.get("container") or ""
        if name == registry.DEFAULT_BOARD and not where:
            where = str(registry.default_local_path())
        hidden = secret_values(spec)  # registrations of this process still hold their secrets
        rows.append({"name": name, "kind": redact_text(str(spec.get("kind")), hidden),
                     "where": redact_text(str(where), hidden)})
    import pandas as pd

    _show(pd.DataFrame(rows, columns=["name", "kind", "where"]), as_json)


@board.command("remove")
@click.argument("name")
@yes_option
def board_remove_cmd(name, yes):
    """Deregister a board (its data stays where it is); asks first (`--yes` skips the question)."""
    if name not in registry.board_specs():
        registry.board_deregister(name, persist=True)   # says it is not registered, and what is
    confirm_destructive(f"board {name!r} ({_where(registry.board_specs()[name])}) from the registered boards "
                        "(its data stays)", yes)
    registry.board_deregister(name, persist=True)
    click.echo(f"removed board {name!r}")


@board.command("repair")
@click.argument("name", default="local")
@click.option("--older-than", default=86400.0, show_default=True, type=click.FloatRange(min=0), metavar="SECONDS",
              help="On buckets, remove unfinished versions (no data.txt) only when this old.")
def board_repair_cmd(name, older_than):
    """Rebuild a writable board's data.txt index from the pins it stores and remove what killed
    writers left (after a crash, or writes by tools that do not keep the index)."""
    from .errors import ReadOnlyBoard

    b = registry.resolve_board(name)
    maintenance = b.maintenance
    if maintenance is None:
        raise ReadOnlyBoard(f"board {name!r} ({b.kind}) has no index of its own to repair")
    removed = maintenance.sweep_temporaries(older_than=older_than)
    count = maintenance.rebuild_index(sweep=False)
    extra = f"; removed {removed} abandoned temporary item(s)" if removed else ""
    click.echo(f"repaired board {name!r} ({b.describe()}): the index lists {count} pin(s){extra}")


@board.command("serve")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0: any free port.")
@click.option("--max-age", default=0, show_default=True, type=click.IntRange(0), metavar="SECONDS",
              help="Cache-Control max-age of what is served: readers skip re-reading data.txt for that long.")
@click.option("--max-connections", default=None, type=click.IntRange(1), help="Connections served at once "
              "(default 128); at the limit a new one replaces the one waiting longest for its request.")
@click.option("--header-timeout", default=None, type=click.FloatRange(0, min_open=True), metavar="SECONDS",
              help="Time a client has to send a whole request head (default 10).")
def board_serve_cmd(path, host, port, max_age, max_connections, header_timeout):
    """Serve a board folder over HTTP (Range-aware) as a read-only datatxt board."""
    from .serve import serve_board

    limits = {k: v for k, v in (("max_connections", max_connections), ("header_timeout", header_timeout))
              if v is not None}
    with serve_board(path, host=host, port=port, max_age=max_age, **limits) as url:
        click.echo(f"serving {path} at {url}  (register with: pinstorm board register {url} --name NAME)")
        try:
            import threading

            threading.Event().wait()
        except KeyboardInterrupt:
            pass


def board_option(f):
    return click.option("--board", "-b", default=None, help="Board name (default: local; reads search all).")(f)


@click.command("pin")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--name", "-n", help="Pin name (default: the file or folder name).")
@board_option
@click.option("--zip", "zip_", is_flag=True, help="Store the files as one zip archive.")
@click.option("--description", "-d", help="Description, searched by `find`.")
def pin_cmd(paths, name, board, zip_, description):
    """Pin files, folders or an http(s) URL as a new version."""
    target = paths[0] if len(paths) == 1 else list(paths)
    if name is None and len(paths) > 1:
        raise click.UsageError("give --name when pinning several paths")
    b = registry.resolve_board(board)
    pin_name = name or default_pin_name(target)
    result = b.pin(target, name=pin_name, zip=zip_, description=description)
    version = b.pin_versions(pin_name, as_df=False)[-1]
    count = f", {len(result)} file(s)" if isinstance(result, list) else ""
    click.echo(f"pinned {pin_name!r} to board {b.name!r} as version {version}{count}")


@click.command("get")
@click.argument("name")
@board_option
@click.option("--version", help="Version or unique prefix (default: latest).")
@click.option("--extract/--no-extract", default=None, help="Unpack archives (default: the board's choice).")
@click.option("--offline", is_flag=True, help="Use only the local cache; no network.")
def get_cmd(name, board, version, extract, offline):
    """Fetch a pin into the cache and print the local paths of its files."""
    paths = api.pin_get(name, board=board, version=version, extract=extract, files=not extract,
                        download=not offline)
    if not isinstance(paths, list):
        paths = api.pin_get(name, board=board, version=version, files=True, download=not offline)
    for p in paths:  # file names come from the board: one escaped path per line
        click.echo(escape(p))


@click.command("find")
@click.argument("text", default="")
@board_option
@click.option("--extended", is_flag=True, help="Show every index field.")
@json_option
def find_cmd(text, board, extended, as_json):
    """Search pins by name, title and description (every board by default)."""
    _show(api.pin_find(text, board=board, extended=extended), as_json)


@click.command("list")
@board_option
@json_option
def list_cmd(board, as_json):
    """The names of a board's pins, one per line (the default board unless --board)."""
    names = registry.resolve_board(board).pin_list()
    if as_json:
        click.echo(_json(names))
    else:
        for name in names:
            click.echo(escape(name))


@click.command("info")
@click.argument("name")
@board_option
@click.option("--version", help="Version or unique prefix (default: latest).")
@click.option("--json", "as_json", is_flag=True, help="Accepted for symmetry: the metadata is always JSON.")
def info_cmd(name, board, version, as_json):
    """Show a pin's metadata as JSON (latest version by default)."""
    click.echo(_json(api.pin_info(name, board=board, version=version), indent=2, default=str))


@click.command("versions")
@click.argument("name")
@board_option
@json_option
def versions_cmd(name, board, as_json):
    """List a pin's versions, oldest first."""
    _show(api.pin_versions(name, board=board), as_json)


def confirm_destructive(what: str, yes: bool, verb: str = "Remove") -> None:
    """Ask before deleting anything: `--yes` skips the question; without a terminal to ask on,
    refuse (a pipe or a script's stdin is not an answer, `echo n | ...` included)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.UsageError(f"refusing to {verb.lower()} {what} without confirmation: stdin is not a terminal, "
                               f"so pinstorm cannot ask; add --yes to {verb.lower()} without asking")
    click.confirm(f"{verb} {what}?", default=False, abort=True)  # only y / yes goes ahead


@click.command("remove")
@click.argument("name")
@board_option
@click.option("--version", help="Remove only this version.")
@yes_option
def remove_cmd(name, board, version, yes):
    """Remove a pin (all versions) or one version; asks first (`--yes` skips the question)."""
    what = f"version {version} of pin {name!r}" if version else f"pin {name!r} and all its versions"
    confirm_destructive(f"{what} from board {board or registry.DEFAULT_BOARD!r}", yes)
    api.pin_remove(name, board=board, version=version)
    click.echo(f"removed {what}")
