"""pinstorm is typed for its users: `py.typed` ships in the wheel, a wrong argument to a board
function is a mypy error in the user's code, the lazy `pinstorm.training` exports have their real
signatures, and the boards' public modules pass `mypy --strict`.

pinstorm is installed, as a wheel installs it, into the site-packages of a fresh virtual environment
(not read from the checkout, and not through PYTHONPATH, where mypy needs no `py.typed`): that is
what a user's type checker sees.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]
STRICT_MODULES = ["board", "api", "constructors", "storage", "registry", "parallel", "cache", "safety.archive", "pruning",
                  "metadata", "display"]


def _build_options() -> list[str]:
    """How pip builds pinstorm here without the network. pyproject's [build-system] needs a newer setuptools
    (PEP 639's SPDX `license`) than the full environment keeps for petastorm 0.13.1 (< 70): an environment
    whose setuptools is new enough builds without isolation, the others in pip's isolated build
    environment from the setuptools wheel `make install` fetched into <venv>/build-wheels."""
    need = int(re.search(r'"setuptools>=(\d+)', (ROOT / "pyproject.toml").read_text()).group(1))
    try:
        have = int(version("setuptools").split(".")[0])
    except PackageNotFoundError:
        have = 0
    if have >= need:
        return ["--no-build-isolation"]
    wheels = Path(sys.prefix) / "build-wheels"
    if not any(wheels.glob("setuptools-*.whl")):
        pytest.fail(f"building pinstorm needs setuptools >= {need}; this environment has {have or 'none'} and "
                    f"{wheels} holds no newer wheel (`make install` fetches it)")
    return ["--no-index", "--find-links", str(wheels)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a new venv whose site-packages holds pinstorm as a wheel installs it; a .pth file
    makes this environment's packages (pinstorm's dependencies) visible there too."""
    source = tmp_path_factory.mktemp("source")   # a clean copy: setuptools would reuse a stale build/ here
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("pinstorm", "boards", "pipeline", "training"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *_build_options(),
                           "--target", site, str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (Path(site) / "pinstorm" / "py.typed").is_file()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _mypy(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--python-executable", str(python),
                           "--config-file", str(ROOT / "pyproject.toml"), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


# A user's code, each file a case of its own; mypy checks them in one run (most of a run is reading the
# installed packages, the same for every file: one run instead of one a file saved ~10 CPU-s a CI suite).
USER_CODE = {
    "user.py": """
        from pinstorm import boards
        from pinstorm.training import train

        boards.pin({"a": 1}, "x", board=3)
        reveal_type(boards.board_folder)
        reveal_type(train)
    """,
    # `dataset_info` returns a typed `DatasetInfo`: ``info.rows`` is an int, ``info.rwos`` an error a type
    # checker reports (``info["rwos"]`` would only fail at run time)
    "user_info.py": """
        from pinstorm.pipeline import DataMap, dataset_info, imagenet_partition

        info = dataset_info("digits-train")
        reveal_type(info.rows)
        reveal_type(info.classes)
        info.rwos
        reveal_type(imagenet_partition(0, 1, "b").image)
        DataMap(image=["a.jpg"], category=[3.5])
    """,
}


@pytest.fixture(scope="module")
def user_code_checked(installed, tmp_path_factory) -> dict[str, str]:
    """mypy's report on each file of `USER_CODE` (its lines), by file name."""
    folder = tmp_path_factory.mktemp("user")
    for name, code in USER_CODE.items():
        (folder / name).write_text(textwrap.dedent(code))
    out = _mypy(installed, *USER_CODE, cwd=folder).stdout
    return {name: "\n".join(line for line in out.splitlines() if line.startswith(name + ":")) for name in USER_CODE}


def test_py_typed_ships_and_user_mistakes_are_type_errors(user_code_checked):
    out = user_code_checked["user.py"]
    assert 'Argument "board" to "pin" has incompatible type "int"' in out, out
    assert "py.typed" not in out and "missing library stubs" not in out, out
    assert "Revealed type is \"def (" in out and "-> pinstorm.boards.board.Board" in out, out
    assert "-> pinstorm.training.results.TrainResult" in out, out   # a lazy export, seen through TYPE_CHECKING


def test_the_boards_public_modules_pass_mypy_strict(installed, tmp_path):
    modules = [arg for name in STRICT_MODULES for arg in ("-m", f"pinstorm.boards.{name}")]
    done = _mypy(installed, "--strict", *modules, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-5000:]


def test_a_typo_in_a_dataset_info_field_is_a_type_error(user_code_checked):
    out = user_code_checked["user_info.py"]
    assert re.search(r'user_info.py:5: note: Revealed type is "(builtins\.)?int"', out), out
    assert re.search(r'user_info.py:6: note: Revealed type is "typing\.Sequence\[(builtins\.)?str\]"', out), out
    assert re.search(r'user_info.py:8: note: Revealed type is "typing\.Sequence\[(builtins\.)?str\]"', out), out
    assert '"DatasetInfo" has no attribute "rwos"' in out, out
    assert 'List item 0 has incompatible type "float"' in out, out
