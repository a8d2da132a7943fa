"""What a secret is, and the one rule that keeps it home: never persisted, never in a file name,
never printed (`***`).

Secrets come in many shapes: options named like a password, token or key (at any depth:
`client_kwargs`, `storage_options`, ...), header values (a dict or a list of pairs), the password
in a URL's `user:password@`, query parameters such as `?token=` or a presigned URL's signature, an
Azure connection string (its `AccountKey=` / `SharedAccessSignature=` fields), and any of these inside
`endpoint_url` or a proxy URL. The registry (what reaches the config file),
the boards (what reaches cache folder names, `.http.json` and messages) and the CLI (what is
printed) all ask this module, so the rule is written once.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"

# option, header or query-parameter names whose values are secrets
_NAME = re.compile(r"secret|password|passwd|pwd|token|^key$|_key$|access_key|key_id|keyid|apikey|api-key|"
                   r"credentials?$|credential|auth|cookie|signature|^sig$|session|private|bearer|"
                   r"connection_?str|conn_?str|^sas|accountkey", re.I)  # Azure: connection_string, sas_token, AccountKey=
# header values that may be saved or shown; every other header (Authorization, Cookie, X-Api-Key...) is not
SAFE_HEADERS = frozenset({"accept", "accept-encoding", "accept-language", "user-agent", "cache-control"})
# gcsfs `token=` values that name a credential source rather than hold a credential
TOKEN_MODES = frozenset({"anon", "google_default", "cloud", "cache", "browser"})
# `scheme://user:password@` and `name=value` query pairs inside free text (messages from libraries)
_USERINFO_IN_TEXT = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'\"]*):[^@/\s'\"]*@")
_QUERY_IN_TEXT = re.compile(r"(?P<head>[?&;](?P<name>[^=&;#\s'\"]+)=)[^&;#\s'\"]*")


def is_secret_name(name: object) -> bool:
    """True for an option, header or query-parameter name that holds a secret."""
    return bool(_NAME.search(str(name)))


def is_secret(option: object, value: Any) -> bool:
    """A secret-named option, except paths to credential files and gcsfs token modes like "anon"
    (those name where a credential lives; they are not one)."""
    if not is_secret_name(option):
        return False
    if str(option) == "token" and isinstance(value, str) and value in TOKEN_MODES:
        return False
    return not (isinstance(value, (str, Path)) and Path(str(value)).expanduser().is_file())


def header_items(headers: Any) -> list[tuple[str, Any]]:
    """Headers as (name, value) pairs, whether given as a mapping or a list of pairs."""
    if isinstance(headers, dict):
        return list(headers.items())
    if isinstance(headers, (list, tuple)):
        return [tuple(h) for h in headers if isinstance(h, (list, tuple)) and len(h) == 2]
    return []


def split_url(url: str) -> tuple[str, tuple[str, str] | None, dict[str, str]]:
    """(the URL without userinfo or secret query parameters, (user, password) or None, the secret
    query parameters). The first part is what may be saved, shown and used in names."""
    parts = urlsplit(url)
    auth = None
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, _, password = userinfo.partition(":")
        auth = (unquote(user), unquote(password))
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    secret = {k: v for k, v in pairs if is_secret_name(k)}
    query = urlencode([(k, v) for k, v in pairs if not is_secret_name(k)]) if secret else parts.query
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)), auth, secret


def strip_url(url: str) -> str:
    """`url` without its userinfo and secret query parameters (safe to save and to name files by)."""
    return split_url(url)[0] if has_secret(url) else url


def has_secret(url: object) -> bool:
    """True when the string `url` is a URL carrying userinfo or a secret query parameter."""
    if not isinstance(url, str) or "://" not in url:
        return False
    try:
        _, auth, secret = split_url(url)
    except ValueError:
        return False
    return auth is not None or bool(secret)


def redact_url(url: str) -> str:
    """`url` for display: the user name stays, the password and secret query values become `***`."""
    return redact_text(url)


def redact_text(text: str, values: tuple[str, ...] | list[str] = ()) -> str:
    """`text` with URL passwords, secret query values and the given secret values replaced by `***`."""
    text = _USERINFO_IN_TEXT.sub(lambda m: f"{m['head']}:{MASK}@", str(text))
    text = _QUERY_IN_TEXT.sub(lambda m: m["head"] + MASK if is_secret_name(m["name"]) else m[0], text)
    for value in sorted({v for v in values if isinstance(v, str) and len(v) >= 4}, key=len, reverse=True):
        text = text.replace(value, MASK).replace(quote(value, safe=""), MASK)
    return text


def public(options: dict, where: str = "") -> tuple[dict, list[str]]:
    """(options without secrets at any depth, the dotted names of what was left out).

    What may reach the config file: secret-named options are left out, header values only for a
    few harmless headers, and URLs (`url`, `endpoint_url`, proxies, anywhere) lose their userinfo
    and secret query parameters.
    """
    kept: dict = {}
    dropped: list[str] = []
    for k, v in options.items():
        dotted = f"{where}{k}"
        if is_secret(k, v):
            dropped.append(dotted)
        elif str(k).lower() == "headers" and header_items(v):
            items = header_items(v)
            safe = [(h, x) for h, x in items if str(h).lower() in SAFE_HEADERS]
            dropped += [f"{dotted}.{h}" for h, _ in items if str(h).lower() not in SAFE_HEADERS]
            kept[k] = dict(safe) if isinstance(v, dict) else [list(p) for p in safe]
        else:
            kept[k], inner = _public_value(v, dotted)
            dropped += inner
    return kept, dropped


def _public_value(v: Any, dotted: str) -> tuple[Any, list[str]]:
    if isinstance(v, dict):
        return public(v, f"{dotted}.")
    if isinstance(v, (list, tuple)):
        items, dropped = [], []
        for i, item in enumerate(v):
            item, inner = _public_value(item, f"{dotted}[{i}]")
            items.append(item)
            dropped += inner
        return items, dropped
    if has_secret(v):
        return strip_url(v), [f"{dotted} (URL credentials)"]
    return (str(v) if isinstance(v, Path) else v), []


def scrub(value: Any, values: tuple[str, ...] | list[str] = ()) -> Any:
    """`value` (any JSON-able structure, or text) as it may be written anywhere: lineage, pin
    metadata and descriptions, reports, logs, progress lines, JSON output.

    The one rule for everything pinstorm writes or prints about a run: a secret-named option at any
    depth and every header but a few harmless ones become `***`; a URL keeps its user name but loses
    its password and secret query values; and every secret string found anywhere inside `value`
    (and the given `values`, e.g. a board's options) is masked wherever else it appears, such as a
    library's error message that quotes it. Keys and shape stay, so the record still reads as it was.
    """
    hidden = tuple(values) + secret_values(value)
    return _scrubbed("", value, hidden)


def _scrubbed(key: object, value: Any, hidden: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return MASK if value and is_secret(key, value) else redact_text(value, hidden)
    if isinstance(value, (bytes, bytearray)):
        return value
    if str(key).lower() == "headers" and header_items(value):
        items = [(h, x if str(h).lower() in SAFE_HEADERS else MASK) for h, x in header_items(value)]
        return dict(items) if isinstance(value, dict) else [list(p) for p in items]
    if isinstance(value, dict):
        return {k: (MASK if is_secret(k, v) and v not in (None, "", {}, []) and not isinstance(v, bool)
                    else _scrubbed(k, v, hidden)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_scrubbed(key, v, hidden) for v in value) if isinstance(value, list) \
            else tuple(_scrubbed(key, v, hidden) for v in value)
    if isinstance(value, Path):
        return redact_text(str(value), hidden)
    return value


class RedactingFilter(logging.Filter):
    """Masks URL passwords and secret query values in a log record (a dataset URL is often logged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        masked = redact_text(text)
        if masked != text:
            record.msg, record.args = masked, ()
        return True


def logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)` with the `RedactingFilter`: how pinstorm's modules get their logger."""
    log = logging.getLogger(name)
    if not any(isinstance(f, RedactingFilter) for f in log.filters):
        log.addFilter(RedactingFilter())
    return log


def secret_values(options: Any) -> tuple[str, ...]:
    """Every secret string inside `options` at any depth, to scrub from messages."""
    out: list[str] = []

    def walk(key: object, v: Any) -> None:
        if isinstance(v, str):
            if is_secret(key, v):
                out.append(v)
            if has_secret(v):
                _, auth, query = split_url(v)
                out.extend([auth[1]] if auth and auth[1] else [])
                out.extend(query.values())
        elif str(key).lower() == "headers" and header_items(v):
            out.extend(str(x) for h, x in header_items(v) if str(h).lower() not in SAFE_HEADERS)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k, x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(key, x)

    walk("", options)
    return tuple(s for s in out if isinstance(s, str) and len(s) >= 4)


__all__ = ["MASK", "SAFE_HEADERS", "TOKEN_MODES", "RedactingFilter", "has_secret", "header_items", "is_secret",
           "is_secret_name", "logger", "public", "redact_text", "redact_url", "scrub", "secret_values", "split_url", "strip_url"]
