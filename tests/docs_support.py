"""Find the fenced examples of README.md and docs/*.md, and run one section's examples in order.

Imported by tests/test_docs_examples.py (which documents the rules); run as a script
(`python docs_support.py PLAN.json`) it is the fresh interpreter a section runs in, as a reader's
script would: Python blocks share one namespace, shell blocks run in bash, all in the current
folder, in document order.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
# Set-up lines a test does not run (installing, building): skipped and reported, never silently.
SETUP_LINE = re.compile(r"^\s*(make|pip|python -m pip|git clone)\b")
# `<!-- docs-test: after "Heading" -->` in a section: run that section's examples first, in the same folder.
AFTER = re.compile(r'<!--\s*docs-test:\s*after\s+"([^"]+)"\s*-->')
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<info>[^`\n]*)$")
HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")


@dataclass
class Example:
    doc: str  # "README.md", "docs/boards.md"
    section: str
    line: int  # 1-based line of the opening fence
    lang: str  # first word of the info string
    options: str  # the rest of the info string, e.g. "skip: needs a GPU"
    code: str

    @property
    def kind(self) -> str | None:
        return "python" if self.lang in PYTHON else "shell" if self.lang in SHELL else None

    @property
    def skip_reason(self) -> str | None:
        match = re.match(r"skip\b:?\s*(.*)", self.options)
        return (match.group(1) or "marked skip") if match else None

    @property
    def label(self) -> str:
        return f"{self.doc}:{self.line} ({self.section}, {self.lang})"


@dataclass
class Section:
    doc: str
    heading: str
    line: int
    text: str = ""
    examples: list[Example] = field(default_factory=list)

    @property
    def after(self) -> list[str]:
        return AFTER.findall(self.text)

    @property
    def id(self) -> str:
        return f"{self.doc}: {self.heading}"


def sections(path: Path) -> list[Section]:
    """The `##` sections of a document (the text before the first one is its intro), with every fenced
    block they hold, sub-sections and blocks indented in lists included."""
    doc = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    current = Section(doc, "(intro)", 1)
    found = [current]
    fence: tuple[str, str, int, str] | None = None  # (fence, info, line, indent)
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        if fence is None:
            opening = FENCE.match(line)
            heading = HEADING.match(line)
            if opening:
                fence = (opening["fence"], opening["info"].strip(), number, opening["indent"])
                body = []
            elif heading and len(heading.group(1)) == 2:
                current = Section(doc, heading.group(2), number)
                found.append(current)
            current.text += line + "\n"
            continue
        if line.strip() == fence[0]:
            info = fence[1].split(None, 1)
            lang = info[0].lower() if info else ""
            code = "\n".join(b[len(fence[3]):] if b.startswith(fence[3]) else b for b in body) + "\n"
            current.examples.append(Example(doc, current.heading, fence[2], lang,
                                            info[1] if len(info) > 1 else "", code))
            fence = None
        else:
            body.append(line)
        current.text += line + "\n"
    return [s for s in found if s.examples or s.heading != "(intro)"]


def all_sections() -> list[Section]:
    return [s for path in DOCUMENTS for s in sections(path)]


def shell_script(example: Example) -> tuple[str, list[str]]:
    """The bash script of a shell block, and the set-up lines it leaves out. A ```console block is a
    transcript: only its `$ ` lines (and their `\\` continuations) are commands."""
    lines = example.code.splitlines()
    if example.lang == "console":
        commands, continued = [], False
        for line in lines:
            if line.startswith("$ ") or continued:
                commands.append(line[2:] if line.startswith("$ ") and not continued else line)
                continued = line.rstrip().endswith("\\")
        lines = commands
    kept, skipped = [], []
    for line in lines:
        if SETUP_LINE.match(line):
            skipped.append(line.strip())
            kept.append(": skipped set-up line")
        else:
            kept.append(line)
    return "\n".join(kept) + "\n", skipped


# -- the runner: a fresh interpreter per section ------------------------------------------------

def run_shell(script: str, label: str) -> int:
    """Run a shell block in bash (exit on the first failing command, each command traced), then end
    whatever it left running in the background (a `board serve ... &`)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as handle:
        handle.write(f"set -eo pipefail; PS4='+ {label}:$LINENO: '; set -x{script}")
    process = subprocess.Popen(["bash", handle.name], start_new_session=True)
    try:
        return process.wait()
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        os.unlink(handle.name)


def run_plan(steps: list[dict]) -> int:
    namespace: dict = {"__name__": "__main__"}
    started = time.perf_counter()
    for step in steps:
        print(f"=== {step['label']} (at {time.perf_counter() - started:.1f} s)", flush=True)
        for line in step.get("skipped", []):
            print(f"--- not run (set-up line): {line}", flush=True)
        if step["kind"] == "python":
            try:
                # padded so a traceback names the document and the line in it
                source = "\n" * step["line"] + step["code"]
                exec(compile(source, step["doc"], "exec"), namespace)  # noqa: S102
            except BaseException:  # noqa: BLE001 - the test reports whatever the example raised
                traceback.print_exc()
                sys.stdout.flush()
                return 1
            sys.stdout.flush()
            sys.stderr.flush()
        else:
            code = run_shell("\n" * step["line"] + step["code"], step["doc"])
            if code:
                print(f"shell block exited with {code}", flush=True)
                return code
    return 0


if __name__ == "__main__":
    sys.exit(run_plan(json.loads(Path(sys.argv[1]).read_text())))
