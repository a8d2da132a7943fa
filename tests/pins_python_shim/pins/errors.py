"""pins.errors: names from pinstorm.boards (see _rename.py)."""

from ._rename import populate

populate(globals(), "errors")
