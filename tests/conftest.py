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
# PyTorch's OpenMP threads spin while they wait for work. With the three CI suites sharing two cores
# that spinning took the cores from the other suites: a torch training loop beside one busy process
# used 2.3-2.8x the CPU seconds of the same loop with passive waits (same results). Set before any
# test imports torch, and inherited by the subprocesses tests start (docs examples, Spark workers).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One intra-op thread per test process (torch, TensorFlow, BLAS). CI runs six test processes on two
# cores: an op split over two threads then waits for whichever was descheduled, op after op. Beside
# three busy loops the torch demo trained in 136 s with one thread against 317 s with two, and two
# Keras fits took 85 against 108 s (same results): more threads than free cores only add waiting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
# Spark's driver JVMs (every local session, every spark-submit) compile with C1 alone: a test's JVM lives
# seconds and does little, and C2's compiler threads were most of its CPU (a local[2] session with a
# small job: 8.6-9.0 CPU-s against 13.5-14.9; the suite starts ~85 JVMs). Tests only: real jobs want C2.
JVM_QUICK_START = "-XX:TieredStopAtLevel=1"
os.environ.setdefault("SPARK_SUBMIT_OPTS", JVM_QUICK_START)
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).parent / "spark_conf"))  # executors: the same
sys.path.insert(0, str(Path(__file__).parent))  # so tests can import the `servers` helpers

# The boards core runs its tests without the heavier extras (CI does, on the oldest Python): the
# modules of a layer whose extra is missing are not collected, and the header says so.
from extras_support import has_extra  # noqa: E402

_LAYER_TESTS = {"pipeline": ["test_pipeline_*.py", "test_trust_parquet.py"],
                "training": ["test_training_*.py", "test_trust_secrets.py"]}
MISSING_LAYERS = [layer for layer in _LAYER_TESTS if not has_extra(layer)]
collect_ignore_glob = [pattern for layer in MISSING_LAYERS for pattern in _LAYER_TESTS[layer]]


def pytest_report_header(config):
    if MISSING_LAYERS:
        return (f"boards core only: the {' and '.join(MISSING_LAYERS)} tests are not collected "
                f"(pip install 'pinstorm[{','.join(MISSING_LAYERS)}]' to run them)")
    return None


# In CI, property tests draw the same examples every run, so a red build is reproducible; on a
# developer's machine they explore new ones each run (what found the `//:a` URL bug).
if os.environ.get("CI"):
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
    _hypothesis_settings.load_profile("ci")


# The longest test modules first (seconds in CI, slowest first), the rest in their usual order.
# `make test` hands whole modules to its test processes in collection order (xdist's --dist
# loadfile): longest first, no long module is left to run alone at the end while the other process
# sits idle (wall time where cores are free; on CI's two saturated cores it measured the same).
LONGEST_FIRST = ("test_training_torch.py", "test_docs_examples.py", "test_training_torch_spark.py",
                 "test_pipeline_spark_converter.py", "test_training_spark_cluster.py",
                 "test_training_multiworker.py", "test_training_spark_distributor.py", "test_training_fit.py",
                 "test_pipeline_streaming.py", "test_training_schedule.py", "test_training_spark.py",
                 "test_training_spark_resume.py", "test_pipeline_exit.py", "test_training_weights_trust.py",
                 "test_trust_delete.py", "test_trust_parquet.py", "test_boards_scale.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: each module stays in order


# PINSTORM_TEST_CPU=FILE: each test's CPU seconds (this process and the children it reaped: servers,
# subprocesses, Spark's JVM when its session stops) into FILE.<venv>.<worker>.json, to see where CI's CPU goes
# (its two cores are saturated, so wall-clock durations mostly measure the neighbours).
CPU_PROFILE = os.environ.get("PINSTORM_TEST_CPU")
_cpu_seconds: dict[str, float] = {}


def _cpu_now() -> float:
    import resource

    return sum(getattr(resource.getrusage(who), field) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = _cpu_now() if CPU_PROFILE else 0.0
    yield
    if CPU_PROFILE:
        _cpu_seconds[item.nodeid] = _cpu_now() - started


def pytest_sessionfinish(session):
    if CPU_PROFILE and _cpu_seconds:
        import json

        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(f"{CPU_PROFILE}.{Path(sys.prefix).name}.{worker}.json").write_text(json.dumps(_cpu_seconds, indent=1))


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
