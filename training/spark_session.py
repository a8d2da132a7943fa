"""Spark sessions fit for barrier training, and a probe that checks the executors before training.

Executors run the interpreter named by ``PYSPARK_PYTHON`` when the session starts (PySpark reads
the variable once, in the driver, and ships the path with every task); without it they run the
system ``python3``, which usually has neither TensorFlow nor pinstorm. pinstorm is an installed
package (its layers are mapped into ``pinstorm.*`` by the install itself), so executors that run
the same environment import it with no ``PYTHONPATH`` at all; nothing is added to it here.

Sessions made for this machine (``local[N]``, or a master on 127.0.0.1) bind the driver and the
JVM to 127.0.0.1, so nothing listens on the machine's network address. Importing this module
imports neither pyspark nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import sys
import time
import warnings
from typing import Iterator

from pinstorm.boards.safety import secrets

from .errors import TrainingError

log = secrets.logger("pinstorm.training")

LOOPBACK = "127.0.0.1"

# Modules a barrier training task needs on every executor.
REQUIRED_MODULES = ("pinstorm.training.multiworker", "tensorflow", "tf_keras")

# Every session pinstorm makes for barrier training: one Python process per task (TensorFlow
# configures its runtime once per process), and a barrier stage that cannot get its slots fails
# in seconds instead of retrying for ten minutes.
BARRIER_CONF = {
    "spark.python.worker.reuse": "false",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "2",
    "spark.ui.showConsoleProgress": "false",
}


# PySpark 4 warns that it "does not yet fully support pandas >= 3.0.0" on every run: starting a
# context imports pyspark.testing.utils, which checks the pandas version at import. pinstorm's barrier
# training passes no pandas data through Spark (tasks exchange JSON strings and return plain
# objects), so the warning says nothing about a pinstorm run; exactly this warning is silenced while
# pinstorm starts a session, and every other warning still shows.
PANDAS_WARNING = r"PySpark does not yet fully support pandas >= 3"


class SparkTrainError(TrainingError, RuntimeError):
    """The barrier stage cannot run (too few slots, executors without TensorFlow) or kept failing."""


@contextlib.contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    """Set environment variables while a session starts (PySpark and the JVM read them then)."""
    previous = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value is not None:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def master_is_local(master: str) -> bool:
    """Whether ``master`` runs everything on this machine: ``local[...]`` or a standalone master on loopback."""
    if master == "local" or master.startswith("local["):
        return True
    match = re.fullmatch(r"spark://(.+)", master)
    if not match:
        return False                       # yarn, k8s://..., mesos://...: a real cluster
    hosts = [entry.rsplit(":", 1)[0].strip("[]") for entry in match.group(1).split(",")]
    return all(_is_loopback(host) for host in hosts)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def spark_session(master: str | None = None, *, workers: int = 2, app_name: str = "pinstorm-train",
                  python: str | None = None, driver_host: str | None = None, pythonpath: list[str] | None = None,
                  conf: dict | None = None):
    """A SparkSession for barrier training on ``master`` (None: ``local[workers]`` on this machine).

    ``master``: ``local[N]``, ``spark://host:port`` (standalone), ``yarn`` or ``k8s://https://...``;
    the URL goes to Spark unchanged. ``python``: the interpreter executors run (default:
    ``conf["spark.pyspark.python"]``, else this one, right when executors share this machine's file
    system; on YARN or Kubernetes give the path inside the shipped environment or image, e.g.
    ``./environment/bin/python``). ``driver_host``:
    the address executors reach the driver at; 127.0.0.1 by default when the master is local or on
    loopback, Spark's own choice otherwise. ``pythonpath``: extra folders for the executors'
    ``PYTHONPATH`` (none are needed when pinstorm is installed in the executors' environment).
    ``conf``: more Spark settings (they win over pinstorm's).
    """
    from pinstorm.extras import require

    SparkSession = require("pyspark.sql", "spark", "Spark training").SparkSession
    master, settings, environment = session_settings(master, workers=workers, python=python,
                                                     driver_host=driver_host, pythonpath=pythonpath, conf=conf)
    executable = environment["PYSPARK_PYTHON"]
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _environment(**environment), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PANDAS_WARNING, category=FutureWarning)
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    actual = session.sparkContext.pythonExec
    if actual != executable:
        log.warning("the Spark session already existed with executors running %s, not %s; stop it first to "
                    "change the executors' Python", actual, executable)
    return session


def session_settings(master: str | None = None, *, workers: int = 2, python: str | None = None,
                     driver_host: str | None = None, pythonpath: list[str] | None = None,
                     conf: dict | None = None) -> tuple[str, dict, dict]:
    """What ``spark_session`` gives Spark: ``(master, Spark settings, environment while it starts)``.

    The environment: ``PYSPARK_PYTHON`` (PySpark reads it once, when the context starts, and ships
    the path with every task), ``PYSPARK_DRIVER_PYTHON``, and ``SPARK_LOCAL_IP`` (the address the
    JVM binds when this call starts it) when the driver stays on this machine.
    """
    master = master or f"local[{workers}]"
    conf = {str(k): str(v) for k, v in (conf or {}).items()}
    if driver_host is None:
        driver_host = conf.get("spark.driver.host") or (LOOPBACK if master_is_local(master) else None)
    settings = dict(BARRIER_CONF)
    if master.startswith("local"):
        settings["spark.ui.enabled"] = "false"
    if driver_host:
        settings.update({"spark.driver.host": driver_host, "spark.driver.bindAddress": driver_host})
    if pythonpath:
        settings["spark.executorEnv.PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    executable = python or conf.get("spark.pyspark.python") or sys.executable
    settings["spark.pyspark.python"] = executable          # for the record; PySpark reads the variable
    settings.update({k: v for k, v in conf.items() if k != "spark.pyspark.python"})
    environment = {"PYSPARK_PYTHON": executable,
                   "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON") or sys.executable,
                   "SPARK_LOCAL_IP": driver_host if driver_host and _is_loopback(driver_host) else None}
    return master, settings, environment


def local_spark_session(slots: int = 2, app_name: str = "pinstorm-train", extra_conf: dict | None = None):
    """A ``local[slots]`` SparkSession on 127.0.0.1 whose Python workers run this interpreter."""
    return spark_session(f"local[{slots}]", app_name=app_name, conf=extra_conf)


def available_slots(spark) -> int:
    """Tasks the cluster can run at once right now (what Spark's own barrier check counts)."""
    sc = spark.sparkContext
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - a private Spark API: fall back to the public estimate
        return int(sc.defaultParallelism)


def wait_for_slots(spark, needed: int, timeout: float = 120.0) -> int:
    """Wait until the cluster has ``needed`` task slots (executors register after the session starts).

    Returns the slots; raises ``SparkTrainError`` when they do not appear within ``timeout`` seconds
    (at once in local mode, where the slots never change).
    """
    local = spark.sparkContext.master.startswith("local")
    deadline = time.monotonic() + (0 if local else timeout)
    while True:
        slots = available_slots(spark)
        if slots >= needed or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if slots < needed:
        waited = "" if local else f" after waiting {timeout:.0f} s for executors"
        raise SparkTrainError(
            f"a barrier stage needs all {needed} tasks running at once but this Spark cluster has {slots} task "
            f"slot(s){waited} (master {spark.sparkContext.master}); use num_workers <= {slots} or add executors")
    return slots


def _make_probe(modules: tuple[str, ...]):
    """The probe task, built in a closure so Spark ships it by value: it must run where pinstorm cannot import."""

    def probe(_partition):
        import importlib
        import importlib.util
        import os
        import platform
        import socket
        import sys

        found = {}
        for name in modules:
            try:
                if name in ("tensorflow", "tf_keras"):         # importing TensorFlow costs seconds: find it
                    ok = importlib.util.find_spec(name) is not None
                    found[name] = None if ok else f"No module named {name!r}"
                else:
                    importlib.import_module(name)
                    found[name] = None
            except Exception as exc:  # noqa: BLE001 - reported to the driver
                found[name] = f"{type(exc).__name__}: {exc}"
        version = None
        try:
            from importlib.metadata import version as _version
            version = _version("pinstorm")
        except Exception:  # noqa: BLE001
            pass
        yield {"python": sys.executable, "python_version": platform.python_version(), "host": socket.gethostname(),
               "pythonpath": os.environ.get("PYTHONPATH", ""), "pinstorm": version, "errors": found}

    return probe


def probe_executors(spark, tasks: int, modules: tuple[str, ...] = REQUIRED_MODULES) -> list[dict]:
    """Run a tiny job of ``tasks`` tasks that reports each executor's Python and what it cannot import.

    Raises ``SparkTrainError`` naming the interpreter and the missing module ("executors run
    /usr/bin/python3, which cannot import tensorflow: set ...") before a barrier stage would fail
    with a bare ``ModuleNotFoundError`` deep in a Java stack trace.
    """
    sc = spark.sparkContext
    sc.setJobDescription("pinstorm: probe the executors' Python")
    try:
        reports = sc.parallelize(range(tasks), tasks).mapPartitions(_make_probe(tuple(modules))).collect()
    except Exception as exc:  # noqa: BLE001 - the executors could not even start the probe
        raise SparkTrainError(f"executors could not run Python {sc.pythonExec!r}: {spark_error_message(exc)}; "
                              f"{_HOW_TO_SET_PYTHON}") from exc
    finally:
        sc.setJobDescription(None)
    for report in reports:
        missing = [name for name, error in report["errors"].items() if error]
        if missing:
            details = "; ".join(f"{name}: {report['errors'][name]}" for name in missing)
            raise SparkTrainError(
                f"executors run {report['python']}, which cannot import "
                f"{', '.join(dict.fromkeys(_module_label(name) for name in missing))}: {_HOW_TO_SET_PYTHON} "
                f"(Python {report['python_version']} on {report['host']}; {details})")
    driver_version = _pinstorm_version()
    for report in reports:
        if report["pinstorm"] and driver_version and report["pinstorm"] != driver_version:
            log.warning("executor %s runs pinstorm %s, the driver %s", report["host"], report["pinstorm"],
                        driver_version)
    return reports


_HOW_TO_SET_PYTHON = ("set PYSPARK_PYTHON before the session starts (or spark_session(python=...), "
                      "pinstorm spark-train --python) to an interpreter that has pinstorm[spark] installed on every "
                      f"executor: this driver runs {sys.executable}; on YARN or Kubernetes ship an environment "
                      "(spark.archives) or an image that has it")


def _module_label(name: str) -> str:
    return "pinstorm" if name.startswith("pinstorm") else name


def _pinstorm_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("pinstorm")
    except Exception:  # noqa: BLE001
        return None


def spark_error_message(exc: BaseException) -> str:
    """The line of a py4j/Spark error that says what went wrong (the Python exception, or Spark's reason)."""
    text = str(exc)
    if "BarrierJobSlotsNumberCheckFailed" in text:
        start = text.index("BarrierJobSlotsNumberCheckFailed")
        return "not enough task slots for the barrier stage (" + text[start:].splitlines()[0] + ")"
    if "Traceback (most recent call last)" in text:
        tail = text[text.rindex("Traceback (most recent call last)"):]
        lines = [line for line in tail.splitlines() if line.strip()]
        errors = [line for line in lines if not line.startswith((" ", "\t")) and ":" in line
                  and not line.startswith(("Traceback", "During handling", "The above exception"))]
        if errors:
            return errors[0].strip() if errors[0].split(":")[0].endswith(("Error", "Exception", "Exit")) \
                else errors[-1].strip()
        return lines[-1].strip()
    for pattern in ("Python worker exited unexpectedly", "ExecutorLostFailure", "Executor lost", "TaskKilled",
                    "finished unsuccessfully"):
        for line in text.splitlines():
            if pattern in line:
                return line.strip().removeprefix(": ").split(". Consider setting")[0]
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
