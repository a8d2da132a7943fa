"""A stand-in for pins-python's `pins` package that only renames imports to pinstorm.boards; see
_rename.py. pins-python's own tests, copied beside it as `pins/tests`, run against pinstorm."""

from ._rename import populate

populate(globals(), None)
