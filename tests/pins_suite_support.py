"""Run pins-python 0.9.2's own tests (they ship in its wheel, `pins/tests/`) against pinstorm.

A temporary folder gets the `pins` stand-in of `tests/pins_python_shim` (it only renames imports to
`pinstorm.boards`) with the wheel's `pins/tests` copied beside it, and pytest runs there in a
subprocess with pins-python CI's marker selection, on a folder board ("file"), on S3 (moto, bucket
`pins-test-hadley`, reached through `AWS_ENDPOINT_URL`) and on GCS (gcp-storage-emulator, bucket
`pins-python`, through `STORAGE_EMULATOR_HOST`) and on Azure Blob Storage (Azurite, container `ci-pins`,
through `AZURE_STORAGE_CONNECTION_STRING`). pins-python's tests need pytest-cases, which
does not import under pytest 9: pytest 8.4.2 and pytest-cases 3.10.1 are installed with
`pip install --target <venv>/pins-tests-deps` (`ensure_deps`, automatically on the first run, in
each environment: .venv, .venv-modern, .venv-py3.10), which the subprocess puts before the
environment's own packages.

    python tests/pins_suite_support.py [file|s3|gcs|abfs ...]   # prints each test's outcome on pinstorm
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM = ROOT / "tests" / "pins_python_shim"
PINS_VERSION = "0.9.2"
DEPS = ("pytest==8.4.2", "pytest-cases==3.10.1")
S3_BUCKET = "pins-test-hadley"
GCS_BUCKET = "pins-python"  # pins-python's test helpers' defaults
AZURE_CONTAINER = "ci-pins"
HANG_DUMP = 120   # seconds a single pins-python test may run before its threads' stacks are dumped
# pins-python CI's selection, per backend; the tests that need the internet (raw.githubusercontent.com)
# and those about pins-python internals (adaptors, drivers, its cache and config modules) are left out.
FILES = ("test_boards.py", "test_compat.py", "test_compat_old_types.py", "test_constructors.py")
# beside the tests run per backend (`[file]`, `[s3]`), the public-API tests that take no backend
PUBLIC_UNPARAMETRIZED = ("test_board_constructor_folder", "test_board_constructor_temp_writable",
                         "test_compat_old_types_load_table")
SELECT = {
    "file": "file or " + " or ".join(PUBLIC_UNPARAMETRIZED),
    "s3": "s3",
    "gcs": "gcs",
    "abfs": "abfs",
}
MARKERS = {
    "file": "not fs_rsc and not fs_s3 and not fs_gcs and not fs_abfs and not fs_dbc and not skip_on_github",
    "s3": "fs_s3",
    "gcs": "fs_gcs",
    "abfs": "fs_abfs",
}


def deps_dir() -> Path:
    """Where this environment's pytest 8.4.2 + pytest-cases go: `<venv>/pins-tests-deps`."""
    return Path(os.environ.get("PINSTORM_PINS_TESTS_DEPS") or Path(sys.prefix) / "pins-tests-deps")


def pins_tests_dir() -> Path | None:
    """The installed pins wheel's tests, when pins is PINS_VERSION."""
    try:
        from importlib import metadata

        if metadata.version("pins") != PINS_VERSION:
            return None
        dist = metadata.distribution("pins")
    except Exception:
        return None
    folder = Path(str(dist.locate_file("pins/tests")))
    return folder if (folder / "test_boards.py").is_file() else None


def missing_reason() -> str | None:
    """Why the suite cannot run here (after trying to install its pytest), or None."""
    if pins_tests_dir() is None:
        return f"pins {PINS_VERSION} (with its tests) is not installed"
    return ensure_deps()


def ensure_deps() -> str | None:
    """Install pytest 8.4.2 + pytest-cases into deps_dir() when missing; a reason on failure."""
    target = deps_dir()
    if (target / "pytest_cases").is_dir() and list(target.glob("pytest-8.4.2.dist-info")):
        return None
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--upgrade", "--target", str(target), *DEPS]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return f"could not install {' '.join(DEPS)} into {target}: {done.stderr.strip()[-500:]}"
    return None


