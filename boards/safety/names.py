"""What a safe pin name is.

A pin name becomes a folder on local disks, in buckets and in URLs, so it must mean the same thing on
all of them: no path separators, no `..`, nothing Windows or URLs would mangle.
"""

from __future__ import annotations

import re

from ..errors import InvalidPinName

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_WINDOWS_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}
MAX_LENGTH = 200
RESERVED_NAMES = {"_pins.yaml", "data.txt"}  # a board's own files


def check_pin_name(name: object) -> str:
    """Return `name` if it is a safe pin name, else raise :class:`InvalidPinName` saying why."""
    if not isinstance(name, str) or not name:
        raise InvalidPinName(f"pin name must be a non-empty string, got {name!r}")
    if "/" in name or "\\" in name:
        raise InvalidPinName(f"Invalid pin name: {name!r} contains a path separator ('/' or '\\')")
    if name in {".", ".."} or ".." in name:
        raise InvalidPinName(f"pin name {name!r} contains '..'")
    if len(name) > MAX_LENGTH:
        raise InvalidPinName(f"pin name {name!r} is longer than {MAX_LENGTH} characters")
    if name.split(".")[0].lower() in _WINDOWS_RESERVED:
        raise InvalidPinName(f"pin name {name!r} is a reserved device name on Windows")
    if name in RESERVED_NAMES:  # pins-python's message
        raise InvalidPinName(f"The pin name '{name}' is reserved for internal use.")
    if not _SAFE.match(name) or name.endswith("."):
        raise InvalidPinName(
            f"pin name {name!r} has characters unsafe on common filesystems; use letters, digits, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    return name
