"""The `pinstorm` board and pin commands, run as a user runs them: the installed console script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _pinstorm(*args, env=None, ok=True):
    exe = shutil.which("pinstorm", path=str(Path(sys.executable).parent)) or "pinstorm"
    r = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e.update(PINSTORM_CONFIG=str(tmp_path / "cfg.yaml"), PINSTORM_BOARD=str(tmp_path / "board"),
             PINSTORM_CACHE=str(tmp_path / "cache"))
    return e


def test_cli_round_trip(tmp_path, env):
    src = tmp_path / "n01440764"
    src.mkdir()
    (src / "a.JPEG").write_bytes(b"\xff\xd8a")
    (src / "b.JPEG").write_bytes(b"\xff\xd8b")
    out = _pinstorm("pin", str(src), "--zip", "-d", "tench images", env=env).stdout
    assert "pinned 'n01440764'" in out and "version" in out
    assert "n01440764" in _pinstorm("find", "tench", env=env).stdout
    paths = _pinstorm("get", "n01440764", "--extract", env=env).stdout.split()
    assert sorted(Path(p).name for p in paths) == ["a.JPEG", "b.JPEG"] and all(Path(p).is_file() for p in paths)
    assert "api_version" in _pinstorm("info", "n01440764", env=env).stdout
    assert "version" in _pinstorm("versions", "n01440764", env=env).stdout
    _pinstorm("board", "register", "local", "--name", "second", "--path", str(tmp_path / "b2"), env=env)
    assert "second" in _pinstorm("board", "list", env=env).stdout  # persisted between processes
    _pinstorm("pin", str(src / "a.JPEG"), "--name", "one", "--board", "second", env=env)
    assert "one" in _pinstorm("find", env=env).stdout
    _pinstorm("remove", "n01440764", "--yes", env=env)
    assert "(none)" in _pinstorm("find", "tench", env=env).stdout
    _pinstorm("board", "remove", "second", "--yes", env=env)
    assert "second" not in _pinstorm("board", "list", env=env).stdout


def test_pin_get_info_and_list_load_neither_pandas_nor_pyarrow(tmp_path, env):
    """pandas and pyarrow are most of a command's start (0.4 of 0.65 CPU-s): the commands that move files
    never load them; a table is read (or a listing shown) only where one is asked for."""
    (tmp_path / "a.txt").write_text("a")
    code = ("import sys; from click.testing import CliRunner; from pinstorm.cli import cli\n"
            f"for args in (['pin', {str(tmp_path / 'a.txt')!r}, '-n', 'one'], ['get', 'one'], ['info', 'one'], ['list']):\n"
            "    r = CliRunner().invoke(cli, args)\n"
            "    assert r.exit_code == 0, (args, r.output)\n"
            "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_cli_errors_are_one_clear_line(tmp_path, env):
    r = _pinstorm("get", "missing", env=env, ok=False)
    assert r.returncode == 1 and "PinNotFound" in r.stderr and "Traceback" not in r.stderr
    r = _pinstorm("pin", str(tmp_path), "--name", "../up", env=env, ok=False)
    assert r.returncode == 1 and "InvalidPinName" in r.stderr
    r = _pinstorm("get", "x", "--board", "nowhere", env=env, ok=False)
    assert r.returncode == 1 and "not registered" in r.stderr
