"""Every fenced Python and shell example of README.md and docs/*.md runs as written, so a changed API
breaks a test, not a reader.

The rules (what a doc writer needs to know):

* **Found automatically.** Every `## ` section of README.md and docs/*.md is one test (the text before
  the first `## ` is the document's "(intro)"), sub-sections and blocks indented in lists included,
  so a section added later is tested without touching this file. Blocks fenced ```python run in one
  namespace; blocks fenced ```bash, ```sh, ```shell run in bash (`set -eo pipefail`: the first failing
  command fails the test); ```console blocks are transcripts: only their `$ ` lines run. Other fences
  (```text, ```yaml, none) are not examples: an unlabelled fence holding `$ ` commands is an error.
* **Isolated, in order.** A section's examples run in document order in a fresh interpreter
  (`tests/docs_support.py`), in a fresh empty folder (relative paths land there), with its own
  `PINSTORM_CONFIG`, `PINSTORM_BOARD`, `PINSTORM_CACHE`, `HOME` and `TMPDIR`, and the venv's `pinstorm` first on
  `PATH`. Anything a shell block leaves running in the background is ended after the block.
* **Building on another section** is explicit: `<!-- docs-test: after "Heading" -->` in a section
  runs that section's examples first, in the same folder (the reader has run them too).
* **Placeholders.** Examples are written for real use and pointed at local servers the way a user
  points them at a stand-in:
  - `http://127.0.0.1:8000` is a board shared with `pinstorm board serve FOLDER --port 8000`. If the
    section serves one itself, port 8000 is replaced by a free port; otherwise the test serves a board
    holding the pins the examples read (`categories`, `n01440764`, `mtcars`) and substitutes its URL.
  - Cloud examples take no endpoint arguments: the clients' own variables point them at the servers
    of tests/servers — `AWS_ENDPOINT_URL` + `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (moto),
    `STORAGE_EMULATOR_HOST` (the GCS emulator), `AZURE_STORAGE_CONNECTION_STRING` (Azurite),
    `PINSTORM_KAGGLE_ENDPOINT` +
    `KAGGLE_USERNAME`/`KAGGLE_KEY` (the Kaggle-API server, holding `uciml/iris` and `c/titanic`).
* **Once.** The examples run in the full environment (`make test`, petastorm included); in the
  modern one (`make test-modern`, no petastorm) their tests skip, saying so, to keep CI's time.
* **Not run, and said so.** Lines starting with `make`, `pip`, `python -m pip` or `git clone`
  (installing, building) are left out of shell blocks and listed in the test's output. A block fenced
  ```python skip: REASON (or ```bash skip: REASON) is not run: its own test is skipped with that
  reason, and the document must say why in its text too. Nothing else is skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import docs_support
from docs_support import Example, Section

SECTIONS = docs_support.all_sections()
BY_HEADING = {(s.doc, s.heading): s for s in SECTIONS}
PLACEHOLDER = "127.0.0.1:8000"

def runnable(example: Example, section: Section) -> bool:
    return example.kind is not None and example.skip_reason is None


RUNNABLE = [s for s in SECTIONS if any(runnable(e, s) for e in s.examples)]
SKIPPED = [(e, e.skip_reason) for s in SECTIONS for e in s.examples if e.kind is not None and not runnable(e, s)]


def prerequisites(section: Section, seen: tuple = ()) -> list[Section]:
    """The sections named by `<!-- docs-test: after "..." -->`, theirs first."""
    chain = []
    for heading in section.after:
        before = BY_HEADING.get((section.doc, heading))
        assert before is not None, f"{section.id}: 'after' names no section {heading!r} of {section.doc}"
        assert heading not in seen, f"{section.id}: 'after' loops through {heading!r}"
        chain += prerequisites(before, (*seen, heading)) + [before]
    return chain


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shared_board(folder: Path) -> Path:
    """The board behind `http://127.0.0.1:8000` when a section does not serve its own."""
    import pandas as pd
    from pinstorm import boards

    board = boards.board_folder(folder)
    board.pin_write(pd.DataFrame({"wnid": ["n01440764", "n01443537"], "name": ["tench", "goldfish"]}),
                    "categories", type="parquet", description="ImageNet categories")
    images = folder.parent / "shared-images" / "n01440764"
    images.mkdir(parents=True)
    (images / "n01440764_1.JPEG").write_bytes(b"\xff\xd8\xff\xe0" + bytes(100) + b"\xff\xd9")
    boards.pin(images, "n01440764", board=board, zip=True, description="tench")
    board.pin_write(pd.DataFrame({"mpg": [21.0, 22.8], "cyl": [6, 4]}), "mtcars", type="csv")
    return folder


@pytest.fixture(scope="module")
def cloud_servers():
    """Started on first use, stopped with the module: {"s3": S3Server, "gcs": ..., "kaggle": ...}."""
    from servers import AzuriteServer, GcsServer, KaggleServer, S3Server
    from servers.azurite import require_azurite

    started: dict = {}

    def get(kind: str):
        if kind not in started:
            if kind == "azure":
                require_azurite()  # skips without Azurite, fails under CI
            server = {"s3": S3Server, "gcs": GcsServer, "azure": AzuriteServer, "kaggle": KaggleServer}[kind]().start()
            if kind == "kaggle":
                server.add_dataset("uciml/iris", {"Iris.csv": b"Id,SepalLengthCm,Species\n1,5.1,Iris-setosa\n"},
                                   title="Iris Species", subtitle="Classify iris plants into three species")
                server.add_competition("titanic", {"train.csv": b"PassengerId,Survived\n1,0\n"},
                                       title="Titanic - Machine Learning from Disaster")
            started[kind] = server
        return started[kind]

    yield get
    for server in started.values():
        server.stop()


def cloud_environment(code: str, servers) -> dict:
    env = {}
    if re.search(r'"s3"|board_s3\(|s3://', code):
        s3 = servers("s3")
        env.update(AWS_ENDPOINT_URL=s3.endpoint, AWS_ACCESS_KEY_ID="testing-key",
                   AWS_SECRET_ACCESS_KEY="testing-secret", AWS_DEFAULT_REGION="us-east-1")
    if re.search(r'"gcs"|"gcloud"|board_gcs\(|gs://', code):
        env.update(STORAGE_EMULATOR_HOST=servers("gcs").endpoint)
    if re.search(r'"azure"|board_azure\(|abfs://|board register azure', code):
        env.update(AZURE_STORAGE_CONNECTION_STRING=servers("azure").connection_string())
    if re.search(r'"kaggle"|board_kaggle\(', code):
        kaggle = servers("kaggle")
        token = kaggle.kaggle_json()
        env.update(PINSTORM_KAGGLE_ENDPOINT=kaggle.endpoint, KAGGLE_USERNAME=token["username"],
                   KAGGLE_KEY=token["key"])
    return env


def steps_of(section: Section, substitute) -> list[dict]:
    steps = []
    for example in (e for e in section.examples if runnable(e, section)):
        step = {"label": example.label, "doc": example.doc, "line": example.line, "kind": example.kind}
        if example.kind == "shell":
            step["code"], step["skipped"] = docs_support.shell_script(example)
        else:
            step["code"] = example.code
        step["code"] = substitute(step["code"])
        steps.append(step)
    return steps


@pytest.mark.parametrize("section", RUNNABLE, ids=[s.id for s in RUNNABLE])
def test_the_examples_of_a_section_run_as_written(section, tmp_path, cloud_servers):
    if importlib.util.find_spec("petastorm") is None:
        pytest.skip("the docs' examples run once, in the full environment (make test: pinstorm[all], "
                    "petastorm included); this one lacks petastorm, and a second run would cost CI ~3 min")
    chain = [*prerequisites(section), section]
    code = "".join(e.code for s in chain for e in s.examples if runnable(e, s))
    retries = contextlib.ExitStack()
    for attempt in range(3):
        base = tmp_path if attempt == 0 else Path(retries.enter_context(tempfile.TemporaryDirectory(prefix="d")))
        work, home = base / "work", base / "home"
        # TMPDIR as short as can be: PyTorch's DataLoader workers put AF_UNIX sockets there (108 bytes at
        # most), and tmp_path is long under xdist or a long TMPDIR
        short_root = "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK) else None
        temp = Path(retries.enter_context(tempfile.TemporaryDirectory(prefix="d", dir=short_root)))
        for folder in (work, home):
            folder.mkdir(parents=True)
        env = dict(os.environ, HOME=str(home), TMPDIR=str(temp), PYTHONDONTWRITEBYTECODE="1",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   MPLCONFIGDIR=os.environ.get("MPLCONFIGDIR") or str(Path.home() / ".config" / "matplotlib"),
                   **cloud_environment(code, cloud_servers))
        env.pop("PYTHONPATH", None)  # the examples import the installed pinstorm, as a user's script does
        done, port = _run_section(section, chain, code, base, work, env)
        # a port found free can be taken by another process before the section binds it: that, and only
        # that, is tried again, from scratch, on another port
        if not (port and done.returncode and f"127.0.0.1:{port}: another process holds that port" in done.stdout):
            break
    retries.close()
    print(done.stdout)
    if done.returncode:
        pytest.fail(f"{section.id} failed:\n{done.stdout[-6000:]}", pytrace=False)


def _run_section(section, chain, code, base, work, env):
    """Run the section's plan in a fresh interpreter: (the finished process, the port given to it or None)."""
    port = None
    with contextlib.ExitStack() as stack:
        replacements: dict[str, str] = {}
        if PLACEHOLDER in code:
            if re.search(r"board serve|serve_board\(", code):
                port = free_port()  # the section serves its own board: give it a free port
                replacements = {PLACEHOLDER: f"127.0.0.1:{port}", "--port 8000": f"--port {port}"}
            else:
                from pinstorm import boards
                url = stack.enter_context(boards.serve_board(shared_board(base / "shared-board")))
                replacements = {f"http://{PLACEHOLDER}": url.rstrip("/")}

        def substitute(text: str) -> str:
            for old, new in replacements.items():
                text = text.replace(old, new)
            return text

        plan = [step for s in chain for step in steps_of(s, substitute)]
        (base / "plan.json").write_text(json.dumps(plan))
        try:
            done = subprocess.run([sys.executable, docs_support.__file__, str(base / "plan.json")], cwd=work,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        except subprocess.TimeoutExpired as timeout:   # say where it stood, not only that it took too long
            so_far = timeout.stdout or b""                 # bytes, even with text=True
            so_far = so_far.decode(errors="replace") if isinstance(so_far, bytes) else so_far
            pytest.fail(f"{section.id} ran past 300 s; its output so far:\n{so_far[-6000:]}", pytrace=False)
    return done, port


@pytest.mark.parametrize("example,reason", SKIPPED, ids=[e.label for e, _ in SKIPPED])
def test_an_example_marked_skip_says_why(example, reason):
    assert reason.strip(), f"{example.label} is marked skip without a reason"
    pytest.skip(f"{example.label} not run: {reason}")


def test_every_command_transcript_is_fenced_as_one():
    """An unlabelled fence holding `$ ` commands would escape the tests: fence it ```console."""
    unlabelled = [e.label for s in SECTIONS for e in s.examples
                  if e.lang == "" and any(line.startswith("$ ") for line in e.code.splitlines())]
    assert not unlabelled


def test_no_example_needs_the_repository():
    """Examples are for users of the installed package: none imports the test helpers."""
    offenders = [e.label for s in SECTIONS for e in s.examples if e.kind == "python"
                 and re.search(r"^\s*(from|import) (tests|servers)\b", e.code, flags=re.M)]
    assert not offenders


def test_the_rules_find_what_they_should():
    """The parser sees the blocks a reader sees: indented ones in lists, console transcripts, skips."""
    example = Example("x.md", "s", 1, "console", "", "$ pinstorm a \\\n  --b\nout put\n$ make x\n")
    assert docs_support.shell_script(example) == ("pinstorm a \\\n  --b\n: skipped set-up line\n", ["make x"])
    assert Example("x.md", "s", 1, "bash", "skip: needs a GPU", "").skip_reason == "needs a GPU"
    found = {s.id for s in RUNNABLE}
    assert "docs/boards.md: Quick start" in found and "docs/cloud.md: S3 boards" in found
    assert any(e.code.startswith("import io") for s in SECTIONS for e in s.examples)  # indented in a list


def synopses() -> list[tuple[str, list[str], str]]:
    """(where, command words, text) of each `pinstorm ...` line (and its indented continuation lines)
    in the ```text blocks: the command-line synopses."""
    found = []
    for section in SECTIONS:
        for example in (e for e in section.examples if e.lang == "text"):
            for chunk in re.findall(r"^pinstorm [^\n]*(?:\n[ \t]+[^\n]*)*", example.code, flags=re.M):
                words = [w for w in chunk.split()[1:3] if re.fullmatch(r"[a-z][a-z-]*", w)]
                found.append((example.label, words, chunk))
    return found


SYNOPSES = synopses()


@pytest.mark.parametrize("where,words,text", SYNOPSES, ids=[f"{w} {' '.join(c)}" for w, c, _ in SYNOPSES])
def test_every_flag_of_a_synopsis_exists(where, words, text):
    """A synopsis is not run, so its flags are checked against the command's own --help."""
    from click.testing import CliRunner
    from pinstorm.cli import COMMANDS, cli

    from extras_support import command_extra, has_extra

    if words[0] in COMMANDS and not has_extra(command_extra(words[0])):
        pytest.skip(f"`pinstorm {words[0]}` needs the {command_extra(words[0])} extra, not installed here")
    helps = CliRunner().invoke(cli, [words[0], "--help"])
    assert helps.exit_code == 0, f"{where}: no command `pinstorm {words[0]}`"
    if "Commands:" in helps.output and len(words) > 1:  # a group: `pinstorm board register`
        helps = CliRunner().invoke(cli, [*words[:2], "--help"])
        assert helps.exit_code == 0, f"{where}: no command `pinstorm {' '.join(words[:2])}`"
    flags = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", text))
    known = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", helps.output))
    assert not flags - known, f"{where}: `pinstorm {' '.join(words)}` has no {sorted(flags - known)}"
