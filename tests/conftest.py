"""Shared fixtures: every test runs with its own board folder, cache and config file, so no test
reads or writes the user's real pinstorm state, and registrations never leak between tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["PINSTORM_PROGRESS"] = "0"
sys.path.insert(0, str(Path(__file__).parent))  # so tests can import the `servers` helpers

# In CI, property tests draw the same examples every run, so a red build is reproducible; on a
# developer's machine they explore new ones each run (what found the `//:a` URL bug).
if os.environ.get("CI"):
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
    _hypothesis_settings.load_profile("ci")


@pytest.fixture(autouse=True)
def isolated_pinstorm(tmp_path, monkeypatch):
    """A private default board, cache and config for each test."""
    from pinstorm.boards import registry

    monkeypatch.setenv("PINSTORM_CONFIG", str(tmp_path / "config" / "boards.yaml"))
    monkeypatch.setenv("PINSTORM_BOARD", str(tmp_path / "board"))
    monkeypatch.setenv("PINSTORM_CACHE", str(tmp_path / "cache"))
    with registry._lock:
        saved = (dict(registry._boards), dict(registry._specs), registry._loaded_from)
        registry._boards.clear()
        registry._specs.clear()
        registry._loaded_from = None
    yield tmp_path
    with registry._lock:
        registry._boards.clear()
        registry._boards.update(saved[0])
        registry._specs.clear()
        registry._specs.update(saved[1])
        registry._loaded_from = saved[2]


@pytest.fixture
def http_board(tmp_path):
    """A local board folder served over a Range-honouring HTTP server: (board, folder, base URL)."""
    from pinstorm import boards
    folder = tmp_path / "served"
    board = boards.board_register("local", name="src", path=folder)
    with boards.serve_board(folder) as url:
        yield board, folder, url
