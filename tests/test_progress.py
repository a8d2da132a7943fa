"""Progress bars where a user can see them: terminal, notebook (with or without ipywidgets), or off.

A notebook kernel is simulated as IPython does it: `get_ipython` in builtins returning the kernel's
shell, whose class is `ZMQInteractiveShell`.
"""

from __future__ import annotations

import builtins
import io
import warnings

import pytest

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


def test_not_a_terminal_is_quiet_unless_forced_and_then_prints_lines(monkeypatch, capsys):
    monkeypatch.delattr(builtins, "get_ipython", raising=False)
    monkeypatch.delenv("PINSTORM_PROGRESS", raising=False)
    assert not progress.progress_enabled()  # pytest's stderr is no terminal
    with progress_bar("quiet", 10) as advance:
        advance(10)
    assert capsys.readouterr().err == ""

    monkeypatch.setenv("PINSTORM_PROGRESS", "1")
    assert progress.renderer() == "lines"
    with progress_bar("board/pin", 2_000_000) as advance:
        advance(2_000_000)
    lines = capsys.readouterr().err.splitlines()
    assert "\r" not in "".join(lines)
    assert lines[-1].startswith("board/pin: 100% |") and "2.0 MB/2.0 MB" in lines[-1]


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
