"""pins.rsconnect: Posit Connect, a backend pinstorm does not have (see _rename.py)."""

from .._rename import not_offered_module

not_offered_module(globals(), "pins.rsconnect")
