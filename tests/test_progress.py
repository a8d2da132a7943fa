"""Progress bars where a user can see them: terminal, notebook (with or without ipywidgets), or off.

A notebook kernel is simulated as IPython does it: `get_ipython` in builtins returning the kernel's
shell, whose class is `ZMQInteractiveShell`.
"""

from __future__ import annotations

import builtins
import io
import os
import warnings

import pytest

from extras_support import needs
from pinstorm import progress
from pinstorm.progress import TextBar, progress_bar


class ZMQInteractiveShell:  # the class name is what identifies a Jupyter kernel
    pass


class TerminalInteractiveShell:  # plain `ipython` in a terminal: not a notebook
    pass


@pytest.fixture
def notebook(monkeypatch):
    """A simulated Jupyter kernel without ipywidgets, progress left to its default."""
    monkeypatch.setattr(builtins, "get_ipython", ZMQInteractiveShell, raising=False)
    monkeypatch.delenv("PINSTORM_PROGRESS", raising=False)
    real_find_spec = progress.importlib.util.find_spec
    monkeypatch.setattr(progress.importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else real_find_spec(name, *a))


def test_notebook_is_detected_by_its_shell(monkeypatch):
    monkeypatch.delattr(builtins, "get_ipython", raising=False)
    assert not progress.in_notebook()
    monkeypatch.setattr(builtins, "get_ipython", TerminalInteractiveShell, raising=False)
    assert not progress.in_notebook()
    monkeypatch.setattr(builtins, "get_ipython", ZMQInteractiveShell, raising=False)
    assert progress.in_notebook()


def test_notebook_without_ipywidgets_shows_a_text_bar_and_no_warning(notebook, capsys):
    assert progress.progress_enabled()  # on by default in a notebook, though stderr is no terminal
    assert progress.renderer() == "notebook-text"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rich's 'install "ipywidgets"' warning would fail here
        with progress_bar("pins from nb", 4, unit="pins") as advance:
            for _ in range(4):
                advance(1)
    err = capsys.readouterr().err
    assert err.startswith("\r") and err.endswith("\n")
    final = err.rstrip("\n").split("\r")[-1]
    assert final.startswith("pins from nb: 100% |" + "#" * TextBar.WIDTH + "| 4/4 pins")


def test_notebook_with_ipywidgets_uses_rich(notebook, monkeypatch):
    monkeypatch.setattr(progress.importlib.util, "find_spec", lambda name, *a: object())
    assert progress.renderer() == "rich"


def test_progress_off_in_a_notebook_when_asked(notebook, monkeypatch, capsys):
    monkeypatch.setenv("PINSTORM_PROGRESS", "0")
    with progress_bar("quiet", 10) as advance:
        advance(10)
    assert capsys.readouterr().err == ""


def test_not_a_terminal_logs_long_work_only_and_is_forced_to_lines(monkeypatch, capsys):
    monkeypatch.delattr(builtins, "get_ipython", raising=False)
    monkeypatch.delenv("PINSTORM_PROGRESS", raising=False)
    monkeypatch.delenv("PINSTORM_PROGRESS_INTERVAL", raising=False)
    assert progress.progress_enabled() and progress.renderer() == "log"  # pytest's stderr is no terminal
    with progress_bar("quick", 10) as advance:   # shorter than one interval (30 s): no line at all
        advance(10)
    assert capsys.readouterr().err == ""

    monkeypatch.setenv("PINSTORM_PROGRESS_INTERVAL", "0")   # every advance is "long" now
    with progress_bar("convert", 4, unit="images") as advance:
        for _ in range(4):
            advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("convert:  25% |") and lines[-1].startswith("convert: 100% |")
    assert "4/4 images" in lines[-1] and "\r" not in "".join(lines)

    monkeypatch.setenv("PINSTORM_PROGRESS", "1")
    assert progress.renderer() == "lines"
    with progress_bar("board/pin", 2_000_000) as advance:
        advance(2_000_000)
    lines = capsys.readouterr().err.splitlines()
    assert "\r" not in "".join(lines)
    assert lines[-1].startswith("board/pin: 100% |") and "2.0 MB/2.0 MB" in lines[-1]

    monkeypatch.setenv("PINSTORM_PROGRESS", "0")
    with progress_bar("off", 10) as advance:
        advance(10)
    assert capsys.readouterr().err == ""


def test_a_log_line_comes_once_per_interval_and_the_last_only_after_one():
    now = [0.0]
    out = io.StringIO()
    bar = TextBar("repartition", 100, "categories", out, in_place=False, interval=30.0, quiet_start=True,
                  clock=lambda: now[0])
    for step in range(1, 5):      # advances at 20, 40, 60, 80 s: lines at 40 and 80 s, then the last
        now[0] = step * 20.0
        bar.advance(25)
    bar.close()
    shown = [line.split(":")[1].split("|")[0].strip() for line in out.getvalue().splitlines()]
    assert shown == ["50%", "100%", "100%"]
    quick = io.StringIO()
    bar = TextBar("quick", 1, "pins", quick, in_place=False, interval=30.0, quiet_start=True, clock=lambda: 1.0)
    bar.advance(1)
    bar.close()
    assert quick.getvalue() == ""


@needs("pipeline")
def test_convert_off_a_terminal_writes_progress_lines(tmp_path):
    """`pinstorm convert` into a log (not a terminal): progress lines on stderr, then its result."""
    import subprocess
    import sys
    from pathlib import Path

    from pinstorm.pipeline import make_digits_tree

    tree = make_digits_tree(tmp_path / "tree", image_size=16, per_class=3, seed=0)
    env = {k: v for k, v in os.environ.items() if k != "PINSTORM_PROGRESS"}
    env["PINSTORM_PROGRESS_INTERVAL"] = "0"
    pinstorm = str(Path(sys.executable).parent / "pinstorm")
    done = subprocess.run([pinstorm, "convert", str(tree), str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("convert:")]
    assert lines and lines[-1].startswith("convert: 100% |"), done.stderr
def test_a_terminal_gets_rich(monkeypatch):
    monkeypatch.delattr(builtins, "get_ipython", raising=False)
    monkeypatch.setattr(progress.sys, "stderr", _Tty())
    assert progress.renderer() == "rich"


def test_text_bar_redraws_at_most_once_per_interval():
    now = [0.0]
    out = io.StringIO()
    bar = TextBar("convert", 100, "images", out, in_place=False, interval=1.0, clock=lambda: now[0])
    for step in range(10):  # ten advances over 2.25 s: drawn at 0, 1.0 and 2.0 s
        now[0] = step * 0.25
        bar.advance(10)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split(":")[1].split("|")[0].strip() for line in lines] == ["10%", "50%", "90%", "100%"]


def test_text_bar_without_total_counts():
    out = io.StringIO()
    bar = TextBar("scan", None, "images", out, in_place=True, clock=lambda: 0.0)
    bar.advance(7)
    bar.close()
    assert out.getvalue().split("\r")[-1] == "scan: 7 images, 0 s\n"


def test_nested_bars_show_only_the_outer_one(monkeypatch, capsys):
    monkeypatch.delattr(builtins, "get_ipython", raising=False)
    monkeypatch.setenv("PINSTORM_PROGRESS", "1")
    with progress_bar("outer", 1, unit="pins") as outer:
        with progress_bar("inner", 5) as inner:
            inner(5)
        outer(1)
    err = capsys.readouterr().err
    assert "outer" in err and "inner" not in err


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True