def prepare(workdir: Path) -> Path:
    """`workdir/pins` (the stand-in + pins-python's tests); returns workdir."""
    shutil.copytree(SHIM / "pins", workdir / "pins", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(pins_tests_dir(), workdir / "pins" / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    # a test still running after HANG_DUMP seconds has every thread's stack written to stderr, which a suite
    # that runs out of time shows: where a hang was (the runs take 10-45 s; one on a loaded CI machine once
    # went past its 300 s on a folder board, and 60 runs here did not repeat it)
    (workdir / "pytest.ini").write_text(f"[pytest]\nfaulthandler_timeout = {HANG_DUMP}\n")
    return workdir


def run(workdir: Path, backend: str, env: dict[str, str] | None = None,
        timeout: float = 300, attempts: int = 2) -> tuple[dict[str, str], str]:
    """({test name: passed | failed | skipped | xfailed} of the selection on `backend`, pytest's output).

    A run that does not finish in `timeout` seconds is stopped, reported as a warning with the end of its
    output (the stacks `HANG_DUMP` wrote), and run again up to `attempts` times in all; then it fails with
    that output."""
    report = workdir / f"report-{backend}.xml"
    tests = [str(workdir / "pins" / "tests" / f) for f in FILES]
    cmd = [sys.executable, "-m", "pytest", "-c", str(workdir / "pytest.ini"), "--rootdir", str(workdir),
           "-p", "no:cacheprovider", "-q", "-W", "ignore", "-m", MARKERS[backend], "-k", SELECT[backend],
           f"--junitxml={report}", *tests]
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(workdir), str(deps_dir())])
    for var in ("PINS_ALLOW_PICKLE_READ", "PINSTORM_CACHE", "PINSTORM_BOARD"):  # pins-python's tests set PINS_*
        full_env.pop(var, None)
    for attempt in range(1, attempts + 1):
        report.unlink(missing_ok=True)
        # the cache of the tests that do not make their own (`tmp_cache`): this run's, not the user's (where
        # every run left its pins, and the concurrent runs of CI's environments shared them)
        full_env["PINS_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"cache-{backend}-", dir=workdir)
        try:   # no stdin: nothing in the suite may wait for a keyboard
            done = subprocess.run(cmd, cwd=workdir, env=full_env, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
            break
        except subprocess.TimeoutExpired as e:
            told = (f"pins-python's tests on {backend} did not finish in {timeout:g} s (attempt {attempt} of "
                    f"{attempts}); the end of their output:\n{_text(e.stdout)[-2000:]}\n{_text(e.stderr)[-8000:]}")
            if attempt == attempts:
                raise AssertionError(told) from None
            warnings.warn(told, stacklevel=2)
    if not report.is_file():
        raise RuntimeError(f"pins-python's tests did not run:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    found = {k: v for k, v in outcomes(report).items()
             if f"[{backend}" in k or (backend == "file" and k in PUBLIC_UNPARAMETRIZED)}
    return found, done.stdout


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def outcomes(report: Path) -> dict[str, str]:
    result = {}
    for case in ET.parse(report).iter("testcase"):
        name = str(case.get("name"))  # unique across pins-python's test files
        kinds = {child.tag for child in case}
        skipped = case.find("skipped")
        if "failure" in kinds or "error" in kinds:
            result[name] = "failed"
        elif skipped is not None:
            result[name] = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        else:
            result[name] = "passed"
    return result


def main(argv: list[str]) -> int:
    reason = missing_reason()
    if reason:
        print(reason)
        return 2
    backends = argv or ["file"]
    with tempfile.TemporaryDirectory(prefix="pins-suite-") as tmp:
        work = prepare(Path(tmp))
        for backend in backends:
            env = {}
            server = None
            sys.path.insert(0, str(ROOT / "tests"))
            if backend == "s3":
                from servers.s3 import S3Server

                server = S3Server().start()
                env = s3_env(server.endpoint)
            elif backend == "gcs":
                from servers.gcs import GcsServer

                server = GcsServer(default_bucket=GCS_BUCKET).start()
                env = gcs_env(server.endpoint)
            elif backend == "abfs":
                from servers.azurite import AzuriteServer

                server = AzuriteServer().start()
                env = azure_env(server.connection_string())
            try:
                res, out = run(work, backend, env)
            finally:
                if server:
                    server.stop()
            for k, v in sorted(res.items()):
                print(v, k)
            print(backend, sum(v == "passed" for v in res.values()), "passed of", len(res))
    return 0


def azure_env(connection_string: str) -> dict[str, str]:
    """The environment pins-python's Azure tests need, with AZURE_CONTAINER created (Azurite)."""
    import adlfs

    fs = adlfs.AzureBlobFileSystem(connection_string=connection_string, skip_instance_cache=True)
    if not fs.exists(AZURE_CONTAINER):
        fs.mkdir(AZURE_CONTAINER)
    return {"AZURE_STORAGE_CONNECTION_STRING": connection_string}


def gcs_env(endpoint: str) -> dict[str, str]:
    """The environment pins-python's GCS tests need (gcp-storage-emulator holding GCS_BUCKET)."""
    return {"STORAGE_EMULATOR_HOST": endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment pins-python's S3 tests need, with the bucket created on the moto server."""
    import s3fs

    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing-key",
           "AWS_SECRET_ACCESS_KEY": "testing-secret", "AWS_DEFAULT_REGION": "us-east-1"}
    fs = s3fs.S3FileSystem(key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"], endpoint_url=endpoint)
    if not fs.exists(S3_BUCKET):
        fs.mkdir(S3_BUCKET)
    return env


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
