"""Run the real R pins clients (0.4.5 legacy, 1.1.0) from tests and get their results back as JSON.

`.ci/install-r` (`make r-pins`) installs R pins 0.4.5 and 1.1.0 into separate libraries under
`.venv/r-lib/pins-<version>` (or `$PINSTORM_R_LIB/pins-<version>`). When Rscript or a library is
missing the tests that need it skip with the reason, except under CI (`CI` set), where they fail:
CI must never pass by silently not testing interoperability.

R starts in about a second, so tests batch many checks into one script: the R code ends with an
expression whose value (lists, vectors, data frames) is written as JSON for Python to assert on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("0.4.5", "1.1.0")
R_TIMEOUT = float(os.environ.get("PINSTORM_R_TIMEOUT", "180"))


def r_lib_root() -> Path:
    return Path(os.environ.get("PINSTORM_R_LIB") or ROOT / ".venv" / "r-lib")


def missing_reason(version: str) -> str | None:
    """Why R pins `version` cannot run here, or None when it can."""
    if shutil.which("Rscript") is None:
        return "Rscript is not installed (run `make r-pins`, which installs R from Debian's packages)"
    description = r_lib_root() / f"pins-{version}" / "pins" / "DESCRIPTION"
    if not description.is_file() or f"Version: {version}" not in description.read_text():
        return f"R pins {version} is not installed in {description.parent.parent} (run `make r-pins`)"
    return None


def require_r(version: str) -> None:
    """Skip the calling test when R pins `version` is missing, or fail under CI."""
    reason = missing_reason(version)
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and the R interoperability tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


class RError(AssertionError):
    """An R script failed; the message holds R's stderr."""


# Written before the test's code: JSON output, quiet package loading, and `try_r(expr)`, which turns
# an R error into list(error = message) so one failing check does not hide the others' results.
_PRELUDE = r"""
options(warn = 1, pins.progress = FALSE, pins.verbose = FALSE, pins.quiet = TRUE)
suppressPackageStartupMessages(library(pins))
try_r <- function(expr) tryCatch(expr, error = function(e) list(error = conditionMessage(e)))
as_json_df <- function(x) if (is.data.frame(x)) as.data.frame(x, stringsAsFactors = FALSE) else x
"""

_EPILOGUE = r"""
.out <- rapply(list(.result), as_json_df, classes = "data.frame", how = "replace")[[1]]
writeLines(jsonlite::toJSON(.out, auto_unbox = TRUE, null = "null", na = "null", digits = NA,
                            force = TRUE, dataframe = "columns"), Sys.getenv("PINSTORM_R_OUT"))
"""


class RPins:
    """One R pins version with a private home (its caches live there across calls in one test)."""

    def __init__(self, version: str, home: Path):
        self.version = version
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("R_", "PINS_"))}
        env.update(
            R_LIBS=str(r_lib_root() / f"pins-{self.version}"), R_LIBS_USER=str(self.home / "no-user-lib"),
            HOME=str(self.home), XDG_CACHE_HOME=str(self.home / "cache"), XDG_DATA_HOME=str(self.home / "data"),
            R_USER_CACHE_DIR=str(self.home / "cache"), R_USER_DATA_DIR=str(self.home / "data"),
            R_USER_CONFIG_DIR=str(self.home / "config"), PINS_USE_CACHE="true",
            # never a proxy for 127.0.0.1, whatever the machine's settings
            no_proxy="127.0.0.1,localhost", NO_PROXY="127.0.0.1,localhost",
        )
        return env

    def run(self, code: str, **values: Any) -> Any:
        """Run `code` (its last expression is the result) and return the result decoded from JSON.

        `values` become R variables (JSON-decoded), e.g. `url=...`, so no quoting is needed.
        """
        with tempfile.TemporaryDirectory(prefix="pinstorm-r-") as tmp:
            script, out, args = Path(tmp) / "script.R", Path(tmp) / "out.json", Path(tmp) / "args.json"
            args.write_text(json.dumps(values))
            script.write_text(
                _PRELUDE
                + f'.args <- jsonlite::fromJSON({json.dumps(str(args))}, simplifyVector = TRUE)\n'
                + "for (.n in names(.args)) assign(.n, .args[[.n]])\n"
                + ".result <- local({\n" + code + "\n})\n" + _EPILOGUE
            )
            env = self.env()
            env["PINSTORM_R_OUT"] = str(out)
            proc = subprocess.run(["Rscript", "--vanilla", str(script)], env=env, cwd=self.home,
                                  capture_output=True, text=True, timeout=R_TIMEOUT)
            if proc.returncode != 0 or not out.is_file():
                raise RError(f"R pins {self.version} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
            return json.loads(out.read_text())


@pytest.fixture
def r045(tmp_path) -> RPins:
    require_r("0.4.5")
    return RPins("0.4.5", tmp_path / "r-home-0.4.5")


@pytest.fixture
def r110(tmp_path) -> RPins:
    require_r("1.1.0")
    return RPins("1.1.0", tmp_path / "r-home-1.1.0")
