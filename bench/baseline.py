"""Run a benchmark against an older commit in the same run: the baseline its ratios need.

`run_against(rev, script, args)` checks `rev` out into a temporary git worktree, lays it out as the
`pinstorm` package (the top folders boards/, pipeline/, training/ become pinstorm.boards, ...) and
runs this checkout's `script` in a subprocess that imports that package instead of the installed one,
writing its results as JSON. So the same measuring code times both versions on the same machine,
minutes apart: `python bench/bench_scale.py --against 84cae95`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Drops the editable install's finder, so `import pinstorm` finds the baseline package first.
_RUNNER = """
import runpy, sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, sys.argv[1])
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_against(rev: str, script: str | Path, args: list[str]) -> dict:
    """The JSON a `script --json-out FILE` run writes, run on the code of commit `rev`."""
    with tempfile.TemporaryDirectory(prefix="pinstorm-baseline-") as tmp:
        src, pkg, out = Path(tmp) / "src", Path(tmp) / "pkg" / "pinstorm", Path(tmp) / "out.json"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(src), rev], check=True)
        try:
            pkg.mkdir(parents=True)
            for item in (src / "pinstorm").iterdir():
                (pkg / item.name).symlink_to(item)
            for layer in ("boards", "pipeline", "training"):
                (pkg / layer).symlink_to(src / layer)
            env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
            subprocess.run([sys.executable, "-c", _RUNNER, str(pkg.parent), str(script), *args, "--json-out", str(out)],
                           check=True, env=env)
            return json.loads(out.read_text())
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(src)], check=False)
