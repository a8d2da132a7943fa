"""The import renaming behind this `pins` stand-in: `pins.<module>.<name>` is pinstorm's `<name>`.

Every name is looked up in `pinstorm.boards.<module>` (when pinstorm has a module of that name),
then in `pinstorm.boards`; `RENAMES` maps the few pins-python names that pinstorm spells otherwise.
Nothing here implements behaviour, with two exceptions that are not pinstorm's API:

* `NOT_OFFERED`: backends pinstorm does not have (Posit Connect, Databricks) and pins-python's
  fsspec cache filesystem (PinsCache, used by one test of its internals). pins-python's test
  helpers import them at module level; the stand-ins raise NotImplementedError when called, and
  the tests that use them are not in the selection.
* `fs_protocol`: a helper of pins-python's test suite (pins.utils) that names an fsspec
  filesystem's protocol; copied as it is.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

RENAMES = {"MetaRaw": "PinMetadata", "Meta": "PinMetadata"}
NOT_OFFERED = {"BoardRsConnect", "BoardManual", "PinsCache", "board_rsconnect", "board_connect", "board_databricks"}


def fs_protocol(fs: Any) -> str:
    """pins-python's pins.utils.fs_protocol."""
    if isinstance(fs.protocol, str):
        return fs.protocol
    if isinstance(fs.protocol, (list, tuple)):
        return fs.protocol[0]
    raise TypeError(f"fs.protocol is of type {type(fs.protocol)}")


def _not_offered(name: str) -> Any:
    class NotOffered:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError(f"pinstorm has no {name}")

    NotOffered.__name__ = name
    return NotOffered


def module_getattr(module: str | None) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = RENAMES.get(name, name)
        for modname in ([f"pinstorm.boards.{module}"] if module else []) + ["pinstorm.boards"]:
            try:
                mod = importlib.import_module(modname)
            except ModuleNotFoundError:
                continue
            if hasattr(mod, target):
                return getattr(mod, target)
        if name == "fs_protocol":
            return fs_protocol
        if name in NOT_OFFERED:
            return _not_offered(name)
        raise AttributeError(f"pinstorm.boards has no {target!r} (pins.{module or ''}.{name})".replace("..", "."))

    return __getattr__


def populate(namespace: dict[str, Any], module: str | None) -> None:
    """Copy pinstorm's public names into a stand-in module (what `from pins.X import *` and
    `eval(..., pins.constructors.__dict__)` see); the rest resolve through `module_getattr`."""
    import pinstorm.boards as top

    sources = [top]
    if module:
        try:
            sources.insert(0, importlib.import_module(f"pinstorm.boards.{module}"))
        except ModuleNotFoundError:
            pass
    for source in reversed(sources):
        names = getattr(source, "__all__", None) or [n for n in vars(source) if not n.startswith("_")]
        namespace.update({n: getattr(source, n) for n in names if hasattr(source, n)})
    namespace.update({pins: getattr(top, ours) for pins, ours in RENAMES.items() if hasattr(top, ours)})
    namespace["board"] = top.board  # pins-python's board(): pinstorm.boards.board is callable
    namespace["__getattr__"] = module_getattr(module)


def not_offered_module(namespace: dict[str, Any], what: str) -> None:
    """A backend pinstorm does not have (pins.rsconnect: Posit Connect): every name is a stand-in
    that raises NotImplementedError when called, so modules importing it still load."""
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _not_offered(f"{what}.{name}")

    namespace["__getattr__"] = __getattr__
